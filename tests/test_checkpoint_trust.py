"""mg.checkpoint where its recomputation could silently differ from its forward pass:
random numbers f draws, static arguments changed in place, no_grad under forward-mode
grad, a recorded function's float, a graph's node reading globals at run time, and
results that are not floating tensors. Oracles: closed forms, NumPy, torch."""

import random

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.autodiff.checkpoint import CheckpointError

X0 = np.array([0.3, -1.2, 0.7, 0.4, -0.9, 1.1])


def _masked(draw):
    """f = x * x * m, m a 0/1 mask that ``draw(n)`` gives (uniform numbers in [0, 1))."""
    return lambda x: x * x * mg.tensor((np.asarray(draw(6)) > 0.5).astype(float))


@pytest.mark.parametrize("kind", ["generator", "np.random", "random"])
def test_the_recomputation_draws_the_forward_pass_numbers(kind):
    """f drew a dropout mask from a generator it reads; the backward pass recomputed f,
    drew another mask, and gave the gradient of another function (2 x m' for 2 x m).
    The oracle: the closed form 2 x m, m read off the forward pass's result; and after
    the backward, the generator goes on as it would without checkpoint."""
    rng = np.random.default_rng(0)
    draw, reference = {
        "generator": (rng.random, lambda: np.random.default_rng(0)),
        "np.random": (np.random.rand, None),
        "random": (lambda n: [random.random() for _ in range(n)], None)}[kind]
    np.random.seed(1), random.seed(1)
    x = mg.tensor(X0, requires_grad=True)
    y = mg.checkpoint(_masked(draw))(x)
    mask = (y.numpy() != 0).astype(float)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * X0 * mask)
    if reference is not None:  # (its state after the forward's draw: the next number)
        ref = reference()
        ref.random(6)
        assert rng.random() == ref.random()


def test_a_generator_passed_as_an_argument_draws_the_same_numbers():
    """A generator given to f as an argument (not a tensor: passed as it is) drew anew in
    the recomputation too. Oracle: the closed form 2 x m."""
    def f(x, rng):
        return _masked(rng.random)(x)

    x = mg.tensor(X0, requires_grad=True)
    y = mg.checkpoint(f)(x, np.random.default_rng(2))
    mask = (y.numpy() != 0).astype(float)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * X0 * mask)


def test_forward_mode_tangent_draws_the_forward_pass_numbers():
    """mg.jvp of a checkpoint ran f again for the tangent, drawing another mask: the
    tangent was 2 x m' along ones for the primal x² m. Oracle: closed form 2 x m."""
    rng = np.random.default_rng(3)
    y, t = mg.jvp(mg.checkpoint(_masked(rng.random)), (mg.tensor(X0),),
                  (mg.tensor(np.ones(6)),))
    mask = (y.numpy() != 0).astype(float)
    np.testing.assert_allclose(t.numpy(), 2 * X0 * mask)


def test_a_graph_node_that_draws_is_refused():
    """In a graph the checkpoint's node and its gradient's node each ran f, each drawing
    anew: the gradient was another mask's, silently. There is no forward pass to take the
    state from: refused, naming the generator."""
    rng = np.random.default_rng(0)
    with mg.Graph():
        x = mg.placeholder(shape=(6,), name="x")
        with pytest.raises(CheckpointError, match="draws random numbers from draw"):
            mg.checkpoint(_masked(rng.random))(x)


class _Cfg:
    def __init__(self, scale):
        self.scale = scale


def test_a_static_argument_changed_before_backward_is_refused():
    """A non-tensor argument (an object, a dict) changed between the forward and the
    backward: the recomputation read the new value, d/dx 3 sin x for the forward's
    2 sin x. Now refused; unchanged, the gradient is the closed form 2 cos x."""
    for arg, change, read in ((_Cfg(2.0), lambda c: setattr(c, "scale", 3.0),
                               lambda c: c.scale),
                              ({"scale": 2.0}, lambda d: d.__setitem__("scale", 3.0),
                               lambda d: d["scale"])):
        f = mg.checkpoint(lambda x, c: mg.sin(x) * read(c))
        x = mg.tensor(X0, requires_grad=True)
        f(x, arg).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), 2.0 * np.cos(X0))
        x = mg.tensor(X0, requires_grad=True)
        y = f(x, arg)
        change(arg)
        with pytest.raises(CheckpointError, match="argument 1"):
            y.sum().backward()


def _constant_under_no_grad(x, no_grad):
    with no_grad():
        c = (x * x).sum()
    return x * c


def test_forward_mode_grad_respects_no_grad_inside_a_checkpoint():
    """mg.grad(mode="forward") through a checkpoint ignored a no_grad block inside f (its
    tangent pass was mg.jvp's), where the other modes and torch.func.grad treat the value
    as a constant; mg.jvp still ignores it, as torch.func.jvp does. Oracle: the closed
    forms, for f = x c, c = sum x²: the gradient of sum f with c constant is c in every
    element; the tangent along ones, c not constant, is c + 2 x sum x."""
    c = (X0 * X0).sum()
    f = mg.checkpoint(lambda x: _constant_under_no_grad(x, mg.no_grad))
    got = mg.grad(lambda x: f(x).sum(), mode="forward")(mg.tensor(X0))
    np.testing.assert_allclose(got.numpy(), np.full(6, c))
    _, t = mg.jvp(f, (mg.tensor(X0),), (mg.tensor(np.ones(6)),))
    np.testing.assert_allclose(t.numpy(), c + 2 * X0 * X0.sum())


def test_a_traced_float_argument_through_a_checkpoint():
    """A Python float argument of a traced function, handed to a checkpoint: replayed on
    a transformation's values, f got Weak(2.0), whose dtype read 2.0.dtype
    (AttributeError). Oracle: the closed forms s cos x, s sin x and -s sin x."""
    s = 2.0
    traced = mg.trace(lambda x, s: mg.checkpoint(lambda x, s: mg.sin(x) * s)(x, s))
    x = mg.tensor(X0, requires_grad=True)
    traced(x, s).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), s * np.cos(X0))
    for mode in ("tape", "forward", "graph"):
        got = mg.grad(lambda x: traced(x, s).sum(), mode=mode)(mg.tensor(X0))
        np.testing.assert_allclose(got.numpy(), s * np.cos(X0))
    batch = mg.vmap(traced, in_axes=(0, None))(mg.tensor(np.stack([X0, X0])), s)
    np.testing.assert_allclose(batch.numpy(), s * np.sin(np.stack([X0, X0])))
    inner = mg.grad(lambda x, s: mg.checkpoint(lambda x, s: mg.sin(x) * s)(x, s).sum(),
                    mode="graph")
    _, hvp = mg.jvp(lambda x: inner(x, s), (mg.tensor(X0),), (mg.tensor(np.ones(6)),))
    np.testing.assert_allclose(hvp.numpy(), -s * np.sin(X0))


SCALE = 2.0


def test_a_graph_node_refuses_a_global_bound_anew_after_the_build():
    """In an mg.Graph the checkpoint's node ran f at every Session.run and read SCALE
    then, while the graph's other nodes held the value it had at the build: the two
    disagreed (3 sum x against 2 sum x), silently. Now refused, naming SCALE; unchanged,
    the node gives NumPy's 2 sum x."""
    global SCALE
    SCALE = 2.0
    with mg.Graph() as g:
        x = mg.placeholder(shape=(6,), name="x")
        z = mg.checkpoint(lambda x: x * SCALE)(x).sum()
        dz, = mg.gradients(z, [x])
    session = mg.Session(g)
    got, grad = session.run([z, dz], feed_dict={x: X0})
    np.testing.assert_allclose(got, 2.0 * X0.sum())
    np.testing.assert_allclose(grad, np.full(6, 2.0))
    SCALE = 3.0
    try:
        with pytest.raises(mg.errors.MinigraphError, match="SCALE"):
            session.run([z, dz], feed_dict={x: X0})
    finally:
        SCALE = 2.0


def test_an_integer_result_takes_no_gradient():
    """An integer result (a count) required grad, and backward through it failed naming
    an op inside f. Oracle: torch.utils.checkpoint: the count does not require grad,
    and d/dx sum(x n) = n."""
    xt = torch.tensor(X0, requires_grad=True)
    nt = torch.utils.checkpoint.checkpoint(lambda a: (a > 0).sum(), xt, use_reentrant=False)
    (xt * nt).sum().backward()
    count = mg.checkpoint(lambda a: (a > 0).sum())
    x = mg.tensor(X0, requires_grad=True)
    n = count(x)
    assert n.requires_grad == nt.requires_grad
    (x * n).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy())
    for mode in ("tape", "forward", "graph"):
        got = mg.grad(lambda x: (x * count(x)).sum(), mode=mode)(mg.tensor(X0))
        np.testing.assert_allclose(got.numpy(), xt.grad.numpy())


def test_a_constant_array_result_is_a_constant():
    """f returning a NumPy array: the backward pass failed ("vjp: f must return a
    tensor"), graph mode called it a value of a transformation. It is a constant:
    d/dx sum(c x) = c, the closed form."""
    c = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    table = mg.checkpoint(lambda a: c)
    x = mg.tensor(X0, requires_grad=True)
    t = table(x)
    assert not t.requires_grad
    (t * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), c)
    for mode in ("tape", "graph"):
        got = mg.grad(lambda x: (table(x) * x).sum(), mode=mode)(mg.tensor(X0))
        np.testing.assert_allclose(got.numpy(), c)


@pytest.mark.parametrize("result", [{"y": 1.0}, None])
def test_a_dict_or_none_result_is_refused_by_name(result):
    """A dict or None result raised tensor()'s error (dtype object, or None), naming
    neither checkpoint nor f's result."""
    with pytest.raises(CheckpointError, match="f returned"):
        mg.checkpoint(lambda a: result)(mg.tensor(X0, requires_grad=True))


@pytest.mark.parametrize("number", [3, True])
def test_a_python_number_result_has_numpy_dtype_in_a_graph(number):
    """A Python int or bool result was declared float64 in a graph while its kernel gave
    int64 or bool: the graph computed in float64 where eager did not. Oracle: NumPy's
    dtype of the number."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(6,), name="x")
        z = mg.checkpoint(lambda a: number)(x)
    got = mg.Session(g).run(z, feed_dict={x: X0})
    assert str(z.dtype) == str(np.asarray(number).dtype) == str(np.asarray(got).dtype)


RNGS = [np.random.default_rng(0)]


class _Holder:
    def __init__(self):
        self.rng = np.random.default_rng(0)


def _dropout_by_an_item(x):
    return mg.sum(x * mg.tensor((RNGS[0].random(8) > 0.5).astype(float)))


def _dropout_by_an_argument(x, holder):
    return mg.sum(x * mg.tensor((holder.rng.random(8) > 0.5).astype(float)))


@pytest.mark.parametrize("where", ["an item of a global list", "an argument's attribute"])
def test_a_generator_one_level_down_draws_the_forward_pass_numbers(where):
    """A generator reached through a list f reads, or an attribute of an argument, was
    not restored: the recomputation drew another mask. d/dx sum(x * m) = m, the mask of
    the forward pass (closed form; torch.utils.checkpoint preserves its RNG state)."""
    x = mg.tensor(np.ones(8), requires_grad=True)
    if where == "an item of a global list":
        RNGS[0] = np.random.default_rng(0)
        mask = (np.random.default_rng(0).random(8) > 0.5).astype(float)
        y = mg.checkpoint(_dropout_by_an_item)(x)
    else:
        mask = (np.random.default_rng(0).random(8) > 0.5).astype(float)
        y = mg.checkpoint(_dropout_by_an_argument)(x, _Holder())
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), mask)


class _DetailedError(Exception):
    def __init__(self, message, detail):
        super().__init__(message)
        self.detail = detail


def _raises_its_own_error(x):
    raise _DetailedError("bad input", detail=42)


def test_an_exception_f_raises_reaches_the_caller_as_it_is():
    """The kernel's error was rebuilt as type(exc)(message), which failed for an
    exception whose __init__ takes other arguments: the caller got a TypeError about
    __init__ instead of f's error (plain Python and torch.utils.checkpoint pass it on)."""
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(_DetailedError, match="bad input") as caught:
        mg.checkpoint(_raises_its_own_error)(x)
    assert caught.value.detail == 42


SHIFT = mg.tensor(np.array([1.0, 2.0]))


def _shifted(x):
    return mg.sum(mg.sin(x * SHIFT))


@pytest.mark.parametrize("write", ["data", "numpy_of_data", "rebind"])
def test_a_tensor_read_from_outside_written_around_the_tape_is_refused(write):
    """A tensor f reads from outside, written between the forward and the backward pass
    where no write stamp sees it (``W.data -= g``, PyTorch's habit, a write into the array
    ``W.data`` is, ``W.data = other``): the recomputation read the new values and gave the
    derivative of another function ([0.0, -5.1] where cos(x * w) * w is [0.88, 0.34])."""
    global SHIFT
    SHIFT = mg.tensor(np.array([1.0, 2.0]))
    x = mg.tensor(np.array([0.5, 0.7]), requires_grad=True)
    y = mg.checkpoint(_shifted)(x)
    if write == "data":
        SHIFT.data -= 3.0
    elif write == "numpy_of_data":
        SHIFT.data[1] = 5.0
    else:
        SHIFT.data = np.array([4.0, 5.0])
    with pytest.raises(CheckpointError, match="changed in place since the forward pass"):
        y.backward()


def test_a_tensor_read_from_outside_left_alone_gives_the_closed_form():
    """The watch above refuses only a change: untouched, the gradient is cos(x * w) * w."""
    global SHIFT
    SHIFT = mg.tensor(np.array([1.0, 2.0]))
    x = mg.tensor(np.array([0.5, 0.7]), requires_grad=True)
    mg.checkpoint(_shifted)(x).backward()
    w = np.array([1.0, 2.0])
    np.testing.assert_allclose(x.grad.numpy(), np.cos(np.array([0.5, 0.7]) * w) * w, rtol=1e-14)
