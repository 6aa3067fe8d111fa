"""Source transformation: ``mg.source_grad`` and ``mg.grad(..., mode="source")``.

Every gradient is checked against the tape, and against closed forms or central finite
differences; values too. The generated text is checked where it is the lesson (the
textbook's (g.*) sequence, the stack of a loop, constants kept, dead code gone), and it
must compile and run on its own. Unsupported Python is refused before anything runs, with
the construct, function, file and line.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import math
import re
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minigraph as mg
from minigraph.autodiff import source
from minigraph.autodiff.source import SourceTransformError
from minigraph.errors import GradientError, ShapeError

from oracle import CASES

rng = np.random.default_rng(7)


# -- functions under test (at module level: source transformation reads their text) -----

def textbook(x, y):
    return x * y + mg.sin(x)


def broadcast_affine(x, b):
    return ((x + b) * x).sum()


def row_means(x, w):
    m = x.mean(axis=1, keepdims=True)
    return mg.sum((x - m) * w) / x.shape[0]


def matmul_tanh(w, x):
    return mg.tanh(w @ x).mean()


def softmax_xent(logits, labels):
    p = mg.softmax(logits, axis=1)
    return -(mg.log(p) * mg.one_hot(labels, 3)).sum() / logits.shape[0]


def mlp(x, w1, b1, w2, labels):
    h = mg.relu(x @ w1 + b1)
    return mg.cross_entropy(h @ w2, labels)


def sigmoid_pow(x):
    s = mg.sigmoid(x)
    return (s ** 2 + mg.sqrt(x * x + 1.0) / 2.0 - mg.exp(-x)).sum()


def _pair(a, b):
    return a * b, mg.cos(a)


def tuples_and_helpers(x, y):
    p, q = _pair(x, y)
    p += q
    p *= 2.0
    return (p - y).sum()


def rnn(xs, w, u):
    h = mg.tanh(xs[0, :] @ w)  # every axis indexed: the Array API asks for it
    for t in range(1, xs.shape[0]):
        h = mg.tanh(xs[t, :] @ w + h @ u)
    return h.sum()


def running_sum(x):
    s = 0.0
    for i in range(3):
        s = s + x[i] * x[i]
    return s


def nested_loops(x, w):
    s = mg.zeros((), "float64", "cpu")
    h = x
    for i in range(3):
        for j in range(2):
            h = mg.tanh(h * w[j])
        s = s + h.sum() * (i + 1)
    return s


def branch_in_loop(x):
    s = 0.0
    for i in range(4):
        v = x[i]
        if v > 0:
            s = s + v * v
        else:
            s = s - mg.sin(v)
    return s


def branch_in_loop_inlined(x):
    return branch_in_loop(x)


def branch_on_index(x):
    s = x[0]
    for i in range(1, 4):
        if i == 2:
            s = s * x[i]
        else:
            s = s + x[i]
    return s


def swap_loop(a, b):
    for i in range(3):
        a, b = b, a * b
    return a + b


def branch(x):
    if x.sum() > 0:
        y = mg.sin(x)
    else:
        y = x * 2.0
    return y.sum()


def return_in_both(x):
    if not x.sum() > 0:
        return mg.exp(x).sum()
    return (x * x).sum()


def static_shape_branch(x):
    if x.ndim == 2:
        x = x.sum(axis=0)
    return (x * x).sum()


def with_dead_code(x, y):
    unused = mg.exp(y) * 3.0  # noqa: F841  (dead code, removed)
    return x * 2.0 - 0.0


def repeat(x, n):
    s = x
    for i in range(n):
        s = s * x
    return s.sum()


def second(x):
    return x * mg.sin(x)


def cached(x, w):  # only the cache test uses it: its cache starts empty
    return (x * w).sum() / x.shape[0]


# -- helpers --------------------------------------------------------------------------------

def as_tuple(g):
    return g if isinstance(g, tuple) else (g,)


def numeric_grad(f, args, k, eps=1e-6):
    """Central differences of f by argument k (evaluated eagerly, on NumPy copies)."""
    base = np.array(args[k], dtype=np.float64)
    out = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        vals = []
        for step in (eps, -eps):
            moved = base.copy()
            moved[idx] += step
            call = [mg.tensor(a) if isinstance(a, (float, np.ndarray)) else a for a in args]
            call[k] = mg.tensor(moved)
            vals.append(f(*call).item())
        out[idx] = (vals[0] - vals[1]) / (2 * eps)
    return out


LABELS = mg.tensor(np.array([0, 2, 1, 2, 0]))
AGREEMENT = {  # name -> (function, arguments, argnums)
    "textbook": (textbook, (2.0, 3.0), (0, 1)),
    "broadcasting": (broadcast_affine, (rng.normal(size=(2, 3)), rng.normal(size=3)), (0, 1)),
    "mean keepdims": (row_means, (rng.normal(size=(4, 3)), rng.normal(size=(1, 3))), (0, 1)),
    "matmul vector": (matmul_tanh, (rng.normal(size=(3, 4)), rng.normal(size=4)), (0, 1)),
    "softmax cross-entropy": (softmax_xent, (rng.normal(size=(5, 3)), LABELS), 0),
    "mlp": (mlp, (mg.tensor(rng.normal(size=(5, 4))), rng.normal(size=(4, 6)), rng.normal(size=6),
                  rng.normal(size=(6, 3)), LABELS), (1, 2, 3)),
    "sigmoid pow sqrt": (sigmoid_pow, (rng.normal(size=4),), 0),
    "tuples and helpers": (tuples_and_helpers, (rng.normal(size=3), rng.normal(size=3)), (0, 1)),
    "rnn loop": (rnn, (rng.normal(size=(4, 3)), rng.normal(size=(3, 3)) * 0.5,
                       rng.normal(size=(3, 3)) * 0.5), (0, 1, 2)),
    "running sum": (running_sum, (rng.normal(size=3),), 0),
    "nested loops": (nested_loops, (rng.normal(size=3), rng.normal(size=2)), (0, 1)),
    "branch in loop": (branch_in_loop, (np.array([1.0, -2.0, 3.0, -0.5]),), 0),
    "branch on index": (branch_on_index, (rng.normal(size=4),), 0),
    "swap in loop": (swap_loop, (1.5, 0.7), (0, 1)),
    "branch taken": (branch, (np.array([1.0, -0.5, 2.0]),), 0),
    "branch not taken": (branch, (np.array([-1.0, -0.5, 0.2]),), 0),
    "return in both branches": (return_in_both, (np.array([-1.0, 0.3, 0.2]),), 0),
    "static branch": (static_shape_branch, (rng.normal(size=(2, 3)),), 0),
    "static int argument": (repeat, (rng.normal(size=3), 3), 0),
}


# -- the textbook example ------------------------------------------------------------------

def test_textbook_gradient_is_the_closed_form():
    gx, gy = mg.source_grad(textbook, argnums=(0, 1))(2.0, 3.0)
    assert gx.item() == pytest.approx(3 + math.cos(2.0), rel=1e-15)
    assert gy.item() == 2.0
    value, gx = mg.value_and_grad(textbook, argnums=0, mode="source")(2.0, 3.0)
    assert value.item() == pytest.approx(6 + math.sin(2.0), rel=1e-15)
    assert gx.item() == mg.grad(textbook, mode="source")(2.0, 3.0).item()


def body_lines(text, start, stop=None):
    lines = [line.strip() for line in text.splitlines()]
    begin = next(k for k, line in enumerate(lines) if line.startswith(start))
    end = next((k for k, line in enumerate(lines) if stop and line.startswith(stop)), None)
    return [line for line in lines[begin + 1:end] if line]


def test_textbook_source_is_the_evaluation_and_adjoint_traces():
    """(a.3)-(a.5) forward; (g.1)-(g.5) in reverse, gz = 1 kept as a tensor of ones."""
    gf = mg.source_grad(textbook, argnums=(0, 1))
    gf(2.0, 3.0)
    assert body_lines(gf.forward_source, "def textbook") == [
        "a = x * y", "b = mg.sin(x)", "z = a + b", "return z"]
    assert body_lines(gf.source, "# forward sweep", "# reverse sweep") == [
        "a = x * y", "b = mg.sin(x)", "z = a + b"]
    assert body_lines(gf.source, "# reverse sweep") == [
        "gz = mg.ones((), 'float64', 'cpu')",  # (g.1) gz = 1
        "gb = gz",                              # (g.2)
        "ga = gz",                              # (g.3)
        "gy = ga * x",                          # (g.4)
        "gx = ga * y + gb * mg.cos(x)",         # (g.5)
        "return z, (gx, gy)"]


def test_source_is_available_before_any_call():
    assert "gx = ga * y + gb * mg.cos(x)" in mg.source_grad(textbook, (0, 1)).source


@pytest.mark.parametrize("name", ["rnn loop", "branch in loop", "branch on index", "mlp"])
def test_forward_source_computes_the_value(name):
    """The normalised primal, with loops and branches, is a program of its own."""
    f, args, argnums = AGREEMENT[name]
    gf = mg.source_grad(f, argnums)
    value = mg.value_and_grad(f, argnums, mode="source")(*args)[0]
    namespace = dict(gf.program_for(*args).fn.__globals__)  # mg and the constants
    exec(compile(gf.forward_source, "<forward>", "exec"), namespace)
    values = [mg.tensor(a) if isinstance(a, (float, np.ndarray)) else a for a in args]
    assert namespace[f.__name__](*values).item() == value.item()
    assert "stack" not in gf.forward_source


def test_generated_text_compiles_and_runs_on_its_own():
    gf = mg.source_grad(broadcast_affine, argnums=(0, 1))
    x, b = rng.normal(size=(2, 3)), rng.normal(size=3)
    expected = gf(x, b)
    namespace = {"mg": mg}
    exec(compile(gf.source, "<generated>", "exec"), namespace)
    value, grads = namespace["grad_broadcast_affine"](mg.tensor(x), mg.tensor(b))
    for g, e in zip(grads, expected):
        np.testing.assert_array_equal(g.numpy(), e.numpy())
    exec(compile(gf.forward_source, "<forward>", "exec"), namespace)
    assert namespace["broadcast_affine"](mg.tensor(x), mg.tensor(b)).item() == value.item()


# -- agreement with the tape, finite differences and closed forms ------------------------------

@pytest.mark.parametrize("name", list(AGREEMENT))
def test_agrees_with_tape_and_finite_differences(name):
    f, args, argnums = AGREEMENT[name]
    value, grads = mg.value_and_grad(f, argnums, mode="source")(*args)
    tape_value, tape_grads = mg.value_and_grad(f, argnums, mode="tape")(*args)
    assert value.item() == pytest.approx(tape_value.item(), rel=1e-12, abs=1e-14)
    for k, g, t in zip(np.atleast_1d(argnums), as_tuple(grads), as_tuple(tape_grads)):
        assert g.shape == np.shape(args[k]) and g.dtype == "float64"
        np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(g.numpy(), numeric_grad(f, args, k), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", list(CASES))
def test_oracle_closed_forms(name):
    f, args, argnums, expected = CASES[name]
    grads = mg.grad(f, argnums=argnums, mode="source")(*args)
    for g, e in zip(as_tuple(grads), expected if isinstance(argnums, tuple) else (expected,)):
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-10, atol=1e-12)


def test_runs_on_every_backend(backend):
    """NumPy and array-api-strict's fake devices: the program never mixes devices."""
    x, b = rng.normal(size=(2, 3)), rng.normal(size=3)
    gx, gb = mg.grad(broadcast_affine, argnums=(0, 1), mode="source")(x, b)
    np.testing.assert_allclose(gx.numpy(), 2 * x + b, rtol=1e-12)
    np.testing.assert_allclose(gb.numpy(), x.sum(axis=0), rtol=1e-12)
    xs = mg.tensor(rng.normal(size=(4, 3)), device="cpu:1")
    w, u = (mg.tensor(rng.normal(size=(3, 3)) * 0.5, device="cpu:1") for _ in range(2))
    grads = mg.grad(rnn, argnums=(0, 1, 2), mode="source")(xs, w, u)
    for g, t in zip(grads, mg.grad(rnn, argnums=(0, 1, 2))(xs, w, u)):
        assert g.device.name == "cpu:1"
        np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1e-12)


def test_float32_stays_float32():
    x = mg.tensor(rng.normal(size=3), dtype="float32")
    value, g = mg.value_and_grad(running_sum, mode="source")(x)
    assert value.dtype == "float32" and g.dtype == "float32"
    assert "'float32'" in mg.source_grad(running_sum).program_for(x).source


def test_kernel_program_and_mg_program_agree_bit_for_bit():
    """A program runs on arrays (kernels: a straight-line program's lines compiled as a
    graph, a program with loops or run-time ifs written again with kernel calls) or on
    tensors (mg functions), with the same bits."""
    for f, args, argnums in AGREEMENT.values():
        gf = mg.source_grad(f, argnums)
        fast = as_tuple(gf(*args))
        value, grads = mg.value_and_grad(f, argnums, mode="source")(*args)
        prog = gf.program_for(*args)
        looped = re.search(r"^ +(for|if) .*:$", prog.source, re.MULTILINE) is not None
        assert prog.raw is not None, prog.source
        assert (" = _k_" if looped else " = k_") in prog.raw_source
        values = [mg.tensor(a) if isinstance(a, (float, np.ndarray)) else a for a in args]
        slow_value, slow = prog.fn(*values)
        np.testing.assert_array_equal(value.numpy(), slow_value.numpy())
        for a, b, c in zip(fast, as_tuple(grads), as_tuple(slow)):
            np.testing.assert_array_equal(a.numpy(), c.numpy())
            np.testing.assert_array_equal(b.numpy(), c.numpy())
        before = [np.array(getattr(a, "data", a), copy=True) for a in args]
        for t in fast + (value,):  # the caller's own arrays: written, nothing else changes
            if isinstance(t.data, np.ndarray):
                t.data[...] = 777.0
        for a, b in zip(args, before):
            np.testing.assert_array_equal(getattr(a, "data", a), b)
        for a, c in zip(as_tuple(gf(*args)), as_tuple(slow)):
            np.testing.assert_array_equal(a.numpy(), c.numpy())


def test_gradient_of_a_source_gradient():
    """The generated program is made of minigraph operations: the tape can differentiate it."""
    d2 = mg.grad(mg.grad(second, mode="source"))(0.7)
    assert d2.item() == pytest.approx(2 * math.cos(0.7) - 0.7 * math.sin(0.7), rel=1e-12)


# -- hypothesis: random straight-line programs, written to a module ---------------------------

OPS = {
    "add": ("{a} + {b}", lambda a, b: a + b),
    "sub": ("{a} - {b}", lambda a, b: a - b),
    "mul": ("{a} * {b}", lambda a, b: a * b),
    "div": ("{a} / (1.0 + {b} * {b})", lambda a, b: a / (1.0 + b * b)),
    "sin": ("mg.sin({a})", lambda a, b: np.sin(a)),
    "cos": ("mg.cos({a})", lambda a, b: np.cos(a)),
    "tanh": ("mg.tanh({a})", lambda a, b: np.tanh(a)),
    "sigmoid": ("mg.sigmoid({a})", lambda a, b: 1 / (1 + np.exp(-a))),
    "exp_tanh": ("mg.exp(mg.tanh({a}))", lambda a, b: np.exp(np.tanh(a))),
    "square": ("{a} ** 2", lambda a, b: a ** 2),
}
_modules = itertools.count()


@st.composite
def programs(draw):
    prog = []
    for k in range(draw(st.integers(1, 10))):
        prog.append((draw(st.sampled_from(sorted(OPS))), draw(st.integers(0, k + 1)),
                     draw(st.integers(0, k + 1))))
    return prog


def write_module(prog, directory):
    """The program as Python source in a new module (inspect can read it there)."""
    lines = ["import minigraph as mg", "", "", "def f(v0, v1):"]
    for k, (op, i, j) in enumerate(prog, start=2):
        lines.append(f"    v{k} = " + OPS[op][0].format(a=f"v{i}", b=f"v{j}"))
    lines.append(f"    return mg.sum(v{len(prog) + 1})")
    path = directory / f"generated_{next(_modules)}.py"
    path.write_text("\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.f


def run_numpy(prog, x0, x1):
    values = [x0, x1]
    for op, i, j in prog:
        values.append(OPS[op][1](values[i], values[j]))
    return values[-1].sum()


@given(programs(), st.lists(st.floats(-1.5, 1.5), min_size=4, max_size=4))
def test_random_straight_line_programs(tmp_path_factory, prog, xs):
    x0, x1 = np.array(xs[:2]), np.array(xs[2:])
    if not abs(run_numpy(prog, x0, x1)) < 1e3:
        return  # repeated squaring can overflow; keep the values tame
    f = write_module(prog, tmp_path_factory.getbasetemp())
    value, grads = mg.value_and_grad(f, (0, 1), mode="source")(x0, x1)
    assert value.item() == pytest.approx(run_numpy(prog, x0, x1), rel=1e-12, abs=1e-12)
    for g, t in zip(grads, mg.grad(f, (0, 1))(x0, x1)):
        np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1e-10, atol=1e-12)
    eps = 1e-6
    for k, x in enumerate((x0, x1)):
        for e in range(2):
            hi, lo = [x0.copy(), x1.copy()], [x0.copy(), x1.copy()]
            hi[k][e] += eps
            lo[k][e] -= eps
            numeric = (run_numpy(prog, *hi) - run_numpy(prog, *lo)) / (2 * eps)
            assert grads[k].numpy()[e] == pytest.approx(numeric, rel=1e-5, abs=1e-6)


# -- loop variables that take each other's values ---------------------------------------------

def swap_in_a_loop(x, w):
    a, b = x, w
    for i in range(2):
        a, b = b * a, a  # b takes a's value from before the line
    return mg.sum(a + 2.0 * b)  # w x^2 + 2 w x


def pure_swap(x, w):
    a, b = x * 1.0, w * 3.0
    for i in range(3):
        a, b = b, a
    return mg.sum(a * a + b)  # 9 w^2 + x


def rotate_through_a_temporary(x, w):
    a, b = x, w
    for i in range(2):
        t = a
        a = b * a
        b = t
    return mg.sum(a + 2.0 * b)  # as swap_in_a_loop


def assigned_on_one_path_then_in_the_loop(x, w):
    a = x * 1.0
    if mg.sum(a) > 0.0:
        t = a * w
    for i in range(2):
        t = a * 2.0  # t assigned before it is read: the if's one branch does not matter
        a = t * w
    return mg.sum(a)  # 4 w^2 x


def assigned_on_one_path_twice(x, w):
    a = x * 1.0
    if mg.sum(a) > 0.0:
        t = a * w
    if mg.sum(a) > 0.5:
        t = a  # t: assigned on one path of each if, read only where assigned
        a = t * w
    return mg.sum(a)  # w x


def reassigned_every_iteration_never_read(x, w):
    c = x
    a = x
    for i in range(2):
        a = x  # a loop variable no iteration reads, nor anything after the loop
        if mg.sum(x) > 100.0:
            c = x * w
    return mg.sum(c)  # x


@pytest.mark.parametrize("f, closed_form", [
    (swap_in_a_loop, lambda x, w: (2 * w * x + 2 * w, x * x + 2 * x)),
    (pure_swap, lambda x, w: (np.ones_like(x), 18 * w)),
    (rotate_through_a_temporary, lambda x, w: (2 * w * x + 2 * w, x * x + 2 * x)),
    (assigned_on_one_path_then_in_the_loop, lambda x, w: (4 * w * w, 8 * w * x)),
    (assigned_on_one_path_twice, lambda x, w: (w, x)),
    (reassigned_every_iteration_never_read, lambda x, w: (np.ones_like(x), 0 * w)),
], ids=lambda v: getattr(v, "__name__", ""))
def test_loop_variables_that_take_each_others_values(f, closed_form):
    """``a, b = b * a, a`` in a loop: the carry at the body's end reads a's value from the
    top of the body, which the carry itself overwrites. The reverse sweep took the a it
    read for the a it made and gave gb to b * a: every mode but source mode got
    d/dx = w + 2 right, source mode 2.1 for 2.7. Also two programs it could not write:
    an unread loop variable's adjoint (no name to give it, a TypeError from inside) and a
    name assigned on one path of an earlier if (refused, its message an internal repr)."""
    x, w = np.array([1.5, -0.5]), np.array([0.7, 1.3])
    gx, gw = mg.grad(f, argnums=(0, 1), mode="source")(x, w)
    want_x, want_w = closed_form(x, w)
    np.testing.assert_allclose(gx.numpy(), want_x, rtol=1e-13)
    np.testing.assert_allclose(gw.numpy(), want_w, rtol=1e-13)


def loop_in_a_branch(x, w):
    c = mg.sum(x)
    if c > 0.0:
        for i in range(2):
            c = c * w[i]
    return c  # sum(x) w0 w1 where sum(x) > 0


def view_before_a_loop(x, w):
    a = x * 1.0
    v = a[1:]
    for i in range(2):
        a += w  # in eager mode v sees it: v is a's memory
    return mg.sum(v)


def view_updated_in_a_loop(x, w):
    a = x * 1.0
    v = a[1:]
    for i in range(2):
        v += w[1:]  # writes a's memory
    return mg.sum(a)


def view_rebound_in_a_loop(x, w):
    h = x * 1.0
    v = h[1:]
    for i in range(2):
        v = v + w[1:]  # a new value: v no longer views h
        h += w         # so this writes nothing v holds, from the first iteration on
    h += w
    return mg.sum(v * v) + mg.sum(h * h)


def test_views_and_loops_refused_where_eager_mode_writes_through_a_view_only():
    """The loop variable that starts as a view's base (or as the view) was kept a view
    after the loop, and for the body's whole length, where the body rebinds it: a
    legitimate update of h after v = v + ... was refused, naming x (which a * 1.0 is
    written as). Refused only where eager mode writes memory another name views; the
    other is the closed form (gx = 2 h + 2 v, on v's elements; gw likewise, times 3 for
    h's three additions and 2 for v's two)."""
    with pytest.raises(SourceTransformError, match=r"an update in place of v, whose value "
                                                   r"\(or memory: a view\) a"):
        mg.grad(view_updated_in_a_loop, argnums=(0, 1), mode="source")(np.ones(3), np.ones(3))
    x, w = np.array([0.3, -0.7, 1.1, 0.5]), np.array([0.9, 1.2, -0.4, 0.8])
    gx, gw = mg.grad(view_rebound_in_a_loop, argnums=(0, 1), mode="source")(x, w)
    h, v = x + 3 * w, x[1:] + 2 * w[1:]
    np.testing.assert_allclose(gx.numpy(), 2 * h + np.r_[0.0, 2 * v], rtol=1e-13)
    np.testing.assert_allclose(gw.numpy(), 6 * h + np.r_[0.0, 4 * v], rtol=1e-13)


def test_a_loop_in_a_branch_and_a_view_before_a_loop():
    """A loop inside an if decided at run time, reading a variable from before the if:
    the reverse branch looked the loop's accumulator up among the variables it had seen,
    where the loop had not put it (KeyError from inside). And a view taken before a loop
    whose base the loop updates in place: the loop variable was a new variable, whose
    memory the view did not share in the program, so source mode gave sum(v) = 5 where
    eager mode gives 105, silently; it refuses now, as every other mode and source mode
    without the loop do. Closed form for the first: (w0 w1, w0 w1; sum(x) w1, sum(x) w0)."""
    x, w = np.array([0.5, 0.2]), np.array([0.7, -1.3])
    gx, gw = mg.grad(loop_in_a_branch, argnums=(0, 1), mode="source")(x, w)
    np.testing.assert_allclose(gx.numpy(), [0.7 * -1.3] * 2, rtol=1e-14)
    np.testing.assert_allclose(gw.numpy(), [0.7 * -1.3, 0.7 * 0.7], rtol=1e-14)
    with pytest.raises(SourceTransformError, match="an update in place of a, whose value "
                                                   r"\(or memory: a view\) v"):
        mg.grad(view_before_a_loop, argnums=(0, 1), mode="source")(np.ones(3), np.ones(3))


def power_by_the_loop_index(x, w):
    acc = 0.0
    for i in range(x.shape[0]):
        acc = acc + x[i] * w[i] ** i
    return acc


def test_a_power_by_the_loop_index_is_differentiated():
    """d(w ** i)/dw is ``where(i == 0, 0, g * i * w ** (i - 1))``: the rule's condition on the
    loop index was a Python object that the program kept as a constant, and the program
    failed when it ran (a RuntimeError from inside). It is written as its text. Closed
    form: d/dx_i = w_i ** i, d/dw_i = i x_i w_i ** (i - 1)."""
    x, w = np.array([0.5, 1.5, -0.3]), np.array([0.7, 1.2, 0.4])
    gf = mg.source_grad(power_by_the_loop_index, argnums=(0, 1))
    gx, gw = gf(x, w)
    np.testing.assert_allclose(gx.numpy(), w ** np.arange(3), rtol=1e-14)
    np.testing.assert_allclose(gw.numpy(), [0.0, 1.5, 2 * -0.3 * 0.4], rtol=1e-14)
    assert "mg.where(i == 0, 0.0, gc * (i * b ** (i - 1)))" in gf.source


# -- what the text shows -----------------------------------------------------------------------

def test_loop_saves_its_values_on_a_stack():
    gf = mg.source_grad(rnn, argnums=(1, 2))
    gf(rng.normal(size=(4, 3)), rng.normal(size=(3, 3)), rng.normal(size=(3, 3)))
    text = gf.source
    assert "for t in range(1, 4):" in text and "for t in reversed(range(1, 4)):" in text
    assert text.count("stack.append(") == 1 and text.count("stack.pop()") == 1
    assert text.index("stack.append(") < text.index("# reverse sweep") < text.index("stack.pop()")


def test_branch_in_a_loop_is_decided_by_the_saved_condition():
    gf = mg.source_grad(branch_in_loop)
    gf(np.array([1.0, -2.0, 3.0, -0.5]))
    reverse = gf.source.split("# reverse sweep")[1]
    pop = next(line.strip() for line in reverse.splitlines() if "stack.pop()" in line)
    condition = next(line.strip() for line in reverse.splitlines()
                     if line.strip().startswith("if "))
    assert condition[3:-1] in pop.split(" = ")[0].split(", ")  # the if reads a popped value


def test_every_straight_line_run_goes_through_the_one_reverse_sweep(monkeypatch):
    """Issue 17: source mode has no reverse walk of its own for lines. The top level, the
    loop's body and both branches are runs of lines, each reversed by backward.py's
    reverse_sweep; a copy (``m = k``, a join) is an identity entry of that sweep."""
    from minigraph.autodiff import backward
    from minigraph.autodiff.source import adjoint
    records = []

    def recording(entries, seeds, *args, **kwargs):
        records.append([entry[0].name for entry in entries])
        return backward.reverse_sweep(entries, seeds, *args, **kwargs)

    monkeypatch.setattr(adjoint, "reverse_sweep", recording)
    x = np.array([1.0, -2.0, 3.0, -0.5])
    gx = mg.source_grad(branch_in_loop_inlined)(x)  # (a function of its own: not cached)
    expected = np.where(x > 0, 2 * x, -np.cos(x))
    np.testing.assert_allclose(gx.numpy(), expected, rtol=1e-12)
    # each branch ends with its join (d = c, d = f: an identity); the body's run before
    # the if reads x[i] and compares it
    for run in (["mul", "add", "identity"], ["sin", "sub", "identity"], ["getitem", "greater"]):
        assert run in records


def test_constants_stay_numbers_and_dead_code_goes():
    gf = mg.source_grad(with_dead_code, argnums=(0, 1))
    gx, gy = gf(2.0, 3.0)
    assert gx.item() == 2.0 and gy.item() == 0.0
    assert "exp" not in gf.source and "- 0.0" not in gf.source  # dead, and x - 0 is x
    assert "x * 2.0" in gf.forward_source and "gz * 2.0" in gf.source


SCALE = mg.tensor(np.array([1.0, 2.0, 3.0]))


def weighted(x):
    return (x * SCALE).sum()


def test_globals_are_constants_captured_when_the_program_is_built(monkeypatch):
    """A global is a constant of the program; bound to another tensor, it makes the
    program stale and the next call builds it again (torch.compile's guards; jax.jit
    would keep the old value, where the tape reads the new one)."""
    gf = mg.source_grad(weighted)
    x = np.ones(3)
    np.testing.assert_array_equal(gf(x).numpy(), [1.0, 2.0, 3.0])
    assert "SCALE: (3,) float64 on cpu" in gf.source and "gx = ga * SCALE" in gf.source
    monkeypatch.setitem(globals(), "SCALE", mg.tensor(np.zeros(3)))
    np.testing.assert_array_equal(gf(x).numpy(), [0.0, 0.0, 0.0])  # d/dx sum(x * SCALE)


def test_tensor_arguments_are_read_when_the_program_runs():
    """Labels are an argument, not a constant: new labels, same program, new gradient."""
    gf = mg.source_grad(softmax_xent)
    logits = rng.normal(size=(5, 3))
    for labels in (LABELS, mg.tensor(np.array([1, 1, 0, 2, 2]))):
        np.testing.assert_allclose(gf(logits, labels).numpy(),
                                   mg.grad(softmax_xent)(logits, labels).numpy(), rtol=1e-12)
    assert len(gf.programs) == 1 and "mg.one_hot(labels, 3, 'float64')" in gf.source


# -- the cache ---------------------------------------------------------------------------------

def test_program_is_built_once_per_signature(monkeypatch):
    calls = []
    transform = source._transform
    monkeypatch.setattr(source.cache, "_transform", lambda *a: calls.append(a) or transform(*a))
    gf = mg.source_grad(cached, argnums=(0, 1))
    x, w = rng.normal(size=(4, 3)), rng.normal(size=(1, 3))
    first = gf(x, w)
    second = gf(x * 2, w)
    assert len(calls) == 1 and len(gf.programs) == 1
    assert not np.array_equal(first[1].numpy(), second[1].numpy())  # it did run again
    again = mg.grad(cached, (0, 1), mode="source")  # another gradient of the same f
    again(x, w)
    assert len(calls) == 1
    gf(rng.normal(size=(5, 3)), w)  # a new shape: a new program
    gf(mg.tensor(x, dtype="float32"), mg.tensor(w, dtype="float32"))  # a new dtype
    assert len(calls) == 3 and len(gf.programs) == 3


def repeat_only_here(x, n):  # its cache starts empty
    return repeat(x, n)


def test_static_arguments_are_part_of_the_signature():
    gf = mg.source_grad(repeat_only_here)
    x = rng.normal(size=3)
    np.testing.assert_allclose(gf(x, 2).numpy(), 3 * x ** 2, rtol=1e-12)
    np.testing.assert_allclose(gf(x, 3).numpy(), 4 * x ** 3, rtol=1e-12)
    assert len(gf.programs) == 2


# -- refusals: construct, function, file and line, before anything runs -------------------------

REFUSALS = {  # construct -> (source of f, line of the construct within it)
    "a while loop": ("def f(x):\n    while x.sum() > 0:\n        x = x - 1.0\n    return x\n", 2),
    "try/except": ("def f(x):\n    try:\n        y = x * 2.0\n    except ValueError:\n"
                   "        y = x\n    return y\n", 2),
    "a lambda": ("def f(x):\n    g = lambda t: t * x\n    return g(x)\n", 2),
    "a generator expression": ("def f(x):\n    y = x * 1.0\n"
                               "    return sum(y * k for k in range(3))\n", 3),
    "a with block": ("def f(x):\n    with mg.no_grad():\n        y = x * 2.0\n    return y\n", 2),
    "a global statement": ("def f(x):\n    global G\n    G = x\n    return x\n", 2),
    "a nested function definition": ("def f(x):\n    def g(t):\n        return t * x\n"
                                     "    return g(x)\n", 2),
    "yield (a generator function)": ("def f(x):\n    yield x * 2.0\n", 2),
    "break": ("def f(x):\n    for i in range(3):\n        x = x * 2.0\n        break\n"
              "    return x\n", 4),
    "an assignment into part of a value (x[...] = ...)": (
        "def f(x):\n    y = x * 2.0\n    y[0] = 1.0\n    return y.sum()\n", 3),
    # (argnums was checked first, against no named parameter: "argnums=0 names argument
    # 0, but the function was called with 0 arguments", before any call)
    "*args, **kwargs or keyword-only parameters": ("def f(*xs):\n    return xs[0] * 2.0\n", 1),
}


def test_argnums_out_of_range_says_how_many_parameters_f_takes(tmp_path):
    f, _ = load("def f(x, y):\n    return (x * y).sum()\n", tmp_path)
    with pytest.raises(IndexError, match="argnums=2 names argument 2, but the function "
                                         "takes 2 arguments"):
        mg.grad(f, argnums=2, mode="source")


def load(code, tmp_path, name="f"):
    path = tmp_path / f"refused_{next(_modules)}.py"
    path.write_text("import minigraph as mg\n\n" + textwrap.dedent(code))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name), str(path)


@pytest.mark.parametrize("construct", list(REFUSALS))
def test_refusals_name_construct_function_file_and_line(construct, tmp_path):
    code, line = REFUSALS[construct]
    f, path = load(code, tmp_path)
    with pytest.raises(SourceTransformError) as info:
        mg.grad(f, mode="source")  # refused when the gradient is made, before any call
    err = info.value
    assert err.construct == construct and err.lineno == line + 2  # + the import lines
    assert err.filename == path and err.function == "f"
    assert construct in str(err) and f"line {line + 2}" in str(err) and path in str(err)
    assert isinstance(err, NotImplementedError)  # and a MinigraphError


def test_nonlocal_is_refused(tmp_path):
    code = ("def outer():\n    v = 1.0\n    def f(x):\n        nonlocal v\n        v = x\n"
            "        return x * 2.0\n    return f\n")
    outer, _ = load(code, tmp_path, "outer")
    with pytest.raises(SourceTransformError, match="a nonlocal statement") as info:
        mg.source_grad(outer())
    assert info.value.lineno == 6 and info.value.function == "outer.<locals>.f"


RUN_TIME_REFUSALS = {  # found while the program is written, before any of it runs
    "a for loop over a list": ("def f(x):\n    s = x * 0.0\n    for w in [x, x]:\n"
                               "        s = s + w\n    return s.sum()\n", 3),
    "calling float on a value of the program": (
        "def f(x):\n    y = x * 2.0\n    return float(y.sum()) * x.sum()\n", 3),
    "calling sin on a value of the program": (
        "import numpy as np\ndef f(x):\n    return np.sin(x).sum()\n", 3),
    "reading y, which the if at line 5 assigns in one branch only": (
        "def f(x):\n    s = x.sum()\n    if s > 0:\n        y = x * 2.0\n"
        "    return (y * x).sum()\n", 5),
    "an if on a value of shape (3,)": (
        "def f(x):\n    if x > 0:\n        x = x * 2.0\n    return x.sum()\n", 2),
    "h changing shape or dtype in the loop": (
        "def f(x):\n    h = x\n    for i in range(2):\n        h = mg.concatenate([h, x])\n"
        "    return h.sum()\n", 3),
    "indexing with a tensor computed in the function": (
        "def f(x):\n    k = x.sum()\n    return x[k].sum()\n", 3),
    # (each of these had no test: coverage showed the refusal never ran)
    "a recursive call of g": (
        "def g(x):\n    return g(x) * 2.0\n\ndef f(x):\n    return g(x).sum()\n", 2),
    "an assert on a value computed in the function": (
        "def f(x):\n    assert x.sum() > 0\n    return x.sum()\n", 2),
    "raise inside an if decided at run time": (
        "def f(x):\n    s = x.sum()\n    if s > 0:\n        raise ValueError('positive')\n"
        "    return s\n", 4),
    # (refused where k is read: unread, as a loop's index in one branch, it costs nothing)
    "reading k, which holds different Python values after the two branches of the if": (
        "def f(x):\n    s = x.sum()\n    if s > 0:\n        k = 1\n    else:\n        k = 2\n"
        "    return s * k\n", 7),
    "y with shape (3,) float64 after one branch and () float64 after the other": (
        "def f(x):\n    s = x.sum()\n    if s > 0:\n        y = x * 2.0\n    else:\n"
        "        y = s\n    return y.sum()\n", 3),
    "y being 1.0 on one path and a tensor of shape (3,) on another": (
        "def f(x):\n    s = x.sum()\n    if s > 0:\n        y = x * 2.0\n    else:\n"
        "        y = 1.0\n    return (y * x).sum()\n", 3),
    "y being the Python number 0.5 on one path of an if and a float64 tensor of shape () "
    "on another": (
        "def f(x):\n    s = x.sum()\n    if s > 0:\n        y = s * 2.0\n    else:\n"
        "        y = 0.5\n    return (y * x).sum()\n", 3),
    "a conditional expression (a if c else b) on a value of the program": (
        "def f(x):\n    s = x.sum()\n    return s * 2.0 if s > 0 else s\n", 3),
    "and/or on a value of the program": (
        "def f(x):\n    s = x.sum()\n    return (s > 0 and s) * 1.0\n", 3),
    "formatting a value of the program into a string": (
        "def f(x):\n    s = x.sum()\n    t = f'{s}'\n    return s\n", 3),
    "c changing from one iteration to the next as a Python value": (
        "def f(x):\n    c = 1.0\n    y = x * 1.0\n    for i in range(3):\n        y = y * c\n"
        "        c = c + 1.0\n    return y.sum()\n", 4),
    "a nested loop reusing the index name i": (
        "def f(x):\n    y = x * 1.0\n    for i in range(2):\n        for i in range(2):\n"
        "            y = y * 2.0\n    return y.sum()\n", 4),
    "indexing a Python sequence with the loop index": (
        "SCALE = [1.0, 2.0, 3.0]\ndef f(x):\n    y = x * 1.0\n    for i in range(3):\n"
        "        y = y * SCALE[i]\n    return y.sum()\n", 5),
    "the attribute .foo of a value of the program": (
        "def f(x):\n    return x.foo.sum()\n", 2),
    "not on a value of the program": (
        "def f(x):\n    s = x.sum()\n    return (not s) * 1.0\n", 3),
    "a chained or identity comparison of values of the program": (
        "def f(x):\n    s = x.sum()\n    return (0 < s < 10) * s\n", 3),
}


SUPPORTED = {  # source of f(x, n) -> its gradient by x at x = (1, 2, 3), n = 2; each ran in
    # no test before (coverage): what Python decides while the program is written
    "and/or and a conditional expression on Python values": (
        "def f(x, n):\n    k = 2.0 if n > 1 and n < 5 else 3.0\n    m = (n == 0) or 4.0\n"
        "    return (x * k * m).sum()\n", lambda x: np.full(3, 8.0)),
    "an f-string in an assert's message": (
        "def f(x, n):\n    assert n >= 0, f'n must be >= 0, got {n!r:>4}'\n"
        "    return (x * n).sum()\n", lambda x: np.full(3, 2.0)),
    "an empty loop": (
        "def f(x, n):\n    y = x * 1.0\n    for i in range(0):\n        y = y * 2.0\n"
        "    return (y * y).sum()\n", lambda x: 2 * x),
    "a Python number that every iteration sets alike": (
        "def f(x, n):\n    c = 2.0\n    y = x * 1.0\n    for i in range(3):\n"
        "        y = y * c\n        c = 2.0\n    return (y * x).sum()\n", lambda x: 16 * x),
    "a loop whose variable nothing differentiated reads (no reverse loop)": (
        "def f(x, n):\n    h = x\n    for i in range(3):\n        h = h + x * x[i]\n"
        "    return (x * x).sum()\n", lambda x: 2 * x),
    "unary minus and plus, an element of a constant tensor": (
        "def f(x, n):\n    w = mg.tensor([1.0, 2.0, 3.0])\n"
        "    return (-x * x).sum() + (+x * w[n]).sum()\n", lambda x: -2 * x + 3.0),
}


@pytest.mark.parametrize("construct", list(SUPPORTED))
def test_python_decides_what_it_can_while_the_program_is_written(construct, tmp_path):
    code, closed_form = SUPPORTED[construct]
    f, _ = load(code, tmp_path)
    x = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(mg.grad(f, mode="source")(x, 2).numpy(), closed_form(x),
                               rtol=1e-12)


@pytest.mark.parametrize("construct", list(RUN_TIME_REFUSALS))
def test_refusals_found_while_writing_the_program(construct, tmp_path):
    code, line = RUN_TIME_REFUSALS[construct]
    f, path = load(code, tmp_path)
    gf = mg.source_grad(f)
    with pytest.raises(SourceTransformError) as info:
        gf(np.array([1.0, 2.0, 3.0]))
    assert construct in str(info.value) and info.value.lineno == line + 2
    assert info.value.filename == path and not gf.programs


def test_statements_that_write_nothing_or_are_decided_while_writing(tmp_path):
    """pass, a docstring, an annotated assignment, an assert and a raise that Python decides
    while the program is written, and an expression whose value nobody reads: each had no
    test. The gradient of sum(2 x * x) is 4 x."""
    f, _ = load("def f(x):\n    'a docstring'\n    pass\n    y: float = x * 2.0\n"
                "    assert x.ndim == 1, 'decided while writing'\n    mg.sin(x)\n"
                "    if x.shape[0] == 4:\n        raise ValueError('not this shape')\n"
                "    return (y * x).sum()\n", tmp_path)
    x = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(mg.grad(f, mode="source")(x).numpy(), 4 * x, rtol=1e-12)
    with pytest.raises(ValueError, match="not this shape"):
        mg.grad(f, mode="source")(np.ones(4))
    with pytest.raises(AssertionError, match="decided while writing"):
        mg.grad(f, mode="source")(np.ones((2, 2)))


def test_a_call_that_does_not_fit_the_function_names_it(tmp_path):
    f, path = load("def g(x, y):\n    return x * y\n\ndef f(x):\n    return g(x).sum()\n",
                   tmp_path)
    with pytest.raises(TypeError, match=r"missing a required argument: 'y' \[source_grad: "
                                        r"in f, .*line 7\]"):
        mg.grad(f, mode="source")(np.ones(3))


def test_unpacking_a_tensor_into_too_few_names_names_the_line(tmp_path):
    f, _ = load("def f(x):\n    a, b = x\n    return a * b\n", tmp_path)
    with pytest.raises(ValueError, match=r"cannot unpack 3 values into 2 names .*line 4"):
        mg.grad(f, mode="source")(np.ones(3))
    np.testing.assert_allclose(mg.grad(f, mode="source")(np.array([2.0, 5.0])).numpy(),
                               [5.0, 2.0])  # d(ab)/da = b, d(ab)/db = a


def test_closure_over_a_differentiated_value_is_refused():
    """An inner source gradient inside an outer tape gradient cannot see y's derivative."""
    def outer(y):
        def inner(x):
            return x * y
        return mg.grad(inner, mode="source")(2.0)

    with pytest.raises(SourceTransformError, match="closes over y"):
        mg.grad(outer)(3.0)


def test_lambda_and_missing_source_are_refused():
    with pytest.raises(SourceTransformError, match="a lambda"):
        mg.source_grad(lambda x: x * 2.0)
    namespace = {"mg": mg}
    exec("def f(x):\n    return x * 2.0\n", namespace)
    with pytest.raises(SourceTransformError, match="source text of f is not available"):
        mg.source_grad(namespace["f"])


def test_shape_errors_point_at_the_users_line(tmp_path):
    f, path = load("def f(x, y):\n    z = x * 2.0\n    return (z @ y).sum()\n", tmp_path)
    with pytest.raises(ShapeError, match=r"matmul: shapes \(2, 3\) and \(2, 3\).*line 5") as caught:
        mg.grad(f, mode="source")(np.ones((2, 3)), np.ones((2, 3)))
    assert str(caught.value).count("[source_grad:") == 1  # (the line once, not per frame)


def test_vector_output_needs_a_scalar():
    with pytest.raises(GradientError, match="scalar"):
        mg.grad(second, mode="source")(np.ones(3))


def plus(x, y):
    return x + y


def across_devices(x, y):
    z = (x * 2.0).to("cpu:1")
    return (z * y).sum()


def test_returned_gradients_are_new_tensors_on_every_call():
    """Here gx and gy are the seed gz itself: it must not be shared between calls."""
    gx, gy = mg.source_grad(plus, argnums=(0, 1))(2.0, 3.0)
    assert gx.item() == gy.item() == 1.0
    gx.data[...] = 99.0  # even a user who writes into a result cannot change the next one
    assert mg.source_grad(plus, argnums=(0, 1))(2.0, 3.0)[1].item() == 1.0


def doubled_while_large(x, n):
    y = x
    for i in range(n):
        if mg.sum(y) > 100.0:
            y = y * 2.0
    return y


def shift_register(x, n):
    a = b = c = d = e = mg.ones(())
    for i in range(n):
        e = e + d * e
        d = c
        c = b
        b = a
        a = mg.sin(x) * 2.0
    return e


def test_a_loop_whose_variables_settle_one_by_one():
    """What a loop variable is (its shape, and whether it depends on x) is found by
    writing the body again until nothing changes: here all five start as numbers, a
    needs x first and hands it on to b, c, d and e, one per writing of the body (five:
    more than the four the writer once allowed, an internal error then). Oracle: the same recurrence on
    (value, derivative) pairs of Python floats."""
    def by_hand(x0, n):
        a = b = c = d = e = (1.0, 0.0)
        for _ in range(n):
            e = (e[0] + d[0] * e[0], e[1] + d[1] * e[0] + d[0] * e[1])
            d, c, b = c, b, a
            a = (2.0 * math.sin(x0), 2.0 * math.cos(x0))
        return e

    for n in (1, 6):
        value, g = mg.value_and_grad(shift_register, mode="source")(0.3, n)
        want = by_hand(0.3, n)
        assert value.item() == pytest.approx(want[0], rel=1e-12)
        assert g.item() == pytest.approx(want[1], rel=1e-12)


W_OUTSIDE = np.array([[0.5, -1.0], [2.0, 0.25]])


def tanh_layers(x, n):
    h = x
    for i in range(n):
        h = mg.tanh(h @ W_OUTSIDE)
    return mg.sum(h)


def test_a_loop_program_reads_a_numpy_array_from_outside_as_a_constant():
    """The kernels of a program with loops get the constant's array itself (a NumPy
    array's ``.data`` is a memoryview, not the array). Oracle: finite differences."""
    x0 = np.array([0.1, -0.3])
    gf = mg.source_grad(tanh_layers)
    g = gf(mg.tensor(x0), 3).numpy()
    assert gf.program_for(mg.tensor(x0), 3).raw is not None

    def value(v):
        h = v
        for _ in range(3):
            h = np.tanh(h @ W_OUTSIDE)
        return h.sum()

    eps = 1e-6
    fd = [(value(x0 + eps * e) - value(x0 - eps * e)) / (2 * eps) for e in np.eye(2)]
    np.testing.assert_allclose(g, fd, rtol=1e-7, atol=1e-9)


def test_a_program_with_loops_hands_back_arrays_of_the_callers_own():
    """Run with kernels on arrays, this program returns its input's own array as f's
    value (no iteration doubles a small x): the caller gets a copy, as in every mode."""
    x = mg.tensor(np.array(2.0))
    value, g = mg.value_and_grad(doubled_while_large, mode="source")(x, 2)
    assert mg.source_grad(doubled_while_large).program_for(x, 2).raw is not None
    assert value.item() == 2.0 and g.item() == 1.0  # closed form: y = x
    assert not np.shares_memory(value.data, x.data) and not np.shares_memory(g.data, x.data)
    value.data[...] = 5.0
    assert x.item() == 2.0


def test_a_copy_between_devices_copies_the_adjoint_back():
    x, y = rng.normal(size=3), mg.tensor(rng.normal(size=3), device="cpu:1")
    gf = mg.source_grad(across_devices, argnums=(0, 1))
    gx, gy = gf(x, y)
    assert (gx.device.name, gy.device.name) == ("cpu", "cpu:1")
    assert "mg.to_device(gz, 'cpu')" in gf.source and gf.last.raw is None  # two devices
    np.testing.assert_allclose(gx.numpy(), 2 * y.numpy(), rtol=1e-15)


def test_forward_mode_over_a_source_gradient():
    """jvp of the gradient (a Hessian-vector product): the program runs on dual numbers."""
    w, x, v = (mg.tensor(rng.normal(size=s)) for s in ((3, 4), 4, 4))
    grad_source = mg.grad(matmul_tanh, argnums=1, mode="source")
    grad_tape = mg.grad(matmul_tanh, argnums=1)
    _, hv = mg.jvp(lambda xi: grad_source(w, xi), (x,), (v,))
    _, expected = mg.jvp(lambda xi: grad_tape(w, xi), (x,), (v,))
    np.testing.assert_allclose(hv.numpy(), expected.numpy(), rtol=1e-12)


def long_chain(x):
    for _ in range(100_000):
        x = x * 1.0000001 - 0.0
    return x


def test_a_100k_iteration_loop_is_written_once():
    """The loop is not unrolled: its body is written once, its reverse runs 100,000 times."""
    gf = mg.source_grad(long_chain)
    assert gf(2.0).item() == pytest.approx(1.0000001 ** 100_000, rel=1e-9)
    assert gf.source.count("1.0000001") == 2 and "- 0.0" not in gf.source


def test_long_straight_line_code(tmp_path):
    """Hundreds of lines: no recursion over the program, the tape's gradient."""
    body = "\n".join(["    v = mg.sin(v) * 0.5 + v * 0.5"] * 150)
    f, _ = load(f"def f(x):\n    v = x\n{body}\n    return v\n", tmp_path)
    assert mg.grad(f, mode="source")(1.5).item() == pytest.approx(mg.grad(f)(1.5).item(),
                                                                  rel=1e-12)


def scaled(x, scale):
    return (x * scale).sum()


def test_float_arguments_not_differentiated_are_data():
    """A float argument that is not differentiated is data, as in every other mode: one
    program serves all its values (the text reads it as a variable), never a stale one."""
    gf = mg.source_grad(scaled)
    x = rng.normal(size=3)
    np.testing.assert_array_equal(gf(x, 2.0).numpy(), np.full(3, 2.0))
    np.testing.assert_array_equal(gf(x, 3.0).numpy(), np.full(3, 3.0))
    assert "a = x * scale" in gf.forward_source and len(gf.programs) == 1
    for s in np.linspace(-2.0, 2.0, 25):
        np.testing.assert_array_equal(gf(x, float(s)).numpy(), np.full(3, s))
    assert len(gf.programs) == 1


# -- the user's names never hide the program's globals ------------------------------------------
# The program's text reads mg, range and reversed from its namespace, and the kernel text
# _k_sin, _xp ...: a parameter or variable of f with such a name hid them (a crash, and a
# printed .source that computed something else). Oracle: PyTorch autograd.

SHADOWING = {  # source (import minigraph as M), the same in torch (import torch as T)
    "a parameter named mg": "def f(mg, x):\n    return M.sin(x) * mg + x * x\n",
    "parameters named range and reversed":
        "def f(range_, x, reversed):\n    y = x\n    for i in range(2):\n"
        "        y = M.sin(y) * reversed + range_\n    return y\n",
    "a parameter named _xp": "def f(_xp, x):\n    y = x\n    for i in range(2):\n"
                             "        y = M.sin(y) * _xp\n    return y\n",
    "variables named like kernels": "def f(w, x):\n    _xp = x\n    for i in range(2):\n"
                                    "        _k_sin = M.sin(_xp) * w\n        _xp = _k_sin + x\n"
                                    "    return _xp\n",
}


@pytest.mark.parametrize("case", sorted(SHADOWING))
def test_names_of_the_users_never_hide_the_programs_globals(case, tmp_path):
    torch = pytest.importorskip("torch")
    text = SHADOWING[case]
    path = tmp_path / f"shadow_{next(_modules)}.py"
    path.write_text("import minigraph as M\n\n" + text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    f = module.f
    namespace: dict = {"M": torch}
    exec(text, namespace)
    n = len(inspect.signature(f).parameters)
    values = [0.7, 0.5, 1.3][:n]
    ts = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in values]
    want = torch.autograd.grad(namespace["f"](*ts), ts, create_graph=True)
    nums = tuple(range(n))
    got = mg.grad(f, argnums=nums, mode="source")(*values)  # (kernels on arrays)
    assert [g.item() for g in got] == pytest.approx([w.item() for w in want], rel=1e-12)
    # the printed program itself, run on values of an outer transformation (jacfwd: duals)
    second = mg.jacfwd(mg.grad(f, argnums=n - 1, mode="source"), argnums=n - 1)(*values)
    want2 = torch.autograd.grad(want[n - 1], ts[n - 1])[0]
    assert second.item() == pytest.approx(want2.item(), rel=1e-10)


def test_a_function_the_program_captures_is_named_after_itself(tmp_path):
    f, _ = load("def inner(x, y):\n    return x * y + mg.sin(x)\n\n"
                "def f(x, y):\n    return mg.checkpoint(inner)(x, y) * x\n", tmp_path)
    g = mg.source_grad(f)
    assert g(2.0, 3.0).item() == pytest.approx(2 * (3 + math.cos(2.0)) + 6 + math.sin(2.0))
    assert "a = mg.checkpoint(inner)(x, y)" in g.source  # (it was 'c1')


# -- a float32 input that meets float64 values: its gradient is float32 ------------------------

_C64 = np.array([0.5, 1.5, -2.0])  # float64 values read by a float32 input's users


def _c64_straight(x):
    return mg.sum(x + mg.tensor(_C64))


def _c64_loop(x):
    h = mg.sum(mg.tensor(_C64) * 0.0)  # (float64 from the start: a loop keeps one dtype)
    for i in range(3):
        h = h + mg.sum(x * mg.tensor(_C64))
    return h


def _c64_branch(x):
    if mg.sum(x) > 0:
        y = x * mg.tensor(_C64)
    else:
        y = x + mg.tensor(_C64)
    return mg.sum(y * x)


@pytest.mark.parametrize("f, torch_f", [
    (_c64_straight, lambda x, c: (x + c).sum()),
    (_c64_loop, lambda x, c: 3 * (x * c).sum()),
    (_c64_branch, lambda x, c: ((x * c if x.sum() > 0 else x + c) * x).sum()),
], ids=["straight", "loop", "branch"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
def test_a_float32_input_gets_a_float32_gradient_next_to_float64_values(f, torch_f, sign):
    """An adjoint line ``gx = ga`` (or a loop's or an if's accumulator) was declared with
    x's float32 while it held ga's float64, so the cast back to x's dtype was left out
    and the gradient came back float64. PyTorch's gradient has x's dtype."""
    torch = pytest.importorskip("torch")
    x = sign * np.array([0.3, -0.7, 1.1], dtype=np.float32)
    xt = torch.tensor(x, requires_grad=True)
    torch_f(xt, torch.tensor(_C64)).backward()
    got = mg.grad(f, mode="source")(mg.tensor(x))
    assert got.dtype == "float32" == str(xt.grad.dtype).removeprefix("torch.")
    np.testing.assert_allclose(got.numpy(), xt.grad.numpy(), rtol=1e-6)


def _divides_on_one_path(x, n):
    if mg.sum(x) > 0.0:
        y = x * (1.0 / n)
    else:
        y = x * 2.0
    return mg.sum(y)


def _divides_always(x, n):
    return mg.sum(x * (1.0 / n))


def test_python_arithmetic_that_raises_on_a_run_time_path_is_refused_clearly():
    """Source mode computes Python numbers while it writes both paths of a run-time if;
    1.0 / 0 raised a bare ZeroDivisionError there, for a call that eager mode, taking the
    other path, runs. Now a refusal that says why; where every path computes it, Python's
    own error, as in eager mode."""
    x = mg.tensor([-1.0, -2.0])
    assert mg.grad(_divides_on_one_path)(x, 0).numpy().tolist() == [2.0, 2.0]  # eager
    with pytest.raises(SourceTransformError, match=r"raises ZeroDivisionError \(float "
                                                   r"division by zero\) on a path of an if "
                                                   r"decided at run time"):
        mg.grad(_divides_on_one_path, mode="source")(x, 0)
    with pytest.raises(ZeroDivisionError):
        mg.grad(_divides_always, mode="source")(x, 0)
    assert mg.grad(_divides_on_one_path, mode="source")(-x, 4).numpy().tolist() == [0.25] * 2


@pytest.mark.parametrize("fn, derivative", [(mg.sin, np.cos), (mg.exp, np.exp),
                                            (mg.tanh, lambda x: 1 - np.tanh(x) ** 2),
                                            (mg.sqrt, lambda x: 0.5 / np.sqrt(x))])
def test_a_library_function_itself_is_transformed(fn, derivative):
    """mg.grad(mg.sin, mode="source") read sin's own text (bind_one(SIN, x, {})) and
    refused its dict display; JAX users write grad(jnp.sin). Source mode now writes a
    function that calls it, as for a transformation handed to it. Oracle: the closed
    forms, and the adjoint is one line of the table's rule."""
    x = 0.7
    assert mg.grad(fn, mode="source")(x).item() == pytest.approx(derivative(x), rel=1e-12)
    g = mg.source_grad(fn)
    g(x)
    assert f"z = mg.{fn.__name__}(x)" in g.source


def _with_optional_bias(x, bias=None):
    y = x * 2.0
    if bias is not None:
        y = y + bias
    return mg.sum(y * y)


def test_an_identity_test_against_none_is_decided_and_extra_arguments_are_refused():
    """`if bias is not None:` with a tensor bias was refused as an identity comparison
    of values of the program, though a value of the program is never None; an extra
    positional argument failed with an IndexError inside. Oracle: PyTorch autograd and
    Python's own TypeError."""
    torch = pytest.importorskip("torch")
    x0, b0 = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    xt = torch.tensor(x0, requires_grad=True)
    ((xt * 2.0 + torch.tensor(b0)) ** 2).sum().backward()
    got = mg.grad(_with_optional_bias, mode="source")(mg.tensor(x0), mg.tensor(b0))
    np.testing.assert_allclose(got.numpy(), xt.grad.numpy(), rtol=1e-12)
    assert mg.grad(_with_optional_bias, mode="source")(mg.tensor(x0)).tolist() == \
        (8.0 * x0).tolist()  # d/dx (2x)^2, bias None
    with pytest.raises(TypeError, match=r"takes 2 positional arguments but 3 were given"):
        mg.grad(_with_optional_bias, mode="source")(mg.tensor(x0), mg.tensor(b0), 1.0)
