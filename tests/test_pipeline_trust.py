"""Pipeline reruns the graph it built for a minibatch shape: what it was built from must be
checked before each run, or the run is silently the old model's.

It used to compare only the layers' and the loss's plain attributes and what their code
reads, not the modules and parameters themselves: a submodule swapped, another loss, a
parameter removed or registered in another order (the placeholders are fed by position),
a layer appended all ran the old graph (a stale loss, parameters fed into each other's
places, or errors about internal placeholders). A loss module's own parameter was held as
a constant (no gradient), a loss that is not callable or returns None failed with raw
errors, and a torch tensor that a layer reads crashed the copy kept to compare it.
The oracle is the same model in PyTorch.
"""

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.parallel.pipeline import Pipeline, PipelineError

nn = mg.nn

RNG = np.random.default_rng(1)
X, Y = RNG.normal(size=(6, 4)), RNG.integers(0, 3, size=6)


def mlp() -> nn.Sequential:
    nn.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def torch_params(model: nn.Sequential) -> dict[str, torch.Tensor]:
    """The model's parameters, by name, as torch leaves."""
    return {name: torch.tensor(p.numpy(), requires_grad=True)
            for name, p in model.named_parameters()}


def torch_mlp(model: nn.Sequential, act=torch.tanh) -> tuple[torch.Tensor, dict]:
    """The logits of ``mlp()``'s layers (Linear, act, Linear) on X, in torch."""
    tp = torch_params(model)
    h = act(torch.tensor(X) @ tp["0.weight"].T + tp["0.bias"])
    return h @ tp["2.weight"].T + tp["2.bias"], tp


def check(run, loss: torch.Tensor, tp: dict, model: nn.Sequential) -> None:
    loss.backward()
    assert run.loss == pytest.approx(loss.item(), abs=1e-12)
    for (name, _), g in zip(model.named_parameters(), run.grads, strict=True):
        np.testing.assert_allclose(g, tp[name].grad.numpy(), atol=1e-12, err_msg=name)


def test_submodule_swapped_after_a_run_is_used():
    """``block.act = nn.ReLU()`` in place of Tanh was not seen: the old graph, with Tanh,
    ran again and gave the old model's loss and gradients."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act = nn.Linear(4, 8), nn.Tanh()

        def forward(self, x):
            return self.act(self.fc(x))

    nn.manual_seed(0)
    model = nn.Sequential(Block(), nn.Linear(8, 3))
    pipe = Pipeline(model, nn.CrossEntropyLoss(), stages=[[0], [1]], microbatches=2)
    pipe.run(X, Y)
    model[0].act = nn.ReLU()
    run = pipe.run(X, Y)
    tp = torch_params(model)
    h = torch.relu(torch.tensor(X) @ tp["0.fc.weight"].T + tp["0.fc.bias"])
    loss = torch.nn.functional.cross_entropy(h @ tp["1.weight"].T + tp["1.bias"],
                                             torch.tensor(Y))
    check(run, loss, tp, model)


@pytest.mark.parametrize("recompute", [False, True])
def test_loss_swapped_after_a_run_is_used(recompute):
    """``pipe.loss = DoubleCE()`` (another class, the same attributes) ran the graph of
    the old loss: half the loss and gradients."""

    class DoubleCE(nn.CrossEntropyLoss):
        def forward(self, logits, labels):
            return 2.0 * mg.cross_entropy(logits, labels)

    model = mlp()
    pipe = Pipeline(model, nn.CrossEntropyLoss(), stages=[[0, 1], [2]], microbatches=2,
                    recompute=recompute)
    pipe.run(X, Y)
    pipe.loss = DoubleCE()
    logits, tp = torch_mlp(model)
    check(pipe.run(X, Y), 2.0 * torch.nn.functional.cross_entropy(logits, torch.tensor(Y)),
          tp, model)


def test_parameters_registered_in_another_order_are_fed_by_place():
    """``p = blk.a; del blk.a; blk.a = p`` puts ``a`` after ``b`` in parameters(); the
    old graph was fed by position, ``b``'s values in ``a``'s placeholder and back."""

    class ScaleShift(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = mg.tensor(np.linspace(0.5, 2.0, 8), requires_grad=True)
            self.b = mg.tensor(np.linspace(-1.0, 1.0, 8), requires_grad=True)

        def forward(self, x):
            return x * self.a + self.b

    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), ScaleShift(), nn.Tanh(), nn.Linear(8, 3))
    pipe = Pipeline(model, nn.CrossEntropyLoss(), stages=[[0, 1], [2, 3]], microbatches=2)
    pipe.run(X, Y)
    a = model[1].a
    del model[1].a
    model[1].a = a
    assert [n for n, _ in model.named_parameters()][2:4] == ["1.b", "1.a"]
    run = pipe.run(X, Y)
    tp = torch_params(model)
    h = torch.tensor(X) @ tp["0.weight"].T + tp["0.bias"]
    h = torch.tanh(h * tp["1.a"] + tp["1.b"])
    loss = torch.nn.functional.cross_entropy(h @ tp["3.weight"].T + tp["3.bias"],
                                             torch.tensor(Y))
    check(run, loss, tp, model)


@pytest.mark.parametrize("layer", [0, 2])
def test_parameter_removed_after_a_run_is_used(layer):
    """``lin.bias = None`` after a run fed the remaining parameters into the old
    placeholders: errors about ``stage0/layer0.bias``, a node the user never made."""
    model = mlp()
    pipe = Pipeline(model, nn.CrossEntropyLoss(), stages=[[0, 1], [2]], microbatches=2)
    pipe.run(X, Y)
    model[layer].bias = None
    tp = torch_params(model)
    h = torch.tensor(X) @ tp["0.weight"].T + tp.get("0.bias", 0.0)
    logits = torch.tanh(h) @ tp["2.weight"].T + tp.get("2.bias", 0.0)
    check(pipe.run(X, Y), torch.nn.functional.cross_entropy(logits, torch.tensor(Y)),
          tp, model)


def test_layer_appended_after_a_run_is_refused_clearly():
    """``model.append(layer)`` after a run raised a raw ``KeyError: 3`` from inside the
    library; the stages no longer cover the model, which the error now says."""
    model = mlp()
    pipe = Pipeline(model, nn.CrossEntropyLoss(), stages=[[0, 1], [2]], microbatches=2)
    pipe.run(X, Y)
    model.append(nn.Linear(3, 3))
    with pytest.raises(PipelineError, match=r"4 layers now, its stages \[\[0, 1\], \[2\]\]"):
        pipe.run(X, Y)


@pytest.mark.parametrize("recompute", [False, True])
def test_a_loss_parameter_gets_its_gradient(recompute):
    """A learnable temperature of the loss module was held as a constant of the graph:
    ``Pipeline.backward`` left its ``.grad`` None, where ``loss.backward()`` gives it."""

    class TempCE(nn.Module):
        def __init__(self):
            super().__init__()
            self.temp = mg.tensor(2.0, requires_grad=True)
            self.reduction = "mean"

        def forward(self, logits, labels):
            return mg.cross_entropy(logits * self.temp, labels)

    model, loss = mlp(), TempCE()
    pipe = Pipeline(model, loss, stages=[[0, 1], [2]], microbatches=2, recompute=recompute)
    run = pipe.backward(X, Y)
    logits, tp = torch_mlp(model)
    temp = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(logits * temp, torch.tensor(Y))
    check(run, expected, tp, model)
    assert loss.temp.grad is not None
    assert loss.temp.grad.item() == pytest.approx(temp.grad.item(), abs=1e-12)
    assert run.loss_grads[0] == pytest.approx(temp.grad.item(), abs=1e-12)
    loss.temp = mg.tensor(3.0, requires_grad=True)  # (a new value is fed, not a constant)
    expected = torch.nn.functional.cross_entropy(logits * 3.0, torch.tensor(Y))
    assert pipe.run(X, Y).loss == pytest.approx(expected.item(), abs=1e-12)


def test_a_loss_that_is_not_a_function_or_returns_none_is_refused():
    """``Pipeline(model, loss=3)`` was accepted (then "the loss int has no reduction"),
    and a loss without ``return`` failed with a raw AttributeError about ``None.shape``."""
    with pytest.raises(TypeError, match="the loss must be a function or module"):
        Pipeline(mlp(), 3, stages=[[0, 1], [2]], microbatches=2)

    def no_return(out, labels):
        mg.cross_entropy(out, labels)

    no_return.reduction = "mean"
    pipe = Pipeline(mlp(), no_return, stages=[[0, 1], [2]], microbatches=2)
    with pytest.raises(PipelineError, match="the loss no_return returned NoneType.*return"):
        pipe.run(X, Y)


SCALE = torch.ones(8, dtype=torch.float64, requires_grad=True)  # a torch tensor, as in a
# notebook that checks minigraph against torch


def test_a_torch_tensor_a_layer_reads_is_compared_not_converted():
    """A torch tensor that requires a gradient among what a layer reads made every run
    crash: its copy, kept to see it change, was made with NumPy, which refuses it. It is
    copied by torch now, and a write into it is seen (the graph holds its value)."""

    class Scale(nn.Module):
        def forward(self, x):
            return x * float(SCALE.detach()[0])

    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Scale(), nn.Tanh(), nn.Linear(8, 3))
    pipe = Pipeline(model, nn.CrossEntropyLoss(), stages=[[0, 1], [2, 3]], microbatches=2)
    for scale in (1.0, 3.0):
        with torch.no_grad():
            SCALE[0] = scale
        tp = torch_params(model)
        h = torch.tanh((torch.tensor(X) @ tp["0.weight"].T + tp["0.bias"]) * scale)
        loss = torch.nn.functional.cross_entropy(h @ tp["3.weight"].T + tp["3.bias"],
                                                 torch.tensor(Y))
        check(pipe.run(X, Y), loss, tp, model)
