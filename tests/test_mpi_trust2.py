"""``run_async`` keeps the feeds' values of its call; runs across MPI ranks keep the
layout of the values they send, refuse an MPI without thread support, and hand the one
thread that makes them on once it ended.

As ``test_mpi_trust.py`` does, the MPI tests start ``mpiexec -n 2 python
tests/test_mpi_trust2.py SCENARIO OUTDIR`` (``test_distributed.launch``, pointed at this
file), and each rank writes what it saw to ``OUTDIR/rank-R.json``; the ranks import the
minigraph this process imported. Oracles: NumPy on the same expression (bit for bit),
closed forms (z = 2x + 1), and MPI's own thread level.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import test_distributed
from test_distributed import needs_mpi

HERE = Path(__file__).resolve()


def launch(scenario: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """``test_distributed.launch`` with this file as the program every rank runs, and
    the ranks importing the minigraph that this process imported."""
    import minigraph

    package_root = str(Path(minigraph.__file__).resolve().parent.parent)
    monkeypatch.setattr(test_distributed, "HERE", HERE)
    monkeypatch.setitem(test_distributed.ENV, "PYTHONPATH", package_root)
    return test_distributed.launch(scenario, tmp_path, limit=30.0)


# -- in this process (no MPI needed) --------------------------------------------------------

@pytest.mark.parametrize("kind", ["list", "list of arrays", "torch"])
def test_run_async_takes_a_fed_list_or_torch_tensor_at_the_call(kind):
    """run_async copied only NumPy arrays, array-API arrays and mg.Tensors: a fed Python
    list, a list of arrays, or a PyTorch tensor (which NumPy reads in place) was kept
    by reference, so a write into it after the call changed the queued run's result.
    The background thread is held by a first run until the write is done. Oracle: the
    closed form y = 2x of the value at the call."""
    import minigraph as mg
    from minigraph.ops.primitive import Primitive
    from minigraph.ops.shape_rules import same

    release = threading.Event()

    def wait(xp, a):  # holds the background thread: the second run waits in the queue
        assert release.wait(10.0)
        return a * 1.0

    with mg.Graph() as g:
        gate = mg.placeholder(shape=(), name="gate")
        held = g.add(Primitive("wait", wait, same, vjp=[None]), (gate,), {})
        x = mg.placeholder(shape=(3,), name="x")
        y = x * 2.0
    if kind == "torch":
        torch = pytest.importorskip("torch")
        feed = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    else:
        feed = [1.0, 2.0, 3.0] if kind == "list" else [np.array(v) for v in (1.0, 2.0, 3.0)]
    with mg.Session(g) as sess:
        first = sess.run_async(held, {gate: 1.0})
        second = sess.run_async(y, {x: feed})
        feed[0] = 100.0 if kind != "list of arrays" else np.array(100.0)
        if kind == "list of arrays":
            feed[1][...] = 200.0  # (a write into an array the list holds, too)
        release.set()
        assert first.result(10) == 1.0
        np.testing.assert_array_equal(second.result(10), [2.0, 4.0, 6.0])


def test_run_async_copies_a_feed_keeping_its_layout():
    """run_async's copy of a fed NumPy array was np.array(copy=True), which reads a
    reversed axis forward and fills a broadcast in: a sum of the copy added in another
    order than a sum of the array the caller fed, and the last bits differed from
    ``run``'s. (A PyTorch tensor, which NumPy reads in place, is copied the same way.)
    Oracle: NumPy's sums of the very arrays fed, bit for bit."""
    import minigraph as mg

    data = np.random.default_rng(0).standard_normal((37, 1000))
    fed = {"reversed": data[::-1], "reversed, transposed": data.T[:, ::-1].T,
           "broadcast": np.broadcast_to(data[:, :1], (37, 1000)),
           "transposed": np.ascontiguousarray(data.T).T}
    with mg.Graph() as g:
        x = mg.placeholder(shape=(37, 1000), name="x")
        sums = [mg.sum(x, axis=0), mg.sum(x, axis=1), mg.sum(x)]
    torch = pytest.importorskip("torch")
    fed["torch, transposed"] = torch.from_numpy(np.ascontiguousarray(data.T)).T
    with mg.Session(g) as sess:
        for name, value in fed.items():
            got = sess.run_async(sums, {x: value}).result(10)
            view = np.asarray(value)
            for how, a, b in zip(("axis=0", "axis=1", "all"), got,
                                 (view.sum(axis=0), view.sum(axis=1), view.sum())):
                assert np.array_equal(a, b), f"{name}, sum {how}: {np.max(np.abs(a - b))}"


# -- across two ranks ---------------------------------------------------------------------

@needs_mpi
def test_values_that_cross_ranks_keep_their_layout(tmp_path, monkeypatch):
    """A value sent to another rank was sent as a C-ordered copy, so a transposed or
    reversed value arrived with another layout, and a sum on the receiving rank added in
    another order: the last bits differed from NumPy on the same expression (and from the
    run in one process, whose Send keeps the layout). Oracle: NumPy, bit for bit."""
    r0, r1 = launch("layouts", tmp_path, monkeypatch)
    assert r0["differ"] == r1["differ"] == [], r0["differ"]
    # broadcast(t, root=np.int64(1)) was refused as "root must be a rank in 0..1, got
    # np.int64(1)", and root=True taken as rank 1 (a bool is no rank: refused now)
    for r in (r0, r1):
        assert r["numpy root"] == {"value": [10.0]}, r["numpy root"]
        assert r["bool root"]["type"] == "ValueError", r["bool root"]


@needs_mpi
def test_the_thread_that_runs_across_ranks_is_handed_on_once_it_ended(tmp_path,
                                                                      monkeypatch):
    """The first cross-rank run pinned its thread's ident for the life of the process:
    after a session that ran with run_async was closed (its thread ended), a run from
    any other thread was refused, or not, by chance (idents are reused). And run_async
    on the closed session raised that thread error instead of SessionClosedError."""
    r0, r1 = launch("handed_on", tmp_path, monkeypatch)
    for r in (r0, r1):
        assert r["closed"] == "SessionClosedError", r["closed"]
        assert r["later"] == [{"value": [3.0, 3.0, 3.0]}] * 3, r["later"]
        assert r["main"] == {"value": [3.0, 3.0, 3.0]}, r["main"]


@needs_mpi
def test_an_mpi_without_thread_multiple_is_refused(tmp_path, monkeypatch):
    """A cross-rank run calls MPI from several threads at once, but MPI's thread level
    was never checked: with mpi4py.rc.thread_level = "serialized" runs hung or failed an
    assertion inside MPI. Now a DistributedError names the level and what is needed.
    Oracle: the level MPI reports (MPI.Query_thread)."""
    r0, r1 = launch("serialized", tmp_path, monkeypatch)
    for r in (r0, r1):
        assert r["level"] == "serialized", r
        assert r["error"].get("type") == "DistributedError", r["error"]
        for words in ("MPI_THREAD_SERIALIZED", "MPI_THREAD_MULTIPLE",
                      "mpi4py.rc.thread_level"):
            assert words in r["error"]["message"], r["error"]["message"]


@needs_mpi
def test_a_loss_that_fails_on_one_ranks_rows_is_heard_by_every_rank(tmp_path, monkeypatch):
    """data_parallel_grads_across_ranks with loss.reduction = "mean" and a bad label in
    rank 1's rows: rank 1 raised before the all-reduce and rank 0 waited in it for ever
    (a hang wherever the error is caught). Now rank 1 raises its own error, naming the
    batch row, and rank 0 a DistributedError naming rank 1 (as every collective's
    refusal does: distributed._agree)."""
    r0, r1 = launch("loss_fails", tmp_path, monkeypatch)
    assert r1["error"]["type"] == "IndexError" and "(row 4)" in r1["error"]["message"], r1
    assert r0["error"]["type"] == "DistributedError", r0
    assert "rank 1" in r0["error"]["message"] and "(row 4)" in r0["error"]["message"], r0
    # (without loss.reduction every rank first tries the loss on pairs of shares, which
    # failed on rank 0 alone, before any agreement: the same wait)
    assert r0["no reduction"]["type"] == "RuntimeError", r0
    assert r1["no reduction"]["type"] == "DistributedError", r1
    assert "rank 0" in r1["no reduction"]["message"], r1


# -- the scenarios: what each rank runs under mpiexec ---------------------------------------

def _attempt(fn) -> dict:
    try:
        return {"value": np.asarray(fn()).tolist()}
    except Exception as exc:  # noqa: BLE001 - the test asserts on the type and message
        return {"type": type(exc).__name__, "message": str(exc)}


def scenario_layouts(out: dict) -> None:
    import minigraph as mg

    data = np.random.default_rng(0).standard_normal((1000, 37))
    expected = {"transposed": data.T, "reversed": data[::-1],
                "reversed, transposed": data[:, ::-1].T,
                "broadcast, transposed": np.broadcast_to(data.T[:, :1], (37, 1000))}
    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            x = mg.placeholder(shape=data.shape, name="x")
            views = {"transposed": mg.transpose(x), "reversed": x[::-1],
                     "reversed, transposed": mg.transpose(x[:, ::-1]),
                     "broadcast, transposed": mg.broadcast_to(mg.transpose(x)[:, :1],
                                                              (37, 1000))}
        with mg.device("rank:1/cpu"):  # (reduced on the rank that received them)
            sums = {k: [mg.sum(v, axis=0), mg.sum(v, axis=1), mg.sum(v)]
                    for k, v in views.items()}
    got = mg.Session(g).run(sums, {x: data})
    t = mg.tensor([10.0 * mg.distributed.rank()])
    out["numpy root"] = _attempt(lambda: mg.distributed.broadcast(t, root=np.int64(1)).numpy())
    out["bool root"] = _attempt(lambda: mg.distributed.broadcast(t, root=True).numpy())
    out["differ"] = [f"{k}, sum {how}" for k, view in expected.items()
                     for how, value, want in zip(("axis=0", "axis=1", "all"), got[k],
                                                 (view.sum(axis=0), view.sum(axis=1),
                                                  view.sum()))
                     if not np.array_equal(value, want)]


def scenario_handed_on(out: dict) -> None:
    import minigraph as mg

    mg.distributed.set_timeout(10.0)
    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            x = mg.placeholder(shape=(3,), name="x")
            y = x * 2.0
        with mg.device("rank:1/cpu"):
            z = y + 1.0
    with mg.Session(g) as first:  # its background thread makes the first cross-rank run
        first.run_async(z, {x: np.ones(3)}).result(10)
    out["closed"] = _attempt(lambda: first.run_async(z, {x: np.ones(3)}).result(10)).get("type")
    out["later"] = []
    for _ in range(3):  # sessions one after another, each with its own background thread
        with mg.Session(g) as sess:
            out["later"].append(_attempt(lambda: sess.run_async(z, {x: np.ones(3)}).result(10)))
    out["main"] = _attempt(lambda: mg.Session(g).run(z, {x: np.ones(3)}))  # and this thread


def scenario_serialized(out: dict) -> None:
    import mpi4py

    import minigraph as mg

    mg.distributed.set_timeout(5.0)
    out["level"] = mpi4py.rc.thread_level
    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            x = mg.placeholder(shape=(3,), name="x")
        with mg.device("rank:1/cpu"):
            y = x * 2.0
    out["error"] = _attempt(lambda: mg.Session(g).run(y, {x: np.ones(3)}))


def scenario_loss_fails(out: dict) -> None:
    import minigraph as mg
    from minigraph.parallel import data_parallel as dp

    mg.distributed.set_timeout(10.0)
    x, y = np.ones((6, 3)), np.array([0, 1, 2, 0, 9, 1])  # label 9, row 4: rank 1's rows
    w = mg.tensor(np.ones((3, 3)), requires_grad=True)

    def loss(ps, xb, yb):
        return mg.cross_entropy(xb @ ps[0], yb)

    loss.reduction = "mean"  # (each rank computes its own share only)
    out["error"] = _attempt(lambda: dp.data_parallel_grads_across_ranks(
        loss, [w], mg.tensor(x), mg.tensor(y))[0].numpy())

    def fails_on_rank_0(ps, xb, yb):  # (no reduction: every rank tries pairs of shares)
        if mg.distributed.rank() == 0:
            raise RuntimeError("this rank's loss fails")
        return mg.mean(xb @ ps[0])

    out["no reduction"] = _attempt(lambda: dp.data_parallel_grads_across_ranks(
        fails_on_rank_0, [w], mg.tensor(x), mg.tensor(np.zeros(6)))[0].numpy())


if __name__ == "__main__":
    if sys.argv[1] == "serialized":  # (read when mpi4py.MPI is first imported: now)
        import mpi4py

        mpi4py.rc.thread_level = "serialized"
    test_distributed.run_scenario(globals())
