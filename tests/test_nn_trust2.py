"""Losses and layers given what they cannot take, and the seeds of their weights.

Oracles: PyTorch (``torch.nn.functional``, ``torch.func``, ``torch.manual_seed``), NumPy
and closed forms; never one minigraph mode against another.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call as torch_functional_call

import minigraph as mg
from minigraph import nn
from minigraph.errors import MinigraphError, ShapeError

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _package_seed_restored():
    """The package generator starts again from its first seed, 0, after each test here
    (one of them seeds it)."""
    yield
    nn.manual_seed(0)


# -- losses whose arguments' shapes are known only when a graph runs -----------------------

def _mse(p, t):
    return nn.MSELoss()(p, t)


def _bce(x, t):
    return mg.binary_cross_entropy_with_logits(x, t)


@pytest.mark.parametrize("loss, oracle, name", [
    (_mse, F.mse_loss, "MSELoss"),
    (_bce, F.binary_cross_entropy_with_logits, "binary_cross_entropy_with_logits")])
def test_a_loss_on_placeholders_of_unknown_shape_refuses_to_broadcast_when_run(loss, oracle,
                                                                               name):
    """MSELoss and binary_cross_entropy_with_logits skipped their shape check when a
    placeholder had shape=None: fed (5, 1) and (5,), or (5, 1) and (1, 1), they
    broadcast and averaged the grid (MSE 4.0 where the elementwise MSE is 0.0). Eager
    mode and PyTorch refuse these shapes; equal shapes give PyTorch's value, and the
    gradients of every mode are PyTorch's. The run's error names the loss (its node was
    plain 'AddN', an op the user never wrote)."""
    with mg.Graph() as g:
        a, b = mg.placeholder(None, name="a"), mg.placeholder(None, name="b")
        out = loss(a, b)
    x, t = np.arange(5.0).reshape(5, 1) / 4, np.array([[1.0], [0.0], [1.0], [1.0], [0.0]])
    want = oracle(torch.tensor(x), torch.tensor(t)).item()
    np.testing.assert_allclose(mg.Session(g).run(out, {a: x, b: t}), want, rtol=1e-13)
    for other in (t[:, 0], t[:1]):  # (5,) and (1, 1): both broadcast against (5, 1)
        with pytest.raises(MinigraphError, match=f"node '{name}/AddN'.*same shape"):
            mg.Session(g).run(out, {a: x, b: other})
    with pytest.raises(ShapeError, match="same shape"):  # (eager: refused at once)
        loss(mg.tensor(x), mg.tensor(t[:, 0]))

    tx = torch.tensor(x, requires_grad=True)
    oracle(tx, torch.tensor(t)).backward()
    for mode in mg.MODES:  # tape, forward, graph, source
        got = mg.grad(loss, mode=mode)(mg.tensor(x), mg.tensor(t))
        np.testing.assert_allclose(got.numpy(), tx.grad.numpy(), rtol=1e-12, err_msg=mode)


# -- Linear's sizes, functional_call's values ------------------------------------------------

def test_linear_refuses_a_bool_size_and_takes_numpys_integers():
    """Linear(True, 2) passed the size check (a bool is an int) and failed inside
    NumPy's generator with "an integer is required"; Linear(np.int64(3), 2) was refused,
    though PyTorch takes it. Oracle: PyTorch's shapes, and x @ W.T + b in NumPy."""
    with pytest.raises(ValueError, match="Linear: in_features must be a positive int, got True"):
        nn.Linear(True, 2)
    with pytest.raises(ValueError, match="out_features"):
        nn.Linear(2, np.bool_(True))
    lin = nn.Linear(np.int64(3), np.int32(2), seed=0)
    assert lin.weight.shape == tuple(torch.nn.Linear(np.int64(3), np.int32(2)).weight.shape)
    assert repr(lin) == "Linear(in_features=3, out_features=2, bias=True)"
    x = RNG.normal(size=(4, 3))
    np.testing.assert_allclose(lin(mg.tensor(x)).numpy(),
                               x @ lin.weight.numpy().T + lin.bias.numpy(), rtol=1e-13)


def test_functional_call_takes_a_nested_list_as_a_value():
    """functional_call(lin, {"weight": [[...]]}, x) raised "'list' object has no
    attribute 'T'"; a nested list is made a tensor, as an eager op makes it, and a value
    that is no data at all is refused naming functional_call and the key. Oracle:
    torch.func.functional_call."""
    lin = nn.Linear(3, 2, seed=0)
    w, x = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[1.0, -1.0, 0.5]]
    tl = torch.nn.Linear(3, 2).double()
    tl.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                        for k, v in lin.state_dict().items()})
    want = torch_functional_call(tl, {"weight": torch.tensor(w, dtype=torch.float64)},
                                 (torch.tensor(x, dtype=torch.float64),))
    got = nn.functional_call(lin, {"weight": w}, x)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-13)
    with pytest.raises(TypeError, match="functional_call: the value for 'bias' .*NoneType"):
        nn.functional_call(lin, {"bias": None}, x)


# -- seeds ---------------------------------------------------------------------------------------

def _drawn(seed, shape):
    """Linear's initial weight for a generator seeded with ``seed`` (NumPy's)."""
    bound = 1 / np.sqrt(shape[1])
    return np.random.default_rng(seed).uniform(-bound, bound, size=shape)


def test_manual_seed_refuses_what_is_no_integer_and_maps_negative_seeds_as_torch():
    """manual_seed(None) seeded from the operating system (other weights on every run;
    torch.manual_seed(None) raises TypeError); manual_seed(-1), manual_seed(1.5) and
    Linear(seed=-1) failed inside NumPy. A negative seed now means what PyTorch makes of
    it (torch.initial_seed() after torch.manual_seed(-1)). Oracle: PyTorch, NumPy."""
    for bad in (None, 1.5, True):
        with pytest.raises(TypeError, match="manual_seed: seed must be an integer"):
            nn.manual_seed(bad)
    with pytest.raises(TypeError, match="Linear: seed must be an integer"):
        nn.Linear(2, 2, seed=2.0)
    state = torch.get_rng_state()
    torch.manual_seed(-1)
    mapped = torch.initial_seed()  # (2**64 - 1: the 64-bit two's complement of -1)
    torch.set_rng_state(state)
    nn.manual_seed(-1)
    np.testing.assert_array_equal(nn.Linear(3, 2).weight.numpy(), _drawn(mapped, (2, 3)))
    np.testing.assert_array_equal(nn.Linear(3, 2, seed=-1).weight.numpy(), _drawn(mapped, (2, 3)))
    with pytest.raises(ValueError):
        torch.manual_seed(2 ** 64)
    with pytest.raises(ValueError, match="manual_seed: seed must lie in"):
        nn.manual_seed(2 ** 64)
    nn.manual_seed(np.int64(5))
    np.testing.assert_array_equal(nn.Linear(3, 2).weight.numpy(), _drawn(5, (2, 3)))


# -- values that are no arrays at all -----------------------------------------------------------

def test_layers_and_losses_name_a_value_that_is_no_array():
    """Linear(None), Linear("abc") and CrossEntropyLoss()("abc", [0, 1]) were told
    "the input has shape ()" (shape_of took anything without a shape for a number), and
    a ragged list raised NumPy's "inhomogeneous shape", naming no layer. PyTorch: a
    TypeError naming the function and the type. Numbers and nested lists still work
    (oracle: NumPy)."""
    with pytest.raises(TypeError, match="must be Tensor, not NoneType"):
        torch.nn.Linear(3, 2)(None)
    lin = nn.Linear(3, 2, seed=0)
    for value, name in ((None, "NoneType"), ("abc", "str"), ({"x": 1}, "dict")):
        with pytest.raises(TypeError, match=f"Linear: the input .*not {name}"):
            lin(value)
    with pytest.raises(TypeError, match="cross_entropy: the logits .*not str"):
        nn.CrossEntropyLoss()("abc", [0, 1])
    with pytest.raises(TypeError, match="CrossEntropyLoss: the logits .*not NoneType"):
        nn.CrossEntropyLoss(reduction="sum")(None, [0, 1])
    with pytest.raises(TypeError, match="cross_entropy: the labels .*not NoneType"):
        mg.cross_entropy(mg.tensor(np.zeros((2, 3))), None)
    with pytest.raises(TypeError, match="softmax: the input .*not NoneType"):
        mg.softmax(None)
    with pytest.raises(ShapeError, match="Linear: the input is a nested list .*ragged"):
        lin([[1.0, 2.0, 3.0], [1.0, 2.0]])
    with pytest.raises(ShapeError, match="MSELoss: the prediction is a nested list .*ragged"):
        nn.MSELoss()([[1.0], [1.0, 2.0]], [[1.0], [1.0, 2.0]])
    x = [[1.0, 2.0, 3.0]]
    np.testing.assert_allclose(lin(x).numpy(), np.array(x) @ lin.weight.numpy().T
                               + lin.bias.numpy(), rtol=1e-13)
    assert nn.MSELoss()(2.0, 3.0).item() == 1.0


# -- freezing a whole model -------------------------------------------------------------------

def test_requires_grad_of_a_module_freezes_every_parameter_as_pytorchs_does():
    """Module had no requires_grad_ (PyTorch's way to freeze a part of a model, such as
    a discriminator): ``model.requires_grad_(False)`` raised AttributeError. Oracle:
    the same two-layer model in PyTorch, its second layer frozen: the same .grad (None
    where frozen), and SGD leaves the frozen weights as they were; unfrozen again, they
    get PyTorch's gradients."""
    m = nn.Sequential(nn.Linear(3, 4, seed=1), nn.Linear(4, 2, seed=2))
    t = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).double()
    with torch.no_grad():
        for p, q in zip(m.parameters(), t.parameters()):
            q.copy_(torch.tensor(p.numpy()))
    x = RNG.normal(size=(5, 3))
    assert m[1].requires_grad_(False) is m[1]
    t[1].requires_grad_(False)
    frozen = m[1].weight.numpy()
    opt = nn.SGD(m.parameters(), lr=0.1)
    (m(mg.tensor(x)) ** 2).sum().backward()
    (t(torch.tensor(x)) ** 2).sum().backward()
    for p, q in zip(m.parameters(), t.parameters()):
        assert (p.grad is None) == (q.grad is None) and p.requires_grad == q.requires_grad
        if q.grad is not None:
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12)
    opt.step(), torch.optim.SGD(t.parameters(), lr=0.1).step()
    np.testing.assert_array_equal(m[1].weight.numpy(), frozen)
    assert len(m.parameters()) == 4 and list(m.state_dict()) == list(t.state_dict())

    m.zero_grad(), t.zero_grad(), m.requires_grad_(), t.requires_grad_()
    (m(mg.tensor(x)) ** 2).sum().backward()
    (t(torch.tensor(x)) ** 2).sum().backward()
    for p, q in zip(m.parameters(), t.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12)
    with pytest.raises(TypeError, match="requires_grad must be True or False, got .no. \\(a str\\)"):
        m.requires_grad_("no")


def test_linear_in_a_graph_of_unknown_shapes_refuses_a_widening_bias_when_run():
    """A Linear whose weight (1, 4) and bias (3,) would broadcast x @ weight.T to (N, 3)
    is refused in eager mode, as by PyTorch; in a graph whose input has shape=None the
    check was skipped and the run returned every column the same. Now the run refuses
    it; a Linear that fits gives NumPy's x @ W.T + b."""
    lin = nn.Linear(4, 3, seed=0)
    x = RNG.normal(size=(2, 4))
    with mg.Graph() as g:
        p = mg.placeholder(None, name="x")
        good = lin(p)
        bad = nn.functional_call(lin, {"weight": mg.tensor(np.ones((1, 4)), requires_grad=True),
                                       "bias": lin.bias}, p)
    np.testing.assert_allclose(mg.Session(g).run(good, {p: x}),
                               x @ lin.weight.numpy().T + lin.bias.numpy(), rtol=1e-12)
    with pytest.raises(MinigraphError, match="Linear/AddN.*same shape"):
        mg.Session(g).run(bad, {p: x})
    with pytest.raises(RuntimeError):
        torch.nn.functional.linear(torch.tensor(x), torch.ones(1, 4), torch.ones(3))
