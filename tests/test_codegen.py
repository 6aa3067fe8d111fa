"""The one code generator (minigraph/codegen.py), and the one signature across levels.

Graph compilation and source transformation write their kernel calls, literals and
names with the same code; the texts pinned here are the ones the chapters quote. The
signature has no transformation level: a program built at one nesting level is replayed
at another, in both orders, and the values are checked against closed forms of the
textbook's f(x, y) = x*y + sin(x): df/dx = y + cos x, d2f/dx2 = -sin x, d2f/dxdy = 1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import minigraph as mg
from minigraph.autodiff.signature import arrays, programs, signature
from minigraph.codegen import Names, define, literal, mg_call
from minigraph.ops import PRIMITIVES

X, Y = np.float64(2.0), np.float64(3.0)  # strong, as the nested calls' values: one program
XS = np.array([-1.0, 0.5, 2.0])


# -- literals and names ------------------------------------------------------------------------

@pytest.mark.parametrize("value", [2.0, -0.0, 3, True, None, "float32", (1,), (0, slice(1, None)),
                                   [1, (2, 3)], float("inf"), -float("inf"), float("nan"), ...])
def test_a_literal_reads_back_as_its_value(value):
    text = literal(value, lambda v: pytest.fail(f"{v!r} has a literal"))
    back = eval(text)
    assert back == value or (back is value) or (math.isnan(back) and math.isnan(value))
    assert type(back) is type(value)


def test_a_value_without_a_literal_is_a_named_constant():
    names = Names()
    a = np.float64(2.0)  # a NumPy scalar: its repr is not Python this namespace can read
    text = names.literal((a, 1, a), "p_mul_")
    assert text == "(p_mul_, 1, p_mul_)" and names.namespace["p_mul_"] is a
    assert eval(text, names.namespace) == (a, 1, a)


def test_globals_never_hide_a_variable():
    names = Names(taken=["k_mul", "xp"])  # a function's own variables
    assert names.kernel(PRIMITIVES["mul"]) == "k_mul_1"
    assert names.xp(mg.get_device("cpu")) == "xp_1"
    assert names.identifier("gradients/mul") == "gradients_mul"
    assert names.identifier("1x") == "v_1x" and names.identifier("if") == "v_if"


def test_one_kernel_call_and_its_in_place_variant():
    names = Names()
    cpu = mg.get_device("cpu")
    text = names.kernel_call(PRIMITIVES["add"], ["a", "b"], {}, names.xp(cpu), into="a")
    assert text == "ko_add(xp, a, b, out=a)"
    assert names.namespace["ko_add"] is PRIMITIVES["add"].out
    text = names.kernel_call(PRIMITIVES["sum"], ["c"], {"axis": (1,), "keepdims": False}, "xp")
    assert text == "k_sum(xp, c, axis=(1,), keepdims=False)"
    fn = define(f"def f(a, b, c):\n    return {text}\n", "f", "<test_codegen>", names.namespace)
    np.testing.assert_array_equal(fn(None, None, np.ones((2, 3))), [3.0, 3.0])


def test_the_mg_call_follows_the_table_entry():
    def lit(v):
        return literal(v, repr)
    assert mg_call(PRIMITIVES["reshape"], ["gb"], {"shape": (2, 4)}, lit) == \
        "mg.reshape(gb, (2, 4))"
    assert mg_call(PRIMITIVES["sum"], ["c"], {"axis": (1,), "keepdims": True}, lit) == \
        "mg.sum(c, axis=1, keepdims=True)"


# -- both generators write it: the texts the chapters quote ----------------------------------

def textbook(x, y):
    return x * y + mg.sin(x)


def test_graph_compilation_and_source_rendering_write_the_same_kernel_calls():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        y = mg.placeholder(shape=(), name="y")
        z = textbook(x, y)
    body = mg.compile_graph(g, [x, y], [z], name="f").source.splitlines()
    assert [line.split("  #")[0] for line in body] == [
        "def f(x, y):", "    sin = k_sin(xp, x)", "    mul = k_mul(xp, x, y)",
        "    add = k_add(xp, mul, sin)", "    return (add,)"]
    raw = mg.source_grad(textbook, (0, 1)).program_for(X, Y).raw_source  # (a graph, too)
    assert raw is not None and "    a = k_mul(xp, x, y)\n" in raw
    assert "    b = k_sin(xp, x)\n" in raw


def test_a_value_without_a_literal_compiles_in_a_graph():
    # (np.float64's repr, and inf's, are not Python the compiled code can read)
    traced = mg.trace(lambda x: mg.maximum(x * np.float64(2.0), -math.inf))
    np.testing.assert_array_equal(traced(np.array([1.0, -2.0])).numpy(), [2.0, -4.0])


def test_a_node_named_like_a_kernel_keeps_the_kernel():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="k_mul")
        z = x * x
    fn = mg.compile_graph(g, [x], [z])
    assert "= k_mul_1(xp, k_mul, k_mul)" in fn.source
    np.testing.assert_array_equal(fn(np.arange(3.0))[0].numpy(), [0.0, 1.0, 4.0])


# -- one unpacking of a cached program's arguments --------------------------------------------

def test_arrays_keeps_or_drops_the_static_arguments():
    args = (mg.tensor([1.0, 2.0]), 2.0, 3)
    key = signature(args)
    assert [type(a) for a in arrays(args, key, static=True)] == [np.ndarray, np.ndarray, int]
    assert len(arrays(args, key, static=False)) == 2
    assert arrays((mg.tensor(1.0, requires_grad=True), 2.0, 3), key, static=True) is None


# -- the signature across nesting levels, both orders -----------------------------------------

def _f():
    """A new f for each test: the cache is per function, so no test sees another's programs."""
    def f(x, y):
        return x * y + mg.sin(x)
    return f


def _nested(dfdx, outer):
    """The second derivatives of f from its graph- or source-mode df/dx, under ``outer``."""
    if outer == "jvp":  # forward over reverse: d2f/dx2 as a tangent
        return mg.jvp(lambda x: dfdx(x, Y), (X,), (1.0,))[1].item(), None
    if outer == "vmap":  # vmap of grad of the compiled gradient: -sin at each x
        return mg.vmap(mg.grad(lambda x: dfdx(x, Y)))(XS).numpy(), None
    dxx = mg.grad(lambda x: dfdx(x, Y), mode=outer)(X).item()
    dxy = mg.grad(lambda y: dfdx(X, y), mode=outer)(Y).item()
    return dxx, dxy


@pytest.mark.parametrize("outer", ["tape", "forward", "graph", "jvp", "vmap"])
@pytest.mark.parametrize("inner", ["graph", "source"])
@pytest.mark.parametrize("plain_first", [True, False], ids=["plain-first", "nested-first"])
def test_a_program_is_replayed_right_at_another_level(inner, outer, plain_first):
    f = _f()
    dfdx = mg.grad(f, 0, mode=inner)

    def plain():
        assert dfdx(X, Y).item() == pytest.approx(Y + math.cos(X), abs=1e-12)

    if plain_first:
        plain()
    dxx, dxy = _nested(dfdx, outer)
    if not plain_first:
        plain()
    if outer == "vmap":
        np.testing.assert_allclose(dxx, -np.sin(XS), atol=1e-12)
    else:
        assert dxx == pytest.approx(-math.sin(X), abs=1e-12)
    if dxy is not None:
        assert dxy == pytest.approx(1.0, abs=1e-12)
    # one program for every level: the signature needs none
    options = ((0,), True) if inner == "source" else ((0,), "gradients only")
    assert len(programs(f, inner, options)) == 1


@pytest.mark.parametrize("plain_first", [True, False], ids=["plain-first", "nested-first"])
def test_a_traced_function_is_replayed_right_at_another_level(plain_first):
    f = _f()
    traced = mg.trace(f)
    if plain_first:
        assert traced(X, Y).item() == pytest.approx(X * Y + math.sin(X))
    h = 1e-6  # the mixed partial by finite differences of the tape's df/dx, against 1
    dfdx = mg.grad(traced)
    assert (dfdx(X, Y + h).item() - dfdx(X, Y - h).item()) / (2 * h) == pytest.approx(1.0, abs=1e-6)
    assert mg.grad(mg.grad(traced))(X, Y).item() == pytest.approx(-math.sin(X), abs=1e-12)
    assert traced(X, Y).item() == pytest.approx(X * Y + math.sin(X))
    assert len(programs(f, "trace")) == 1


# -- a function's name is no identifier ---------------------------------------------------------

def _squares(x):
    return mg.sum(x * x)


def _named(name):
    def fn(x):
        return _squares(x)
    fn.__name__ = name
    return fn


@pytest.mark.parametrize("make", [lambda: _named("my-function 2"), lambda: _named("class"),
                                  lambda: mg.checkpoint(_squares)])  # named checkpoint(_squares)
@pytest.mark.parametrize("mode", ["graph", "trace"])
def test_a_function_whose_name_is_no_identifier_compiles(make, mode):
    """The generated function is named after f, made an identifier in one place
    (compile_graph); before, ``def grad_checkpoint(_squares)(...)`` was a SyntaxError."""
    x = mg.tensor(XS)
    if mode == "trace":
        assert mg.trace(make())(x).item() == pytest.approx(float(np.sum(XS * XS)))
    else:
        np.testing.assert_allclose(mg.grad(make(), mode="graph")(x).numpy(), 2 * XS)


def test_source_mode_names_the_program_after_the_def_it_read():
    g = mg.grad(_named("my-function 2"), mode="source")
    np.testing.assert_allclose(g(mg.tensor(XS)).numpy(), 2 * XS)
    assert g.source.startswith("def grad_fn(x):")  # (the def's own name, always an identifier)


# -- NumPy's scalars are what Python's numbers are ----------------------------------------------

def _fs(x, y):
    return mg.sum(x * y + mg.sin(x) * 2.0)


@pytest.mark.parametrize("mode", mg.MODES)
@pytest.mark.parametrize("x", [np.float32(0.5), np.float64(0.5), np.array(0.5, np.float32)],
                         ids=["float32", "float64", "0-d array"])
def test_a_numpy_float_scalar_is_differentiated_in_its_dtype(mode, x):
    """np.float32(0.5) is data, as a float is (graph mode refused it as 'not a float',
    source mode crashed on it): d/dx (x y + 2 sin x) = y + 2 cos x, in x's dtype."""
    g = mg.grad(_fs, mode=mode)(x, 2.0)
    assert g.dtype == str(np.asarray(x).dtype)
    assert g.item() == pytest.approx(2.0 + 2 * math.cos(0.5), rel=1e-6)


@pytest.mark.parametrize("mode", mg.MODES)
@pytest.mark.parametrize("x", [np.int64(2), np.bool_(True)], ids=["int64", "bool"])
def test_a_numpy_integer_scalar_gets_the_one_integer_refusal(mode, x):
    with pytest.raises(mg.errors.DTypeError, match=f"argument 0 of dtype {np.asarray(x).dtype}"):
        mg.grad(_fs, mode=mode)(x, 2.0)


def test_one_traced_program_serves_every_value_of_a_numpy_float():
    traced = mg.trace(_fs)
    for v in (0.5, 0.75, -1.0):
        assert traced(np.float32(v), 2.0).item() == pytest.approx(2 * v + 2 * math.sin(v),
                                                                  rel=1e-6)
    assert traced.recordings == 1  # (it was a constant, one program per value)


@pytest.mark.parametrize("mode", mg.MODES)
def test_a_list_of_numbers_to_differentiate_is_an_array_in_every_mode(mode):
    """As mg.tensor makes it, and as the tape and forward mode took it; graph mode refused
    it ('must be a float, array or tensor') and source mode crashed on it."""
    g = mg.grad(_fs, mode=mode)([0.5, -1.0], 2.0)
    np.testing.assert_allclose(g.numpy(), 2.0 + 2 * np.cos([0.5, -1.0]), rtol=1e-12)
    with pytest.raises(mg.errors.DTypeError, match="argument 0 of dtype int64"):
        mg.grad(_fs, mode=mode)([1, 2], 2.0)


@pytest.mark.parametrize("mode", ["graph", "source"])
@pytest.mark.parametrize("value", ["abc", None])
def test_what_is_no_array_is_refused_by_name_when_differentiated(mode, value):
    with pytest.raises(TypeError, match=f"argument 0 must be a float, array or tensor to be "
                                        f"differentiated, got {type(value).__name__}"):
        mg.grad(_fs, mode=mode)(value, 2.0)
