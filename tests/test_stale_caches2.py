"""Compiled programs and checkpoints guard what a function passed as an argument reads,
minigraph's own functions are not read as the user's, and hessian takes a NumPy integer
argnums as an int.

Source mode reads function text: the functions differentiated are defined at module
level. Oracles: closed forms, torch.func."""

import functools
import sys

import numpy as np
import pytest
import torch
import torch.func as tf

import minigraph as mg
from minigraph.autodiff.checkpoint import CheckpointError

SCALE = 1.0
_here = sys.modules[__name__]
X = np.array([0.3, -0.5, 1.2])


def scaled(x):
    return mg.sum(mg.sin(x) * SCALE)


def outer(x, fn):
    return mg.sum(fn(x) * x)


def outer_first(x, fns):
    return mg.sum(fns[0](x) * x)


def call_fn(x, fn):
    return fn(x) * 1.0


class Model:
    def __init__(self):
        self.scale = 1.0

    def loss(self, x):
        return mg.sum(mg.sin(x) * self.scale)


def d_outer(s):
    """d/dx [s * sum(sin x) * sum(x)]."""
    return s * (np.cos(X) * np.sum(X) + np.sum(np.sin(X)))


def d_outer_of_grad(s):
    """d/dx sum(s * cos(x) * x), the outer function given mg.grad(scaled)."""
    return s * (np.cos(X) - X * np.sin(X))


@pytest.fixture(autouse=True)
def _scale_back():
    yield
    _here.SCALE = 1.0


def _before_and_after(call):
    """call() with SCALE = 1.0, then with SCALE = 2.0 (the same cached program)."""
    _here.SCALE = 1.0
    first = np.asarray(call())
    _here.SCALE = 2.0
    return first, np.asarray(call())


@pytest.mark.parametrize("inner, want", [("f", d_outer), ("grad(f)", d_outer_of_grad)])
def test_checkpoint_function_argument_global_rebound(inner, want):
    """grad(mg.checkpoint(outer))(x, fn): the backward program was cached with fn's old
    global SCALE (only outer's own reads were guarded): after SCALE = 2.0 the value was
    new and the gradient old."""
    fn = scaled if inner == "f" else mg.grad(scaled)
    ck = mg.checkpoint(outer)
    first, second = _before_and_after(lambda: mg.grad(ck)(mg.tensor(X), fn).numpy())
    np.testing.assert_allclose(first, want(1.0))
    np.testing.assert_allclose(second, want(2.0))


def test_checkpoint_bound_method_argument_attribute_changed():
    """A bound method passed to a checkpoint: model.scale = 3.0 between calls left the
    cached backward program on the old scale (a bound method is keyed by its function
    and its object's identity, not by what the method reads)."""
    model = Model()
    ck = mg.checkpoint(call_fn)
    mg.grad(ck)(mg.tensor(X), model.loss)
    model.scale = 3.0
    got = mg.grad(ck)(mg.tensor(X), model.loss).numpy()
    np.testing.assert_allclose(got, 3.0 * np.cos(X))


def test_checkpoint_function_in_static_tuple_argument():
    """A function held in a static tuple argument is guarded as one passed alone."""
    ck = mg.checkpoint(outer_first)
    first, second = _before_and_after(
        lambda: mg.grad(ck)(mg.tensor(X), (scaled,)).numpy())
    np.testing.assert_allclose(first, d_outer(1.0))
    np.testing.assert_allclose(second, d_outer(2.0))


def test_checkpoint_refuses_rebound_between_forward_and_backward():
    """SCALE, read by the function passed to the checkpoint, rebound between the forward
    and the backward pass: the recomputation would differentiate another function. It
    was not refused (what f reads as a global is)."""
    ck = mg.checkpoint(outer)
    x = mg.tensor(X, requires_grad=True)
    y = ck(x, scaled)
    _here.SCALE = 2.0
    with pytest.raises(CheckpointError, match="SCALE"):
        y.backward()


BUFFER = np.zeros(3)


def writes_buffer(x):
    BUFFER[0] += 1.0
    return mg.sin(x)


def test_checkpoint_refuses_write_by_function_argument():
    """The function passed to a checkpoint wrote into a global array: it was not made
    read-only (only f's own reads were), so the forward pass wrote once and the
    recomputation again, where eager mode writes once. Refused before the write now."""
    BUFFER[...] = 0.0
    x = mg.tensor(X, requires_grad=True)
    with pytest.raises(CheckpointError, match="BUFFER"):
        mg.checkpoint(outer)(x, writes_buffer).backward()
    np.testing.assert_array_equal(BUFFER, np.zeros(3))


@pytest.mark.parametrize("mode", ["graph", "source"])
def test_compiled_grad_function_argument_global_rebound(mode):
    """grad(outer, mode)(x, fn) replayed the program built with fn's old SCALE."""
    g = mg.grad(outer, mode=mode)
    first, second = _before_and_after(lambda: g(mg.tensor(X), scaled).numpy())
    np.testing.assert_allclose(first, d_outer(1.0))
    np.testing.assert_allclose(second, d_outer(2.0))


def test_trace_function_argument_global_rebound():
    """mg.trace(outer)(x, fn) replayed the graph built with fn's old SCALE."""
    traced = mg.trace(outer)
    first, second = _before_and_after(lambda: mg.grad(traced)(mg.tensor(X), scaled).numpy())
    np.testing.assert_allclose(first, d_outer(1.0))
    np.testing.assert_allclose(second, d_outer(2.0))


class Cfg:
    vmap = staticmethod(mg.vmap)


pvmap = functools.partial(mg.vmap, in_axes=0)


def through_static(a):
    return mg.sum(Cfg.vmap(mg.sin)(a) * a)


def through_partial(a):
    return mg.sum(pvmap(mg.sin)(a) * a)


def _jacobian():
    """d/da sum(sin(a) * a), closed form."""
    return np.cos(X) * X + np.sin(X)


@pytest.mark.parametrize("f", [through_static, through_partial])
@pytest.mark.parametrize("how", ["graph", "source", "checkpoint"])
def test_library_function_through_partial_or_staticmethod(f, how):
    """mg.vmap reached through functools.partial or a staticmethod was read as the
    user's code: its module's set of running levels changed as it ran, and jacrev
    (graph, source) and grad(checkpoint(f)) refused "f reads an item of running"."""
    if how == "checkpoint":
        got = mg.grad(mg.checkpoint(f))(mg.tensor(X))
    else:
        got = mg.jacrev(f, mode=how)(mg.tensor(X))
    np.testing.assert_allclose(got.numpy(), _jacobian())


def scaled_sin(a):
    return mg.sin(a) * SCALE


vmapped_scaled = functools.partial(mg.vmap, scaled_sin)


def through_partial_of_user_function(a):
    return mg.sum(vmapped_scaled()(a) * a)


@pytest.mark.parametrize("mode", ["graph", "source"])
def test_user_function_given_to_library_function_is_still_read(mode):
    """A partial of mg.vmap over the user's function: minigraph's vmap is not read, but
    the function given to it is (its SCALE rebound rebuilds the program)."""
    jac = mg.jacrev(through_partial_of_user_function, mode=mode)
    first, second = _before_and_after(lambda: jac(mg.tensor(X)).numpy())
    for s, got in ((1.0, first), (2.0, second)):
        want = tf.jacrev(lambda a: torch.sum(s * torch.sin(a) * a))(torch.tensor(X))
        np.testing.assert_allclose(got, want.numpy())


def two_args(x, y):
    return mg.sum(mg.sin(x) * y * y)


@pytest.mark.parametrize("mode", ["tape", "graph", "source"])
def test_hessian_numpy_integer_argnums_is_an_int(mode):
    """hessian(f, argnums=np.int64(1)) returned ((H,),), as for a tuple, where grad,
    jacrev and jacfwd read a NumPy integer as the int it is."""
    x, y = np.array([0.3, -0.5]), np.array([0.7, 0.2])
    got = mg.hessian(two_args, argnums=np.int64(1), mode=mode)(x, y)
    want = tf.hessian(lambda a, b: torch.sum(torch.sin(a) * b * b), argnums=1)(
        torch.tensor(x), torch.tensor(y))
    assert isinstance(got, mg.Tensor)
    np.testing.assert_allclose(got.numpy(), want.numpy())


TABLE = np.empty(1, dtype=object)


def _reads_the_table(x):
    return (x * TABLE[0]).sum()


@pytest.mark.parametrize("mode", ["graph", "source"])
def test_a_tensor_in_an_object_array_bound_anew_gives_a_new_program(mode):
    """A NumPy array of objects (a table of tensors) was compared by its values: the
    stale check compared the tensors elementwise and died in NumPy's "ambiguous truth
    value". Its items are watched as a list's. Closed form: d/dx sum(x * w) = w."""
    TABLE[0] = mg.tensor([1.0, 1.0])
    g = mg.grad(_reads_the_table, mode=mode)
    x = mg.tensor([1.0, 2.0])
    np.testing.assert_array_equal(g(x).numpy(), [1.0, 1.0])
    TABLE[0] = mg.tensor([3.0, 3.0])
    np.testing.assert_array_equal(g(x).numpy(), [3.0, 3.0])


def test_a_tensor_in_an_object_array_written_before_backward_is_refused():
    """A checkpoint's recomputation read the new values of a tensor held in an object
    array (gradient [5, 5] for the forward pass's [1, 1]), where one in a list is refused."""
    TABLE[0] = mg.tensor([1.0, 1.0])
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    y = mg.checkpoint(_reads_the_table)(x)
    TABLE[0].data[...] = 5.0
    with pytest.raises(CheckpointError, match="changed in place since the forward pass"):
        y.backward()
