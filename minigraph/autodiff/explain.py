"""Print the textbook's traces for any small function: (a.*), (c.*)/(d.*) and (g.*).

``explain(f, x=2.0, y=3.0)`` runs ``f`` once on tensors, reads the tape, and prints

* the evaluation trace, one primitive per line: ``a = x * y = 6``  (a.1)-(a.5);
* one forward-mode trace per input, in evaluation order: ``da = dx * y + x * dy = 3``
  (c.*) with ``dx = 1, dy = 0``, then (d.*) with ``dx = 0, dy = 1``;
* the reverse-mode adjoint trace, in reverse order: ``gx = ga * y + gb * cos(x)``  (g.*).

The formulas are not written by hand: the primitives' own JVP and VJP rules are run on
:class:`Sym` values, which compute a number *and* write down the expression that
produced it. So what is printed is exactly what forward and reverse mode compute.
"""

from __future__ import annotations

import itertools
import math
import string
from typing import Any, Callable

import numpy as np

from ..codegen import literal
from ..errors import DTypeError
from ..ops.operators import ArrayOps
from ..ops.primitive import ATOM, PRECEDENCE, UNARY, Primitive, bind, register_kind
from ..tensor import Tensor, tensor
from . import tape
from .argnums import refuse_integers
from .backward import reverse_sweep
from .forward import push_tangents

_ATOM = ATOM  # how tightly a name or a call binds (the table's precedences: PRECEDENCE)


class Sym(ArrayOps):
    """A value that remembers the expression it came from: ``Sym("ga * y", 3.0)``."""

    __slots__ = ("expr", "value", "prec")
    _priority = 20  # above tensors: rules applied to Syms are written down, not just run

    def __init__(self, expr: str, value: Any, prec: int = _ATOM):
        self.expr, self.value, self.prec = expr, value, prec

    shape = property(lambda self: self.value.shape)
    dtype = property(lambda self: self.value.dtype)
    device = property(lambda self: self.value.device)

    def _bind(self, prim: Primitive, args: tuple, params: dict) -> "Sym":
        values = [a.value if isinstance(a, Sym) else a for a in args]
        with tape.no_grad():
            value = bind(prim, *values, **params)
        return _make(prim, args, params, value)

    def __repr__(self) -> str:
        return f"Sym({self.expr!r})"


register_kind(Sym)


def _text(a: Any, prec: int, strict: bool = False) -> str:
    """An argument's text, in parentheses if it binds more loosely than needed (a
    negative number too, as an operand: ``(-2) ** x``, since ``-2 ** x`` is -4)."""
    if not isinstance(a, Sym):
        text = _number(a, exact=True)
        return f"({text})" if prec > 0 and text.startswith("-") else text
    weaker = a.prec < prec or (strict and a.prec == prec)
    return f"({a.expr})" if weaker else a.expr


def _make(prim: Primitive, args: tuple, params: dict, value: Any) -> Sym:
    """The expression of ``prim`` applied to ``args``, written as the table says."""
    sym = prim.symbol
    if sym in PRECEDENCE and len(args) == 2:
        prec = PRECEDENCE[sym]
        right_strict = sym in ("-", "/", "**")
        text = f"{_text(args[0], prec + (sym == '**'))} {sym} " \
               f"{_text(args[1], prec, strict=right_strict)}"
        return Sym(text, value, prec)
    if sym == "-" and len(args) == 1:
        return Sym(f"-{_text(args[0], UNARY)}", value, UNARY)
    shown = [_text(a, 0) for a in args] + [f"{k}={_param(v)}" for k, v in params.items()]
    return Sym(f"{prim.name}({', '.join(shown)})", value)


def _param(v: Any) -> str:
    """A parameter as text: numbers and tuples as Python writes them, a function (and a
    device) by its name, not its repr (``fn=f``, not ``fn=<function f at 0x7f...>``),
    an array (an integer index) and a NumPy number by their values."""
    return literal(v, _named)


def _named(o: Any) -> str:
    """What ``_param`` writes for a value that is no Python literal. An array by its
    values, as a list, shortened if long (``index=[0, 0, 1]``): its type's name would
    print two different indices, with different derivatives, as the same formula."""
    if isinstance(o, (np.ndarray, np.generic)):
        text = _exact_array(np.asarray(o), separator=", ", threshold=10, edgeitems=3)
        return " ".join(text.split())  # (on one line: a 2-D array prints one row a line)
    return getattr(o, "__name__", None) or getattr(o, "name", None) or type(o).__name__


def _number(v: Any, exact: bool = False) -> str:
    """A value as the textbook would print it: 6, 0.9093, [1. 2.]. ``exact``: a
    constant in a formula, with every digit that reads it back (``x - 1.0000004``: a
    formula must compute the value printed after it, and ``x - 1`` does not); else a
    value after ``=``, with 6 significant digits (4 in an array)."""
    if isinstance(v, Sym):
        v = v.value
    arr = np.asarray(v.numpy() if isinstance(v, Tensor) else v)
    if arr.ndim == 0:
        x = arr.item()
        if float(x).is_integer():  # (-0.0 as -0: y / -0.0 is -inf, y / 0 is inf)
            return "-0" if x == 0 and math.copysign(1.0, x) < 0 else str(int(x))
        return repr(x) if exact else f"{x:.6g}"  # (a Python float's repr reads back)
    if exact:
        return _exact_array(arr)
    return np.array2string(arr, precision=4)


def _exact_array(arr: np.ndarray, **options: Any) -> str:
    """``arr`` with every digit that reads each element back (floatmode="unique"),
    whatever ``np.set_printoptions`` says; ``options`` go to ``np.array2string``.

    A float32 array is written as the float64 numbers it holds, as a scalar is
    (``repr``): its own shortest digits read back only in float32 (float32 0.1 is
    0.10000000149011612, and that is what a float64 computation with it reads)."""
    if arr.dtype.kind == "f":
        arr = arr.astype(np.float64)
    return np.array2string(arr, floatmode="unique", suppress_small=False, **options)


def _names(n: int, taken: set[str]) -> list[str]:
    """Names for intermediates: a, b, c, ... then t1, t2, ... (skipping input names); the
    last is z, the textbook's output."""
    if "z" in taken:
        raise ValueError("explain: the traces call f's result z; give the input named z "
                         "another name")
    letters = (c for c in string.ascii_lowercase if c != "z")
    more = (f"t{k}" for k in itertools.count(1))
    free = (name for name in itertools.chain(letters, more) if name not in taken)
    return list(itertools.islice(free, n - 1)) + ["z"]


def _trace(f: Callable[..., Any], inputs: dict[str, Any]):
    """Run ``f`` on tracked tensors; return the inputs, the tape in order and the names."""
    xs = {name: _input(name, k, v) for k, (name, v) in enumerate(inputs.items())}
    for name, x in xs.items():  # (a vector's "dx = 1" would be a direction, not d/dx)
        if x.shape != ():
            raise ValueError(f"explain: prints the textbook's traces of numbers; input "
                             f"{name} has shape {x.shape}. Give a number, or use mg.jacfwd "
                             f"and mg.jacrev for arrays")
    out = f(*xs.values())
    if not (isinstance(out, Tensor) and out.requires_grad and out.shape == ()):
        what = (f"a {type(out).__name__}" if not isinstance(out, Tensor) else
                f"shape {out.shape}" if out.shape != () else "a value that no input reaches")
        raise ValueError(f"explain: f must return a number computed from its inputs "
                         f"(the z of the traces), got {what}")
    entries, _ = tape._entries([out], set())
    recorded = [t for _, _, t, _ in entries]  # evaluation order: (a.3), (a.4), (a.5)
    if not recorded:
        raise ValueError("explain: f returned one of its inputs unchanged; there is no "
                         "operation to trace")
    names = {id(t): n for n, t in xs.items()}
    for t, n in zip(recorded, _names(len(recorded), set(xs))):
        names[id(t)] = n
    _refuse_derived_names(xs, set(names.values()))
    return xs, recorded, names


def _input(name: str, position: int, value: Any) -> Tensor:
    """The input ``name`` (f's argument ``position``) as a tensor to differentiate, or
    mg.grad's refusal of an integer (``x=2``: pass 2.0), which names the input."""
    x = tensor(value)
    try:
        refuse_integers(x.dtype, position, "explain")
    except DTypeError as exc:
        raise DTypeError(f"{exc} (the input {name} = {value!r})") from None
    return x.requires_grad_()


def _refuse_derived_names(xs: dict[str, Tensor], names: set[str]) -> None:
    """Refuse an input whose name is one the traces give to a tangent (``d`` + a name)
    or an adjoint (``g`` + a name): with inputs x and dx, ``dx`` would stand for both the
    input and x's tangent, and a printed formula, read as written, would be wrong."""
    for n in xs:
        for prefix, what in (("d", "tangent"), ("g", "adjoint")):
            if n.startswith(prefix) and n[1:] in names:
                raise ValueError(f"explain: input {n!r} has the name the traces give to "
                                 f"the {what} of {n[1:]!r} ({prefix} + {n[1:]}): a printed "
                                 f"formula would read the two as one value; give the input "
                                 f"another name")


def _symbol(a: Any, names: dict[int, str]) -> Any:
    """A recorded tensor as its name (``a``); a tensor f made without recording it (a
    constant, a value computed under no_grad) as its number: ``a = x * 2``."""
    if not isinstance(a, Tensor):
        return a
    return Sym(names[id(a)] if id(a) in names else _number(a, exact=True), a.detach())


def _sym_args(args: tuple, names: dict[int, str]) -> list[Any]:
    return [_symbol(a, names) for a in args]


def evaluation_trace(f: Callable[..., Any], label: str = "a", **inputs: Any) -> list[str]:
    """The lines ``(a.k) name = expression = value`` of the forward evaluation."""
    xs, recorded, names = _trace(f, inputs)
    # (an input as exactly as a constant: the formulas below start from it)
    lines = [f"{n} = {_number(x, exact=True)}" for n, x in xs.items()]
    for t in recorded:
        prim, params, _, *args = t._entry
        expr = _make(prim, tuple(_sym_args(args, names)), params, t).expr
        lines.append(f"{names[id(t)]} = {expr} = {_number(t)}")
    return [f"({label}.{k}) {line}" for k, line in enumerate(lines, 1)]


def forward_trace(f: Callable[..., Any], seed: dict[str, float], label: str,
                  **inputs: Any) -> list[str]:
    """The forward-mode trace for one direction, e.g. ``seed={"x": 1, "y": 0}`` (c.*).

    Each line applies the primitive's JVP rules to the tangents already computed,
    in evaluation order: ``da = dx * y + x * dy``.
    """
    xs, recorded, names = _trace(f, inputs)
    tangent = {id(x): Sym("d" + n, tensor(float(seed[n]))) for n, x in xs.items()}
    lines = [f"d{n} = {_number(seed[n])}" for n in xs]
    for t in recorded:  # the forward-tangent step of dual numbers, run on symbols
        prim, params, _, *args = t._entry
        dargs = [Sym("d" + names[id(a)], tangent[id(a)].value)
                 if isinstance(a, Tensor) and id(a) in tangent else None for a in args]
        total = push_tangents(prim, params, Sym(names[id(t)], t.detach()),
                              _sym_args(args, names), dargs)
        tangent[id(t)] = total
        lines.append(f"d{names[id(t)]} = {total.expr} = {_number(total)}")
    return [f"({label}.{k}) {line}" for k, line in enumerate(lines, 1)]


def reverse_trace(f: Callable[..., Any], label: str = "g", **inputs: Any) -> list[str]:
    """The reverse-mode adjoint trace (g.*): ``gz = 1``, then each adjoint once complete.

    This is the one reverse sweep (``backward.reverse_sweep``) over the tape, run on
    symbols: a variable's adjoint is complete once all of its consumers have been
    visited, and is printed as the sum of their shares, in the consumers' evaluation
    order, as the textbook writes (f.5).
    """
    xs, recorded, names = _trace(f, inputs)
    z = recorded[-1]
    lines = [f"g{names[id(z)]} = 1"]

    def completed(t: Tensor, g: Sym) -> Sym:
        if t is not z:
            lines.append(f"g{names[id(t)]} = {g.expr} = {_number(g)}")
        return Sym("g" + names[id(t)], g.value)

    entries = [(t._entry[0], t._entry[1], t, t._entry[3:]) for t in recorded]
    adjoint = reverse_sweep(entries, [(z, Sym("1", tensor(1.0)))],
                            lambda a: isinstance(a, Tensor) and a.requires_grad,
                            lambda a: _symbol(a, names), completed=completed)
    for n, x in reversed(list(xs.items())):
        g = adjoint.get(id(x))
        lines.append(f"g{n} = {g.expr} = {_number(g)}" if g is not None else f"g{n} = 0")
    return [f"({label}.{k}) {line}" for k, line in enumerate(lines, 1)]


def explain(f: Callable[..., Any], **inputs: Any) -> str:
    """All three traces of ``f`` at ``inputs`` as one text (what ``minigraph demo`` prints)."""
    names = list(inputs)
    labels = [c for c in string.ascii_lowercase[2:] if c != "g"]  # ((g.*) is the reverse's)
    if len(names) > len(labels):
        raise ValueError(f"explain: {len(names)} inputs, one forward trace each, and "
                         f"{len(labels)} labels (c.*) ... (z.*) to number them; give at "
                         f"most {len(labels)}")
    out = ["Evaluation trace (forward computation):"]
    out += ["  " + line for line in evaluation_trace(f, **inputs)]
    for name, label in zip(names, labels):
        seed = {n: float(n == name) for n in names}
        shown = ", ".join(f"d{n} = {int(v)}" for n, v in seed.items())
        out.append(f"Forward mode, one pass for d/d{name} ({shown}):")
        out += ["  " + line for line in forward_trace(f, seed, label, **inputs)]
    out.append("Reverse mode, one sweep for every input (gz = 1):")
    out += ["  " + line for line in reverse_trace(f, **inputs)]
    return "\n".join(out)
