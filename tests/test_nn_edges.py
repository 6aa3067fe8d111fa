"""Edges of ``mg.nn`` (and the losses under it) where minigraph differed from PyTorch:
each test names what was wrong. Oracles: PyTorch, NumPy, closed forms."""

import numpy as np
import pytest

import minigraph as mg
from minigraph import nn
from minigraph.autodiff.checkpoint import CheckpointError
from minigraph.errors import AxisError, ShapeError

torch = pytest.importorskip("torch")
F = torch.nn.functional


def test_sgd_refuses_a_non_leaf_parameter():
    """SGD took ``w = mg.tensor(..., requires_grad=True) * 0.5``, a recorded result that
    backward() never gives a .grad, so every step() silently skipped it and the model
    never trained. PyTorch refuses it when the optimizer is built (ValueError "can't
    optimize a non-leaf Tensor"; not called here: torch.optim's first use takes 2.5 s).
    Oracle for the leaf: the closed form w - lr * 2w."""
    with pytest.raises(ValueError, match=r"can't optimize a non-leaf tensor: parameter 1 "
                                         r"\(shape \(3,\)\)"):
        nn.SGD([mg.tensor(np.ones(2), requires_grad=True),
                mg.tensor(np.ones(3), requires_grad=True) * 0.5], lr=0.1)
    w = mg.tensor(np.full(3, 0.5), requires_grad=True)  # a leaf trains
    opt = nn.SGD([w], lr=0.1)
    (w * w).sum().backward()
    opt.step()
    np.testing.assert_allclose(w.numpy(), 0.5 * (1 - 0.2))


def test_a_name_set_to_none_keeps_its_place_for_the_next_parameter_or_layer():
    """``m.a = None`` dropped 'a' from its table, so the parameter (or layer) assigned
    next went to the end of parameters() and of the state dict; PyTorch keeps the name
    registered as None, and the new value takes the old place."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = mg.tensor(np.ones(2), requires_grad=True)
            self.b = mg.tensor(np.ones(3), requires_grad=True)
            self.f = nn.Linear(2, 2)
            self.g = nn.Linear(2, 2)

    class TM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.ones(2))
            self.b = torch.nn.Parameter(torch.ones(3))
            self.f = torch.nn.Linear(2, 2)
            self.g = torch.nn.Linear(2, 2)

    m, t = M(), TM()
    m.a = None
    m.f = None
    t.a = None
    t.f = None
    assert m.a is None and m.f is None  # (PyTorch's: the name reads None)
    assert list(m.state_dict()) == list(t.state_dict())  # (no None values listed)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert len(m.children()) == len(list(t.children())) == 1
    m.a = mg.tensor(np.zeros(2), requires_grad=True)
    m.f = nn.Linear(2, 2)
    t.a = torch.nn.Parameter(torch.zeros(2))
    t.f = torch.nn.Linear(2, 2)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert list(m.state_dict()) == list(t.state_dict())
    assert [p.shape for p in m.parameters()] == [tuple(p.shape) for p in t.parameters()]
    m.g.bias = None  # a name kept with None is no parameter for functional_call either
    with pytest.raises(KeyError, match="has no parameter 'g.bias'"):
        nn.functional_call(m, {"g.bias": mg.tensor(np.zeros(2))}, mg.tensor(np.ones((1, 2))))
    out = nn.functional_call(m.g, {"weight": mg.tensor(np.eye(2))}, mg.tensor([[1.0, 2.0]]))
    assert out.tolist() == [[1.0, 2.0]]


def test_sequential_append_after_a_named_layer_uses_pytorchs_name():
    """``s.head = Tanh()`` then ``s.append(...)`` raised Python's 'invalid literal for
    int()': the next name was computed as if every name were a number. PyTorch gives
    str(len(s))."""
    t = torch.nn.Sequential(torch.nn.Linear(2, 2))
    t.head = torch.nn.Tanh()
    t.append(torch.nn.Tanh())
    s = nn.Sequential(nn.Linear(2, 2))
    s.head = nn.Tanh()
    s.append(nn.Tanh())
    assert list(s._modules) == list(t._modules) == ["0", "head", "2"]


def test_a_frozen_parameter_can_be_updated_in_place_through_its_module():
    """``lin.weight *= 2`` on a frozen parameter (requires_grad False) doubled the weight
    and then raised: Python re-assigns the same tensor after ``__imul__``, and that was
    refused as "a tensor that does not require a gradient". PyTorch allows it, and
    ``lin.weight = lin.weight`` too; the parameter stays registered."""
    lin = nn.Linear(3, 2, seed=0)
    lin.weight.requires_grad_(False)
    before = lin.weight.numpy().copy()
    tl = torch.nn.Linear(3, 2)
    tl.weight.requires_grad_(False)
    with torch.no_grad():
        tl.weight *= 2.0  # (the oracle: no error)
    with mg.no_grad():
        lin.weight *= 2.0
    lin.weight = lin.weight
    np.testing.assert_array_equal(lin.weight.numpy(), 2 * before)
    assert list(lin.state_dict()) == list(tl.state_dict()) == ["weight", "bias"]


def test_cross_entropy_sum_takes_lists_and_refuses_unknown_shapes_by_name():
    """reduction='sum' read ``logits.shape[0]`` first: nested-list logits (which 'mean'
    takes) raised AttributeError, and a placeholder of unknown shape a TypeError about
    None, not the ShapeError that 'mean' gives."""
    logits = np.random.default_rng(0).standard_normal((4, 5))
    labels = np.array([0, 4, 2, 1])
    want = F.cross_entropy(torch.tensor(logits), torch.tensor(labels), reduction="sum")
    got = nn.CrossEntropyLoss(reduction="sum")(logits.tolist(), mg.tensor(labels))
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-12)
    with mg.Graph():
        x = mg.placeholder(None, name="x")
        y = mg.placeholder(None, "int64", name="y")
        with pytest.raises(ShapeError, match="whose shape is unknown"):
            nn.CrossEntropyLoss(reduction="sum")(x, y)
    with pytest.raises(ShapeError, match=r"logits \(N, C\)"):  # (was an IndexError)
        nn.CrossEntropyLoss(reduction="sum")(mg.tensor(2.0), 1)


def test_mse_loss_takes_two_lists():
    """MSELoss(list, list) raised Python's "unsupported operand type(s) for -": it
    subtracted with '-', which lists do not have. Oracle: NumPy."""
    p, t = [[1.0, 2.0], [3.0, -1.0]], [[0.0, 0.0], [1.0, 1.0]]
    d = np.subtract(p, t)
    np.testing.assert_allclose(nn.MSELoss()(p, t).item(), np.mean(d * d))
    np.testing.assert_allclose(nn.MSELoss(reduction="sum")(p, t).item(), np.sum(d * d))


def test_binary_cross_entropy_with_logits_takes_lists():
    """The same slip: ``1.0 - targets`` and ``-logits`` on lists raised TypeError."""
    x, t = [0.5, -1.0, 3.0], [1.0, 0.0, 1.0]
    want = F.binary_cross_entropy_with_logits(torch.tensor(x, dtype=torch.float64),
                                              torch.tensor(t, dtype=torch.float64))
    np.testing.assert_allclose(mg.binary_cross_entropy_with_logits(x, t).item(),
                               want.item(), rtol=1e-12)


def test_labels_of_another_integer_dtype_are_told_the_dtype_needed():
    """uint8 labels were told "labels must be integers", which they are; the message
    now names the dtypes taken (int64 or int32) and the conversion, which works."""
    logits = np.random.default_rng(0).standard_normal((4, 5))
    labels = np.array([0, 4, 2, 1], np.uint8)
    with pytest.raises(TypeError, match=r"labels must have dtype int64 or int32, got uint8; "
                                        r"convert them first: labels.astype\(np.int64\)"):
        nn.CrossEntropyLoss()(mg.tensor(logits), labels)
    want = F.cross_entropy(torch.tensor(logits), torch.tensor(labels))  # (torch takes uint8)
    got = nn.CrossEntropyLoss()(mg.tensor(logits), labels.astype(np.int64))
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-12)
    with pytest.raises(TypeError, match="labels must be integers, got dtype float64"):
        mg.cross_entropy(mg.tensor(logits), labels.astype(np.float64))


def test_checkpoint_of_a_module_refuses_keywords_clearly():
    """``mg.checkpoint(module)(x, scale=2.0)`` raised Python's TypeError naming an
    internal closure; a checkpointed function refuses keywords with a CheckpointError."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2, seed=1)

        def forward(self, x, scale=1.0):
            return self.fc(x) * scale

    x = mg.tensor(np.ones((1, 2)))
    with pytest.raises(CheckpointError, match=r"checkpoint\(M\): pass the arguments by "
                                              r"position \(got keywords \['scale'\]\)"):
        mg.checkpoint(M())(x, scale=2.0)


@pytest.mark.parametrize("fn, torch_fn", [(mg.softmax, torch.softmax),
                                          (mg.log_softmax, torch.log_softmax)])
def test_softmax_of_a_0d_tensor_is_pytorchs(fn, torch_fn):
    """softmax and log_softmax of a 0-d tensor were refused with "valid axes 0 to -1";
    PyTorch reads it as one class (axis 0 or -1): 1.0 and 0.0, gradient 0."""
    for axis in (-1, 0):
        x = mg.tensor(2.5, requires_grad=True)
        tx = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
        y, ty = fn(x, axis), torch_fn(tx, axis)
        assert y.shape == () and y.item() == ty.item()
        y.backward()
        ty.backward()
        assert x.grad.item() == tx.grad.item() == 0.0
    with pytest.raises(AxisError, match=r"axis 1 is out of range for a tensor of shape "
                                        r"\(\) \(one class: valid axes -1 and 0"):
        fn(mg.tensor(2.5), 1)
