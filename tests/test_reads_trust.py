"""What a function reads from outside its arguments (``reads.outside_reads``), as the
checkpoint and the compiled programs guard it: the names f loads as globals, not every
name in its code; a module's checkpoint recomputing with the parameters it was called
with (through ``nn.functional_call`` too); and the refusal of a model too large to watch
saying what to do. Oracles: torch (``torch.utils.checkpoint``, ``torch.func``)."""

import numpy as np
import pytest
import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import minigraph as mg
from minigraph.errors import MinigraphError

nn = mg.nn


class _Scale(nn.Module):
    """x * self.w, and an attribute ``offset`` that forward does not read."""

    def __init__(self):
        super().__init__()
        self.w = mg.tensor(np.full(4, 1.5), requires_grad=True)
        self.offset = 0.0

    def forward(self, x):
        return x * self.w + offset


w = np.zeros(4)  # a global named as _Scale's attribute, which _Scale never reads
offset = 0.25    # a global named as another attribute of _Scale, which it reads


def _torch_scale_grads():
    """x.grad and w.grad of sum((x * w + 0.25)**2), x ones (2, 4), w 1.5: torch's."""
    tw = torch.full((4,), 1.5, dtype=torch.float64, requires_grad=True)
    tx = torch.ones(2, 4, dtype=torch.float64, requires_grad=True)
    out = torch_checkpoint(lambda a: a * tw + 0.25, tx, use_reentrant=False)
    (out ** 2).sum().backward()
    return tx.grad.numpy(), tw.grad.numpy()


_SCALE_GRADS = _torch_scale_grads()  # (once, as the module is loaded: torch's first
# checkpoint takes seconds to set itself up)


def test_a_global_named_like_an_attribute_f_reads_is_not_read():
    """``self.w`` made the unrelated global ``w`` count as read (co_names holds attribute
    names too), so rebinding that global between the forward and the backward pass made
    the checkpoint refuse ("f reads w, which holds another value")."""
    global w
    m = _Scale()
    x = mg.tensor(np.ones((2, 4)), requires_grad=True)
    loss = (mg.checkpoint(m)(x) ** 2).sum()
    w = np.ones(4)  # (the student's own data, rebound before backward())
    loss.backward()
    want_x, want_w = _SCALE_GRADS
    np.testing.assert_allclose(x.grad.numpy(), want_x, rtol=1e-12)
    np.testing.assert_allclose(m.w.grad.numpy(), want_w, rtol=1e-12)


def test_an_attribute_named_like_a_global_f_reads_is_not_read():
    """The other way round: forward loads the global ``offset``, so the module's own
    attribute ``offset``, which it never reads, was watched, and setting it between the
    forward and the backward pass made the checkpoint refuse."""
    m = _Scale()
    x = mg.tensor(np.ones((2, 4)), requires_grad=True)
    loss = (mg.checkpoint(m)(x) ** 2).sum()
    m.offset = 1.0
    loss.backward()
    want_x, want_w = _SCALE_GRADS
    np.testing.assert_allclose(x.grad.numpy(), want_x, rtol=1e-12)
    np.testing.assert_allclose(m.w.grad.numpy(), want_w, rtol=1e-12)


random = 0.5  # a global named random: a number, not a random number generator


def _times_pi_and_random(x):
    return x * np.pi * random


def test_a_global_named_random_is_not_numpys_generator():
    """f read ``np`` and the name ``random`` stood in its code, as a global, so the
    checkpoint took it for ``np.random`` (drawn from) and refused it in a graph:
    only ``np.random`` loaded as an attribute is NumPy's generator."""
    g = mg.grad(lambda x: mg.checkpoint(_times_pi_and_random)(x).sum(), mode="graph")
    got = g(mg.tensor(np.array([1.0, 2.0])))
    tx = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    (tx * np.pi * 0.5).sum().backward()
    np.testing.assert_allclose(got.numpy(), tx.grad.numpy(), rtol=1e-12)


class _CheckpointedBlock(nn.Module):
    """head(tanh(checkpoint(block)(x))): a checkpoint of a submodule inside a module."""

    def __init__(self):
        super().__init__()
        self.block = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)
        self.ck = mg.checkpoint(self.block)

    def forward(self, x):
        return self.head(mg.tanh(self.ck(x)))


X = np.random.default_rng(1).normal(size=(5, 4))
Y = np.array([0, 1, 2, 0, 1])


def _torch_functional_call_grads(values):
    """The gradients of the cross entropy of torch.func.functional_call, with ``values``
    (NumPy arrays by minigraph's parameter names), of the torch twin of
    ``_CheckpointedBlock`` (its block under torch.utils.checkpoint)."""
    block, head = torch.nn.Linear(4, 4).double(), torch.nn.Linear(4, 3).double()

    class Twin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block, self.head = block, head

        def forward(self, x):
            return self.head(torch.tanh(torch_checkpoint(self.block, x, use_reentrant=False)))

    params = {k: torch.tensor(v, requires_grad=True) for k, v in values.items()}
    out = torch.func.functional_call(Twin(), params, (torch.tensor(X),))
    torch.nn.functional.cross_entropy(out, torch.tensor(Y)).backward()
    return {k: p.grad.numpy() for k, p in params.items()}


@pytest.mark.parametrize("mode", ["tape", "graph", "backward"])
def test_a_module_checkpoint_inside_functional_call_recomputes_with_its_values(mode):
    """functional_call puts the module's own parameters back after the forward pass, and
    the checkpoint, which watched the module's parameter slots, refused the backward
    ("f reads weight, which holds another value since the forward pass"). Its parameters
    are its arguments: it recomputes with those the forward pass used."""
    nn.manual_seed(0)
    m = _CheckpointedBlock()
    names = [n for n, _ in m.named_parameters()]
    values = [mg.tensor(p.numpy() + 0.125, requires_grad=True) for p in m.parameters()]
    want = _torch_functional_call_grads({n: v.numpy() for n, v in zip(names, values)})

    def loss(*ps):
        out = nn.functional_call(m, dict(zip(names, ps)), mg.tensor(X))
        return nn.CrossEntropyLoss()(out, mg.tensor(Y))

    if mode == "backward":
        loss(*values).backward()
        got = [v.grad for v in values]
    else:
        got = mg.grad(loss, argnums=tuple(range(len(names))), mode=mode)(*values)
    for name, g in zip(names, got):
        np.testing.assert_allclose(g.numpy(), want[name], rtol=1e-10, atol=1e-13)
    assert all(p.grad is None for p in m.parameters())  # (the module's own: untouched)


class _Rows(nn.Module):
    """``self.table[i]``: a row of its parameter, a view of it (a learned embedding)."""

    def __init__(self):
        super().__init__()
        self.table = mg.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)

    def forward(self, i):
        return self.table[i]


def test_a_module_checkpoint_returning_a_view_of_its_parameter_gets_its_gradient():
    """The result, a view of the module's parameter, was taken for a tensor read from
    outside f (a constant), and the parameter got no gradient at all (None): the
    module's parameters are the checkpoint's arguments, not reads from outside."""
    m = _Rows()
    x = mg.tensor(np.array([1.0, 2.0, 3.0]))
    (mg.checkpoint(m)(1) * x).sum().backward()
    table = torch.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    (torch_checkpoint(lambda i: table[i], 1, use_reentrant=False)
     * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    assert m.table.grad is not None
    np.testing.assert_array_equal(m.table.grad.numpy(), table.grad.numpy())


def test_a_model_too_large_to_watch_is_refused_saying_what_to_do():
    """A graph-mode gradient of a Sequential of 5,000 layers was refused, saying to pass
    what f uses as an argument (which a model's layers cannot be). The refusal of a
    module says what to do: the tape, or a checkpoint per segment."""
    m = nn.Sequential(*[nn.Tanh() for _ in range(5_000)])
    x = mg.tensor(np.full(3, 0.5))
    with pytest.raises(MinigraphError, match=r"a module of 5,001 layers.*mode=\"tape\".*"
                                             r"segments"):
        mg.grad(lambda x: m(x).sum(), mode="graph")(x)


SCALE = 2.0


class _Inner(nn.Module):
    def forward(self, x):
        return x * SCALE


class _Outer(nn.Module):
    """``self.inner(x)``: a layer its forward finds in its table of layers."""

    def __init__(self):
        super().__init__()
        self.inner = _Inner()

    def forward(self, x):
        return self.inner(x)


def test_a_layers_global_is_watched_by_its_models_program():
    """A compiled program read the model's tree of layers but not what its layers'
    forwards read: ``SCALE = 3.0`` left graph mode computing with 2.0, where the tape
    (and torch) use 3.0."""
    global SCALE
    m = _Outer()
    g = mg.grad(lambda x: m(x).sum(), mode="graph")
    x = np.array([1.0, 2.0])
    g(mg.tensor(x))
    SCALE = 3.0
    try:
        got = g(mg.tensor(x))
    finally:
        SCALE = 2.0
    tx = torch.tensor(x, requires_grad=True)
    (tx * 3.0).sum().backward()
    np.testing.assert_array_equal(got.numpy(), tx.grad.numpy())
