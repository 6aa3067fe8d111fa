"""A fuzzer for minigraph: random cases, an independent oracle, and a minimal reproducer.

Run it from the command line (users, CI)::

    python -m minigraph.fuzz --seconds 60 [--seed N]

It tries three kinds of case, in turn, until the time is up:

1. **programs**: a small random program over minigraph's primitives (elementwise ops,
   reductions, matmul, reshape/transpose, softmax/log_softmax, where, maximum, pow,
   concatenate) on random shapes. It is written as Python source into a temporary module
   (source transformation reads a function's *text*, so the program must be a real file),
   once with ``mg.`` and once with ``torch.``. minigraph's value, its gradient in each of
   the four modes, a second derivative through a random (outer, inner) pairing of modes,
   ``jvp`` and ``vmap`` of ``grad``, ``vjp`` and ``jacrev`` of the program's last value
   (of any shape) in a random reverse mode, source mode's gradient of ``mg.checkpoint(f)`` or
   ``mg.trace(f)`` handed to it as it is, and ``backward()`` through ``mg.checkpoint(f)``
   (its replayed pullback) are compared with PyTorch (``torch.func``) in float64.
2. **dags**: a random dataflow graph of placeholders and ops, each node placed at random on
   ``cpu``, ``cpu:1`` or ``cpu:2``, sometimes with its gradient graph. Runs with 2 and 4
   workers, partitioned and not, with and without memory recycling, twice in one session,
   must give results *bit-identical* to the serial run (``workers=1``, one device): the
   kernels are the same, so any difference, even in the last bit, is a finding.
3. **adversarial**: one op on awkward inputs (empty and 0-d shapes, huge and tiny
   magnitudes, NaN/inf, int and bool dtypes, Python scalars). minigraph must give
   PyTorch's values (NaN where PyTorch gives NaN) with NumPy's dtype (DESIGN.md: "Defaults
   follow NumPy"), or refuse with a clear error: a ``MinigraphError``, or a built-in
   ``ValueError``/``IndexError``-like error that NumPy itself would raise. A stray
   ``TypeError``/``AttributeError`` from deep inside, or a value where NumPy refuses, is a
   finding.

Every check is a few lines of Python *text* that the fuzzer executes; on a disagreement the
case is shrunk greedily (drop steps, shrink shapes, simplify values) while the same check
keeps failing, and the shrunk check's text, with its data and imports, is printed as a
self-contained snippet: what you read is exactly what ran. The exit status is 1 when
anything disagreed, 0 otherwise; the last line counts the cases of each kind.

``run(...)`` is the same thing as a function (``tests/test_fuzz.py`` calls it with a fixed
seed and a fixed number of cases, so the CI run is deterministic).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import shutil
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

Shape = tuple[int, ...]
DEVICES = ("cpu", "cpu:1", "cpu:2")
MODES = ("tape", "forward", "graph", "source")
REVERSE_MODES = ("tape", "graph", "source")

# Imports every reproducer starts with (and the namespace every check runs in).
PRELUDE = """\
import importlib.util, pathlib, tempfile
import numpy as np
from numpy import nan, inf
import torch
import torch.func as tf
import minigraph as mg
"""

# The helpers every check uses to compare: a check leaves ``got`` and ``want`` behind,
# and ``verdict(got, want)`` says what is wrong with them (None: they agree).
HELPERS = '''\
def T(a):
    """A NumPy array as a float64 torch tensor (the oracle computes in float64)."""
    return torch.tensor(np.asarray(a, dtype=np.float64))


def as_numpy(v):
    """minigraph tensors, torch tensors, numbers and tuples of them, as NumPy arrays."""
    if isinstance(v, (tuple, list)):
        return [as_numpy(e) for e in v]
    if isinstance(v, torch.Tensor):
        return v.detach().numpy()
    if hasattr(v, "numpy"):
        return np.asarray(v.numpy())
    return np.asarray(v)


def verdict(got, want, rtol=1e-6, atol=1e-9):
    """None if ``got`` matches ``want`` within tolerances scaled to ``want``'s size, else why."""
    got, want = as_numpy(got), as_numpy(want)
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"structure: got {type(got).__name__} of {len(got) if isinstance(got, list) else 1}, want {len(want)} values"
        for k, (g, w) in enumerate(zip(got, want)):
            why = verdict(g, w, rtol, atol)
            if why:
                return f"[{k}] {why}"
        return None
    if isinstance(got, list):
        return f"structure: got {len(got)} values, want one"
    if got.shape != want.shape:
        return f"shape: got {got.shape}, want {want.shape}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isnan(g), np.isnan(w)):
        return f"NaN where the oracle has none (or the reverse): got {g!r}, want {w!r}"
    ok = ~np.isnan(w)
    scale = max(1.0, float(np.max(np.abs(w[ok & np.isfinite(w)]), initial=0.0)))
    with np.errstate(all="ignore"):
        close = (g == w) | (np.abs(g - w) <= atol * scale + rtol * np.abs(w))
    if not np.all(close[ok]):
        return f"values: got {g!r}, want {w!r} (max abs diff {np.max(np.abs(g - w)[ok]):.3g})"
    return None
'''


# -- the report ---------------------------------------------------------------------------

@dataclass
class Finding:
    """One disagreement, shrunk: which check, why, and a snippet that reproduces it."""

    kind: str       # "programs", "dags" or "adversarial"
    check: str      # e.g. "grad[graph]", "workers=2 partitioned recycle run 2", "sum"
    why: str        # what the comparison said
    seed: int       # the case's seed: KINDS[kind][0](random.Random(seed)) redraws the case
    snippet: str    # self-contained Python that shows the disagreement

    def render(self) -> str:
        rule = "-" * 78
        return (f"{rule}\nFINDING [{self.kind}] {self.check}\n  {self.why}\n  case seed {self.seed}\n"
                f"--- reproducer (python) ---\n{self.snippet}{rule}")


@dataclass
class Report:
    """What a fuzzing run did: cases and checks of each kind, and the findings."""

    seed: int
    cases: dict[str, int] = field(default_factory=lambda: {"programs": 0, "dags": 0,
                                                           "adversarial": 0})
    checks: dict[str, int] = field(default_factory=lambda: {"programs": 0, "dags": 0,
                                                            "adversarial": 0})
    skipped: int = 0              # cases whose oracle overflowed: no verdict either way
    refused: int = 0              # adversarial cases minigraph refused with a clear error
    findings: list[Finding] = field(default_factory=list)
    repeats: dict[str, int] = field(default_factory=dict)  # class -> further occurrences
    seconds: float = 0.0

    def summary(self) -> str:
        total = sum(self.cases.values())
        rate = total / self.seconds if self.seconds else 0.0
        kinds = ", ".join(f"{self.cases[k]} {k} ({self.checks[k]} checks)" for k in self.cases)
        repeats = sum(self.repeats.values())
        return (f"fuzz: seed {self.seed}, {total} cases in {self.seconds:.0f} s "
                f"({rate:.1f}/s): {kinds}; {self.skipped} skipped (overflow), "
                f"{self.refused} clear refusals; {len(self.findings)} findings"
                + (f" (+{repeats} repeats of them)" if repeats else ""))


# -- running a check ----------------------------------------------------------------------

def _namespace() -> dict[str, Any]:
    """A fresh namespace with the prelude and the helpers, as a reproducer would have."""
    ns: dict[str, Any] = {}
    exec(compile(PRELUDE + HELPERS, "<fuzz prelude>", "exec"), ns)
    return ns


def _run_check(setup: str, check: str, ns: dict[str, Any]) -> str | None:
    """Execute ``check`` (after ``setup``) in ``ns``; None if it passed, else why it failed.

    A check sets ``got`` and ``want`` and calls ``verdict``, or raises. A Python error
    inside minigraph is a failure too: it is reported with its last frames.
    """
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            exec(compile(setup + check, "<fuzz check>", "exec"), ns)
    except _Skip:
        raise
    except Exception as e:  # noqa: BLE001 - every exception is an answer to judge
        tb = traceback.extract_tb(e.__traceback__)
        where = "; ".join(f"{Path(f.filename).name}:{f.lineno}" for f in tb[-3:])
        return f"raised {type(e).__name__}: {str(e)[:300]} (at {where})"
    return ns.get("why")


class _Skip(Exception):
    """The oracle itself could not give a trustworthy answer (overflow): no verdict."""


def _snippet(setup: str, check: str) -> str:
    return (PRELUDE + "\n" + HELPERS + "\n" + setup + check
            + "print('got ', as_numpy(got))\nprint('want', as_numpy(want))\n"
              "print('verdict:', why or 'agree')\n")


def _literal(a: np.ndarray) -> str:
    """``a`` as exact Python text (repr of floats round-trips; nan/inf come from numpy)."""
    return f"np.array({a.tolist()!r}, dtype=np.{a.dtype.name}).reshape({a.shape!r})"


# == 1. random programs ======================================================================

@dataclass(frozen=True)
class Step:
    """``v_k = op(values[args...])``; ``param`` is the op's axis/keepdims choice, if any."""

    op: str
    args: tuple[int, ...]
    param: Any = None


# op -> (arity, mg template, torch template). {a}, {b} are operands, {p}/{q} parameters.
# The compositions keep every op inside its domain (log of 1 + a*a, never of a raw value)
# so that the math is defined wherever the random inputs land.
ELEMENTWISE: dict[str, tuple[int, str, str]] = {
    "sin": (1, "mg.sin({a})", "torch.sin({a})"),
    "cos": (1, "mg.cos({a})", "torch.cos({a})"),
    "tanh": (1, "mg.tanh({a})", "torch.tanh({a})"),
    "sigmoid": (1, "mg.sigmoid({a})", "torch.sigmoid({a})"),
    "log_sigmoid": (1, "mg.log_sigmoid({a})", "torch.nn.functional.logsigmoid({a})"),
    "exp_tanh": (1, "mg.exp(mg.tanh({a}))", "torch.exp(torch.tanh({a}))"),
    "log1sq": (1, "mg.log(1.0 + {a} * {a})", "torch.log(1.0 + {a} * {a})"),
    "sqrt1sq": (1, "mg.sqrt(1.0 + {a} * {a})", "torch.sqrt(1.0 + {a} * {a})"),
    "relu": (1, "mg.relu({a})", "torch.relu({a})"),
    "abs": (1, "mg.abs({a})", "torch.abs({a})"),
    "neg": (1, "-{a}", "-{a}"),
    "pow_const": (1, "(1.5 + {a} * {a}) ** 0.75", "(1.5 + {a} * {a}) ** 0.75"),
    "add": (2, "{a} + {b}", "{a} + {b}"),
    "sub": (2, "{a} - {b}", "{a} - {b}"),
    "mul": (2, "{a} * {b}", "{a} * {b}"),
    "div": (2, "{a} / (1.5 + {b} * {b})", "{a} / (1.5 + {b} * {b})"),
    "maximum": (2, "mg.maximum({a}, {b})", "torch.maximum({a}, {b})"),
    "minimum": (2, "mg.minimum({a}, {b})", "torch.minimum({a}, {b})"),
    "where": (2, "mg.where({a} > {b}, {a}, {b} * 0.5)", "torch.where({a} > {b}, {a}, {b} * 0.5)"),
    "pow": (2, "(1.5 + {a} * {a}) ** mg.tanh({b})", "(1.5 + {a} * {a}) ** torch.tanh({b})"),
}
REDUCTIONS = {"sum": ("mg.sum", "torch.sum"), "mean": ("mg.mean", "torch.mean"),
              "max": ("mg.max", "torch.amax"), "min": ("mg.min", "torch.amin")}
OTHER_OPS = ("reduce", "softmax", "log_softmax", "transpose", "flatten", "reshape_swap",
             "matmul", "matmul_t", "concatenate")


def _broadcast(a: Shape, b: Shape) -> Shape | None:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        return None


def _matmul_shape(a: Shape, b: Shape) -> Shape | None:
    if not (1 <= len(a) <= 2 and 1 <= len(b) <= 2):
        return None
    if a[-1] != b[0]:
        return None
    return a[:-1] + b[1:]


def step_shape(step: Step, shapes: Sequence[Shape]) -> Shape | None:
    """The shape ``step`` gives on operands of ``shapes``, or None if it does not apply."""
    s = [shapes[i] for i in step.args]
    op, p = step.op, step.param
    if op in ELEMENTWISE:
        return s[0] if len(s) == 1 else _broadcast(s[0], s[1])
    if op == "reduce":
        name, axis, keep = p
        if axis is None:
            return tuple(1 for _ in s[0]) if keep else ()
        if axis >= len(s[0]):
            return None
        return s[0][:axis] + ((1,) if keep else ()) + s[0][axis + 1:]
    if op in ("softmax", "log_softmax"):
        return s[0] if p < len(s[0]) else None
    if op == "transpose":
        return s[0][::-1] if len(s[0]) == 2 else None
    if op == "flatten":
        return (int(np.prod(s[0])),) if len(s[0]) >= 1 else None
    if op == "reshape_swap":
        return s[0][::-1] if len(s[0]) == 2 else None
    if op == "matmul":
        return _matmul_shape(s[0], s[1])
    if op == "matmul_t":  # a @ b.T for two matrices of the same shape
        return (s[0][0], s[1][0]) if len(s[0]) == len(s[1]) == 2 and s[0][1] == s[1][1] else None
    if op == "concatenate":
        a, b = s
        if len(a) != len(b) or p >= len(a):
            return None
        if any(x != y for k, (x, y) in enumerate(zip(a, b)) if k != p):
            return None
        return a[:p] + (a[p] + b[p],) + a[p + 1:]
    raise AssertionError(op)


def step_source(step: Step, names: Sequence[str], ns: str) -> str:
    """The right-hand side of ``step`` in namespace ``ns`` ("mg" or "torch")."""
    a = names[step.args[0]]
    b = names[step.args[1]] if len(step.args) > 1 else ""
    op, p = step.op, step.param
    mg_ = ns == "mg"
    if op in ELEMENTWISE:
        _, mg_template, torch_template = ELEMENTWISE[op]
        return (mg_template if mg_ else torch_template).format(a=a, b=b)
    if op == "reduce":
        name, axis, keep = p
        fn = REDUCTIONS[name][0 if mg_ else 1]
        if axis is None and not keep:
            return f"{fn}({a})"
        if axis is None:  # torch has no keepdim for "all axes" in every reduction
            return (f"{fn}({a}, axis=None, keepdims=True)" if mg_
                    else f"{fn}({a}, dim=tuple(range({a}.dim())), keepdim=True)")
        return (f"{fn}({a}, axis={axis}, keepdims={keep})" if mg_
                else f"{fn}({a}, dim={axis}, keepdim={keep})")
    if op in ("softmax", "log_softmax"):
        return f"mg.{op}({a}, axis={p})" if mg_ else f"torch.{op}({a}, dim={p})"
    if op == "transpose":
        return f"mg.transpose({a})" if mg_ else f"torch.permute({a}, (1, 0))"
    if op == "flatten":
        return f"mg.reshape({a}, (-1,))" if mg_ else f"torch.reshape({a}, (-1,))"
    if op == "reshape_swap":
        return (f"mg.reshape({a}, {a}.shape[::-1])" if mg_
                else f"torch.reshape({a}, tuple({a}.shape)[::-1])")
    if op == "matmul":
        return f"({a} @ {b}) * 0.5"
    if op == "matmul_t":
        return (f"({a} @ mg.transpose({b})) * 0.5" if mg_
                else f"({a} @ torch.permute({b}, (1, 0))) * 0.5")
    if op == "concatenate":
        return (f"mg.concatenate([{a}, {b}], axis={p})" if mg_
                else f"torch.cat([{a}, {b}], dim={p})")
    raise AssertionError(op)


@dataclass
class Program:
    """A random straight-line program of two inputs, with its inputs' values."""

    x: np.ndarray
    y: np.ndarray
    steps: list[Step]
    outer: str = "tape"    # the random pairing for the second derivative
    inner: str = "tape"
    wrt: int = 0           # the outer derivative is d/dx or d/dy of (sum sin grad_x f)
    vmap_mode: str = "tape"
    batch: int = 2
    handed: str = "checkpoint"  # the transformation of f that source mode is handed as it is
    vjp_mode: str = "tape"      # the reverse mode of vjp and jacrev of v (any output shape)

    def shapes(self) -> list[Shape] | None:
        """Every value's shape, or None when a step does not apply (after shrinking)."""
        shapes: list[Shape] = [self.x.shape, self.y.shape]
        for s in self.steps:
            if any(i >= len(shapes) for i in s.args):
                return None
            out = step_shape(s, shapes)
            if out is None:
                return None
            shapes.append(out)
        return shapes

    def source(self) -> str:
        """The module text: ``v``/``f`` in minigraph, ``v_torch``/``f_torch`` in torch, and
        the outer functions of the second derivative (source mode needs them in a file)."""
        out = ["import minigraph as mg", "import torch", "import torch.func as tf", ""]
        for ns, suffix in (("mg", ""), ("torch", "_torch")):
            body = []
            names = ["x", "y"]
            for k, s in enumerate(self.steps):
                body.append(f"    v{k} = {step_source(s, names, ns)}")
                names.append(f"v{k}")
            last = names[-1]
            # v: the program's last value (values are compared); f: a scalar read-out of it,
            # sin so that the gradient weights differ per element (a plain sum would make,
            # e.g., softmax's gradient vanish), plus a term in both inputs so that every
            # derivative has something to do.
            readout = (f"    return {ns}.sum({ns}.sin({last})) "
                       f"+ {ns}.sum(x) * {ns}.sum(y) * 0.25")
            out += [f"def v{suffix}(x, y):", *body, f"    return {last}", "",
                    f"def f{suffix}(x, y):", *body, readout, ""]
        out += ["def outer(x, y):  # g_inner is set by the check: mg.grad(f, 0, mode=inner)",
                "    return mg.sum(mg.sin(g_inner(x, y)))", "",
                "def outer_torch(x, y):",
                "    return torch.sum(torch.sin(tf.grad(f_torch, argnums=0)(x, y)))", ""]
        return "\n".join(out)

    def setup(self) -> str:
        """Reproducer text: write the module to a file, import it, define the inputs."""
        xs = np.stack([self.x * (1.0 - 0.25 * k) + 0.125 * k for k in range(self.batch)])
        return (f"SOURCE = {self.source()!r}\n"
                "path = pathlib.Path(tempfile.mkdtemp(prefix='minigraph-fuzz-')) / 'fuzz_program.py'\n"
                "path.write_text(SOURCE)  # source mode reads the function's text\n"
                "spec = importlib.util.spec_from_file_location('fuzz_program', path)\n"
                "m = importlib.util.module_from_spec(spec)\n"
                "spec.loader.exec_module(m)\n"
                f"x = {_literal(self.x)}\n"
                f"y = {_literal(self.y)}\n"
                f"xs = {_literal(xs)}  # a batch of x, for vmap\n")

    def checks(self) -> dict[str, str]:
        """Check name -> the text that sets ``got``, ``want`` and ``why``."""
        args_mg = "mg.tensor(x), mg.tensor(y)"
        c = {"value": ("got = m.v(mg.tensor(x), mg.tensor(y))\n"
                       "want = m.v_torch(T(x), T(y))\n"
                       "why = verdict(got, want)\n")}
        for mode in MODES:
            c[f"grad[{mode}]"] = (
                f"got = mg.grad(m.f, argnums=(0, 1), mode={mode!r})({args_mg})\n"
                "want = tf.grad(m.f_torch, argnums=(0, 1))(T(x), T(y))\n"
                "why = verdict(got, want)\n")
        c[f"second[{self.outer} over {self.inner}, d/d{'xy'[self.wrt]}]"] = (
            f"m.g_inner = mg.grad(m.f, argnums=0, mode={self.inner!r})\n"
            f"got = mg.grad(m.outer, argnums={self.wrt}, mode={self.outer!r})({args_mg})\n"
            f"want = tf.grad(m.outer_torch, argnums={self.wrt})(T(x), T(y))\n"
            "why = verdict(got, want, rtol=1e-5)\n")
        c["jvp"] = ("tx, ty = np.cos(3.0 * x + 1.0), np.sin(2.0 * y)  # tangents\n"
                    f"got = mg.jvp(m.f, ({args_mg}), (mg.tensor(tx), mg.tensor(ty)))\n"
                    "want = tf.jvp(m.f_torch, (T(x), T(y)), (T(tx), T(ty)))\n"
                    "why = verdict(got, want)\n")
        c[f"vmap(grad[{self.vmap_mode}])"] = (
            f"got = mg.vmap(mg.grad(m.f, argnums=0, mode={self.vmap_mode!r}), "
            "in_axes=(0, None))(mg.tensor(xs), mg.tensor(y))\n"
            "want = tf.vmap(tf.grad(m.f_torch, argnums=0), in_dims=(0, None))(T(xs), T(y))\n"
            "why = verdict(got, want)\n")
        c[f"grad[source] of {self.handed}(f)"] = (
            f"got = mg.grad(mg.{self.handed}(m.f), argnums=(0, 1), mode='source')({args_mg})\n"
            "want = tf.grad(m.f_torch, argnums=(0, 1))(T(x), T(y))\n"
            "why = verdict(got, want)\n")
        c[f"vjp[{self.vjp_mode}] of v"] = (  # v's value has any shape: a cotangent of it
            "out_t, pull_t = tf.vjp(m.v_torch, T(x), T(y))\n"
            "gv = np.cos(np.arange(out_t.numel()) + 0.5).reshape(tuple(out_t.shape))\n"
            f"out, pull = mg.vjp(m.v, {args_mg}, mode={self.vjp_mode!r})\n"
            "got = (out,) + pull(mg.tensor(gv))\n"
            "want = (out_t,) + pull_t(T(gv))\n"
            "why = verdict(got, want)\n")
        c[f"jacrev[{self.vjp_mode}] of v"] = (
            f"got = mg.jacrev(m.v, argnums=(0, 1), mode={self.vjp_mode!r})({args_mg})\n"
            "want = tf.jacrev(m.v_torch, argnums=(0, 1))(T(x), T(y))\n"
            "why = verdict(got, want)\n")
        c["backward() through checkpoint(f)"] = (  # (its replayed, pruned pullback)
            "xt, yt = mg.tensor(x, requires_grad=True), mg.tensor(y, requires_grad=True)\n"
            "mg.checkpoint(m.f)(xt, yt).backward()\n"
            "got = tuple(t.grad if t.grad is not None else mg.zeros_like(t) for t in (xt, yt))\n"
            "want = tf.grad(m.f_torch, argnums=(0, 1))(T(x), T(y))\n"
            "why = verdict(got, want)\n")
        return c


def random_shape(rng: random.Random) -> Shape:
    return rng.choice([(), (rng.randint(1, 4),), (rng.randint(1, 4), rng.randint(1, 4))])


def random_program(rng: random.Random) -> Program:
    """Inputs of random (often related) shapes and 1..6 steps that apply to them."""
    sx = random_shape(rng)
    sy = rng.choice([sx, sx, (), sx[-1:], random_shape(rng)])
    nprng = np.random.default_rng(rng.getrandbits(32))
    x = np.round(nprng.uniform(-2, 2, size=sx), 3)
    y = np.round(nprng.uniform(-2, 2, size=sy), 3)
    shapes: list[Shape] = [sx, sy]
    steps: list[Step] = []
    for _ in range(rng.randint(1, 6)):
        for _attempt in range(20):  # draw until a step applies to the shapes at hand
            step = _random_step(rng, len(shapes), shapes)
            out = step_shape(step, shapes)
            if out is not None:
                steps.append(step)
                shapes.append(out)
                break
    return Program(x, y, steps, outer=rng.choice(MODES), inner=rng.choice(MODES),
                   wrt=rng.randint(0, 1), vmap_mode=rng.choice(MODES),
                   batch=rng.randint(1, 3), handed=rng.choice(["checkpoint", "trace"]),
                   vjp_mode=rng.choice(REVERSE_MODES))


def _random_step(rng: random.Random, n: int, shapes: list[Shape]) -> Step:
    # mostly the latest values, so programs are chains more than bushes
    def pick() -> int:
        return rng.choice([n - 1, n - 1, max(0, n - 2), rng.randrange(n)])

    a, b = pick(), pick()
    rank = len(shapes[a])
    if rng.random() < 0.6:
        op = rng.choice(sorted(ELEMENTWISE))
        return Step(op, (a, b) if ELEMENTWISE[op][0] == 2 else (a,))
    op = rng.choice(OTHER_OPS)
    if op == "reduce":
        axis = rng.choice([None] + list(range(rank)))
        return Step(op, (a,), (rng.choice(sorted(REDUCTIONS)), axis, rng.random() < 0.4))
    if op in ("softmax", "log_softmax", "concatenate"):
        return Step(op, (a,) if op != "concatenate" else (a, b), rng.randrange(max(rank, 1)))
    if op in ("matmul", "matmul_t"):
        return Step(op, (a, b))
    return Step(op, (a,))


def check_program(prog: Program, only: str | None = None) -> tuple[dict[str, str | None], str]:
    """Run every check (or ``only`` that one) of ``prog``: name -> None or why it failed."""
    ns = _namespace()
    setup = prog.setup()
    try:
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                exec(compile(setup, "<fuzz setup>", "exec"), ns)
                # no verdict where the oracle itself overflows or is undefined
                want = ns["as_numpy"](ns["m"].v_torch(ns["T"](prog.x), ns["T"](prog.y)))
        except Exception as e:  # noqa: BLE001 - torch refusing the program: not our business
            raise _Skip(str(e)) from e
        if not np.all(np.isfinite(want)) or np.max(np.abs(want), initial=0.0) > 1e6:
            raise _Skip("oracle overflow")
        results = {}
        for name, text in prog.checks().items():
            if only is None or name == only:
                results[name] = _run_check("", text, ns)
        return results, setup
    finally:
        # The setup wrote the program's module into a folder of its own, which source mode
        # reads during the checks; a run checks thousands of programs, so none may stay.
        if "path" in ns:
            shutil.rmtree(ns["path"].parent, ignore_errors=True)


def shrink_program(prog: Program, name: str, deadline: float) -> Program:
    """Greedy shrinking: keep any simplification under which check ``name`` still fails."""
    def fails(p: Program) -> bool:
        if p.shapes() is None:
            return False
        try:
            return check_program(p, only=name)[0].get(name) is not None
        except _Skip:
            return False

    def candidates(p: Program) -> Iterator[Program]:
        for k in range(len(p.steps) - 1, -1, -1):  # drop a step; later uses see its operand
            steps = []
            for j, s in enumerate(p.steps):
                if j == k:
                    continue
                def remap(i: int) -> int:
                    v = 2 + k
                    if i == v:
                        return p.steps[k].args[0]
                    return i - 1 if i > v else i
                steps.append(dataclasses.replace(s, args=tuple(remap(i) for i in s.args)))
            if steps:
                yield dataclasses.replace(p, steps=steps)
        for attr in ("x", "y"):  # smaller inputs: fewer rows/columns, fewer axes
            a: np.ndarray = getattr(p, attr)
            for axis in range(a.ndim):
                if a.shape[axis] > 1:
                    yield _replace(p, **{attr: np.take(a, range(a.shape[axis] - 1),
                                                                  axis=axis)})
            if a.ndim:
                yield _replace(p, **{attr: a.reshape(-1)[:1].reshape(())})
        if p.batch > 1:
            yield dataclasses.replace(p, batch=1)
        for attr in ("x", "y"):  # simpler values
            a = getattr(p, attr)
            for simple in (np.round(a, 1), np.round(a), np.ones_like(a) * 0.5):
                if not np.array_equal(simple, a):
                    yield _replace(p, **{attr: simple})

    return _greedy(prog, candidates, fails, deadline)


def _replace(case: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` for a field chosen by name at run time."""
    return dataclasses.replace(case, **changes)


def _greedy(case: Any, candidates: Callable[[Any], Iterator[Any]], fails: Callable[[Any], bool],
            deadline: float) -> Any:
    """Take the first candidate that still fails, and start over from it, until none does
    (or the time for shrinking is up): the result is locally minimal."""
    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        for cand in candidates(case):
            if time.monotonic() > deadline:
                break
            if fails(cand):
                case, progress = cand, True
                break
    return case


# == 2. random DAGs: workers x partitions x recycling vs the serial run =====================

@dataclass
class Dag:
    """A random graph: ``nodes`` are (op, inputs, device) over placeholders p0..p{n-1}."""

    size: int                          # every placeholder is size x size
    placeholders: list[str]            # their devices
    nodes: list[tuple[str, tuple[int, ...], str]]
    gradients: bool
    feeds: list[np.ndarray]
    fetch_last: int = 3

    def source(self) -> str:
        """``build(placed)``: the graph; every node on its device if ``placed``, else cpu."""
        n = len(self.placeholders)
        lines = ["def build(placed):",
                 "    def on(device):",
                 "        return mg.device(device if placed else 'cpu')",
                 "    with mg.Graph() as g:"]
        names = [f"p{k}" for k in range(n)]
        for k, dev in enumerate(self.placeholders):
            lines.append(f"        with on({dev!r}):")
            lines.append(f"            p{k} = mg.placeholder(shape=({self.size}, {self.size}), "
                         f"name='p{k}')")
        for k, (op, args, dev) in enumerate(self.nodes):
            lines.append(f"        with on({dev!r}):")
            lines.append(f"            n{k} = {DAG_OPS[op].format(*(names[i] for i in args))}")
            names.append(f"n{k}")
        fetches = names[n:][-self.fetch_last:]
        lines.append(f"        fetches = [{', '.join(fetches)}]")
        if self.gradients:
            lines.append(f"        fetches += [d for d in mg.gradients(mg.sum({names[-1]}), "
                         f"[{', '.join(names[:n])}]) if d is not None]")
        lines.append(f"    return g, [{', '.join(names[:n])}], fetches")
        return "\n".join(lines) + "\n"

    def setup(self) -> str:
        feeds = ", ".join(_literal(f) for f in self.feeds)
        return self.source() + f"FEEDS = [{feeds}]\n" + (
            "def run(placed, workers, recycle, times=2):\n"
            "    g, ps, fetches = build(placed)\n"
            "    sess = mg.Session(g, workers=workers, recycle=recycle)\n"
            "    return [sess.run(fetches, dict(zip(ps, FEEDS))) for _ in range(times)]\n"
            "\n"
            "def bits(values):  # the exact bytes, dtype and shape of every fetched value\n"
            "    return [(np.asarray(v).dtype.str, np.shape(v), np.asarray(v).tobytes())\n"
            "            for v in values]\n")

    @staticmethod
    def variants() -> list[tuple[bool, int, bool]]:
        # simplest first: a run's first failing variant is the one reported
        return [(placed, workers, recycle) for placed in (False, True) for workers in (1, 2, 4)
                for recycle in (False, True)]

    @staticmethod
    def check(placed: bool, workers: int, recycle: bool) -> str:
        return ("# the reference: serial, one device, no buffer recycling\n"
                "want = run(False, 1, False, times=1)[0]\n"
                f"runs = run({placed}, {workers}, {recycle})\n"
                "got = runs[-1]\n"
                "why = next((f'run {k + 1}: fetch {j} differs in its bits' for k, r in "
                "enumerate(runs)\n"
                "            for j, (a, b) in enumerate(zip(bits(r), bits(want))) if a != b), None)\n")


# node templates over placeholders/nodes of the same square shape; values stay bounded
DAG_OPS = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}",
    "tanh": "mg.tanh({0})", "sin": "mg.sin({0})", "exp_tanh": "mg.exp(mg.tanh({0}))",
    "matmul": "({0} @ {1}) * 0.25",
    "rowsum": "mg.sum({0}, axis=1, keepdims=True) * 0.1 + {1}",
    "colmean": "mg.mean({0}, axis=0) + {1}",
    "total": "mg.sum({0}) * 0.01 + {1}",
    "softmax": "mg.softmax({0}, axis=-1)",
    "maximum": "mg.maximum({0}, {1})",
    "minimum": "mg.minimum({0}, {1})",
    "add_n": "mg.add_n([{0}, {1}, {2}])",
    "transpose": "mg.transpose({0})",
    "where": "mg.where({0} > {1}, {0}, {1})",
}
_ARITY = {op: max(int(c) for c in t if c.isdigit()) + 1 for op, t in DAG_OPS.items()}


def random_dag(rng: random.Random) -> Dag:
    n_in = rng.randint(1, 3)
    size = rng.randint(2, 6)
    nodes = []
    for k in range(rng.randint(1, 25)):
        op = rng.choice(sorted(DAG_OPS))
        avail = n_in + k
        args = tuple(rng.choice([avail - 1, rng.randrange(avail)]) for _ in range(_ARITY[op]))
        nodes.append((op, args, rng.choice(DEVICES)))
    nprng = np.random.default_rng(rng.getrandbits(32))
    return Dag(size, [rng.choice(DEVICES) for _ in range(n_in)], nodes, rng.random() < 0.6,
               [nprng.normal(size=(size, size)) * 0.5 for _ in range(n_in)],
               fetch_last=rng.randint(1, 3))


def check_dag(dag: Dag, only: str | None = None) -> tuple[dict[str, str | None], str]:
    ns = _namespace()
    setup = dag.setup()
    exec(compile(setup, "<fuzz setup>", "exec"), ns)
    results = {}
    for placed, workers, recycle in Dag.variants():
        name = (f"workers={workers} {'partitioned' if placed else 'one device'} "
                f"recycle={recycle}")
        if only is None or name == only:
            results[name] = _run_check("", Dag.check(placed, workers, recycle), ns)
    return results, setup


def shrink_dag(dag: Dag, name: str, deadline: float) -> Dag:
    def fails(d: Dag) -> bool:
        try:
            return check_dag(d, only=name)[0].get(name) is not None
        except Exception:  # noqa: BLE001 - a candidate that does not build is no candidate
            return False

    def candidates(d: Dag) -> Iterator[Dag]:
        n = len(d.placeholders)
        for k in range(len(d.nodes) - 1, -1, -1):  # drop node k; its users read its input
            v = n + k
            nodes = [(op, tuple((d.nodes[k][1][0] if i == v else i - (i > v)) for i in args), dev)
                     for j, (op, args, dev) in enumerate(d.nodes) if j != k]
            if nodes:
                yield dataclasses.replace(d, nodes=nodes)
        if d.gradients:
            yield dataclasses.replace(d, gradients=False)
        if d.fetch_last > 1:
            yield dataclasses.replace(d, fetch_last=d.fetch_last - 1)
        if d.size > 1:
            yield dataclasses.replace(d, size=d.size - 1, feeds=[f[1:, 1:] for f in d.feeds])
        for k, (op, args, dev) in enumerate(d.nodes):  # fewer devices
            if dev != "cpu":
                nodes = list(d.nodes)
                nodes[k] = (op, args, "cpu")
                yield dataclasses.replace(d, nodes=nodes)
        for k, dev in enumerate(d.placeholders):
            if dev != "cpu":
                yield dataclasses.replace(d, placeholders=[
                    "cpu" if j == k else p for j, p in enumerate(d.placeholders)])
        for k, f in enumerate(d.feeds):  # simpler values
            for simple in (np.round(f, 1), np.round(f)):
                if not np.array_equal(simple, f):
                    yield dataclasses.replace(d, feeds=[simple if j == k else g
                                                        for j, g in enumerate(d.feeds)])

    return _greedy(dag, candidates, fails, deadline)


# == 3. adversarial inputs ==================================================================

# Where minigraph documents a choice of its own, the NumPy reference says it too:
# softmax and log_softmax of integers and bools compute in float64 (as exp does; NumPy
# has no softmax, and the max subtracted in integer arithmetic would wrap around); exp,
# sin, sigmoid ... of bools compute in float64 too (NumPy picks float16, a dtype minigraph
# has not); and a 0-d tensor reduced over axis 0 or -1 is reduced over no axis
# (PyTorch's reading; NumPy raises AxisError).
_AS_FLOAT = "(a if a.dtype.kind == 'f' else a.astype(np.float64))"
_B = "(a.astype(np.float64) if a.dtype == bool else a)"  # (the floating ops' bools)
# (over an empty axis, PyTorch's empty result: NumPy's max of nothing raises)
_SOFTMAX = ("(np.empty_like({f}) if {f}.shape[-1:] == (0,) else "
            "np.exp({f} - np.max({f}, axis=-1, keepdims=True)) / np.sum(np.exp({f} - "
            "np.max({f}, axis=-1, keepdims=True)), axis=-1, keepdims=True))")
_LOG_SOFTMAX = ("(np.empty_like({f}) if {f}.shape[-1:] == (0,) else "
                "{f} - np.max({f}, axis=-1, keepdims=True) - np.log(np.sum(np.exp({f} - "
                "np.max({f}, axis=-1, keepdims=True)), axis=-1, keepdims=True)))")
_OVER_AXIS = "(np.{0}(a, axis={1}) if a.ndim else np.{0}(a, axis=()))"

# name -> (arity, minigraph, torch, NumPy). NumPy decides the dtype (and whether to refuse);
# torch, run on the inputs cast to NumPy's working dtype, gives the values.
ADV_OPS: dict[str, tuple[int, str, str, str]] = {
    "sin": (1, "mg.sin(a)", "torch.sin(a)", f"np.sin({_B})"),
    "cos": (1, "mg.cos(a)", "torch.cos(a)", f"np.cos({_B})"),
    "exp": (1, "mg.exp(a)", "torch.exp(a)", f"np.exp({_B})"),
    "log": (1, "mg.log(a)", "torch.log(a)", f"np.log({_B})"),
    "sqrt": (1, "mg.sqrt(a)", "torch.sqrt(a)", f"np.sqrt({_B})"),
    "tanh": (1, "mg.tanh(a)", "torch.tanh(a)", f"np.tanh({_B})"),
    "sigmoid": (1, "mg.sigmoid(a)", "torch.sigmoid(a)", f"1 / (1 + np.exp(-{_B}))"),
    "log_sigmoid": (1, "mg.log_sigmoid(a)", "torch.nn.functional.logsigmoid(a)",
                    f"-np.logaddexp(0, -{_B})"),
    "relu": (1, "mg.relu(a)", "torch.relu(a)", "np.maximum(a, np.zeros((), a.dtype))"),
    "abs": (1, "abs(a)", "torch.abs(a)", "np.abs(a)"),
    "neg": (1, "-a", "-a", "-a"),
    "sum": (1, "mg.sum(a)", "torch.sum(a)", "np.sum(a)"),
    "sum_axis0": (1, "mg.sum(a, axis=0)", "torch.sum(a, dim=0)", _OVER_AXIS.format("sum", 0)),
    "mean": (1, "mg.mean(a)", "torch.mean(a)", "np.mean(a)"),
    "mean_axis-1": (1, "mg.mean(a, axis=-1)", "torch.mean(a, dim=-1)",
                    _OVER_AXIS.format("mean", -1)),
    "max": (1, "mg.max(a)", "torch.amax(a)", "np.max(a)"),
    "max_axis0": (1, "mg.max(a, axis=0)", "torch.amax(a, dim=0)", _OVER_AXIS.format("max", 0)),
    "min": (1, "mg.min(a)", "torch.amin(a)", "np.min(a)"),
    "min_axis0": (1, "mg.min(a, axis=0)", "torch.amin(a, dim=0)", _OVER_AXIS.format("min", 0)),
    "softmax": (1, "mg.softmax(a, axis=-1)", "torch.softmax(a, dim=-1)",
                _SOFTMAX.format(f=_AS_FLOAT)),
    "log_softmax": (1, "mg.log_softmax(a, axis=-1)", "torch.log_softmax(a, dim=-1)",
                    _LOG_SOFTMAX.format(f=_AS_FLOAT)),
    "transpose": (1, "mg.transpose(a)", "torch.permute(a, tuple(range(a.dim()))[::-1])",
                  "np.transpose(a)"),
    "add_float": (1, "a + 2.5", "a + 2.5", "a + 2.5"),
    "mul_int": (1, "a * 3", "a * 3", "a * 3"),
    "div_int": (1, "a / 2", "a / 2", "a / 2"),
    "rpow": (1, "2.0 ** a", "2.0 ** a", "2.0 ** a"),
    "add": (2, "a + b", "a + b", "a + b"),
    "sub": (2, "a - b", "a - b", "a - b"),
    "mul": (2, "a * b", "a * b", "a * b"),
    "div": (2, "a / b", "a / b", "a / b"),
    "pow": (2, "a ** b", "a ** b", "a ** b"),
    "maximum": (2, "mg.maximum(a, b)", "torch.maximum(a, b)", "np.maximum(a, b)"),
    "minimum": (2, "mg.minimum(a, b)", "torch.minimum(a, b)", "np.minimum(a, b)"),
    # (not remainder: PyTorch's is a - b * floor(a / b), NaN where a / b overflows,
    # 1 % 5e-324, where NumPy's, from the exact fmod, is 0; tests/ check it elsewhere)
    "floor_divide": (2, "a // b", "torch.floor_divide(a, b)", "a // b"),
    "less": (2, "a < b", "a < b", "a < b"),
    "equal": (2, "mg.equal(a, b)", "a == b", "a == b"),
    "where": (2, "mg.where(a > b, a, b)", "torch.where(a > b, a, b)", "np.where(a > b, a, b)"),
    "matmul": (2, "a @ b", "a @ b", "a @ b"),
}
ACCUMULATING = {"sum", "sum_axis0", "mean", "mean_axis-1", "matmul"}
# Ops whose answer may be NumPy's own bits where PyTorch's value differs (see
# adversarial_verdict): the reductions above, and pow, for which NumPy and PyTorch take the
# square root at a single exponent of 0.5 (nan at -inf) and IEEE's pow for an array of
# exponents (+inf there): the libraries disagree with themselves, and minigraph's kernel
# is NumPy's.
NUMPYS_BITS = ACCUMULATING | {"pow"}
FLOAT_POOL = [0.0, -0.0, 1.0, -1.5, 0.5, 2.0, 1e308, -1e308, 1e-308, 5e-324, -5e-324, 3.4e38,
              1e-45, 88.8, -104.0, 710.0, -745.5, 1e16, float("nan"), float("inf"),
              float("-inf")]
INT_POOL = [0, 1, -1, 2, 3, -7, 100, 2**31 - 1, -2**31, 2**62, -2**63]
ADV_SHAPES: list[Shape] = [(), (0,), (1,), (3,), (2, 0), (0, 3), (2, 3), (3, 3)]
ADV_DTYPES = ["float64", "float32", "int64", "int32", "bool"]


def random_array(rng: random.Random, shape: Shape, dtype: str) -> np.ndarray:
    n = int(np.prod(shape))
    if dtype == "bool":
        vals: list[Any] = [rng.random() < 0.5 for _ in range(n)]
    elif dtype.startswith("int"):
        info = np.iinfo(dtype)
        vals = [v for v in (rng.choice(INT_POOL) for _ in range(n))]
        vals = [v if info.min <= v <= info.max else rng.randint(-5, 5) for v in vals]
    else:
        vals = [rng.choice(FLOAT_POOL) if rng.random() < 0.7 else rng.uniform(-3, 3)
                for _ in range(n)]
    with np.errstate(all="ignore"):
        return np.array(vals, dtype=dtype).reshape(shape)


@dataclass
class Adversarial:
    """One op on awkward inputs."""

    op: str
    a: np.ndarray
    b: np.ndarray | None = None

    def setup(self) -> str:
        text = f"a_np = {_literal(self.a)}\n"
        if self.b is not None:
            text += f"b_np = {_literal(self.b)}\n"
        return text

    def check(self) -> str:
        arity, mg_expr, torch_expr, np_expr = ADV_OPS[self.op]
        binary = self.b is not None
        args = "a_np, b_np" if binary else "a_np"
        return (
            "# NumPy's rule decides the dtype, and whether the op is defined at all\n"
            "try:\n"
            f"    expected = np.asarray((lambda a{', b' if binary else ''}: {np_expr})({args}))\n"
            "except Exception as e:\n"
            "    expected = e\n"
            "# PyTorch gives the values, on the inputs cast to NumPy's working dtype\n"
            "try:\n"
            "    work = (expected.dtype if isinstance(expected, np.ndarray) and "
            "expected.dtype.kind == 'f'\n"
            f"            else np.result_type({args}))\n"
            f"    want = (lambda a{', b' if binary else ''}: {torch_expr})"
            f"(torch.tensor(a_np.astype(work)){', torch.tensor(b_np.astype(work))' if binary else ''})\n"
            "    want = want.numpy() if isinstance(want, torch.Tensor) else np.asarray(want)\n"
            "except Exception as e:  # torch has no kernel for this dtype: NumPy's values then\n"
            "    want = expected\n"
            "try:\n"
            f"    got = (lambda a{', b' if binary else ''}: {mg_expr})"
            f"(mg.tensor(a_np){', mg.tensor(b_np)' if binary else ''})\n"
            "    got_np = got.numpy() if hasattr(got, 'numpy') else np.asarray(got)\n"
            "except mg.errors.MinigraphError as e:\n"
            "    got = got_np = e  # a clear refusal is always allowed\n"
            "except (ValueError, IndexError, ZeroDivisionError, OverflowError) as e:\n"
            "    if not isinstance(expected, Exception) or isinstance(e, TypeError):\n"
            "        raise  # a built-in error is clear only where NumPy refuses too\n"
            "    got = got_np = e\n"
            "refused = isinstance(got_np, Exception)\n"
            f"why = adversarial_verdict(got_np, expected, want, {self.op in NUMPYS_BITS!r})\n")


ADV_HELPERS = '''\
def adversarial_verdict(got, expected, want, numpys_bits=False):
    """None if minigraph's answer is acceptable: NumPy's dtype and PyTorch's values, or a
    clear refusal (a MinigraphError; or NumPy's own ValueError-like error where NumPy
    refuses too). An op of ``NUMPYS_BITS`` may also give NumPy's exact value: the order of
    a reduction's additions is unspecified (with huge terms one order overflows to inf
    where another does not), and pow's special values depend on how it is spelled."""
    if numpys_bits and not isinstance(got, Exception) and not isinstance(expected, Exception):
        g, e = np.asarray(got), np.asarray(expected)
        if g.dtype == e.dtype and g.shape == e.shape and g.tobytes() == e.tobytes():
            return None
    if isinstance(got, Exception):
        return None  # refused with a MinigraphError: allowed
    if isinstance(expected, Exception):
        return f"returned {got!r} where NumPy raises {type(expected).__name__}: {expected}"
    if isinstance(want, Exception):
        want = expected
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != expected.dtype:
        return f"dtype: got {got.dtype}, NumPy gives {expected.dtype}"
    if got.shape != want.shape:
        return f"shape: got {got.shape}, want {want.shape}"
    want = want.astype(expected.dtype)
    if got.dtype.kind != "f":
        return None if np.array_equal(got, want) else f"values: got {got!r}, want {want!r}"
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return f"NaN pattern: got {got!r}, want {want!r}"
    finite = np.isfinite(want)
    if not np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)]):
        return f"infinities: got {got!r}, want {want!r}"
    eps = np.finfo(got.dtype).eps
    tiny = np.finfo(got.dtype).smallest_subnormal
    g, w = got[finite].astype(np.float64), want[finite].astype(np.float64)
    if not np.all(np.abs(g - w) <= 64 * eps * np.abs(w) + 4 * tiny):
        return f"values: got {got!r}, want {want!r}"
    return None
'''


def random_adversarial(rng: random.Random) -> Adversarial:
    op = rng.choice(sorted(ADV_OPS))
    shape = rng.choice(ADV_SHAPES)
    a = random_array(rng, shape, rng.choice(ADV_DTYPES))
    if ADV_OPS[op][0] == 1:
        return Adversarial(op, a)
    if op == "matmul":
        k = shape[-1] if shape else 1
        bshape = rng.choice([(k,), (k, rng.randint(0, 3)), shape])
    else:
        bshape = rng.choice([shape, shape, (), shape[-1:]])
    return Adversarial(op, a, random_array(rng, bshape, rng.choice(ADV_DTYPES)))


def check_adversarial(case: Adversarial) -> tuple[dict[str, str | None], str]:
    """One check (named by the op); a stray Python error escaping minigraph fails it."""
    ns = _namespace()
    exec(ADV_HELPERS, ns)
    setup = case.setup()
    name = f"{case.op}({case.a.dtype}{list(case.a.shape)}" + (
        f", {case.b.dtype}{list(case.b.shape)})" if case.b is not None else ")")
    why = _run_check(setup, case.check(), ns)
    if why is None and ns.get("refused"):
        name += REFUSED  # counted in the report: a clear refusal, not a finding
    return {name: why}, ADV_HELPERS + setup


REFUSED = " [refused]"


def shrink_adversarial(case: Adversarial, name: str, deadline: float) -> Adversarial:
    def fails(c: Adversarial) -> bool:
        return next(iter(check_adversarial(c)[0].values())) is not None

    def candidates(c: Adversarial) -> Iterator[Adversarial]:
        for attr in ("a", "b"):
            arr: np.ndarray | None = getattr(c, attr)
            if arr is None:
                continue
            for axis in range(arr.ndim):  # fewer elements (keep the rank: it matters here)
                if arr.shape[axis] > 1:
                    yield _replace(c, **{attr: np.take(arr, range(arr.shape[axis] - 1),
                                                                  axis=axis)})
            flat = arr.reshape(-1)
            for k in range(flat.size):  # simpler elements: 0 or 1 of its dtype
                for simple in (0, 1):
                    if flat[k] != simple:
                        new = flat.copy()
                        new[k] = simple
                        yield _replace(c, **{attr: new.reshape(arr.shape)})

    return _greedy(case, candidates, fails, deadline)


# == the driver ===============================================================================

KINDS: dict[str, tuple[Callable[[random.Random], Any], Callable[..., Any], Callable[..., Any]]] = {
    "programs": (random_program, check_program, shrink_program),
    "dags": (random_dag, check_dag, shrink_dag),
    "adversarial": (random_adversarial, check_adversarial, shrink_adversarial),
}


def _class_of(kind: str, check: str, why: str) -> str:
    """What makes two failures "the same" for reporting: the kind, the check family (mode
    names kept, shapes and dtypes dropped) and the first words of the complaint."""
    if kind == "dags":  # what differs from the reference: recycling, placement, threads
        placed, workers, recycle = _variant_of(check)
        return f"dags:recycle={recycle}:partitioned={placed}:threads={workers > 1}"
    family = check.split("(")[0] if kind == "adversarial" else check
    return f"{kind}:{family}:{why.split(':')[0][:40]}"


def run(seconds: float | None = 60.0, seed: int = 0, cases: dict[str, int] | None = None,
        exclude: Callable[[str, str], bool] | None = None, shrink_seconds: float = 30.0,
        out: Any = sys.stdout) -> Report:
    """Fuzz for ``seconds`` (or exactly ``cases[kind]`` cases of each kind), from ``seed``.

    Case ``i`` of a kind draws from its own ``random.Random`` seeded by
    ``(seed, kind, i)``, so a reported case seed redraws the same case. ``exclude(kind,
    check)`` skips checks known to fail (the CI run uses it for recorded findings).
    Findings are shrunk (at most ``shrink_seconds`` each; one per class, later ones
    counted as repeats) and printed to ``out`` as they are found.
    """
    report = Report(seed)
    start = time.monotonic()
    seen: set[str] = set()
    counters = {kind: itertools.count() for kind in KINDS}
    order = itertools.cycle(["programs", "dags", "adversarial", "adversarial", "adversarial"])
    while True:
        if cases is not None:
            todo = [k for k in KINDS if report.cases[k] < cases.get(k, 0)]
            if not todo:
                break
            kind = next(k for k in order if k in todo)
        else:
            if time.monotonic() - start >= (seconds or 0):
                break
            kind = next(order)
        make, check, shrink = KINDS[kind]
        i = next(counters[kind])
        case_seed = hash_seed(seed, kind, i)
        case = make(random.Random(case_seed))
        report.cases[kind] += 1
        try:
            results, _ = check(case)
        except _Skip:
            report.skipped += 1
            continue
        case_failed = False
        for name, why in results.items():
            if exclude is not None and exclude(kind, name):
                continue
            report.checks[kind] += 1
            if kind == "adversarial" and why is None and REFUSED in name:
                report.refused += 1
            if why is None:
                continue
            cls = _class_of(kind, name, why)
            # A DAG's variants fail together when one cause (say recycling) is at work: the
            # first, simplest failing variant is reported, the others counted as repeats.
            if cls in seen or (kind == "dags" and case_failed):
                case_failed = True
                report.repeats[cls] = report.repeats.get(cls, 0) + 1
                continue
            seen.add(cls)
            case_failed = True
            small = shrink(case, name, time.monotonic() + shrink_seconds)
            try:
                small_results, setup = check(small, **({"only": name} if kind != "adversarial"
                                                       else {}))
            except _Skip:
                small, small_results, setup = case, results, check(case)[1]
            small_name, small_why = next(((n, w) for n, w in small_results.items()
                                          if w is not None), (name, why))
            text = (small.checks()[small_name] if kind == "programs"
                    else Dag.check(*_variant_of(small_name)) if kind == "dags"
                    else small.check())
            finding = Finding(kind, small_name, small_why or why, case_seed,
                              _snippet(setup, text))
            report.findings.append(finding)
            print(finding.render(), file=out, flush=True)
    report.seconds = time.monotonic() - start
    return report


def _variant_of(name: str) -> tuple[bool, int, bool]:
    """Parse ``"workers=2 partitioned recycle=True"`` back into check arguments."""
    workers = int(name.split()[0].split("=")[1])
    return "partitioned" in name, workers, name.endswith("True")


def hash_seed(seed: int, kind: str, i: int) -> int:
    """A stable seed for case ``i`` of ``kind`` (Python's hash() of str is salted)."""
    return (seed * 1_000_003 + sum(ord(c) * 31 ** k for k, c in enumerate(kind)) * 7_919
            + i) % 2**63


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigraph.fuzz", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz")
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock")
    parser.add_argument("--shrink-seconds", type=float, default=30.0,
                        help="time to shrink each finding")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    print(f"fuzz: seed {seed} (rerun with --seed {seed})", flush=True)
    report = run(args.seconds, seed, shrink_seconds=args.shrink_seconds)
    print(report.summary(), flush=True)
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
