"""Data parallelism across devices and ranks, pipeline simulation and partitioning, held
to independent oracles (PyTorch, closed forms): the gradients of a model's own
parameters across ranks, and errors told in the user's terms (the function, the
argument, the loss, the row of the batch), one test each.

The MPI test starts ``mpiexec -n 2 python tests/test_parallel_trust3.py SCENARIO OUTDIR``
as ``test_mpi_trust.py`` does: this file is also the program every rank runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import minigraph as mg
import test_distributed
from minigraph import nn
from minigraph.errors import ShapeError
from minigraph.parallel import pipeline as pp
from minigraph.parallel.pipeline import PipelineError
from test_distributed import needs_mpi

HERE = Path(__file__).resolve()


def _linear_problem():
    """A Linear(4, 3) model, a batch of 6 and the loss of ``model.parameters()``."""
    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(6, 4)), rng.integers(0, 3, size=6)
    names = [n for n, _ in model.named_parameters()]

    def loss(ps, xb, yb):
        return nn.CrossEntropyLoss()(nn.functional_call(model, dict(zip(names, ps)), xb), yb)

    return model, loss, x, y


def _torch_grads(model, x, y):
    """torch's gradient of the batch's mean cross-entropy (the oracle). (torch is
    imported here: the ranks, which do not need it, would take seconds to import it.)"""
    import torch

    w = torch.tensor(model[0].weight.numpy(), requires_grad=True)
    b = torch.tensor(model[0].bias.numpy(), requires_grad=True)
    torch.nn.functional.cross_entropy(torch.tensor(x) @ w.T + b, torch.tensor(y)).backward()
    return [w.grad.numpy(), b.grad.numpy()]


def test_across_ranks_takes_a_models_own_parameters():
    """data_parallel_grads_across_ranks(loss, model.parameters(), x, y) raised "the
    collectives of mg.distributed have no derivative: t requires a gradient", of an
    internal tensor: grad's results of parameters that require a gradient are on the
    tape, and they went to all_reduce as they were. Oracle: torch (a world of one)."""
    model, loss, x, y = _linear_problem()
    expected = _torch_grads(model, x, y)
    got = mg.parallel.data_parallel_grads_across_ranks(loss, model.parameters(), x, y)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.numpy(), e, atol=1e-12)


@needs_mpi
def test_across_two_ranks_takes_a_models_own_parameters(tmp_path, monkeypatch):
    """The same on two ranks, each computing its half of the batch: every rank gets
    torch's gradient of the whole batch."""
    monkeypatch.setattr(test_distributed, "HERE", HERE)
    ranks = test_distributed.launch("model_parameters", tmp_path, limit=60.0)
    model, _, x, y = _linear_problem()
    expected = _torch_grads(model, x, y)
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    for r in ranks:
        assert "error" not in r, r
        for g, e in zip(r["grads"], expected):
            np.testing.assert_allclose(np.array(g), e, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", None])
def test_data_parallel_grads_names_the_batch_row_of_a_bad_label(reduction):
    """A label 7 of 3 classes at row 5 of the batch was reported as "label 7 (row 1)" of
    an nll_loss on the share's shape (4, 3) on cpu:1: the row of the share, not the
    user's. With loss.reduction unset the loss is first read on pairs of shares, where
    the rows must be counted in the batch too. Oracle: the row the test puts it at."""
    mg.set_virtual_cpus(2)
    x, y = np.ones((8, 3)), np.array([0, 1, 2, 0, 1, 7, 0, 1])
    params = [mg.tensor(np.ones((3, 3)))]

    def ce_loss(ps, xb, yb):
        return mg.cross_entropy(xb @ ps[0], yb)

    if reduction is not None:
        ce_loss.reduction = reduction
    with pytest.raises(IndexError, match=r"^data_parallel_grads: the loss ce_loss failed on "
                                         r"the share of rows 4\.\.7 of the batch.*"
                                         r"label 7 \(row 5\)"):
        mg.parallel.data_parallel_grads(ce_loss, params, x, y, ["cpu", "cpu:1"])
    with pytest.raises(IndexError, match=r"^data_parallel_grads_across_ranks: the loss "
                                         r"ce_loss .*label 7 \(row 5\)"):
        mg.parallel.data_parallel_grads_across_ranks(ce_loss, params, x, y)


def test_data_parallel_grads_names_a_loss_that_returns_no_scalar():
    """A loss returning a vector was refused as "grad: f must return a scalar" (the user
    called neither grad nor anything named f), and one returning None failed in the
    library's own `loss(...) * scale` with Python's TypeError about 'NoneType' * float."""
    mg.set_virtual_cpus(2)
    x, y = np.ones((8, 3)), np.zeros(8, dtype=np.int64)
    params = [mg.tensor(np.ones((3, 3)))]

    def vec_loss(ps, xb, yb):
        return xb @ ps[0]

    def none_loss(ps, xb, yb):
        return None

    for f in (vec_loss, none_loss):
        f.reduction = "mean"  # (the grad path: no reading of the loss on pairs of shares)
    with pytest.raises(ValueError, match=r"^data_parallel_grads: the loss vec_loss must "
                                         r"return a scalar, it returned shape \(4, 3\)"):
        mg.parallel.data_parallel_grads(vec_loss, params, x, y, ["cpu", "cpu:1"])
    with pytest.raises(TypeError, match=r"^data_parallel_grads: the loss none_loss must "
                                        r"return a scalar tensor.*it returned None"):
        mg.parallel.data_parallel_grads(none_loss, params, x, y, ["cpu", "cpu:1"])


def test_gather_checks_its_parts_where_they_are():
    """gather's parts of shapes (3, 2) and (1,) failed as `concatenate`, with both parts
    said to be "on cpu" (the copies' device: one was on cpu:1); and a single tensor was
    taken for its rows, which were joined: a (3, 2) tensor came back flattened to (6,),
    silently. Oracle: NumPy's concatenate of the parts."""
    mg.set_virtual_cpus(2)
    a, b = np.arange(6.0).reshape(3, 2), np.arange(4.0).reshape(2, 2)
    got = mg.parallel.gather([mg.tensor(a), mg.tensor(b, device="cpu:1")], "cpu:1")
    assert got.device.name == "cpu:1"
    np.testing.assert_array_equal(got.numpy(), np.concatenate([a, b]))
    with pytest.raises(ShapeError, match=r"^gather: .*\(3, 2\) on cpu, \(1,\) on cpu:1"):
        mg.parallel.gather([mg.tensor(a), mg.tensor([1.0], device="cpu:1")], "cpu")
    with pytest.raises(TypeError, match=r"^gather: xs is a list of parts.*write \[x\]"):
        mg.parallel.gather(mg.tensor(a), "cpu")


def test_pipeline_planning_names_the_function_and_the_argument():
    """Wrong costs and schedules failed with Python's own words, naming neither the
    function nor the argument: "'NoneType' object is not iterable", "could not convert
    string to float: 'ab'" (and a string of digits was read as a number), "float()
    argument must be a string or a real number", "'>' not supported". NumPy's numbers
    and 0-d arrays are still costs. Oracles: 1F1B with uniform stages takes
    (m + p - 1)(f + b); [1, 2, 3] cut in two is [0, 1], [2]."""
    s = pp.schedule("1f1b", stages=2, microbatches=4)
    profile = [pp.LayerCost("node0", "Linear", 1.0, 1.0, 8, 8)]
    for call, message in [
            (lambda: pp.simulate(None), r"^simulate: sched is a Schedule"),
            (lambda: pp.simulate([1, 2]), r"^simulate: sched is a Schedule"),
            (lambda: pp.simulate(s, forward="ab"), r"^simulate: forward is 'ab'"),
            (lambda: pp.simulate(s, backward=[1.0, None]), r"^simulate: backward\[1\] is None"),
            (lambda: pp.simulate(s, forward=[1.0, [2.0]]), r"^simulate: forward\[1\] is \["),
            (lambda: pp.partition("abc", 2), r"^partition: costs is a Profile.*got 'abc'"),
            (lambda: pp.partition(None, 2), r"^partition: costs is a Profile.*got None"),
            (lambda: pp.partition([1.0, None, 2.0], 2), r"^partition: the cost of layer 1"),
            (lambda: pp.stage_times([1.0, "2"], [[0, 1]]), r"^stage_times: the cost of layer 1"),
            (lambda: pp.partition_pipedream(None, 2, 1e9), r"^partition_pipedream: needs a"),
            (lambda: pp.partition_pipedream(profile, 2, "fast"), r"^partition_pipedream: band")]:
        with pytest.raises(PipelineError, match=message):
            call()
    sim = pp.simulate(s, forward=np.array(2.0), backward=np.float32(1.0), comm=(0,))
    assert sim.makespan == (4 + 2 - 1) * (2.0 + 1.0)
    assert pp.partition(np.array([1.0, 2.0, 3.0]), 2) == [[0, 1], [2]]


# -- the scenario: what each rank runs under mpiexec -----------------------------------------

def scenario_model_parameters(out: dict) -> None:
    model, loss, x, y = _linear_problem()
    try:
        grads = mg.parallel.data_parallel_grads_across_ranks(loss, model.parameters(), x, y)
        out["grads"] = [g.numpy().tolist() for g in grads]
    except Exception as exc:  # noqa: BLE001 - the test shows it
        out["error"] = f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    test_distributed.run_scenario(globals())


def test_devices_and_costs_are_taken_as_numpy_and_python_give_them():
    """A NumPy array of device names raised NumPy's "truth value of an array is
    ambiguous" in scatter, and a generator of them was read up by scatter before
    data_parallel_grads replicated the parameters; a cost given as a 0-d torch tensor or
    a Decimal, which float() reads, was refused. Oracles: the closed-form partition of
    [1, 2, 3] into two stages, and the gradient of mean(x @ w) on one device."""
    import decimal

    import torch

    from minigraph.parallel import data_parallel as dp
    from minigraph.parallel import pipeline as pp

    x = mg.tensor(np.arange(8.0).reshape(4, 2))
    parts = mg.parallel.scatter(x, np.array(["cpu", "cpu:1"]))
    assert [p.device.name for p in parts] == ["cpu", "cpu:1"]
    w = mg.tensor(np.ones((2, 1)), requires_grad=True)

    def loss(ps, xb, yb):
        return mg.mean(xb @ ps[0])

    grads = dp.data_parallel_grads(loss, [w], x, mg.tensor(np.zeros(4)),
                                   (d for d in ["cpu", "cpu:1"]))
    np.testing.assert_allclose(grads[1][0].numpy(), x.numpy().mean(0)[:, None], rtol=1e-12)
    assert pp.partition([torch.tensor(1.0), decimal.Decimal("2"), np.float32(3)], 2) == \
        [[0, 1], [2]]
    for bad in (np.array(True), torch.tensor(True), torch.tensor([2.0])):  # (no number)
        with pytest.raises(PipelineError, match="a cost is a number"):
            pp.partition([bad, 1.0], 1)
