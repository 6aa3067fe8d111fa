"""mg.vmap and mg.stack, checked against independent oracles.

* every primitive's batching rule against a NumPy loop over the batch (one table,
  which must name every primitive), with hypothesis choosing the batch size, which
  arguments are batched and along which axis, and the output axis;
* random programs over the primitive table against ``torch.func.vmap``;
* vmap of vmap, in_axes/out_axes, and the compositions with forward mode
  (``jvp``) and reverse mode (per-example gradients) against ``torch.func``;
* ``mg.stack`` against ``numpy.stack`` / ``torch.stack``, in every gradient mode;
* the errors: each names what was wrong.

All in float64; minigraph is never its own oracle.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigraph as mg
from minigraph.autodiff.batching import BatchingError
from minigraph.errors import MinigraphError, ShapeError
from minigraph.ops.primitive import PRIMITIVES, Primitive, bind

torch = pytest.importorskip("torch")
tf = torch.func


@pytest.fixture(autouse=True)
def _torch_in_float64():
    """The oracles compute in float64; the setting is put back after each test, so that
    no other test file inherits it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


# ----------------------------------------------------------------------------------------
# every primitive's batching rule, against a NumPy loop over the batch
# ----------------------------------------------------------------------------------------

def u(*shape):
    return lambda rng: rng.uniform(-1.0, 1.0, size=shape)


def pos(*shape):
    return lambda rng: rng.uniform(0.5, 2.0, size=shape)


def labels(n, classes=3):
    return lambda rng: rng.integers(0, classes, size=n)


def cond(*shape):
    return lambda rng: rng.random(shape) > 0.5


def logp(n, c):  # log-probabilities: rows of a log-softmax
    def make(rng):
        x = rng.uniform(-1.0, 1.0, size=(n, c))
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    return make


def softmax_np(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def scatter_np(g, index, shape):
    out = np.zeros(shape)
    np.add.at(out, index, g)
    return out


ADV = (np.array([0, 1]), slice(None), np.array([1, 2]))  # advanced indices, not adjacent

# (primitive, minigraph function of one example, argument makers, NumPy reference)
CASES = [
    ("add", lambda x, y: x + y, [u(), u(3)], np.add),  # a batched scalar meets a (3,)
    ("add", lambda x, y: x + y, [u(2, 1), u(3)], np.add),
    ("sub", lambda x, y: x - y, [u(2, 3), u(3)], np.subtract),
    ("mul", lambda x, y: x * y, [u(3, 1), u(1, 4)], np.multiply),
    ("div", lambda x, y: x / y, [u(2, 3), pos(2, 3)], np.divide),
    ("pow", lambda x, y: x ** y, [pos(2, 3), u(3)], np.power),
    ("maximum", mg.maximum, [u(2, 3), u(3)], np.maximum),
    ("minimum", mg.minimum, [u(2, 3), u(3)], np.minimum),
    ("neg", lambda x: -x, [u(2, 3)], np.negative),
    ("exp", mg.exp, [u(2, 3)], np.exp),
    ("log", mg.log, [pos(2, 3)], np.log),
    ("sin", mg.sin, [u(2, 3)], np.sin),
    ("cos", mg.cos, [u(2, 3)], np.cos),
    ("tanh", mg.tanh, [u(2, 3)], np.tanh),
    ("sigmoid", mg.sigmoid, [u(2, 3)], lambda x: 1 / (1 + np.exp(-x))),
    ("log_sigmoid", mg.log_sigmoid, [u(2, 3)], lambda x: -np.log1p(np.exp(-x))),
    ("relu", mg.relu, [u(2, 3)], lambda x: np.maximum(x, 0)),
    ("abs", mg.abs, [u(2, 3)], np.abs),
    ("relu_grad", mg.relu_grad, [u(2, 3), u(3)], lambda g, y: g * (y > 0)),
    ("sqrt", mg.sqrt, [pos(2, 3)], np.sqrt),
    ("floor_divide", lambda x, y: x // y, [u(2, 3), pos(3)], np.floor_divide),
    ("remainder", lambda x, y: x % y, [u(2, 3), pos(3)], np.remainder),
    ("where", mg.where, [cond(2, 3), u(3), u(2, 1)], np.where),
    ("AddN", lambda x, y: mg.add_n([x, y, x]), [u(2, 3), u(2, 3)], lambda x, y: 2 * x + y),
    ("less", lambda x, y: x < y, [u(2, 3), u(3)], np.less),
    ("less_equal", lambda x, y: x <= y, [u(2, 3), u(3)], np.less_equal),
    ("greater", lambda x, y: x > y, [u(), u(3)], np.greater),
    ("greater_equal", lambda x, y: x >= y, [u(2, 3), u(3)], np.greater_equal),
    ("equal", lambda x, y: x == y, [labels(4), labels(4)], np.equal),
    ("not_equal", lambda x, y: x != y, [labels(4), labels(())], np.not_equal),
    ("sum", lambda x: x.sum(axis=0), [u(2, 3)], lambda x: x.sum(axis=0)),
    ("sum", lambda x: x.sum(), [u(2, 3)], lambda x: x.sum()),
    ("mean", lambda x: x.mean(axis=-1, keepdims=True), [u(2, 3)],
     lambda x: x.mean(axis=-1, keepdims=True)),
    ("max", lambda x: x.max(axis=(0, 2)), [u(2, 3, 4)], lambda x: x.max(axis=(0, 2))),
    ("max", lambda x: x.max(keepdims=True), [u(2, 3)], lambda x: x.max(keepdims=True)),
    ("min", lambda x: mg.min(x, axis=-1), [u(2, 3)], lambda x: x.min(axis=-1)),
    ("matmul", lambda x, y: x @ y, [u(2, 3), u(3, 4)], np.matmul),
    ("matmul", lambda x, y: x @ y, [u(3), u(3, 4)], np.matmul),
    ("matmul", lambda x, y: x @ y, [u(3), u(3)], np.matmul),
    ("matmul", lambda x, y: x @ y, [u(2, 2, 3), u(3, 4)], np.matmul),
    ("matmul", lambda x, y: x @ y, [u(2, 3), u(5, 3, 4)], np.matmul),
    ("transpose", lambda x: mg.transpose(x, (2, 0, 1)), [u(2, 3, 4)],
     lambda x: x.transpose(2, 0, 1)),
    ("transpose", lambda x: x.T, [u(2, 3)], lambda x: x.T),
    ("reshape", lambda x: x.reshape(3, 2), [u(2, 3)], lambda x: x.reshape(3, 2)),
    ("reshape", lambda x: x.reshape(-1), [u(2, 3)], lambda x: x.reshape(-1)),
    ("broadcast_to", lambda x: mg.broadcast_to(x, (2, 3)), [u(3)],
     lambda x: np.broadcast_to(x, (2, 3))),
    ("broadcast_to", lambda x: mg.broadcast_to(x, (4, 2, 3)), [u(2, 1)],
     lambda x: np.broadcast_to(x, (4, 2, 3))),
    ("getitem", lambda x: x[1, 0:2], [u(2, 3)], lambda x: x[1, 0:2]),
    ("getitem", lambda x: x[None, ..., 0], [u(2, 3)], lambda x: x[None, ..., 0]),
    ("getitem", lambda x: x[np.array([1, 0, 1])], [u(2, 3)], lambda x: x[[1, 0, 1]]),
    ("getitem", lambda x: x[ADV], [u(2, 3, 4)], lambda x: x[ADV]),
    ("getitem", lambda x: x[1, :, np.array([0, 3])], [u(2, 3, 4)],
     lambda x: x[1, :, [0, 3]]),
    ("scatter_add", lambda g: mg.scatter_add(g, (slice(0, 2), 1), (3, 4)), [u(2)],
     lambda g: scatter_np(g, (slice(0, 2), 1), (3, 4))),
    ("scatter_add", lambda g: mg.scatter_add(g, ADV, (2, 3, 4)), [u(2, 3)],
     lambda g: scatter_np(g, ADV, (2, 3, 4))),
    ("concatenate", lambda x, y: mg.concatenate([x, y], axis=1), [u(2, 3), u(2, 4)],
     lambda x, y: np.concatenate([x, y], axis=1)),
    ("concatenate", lambda x, y: mg.concatenate([x, y, x]), [u(3), u(2)],
     lambda x, y: np.concatenate([x, y, x])),
    ("softmax", lambda x: mg.softmax(x, axis=0), [u(2, 3)], lambda x: softmax_np(x, 0)),
    ("softmax", mg.softmax, [u(2, 3)], lambda x: softmax_np(x, -1)),
    ("log_softmax", lambda x: mg.log_softmax(x, axis=0), [u(2, 3)],
     lambda x: np.log(softmax_np(x, 0))),
    ("log_softmax_grad", lambda g, y: mg.log_softmax_grad(g, y, axis=1), [u(4, 3), logp(4, 3)],
     lambda g, y: g - np.exp(y) * g.sum(axis=1, keepdims=True)),
    ("one_hot", lambda lab: mg.one_hot(lab, 3), [labels(4)], lambda lab: np.eye(3)[lab]),
    ("nll_loss", mg.nll_loss, [logp(4, 3), labels(4)],
     lambda lp, lab: -lp[np.arange(4), lab].mean()),
    ("nll_loss_grad", lambda g, lab: mg.nll_loss_grad(g, lab, 3), [u(), labels(4)],
     lambda g, lab: -np.eye(3)[lab] * g / 4),
    ("identity", mg.identity, [u(2, 3)], lambda x: x),
    ("stop_gradient", mg.stop_gradient, [u(2, 3)], lambda x: x),
    ("no_grad", mg.PRIMITIVES["no_grad"], [u(2, 3)], lambda x: x),
    ("astype", lambda x: mg.astype(x, "float32"), [u(2, 3)], lambda x: x.astype(np.float32)),
    ("to_device", lambda x: mg.to_device(x, "cpu:1"), [u(2, 3)], lambda x: x),
    ("zeros_like", mg.zeros_like, [u(2, 3)], np.zeros_like),
    ("ones_like", mg.ones_like, [u(2, 3)], np.ones_like),
    ("checkpoint", mg.checkpoint(lambda x, w: mg.tanh(x @ w) * x), [u(2, 3), u(3, 3)],
     lambda x, w: np.tanh(x @ w) * x),
]


def test_every_primitive_has_a_batching_rule_and_a_case():
    assert [name for name, p in PRIMITIVES.items() if p.batch is None] == []
    assert {name for name, *_ in CASES} == set(PRIMITIVES)


def batch_inputs(data, makers, rng):
    """Draw a batch size and an in_axes entry per argument; return the vmap inputs and
    the per-example inputs of every example (for the loop)."""
    size = data.draw(st.integers(1, 3), label="batch size")
    examples = [[make(rng) for _ in range(size)] for make in makers]
    axes = []
    for ex in examples:
        rank = np.ndim(ex[0])
        axes.append(data.draw(st.sampled_from([None] + list(range(-rank - 1, rank + 1)))))
    if all(a is None for a in axes):
        axes[0] = 0
    inputs = [ex[0] if a is None else np.stack(ex, axis=a) for ex, a in zip(examples, axes)]
    per_example = [[ex[0] if a is None else ex[b] for ex, a in zip(examples, axes)]
                   for b in range(size)]
    return tuple(axes), inputs, per_example


@settings(max_examples=12)
@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
@given(data=st.data())
def test_batching_rule_matches_a_loop(case, data):
    name, f, makers, ref = CASES[case]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    in_axes, inputs, per_example = batch_inputs(data, makers, rng)
    expected_each = [np.asarray(ref(*args)) for args in per_example]
    rank = expected_each[0].ndim
    out_axis = data.draw(st.integers(-rank - 1, rank), label="out_axes")
    expected = np.stack(expected_each, axis=out_axis)
    out = mg.vmap(f, in_axes=in_axes, out_axes=out_axis)(*inputs)
    assert out.shape == expected.shape
    assert out.dtype == expected.dtype.name
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6 if out.dtype == "float32"
                               else 1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------
# random programs over the table, against torch.func.vmap
# ----------------------------------------------------------------------------------------

W = np.random.default_rng(1).uniform(-1, 1, (4, 4))
C4 = np.random.default_rng(2).uniform(-1, 1, 4)
ROWS = [2, 0, 1]

# one step: (minigraph, torch), each maps s (3, 4) and y (3, 4) of one example to (3, 4)
STEPS = {
    "sin": (lambda s, y: mg.sin(s), lambda s, y: torch.sin(s)),
    "tanh": (lambda s, y: mg.tanh(s), lambda s, y: torch.tanh(s)),
    "sigmoid": (lambda s, y: mg.sigmoid(s), lambda s, y: torch.sigmoid(s)),
    "relu": (lambda s, y: mg.relu(s) - s * 0.5, lambda s, y: torch.relu(s) - s * 0.5),
    "exp": (lambda s, y: mg.exp(mg.tanh(s)), lambda s, y: torch.exp(torch.tanh(s))),
    "sqrt": (lambda s, y: mg.sqrt(s * s + 1.0), lambda s, y: torch.sqrt(s * s + 1.0)),
    "pow": (lambda s, y: (s * s + 1.0) ** 0.5, lambda s, y: (s * s + 1.0) ** 0.5),
    "add_y": (lambda s, y: s + y, lambda s, y: s + y),
    "mul_y": (lambda s, y: s * y, lambda s, y: s * y),
    "div_y": (lambda s, y: s / (1.0 + y * y), lambda s, y: s / (1.0 + y * y)),
    "max_y": (lambda s, y: mg.maximum(s, y), lambda s, y: torch.maximum(s, y)),
    "where": (lambda s, y: mg.where(s > y, s, -y), lambda s, y: torch.where(s > y, s, -y)),
    "bias": (lambda s, y: s * mg.tensor(C4) + 1.0, lambda s, y: s * torch.tensor(C4) + 1.0),
    "matmul": (lambda s, y: s @ mg.tensor(W), lambda s, y: s @ torch.tensor(W)),
    "softmax0": (lambda s, y: mg.softmax(s, 0), lambda s, y: torch.softmax(s, 0)),
    "log_softmax": (lambda s, y: mg.log_softmax(s, 1), lambda s, y: torch.log_softmax(s, 1)),
    "center": (lambda s, y: s - s.mean(axis=1, keepdims=True),
               lambda s, y: s - s.mean(dim=1, keepdim=True)),
    "max0": (lambda s, y: s - s.max(axis=0, keepdims=True),
             lambda s, y: s - s.amax(dim=0, keepdim=True)),
    "total": (lambda s, y: s + s.sum() * 0.1, lambda s, y: s + s.sum() * 0.1),
    "transpose": (lambda s, y: s.T.reshape(3, 4), lambda s, y: s.T.reshape(3, 4)),
    "concat": (lambda s, y: mg.concatenate([s, y], axis=1)[:, 2:6],
               lambda s, y: torch.cat([s, y], dim=1)[:, 2:6]),
    "stack": (lambda s, y: mg.stack([s, y], axis=2).sum(axis=2),
              lambda s, y: torch.stack([s, y], dim=2).sum(dim=2)),
    "rows": (lambda s, y: s[np.array(ROWS)], lambda s, y: s[ROWS]),
    "broadcast": (lambda s, y: mg.broadcast_to(s.sum(axis=0), (3, 4)),
                  lambda s, y: torch.broadcast_to(s.sum(dim=0), (3, 4))),
    "add_n": (lambda s, y: mg.add_n([s, y, s]), lambda s, y: s + y + s),
}


def run_program(steps, s, y, lib):
    for step in steps:
        s = STEPS[step][lib](s, y)
    return s


@settings(max_examples=40)
@given(steps=st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=6),
       x_axis=st.integers(-3, 2), y_axis=st.sampled_from([None, 0, 1, 2, -1]),
       out_axis=st.integers(-3, 2), size=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_random_programs_match_torch_vmap(steps, x_axis, y_axis, out_axis, size, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, np.insert([3, 4], x_axis % 3, size))
    y = rng.uniform(-1, 1, (3, 4) if y_axis is None else np.insert([3, 4], y_axis % 3, size))
    out = mg.vmap(lambda s, t: run_program(steps, s, t, 0), in_axes=(x_axis, y_axis),
                  out_axes=out_axis)(x, y)
    expected = tf.vmap(lambda s, t: run_program(steps, s, t, 1),
                       in_dims=(x_axis % 3, None if y_axis is None else y_axis % 3),
                       out_dims=out_axis % 3)(torch.tensor(x), torch.tensor(y))
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------
# vmap of vmap, in_axes, out_axes
# ----------------------------------------------------------------------------------------

def f_mg(x, w):
    return mg.tanh(x @ w).sum(axis=-1) + mg.sin(x).mean()


def f_torch(x, w):
    return torch.tanh(x @ w).sum(dim=-1) + torch.sin(x).mean()


@settings(max_examples=25)
@given(inner=st.sampled_from([(0, None), (1, None), (0, 0), (-1, 2)]),
       outer=st.sampled_from([(0, None), (1, None), (2, 0), (-1, -1)]),
       out_inner=st.integers(0, 1), out_outer=st.integers(-2, 2), seed=st.integers(0, 99))
def test_vmap_of_vmap_matches_torch(inner, outer, out_inner, out_outer, seed):
    rng = np.random.default_rng(seed)
    x_shape, w_shape = [2, 3], [3, 4]  # one example: x (2, 3) @ w (3, 4)
    for (ax, aw), n in ((inner, 5), (outer, 6)):  # the inner batch axis is added first
        x_shape.insert(ax % (len(x_shape) + 1), n)
        if aw is not None:
            w_shape.insert(aw % (len(w_shape) + 1), n)
    x, w = rng.uniform(-1, 1, x_shape), rng.uniform(-1, 1, w_shape)
    got = mg.vmap(mg.vmap(f_mg, inner, out_inner), outer, out_outer)(x, w)
    expected = tf.vmap(tf.vmap(f_torch, inner, out_inner), outer, out_outer)(
        torch.tensor(x), torch.tensor(w))
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)


def test_in_axes_forms_and_tuple_outputs():
    rng = np.random.default_rng(0)
    x, w = rng.uniform(-1, 1, (3, 5)), rng.uniform(-1, 1, 3)

    def two(a, b):
        return a * b, (a * b).sum()
    for in_axes in [(1, None), [-1, None]]:
        p, s = mg.vmap(two, in_axes=in_axes, out_axes=(1, 0))(x, w)
        tp, ts = tf.vmap(lambda a, b: (a * b, (a * b).sum()), (1, None), (1, 0))(
            torch.tensor(x), torch.tensor(w))
        np.testing.assert_allclose(p.numpy(), tp.numpy())
        np.testing.assert_allclose(s.numpy(), ts.numpy())
    # an int in_axes applies to every argument; plain floats are unbatched constants
    got = mg.vmap(lambda a, b: a * b + 1.0)(x, x)
    np.testing.assert_allclose(got.numpy(), x * x + 1.0)
    got = mg.vmap(lambda a, c: a * c, in_axes=(0, None))(x, 2.0)
    np.testing.assert_allclose(got.numpy(), 2 * x)


def test_unbatched_output_is_repeated_or_returned():
    x = np.arange(6.0).reshape(2, 3)
    c = mg.tensor([1.0, 2.0])
    out = mg.vmap(lambda a: c, out_axes=1)(x)  # does not depend on the batch: repeated
    np.testing.assert_array_equal(out.numpy(), np.repeat([[1.0], [2.0]], 2, axis=1))
    assert mg.vmap(lambda a: (a, c), out_axes=(0, None))(x)[1] is c


# ----------------------------------------------------------------------------------------
# errors: each names what was wrong
# ----------------------------------------------------------------------------------------

def test_mismatched_batch_sizes_name_the_arguments():
    with pytest.raises(ShapeError, match=r"argument 0 has size 3.*argument 1 has size 4"):
        mg.vmap(lambda a, b: a + b, in_axes=(0, 1))(np.ones((3, 2)), np.ones((2, 4)))


def test_in_axes_out_of_range_names_argument_axis_and_rank():
    with pytest.raises(ShapeError, match=r"in_axes\[1\] = 2 .*argument 1 of rank 2"):
        mg.vmap(lambda a, b: a + b, in_axes=(0, 2))(np.ones((3, 2)), np.ones((3, 2)))
    with pytest.raises(ShapeError, match=r"in_axes\[0\] = 0 .*rank 0"):
        mg.vmap(mg.sin)(1.0)


def test_in_axes_of_the_wrong_length_names_both_lengths():
    with pytest.raises(BatchingError, match=r"3 entries .* 2 positional arguments"):
        mg.vmap(lambda a, b: a + b, in_axes=(0, 0, None))(np.ones(3), np.ones(3))


@pytest.mark.parametrize("in_axes", [None, (None, None), 1.5, (0, "x")])
def test_malformed_in_axes_are_refused(in_axes):
    with pytest.raises(BatchingError, match="in_axes"):
        mg.vmap(lambda a, b: a + b, in_axes=in_axes)(np.ones(3), np.ones(3))


def test_out_axes_errors():
    with pytest.raises(ShapeError, match=r"out_axes\[0\] = 3 .*rank 2"):
        mg.vmap(mg.sin, out_axes=3)(np.ones((2, 3)))
    with pytest.raises(BatchingError, match=r"out_axes\[0\] is None"):
        mg.vmap(mg.sin, out_axes=None)(np.ones((2, 3)))
    with pytest.raises(BatchingError, match="2 entries but the function returned 3"):
        mg.vmap(lambda a: (a, a, a), out_axes=(0, 0))(np.ones(2))


def test_an_op_without_a_batching_rule_is_refused_by_name():
    # (made, not registered: the table itself must stay complete)
    lonely = Primitive("lonely", lambda xp, x: x, lambda x: (x.shape, x.dtype),
                       differentiable=False)
    assert lonely.batch is None
    with pytest.raises(BatchingError, match="'lonely' has no batching rule"):
        mg.vmap(lambda a: bind(lonely, a))(np.ones((2, 3)))
    # outside vmap it runs as before
    assert bind(lonely, mg.tensor([1.0])).shape == (1,)


def test_a_wrong_batching_rule_is_caught():
    bad = Primitive("bad", lambda xp, x: x, lambda x: (x.shape, x.dtype), differentiable=False,
                    batch=lambda dims, x: mg.sum(x, 0))  # drops the batch axis
    with pytest.raises(BatchingError, match="'bad' returned shape"):
        mg.vmap(lambda a: bind(bad, a))(np.ones((2, 3)))


def test_python_control_flow_on_a_batched_value_is_refused():
    def f(a):
        return a if a.sum() > 0 else -a
    with pytest.raises(BatchingError, match="truth value"):
        mg.vmap(f)(np.ones((2, 3)))


def test_a_batched_index_is_refused():
    with pytest.raises(ShapeError, match="getitem: an index must be .* not a BatchTracer"):
        mg.vmap(lambda x, i: x[i])(np.ones((4, 3)), np.array([0, 1, 2, 0]))


def test_errors_are_minigraph_errors():
    assert issubclass(BatchingError, MinigraphError)


# ----------------------------------------------------------------------------------------
# composing with forward mode
# ----------------------------------------------------------------------------------------

def g_mg(x):
    return mg.sin(x) * mg.tanh(x @ mg.tensor(W)).sum() + mg.softmax(x)


def g_torch(x):
    return torch.sin(x) * torch.tanh(x @ torch.tensor(W)).sum() + torch.softmax(x, -1)


def test_vmap_of_jvp_matches_torch():
    rng = np.random.default_rng(3)
    x, tangents = rng.uniform(-1, 1, 4), rng.uniform(-1, 1, (5, 4))
    got = mg.vmap(lambda t: mg.jvp(g_mg, (mg.tensor(x),), (t,))[1])(tangents)
    expected = tf.vmap(lambda t: tf.jvp(g_torch, (torch.tensor(x),), (t,))[1])(
        torch.tensor(tangents))
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)


def test_jvp_of_vmap_matches_torch():
    rng = np.random.default_rng(4)
    xs, ts = rng.uniform(-1, 1, (4, 5)), rng.uniform(-1, 1, (4, 5))
    out, tangent = mg.jvp(mg.vmap(g_mg, in_axes=1, out_axes=1), (mg.tensor(xs),),
                          (mg.tensor(ts),))
    t_out, t_tangent = tf.jvp(tf.vmap(g_torch, in_dims=1, out_dims=1), (torch.tensor(xs),),
                              (torch.tensor(ts),))
    np.testing.assert_allclose(out.numpy(), t_out.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tangent.numpy(), t_tangent.numpy(), rtol=1e-10, atol=1e-12)


def test_jvp_through_an_unbatched_argument_matches_torch():
    """The dual number of the outer jvp enters vmap unbatched (in_axes None) and meets
    batched values in one operation: bind must see the jvp's level below vmap's. Should
    the levels ever come out in the wrong order, vmap refuses; it never returns a wrong
    value."""
    rng = np.random.default_rng(5)
    w, t, xs = rng.uniform(-1, 1, 4), rng.uniform(-1, 1, 4), rng.uniform(-1, 1, (3, 4))

    def h_mg(w):
        return mg.vmap(lambda wv, x: mg.sin(wv * x).sum(), in_axes=(None, 0))(w, mg.tensor(xs))

    def h_torch(w):
        return tf.vmap(lambda wv, x: torch.sin(wv * x).sum(), in_dims=(None, 0))(
            w, torch.tensor(xs))
    _, tangent = mg.jvp(h_mg, (mg.tensor(w),), (mg.tensor(t),))
    expected = tf.jvp(h_torch, (torch.tensor(w),), (torch.tensor(t),))[1]
    np.testing.assert_allclose(tangent.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------
# composing with reverse mode: per-example gradients
# ----------------------------------------------------------------------------------------

RNG = np.random.default_rng(6)
W1, XS, YS = RNG.uniform(-1, 1, (3, 4)), RNG.uniform(-1, 1, (5, 3)), RNG.integers(0, 4, 5)


def loss_mg(w, x, y):  # one example: x (3,), label y ()
    logits = mg.tanh(x @ w) * 2.0
    return mg.cross_entropy(mg.reshape(logits, (1, 4)), mg.reshape(y, (1,)))


def loss_torch(w, x, y):
    logits = torch.tanh(x @ w) * 2.0
    return torch.nn.functional.cross_entropy(logits.reshape(1, 4), y.reshape(1))


def torch_args():
    return torch.tensor(W1), torch.tensor(XS), torch.tensor(YS)


@pytest.mark.parametrize("mode", ["tape", "forward", "graph", "source"])
def test_per_example_gradients_match_torch(mode):
    got = mg.vmap(mg.grad(loss_mg, mode=mode), in_axes=(None, 0, 0))(W1, XS, YS)
    expected = tf.vmap(tf.grad(loss_torch), in_dims=(None, 0, 0))(*torch_args())
    assert got.shape == (5, 3, 4)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)


def total_mg(w):  # (module level: source transformation reads a def's text)
    return mg.vmap(loss_mg, in_axes=(None, 0, 0))(w, XS, YS).mean()


@pytest.mark.parametrize("mode", ["tape", "forward", "graph", "source"])
def test_grad_of_vmap_matches_torch(mode):
    def total_torch(w, x, y):
        return tf.vmap(loss_torch, in_dims=(None, 0, 0))(w, x, y).mean()
    got = mg.grad(total_mg, mode=mode)(mg.tensor(W1))
    expected = tf.grad(total_torch)(*torch_args())
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)


def test_vmap_of_jacrev_rows_match_torch():
    rng = np.random.default_rng(7)
    xs = rng.uniform(-1, 1, (3, 4))
    got = mg.vmap(mg.jacrev(g_mg))(xs)
    expected = tf.vmap(tf.jacrev(g_torch))(torch.tensor(xs))
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------
# mg.stack
# ----------------------------------------------------------------------------------------

@settings(max_examples=25)
@given(shape=st.lists(st.integers(1, 3), max_size=3), n=st.integers(1, 3), data=st.data())
def test_stack_matches_numpy_and_torch_gradients(shape, n, data):
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)), label="axis")
    rng = np.random.default_rng(len(shape) * 10 + n)
    xs = [rng.uniform(-1, 1, shape) for _ in range(n)]
    weights = rng.uniform(-1, 1, np.stack(xs, axis=axis).shape)
    out = mg.stack([mg.tensor(x) for x in xs], axis=axis)
    np.testing.assert_array_equal(out.numpy(), np.stack(xs, axis=axis))

    def f_torch(*ts):
        return (torch.sin(torch.stack(ts, dim=axis)) * torch.tensor(weights)).sum()
    expected = tf.grad(f_torch, argnums=tuple(range(n)))(*map(torch.tensor, xs))
    for mode in ["tape", "forward", "graph"]:
        def f(*ts):
            return (mg.sin(mg.stack(list(ts), axis=axis)) * mg.tensor(weights)).sum()
        got = mg.grad(f, argnums=tuple(range(n)), mode=mode)(*map(mg.tensor, xs))
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-12, atol=1e-12)


def stacked_loss(x, y):  # (module level: source transformation reads a def's text)
    return (mg.stack([mg.sin(x), x * y], axis=1) * 3.0).sum()


def test_stack_in_source_mode_matches_torch():
    x, y = np.array([0.5, -1.0]), np.array([2.0, 0.25])
    got = mg.grad(stacked_loss, argnums=(0, 1), mode="source")(mg.tensor(x), mg.tensor(y))
    expected = tf.grad(lambda a, b: (torch.stack([torch.sin(a), a * b], dim=1) * 3.0).sum(),
                       argnums=(0, 1))(torch.tensor(x), torch.tensor(y))
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-12)


def test_stack_under_vmap_and_jvp_match_torch():
    rng = np.random.default_rng(8)
    xs, c = rng.uniform(-1, 1, (4, 3)), rng.uniform(-1, 1, 3)
    got = mg.vmap(lambda x: mg.stack([x, mg.tensor(c), x * x], axis=-1))(xs)
    expected = tf.vmap(lambda x: torch.stack([x, torch.tensor(c), x * x], dim=-1))(
        torch.tensor(xs))
    np.testing.assert_allclose(got.numpy(), expected.numpy())
    t = rng.uniform(-1, 1, 3)
    _, tangent = mg.jvp(lambda x: mg.stack([mg.sin(x), x]), (mg.tensor(c),), (mg.tensor(t),))
    expected = tf.jvp(lambda x: torch.stack([torch.sin(x), x]), (torch.tensor(c),),
                      (torch.tensor(t),))[1]
    np.testing.assert_allclose(tangent.numpy(), expected.numpy())


def test_stack_errors():
    with pytest.raises(ShapeError, match=r"same shape.*\(2,\).*\(3,\)"):
        mg.stack([mg.tensor([1.0, 2.0]), mg.tensor([1.0, 2.0, 3.0])])
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        mg.stack([mg.tensor([1.0, 2.0])], axis=2)
    with pytest.raises(ValueError, match="at least one"):
        mg.stack([])


def test_vmap_on_graph_nodes_matches_numpy():
    """The rules call minigraph functions, so under a Graph they add nodes."""
    rng = np.random.default_rng(9)
    x_val, w_val = rng.uniform(-1, 1, (4, 3)), rng.uniform(-1, 1, 3)
    with mg.Graph() as g:
        x = mg.placeholder(shape=(4, 3), name="x")
        w = mg.placeholder(shape=(3,), name="w")
        y = mg.vmap(lambda a, b: mg.sin(a) * b + a.sum(), in_axes=(0, None), out_axes=1)(x, w)
        gx, = mg.gradients(y.sum(), [x])
    out, grad = mg.Session(g).run([y, gx], feed_dict={x: x_val, w: w_val})
    np.testing.assert_allclose(out, (np.sin(x_val) * w_val + x_val.sum(1, keepdims=True)).T)
    np.testing.assert_allclose(grad, np.cos(x_val) * w_val + 3.0)


def test_outputs_are_the_callers_own_arrays_apart_from_each_other():
    """The gradients of a + b with respect to a and b are one batched value: vmap(grad)
    and jacrev handed out two tensors over one array (writing into one changed the
    other), as mg.grad does not. An output that is the same for every example was a
    read-only broadcast view."""
    xs, ys = mg.tensor(np.ones((2, 3))), mg.tensor(np.ones((2, 3)))
    ga, gb = mg.vmap(mg.grad(lambda a, b: mg.sum(a + b), argnums=(0, 1)))(xs, ys)
    ja, jb = mg.jacrev(lambda a, b: a + b, argnums=(0, 1))(xs[0], ys[0])
    for one, other in ((ga, gb), (ja, jb)):
        assert not np.shares_memory(one.numpy(), other.numpy())
        one -= 1.0  # (into the first of each pair: the second stays as it was)
    np.testing.assert_array_equal(gb.numpy(), np.ones((2, 3)))
    np.testing.assert_array_equal(jb.numpy(), np.eye(3))
    w = mg.tensor([1.0, 2.0, 3.0])
    same = mg.vmap(lambda v: w * 2.0)(xs)  # the same for both examples
    same -= 1.0
    np.testing.assert_array_equal(same.numpy(), [[1.0, 3.0, 5.0]] * 2)


def test_np_asarray_of_a_batched_value_says_what_it_is():
    """np.asarray(x) inside vmap read the batch as a sequence and made an object array,
    which failed later as 'tensor(): dtype object is not supported'. It refuses at once
    and says why (one value per example), as float(x) and x.item() do."""
    with pytest.raises(BatchingError, match=r"np.asarray\(\) \(a NumPy array\) of a batched "
                                            r"value: it has one value per example"):
        mg.vmap(lambda x: mg.tensor(np.asarray(x)))(mg.tensor([[3.0, 1.0], [2.0, 0.0]]))
