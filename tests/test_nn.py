"""mg.nn: layers against hand-written NumPy, module bookkeeping, losses, SGD, graph mode."""

from __future__ import annotations

import numpy as np
import pytest

import minigraph as mg
from minigraph import nn
from minigraph.errors import DeviceError, DTypeError, ShapeError

RNG = np.random.default_rng(7)
X = RNG.normal(size=(5, 4))
G = RNG.normal(size=(5, 3))  # an upstream gradient: loss = sum(y * G)


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 6, seed=1), nn.Tanh(), nn.Linear(6, 3, seed=2))


# -- layers against NumPy ------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_linear_forward_and_backward_match_numpy(bias):
    layer = nn.Linear(4, 3, bias=bias, seed=0)
    w = layer.weight.numpy()
    b = layer.bias.numpy() if bias else np.zeros(3)
    x = mg.tensor(X, requires_grad=True)
    y = layer(x)
    np.testing.assert_allclose(y.numpy(), X @ w.T + b, rtol=1e-13)
    (y * mg.tensor(G)).sum().backward()
    np.testing.assert_allclose(layer.weight.grad.numpy(), G.T @ X, rtol=1e-13)
    np.testing.assert_allclose(x.grad.numpy(), G @ w, rtol=1e-13)
    if bias:
        np.testing.assert_allclose(layer.bias.grad.numpy(), G.sum(axis=0), rtol=1e-13)
    assert [n for n, _ in layer.named_parameters()] == (["weight", "bias"] if bias else ["weight"])


def test_linear_uses_pytorch_layout_and_initialisation():
    layer = nn.Linear(16, 5, seed=3)
    assert layer.weight.shape == (5, 16) and layer.bias.shape == (5,)
    assert layer.weight.dtype == "float64" and layer.weight.requires_grad
    assert np.abs(layer.weight.numpy()).max() <= 1 / 4 and np.abs(layer.bias.numpy()).max() <= 1 / 4
    same = nn.Linear(16, 5, seed=3)
    np.testing.assert_array_equal(same.weight.numpy(), layer.weight.numpy())
    assert not np.array_equal(nn.Linear(16, 5, seed=4).weight.numpy(), layer.weight.numpy())
    assert nn.Linear(2, 2, dtype="float32").weight.dtype == "float32"
    assert repr(layer) == "Linear(in_features=16, out_features=5, bias=True)"


def test_manual_seed_makes_unseeded_layers_reproducible():
    nn.manual_seed(11)
    a = nn.Linear(3, 3).weight.numpy()
    nn.manual_seed(11)
    np.testing.assert_array_equal(nn.Linear(3, 3).weight.numpy(), a)


def test_linear_rejects_bad_sizes_and_inputs():
    with pytest.raises(ValueError, match="in_features"):
        nn.Linear(0, 3)
    with pytest.raises(ShapeError, match="in_features=4"):
        nn.Linear(4, 3)(mg.tensor(np.ones((2, 5))))


@pytest.mark.parametrize("layer, f, df", [
    (nn.ReLU(), lambda x: np.maximum(x, 0), lambda x: (x > 0).astype(float)),
    (nn.Tanh(), np.tanh, lambda x: 1 - np.tanh(x) ** 2),
])
def test_activations_match_numpy(layer, f, df):
    x = mg.tensor(X, requires_grad=True)
    y = layer(x)
    np.testing.assert_allclose(y.numpy(), f(X), rtol=1e-13)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), df(X), rtol=1e-13)


# -- modules ---------------------------------------------------------------------------------

def test_sequential_composes_and_lists_parameters_in_order():
    model = mlp()
    expected = np.tanh(X @ model[0].weight.numpy().T + model[0].bias.numpy())
    expected = expected @ model[2].weight.numpy().T + model[2].bias.numpy()
    np.testing.assert_allclose(model(mg.tensor(X)).numpy(), expected, rtol=1e-13)
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert model.parameters()[2] is model[2].weight
    assert len(model) == 3 and isinstance(model[1], nn.Tanh)
    head = model[1:]
    assert isinstance(head, nn.Sequential) and head[1] is model[2]  # shared, not copied
    assert "(1): Tanh()" in repr(model)
    with pytest.raises(IndexError, match="3 layers"):
        model[5]
    with pytest.raises(TypeError, match="not a Module"):
        nn.Sequential(nn.ReLU(), lambda x: x)


def test_custom_module_registers_nested_parameters_once():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = mg.tensor([2.0], requires_grad=True)
            self.fc = nn.Linear(4, 4, seed=0)
            self.tied = self.fc  # the same layer twice: its parameters are listed once
            self.note = "not a parameter"
            self.buffer = mg.tensor([1.0])  # no requires_grad: not a parameter

        def forward(self, x):
            return self.fc(x) * self.scale

    b = Block()
    assert [n for n, _ in b.named_parameters()] == ["scale", "fc.weight", "fc.bias"]
    out = b(mg.tensor(X))
    out.sum().backward()
    assert all(p.grad is not None for p in b.parameters())
    b.zero_grad()
    assert all(p.grad is None for p in b.parameters())
    with pytest.raises(NotImplementedError, match="forward"):
        nn.Module()(1.0)


def test_a_module_without_init_explains_itself():
    class Forgot(nn.Module):
        def __init__(self):
            self.w = mg.tensor([1.0], requires_grad=True)

    with pytest.raises(AttributeError, match="super\\(\\).__init__"):
        Forgot()


# -- losses ------------------------------------------------------------------------------------

def test_cross_entropy_loss_matches_numpy():
    logits, labels = RNG.normal(size=(6, 4)), np.array([0, 3, 1, 1, 2, 0])
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    nll = -logp[np.arange(6), labels]
    x = mg.tensor(logits, requires_grad=True)
    loss = nn.CrossEntropyLoss()(x, mg.tensor(labels))
    np.testing.assert_allclose(loss.item(), nll.mean(), rtol=1e-13)
    loss.backward()
    onehot = np.eye(4)[labels]
    np.testing.assert_allclose(x.grad.numpy(), (np.exp(logp) - onehot) / 6, rtol=1e-12)
    total = nn.CrossEntropyLoss(reduction="sum")(mg.tensor(logits), mg.tensor(labels))
    np.testing.assert_allclose(total.item(), nll.sum(), rtol=1e-13)


def test_mse_loss_matches_numpy_and_checks_shapes():
    pred, target = RNG.normal(size=(5, 3)), RNG.normal(size=(5, 3))
    x = mg.tensor(pred, requires_grad=True)
    loss = nn.MSELoss()(x, mg.tensor(target))
    np.testing.assert_allclose(loss.item(), ((pred - target) ** 2).mean(), rtol=1e-13)
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * (pred - target) / pred.size, rtol=1e-13)
    np.testing.assert_allclose(nn.MSELoss(reduction="sum")(x, mg.tensor(target)).item(),
                               ((pred - target) ** 2).sum(), rtol=1e-13)
    with pytest.raises(ShapeError, match=r"\(5, 3\).*\(3,\)"):
        nn.MSELoss()(x, mg.tensor(target[0]))
    with pytest.raises(ValueError, match="reduction"):
        nn.MSELoss(reduction="none")


# -- SGD -----------------------------------------------------------------------------------------

def params_with_grads(values, grads):
    params = [mg.tensor(v, requires_grad=True) for v in values]
    for p, g in zip(params, grads):
        p.grad = None if g is None else mg.tensor(g)
    return params


def test_sgd_step_momentum_and_weight_decay_follow_pytorch():
    p0, g1, g2 = RNG.normal(size=3), RNG.normal(size=3), RNG.normal(size=3)
    lr, mu, wd = 0.1, 0.9, 0.01
    (p,) = params_with_grads([p0], [g1])
    opt = nn.SGD([p], lr=lr, momentum=mu, weight_decay=wd)
    opt.step()
    d1 = g1 + wd * p0
    p1 = p0 - lr * d1
    np.testing.assert_allclose(p.numpy(), p1, rtol=1e-14)
    p.grad = mg.tensor(g2)
    opt.step()
    d2 = mu * d1 + (g2 + wd * p1)
    np.testing.assert_allclose(p.numpy(), p1 - lr * d2, rtol=1e-14)
    opt.zero_grad()
    assert p.grad is None
    opt.step()  # no gradient: nothing moves
    np.testing.assert_allclose(p.numpy(), p1 - lr * d2, rtol=1e-14)


@pytest.mark.parametrize("bad, error", [
    (mg.tensor(np.ones(2)), ShapeError),
    (mg.tensor(np.ones(3, dtype=np.float32)), DTypeError),
    (mg.tensor(np.ones(3), device="cpu:1"), DeviceError),
])
def test_a_failed_sgd_step_leaves_every_parameter_and_buffer_as_it_was(bad, error):
    values = [RNG.normal(size=3) for _ in range(3)]
    params = params_with_grads(values, [np.ones(3), None, np.ones(3)])
    with pytest.raises(mg.errors.GradientError, match="cannot assign a gradient"):
        params[1].grad = bad  # refused as PyTorch refuses it ...
    params[1]._grad = bad  # ... so put behind the check: SGD's own check must hold too
    # (the middle one fails, after the first was computed)
    opt = nn.SGD(params, lr=0.5, momentum=0.9)
    with pytest.raises(error, match="parameter 1"):
        opt.step()
    for p, v in zip(params, values):
        np.testing.assert_array_equal(p.numpy(), v)
    assert opt.state == {}
    params[1].grad = mg.tensor(np.ones(3))  # fixed: the step goes through
    opt.step()
    np.testing.assert_allclose(params[0].numpy(), values[0] - 0.5)


def test_sgd_writes_in_place_and_a_stale_tape_refuses_backward():
    model = mlp()
    arrays = [p.data for p in model.parameters()]
    loss = nn.CrossEntropyLoss()(model(mg.tensor(X)), mg.tensor(np.array([0, 1, 2, 1, 0])))
    loss.backward(retain_graph=True)  # kept, so that the second backward reaches the check
    nn.SGD(model.parameters(), lr=0.1).step()
    assert all(p.data is a for p, a in zip(model.parameters(), arrays))  # no new arrays
    with pytest.raises(mg.errors.GradientError, match="changed in place"):
        loss.backward()  # its tape read the parameters as they were before the step


def test_sgd_rejects_bad_arguments():
    with pytest.raises(ValueError, match="empty"):
        nn.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        nn.SGD(mlp().parameters(), lr=-1.0)
    with pytest.raises(TypeError, match="parameter 0"):
        nn.SGD([np.ones(3)], lr=0.1)


def test_training_an_mlp_lowers_the_loss():
    model, labels = mlp(), mg.tensor(np.array([0, 1, 2, 1, 0]))
    opt, loss_fn = nn.SGD(model.parameters(), lr=0.5, momentum=0.5), nn.CrossEntropyLoss()
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = loss_fn(model(mg.tensor(X)), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


# -- graph mode -----------------------------------------------------------------------------------

def test_layers_build_graphs_with_parameters_as_constants():
    model = mlp()
    with mg.Graph() as g:
        x = mg.placeholder((5, 4), name="x")
        y = model(x)
    assert sum(n.op == "Const" for n in g.nodes) == 4  # two weights, two biases
    before = mg.Session(g).run(y, {x: X})
    np.testing.assert_allclose(before, model(mg.tensor(X)).numpy(), rtol=1e-13)
    for p in model.parameters():  # the graph keeps the values it was built with
        p.grad = mg.ones(p.shape)
    nn.SGD(model.parameters(), lr=1.0).step()
    np.testing.assert_array_equal(mg.Session(g).run(y, {x: X}), before)


def test_functional_call_with_placeholders_gives_the_tape_gradients():
    model, labels = mlp(), np.array([0, 1, 2, 1, 0])
    loss_fn = nn.CrossEntropyLoss()
    with mg.Graph() as g:
        x = mg.placeholder((5, 4), name="x")
        y = mg.placeholder((5,), dtype="int64", name="y")
        params = nn.parameter_placeholders(model, prefix="p/")
        loss = loss_fn(nn.functional_call(model, params, x), y)
        grads = mg.gradients(loss, list(params.values()))
    assert all(n.op == "Placeholder" for n in params.values())
    assert not any(n.op == "Const" and n.shape == (6, 4) for n in g.nodes)
    feed = {x: X, y: labels, **{params[n]: p for n, p in model.named_parameters()}}
    value, graph_grads = mg.Session(g).run([loss, grads], feed)
    tape_loss = loss_fn(model(mg.tensor(X)), mg.tensor(labels))
    tape_loss.backward()
    np.testing.assert_allclose(value, tape_loss.item(), rtol=1e-13)
    for gg, p in zip(graph_grads, model.parameters()):
        np.testing.assert_allclose(gg, p.grad.numpy(), rtol=1e-12)
    assert isinstance(model[0].weight, mg.Tensor)  # the module's own tensors are back


def _tied():
    """Two layers that share one weight (m[2].weight = m[0].weight)."""
    m = nn.Sequential(nn.Linear(3, 3, seed=1), nn.Tanh(), nn.Linear(3, 3, seed=2))
    m[2].weight = m[0].weight
    return m


def _tied_numpy(w, m, x):
    """The tied network in NumPy: tanh(x W^T + b0) W^T + b2, summed."""
    h = np.tanh(x @ w.T + m[0].bias.numpy())
    return (h @ w.T + m[2].bias.numpy()).sum()


@pytest.mark.parametrize("mode", ["tape", "forward", "graph"])  # (source: no dict displays)
def test_functional_call_replaces_a_tied_weight_wherever_it_is_used(mode):
    """functional_call(m, {"0.weight": w}, x) swapped w into layer 0 only; layer 2 kept
    the module's tensor, so the gradient left out the second use ([0.03, -0.05, 0.11]
    for [-0.86, 0.44, 0.50] in row 0). The tie is followed, under either name, as
    torch.func.functional_call does. Oracle: central differences of the NumPy network."""
    m = _tied()
    x = np.array([[0.5, -1.0, 2.0]])
    w0 = m[0].weight.numpy().copy()
    g = mg.grad(_tied_loss, mode=mode)(mg.tensor(w0), m, mg.tensor(x))
    numeric = np.zeros_like(w0)
    for i in np.ndindex(*w0.shape):
        step = np.zeros_like(w0)
        step[i] = 1e-6
        numeric[i] = (_tied_numpy(w0 + step, m, x) - _tied_numpy(w0 - step, m, x)) / 2e-6
    np.testing.assert_allclose(g.numpy(), numeric, rtol=1e-6, atol=1e-9)
    assert m[2].weight is m[0].weight  # (put back, still tied)
    with pytest.raises(ValueError, match="'0.weight' and '2.weight' are one tensor"):
        nn.functional_call(m, {"0.weight": mg.tensor(w0), "2.weight": mg.tensor(w0)},
                           mg.tensor(x))


def _tied_loss(w, m, x):
    return mg.sum(nn.functional_call(m, {"2.weight": w}, x))  # (either name of the tie)


def test_functional_call_restores_parameters_after_an_error_and_checks_names():
    model = mlp()
    own = model[0].weight
    with pytest.raises(ShapeError):
        nn.functional_call(model, {"0.weight": mg.ones((6, 4))}, mg.ones((2, 9)))
    assert model[0].weight is own
    with pytest.raises(KeyError, match="0.weight"):
        nn.functional_call(model, {"weight": own}, mg.tensor(X))


# -- regressions: each docstring says what was wrong ---------------------------------------------

def test_sgd_hyperparameters_given_as_numpy_scalars_keep_the_parameters_dtype():
    """lr, momentum and weight_decay given as np.float64 (a NumPy schedule) made a float32
    parameter's update float64, which the in-place write refused, after the float64
    parameter before it was already written: a half-applied step. A NumPy scalar now
    acts as a Python float, as in PyTorch. Oracle: torch.optim.SGD with the same values."""
    torch = pytest.importorskip("torch")
    p0 = [np.array([1.0, 2.0]), np.array([1.0, 2.0], np.float32)]
    g0 = [np.array([0.5, -1.0]), np.array([0.25, 3.0], np.float32)]
    hyper = dict(lr=np.float64(0.1), momentum=np.float64(0.9), weight_decay=np.float32(0.01))
    params = [mg.tensor(v, requires_grad=True) for v in p0]
    opt = nn.SGD(params, **hyper)
    theirs = [torch.tensor(v, requires_grad=True) for v in p0]
    topt = torch.optim.SGD(theirs, **hyper)
    for _ in range(2):  # the second step uses the momentum buffers
        for p, t, g in zip(params, theirs, g0):
            p.grad, t.grad = mg.tensor(g), torch.tensor(g)
        opt.step()
        topt.step()
    for p, t in zip(params, theirs):
        assert p.dtype == str(t.dtype).removeprefix("torch.")
        np.testing.assert_allclose(p.numpy(), t.detach().numpy(), rtol=1e-6)


def test_an_update_of_another_dtype_is_refused_before_any_parameter_is_written():
    """The dtype of each update was only checked by the write itself, after the earlier
    parameters were written; now every update is checked before the first write.
    Oracle: the parameters' values before the step (all-or-nothing)."""
    params = params_with_grads([np.ones(2), np.ones(2, np.float32)],
                               [np.ones(2), np.ones(2, np.float32)])
    opt = nn.SGD(params, lr=0.5, momentum=0.9)
    opt.state[1] = mg.tensor(np.zeros(2))  # a float64 buffer for the float32 parameter
    with pytest.raises(DTypeError, match="parameter 1 has dtype float32 but its update"):
        opt.step()
    np.testing.assert_array_equal(params[0].numpy(), np.ones(2))  # not half-applied
    assert list(opt.state) == [1]


def test_sgd_steps_a_zero_d_parameter_held_as_a_numpy_scalar():
    """A 0-d parameter made from a reduction holds a NumPy scalar, whose flags say
    read-only; SGD took it for a read-only array and refused the step. Oracle: the
    closed form 1 - 0.1 * 2 = 0.8 (and PyTorch's SGD gives the same)."""
    scale = (mg.tensor([1.0, 2.0]).sum() / 3).requires_grad_()  # (a leaf: nothing recorded)
    assert isinstance(scale.data, np.generic)
    (scale * scale).backward()  # gradient 2 * scale = 2
    nn.SGD([scale], lr=0.1).step()
    np.testing.assert_allclose(scale.numpy(), 1 - 0.1 * 2.0, rtol=1e-15)


def test_an_activation_kept_on_self_is_not_a_parameter():
    """self.hidden = self.fc(x) in forward registered the activation (it requires a
    gradient) as a parameter and a state-dict key. Only leaves are parameters. Oracle:
    the same module in PyTorch."""
    torch = pytest.importorskip("torch")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2, seed=0)

        def forward(self, x):
            self.hidden = self.fc(x)
            return self.hidden.sum()

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

        def forward(self, x):
            self.hidden = self.fc(x)
            return self.hidden.sum()

    m, t = Net(), TorchNet()
    m(mg.tensor(np.ones((3, 2)))).backward()
    t(torch.ones(3, 2)).backward()
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert list(m.state_dict()) == list(t.state_dict())
    assert m.hidden.shape == (3, 2)


def test_a_parameter_name_refuses_a_tensor_that_is_not_a_parameter_and_del_works():
    """m.weight = mg.tensor(...) without requires_grad silently unregistered the weight,
    and del m.bias raised AttributeError. Oracle: PyTorch raises TypeError for the first
    and deletes for the second."""
    torch = pytest.importorskip("torch")
    t = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError):
        t.weight = torch.eye(2)
    del t.bias
    m = nn.Linear(2, 2, seed=0)
    with pytest.raises(TypeError, match="cannot assign a tensor that does not require a "
                                        "gradient to parameter 'weight'"):
        m.weight = mg.tensor(np.eye(2))
    del m.bias
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in t.named_parameters()]
    m.weight = mg.tensor(np.eye(2), requires_grad=True)  # a parameter replaces one
    assert m.parameters()[0] is m.weight


def test_a_module_that_contains_itself_lists_its_parameters_once():
    """named_parameters() walked a module that contains itself forever. Oracle: PyTorch
    visits each module once (its memo of modules)."""
    torch = pytest.importorskip("torch")
    a = nn.Sequential(nn.Linear(1, 1, seed=0))
    a.append(a)
    t = torch.nn.Sequential(torch.nn.Linear(1, 1))
    t.append(t)
    assert [n for n, _ in a.named_parameters()] == [n for n, _ in t.named_parameters()]
    with pytest.raises(nn.StateDictError, match="contains itself"):
        a.state_dict()  # (endless keys: PyTorch recurses until RecursionError)
    with pytest.raises(nn.StateDictError, match="contains itself"):  # (its walk, too)
        nn.functional_call(a, {}, mg.tensor([[1.0]]))


def test_cross_entropy_sum_of_an_empty_batch_is_zero():
    """reduction='sum' computed N * mean, 0 * (0 / 0) = nan, for N = 0. Oracle: PyTorch
    (and the empty sum, 0)."""
    torch = pytest.importorskip("torch")
    logits = mg.tensor(np.zeros((0, 3)), requires_grad=True)
    loss = nn.CrossEntropyLoss(reduction="sum")(logits, mg.tensor(np.zeros(0, np.int64)))
    expected = torch.nn.functional.cross_entropy(torch.zeros(0, 3, dtype=torch.float64),
                                                 torch.zeros(0, dtype=torch.int64),
                                                 reduction="sum")
    assert loss.item() == expected.item() == 0.0 and loss.dtype == "float64"
    loss.backward()
    assert logits.grad.shape == (0, 3)


def test_mse_loss_checks_the_shape_of_a_list_target_too():
    """A list target skipped the no-broadcasting check (it has no .shape): a (3, 1)
    prediction against [1, 2, 3] broadcast to (3, 3). Oracle: NumPy's shape of the list,
    and the value for a target of the right shape."""
    pred = mg.tensor([[1.0], [2.0], [3.0]])
    with pytest.raises(ShapeError, match=r"\(3, 1\) and the target \(3,\)"):
        nn.MSELoss()(pred, [1.0, 2.0, 3.0])
    target = [[1.0], [2.0], [4.0]]
    assert np.shape(target) == pred.shape
    np.testing.assert_allclose(nn.MSELoss()(pred, target).item(),
                               np.mean((pred.numpy() - np.array(target)) ** 2))


def test_a_slice_of_a_sequential_keeps_pytorchs_state_dict_keys():
    """model[1:] renumbered its layers, so its state dict said '1.weight' where PyTorch
    (and the whole model) say '2.weight'. Oracle: PyTorch's slice."""
    torch = pytest.importorskip("torch")
    ours = mlp()
    theirs = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    assert list(ours[1:].state_dict()) == list(theirs[1:].state_dict())
    head = ours[1:]
    head.append(nn.ReLU())  # the next number, not a reused one
    assert list(head._modules) == ["1", "2", "3"] and len(head) == 3
