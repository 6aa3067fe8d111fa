"""parallel_cross_entropy refuses a label of no class on every path of a graph.

In a graph the labels are checked when it runs, by the ``one_hot`` of each shard. Only
the first shard's refused a negative label and only the last shard's a label past the
last class, so a gradient of another shard's logits, which does not read that node, had
it pruned away: the bad row's gradient was the softmax alone, as if its label matched no
class. PyTorch's cross_entropy on the concatenated logits is the oracle: it refuses the
label, and for good labels gives the loss and gradients.
"""

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.errors import ShapeError
from minigraph.parallel import parallel_cross_entropy
from minigraph.runtime.scheduler import NodeError

WIDTHS = (3, 2, 2)  # classes of the shards, 7 in all
DEVICES = ("cpu", "cpu:1", "cpu:2")
LOGITS = np.random.default_rng(0).normal(size=(4, sum(WIDTHS)))


def _shards(n: int) -> list:
    """The first ``n`` shards of LOGITS as tensors, each on its own device."""
    bounds = np.cumsum((0,) + WIDTHS[:n])
    return [mg.tensor(LOGITS[:, lo:hi], device=d)
            for lo, hi, d in zip(bounds[:-1], bounds[1:], DEVICES)]


def _torch_refuses(logits: np.ndarray, labels: list) -> None:
    """The oracle's verdict on ``labels``: torch must refuse them too."""
    with pytest.raises(IndexError, match="out of bounds"):
        torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels))


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("bad", [-1, 7, 9])
def test_graph_gradient_of_any_one_shard_refuses_a_label_of_no_class(n, bad):
    """mg.grad(mode="graph") of one shard returned a gradient for a label < 0 or >= C
    unless that shard was the first (negative) or the last (too large); the middle shard
    of three refused neither. Good labels still give torch's gradient, shard by shard."""
    shards = _shards(n)
    classes = sum(WIDTHS[:n])
    logits = LOGITS[:, :classes]
    good = [0, classes - 1, 2, 3]
    z = torch.tensor(logits, requires_grad=True)
    torch.nn.functional.cross_entropy(z, torch.tensor(good)).backward()
    expected = np.split(z.grad.numpy(), np.cumsum(WIDTHS[:n - 1]), axis=1)

    def f(*args):
        return parallel_cross_entropy(list(args[:-1]), args[-1])

    labels = [0, bad, 1, 2]
    _torch_refuses(logits, labels)
    for k in range(n):
        g = mg.grad(f, argnums=k, mode="graph")
        np.testing.assert_allclose(g(*shards, mg.tensor(good)).numpy(), expected[k],
                                   rtol=1e-12, atol=1e-15)
        with pytest.raises(NodeError, match=rf"label {bad} \(row 1\) is out of range"):
            g(*shards, mg.tensor(labels))


def test_session_fetching_one_shards_gradient_refuses_a_label_of_no_class():
    """A hand-built graph fetching only mg.gradients(loss, [shard]) ran for label 9 of
    7 classes (or -1) and returned a gradient; it raises now, for every shard."""
    with mg.Graph() as g:
        shards = []
        for w, d in zip(WIDTHS, DEVICES):
            with mg.device(d):
                shards.append(mg.placeholder((4, w), name=f"z{len(shards)}"))
        y = mg.placeholder((4,), "int64", name="y")
        grads = mg.gradients(parallel_cross_entropy(shards, y), shards)
    feeds = {p: t.numpy() for p, t in zip(shards, _shards(3))}
    sess = mg.Session(g)
    for bad in (9, -1):
        _torch_refuses(LOGITS, [0, bad, 1, 2])
        for grad in grads:
            with pytest.raises(NodeError, match=rf"label {bad} \(row 1\) is out of range"):
                sess.run(grad, {**feeds, y: np.array([0, bad, 1, 2])})


def test_labels_of_unknown_shape_are_refused_by_name():
    """A labels placeholder of unknown shape failed inside, in one_hot, with "labels
    must be integers, got dtype None" for int64 labels; the check names the labels."""
    with mg.Graph():
        a = mg.placeholder((4, 3), "float64")
        with mg.device("cpu:1"):
            b = mg.placeholder((4, 2), "float64")
        with pytest.raises(ShapeError, match=r"parallel_cross_entropy: labels must have "
                                             r"shape \(N,\) = \(4,\), one class per example, "
                                             r"got a shape unknown until the graph runs"):
            parallel_cross_entropy([a, b], mg.placeholder(dtype="int64"))
