"""Pipeline: a tensor that requires a gradient must not be cut off silently, and a run must
cost time linear in the depth of the model.

A tensor that requires a gradient and that the loss or a layer reads from outside its
arguments (a global, a plain attribute, another layer's weight) was held as a constant of
the pipeline's graph: its ``.grad`` stayed None after ``Pipeline.backward``, where torch
gives it one. It is refused now, naming it and the function that reads it.

Every node of a stage's op had the previous op's last nodes (one accumulated gradient per
parameter among them) as control inputs, so the edges grew as nodes times parameters,
and each ``Session.run`` of a partitioned graph walked them anew to order each device's
part: quadratic in depth. The oracles are PyTorch, NumPy and counts of edges and calls.
"""

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.parallel.pipeline import Pipeline, PipelineError
from minigraph.runtime import session as session_module

nn = mg.nn

RNG = np.random.default_rng(2)
X, Y = RNG.normal(size=(8, 4)), RNG.integers(0, 3, size=8)


def mlp() -> nn.Sequential:
    nn.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


TEMP = mg.tensor(2.0, requires_grad=True)  # a learnable temperature, read by the loss


def tempered_loss(logits, labels):
    return mg.cross_entropy(logits * TEMP, labels)


tempered_loss.reduction = "mean"


def test_outside_tensor_read_by_the_loss_is_refused():
    """The loss read TEMP, a global that requires a gradient: Pipeline.backward left its
    .grad None (torch: the gradient below, not zero)."""
    tt = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    model = mlp()
    w = {n: torch.tensor(p.numpy()) for n, p in model.named_parameters()}
    h = torch.tanh(torch.tensor(X) @ w["0.weight"].T + w["0.bias"]) @ w["2.weight"].T
    torch.nn.functional.cross_entropy((h + w["2.bias"]) * tt, torch.tensor(Y)).backward()
    assert abs(tt.grad.item()) > 1e-3  # (a gradient to lose)
    pipe = Pipeline(model, tempered_loss, stages=[[0, 1], [2]], microbatches=2)
    with pytest.raises(PipelineError, match=r"the loss tempered_loss reads TEMP.*requires "
                                            r"a gradient.*parameter of a layer or of a loss"):
        pipe.backward(X, Y)
    assert TEMP.grad is None


SCALE = mg.tensor(1.5, requires_grad=True)
SCALES = {"scale": mg.tensor(1.5, requires_grad=True)}


def scaled(where: str) -> nn.Module:
    """A layer ``h * scale``, its scale a global, a dict's item or a closure variable."""
    scale = mg.tensor(1.5, requires_grad=True)
    forwards = {"global": lambda h: h * SCALE, "item": lambda h: h * SCALES["scale"],
                "closure": lambda h: h * scale}

    class Scaled(nn.Module):
        def forward(self, h):
            return forwards[where](h)

    return Scaled()


@pytest.mark.parametrize("where, name", [("global", "SCALE"), ("item", "an item of SCALES"),
                                         ("closure", "scale")])
def test_outside_tensor_read_by_a_layer_is_refused(where, name):
    """A layer's forward read a tensor that requires a gradient from a global, a dict or a
    closure: held as a constant, its .grad stayed None."""
    model = mlp()
    model = nn.Sequential(model[0], scaled(where), model[1], model[2])
    pipe = Pipeline(model, nn.CrossEntropyLoss(), stages=[[0, 1], [2, 3]], microbatches=2)
    with pytest.raises(PipelineError, match=rf"the forward of layer 1, a Scaled, reads "
                                            rf"{name}, a tensor of shape \(\)"):
        pipe.backward(X, Y)
    assert SCALE.grad is None and SCALES["scale"].grad is None


def test_requires_grad_set_after_the_graph_was_built_is_refused():
    """The graph was built while ``temp`` did not require a gradient (right: a
    constant); after ``temp.requires_grad_()`` the same graph ran again and gave it
    none."""
    temp = mg.tensor(0.5)

    def loss(logits, labels):
        return mg.cross_entropy(logits * temp, labels)

    loss.reduction = "mean"
    model = mlp()
    pipe = Pipeline(model, loss, stages=[[0], [1, 2]], microbatches=4)
    w = {n: torch.tensor(p.numpy()) for n, p in model.named_parameters()}
    h = torch.tanh(torch.tensor(X) @ w["0.weight"].T + w["0.bias"]) @ w["2.weight"].T
    expected = torch.nn.functional.cross_entropy((h + w["2.bias"]) * 0.5, torch.tensor(Y))
    assert pipe.run(X, Y).loss == pytest.approx(expected.item(), abs=1e-12)
    temp.requires_grad_()
    with pytest.raises(PipelineError, match=r"reads temp, .*requires a gradient"):
        pipe.backward(X, Y)
    assert temp.grad is None


def test_another_layers_weight_is_refused():
    """A decoder tied to layer 0's weight (``h @ W``) read it as a constant: the
    decoder's share of its gradient was lost. A penalty ``(W ** 2).sum()`` computed
    eagerly in the loss was a constant too: its gradient never reached W."""
    model = mlp()
    encoder = model[0]

    class Tied(nn.Module):
        def forward(self, h):
            return h @ encoder.weight  # (6, 4): back to 4 features

    tied = nn.Sequential(encoder, nn.Tanh(), Tied(), nn.Linear(4, 3))
    pipe = Pipeline(tied, nn.CrossEntropyLoss(), stages=[[0, 1], [2, 3]], microbatches=2)
    with pytest.raises(PipelineError, match=r"layer 2, a Tied, reads weight.*layer 0's "
                                            r"parameter 0\.weight.*not supported"):
        pipe.backward(X, Y)

    def penalised(logits, labels):
        return mg.cross_entropy(logits, labels) + 0.1 * (model[0].weight ** 2).sum()

    penalised.reduction = "mean"
    pipe = Pipeline(model, penalised, stages=[[0, 1], [2]], microbatches=2)
    with pytest.raises(PipelineError, match=r"uses a tensor of shape \(\) .*computed "
                                            r"eagerly"):
        pipe.backward(X, Y)
    assert all(p.grad is None for p in model.parameters())


def graph_of(pipe: Pipeline) -> mg.Graph:
    """The graph the pipeline built for its one minibatch shape (the plan's session's)."""
    (plan,) = [built[2] for built in pipe._plans.values()]
    return plan.session.graph


def test_control_edges_grow_linearly_with_depth():
    """Each node of an op had every last node of the op before as a control input: at 16
    and 64 layers, 1658 and 23498 control edges (14x for 4x the layers). Each op now
    waits for the one barrier of the op before; the gradients and the schedule's order
    stay those of torch and of the 1F1B schedule."""
    counts = {}
    for n in (16, 64):
        nn.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(n)])
        pipe = Pipeline(model, nn.CrossEntropyLoss(),
                        stages=[list(range(n // 2)), list(range(n // 2, n))], microbatches=2)
        run = pipe.run(X[:, :2], Y % 2)
        g = graph_of(pipe)
        counts[n] = sum(len(node.control_inputs) for node in g.nodes)
        assert counts[n] < len(g.nodes)  # (one per node of an op, and the barriers')
        assert run.order == [list(ops) for ops in pipe.schedule.ops]
    assert counts[64] / counts[16] < 4.5
    # the 64-layer model in torch
    tp = [(torch.tensor(m.weight.numpy(), requires_grad=True),
           torch.tensor(m.bias.numpy(), requires_grad=True)) for m in model]
    h = torch.tensor(X[:, :2])
    for w, b in tp:
        h = h @ w.T + b
    loss = torch.nn.functional.cross_entropy(h, torch.tensor(Y % 2))
    loss.backward()
    assert run.loss == pytest.approx(loss.item(), abs=1e-12)
    expected = [t.grad.numpy() for pair in tp for t in pair]
    for got, want in zip(run.grads, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_partitioned_run_orders_each_part_once(monkeypatch):
    """``Session.run`` of a graph across devices ordered each device's part (a walk over
    all its edges) on every run, though the partition is cached: now once per partition.
    The values stay NumPy's, also for a partition made after the graph grew."""
    calls = []
    fifo_order = session_module.fifo_order
    monkeypatch.setattr(session_module, "fifo_order",
                        lambda *args: calls.append(1) or fifo_order(*args))
    a = RNG.normal(size=(3, 3))
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3, 3), name="x")
        with mg.device("cpu:1"):
            b = mg.sin(x.to("cpu:1")) * 2.0
        d = mg.tanh(x @ x) + b.to("cpu")
    sess = mg.Session(g)
    for _ in range(3):
        np.testing.assert_allclose(sess.run(d, {x: a}), np.tanh(a @ a) + 2 * np.sin(a),
                                   rtol=1e-12)
    assert len(calls) == 3  # (the whole plan's, then each part's, at the first run alone)
    with g, mg.device("cpu:1"):
        e = mg.exp(d.to("cpu:1"))
    for _ in range(2):
        np.testing.assert_allclose(sess.run(e, {x: a}), np.exp(np.tanh(a @ a) + 2 * np.sin(a)),
                                   rtol=1e-12)
    assert len(calls) == 6
