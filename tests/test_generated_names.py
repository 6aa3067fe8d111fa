"""The names generated code writes: every variable, index and global of a generated
function is one name Python reads as one thing (codegen.Names, source mode's namer).

Oracles: PyTorch (torch.func) for values and gradients, closed forms, Python's own run.
"""

import math
import traceback

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.runtime.scheduler import NodeError


def T(v):
    return torch.tensor(v, dtype=torch.float64)


# -- loop indices in source mode (normalize.py's index_name, tidy.py's _Namer) -------------

def rebind(x):
    h = x
    for k in range(3):
        h = h * (k + 1.0)  # reads the index
        k = mg.sin(h)  # rebinds its name to a tensor (valid Python)
        h = h + k * k
    return h


def t_rebind(x):
    h = x
    for k in range(3):
        h = h * (k + 1.0)
        k = torch.sin(h)
        h = h + k * k
    return h


def loops_over_k(h, x, n):
    for k in range(n):  # its own k
        h = mg.sin(h) * x
    return h


def param_k(x, k):  # the caller's parameter k
    return loops_over_k(x, x, 3) * k


def t_param_k(x, k):
    h = x
    for _ in range(3):
        h = torch.sin(h) * x
    return h * k


def loops_over_i(h, x):
    for i in range(2):  # its own i
        h = mg.sin(h) + x
    return h


def nested_i(x):
    h = x[0]
    for i in range(3):  # the caller's i, around the helper's
        h = loops_over_i(h, x[i]) * x[i]
    return h


def t_nested_i(x):
    h = x[0]
    for i in range(3):
        for _ in range(2):
            h = torch.sin(h) + x[i]
        h = h * x[i]
    return h


def local_k(h):
    k = mg.sin(h) * 2.0  # its own local k, a tensor
    return k


def caller_k(x):
    h = x
    for k in range(3):  # the caller's loop index k
        h = local_k(h) + x * k
    return h


def t_caller_k(x):
    h = x
    for k in range(3):
        h = torch.sin(h) * 2.0 + x * k
    return h


def index_xp(x):
    h = x
    for _xp in range(3):  # the kernel text's array namespace is _xp
        h = mg.sin(h) * x
    return h


def t_index_xp(x):
    h = x
    for _ in range(3):
        h = torch.sin(h) * x
    return h


def renamed_param(_x):  # the program calls this parameter x_1
    h = _x
    for x_1 in range(3):
        h = mg.sin(h) * _x + x_1
    return h


def t_renamed_param(x):
    h = x
    for j in range(3):
        h = torch.sin(h) * x + j
    return h


def index_z(x):  # z: the name the program gives a restored output
    h = x
    for z in range(3):
        h = mg.sin(h) * x
    return h * 2.0


def t_index_z(x):
    return t_index_xp(x) * 2.0


X3 = np.array([0.3, 0.8, 1.1])


@pytest.mark.parametrize("f, ref, args", [
    (rebind, t_rebind, (0.7,)),
    (param_k, t_param_k, (0.7, 1.3)),
    (nested_i, t_nested_i, (X3,)),
    (caller_k, t_caller_k, (0.7,)),
    (index_xp, t_index_xp, (0.7,)),
    (renamed_param, t_renamed_param, (0.7,)),
    (index_z, t_index_z, (0.7,)),
], ids=["rebound", "helper-index-is-caller-param", "helper-index-in-caller-loop",
        "helper-local-is-caller-index", "index-named-_xp", "index-is-renamed-param",
        "index-named-z"])
def test_a_loop_index_never_shares_a_name_with_another_variable(f, ref, args):
    """Source mode wrote a loop's index with the user's name, never registered with the
    program's namer: a body rebinding it, a helper's index or local reusing a caller's
    parameter, local or index, a parameter renamed to the index's name, or the output
    restored as ``z`` all became one Python variable (silent wrong values and gradients),
    and an index named ``_xp`` hid the kernel text's array namespace."""
    nums = tuple(range(len(args)))
    value, grads = mg.value_and_grad(f, argnums=nums, mode="source")(*args)
    expected = torch.func.grad_and_value(ref, argnums=nums)(*map(T, args))
    assert value.dtype == "float64"
    np.testing.assert_allclose(value.numpy(), expected[1].numpy())
    for got, exp in zip(grads, expected[0]):
        np.testing.assert_allclose(got.numpy(), exp.numpy())


# -- the program's own names among f's globals (compiled.py's namer) ------------------------

grad_looped = mg.tensor(3.0)  # named like the program of looped, grad_looped
vjp_straight = mg.tensor(3.0)  # named like straight's vjp program


def looped(x, n):
    h = x
    for i in range(n):
        h = mg.sin(h) * grad_looped
    return h


def straight(x):
    return mg.sin(x) * vjp_straight


def test_a_global_named_like_the_program_is_read_as_the_global():
    """A global named like the generated def (``grad_looped`` for looped) was bound in
    the program's namespace under that name, which the def then rebound to the program
    itself: the program multiplied by a function."""
    expected = torch.func.grad(lambda x: torch.sin(torch.sin(x) * 3.0) * 3.0)(T(0.7))
    assert math.isclose(mg.grad(looped, mode="source")(0.7, 2).item(), expected.item())
    held = mg.tensor(0.7, requires_grad=True)  # (runs the .source program)
    assert math.isclose(mg.grad(looped, mode="source")(held, 2).item(), expected.item())
    _, pullback = mg.vjp(straight, mg.tensor(0.7), mode="source")
    assert math.isclose(pullback(mg.tensor(1.0))[0].item(), 3.0 * math.cos(0.7))


# -- names Python reads differently from how they are written (codegen.Names) ---------------

def test_names_are_compared_as_python_reads_them():
    """A placeholder named fullwidth ``ｍｕｌ`` IS the variable ``mul`` to Python (NFKC),
    so the node auto-named ``mul`` overwrote it: 3 * p came out 4 * p."""
    with mg.Graph() as g:
        p = mg.placeholder(shape=(), dtype="float64", name="\uff4d\uff55\uff4c")
        w = p * 2.0 + p
    assert mg.compile_graph(g, [p], [w])(1.0)[0].item() == 3.0


@pytest.mark.parametrize("names", [["w\u2081"], ["x\u00b2"], ["__debug__"], ["\u00b5", "\u03bc"],
                                   ["\u2460"]])
def test_a_name_that_is_no_identifier_gives_one(names):
    """``w₁``, ``x²``, ``__debug__`` and the micro sign with the Greek mu (one name to
    Python) gave a SyntaxError from the generated code, or one variable for two."""
    with mg.Graph() as g:
        ps = [mg.placeholder(shape=(), dtype="float64", name=n) for n in names]
        z = ps[0] * 2.0
        for k, q in enumerate(ps[1:], 2):
            z = z + q * float(k)
    fn = mg.compile_graph(g, ps, [z])
    args = [float(k) for k in range(1, len(ps) + 1)]
    assert fn(*args)[0].item() == 2.0 + sum(k * k for k in args[1:])


def scoped(x):
    with mg.name_scope("s"):
        a = mg.cos(x)  # s/cos
    with mg.name_scope("\uff53"):  # fullwidth s: Python reads ｓ_cos as s_cos
        b = mg.cos(x * 2.0)
    with mg.name_scope("layer\u2081"):
        c = mg.sin(x) * x
    return a + b + c


def test_name_scopes_that_python_reads_alike_stay_apart_in_a_trace():
    """mg.trace: scopes ``s`` and fullwidth ``ｓ`` made one variable of two nodes (a
    silent wrong value), and the scope ``layer₁`` a SyntaxError."""
    expected = math.cos(0.7) + math.cos(1.4) + math.sin(0.7) * 0.7
    assert math.isclose(mg.trace(scoped)(0.7).item(), expected)
    d = -math.sin(0.7) - 2 * math.sin(1.4) + math.cos(0.7) * 0.7 + math.sin(0.7)
    assert math.isclose(mg.grad(scoped, mode="graph")(0.7).item(), d)


# -- the builtins generated code calls (codegen.BUILTINS) -----------------------------------

def param_slice(slice):
    return (slice[1:] * slice[1:]).sum()


def param_float(float):
    return mg.maximum(float, -1e400).sum() * 2.0


def local_float(x, n):
    float = x * 1.0
    for i in range(n):
        float = mg.maximum(float * x, -1e400)
    return float.sum()


NINF = T(-math.inf)


def t_local_float(x):
    f = x * 1.0
    for _ in range(2):
        f = torch.maximum(f * x, NINF)
    return f.sum()


@pytest.mark.parametrize("f, ref, args, mode", [
    (param_slice, lambda s: (s[1:] * s[1:]).sum(), (X3,), "graph"),
    (param_slice, lambda s: (s[1:] * s[1:]).sum(), (X3,), "source"),
    (param_float, lambda s: torch.maximum(s, NINF).sum() * 2.0, (X3,), "graph"),
    (param_float, lambda s: torch.maximum(s, NINF).sum() * 2.0, (X3,), "source"),
    (local_float, t_local_float, (X3, 2), "source"),  # (graph mode names no node after a local)
], ids=["param-slice-graph", "param-slice-source", "param-float-graph",
        "param-float-source", "local-float-source"])
def test_a_variable_named_like_a_builtin_the_text_calls(f, ref, args, mode):
    """Generated code writes ``slice(1, None, None)`` and ``float('-inf')``: a parameter
    or local named ``slice`` or ``float`` hid the builtin ("'numpy.ndarray' object is not
    callable" from inside generated code)."""
    expected = torch.func.grad(ref)(T(args[0])).numpy()
    np.testing.assert_allclose(mg.grad(f, mode=mode)(*args).numpy(), expected)
    np.testing.assert_allclose(mg.trace(f)(*args).numpy(), ref(T(args[0])).numpy())


# -- a kernel's failure in source mode names the node and the user's line ------------------

def divides(x, n):
    h = x
    if x.shape[0] > 3:
        h = mg.exp(h) * 2.0 + 1.0
    for i in range(n):
        h = mg.sin(h) / x  # the line that fails at x = 0
    return h.sum()


def test_loop_kernels_of_two_programs_keep_their_own_text_and_name_the_line():
    """The kernel text of a program with loops went into linecache under one name per
    function: a second signature's program replaced the first's text, so a traceback
    showed the other program's line; and the error was a bare NumPy one."""
    g = mg.grad(divides, mode="source")
    g(np.ones(3), 2)
    first = mg.source_grad(divides).program_for(np.ones(3), 2)
    g(np.ones(4), 2)  # the same function, another signature: another program
    with np.errstate(all="raise"), pytest.raises(NodeError) as info:
        g(np.zeros(3), 2)
    assert "h = mg.sin(h) / x" in str(info.value) and __file__ in str(info.value)
    frames = [f for f in traceback.extract_tb(info.value.__cause__.__traceback__)
              if f.filename.startswith("<source_grad")]
    assert frames[-1].line == first.raw_source.splitlines()[frames[-1].lineno - 1].strip()


def sqrt_then_log(x, y):
    return (mg.sqrt(x) * y + mg.log(y)).sum()


def test_straight_line_kernels_name_where_the_failing_line_was_written():
    """Source mode's straight-line kernels dropped every node's place: a failure said
    "created at an unknown place" where graph mode names the user's line."""
    with np.errstate(all="raise"), pytest.raises(NodeError) as info:
        mg.grad(sqrt_then_log, mode="source")(np.zeros(3), np.ones(3))
    assert __file__ in str(info.value) and "an unknown place" not in str(info.value)
