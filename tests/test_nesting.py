"""Transformations nested in each other, checked against PyTorch (torch.func, float64).

Every pairing of the four ways to differentiate {tape, forward, graph, source}, outer x
inner, two and three levels deep, on random programs that hypothesis writes as Python
source (source transformation reads a function's text, so each program is a real file),
and the wrappers that build on them (jvp, jacfwd, jacrev, vjp, value_and_grad, hessian).
The oracle is always PyTorch, never another minigraph mode.
"""

from __future__ import annotations

import importlib.util
import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minigraph as mg
from minigraph.autodiff.batching import BatchingError
from minigraph.autodiff.source import SourceTransformError
from minigraph.errors import DTypeError, GradientError
from minigraph.graph.graph import GraphError, TracedValueError
from program_files import load_pair  # (tests/program_files.py)

torch = pytest.importorskip("torch")
tf = pytest.importorskip("torch.func")

MODES = ("tape", "forward", "graph", "source")
PAIRS = list(itertools.product(MODES, MODES))

# -- random programs, written as source files ----------------------------------------------

UNARY = {"sin": "{ns}.sin({a})", "cos": "{ns}.cos({a})", "tanh": "{ns}.tanh({a})",
         "exp": "{ns}.exp(0.3 * {a})", "square": "{a} * {a}"}
BINARY = {"add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}",
          "div": "{a} / (1.5 + {b} * {b})"}

step = st.one_of(
    st.tuples(st.sampled_from(sorted(UNARY)), st.integers(0, 50), st.just(0)),
    st.tuples(st.sampled_from(sorted(BINARY)), st.integers(0, 50), st.integers(0, 50)))
programs = st.lists(step, min_size=1, max_size=6)


def source_of(prog: list, ns: str, name: str) -> str:
    """``def name(x, y): ...`` computing the program with namespace ``ns`` (mg or torch)."""
    names = ["x", "y"]
    lines = [f"def {name}(x, y):"]
    for k, (op, i, j) in enumerate(prog):
        a, b = names[i % len(names)], names[j % len(names)]
        template = UNARY.get(op) or BINARY[op]
        v = f"v{k}"
        lines.append(f"    {v} = " + template.format(ns=ns, a=a, b=b))
        names.append(v)
    # the last value plus a term in both inputs, so every derivative has something to do
    lines.append(f"    return {names[-1]} + x * y * 0.5")
    return "\n".join(lines) + "\n"


_counter = itertools.count()


def load(prog, tmp_path_factory) -> tuple:
    """The program as an mg function and a torch function, each defined in a real file."""
    return load_pair(source_of, prog, tmp_path_factory)


def as_float(v) -> float:
    return float(v.item() if hasattr(v, "item") else v)


def torch_second(f_torch, first: int, second: int, x: float, y: float) -> float:
    """d/d(arg second) of d f/d(arg first), by torch.func, in float64."""
    g = tf.grad(tf.grad(f_torch, argnums=first), argnums=second)
    return float(g(torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)))


SETTINGS = settings(max_examples=6, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("outer,inner", PAIRS)
@SETTINGS
@given(prog=programs, x=st.floats(-1.5, 1.5), y=st.floats(-1.5, 1.5))
def test_every_pairing_gives_torchs_second_derivatives(outer, inner, prog, x, y,
                                                       tmp_path_factory):
    f, f_torch = load(prog, tmp_path_factory)
    g_inner = mg.grad(f, argnums=0, mode=inner)  # df/dx

    def mixed(y):  # d/dy of df/dx: the inner gradient must carry the outer perturbation
        return g_inner(x, y)

    def pure(x):
        return g_inner(x, y)

    namespace = {"g_inner": g_inner}
    # (source mode reads a function's text: define these two in a file too)
    want_mixed = torch_second(f_torch, 0, 1, x, y)
    want_pure = torch_second(f_torch, 0, 0, x, y)
    got_mixed = as_float(mg.grad(_in_file(mixed, "mixed", tmp_path_factory, namespace, x=x),
                                 mode=outer)(y))
    got_pure = as_float(mg.grad(_in_file(pure, "pure", tmp_path_factory, namespace, y=y),
                                mode=outer)(x))
    assert got_mixed == pytest.approx(want_mixed, rel=1e-9, abs=1e-9)
    assert got_pure == pytest.approx(want_pure, rel=1e-9, abs=1e-9)


def _in_file(fn, name: str, tmp_path_factory, namespace: dict, **constants):
    """``fn`` written as ``def name(arg): return g_inner(...)`` in a file (source mode reads
    text), with the other argument a constant of the file."""
    k = next(_counter)
    path = tmp_path_factory.mktemp("outer") / f"outer{k}.py"
    if name == "mixed":
        body = f"def mixed(y):\n    return g_inner({constants['x']!r}, y)\n"
    else:
        body = f"def pure(x):\n    return g_inner(x, {constants['y']!r})\n"
    path.write_text(body)
    spec = importlib.util.spec_from_file_location(f"outer{k}", path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(namespace)
    spec.loader.exec_module(module)
    return getattr(module, name)


# -- three levels deep ------------------------------------------------------------------------

def cube(x, y):
    return x * x * x * y + mg.sin(x) * y * y


def cube_torch(x, y):
    return x * x * x * y + torch.sin(x) * y * y


@pytest.mark.parametrize("modes", list(itertools.product(MODES, repeat=3)))
def test_three_levels_deep(modes):
    """d/dy d/dx d/dx of cube at (0.7, 1.3), each level in its own mode."""
    m1, m2, m3 = modes
    g1 = mg.grad(cube, argnums=0, mode=m3)
    g2 = mg.grad(_g1_of_x(g1), argnums=0, mode=m2)
    g3 = mg.grad(_g2_of_y(g2), argnums=0, mode=m1)
    want = tf.grad(lambda y: tf.grad(tf.grad(cube_torch, argnums=0), argnums=0)(
        torch.tensor(0.7, dtype=torch.float64), y))(torch.tensor(1.3, dtype=torch.float64))
    assert as_float(g3(1.3)) == pytest.approx(float(want), rel=1e-10)


def _g1_of_x(g1):
    def second(x, y):
        return g1(x, y)
    return second


def _g2_of_y(g2):
    def third(y):
        return g2(0.7, y)
    return third


# -- the wrappers: jvp, jacfwd, jacrev, vjp, value_and_grad, hessian over every mode ------------

def loss(w):
    return mg.sum(mg.tanh(w) * w) + mg.sum(w * w * w) * 0.1


def loss_torch(w):
    return torch.sum(torch.tanh(w) * w) + torch.sum(w * w * w) * 0.1


W = np.array([0.3, -0.8, 1.1])


def torch_hessian() -> np.ndarray:
    return tf.hessian(loss_torch)(torch.tensor(W)).numpy()


@pytest.mark.parametrize("mode", MODES)
def test_hessian_vector_product_forward_over_reverse(mode):
    v = np.array([1.0, -2.0, 0.5])
    _, hvp = mg.jvp(mg.grad(loss, mode=mode), (mg.tensor(W),), (mg.tensor(v),))
    np.testing.assert_allclose(hvp.numpy(), torch_hessian() @ v, rtol=1e-10)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("jac", ["jacfwd", "jacrev"])
def test_jacobian_of_gradient_is_the_hessian(mode, jac):
    H = getattr(mg, jac)(mg.grad(loss, mode=mode))(mg.tensor(W))
    assert H.shape == (3, 3)
    np.testing.assert_allclose(H.numpy(), torch_hessian(), rtol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_vjp_and_value_and_grad_of_a_gradient(mode):
    u = np.array([0.5, 1.0, -1.0])
    out, vjp_fn = mg.vjp(mg.grad(loss, mode=mode), mg.tensor(W))
    (gu,) = vjp_fn(mg.tensor(u))
    np.testing.assert_allclose(gu.numpy(), torch_hessian().T @ u, rtol=1e-10)

    def u_dot_grad(w):
        return mg.sum(mg.grad(loss, mode=mode)(w) * mg.tensor(u))

    value, g = mg.value_and_grad(u_dot_grad)(mg.tensor(W))
    gw = tf.grad(loss_torch)(torch.tensor(W)).numpy()
    assert as_float(value) == pytest.approx(float(gw @ u), rel=1e-12)
    np.testing.assert_allclose(g.numpy(), torch_hessian() @ u, rtol=1e-10)


@pytest.mark.parametrize("mode", ["tape", "graph", "source"])
def test_hessian(mode):
    """``mode`` is the reverse sweep's, under jacfwd's dual numbers."""
    np.testing.assert_allclose(mg.hessian(loss, mode=mode)(mg.tensor(W)).numpy(),
                               torch_hessian(), rtol=1e-10)


def test_hessian_refuses_a_mode_without_a_reverse_sweep():
    with pytest.raises(ValueError, match=r"^hessian: unknown mode 'forward'.*mg.jacfwd"):
        mg.hessian(loss, mode="forward")


@pytest.mark.parametrize("mode", ["tape", "graph", "source"])
@pytest.mark.parametrize("argnums", [(0, 1), (1, 0), (1,)])
def test_hessian_blocks_for_several_arguments_are_torchs(argnums, mode):
    """argnums as a tuple: the blocks d2f / dx_i dx_j as a tuple of tuples, shaped
    x_i.shape + x_j.shape (it raised an internal error: jacfwd cannot take jacrev's tuple)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2, 3)), rng.normal(size=3)

    def mine(a, b):
        return mg.sum(mg.sin(a) * mg.sum(b * b * a))

    def theirs(a, b):
        return torch.sum(torch.sin(a) * torch.sum(b * b * a))

    got = mg.hessian(mine, argnums=argnums, mode=mode)(x, y)
    want = tf.hessian(theirs, argnums=argnums)(torch.tensor(x), torch.tensor(y))
    assert len(got) == len(want) == len(argnums)
    for row, wrow in zip(got, want):
        assert len(row) == len(wrow)
        for block, wblock in zip(row, wrow):
            assert block.shape == tuple(wblock.shape)
            np.testing.assert_allclose(block.numpy(), wblock.numpy(), rtol=1e-10)
    if argnums == (1, 0):  # negative argnums name the same arguments (torch.func's jacfwd
        again = mg.hessian(mine, argnums=(-1, 0), mode=mode)(x, y)  # gives other numbers for -1)
        for row, arow in zip(got, again):
            for block, ablock in zip(row, arow):
                np.testing.assert_array_equal(block.numpy(), ablock.numpy())


def test_jvp_of_a_function_with_several_outputs_says_so():
    with pytest.raises(TypeError, match="jvp: f must return a tensor, got tuple"):
        mg.jvp(lambda v: (mg.sin(v), v), (np.ones(2),), (np.ones(2),))
    with pytest.raises(TypeError, match="must return a tensor, got tuple"):
        mg.jacfwd(lambda v: (mg.sin(v), v))(np.ones(2))


# -- the examples, each a regression test -----------------------------------------------

def f(x, y):
    return x * y + mg.sin(x)


def test_mixed_partial_of_the_textbook_function():
    assert as_float(mg.grad(lambda y: mg.grad(f)(2.0, y))(3.0)) == 1.0


@pytest.mark.parametrize("mode", ["graph", "source"])
def test_tape_gradient_through_a_compiled_function(mode):
    x = mg.tensor(2.0, requires_grad=True)
    gx = mg.grad(f, mode=mode)(x, 3.0)  # 3 + cos x, recorded on the tape
    gx.backward()
    assert x.grad.item() == pytest.approx(-math.sin(2.0), rel=1e-12)


def test_tape_gradient_through_trace():
    traced = mg.trace(f)
    x = mg.tensor(2.0, requires_grad=True)
    traced(x, mg.tensor(3.0)).backward()
    assert x.grad.item() == pytest.approx(3 + math.cos(2.0), rel=1e-12)
    assert mg.grad(traced)(2.0, 3.0).item() == pytest.approx(3 + math.cos(2.0), rel=1e-12)


def test_jacfwd_of_grad():
    H = mg.jacfwd(mg.grad(f))(2.0, 3.0)
    assert as_float(H) == pytest.approx(-math.sin(2.0), rel=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_a_gradient_lands_on_the_default_device(mode):
    gf = mg.grad(f, mode=mode)
    assert gf(1.0, 2.0).device.name == "cpu"
    with mg.device("cpu:1"):
        g = gf(1.0, 2.0)
    assert g.device.name == "cpu:1"


def test_printed_adjoint_keeps_a_equals_x_times_y_and_one_program_serves_all_y():
    gf = mg.source_grad(f)
    assert "a = x * y" in gf.source  # before any call: y is data, not folded into a constant
    gf(2.0, 0.0)
    written = gf.transforms
    for y in np.linspace(-3.0, 3.0, 25):
        assert as_float(gf(2.0, float(y))) == pytest.approx(y + math.cos(2.0), rel=1e-12)
    assert gf.transforms == written  # (programs are shared by every source_grad of f)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("argnums", [3, -3, (0, 0), (0, 5)])
def test_bad_argnums_get_one_error_in_every_mode(mode, argnums):
    with pytest.raises((IndexError, ValueError), match="argnums"):
        mg.grad(f, argnums=argnums, mode=mode)(2.0, 3.0)


@pytest.mark.parametrize("mode", MODES)
def test_argnums_int_and_negative_and_tuple_agree(mode):
    a = mg.grad(f, argnums=1, mode=mode)(2.0, 3.0)
    b = mg.grad(f, argnums=-1, mode=mode)(2.0, 3.0)
    (c,) = mg.grad(f, argnums=(1,), mode=mode)(2.0, 3.0)
    assert as_float(a) == as_float(b) == as_float(c) == 2.0


# -- Jacobians in one batched pass, nested both ways; vmap with every mode ---------------------

@pytest.mark.parametrize("outer", ["jacfwd", "jacrev"])
@pytest.mark.parametrize("inner", ["jacfwd", "jacrev"])
def test_jacobian_of_jacobian_is_the_hessian(outer, inner):
    def g(w):  # R^3 -> R^3, so the inner Jacobian is a matrix and the outer a 3-tensor
        return mg.tanh(w) * mg.sum(w * w)

    def g_torch(w):
        return torch.tanh(w) * torch.sum(w * w)

    got = getattr(mg, outer)(getattr(mg, inner)(g))(mg.tensor(W))
    want = tf.jacfwd(tf.jacrev(g_torch))(torch.tensor(W)).numpy()
    assert got.shape == (3, 3, 3)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-14)


def test_vmap_of_vmap_with_two_batched_values():
    E = np.eye(3)
    got = mg.vmap(lambda v: mg.vmap(lambda t: t * v)(mg.tensor(E)))(mg.tensor(2 * E))
    want = tf.vmap(lambda v: tf.vmap(lambda t: t * v)(torch.tensor(E)))(torch.tensor(2 * E))
    assert got.shape == (3, 3, 3)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def per_example_loss(w, x, y):
    return (mg.sum(mg.tanh(x * w)) - y) ** 2


def per_example_loss_torch(w, x, y):
    return (torch.sum(torch.tanh(x * w)) - y) ** 2


@pytest.mark.parametrize("mode", MODES)
def test_per_example_gradients_by_vmap_of_grad(mode):
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(5, 3)), rng.normal(size=5)
    got = mg.vmap(mg.grad(per_example_loss, mode=mode), in_axes=(None, 0, 0))(
        mg.tensor(W), mg.tensor(X), mg.tensor(Y))
    want = tf.vmap(tf.grad(per_example_loss_torch), in_dims=(None, 0, 0))(
        torch.tensor(W), torch.tensor(X), torch.tensor(Y))
    assert got.shape == (5, 3)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_grad_of_a_vmapped_function(mode):
    rng = np.random.default_rng(1)
    X, Y = rng.normal(size=(5, 3)), rng.normal(size=5)

    def total(w):
        return mg.sum(mg.vmap(per_example_loss, in_axes=(None, 0, 0))(w, mg.tensor(X),
                                                                     mg.tensor(Y)))

    def total_torch(w):
        return torch.sum(tf.vmap(per_example_loss_torch, in_dims=(None, 0, 0))(
            w, torch.tensor(X), torch.tensor(Y)))

    got = mg.grad(_in_file_total(total), mode=mode)(mg.tensor(W))
    np.testing.assert_allclose(got.numpy(), tf.grad(total_torch)(torch.tensor(W)).numpy(),
                               rtol=1e-10)


def _in_file_total(total):
    def loss_of_w(w):
        return total(w)
    return loss_of_w


@pytest.mark.parametrize("mode", MODES)
def test_gradients_come_in_argnums_order(mode):
    """argnums=(1, 0) gives (dz/dy, dz/dx), as in JAX, in every mode."""
    gy, gx = mg.grad(f, argnums=(1, 0), mode=mode)(2.0, 3.0)
    assert (as_float(gy), as_float(gx)) == pytest.approx((2.0, 3 + math.cos(2.0)), rel=1e-12)


# -- Python asking a transformed value for a number ---------------------------------------------

def _times_its_float(x):
    return float(x) * x  # float(x) is a constant: PyTorch's d/dx is float(x), not 2x


def _times_its_item(x):
    return x * int(x.item())


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")  # (torch's, on purpose)
@pytest.mark.parametrize("mode", ["tape", "forward"])
@pytest.mark.parametrize("fn", [_times_its_float, _times_its_item])
def test_a_number_asked_of_a_differentiated_value_is_a_constant_as_in_pytorch(mode, fn):
    """float(x), int(x), x.item() inside mg.grad: the value inside answers in every mode
    that has one (a dual number raised TypeError/AttributeError before), and the number is
    a constant, as PyTorch's is; numpy() refuses, as PyTorch's does."""
    xt = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    fn(xt).backward()
    assert mg.grad(fn, mode=mode)(2.5).item() == pytest.approx(xt.grad.item(), rel=1e-15)
    assert mg.jvp(fn, (2.5,), (1.0,))[1].item() == pytest.approx(xt.grad.item(), rel=1e-15)
    with pytest.raises(GradientError, match="numpy\\(\\): this value is being differentiated"):
        mg.grad(lambda x: x.numpy() * x, mode=mode)(2.5)


def _times_its_list(x):
    return x * mg.tensor(x.tolist())  # a list of numbers: constants, as float(x) is


@pytest.mark.parametrize("mode", ["tape", "forward"])
def test_tolist_of_a_differentiated_value_is_constants_as_in_pytorch(mode):
    """x.tolist() answered AttributeError ('Box' object has no attribute 'tolist')."""
    xt = torch.tensor([2.5, -1.0], dtype=torch.float64, requires_grad=True)
    torch.sum(xt * torch.tensor(xt.tolist(), dtype=torch.float64)).backward()
    got = mg.grad(lambda x: mg.sum(_times_its_list(x)), mode=mode)(mg.tensor([2.5, -1.0]))
    np.testing.assert_array_equal(got.numpy(), xt.grad.numpy())


def _through_numpy(x):
    return mg.tensor(np.asarray(x) * 2.0) * x


@pytest.mark.parametrize("transform, error", [
    (lambda f: mg.grad(f, mode="tape"), GradientError),
    (lambda f: mg.grad(f, mode="forward"), GradientError),
    (lambda f: mg.grad(f, mode="graph"), TracedValueError),
    (lambda f: lambda x: mg.vjp(f, x)[0], GradientError),
    (lambda f: lambda x: mg.jvp(f, (x,), (1.0,))[1], GradientError),
])
def test_np_asarray_of_a_transformed_value_refuses_and_says_why(transform, error):
    """np.asarray(x) of a value being differentiated made a NumPy object array, which
    failed later as "dtype object is not supported"; PyTorch refuses it ("Can't call
    numpy() on Tensor that requires grad"). Every transformation now refuses at once
    (vmap's batched values already did: test_vmap.py)."""
    with pytest.raises(RuntimeError, match="requires grad"):
        np.asarray(torch.tensor(2.5, requires_grad=True) * 2)
    with pytest.raises(error, match="np.asarray"):
        transform(_through_numpy)(2.5)


NUMPY_REDUCTIONS = [(np.sum, torch.sum), (np.mean, torch.mean), (np.max, torch.max),
                    (np.min, torch.min)]


@pytest.mark.parametrize("np_reduce, torch_reduce", NUMPY_REDUCTIONS)
@pytest.mark.parametrize("mode", ["tape", "forward", "graph"])
def test_numpys_reductions_of_a_minigraph_value_are_minigraphs_with_their_gradient(
        np_reduce, torch_reduce, mode):
    """np.sum(x), np.mean(x), np.max(x) call x's own method with NumPy's dtype= and out=;
    it failed with "unexpected keyword argument 'out'" in every mode (eager too)."""
    x0 = np.array([0.5, -2.0, 3.0])
    xt = torch.tensor(x0, requires_grad=True)
    torch_reduce(torch.sin(xt) * xt).backward()
    got = mg.grad(lambda x: np_reduce(mg.sin(x) * x), mode=mode)(mg.tensor(x0))
    np.testing.assert_allclose(got.numpy(), xt.grad.numpy(), rtol=1e-12)
    assert float(np_reduce(mg.tensor(x0))) == float(np_reduce(x0))  # eager: NumPy's value
    rows = np.array([[1.0, 5.0], [4.0, 2.0]])
    np.testing.assert_array_equal(mg.vmap(np_reduce)(mg.tensor(rows)).numpy(),
                                  np_reduce(rows, axis=1))


@pytest.mark.parametrize("call, error, words", [
    (lambda t: np.sum(t, dtype=np.float32), DTypeError, r"sum of a tensor of shape \(2,\) "
                                                        r"float64: dtype=float32 is not"),
    (lambda t: np.mean(t, dtype="float32"), DTypeError, r"mean of a tensor .*dtype=float32"),
    (lambda t: np.sum(t, out=np.zeros(())), TypeError, r"sum of a tensor .*: out= is not"),
    (lambda t: np.max(t, out=np.zeros(())), TypeError, r"max of a tensor .*: out= is not"),
    (lambda t: np.min(t, out=np.zeros(())), TypeError, r"min of a tensor .*: out= is not"),
])
def test_numpys_reduction_options_minigraph_has_not_are_refused_by_name(call, error, words):
    with pytest.raises(error, match=words):
        call(mg.tensor([1.0, 2.0]))


def _numpys_sum_of(x):
    return np.sum(mg.sin(x) * x)


def test_source_mode_refuses_numpys_reduction_and_names_the_line():
    """Source mode reads f's text and knows minigraph's functions only: np.sum is not one
    of them, so it refuses, at the line, rather than guess what the call does."""
    with pytest.raises(SourceTransformError, match=r"calling sum on a value of the program "
                                                   r"is not supported \(in _numpys_sum_of"):
        mg.grad(_numpys_sum_of, mode="source")(mg.tensor([0.5, -2.0]))


def test_np_asarray_of_a_graph_constant_is_its_value():
    with mg.Graph():
        c = mg.constant(np.array([1.0, 2.0]))
        x = mg.placeholder((2,))
        np.testing.assert_array_equal(np.asarray(c), [1.0, 2.0])
        assert np.asarray(c, dtype=np.float32).dtype == np.float32
        mine = np.asarray(c)
        mine[0] = 7.0  # the caller's copy: the constant keeps its value
        np.testing.assert_array_equal(np.asarray(c), [1.0, 2.0])
        with pytest.raises(ValueError, match="copy=False"):
            np.asarray(c, copy=False)
        assert c.tolist() == [1.0, 2.0]
        with pytest.raises(TracedValueError, match="tolist"):
            x.tolist()


@pytest.mark.parametrize("ask", [float, int, lambda v: v.item(), lambda v: v.numpy(),
                                 lambda v: mg.tensor(v.tolist())])
def test_a_batched_value_refuses_to_be_one_number(ask):
    """(tolist() answered AttributeError: 'BatchTracer' object has no attribute 'tolist'.)"""
    with pytest.raises(BatchingError, match="one value per example"):
        mg.vmap(lambda v: v * ask(v))(mg.tensor([2.5, 0.5]))
    with pytest.raises(TracedValueError):  # a graph node has no value while it is traced
        mg.grad(lambda v: v * ask(v), mode="graph")(2.5)


def test_len_of_a_transformed_value_is_one_examples_length():
    rows = mg.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(mg.vmap(lambda v: v * len(v))(rows).numpy(), rows.numpy() * 3)
    assert mg.jvp(lambda v: v * len(v), (rows,), (rows,))[1].numpy().tolist() == \
        (rows.numpy() * 2).tolist()


# -- a no_grad block inside the function -----------------------------------------------------------
# The tape made the values computed inside it constants, as PyTorch's torch.func.grad does;
# forward and graph mode (and a tape gradient through mg.trace) differentiated through
# them: mg.grad gave 9 in one mode and 27 in the others for x * x * x at 3. PyTorch's
# torch.func is the oracle, for grad and for jvp/jacfwd, which ignore the block.

def _with_a_constant_inside(lib):
    def f(x):
        with lib.no_grad():
            c = x * x
        return lib.sum(c * lib.sin(x))
    return f


def test_a_no_grad_block_inside_f_is_a_constant_for_grad_in_every_mode():
    torch = pytest.importorskip("torch")
    import torch.func as tf

    x = np.array([0.3, -1.2, 2.0])
    want = tf.grad(_with_a_constant_inside(torch))(torch.tensor(x)).numpy()
    f = _with_a_constant_inside(mg)
    for name, got in [(mode, mg.grad(f, mode=mode)(x)) for mode in ("tape", "forward", "graph")]\
            + [("grad(trace)", mg.grad(mg.trace(f))(x)),
               ("value_and_grad forward", mg.value_and_grad(f, mode="forward")(x)[1]),
               ("jacrev", mg.jacrev(f)(x))]:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, err_msg=name)
    with mg.no_grad():  # an outer block does not stop a transformation (torch.func's rule)
        for mode in ("tape", "forward", "graph"):
            np.testing.assert_allclose(mg.grad(f, mode=mode)(x).numpy(), want, rtol=1e-12)
    # jvp and jacfwd are forward mode, which the block does not stop, in torch.func too
    e = np.array([1.0, 0.0, 0.0])
    _, t = mg.jvp(f, (x,), (e,))
    _, t_want = tf.jvp(_with_a_constant_inside(torch), (torch.tensor(x),), (torch.tensor(e),))
    np.testing.assert_allclose(t.numpy(), t_want.numpy(), rtol=1e-12)
    np.testing.assert_allclose(mg.jacfwd(f)(x).numpy(),
                               tf.jacfwd(_with_a_constant_inside(torch))(torch.tensor(x)).numpy(),
                               rtol=1e-12)


def test_a_no_grad_block_is_a_constant_at_every_level_of_every_pairing():
    """grad of grad, each of tape, forward and graph outside and inside, and vmap of
    grad: the block's value is a constant at both levels, as in torch.func."""
    torch = pytest.importorskip("torch")
    import torch.func as tf

    def g(lib):
        def h(x):
            with lib.no_grad():
                c = x * x
            return lib.sin(x) * c
        return h
    x0 = 0.7
    want = tf.grad(tf.grad(g(torch)))(torch.tensor(x0, dtype=torch.float64)).item()
    assert want == pytest.approx(-x0 ** 2 * math.sin(x0), rel=1e-12)  # -c sin(x), c held
    modes = ("tape", "forward", "graph")
    for outer, inner in itertools.product(modes, modes):
        got = mg.grad(mg.grad(g(mg), mode=inner), mode=outer)(x0).item()
        assert got == pytest.approx(want, rel=1e-12), (outer, inner)
    xs = np.array([0.2, 0.7, 1.3])
    per_example = tf.vmap(tf.grad(g(torch)))(torch.tensor(xs)).numpy()
    for mode in modes:
        np.testing.assert_allclose(mg.vmap(mg.grad(g(mg), mode=mode))(xs).numpy(),
                                   per_example, rtol=1e-12, err_msg=mode)


def _held_inside(x):
    with mg.no_grad():
        c = mg.sin(x) * x
    return c * x


def _sum_through_vmap(x):  # (source mode reads this one; it refuses a with block in it)
    return mg.sum(mg.vmap(_held_inside)(x))


def _sum_held(y):
    return mg.sum(_held_inside(y))


def _sum_through_grad(x):
    return mg.sum(mg.grad(_sum_held)(x))


def _sum_held_quadratic(lib):
    def f(a):
        with lib.no_grad():
            c = lib.sin(a) * a
        return lib.sum(c * a * a)
    return f


def test_a_no_grad_block_in_a_recorded_program_stops_adjoints_only():
    """A recorded program (mg.trace, mode="graph") marked a no_grad value with
    stop_gradient, which stops tangents too: mg.hessian(f, mode="graph") gave
    d/da (2 a c) with c held (torch.func.hessian and finite differences: c moves), and
    mg.jvp of a traced f lost the block's tangent, which mg.jvp of f keeps. Source mode,
    reaching the block through vmap or grad, differentiated through it. The value now
    gets a no_grad node: no adjoint, tangents pass (forward-mode grad stops them)."""
    torch = pytest.importorskip("torch")
    import torch.func as tf

    a = np.array([0.3, 0.8, 1.1])
    ta = torch.tensor(a)
    want = tf.hessian(_sum_held_quadratic(torch))(ta).numpy()
    np.testing.assert_allclose(np.diag(want), 4 * a * np.sin(a) + 2 * a * a * np.cos(a),
                               rtol=1e-12)  # d/da 2 a^2 sin a, the closed form
    for mode in ("tape", "graph", "source"):
        if mode == "source":  # (f holds the block itself: source mode refuses it)
            continue
        got = mg.hessian(_sum_held_quadratic(mg), mode=mode)(a)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, err_msg=mode)
    e = np.ones(3)
    t_want = tf.jvp(lambda x: (torch.sin(x) * x) * x, (ta,), (torch.tensor(e),))[1].numpy()
    for fn in (_held_inside, mg.trace(_held_inside)):
        np.testing.assert_allclose(mg.jvp(fn, (a,), (e,))[1].numpy(), t_want, rtol=1e-12)
    def held_torch(x):
        with torch.no_grad():
            c = torch.sin(x) * x
        return c * x
    wants = {_sum_through_vmap: tf.grad(lambda x: tf.vmap(held_torch)(x).sum())(ta).numpy(),
             _sum_through_grad: tf.grad(lambda x: tf.grad(
                 lambda y: held_torch(y).sum())(x).sum())(ta).numpy()}
    np.testing.assert_allclose(wants[_sum_through_vmap], a * np.sin(a), rtol=1e-12)  # c held
    assert not wants[_sum_through_grad].any()  # the inner gradient, c, is held at both levels
    for mode in ("tape", "forward", "graph", "source"):
        for f, want_f in wants.items():
            np.testing.assert_allclose(mg.grad(f, mode=mode)(a).numpy(), want_f, rtol=1e-12,
                                       err_msg=f"{mode} {f.__name__}")


@pytest.mark.parametrize("who, call", [
    ("grad", lambda x: mg.grad(lambda a: mg.sum(a * a))(x)),
    ("grad", lambda x: mg.grad(lambda a: mg.sum(a * a), mode="forward")(x)),
    ("jacrev", lambda x: mg.jacrev(mg.sin)(x)), ("jacfwd", lambda x: mg.jacfwd(mg.sin)(x)),
    ("hessian", lambda x: mg.hessian(lambda a: mg.sum(a * a))(x)),
    ("jvp", lambda x: mg.jvp(mg.sin, (x,), (1.0,))), ("vmap", lambda x: mg.vmap(mg.sin)(x))])
def test_a_placeholder_of_unknown_shape_is_refused_by_name(who, call):
    """grad, jacrev, jacfwd, hessian and jvp of a graph placeholder made with shape=None
    failed inside with a TypeError (int(None), None not iterable); vmap said why."""
    with mg.Graph():
        x = mg.placeholder(shape=None, dtype="float64", name="x")
        with pytest.raises(mg.errors.ShapeError, match=f"{who}: argument 0 has an unknown shape"):
            call(x)


# -- a transformation handed to another as it is ------------------------------------------
# mg.grad(mg.grad(f, mode="source"), mode="source"), as JAX users write grad(grad(f)): source
# mode writes a function that calls the inner transformation and reads that (the other modes
# call it anyway). Checked against torch.func, never against another minigraph mode.

def _torch_at(fn, *args):
    return float(fn(*[torch.tensor(a, dtype=torch.float64) for a in args]))


INNER = {  # name -> (the inner transformation of cube, torch's, as functions of (x, y))
    **{f"grad(mode={m!r})": (lambda m=m: mg.grad(cube, mode=m), lambda: tf.grad(cube_torch))
       for m in MODES},
    "source_grad": (lambda: mg.source_grad(cube), lambda: tf.grad(cube_torch)),
    "jacfwd": (lambda: mg.jacfwd(cube), lambda: tf.jacfwd(cube_torch)),
    "jacrev": (lambda: mg.jacrev(cube), lambda: tf.jacrev(cube_torch)),
    "checkpoint": (lambda: mg.checkpoint(cube), lambda: cube_torch),
    "trace": (lambda: mg.trace(cube), lambda: cube_torch),
}


@pytest.mark.parametrize("inner", sorted(INNER))
@pytest.mark.parametrize("argnums", [0, 1])
def test_source_mode_transforms_a_transformation_handed_to_it(inner, argnums):
    make, make_torch = INNER[inner]
    got = mg.grad(make(), argnums=argnums, mode="source")(0.7, -1.3)
    want = _torch_at(tf.grad(make_torch(), argnums=argnums), 0.7, -1.3)
    assert as_float(got) == pytest.approx(want, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("inner", MODES)
def test_source_mode_three_levels_deep_on_transformations_themselves(inner):
    g3 = mg.grad(mg.grad(mg.grad(cube, mode=inner), mode="source"), argnums=1, mode="source")
    want = _torch_at(tf.grad(tf.grad(tf.grad(cube_torch)), argnums=1), 0.7, -1.3)
    assert as_float(g3(0.7, -1.3)) == pytest.approx(want, rel=1e-10)


def test_the_printed_program_of_a_gradient_of_a_gradient():
    gg = mg.source_grad(mg.source_grad(f))
    assert as_float(gg(2.0, 3.0)) == pytest.approx(-math.sin(2.0), rel=1e-12)
    text = gg.source
    assert text.startswith("def grad_grad_f(x, y):")  # f's parameters, named after both
    assert "mg.cos(x)" in text and "mg.sin(x)" in text  # the inner adjoint's line, reversed


def _calls_vjp(x, y):
    out, back = mg.vjp(cube, x, y)
    gx, gy = back(1.0)
    return gx * out + gy


def _calls_vjp_torch(x, y):
    out = cube_torch(x, y)
    gx, gy = torch.autograd.grad(out, (x, y), create_graph=True)
    return gx * out + gy


def _calls_jvp(x, y):
    out, t = mg.jvp(cube, (x, y), (1.0, 0.5))
    return t * out


def _calls_jvp_torch(x, y):
    out, t = tf.jvp(cube_torch, (x, y), (torch.tensor(1.0, dtype=torch.float64),
                                         torch.tensor(0.5, dtype=torch.float64)))
    return t * out


def _calls_trace(x, y):
    return mg.trace(cube)(x, y) * x


def _calls_source_grad(x, y):
    return mg.source_grad(cube, argnums=1)(x, y) * y


@pytest.mark.parametrize("fn,oracle", [(_calls_vjp, _calls_vjp_torch),
                                       (_calls_jvp, _calls_jvp_torch),
                                       (_calls_trace, lambda x, y: cube_torch(x, y) * x),
                                       (_calls_source_grad,
                                        lambda x, y: tf.grad(cube_torch, argnums=1)(x, y) * y)])
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_differentiates_a_function_calling_vjp_jvp_trace_or_source_grad(fn, oracle,
                                                                                  mode):
    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    y = torch.tensor(-1.3, dtype=torch.float64, requires_grad=True)
    want = torch.autograd.grad(oracle(x, y), (x, y))
    got = mg.grad(fn, argnums=(0, 1), mode=mode)(0.7, -1.3)
    assert [as_float(g) for g in got] == pytest.approx([float(w) for w in want], rel=1e-10)


@pytest.mark.parametrize("make", [lambda: mg.grad(cube), lambda: mg.grad(cube, mode="source"),
                                  lambda: mg.value_and_grad(cube, mode="graph"),
                                  lambda: mg.jacfwd(cube), lambda: mg.jacrev(cube),
                                  lambda: mg.hessian(cube), lambda: mg.vmap(cube),
                                  lambda: mg.checkpoint(cube), lambda: mg.trace(cube),
                                  lambda: mg.source_grad(cube)])
def test_a_transformation_has_its_functions_parameters(make):
    import inspect
    assert inspect.signature(make()) == inspect.signature(cube)  # (functools.wraps, as JAX)


def test_source_mode_of_vjp_itself_refuses_naming_it():
    with pytest.raises(mg.SourceTransformError, match=r"vjp\(f, \*primals"):
        mg.grad(mg.vjp, mode="source")


def _with_default(x, y=-1.3):
    return cube(x, y)


def test_source_mode_of_a_transformation_keeps_fs_defaults():
    want = _torch_at(tf.grad(tf.grad(cube_torch)), 0.7, -1.3)
    got = mg.grad(mg.grad(_with_default, mode="source"), mode="source")(0.7)  # y defaulted
    assert as_float(got) == pytest.approx(want, rel=1e-10)


# -- a gradient has its input's dtype, in every mode (PyTorch's and JAX's rule) --------------

def _mixed(x, y):  # x float32, y float64: the arithmetic is float64
    return mg.sum(x * y + mg.sin(x))


def _mixed_torch(x, y):
    return torch.sum(x * y + torch.sin(x))


@pytest.mark.parametrize("mode", MODES)
def test_a_gradient_has_its_inputs_dtype_in_every_mode(mode):
    x32, y64 = np.array([0.5, -1.0], np.float32), np.array([2.0, 3.0])
    tx, ty = torch.tensor(x32), torch.tensor(y64)
    want = tf.grad(_mixed_torch, argnums=(0, 1))(tx, ty)
    got = mg.grad(_mixed, argnums=(0, 1), mode=mode)(mg.tensor(x32), mg.tensor(y64))
    assert [g.dtype for g in got] == ["float32", "float64"] == [str(w.dtype)[6:] for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6)
    batched = mg.vmap(mg.grad(_mixed, mode=mode), in_axes=(0, None))(
        mg.tensor(np.stack([x32, -x32])), mg.tensor(y64))
    assert batched.dtype == "float32"
    hess = mg.jacfwd(mg.grad(_mixed, mode=mode))(mg.tensor(x32), mg.tensor(y64))
    want_h = tf.jacfwd(tf.grad(_mixed_torch))(tx, ty)
    assert hess.dtype == str(want_h.dtype)[6:] == "float32"
    np.testing.assert_allclose(hess.numpy(), want_h.numpy(), rtol=1e-6)


def test_mg_gradients_of_a_float32_placeholder_is_float32():
    with mg.Graph():
        x = mg.placeholder((2,), "float32", name="x")
        y = mg.sum(x * mg.constant(np.array([2.0, 3.0])))  # float64 arithmetic
        (gx,) = mg.gradients(y, [x])
        assert gx.dtype == "float32"
        with mg.Session() as sess:
            out = sess.run(gx, {x: np.array([1.0, 1.0], np.float32)})
    assert out.dtype == np.float32 and out.tolist() == [2.0, 3.0]


def _defaulted(x, w=3.0):
    return x * x * w  # d/dx = 2 x w, d/dw = x^2


@pytest.mark.parametrize("mode", MODES)
def test_argnums_count_the_arguments_passed_when_defaults_fill_the_rest(mode):
    """As in JAX: argnums=-1 is the last argument passed, and an argnum that names a
    default is refused. Source mode counted f's parameters instead, so argnums=-1
    differentiated the default w: another answer than the other modes, without a word."""
    assert as_float(mg.grad(_defaulted, argnums=-1, mode=mode)(2.0)) == 12.0  # d/dx
    assert as_float(mg.grad(_defaulted, argnums=-1, mode=mode)(2.0, 3.0)) == 4.0  # d/dw
    with pytest.raises(IndexError, match="argnums=1 names argument 1, but the function was "
                                         "called with 1 argument"):
        mg.grad(_defaulted, argnums=1, mode=mode)(2.0)


@pytest.mark.parametrize("call, error", [
    (lambda h: h(np.ones(3), w=2.0), TypeError),          # a keyword
    (lambda h: h(2), mg.errors.DTypeError),                # an integer to differentiate
    (lambda h: h([mg.tensor(1.0)]), mg.errors.PytreeError),  # a pytree
])
@pytest.mark.parametrize("argnums", [0, (0,)])
def test_hessians_errors_name_hessian_not_the_jacfwd_inside_it(call, error, argnums):
    h = mg.hessian(lambda x, w=1.0: mg.sum(x * x * w), argnums=argnums)
    with pytest.raises(error, match=r"^hessian: "):
        call(h)
    with pytest.raises(IndexError, match=r"^hessian: argnums"):
        mg.hessian(cube, argnums=3)(0.5, 1.0)


@pytest.mark.parametrize("shape", [(), (1,), (1, 1), (3,), (2, 3), (0,)])
def test_forward_modes_gradient_has_the_arguments_shape(shape):
    """One pass per element; a single element's tangent is the gradient, reshaped."""
    x = np.linspace(-1.0, 1.0, math.prod(shape)).reshape(shape)
    g = mg.grad(lambda v: mg.sum(mg.sin(v) * v), mode="forward")(mg.tensor(x))
    assert g.shape == shape
    np.testing.assert_allclose(g.numpy(), np.cos(x) * x + np.sin(x), rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_source_mode_of_value_and_grad_refuses_its_tuple_naming_it(mode):
    """value_and_grad returns (value, gradient): no scalar to differentiate. The refusal
    names the function source mode wrote to call it (it said 'in wrapped')."""
    with pytest.raises(TypeError, match=r"got tuple \[source_grad: in value_and_grad_cube"):
        mg.grad(mg.value_and_grad(cube, mode=mode), mode="source")(0.7, -1.3)


@pytest.mark.parametrize("wrap", [lambda g, x: mg.vmap(g)(mg.stack([x, x])),
                                  lambda g, x: mg.grad(lambda a: mg.sum(g(a)))(x),
                                  lambda g, x: mg.jvp(g, (x,), (mg.ones_like(x),))])
@pytest.mark.parametrize("inner", ["grad", "trace"])
def test_a_recorded_function_closing_over_an_outer_value_says_so(wrap, inner):
    """Graph mode records f on placeholders; an f that reads a variable of the function
    around it (a vmap's batched value, a grad's box) returned that transformation's value,
    and the error only said 'f must return a graph value, got BatchTracer'."""
    def outer(x):
        if inner == "grad":
            return mg.grad(lambda y: mg.sum(y * x), mode="graph")(x)
        return mg.trace(lambda y: y * x)(x)
    with pytest.raises(GraphError, match="a value of a transformation around this one"):
        wrap(outer, mg.tensor([1.0, 2.0]))
