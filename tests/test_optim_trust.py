"""SGD's state dict (resuming momentum training) and Linear with replaced parameters.

Oracles: PyTorch (torch.optim.SGD, torch.nn.Linear) and NumPy; never one minigraph mode
against another.
"""

import numpy as np
import pytest
import torch
import torch._dynamo  # noqa: F401  (torch.optim imports it at its first use, 2.5 s: here)

import minigraph as mg
from minigraph import nn
from minigraph.nn.module import StateDictError


def _data(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [(rng.normal(size=(7, 4)), rng.integers(0, 3, size=7)) for _ in range(steps)]


def _mg_step(model, opt, X, Y) -> None:
    opt.zero_grad()
    nn.CrossEntropyLoss()(model(mg.tensor(X)), mg.tensor(Y)).backward()
    opt.step()


def test_sgd_resumed_through_files_matches_torch_uninterrupted(tmp_path):
    """SGD had no state_dict/load_state_dict: the momentum buffers could not be saved, and
    a run resumed at step 10 departed from the uninterrupted one. Here the model and the
    buffers go through mg.save/mg.load (the recipe in SGD.state_dict's docstring) into a
    new model with other weights and a new SGD, and the 20 steps must match torch's
    uninterrupted run."""
    data = _data(20)
    model = nn.Linear(4, 3, seed=0)
    t = torch.nn.Linear(4, 3).double()
    with torch.no_grad():
        t.weight.copy_(torch.from_numpy(model.weight.numpy().copy()))
        t.bias.copy_(torch.from_numpy(model.bias.numpy().copy()))
    t_opt = torch.optim.SGD(t.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    for X, Y in data:
        t_opt.zero_grad()
        torch.nn.functional.cross_entropy(t(torch.from_numpy(X)), torch.from_numpy(Y)).backward()
        t_opt.step()

    opt = nn.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    for X, Y in data[:10]:
        _mg_step(model, opt, X, Y)
    mg.save(model.state_dict(), tmp_path / "model.npz")
    state = opt.state_dict()["state"]
    mg.save({str(i): s["momentum_buffer"] for i, s in state.items()}, tmp_path / "sgd.npz")

    model = nn.Linear(4, 3, seed=5)  # other weights, overwritten by the load
    model.load_state_dict(mg.load(tmp_path / "model.npz"))
    opt = nn.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    sd = opt.state_dict()
    sd["state"] = {int(i): {"momentum_buffer": b} for i, b in mg.load(tmp_path / "sgd.npz").items()}
    opt.load_state_dict(sd)
    for X, Y in data[10:]:
        _mg_step(model, opt, X, Y)
    np.testing.assert_allclose(model.weight.numpy(), t.weight.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(model.bias.numpy(), t.bias.detach().numpy(), atol=1e-12)


def test_sgd_state_dict_has_torch_layout_and_hands_out_copies():
    """The state dict has torch.optim.SGD's layout and buffers (compared after one step),
    and neither the dict handed out nor the one loaded aliases the optimizer's buffers."""
    w0 = np.array([[1.0, -2.0], [0.5, 3.0]])
    g = np.array([[0.1, 0.2], [-0.3, 0.4]])
    w = mg.tensor(w0, requires_grad=True)
    opt = nn.SGD([w], lr=0.1, momentum=0.9)
    w.grad = mg.tensor(g)
    opt.step()
    tw = torch.tensor(w0, requires_grad=True)
    t_opt = torch.optim.SGD([tw], lr=0.1, momentum=0.9)
    tw.grad = torch.tensor(g)
    t_opt.step()
    want = t_opt.state_dict()

    sd = opt.state_dict()
    assert list(sd) == list(want) == ["state", "param_groups"]
    assert list(sd["state"]) == list(want["state"]) == [0]
    assert list(sd["state"][0]) == ["momentum_buffer"]
    np.testing.assert_array_equal(sd["state"][0]["momentum_buffer"].numpy(),
                                  want["state"][0]["momentum_buffer"].numpy())
    group, t_group = sd["param_groups"][0], want["param_groups"][0]
    assert len(sd["param_groups"]) == 1
    assert {k: group[k] for k in ("lr", "momentum", "weight_decay", "params")} == \
        {k: t_group[k] for k in ("lr", "momentum", "weight_decay", "params")}

    sd["state"][0]["momentum_buffer"] -= 100.0  # a copy: the optimizer keeps its buffer
    np.testing.assert_array_equal(opt.state_dict()["state"][0]["momentum_buffer"].numpy(), g)
    loaded = {"state": {0: {"momentum_buffer": mg.tensor(g * 2)}},
              "param_groups": [{"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0,
                                "params": [0]}]}
    opt.load_state_dict(loaded)
    loaded["state"][0]["momentum_buffer"] -= 100.0  # copied in: the optimizer keeps 2 g
    np.testing.assert_array_equal(opt.state_dict()["state"][0]["momentum_buffer"].numpy(), 2 * g)


def _good_state() -> dict:
    return {"state": {0: {"momentum_buffer": mg.tensor(np.ones((2, 2)))}},
            "param_groups": [{"lr": 0.5, "momentum": 0.5, "weight_decay": 0.0,
                              "params": [0, 1]}]}


def _with(change):
    sd = _good_state()
    change(sd)
    return sd


@pytest.mark.parametrize("bad, words", [
    (_with(lambda sd: sd["param_groups"][0].update(params=[0])), ["params", "2 parameters"]),
    (_with(lambda sd: sd["state"][0].update(momentum_buffer=mg.tensor(np.ones((2, 3))))),
     ["parameter 0", "shape (2, 3)", "(2, 2)"]),
    (_with(lambda sd: sd["state"][0].update(momentum_buffer=mg.tensor(np.ones((2, 2)),
                                                                      dtype="float32"))),
     ["parameter 0", "float32", "float64"]),
    (_with(lambda sd: sd["param_groups"][0].update(lr="0.5")), ["lr", "real number"]),
    (_with(lambda sd: sd["param_groups"][0].update(nesterov=True)), ["nesterov"]),
    (_with(lambda sd: sd.update(state={"0": sd["state"][0]})), ["'0'", "index"]),
])
def test_sgd_load_state_dict_refuses_what_does_not_fit_and_changes_nothing(bad, words):
    """load_state_dict checks the parameter count, each buffer's shape and dtype, the
    hyperparameters' types and the keys before changing anything: the refusal names what
    does not fit, and the optimizer keeps its hyperparameters and buffers (here, the good
    state dict loaded first)."""
    params = [mg.tensor(np.zeros((2, 2)), requires_grad=True),
              mg.tensor(np.zeros(3), requires_grad=True)]
    opt = nn.SGD(params, lr=0.1, momentum=0.9)
    opt.load_state_dict(_good_state())
    with pytest.raises((RuntimeError, TypeError)) as info:
        opt.load_state_dict(bad)
    assert all(word in str(info.value) for word in words), str(info.value)
    assert (opt.lr, opt.momentum, opt.weight_decay) == (0.5, 0.5, 0.0)
    sd = opt.state_dict()
    assert list(sd["state"]) == [0]
    np.testing.assert_array_equal(sd["state"][0]["momentum_buffer"].numpy(), np.ones((2, 2)))


def test_linear_weight_none_is_a_clear_type_error_and_bias_none_still_works():
    """``layer.weight = None`` (accepted, as in PyTorch) made forward fail with a raw
    AttributeError ('NoneType' object has no attribute 'T'); it is now a TypeError naming
    the layer and its weight. ``bias = None`` still means no bias (NumPy's x @ W.T)."""
    x = np.arange(6.0).reshape(2, 3)
    m = nn.Linear(3, 4, seed=0)
    m.weight = None
    with pytest.raises(TypeError, match=r"Linear\(in_features=3.*'weight' is None"):
        m(mg.tensor(x))
    m = nn.Linear(3, 4, seed=0)
    m.bias = None
    np.testing.assert_allclose(m(mg.tensor(x)).numpy(), x @ m.weight.numpy().T)


def test_linear_bias_may_not_widen_the_product_as_in_torch():
    """An assigned weight of shape (1, 3) with the bias of shape (4,) broadcast silently
    to an output of the expected shape (2, 4), each column the same product; PyTorch
    refuses it, and so does Linear now, naming itself and both shapes. A bias that fits
    into the product by broadcasting, shape (1,), is still taken, as by PyTorch."""
    x = np.arange(6.0).reshape(2, 3)
    m, t = nn.Linear(3, 4, seed=0), torch.nn.Linear(3, 4).double()
    m.weight = mg.tensor(np.ones((1, 3)), requires_grad=True)
    t.weight = torch.nn.Parameter(torch.ones(1, 3, dtype=torch.float64))
    with pytest.raises(RuntimeError):
        t(torch.from_numpy(x))
    with pytest.raises(mg.errors.ShapeError, match=r"Linear.*bias of shape \(4,\).*\(2, 1\)"):
        m(mg.tensor(x))
    m, t = nn.Linear(3, 4, seed=0), torch.nn.Linear(3, 4).double()
    m.bias = mg.tensor(np.full(1, 0.5), requires_grad=True)
    t.weight = torch.nn.Parameter(torch.from_numpy(m.weight.numpy().copy()))
    t.bias = torch.nn.Parameter(torch.full((1,), 0.5, dtype=torch.float64))
    np.testing.assert_allclose(m(mg.tensor(x)).numpy(),
                               t(torch.from_numpy(x)).detach().numpy(), atol=1e-14)


def test_sgd_loads_torchs_state_dict_with_its_options_at_their_defaults():
    """torch.optim.SGD's state dict has options this SGD does not (dampening, nesterov,
    maximize, foreach, differentiable, fused): load_state_dict refused it for them, even
    at their defaults, which compute what this SGD computes; and NumPy integer keys. Now
    it loads (the buffers made minigraph tensors), and the next steps are torch's;
    nesterov=True is still refused."""
    w0 = np.array([1.0, -2.0, 0.5])
    tp = torch.nn.Parameter(torch.tensor(w0))
    topt = torch.optim.SGD([tp], lr=0.1, momentum=0.9)
    for _ in range(2):
        topt.zero_grad()
        (tp ** 2).sum().backward()
        topt.step()
    sd = topt.state_dict()
    p = mg.tensor(tp.detach().numpy().copy(), requires_grad=True)
    opt = nn.SGD([p], lr=0.5)
    opt.load_state_dict({"state": {np.int64(0): {"momentum_buffer": mg.tensor(
        sd["state"][0]["momentum_buffer"].numpy())}}, "param_groups": sd["param_groups"]})
    for _ in range(3):
        topt.zero_grad()
        (tp ** 2).sum().backward()
        topt.step()
        p.grad = None
        (p ** 2).sum().backward()
        opt.step()
    np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-14)
    nesterov = dict(sd["param_groups"][0], nesterov=True)
    with pytest.raises(StateDictError, match="unexpected: \\['nesterov'\\]"):
        opt.load_state_dict({"state": {}, "param_groups": [nesterov]})
