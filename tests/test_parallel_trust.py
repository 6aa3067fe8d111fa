"""Data, model and pipeline parallelism held to independent oracles (PyTorch, NumPy,
closed forms): the bugs found in them, one test each."""

import time

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.errors import DTypeError, ShapeError
from minigraph import nn
from minigraph.parallel import LayerSplitMLP, cost_model
from minigraph.parallel import pipeline as pp
from minigraph.parallel.pipeline import PipelineError


def _torch_ce_grad(z, y, reduction="mean"):
    tz = torch.tensor(z, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(tz, torch.tensor(y), reduction=reduction)
    loss.backward()
    return loss.item(), tz.grad.numpy()


def test_parallel_cross_entropy_with_a_minus_inf_logit_is_finite():
    """A -inf logit (a masked class) made the loss nan: the label's logit was picked by
    multiplying the shard with a one-hot row, and -inf * 0 is nan."""
    z = np.array([[1.0, -np.inf, 2.0, 0.5], [0.0, 3.0, -np.inf, 1.0]])
    y = np.array([0, 1])
    want, want_grad = _torch_ce_grad(z, y)
    for cuts in ([4], [2, 2], [1, 3]):
        bounds = np.cumsum([0] + cuts)
        shards = [mg.tensor(z[:, a:b], device="cpu" if k == 0 else f"cpu:{k}",
                            requires_grad=True)
                  for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        loss = mg.parallel.parallel_cross_entropy(shards, y)
        loss.backward()
        assert np.isclose(loss.item(), want)
        grad = np.concatenate([s.grad.numpy() for s in shards], axis=1)
        np.testing.assert_allclose(grad, want_grad, atol=1e-12)


def test_parallel_cross_entropy_refuses_labels_of_another_shape_or_dtype():
    """Labels of shape (1,) or () broadcast over every row, and bool labels were taken
    for classes 0 and 1, where torch and mg.cross_entropy refuse all three; in graph
    mode too."""
    z = np.random.default_rng(0).normal(size=(4, 5))
    shards = [mg.tensor(z[:, :2]), mg.tensor(z[:, 2:], device="cpu:1")]
    for labels in ([4], 4, [0, 1, 2, 3, 4]):
        with pytest.raises(ShapeError, match=r"parallel_cross_entropy: labels must have "
                                                r"shape \(N,\) = \(4,\)"):
            mg.parallel.parallel_cross_entropy(shards, labels)
    with pytest.raises(TypeError, match="parallel_cross_entropy: labels must be integers, "
                                        "got dtype bool"):
        mg.parallel.parallel_cross_entropy(shards, [True, False, True, True])
    with mg.Graph():
        a = mg.placeholder((4, 2), "float64")
        with mg.device("cpu:1"):
            b = mg.placeholder((4, 3), "float64")
        with pytest.raises(ShapeError, match=r"got shape \(1,\)"):
            mg.parallel.parallel_cross_entropy([a, b], mg.placeholder((1,), "int64"))


def test_pipeline_first_stage_without_parameters_keeps_its_backwards_in_order():
    """A first stage without parameters builds no node for its backwards, so they were
    missing from run.order, and peak_activations said the stage held every microbatch
    (4) where 1F1B holds min(p - s, m) = 2."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 4)), rng.integers(0, 3, 8)
    model = nn.Sequential(nn.Tanh(), nn.Linear(4, 3, seed=1))
    run = pp.Pipeline(model, nn.CrossEntropyLoss(), [[0], [1]], None, "1f1b", 4).run(x, y)
    assert run.order == list(pp.schedule("1f1b", 2, 4))
    assert run.peak_activations == [2, 1]  # min(p - s, m)
    # and the gradients are still torch's
    tx = torch.tensor(x)
    tw = torch.tensor(model[1].weight.numpy(), requires_grad=True)
    tb = torch.tensor(model[1].bias.numpy(), requires_grad=True)
    torch.nn.functional.cross_entropy(torch.nn.functional.linear(torch.tanh(tx), tw, tb),
                                      torch.tensor(y)).backward()
    np.testing.assert_allclose(run.grads[0], tw.grad.numpy(), atol=1e-12)


def test_pipeline_refuses_a_loss_that_is_not_a_scalar_before_running():
    """A loss of per-example values ran the whole pipeline (its backward seeded with
    ones) and then failed in NumPy ('only 0-dimensional arrays ...')."""
    rng = np.random.default_rng(0)
    x, t = rng.normal(size=(6, 4)), rng.normal(size=(6, 3))

    def per_example(out, y):
        return mg.sum((out - y) ** 2, axis=1)
    per_example.reduction = "sum"
    model = nn.Sequential(nn.Linear(4, 5, seed=1), nn.Tanh(), nn.Linear(5, 3, seed=2))
    pipe = pp.Pipeline(model, per_example, [[0, 1], [2]], None, "1f1b", 2)
    with pytest.raises(PipelineError, match=r"the loss per_example must return a scalar.*"
                                            r"shape \(3,\)"):
        pipe.run(x, t)


def test_a_schedule_without_microbatches_is_refused():
    """A hand-made schedule of no ops passed as one of 0 microbatches (pp.schedule
    refuses 0); Pipeline.run then divided by zero."""
    with pytest.raises(PipelineError, match="at least one microbatch"):
        pp.simulate([[], []])
    model = nn.Sequential(nn.Linear(4, 5, seed=1), nn.Tanh(), nn.Linear(5, 3, seed=2))
    with pytest.raises(PipelineError, match="at least one microbatch"):
        pp.Pipeline(model, nn.CrossEntropyLoss(), [[0, 1], [2]], schedule=[[], []])


def test_data_parallel_grads_of_a_sum_loss_is_the_sum_gradient():
    """Every share's loss was weighted by n_k / N, right only for a mean: a sum loss got
    its gradient divided by the number of devices (unevenly), without a word."""
    rng = np.random.default_rng(0)
    x, y, w = rng.normal(size=(7, 3)), rng.integers(0, 2, 7), rng.normal(size=(3, 2))
    tw = torch.tensor(w, requires_grad=True)
    torch.nn.functional.cross_entropy(torch.tensor(x) @ tw, torch.tensor(y),
                                      reduction="sum").backward()
    ce_sum = nn.CrossEntropyLoss(reduction="sum")
    told = lambda p, a, b: ce_sum(a @ p[0], b)  # noqa: E731
    told.reduction = "sum"
    for loss in (lambda p, a, b: ce_sum(a @ p[0], b), told):  # found out, or told
        grads = mg.parallel.data_parallel_grads(loss, [mg.tensor(w)], x, y,
                                                ["cpu", "cpu:1", "cpu:2"])
        for per_device in grads:
            np.testing.assert_allclose(per_device[0].numpy(), tw.grad.numpy(), atol=1e-12)
    # a sum plus a penalty on the weights, which every share would add once: refused
    penalised = lambda p, a, b: ce_sum(a @ p[0], b) + mg.sum(p[0] ** 2)  # noqa: E731
    with pytest.raises(ValueError, match="data_parallel_grads: the loss's reduction is "
                                         "neither"):
        mg.parallel.data_parallel_grads(penalised, [mg.tensor(w)], x, y, ["cpu", "cpu:1"])


def test_scatter_and_replicate_take_graph_nodes():
    """scatter and replicate refused graph nodes (tensor(x) of a node), though a slice
    and .to() work on nodes, and allreduce and gather take them."""
    x_value = np.arange(18.0).reshape(6, 3)
    with mg.Graph() as g:
        x = mg.placeholder((6, 3), "float64", name="x")
        parts = mg.parallel.scatter(x, ["cpu", "cpu:1", "cpu:2"])
        copies = mg.parallel.replicate([x], ["cpu", "cpu:1"])
    assert [p.device.name for p in parts] == ["cpu", "cpu:1", "cpu:2"]
    got = mg.Session(g).run(parts + [c[0] for c in copies], {x: x_value})
    for k in range(3):
        np.testing.assert_array_equal(got[k], x_value[2 * k:2 * k + 2])
    np.testing.assert_array_equal(got[3], x_value)
    np.testing.assert_array_equal(got[4], x_value)


def test_across_ranks_takes_lists_and_shard_refuses_ranks_outside_the_world():
    """data_parallel_grads_across_ranks read x.shape of a list (AttributeError); shard
    gave a rank outside 0..world-1 an empty share, and world=0 divided by zero."""
    x, y = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [0, 1, 1]
    w = np.full((2, 2), 0.1)
    got = mg.parallel.data_parallel_grads_across_ranks(
        lambda p, a, b: mg.cross_entropy(a @ p[0], b), [mg.tensor(w)], x, y)
    tw = torch.tensor(w, requires_grad=True)
    torch.nn.functional.cross_entropy(torch.tensor(x, dtype=torch.float64) @ tw,
                                      torch.tensor(y)).backward()
    np.testing.assert_allclose(got[0].numpy(), tw.grad.numpy(), atol=1e-12)
    rows = np.arange(12.0).reshape(6, 2)
    for rank, world in ((2, 2), (5, 2), (-1, 2)):
        with pytest.raises(ValueError, match=f"shard: rank must be an int in 0..1 for a "
                                             f"world of 2, got {rank}"):
            mg.parallel.shard(rows, rank, world)
    with pytest.raises(ValueError, match="shard: world must be an int >= 1"):
        mg.parallel.shard(rows, 0, 0)
    np.testing.assert_array_equal(mg.parallel.shard(rows, 1, 2).numpy(), rows[3:])


def test_nodes_of_unknown_shape_are_refused_by_name():
    """Placeholders of unknown shape gave Python's "'NoneType' object is not iterable"
    in allreduce(..., "naive") and parallel_cross_entropy."""
    with mg.Graph():
        a = mg.placeholder(None, "float64", name="a")
        with mg.device("cpu:1"):
            b = mg.placeholder(None, "float64", name="b")
        for algorithm in ("naive", "ring", "parameter_server"):
            with pytest.raises(ShapeError, match=r"allreduce: tensors\[0\] is a graph "
                                                    r"node of a shape unknown"):
                mg.parallel.allreduce([a, b], algorithm)
        with pytest.raises(ShapeError, match=r"parallel_cross_entropy: shards\[0\] has "
                                                r"a shape unknown"):
            mg.parallel.parallel_cross_entropy([a, b], [0, 1])


def test_layer_split_mlp_refuses_integer_dtypes_and_bad_sizes():
    """dtype="int64" built a graph whose gradients were None (step() then failed to
    fetch a NoneType); a negative size got NumPy's 'negative dimensions'."""
    with pytest.raises(DTypeError, match="LayerSplitMLP: dtype must be float32 or "
                                            "float64.*'int64'"):
        LayerSplitMLP([4, 3], ["cpu", "cpu:1"], 2, dtype="int64")
    with pytest.raises(ValueError, match=r"LayerSplitMLP: sizes must be ints >= 1.*"
                                         r"\[4, -1, 3\]"):
        LayerSplitMLP([4, -1, 3], ["cpu", "cpu:1"], 2)


def test_schedule_validation_is_linear_in_microbatches():
    """The check that each B follows its F called ops.index per microbatch: O(m^2) per
    stage (m = 5000 took seconds; a pass that records positions takes milliseconds)."""
    sched = pp.schedule("gpipe", 1, 5000)
    start = time.perf_counter()
    pp.simulate(sched)
    assert time.perf_counter() - start < 1.0
    with pytest.raises(PipelineError, match="runs a backward before its forward"):
        pp.simulate([[("B", 0), ("F", 0)]])


def test_small_arguments_are_refused_by_name():
    """A device name for a device list, no tensors, counts out of range or of the wrong
    type: each raised a Python error or gave a wrong value without a word."""
    with pytest.raises(TypeError, match="scatter: devices is a list of device names"):
        mg.parallel.scatter(np.ones((3, 2)), "cpu")
    with pytest.raises(ValueError, match="allreduce: no tensors"):
        mg.parallel.allreduce([])
    with pytest.raises(PipelineError, match="stage_times: layer 5"):
        pp.stage_times([1.0, 2.0, 3.0], [[0, 1], [2, 5]])
    with pytest.raises(PipelineError, match="bubble_closed_form: microbatches"):
        pp.bubble_closed_form(1, 0)
    with pytest.raises(PipelineError, match="schedule: microbatches must be an int >= 1, "
                                            "got True"):
        pp.schedule("gpipe", 2, True)
    with pytest.raises(ValueError, match="bytes_sent: elements must be an int >= 0"):
        cost_model.bytes_sent("ring", -5, 2)
    # NumPy's ints are counts too
    assert pp.schedule("1f1b", np.int64(2), np.int64(3)) == pp.schedule("1f1b", 2, 3)
    assert pp.partition([1.0, 2.0, 3.0], np.int64(2)) == pp.partition([1.0, 2.0, 3.0], 2)
