"""Trust in the op table: broadcasting VJPs, batching of scatter_add and getitem, index
errors, NumPy scalars' dtypes, and every kernel against its own shape rule.

Each test names what was wrong. The oracles are independent of minigraph: NumPy,
PyTorch, closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minigraph as mg
from minigraph.autodiff import tape
from minigraph.ops.primitive import PRIMITIVES

torch = pytest.importorskip("torch")


def _scatter_np(g, index, shape):
    out = np.zeros(shape)
    np.add.at(out, index, g)
    return out


# -- scatter_add: g that broadcasts to x[index] ------------------------------------------------

def test_vmap_and_jacfwd_of_scatter_add_with_a_broadcast_g():
    """vmap moved g's batch axis without first giving g the rank of x[index]: the batch
    axis met the trailing axis of the places, and the values came out silently wrong."""
    idx = (np.array([0, 0, 1]),)
    G = np.array([1.0, 2.0, 3.0])
    got = mg.vmap(lambda g: mg.scatter_add(g, idx, (3,)))(mg.tensor(G)).numpy()
    np.testing.assert_allclose(got, np.stack([_scatter_np(g, idx, (3,)) for g in G]))
    G2 = np.array([[1.0, 2.0], [3.0, 4.0]])  # a basic index: g (2,) over a (2, 2) block
    got2 = mg.vmap(lambda g: mg.scatter_add(g, (slice(0, 2),), (2, 2)))(mg.tensor(G2))
    np.testing.assert_allclose(got2.numpy(), np.stack([np.broadcast_to(r, (2, 2)) for r in G2]))
    w = np.array([1.0, 2.0, 3.0])  # d scatter(sum(w * x))_i / dx_j = hits(i) * w_j
    J = mg.jacfwd(lambda x: mg.scatter_add(mg.sum(x * mg.tensor(w)), idx, (3,)))(
        mg.tensor([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(J.numpy(), np.outer([2.0, 1.0, 0.0], w))


def test_scatter_add_refuses_a_g_that_does_not_broadcast_to_the_places():
    """The shape rule never compared g with x[index]: graph mode accepted any g."""
    with mg.Graph():
        g = mg.placeholder(shape=(2,))
        with pytest.raises(mg.errors.ShapeError, match="scatter_add: g of shape"):
            mg.scatter_add(g, (np.array([0, 0, 1]),), (3,))
    with pytest.raises(mg.errors.ShapeError, match="scatter_add"):  # NumPy drops the 1
        mg.scatter_add(mg.tensor(np.ones((1, 2))), (slice(0, 2),), (3,))


SCATTER_INDEX, SCATTER_W = (np.array([0, 0, 1]),), np.array([1.0, 10.0, 100.0])


def _scattered(g):  # (a def at module level: source mode reads the function's text)
    return (mg.scatter_add(g, SCATTER_INDEX, (3,)) * mg.tensor(SCATTER_W)).sum()


@pytest.mark.parametrize("mode", ["tape", "graph", "source"])
def test_scatter_add_gradient_of_a_broadcast_g_has_g_shape(mode):
    """getitem(adjoint, index) was g's share, of x[index]'s shape: a scalar g got a .grad
    of shape (3,). Oracle: PyTorch's index_put with accumulate=True."""
    index, W = SCATTER_INDEX, SCATTER_W
    tg = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    out = torch.zeros(3, dtype=torch.float64).index_put(
        (torch.tensor(index[0]),), tg.expand(3), accumulate=True)
    (out * torch.tensor(W)).sum().backward()
    got = mg.grad(_scattered, mode=mode)(mg.tensor(2.0))
    assert got.shape == ()
    np.testing.assert_allclose(got.numpy(), tg.grad.numpy())


def test_a_vjp_rule_share_of_the_wrong_shape_is_an_error():
    """The reverse sweep handed on whatever a VJP rule returned: a rule that forgot to sum
    a broadcast back put a wrong-shaped .grad on a leaf, silently."""
    prim = PRIMITIVES["identity"]
    saved = prim.vjp
    try:
        prim.vjp = (lambda g, out, x: mg.broadcast_to(g, (2,) + tuple(g.shape)),)
        x = mg.tensor([1.0, 2.0, 3.0], requires_grad=True)
        with pytest.raises(mg.errors.ShapeError, match=r"'identity'.*\(2, 3\).*\(3,\)"):
            mg.identity(x).sum().backward()
    finally:
        prim.vjp = saved


# -- relu_grad and log_softmax_grad broadcast g against y -----------------------------------

@pytest.mark.parametrize("mode", ["tape", "graph"])
def test_relu_grad_and_log_softmax_grad_vjps_sum_back_a_broadcast_g(mode):
    """Their VJPs never summed the adjoint back to a broadcast g's shape (oracle: PyTorch
    on the closed forms g * (y > 0) and g - exp(y) * sum(g, axis))."""
    Y, W = np.array([1.0, -2.0, 3.0]), np.array([1.0, 10.0, 100.0])
    tg = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    (tg * (torch.tensor(Y) > 0).double() * torch.tensor(W)).sum().backward()
    got = mg.grad(lambda g: (mg.relu_grad(g, mg.tensor(Y)) * mg.tensor(W)).sum(),
                  mode=mode)(mg.tensor(2.0))
    assert got.shape == () and np.isclose(got.item(), tg.grad.item())
    rng = np.random.default_rng(0)
    W2 = rng.standard_normal((2, 3))
    Yl = np.log([[0.2, 0.3, 0.5], [0.1, 0.6, 0.3]])
    for G, axis in [(rng.standard_normal((1, 3)), -1), (rng.standard_normal((2, 1)), -1),
                    (rng.standard_normal(3), 0)]:  # broadcast along, across, in front of axis
        tg = torch.tensor(G, requires_grad=True)
        s = tg.sum(axis, keepdim=True)
        ((tg - torch.exp(torch.tensor(Yl)) * s) * torch.tensor(W2)).sum().backward()
        f = lambda g: (mg.log_softmax_grad(g, mg.tensor(Yl), axis) * mg.tensor(W2)).sum()
        got = mg.grad(f, mode=mode)(mg.tensor(G))
        assert got.shape == G.shape
        np.testing.assert_allclose(got.numpy(), tg.grad.numpy())


def test_log_softmax_grad_with_y_smaller_than_g():
    """The kernel multiplied exp(y) in place by sum(g), which fails where y is smaller
    than g (NumPy's 'non-broadcastable output operand'). Oracle: NumPy."""
    g = np.random.default_rng(0).uniform(-1, 1, (4, 3))
    y = np.log(np.array([[0.2, 0.3, 0.5]]))
    got = mg.log_softmax_grad(mg.tensor(g), mg.tensor(y), axis=-1).numpy()
    np.testing.assert_allclose(got, g - np.exp(y) * g.sum(-1, keepdims=True))


# -- getitem ---------------------------------------------------------------------------------

def test_a_bool_scalar_beside_ints_is_batched_as_numpy_indexes():
    """_is_basic counted a bool as an int (Python's bool subclasses int), though NumPy reads
    x[0, :, True] as advanced indexing: vmap, jacrev and jacfwd failed. Oracle: NumPy."""
    A = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    f = lambda x: x[0, :, True]
    np.testing.assert_array_equal(mg.vmap(f)(mg.tensor(A)).numpy(),
                                  np.stack([a[0, :, True] for a in A]))
    picked = np.arange(12).reshape(3, 4)[0, :, True]  # the flat positions selected
    J = np.eye(12)[picked.ravel()].reshape(picked.shape + (3, 4))
    for jac in (mg.jacrev, mg.jacfwd):
        np.testing.assert_array_equal(jac(f)(mg.tensor(A[0])).numpy(), J)


@pytest.mark.parametrize("index", [5, [0, 5], 1.5, (0, 0)])
def test_a_bad_index_in_graph_mode_names_getitem_and_the_shape(index):
    """getitem's shape rule let NumPy's bare IndexError out: no op, no shape, no line."""
    with mg.Graph():
        x = mg.placeholder(shape=(2,), name="x")
        with pytest.raises(IndexError, match=r"getitem: .*shape \(2,\)(.|\n)*in node"):
            x[index]


def test_a_bad_index_under_vmap_names_the_example_shape():
    """Under vmap the error named the batched shape (2, 3, 4) and axis 2, not the shape
    (3, 4) and axis 1 the user indexed (NumPy's message for one example is the oracle)."""
    with pytest.raises(IndexError) as numpy_error:
        np.zeros((3, 4))[:, 5]
    with pytest.raises(IndexError, match=r"shape \(3, 4\)") as error:
        mg.vmap(lambda r: r[:, 5])(mg.tensor(np.zeros((2, 3, 4))))
    assert str(numpy_error.value) in str(error.value)


# -- dtypes -----------------------------------------------------------------------------------

def _scaled(x):  # (source mode reads the function's text: a def at module level)
    return (mg.astype(x * np.float64(0.1), "float32") ** 2).sum()


@pytest.mark.parametrize("mode", ["graph", "source"])
def test_a_numpy_float64_scalar_is_a_strong_dtype(mode):
    """dtype_of took np.float64 (a float subclass) for a weak Python float, so the rules
    said float32 * np.float64(0.1) is float32; NumPy (NEP 50) says float64."""
    x32 = np.array([1.0, 2.0, 3.0], np.float32)
    assert mg.ops.shape_rules.dtype_of(np.float64(0.1)) == "float64"
    with mg.Graph():
        p = mg.placeholder(shape=(3,), dtype="float32")
        assert (p * np.float64(0.1)).dtype == (x32 * np.float64(0.1)).dtype.name
    v, g = mg.value_and_grad(_scaled, mode=mode)(mg.tensor(x32))
    want = ((x32 * np.float64(0.1)).astype(np.float32) ** 2).sum()
    assert v.dtype == "float32" and g.dtype == "float32" and v.item() == want.item()


def test_log_softmax_grad_and_nll_loss_rules_give_their_kernels_dtypes():
    """log_softmax_grad's rule said g's dtype (float32) where its kernel promotes with y
    (float64); nll_loss's said int64 for integer log-probabilities, which it divides by N."""
    g = np.array([[0.1, 0.2, 0.3]], np.float32)
    y = np.log(np.array([[0.2, 0.3, 0.5]]))
    logp, labels = np.array([[-1, -2, -3], [-4, -5, -8]]), np.array([0, 2])
    with mg.Graph() as graph:
        p, q = mg.placeholder((1, 3), "float32"), mg.placeholder((1, 3), "float64")
        a, b = mg.placeholder((2, 3), "int64"), mg.placeholder((2,), "int64")
        out1, out2 = mg.log_softmax_grad(p, q, 1), mg.nll_loss(a, b) * 2
    want1 = g - np.exp(y) * g.sum(1, keepdims=True)
    got1, got2 = mg.Session(graph).run([out1, out2], {p: g, q: y, a: logp, b: labels})
    assert out1.dtype == want1.dtype.name == got1.dtype.name
    assert out2.dtype == "float64" and got2 == -(logp[[0, 1], labels]).sum() / 2 * 2


# -- kernels as strict as their rules ---------------------------------------------------------

def test_binary_cross_entropy_refuses_unequal_shapes():
    """logits (3, 1) and targets (3,) broadcast to a 3 x 3 grid, averaged silently;
    PyTorch refuses them."""
    L, T = np.array([[0.5], [-1.0], [2.0]]), np.array([1.0, 0.0, 1.0])
    with pytest.raises(ValueError):
        torch.nn.functional.binary_cross_entropy_with_logits(torch.tensor(L), torch.tensor(T))
    with pytest.raises(mg.errors.ShapeError, match="same shape"):
        mg.binary_cross_entropy_with_logits(mg.tensor(L), mg.tensor(T))


def test_eager_kernels_refuse_what_their_rules_refuse():
    """Eager mode asks a rule only after its kernel fails: nll_loss with labels (N, 1)
    returned a number (an N x N grid), nll_loss_grad likewise, and add_n broadcast."""
    lp, labels = mg.tensor(np.log(np.full((2, 3), 1 / 3))), mg.tensor(np.array([[0], [2]]))
    with pytest.raises(RuntimeError):  # PyTorch: multi-target not supported
        torch.nn.functional.nll_loss(torch.tensor(lp.numpy()), torch.tensor(labels.numpy()))
    with pytest.raises(mg.errors.ShapeError, match="nll_loss"):
        mg.nll_loss(lp, labels)
    with pytest.raises(mg.errors.ShapeError, match="nll_loss_grad"):
        mg.nll_loss_grad(mg.tensor(1.0), labels, 3)
    with pytest.raises(mg.errors.ShapeError, match="AddN"):
        mg.add_n([mg.tensor(np.ones((2, 3))), mg.tensor(np.ones(3))])


# -- every kernel against its own shape rule -----------------------------------------------------

DTYPES = ["float64", "float32", "int64", "int32", "bool"]


def _array(d, shape=None, dtype=None, low=-3, high=3):
    shape = d.draw(st.lists(st.integers(0, 3), max_size=3).map(tuple)) if shape is None else shape
    dtype = d.draw(st.sampled_from(DTYPES)) if dtype is None else dtype
    values = np.random.default_rng(d.draw(st.integers(0, 2 ** 16))).uniform(low, high, shape)
    return values > 0 if dtype == "bool" else values.astype(dtype)


def _operand(d):
    """An array, or now and then a Python number (weak)."""
    if d.draw(st.integers(0, 4)) == 0:
        return d.draw(st.sampled_from([2, -1, 0.5, True, 3.0]))
    return _array(d)


def _operands(n):
    def draw(d):
        args = [_operand(d) for _ in range(n)]
        if not any(hasattr(a, "shape") for a in args):  # (eager mode makes numbers tensors)
            args[0] = _array(d)
        return args, {}
    return draw


def _axis(d, x):
    """An axis of ``x``, as the public functions pass it (they refuse a 0-d x)."""
    if x.ndim == 0:
        raise Refused
    return d.draw(st.integers(0, x.ndim - 1))


class Refused(Exception):
    """Arguments outside the primitive's domain: its public function refuses them."""


def _matrices(d):
    """matmul's operands: mg.matmul makes vectors matrices before binding."""
    xs = [_array(d, d.draw(st.lists(st.integers(0, 3), min_size=2, max_size=3).map(tuple)))
          for _ in range(2)]
    return xs, {}


def _index(d, shape):
    part = st.one_of(st.integers(-3, 3), st.booleans(), st.none(), st.just(Ellipsis),
                     st.builds(slice, st.integers(-3, 3) | st.none(),
                               st.integers(-3, 3) | st.none(), st.sampled_from([None, 1, 2])),
                     st.lists(st.integers(-3, 3), min_size=1, max_size=3).map(np.array))
    return tuple(d.draw(st.lists(part, max_size=len(shape) + 1)))


def _recorded(name, f, *xs):
    """The params of the entry of ``name`` that f records on the tape (to_device's device,
    checkpoint's function)."""
    entries, _ = tape._entries([f(*[mg.tensor(x, requires_grad=True) for x in xs])], set())
    return next(params for prim, params, _, _ in entries if prim.name == name)


def _checkpointed(d):
    f = mg.checkpoint(lambda x, y: mg.sin(x) * y)
    params = _recorded("checkpoint", f, np.ones(2), np.ones(2))
    return [_array(d), _operand(d)], params


def _to_device(d):
    return [_array(d)], _recorded("to_device", lambda x: mg.to_device(x, "cpu:1") * 1.0,
                                   np.ones(2))


def _reduction(d):
    x = _array(d)
    axes = d.draw(st.none() | st.sets(st.integers(0, max(x.ndim - 1, 0))).map(
        lambda s: tuple(sorted(s))))
    return [x], {"axis": axes, "keepdims": d.draw(st.booleans())}


def _getitem(d):
    x = _array(d)
    return [x], {"index": _index(d, x.shape)}


def _scatter_add(d):
    shape = d.draw(st.lists(st.integers(0, 3), max_size=3).map(tuple))
    return [_array(d)], {"index": _index(d, shape), "shape": shape}


def _concatenate(d):
    xs = [_array(d) for _ in range(d.draw(st.integers(1, 3)))]
    return xs, {"axis": _axis(d, xs[0])}


def _log_softmax_grad(d):
    g = _array(d)
    return [g, _operand(d)], {"axis": _axis(d, g)}


def _labels(d):
    return _array(d, dtype=d.draw(st.sampled_from(["int64", "int32"])), low=0, high=3)


GENERATORS = {
    **{n: _operands(1) for n in ["identity", "stop_gradient", "no_grad", "zeros_like",
                                 "ones_like", "neg", "abs", "exp", "log", "sin", "cos", "tanh",
                                 "sigmoid", "log_sigmoid", "relu", "sqrt"]},
    **{n: _operands(2) for n in ["add", "sub", "mul", "div", "pow", "floor_divide",
                                 "remainder", "maximum", "minimum", "relu_grad", "less",
                                 "less_equal", "greater", "greater_equal", "equal",
                                 "not_equal"]},
    "matmul": _matrices,
    "where": _operands(3),
    "AddN": lambda d: _operands(d.draw(st.integers(1, 3)))(d),
    "astype": lambda d: ([_array(d)], {"dtype": d.draw(st.sampled_from(DTYPES))}),
    "to_device": _to_device,
    **{n: _reduction for n in ["sum", "mean", "max", "min"]},
    "reshape": lambda d: ([_array(d)], {"shape": d.draw(st.lists(st.integers(0, 4),
                                                                  max_size=3).map(tuple))}),
    "transpose": lambda d: (lambda x: ([x], {"axes": tuple(d.draw(st.permutations(
        range(x.ndim))))}))(_array(d)),
    "broadcast_to": lambda d: ([_array(d)], {"shape": d.draw(st.lists(
        st.integers(0, 3), max_size=4).map(tuple))}),
    "getitem": _getitem,
    "scatter_add": _scatter_add,
    "concatenate": _concatenate,
    "softmax": lambda d: (lambda x: ([x], {"axis": _axis(d, x)}))(_array(d)),
    "log_softmax": lambda d: (lambda x: ([x], {"axis": _axis(d, x)}))(_array(d)),
    "log_softmax_grad": _log_softmax_grad,
    "one_hot": lambda d: ([_labels(d)], {"num_classes": d.draw(st.integers(0, 4)),
                                         "dtype": d.draw(st.sampled_from(DTYPES))}),
    "nll_loss": lambda d: ([_array(d), _labels(d)], {}),
    "nll_loss_grad": lambda d: ([_operand(d), _labels(d)],
                                {"num_classes": d.draw(st.integers(0, 4)),
                                 "dtype": d.draw(st.sampled_from(DTYPES[:2]))}),
    "checkpoint": _checkpointed,
}


def test_every_primitive_has_a_generator():
    assert set(GENERATORS) == set(PRIMITIVES)


@pytest.mark.parametrize("name", sorted(GENERATORS))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_kernel_that_succeeds_agrees_with_its_rule(name, data):
    """Eager mode runs a primitive's shape rule only when its kernel fails, so a kernel
    more permissive than its rule gave silent wrong values (nll_loss with labels (N, 1),
    add_n of two shapes), and a rule that disagreed with its kernel misled graph mode.
    For random shapes and dtypes: if the kernel succeeds, the rule succeeds and says the
    kernel's shape and dtype. (The oracle is the kernel itself, NumPy's arithmetic.)"""
    prim = PRIMITIVES[name]
    try:
        args, params = GENERATORS[name](data)
    except Refused:
        return
    try:
        with np.errstate(all="ignore"):
            out = prim.impl(np, *args, **params)
    except Exception:
        return  # refused: the rule may say what it likes (graph mode then fails at run time)
    out = np.asarray(out)
    assert prim.shape(*args, **params) == (out.shape, out.dtype.name), (args, params)


@pytest.mark.parametrize("mode", ["tape", "graph"])
def test_the_sweep_through_an_n_term_op_gives_every_term_its_share(mode):
    """add_n, stack and concatenate of n terms: each argument's rule read all n
    arguments, so the sweep took time n^2 (4x the terms, 15x the time); their ``Each``
    rules now give every share in one call. Oracle: the closed form, d/dx_k of
    sum(c_k * x_k) over the joined values is c_k."""
    n = 600
    xs = [mg.tensor(float(k)) for k in range(n)]
    c = np.arange(1.0, n + 1)

    def joined(*xs):
        return (mg.sum(mg.stack(list(xs)) * c) + mg.sum(mg.concatenate([x.reshape(1) for x in xs])
                * c) + mg.add_n(list(xs)))

    grads = mg.grad(joined, argnums=tuple(range(n)), mode=mode)(*xs)
    np.testing.assert_array_equal([float(g.item()) for g in grads], 2 * c + 1)


@pytest.mark.parametrize("shapes", [((2,), (3, 3)), ((3, 3), (2,)), ((2,), (3,))])
def test_a_refused_matmul_of_a_vector_leaves_the_graph_as_it_was(shapes):
    """A vector operand is reshaped to a matrix first: the reshape nodes were added to
    the graph under construction before the product was refused (NumPy's rule: the inner
    sizes must agree)."""
    with mg.Graph() as g:
        a, b = (mg.placeholder(s, name=f"p{k}") for k, s in enumerate(shapes))
        before = list(g.nodes)
        with pytest.raises(mg.errors.ShapeError, match="matmul"):
            a @ b
        assert g.nodes == before
    with pytest.raises(ValueError):  # (NumPy refuses the same operands)
        np.ones(shapes[0]) @ np.ones(shapes[1])


def test_the_tangent_of_a_concatenation_of_n_pieces_is_their_tangents_joined():
    """Forward mode placed each piece's tangent in zeros the size of the whole output: n
    full-size arrays, time n^2 (4x the pieces, 12x the time). Oracle: the closed form,
    d/dx of [k x for each k] joined with a constant piece is [k ...] and zeros."""
    n = 300
    x = mg.tensor(np.array([0.5, -1.0]))

    def joined(x):
        return mg.concatenate([x * float(k) for k in range(n)] + [mg.ones(3)])

    value, tangent = mg.jvp(joined, (x,), (mg.ones(2),))
    np.testing.assert_array_equal(tangent.numpy(),
                                  np.concatenate([np.repeat(np.arange(n), 2), np.zeros(3)]))
    np.testing.assert_array_equal(value.numpy()[-3:], np.ones(3))
