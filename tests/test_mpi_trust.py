"""Runs across MPI ranks stay in step and refuse what the ranks disagree on.

As ``test_distributed.py`` does, the MPI tests start ``mpiexec -n 2 python
tests/test_mpi_trust.py SCENARIO OUTDIR`` (its ``launch``, pointed at this file): this
file is also the program every rank runs (the ``scenario_*`` functions below), and each
rank writes what it saw to ``OUTDIR/rank-R.json``. Oracles: closed forms (y = 2x), NumPy,
and the same graph in one process (unprefixed devices). The tests without ``needs_mpi``
run in pytest's process.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import test_distributed
from test_distributed import _across_two_ranks, needs_mpi, sending_while_the_other_fails

HERE = Path(__file__).resolve()


def launch(scenario: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """``test_distributed.launch``, with this file as the program every rank runs."""
    monkeypatch.setattr(test_distributed, "HERE", HERE)
    return test_distributed.launch(scenario, tmp_path, limit=60.0)


def _attempt(fn) -> dict:
    try:
        return {"value": np.asarray(fn()).tolist()}
    except Exception as exc:  # noqa: BLE001 - the test asserts on the type and message
        return {"type": type(exc).__name__, "message": str(exc)}


# -- tests in this process (no MPI needed) --------------------------------------------------

def test_a_control_edge_and_a_node_named_like_it_get_two_keys():
    """The control edge from 'v/assign' to another device had the rendezvous key
    '...;v/assign/control', the key of the data edge of a node the user named
    'v/assign/control': the run raised "sent twice in one run" (across ranks, a shape
    mismatch). Oracle: r = c + 1 = 6 (closed form)."""
    import minigraph as mg

    with mg.Graph() as g:
        with mg.device("cpu"):
            x = mg.placeholder(shape=(3,), name="x")
            v = mg.variable(np.zeros(3), name="v")
            a = v.assign(x + 1.0)
            c = mg.placeholder(shape=(3,), name=a.name + "/control")
        with mg.device("cpu:1"):
            with mg.control_dependencies([a]):
                r = c + 1.0
    keys = [s.key for s in mg.partition(g).sends()]
    assert len(set(keys)) == len(keys) == 2, keys
    sess = mg.Session(g)
    np.testing.assert_array_equal(sess.run(r, {x: np.ones(3), c: np.full(3, 5.0)}),
                                  np.full(3, 6.0))
    np.testing.assert_array_equal(sess.run(v), np.full(3, 2.0))  # the assign ran (x + 1)


def test_compile_graph_refuses_a_node_of_another_rank():
    """compile_graph ran a graph with nodes on rank:1/cpu in this process, as if they were
    local: a variable of rank 1 gave this process's stale copy (Session.run refuses or
    runs it on rank 1). It now refuses, naming the node and the device."""
    import minigraph as mg
    from minigraph.graph.graph import GraphError

    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            x = mg.placeholder(shape=(), name="x")
        with mg.device("rank:1/cpu"):
            v = mg.variable(0.0, name="v")
            y = v * x
    with pytest.raises(GraphError, match=r"node 'v' \(Variable\) is on rank:1/cpu.*"
                                            r"Session.run on every rank"):
        mg.compile_graph(g, [x], y)


# -- tests across two ranks -------------------------------------------------------------------

@needs_mpi
def test_a_refusal_on_one_rank_keeps_the_ranks_in_step(tmp_path, monkeypatch):
    """A run refused on rank 0 alone (made from a second thread; on a closed session, by
    run or run_async) was refused before it took its run number, and without telling
    rank 1: rank 1's call paired with rank 0's next one, and the ranks stayed one run
    apart, rank 1 returning another call's values. Now the refusal fails the run on both
    ranks, and the later runs give y = 2x (closed form) for their own feeds."""
    r0, r1 = launch("refusals", tmp_path, monkeypatch)
    assert r0["thread"]["type"] == "DistributedError", r0["thread"]
    assert r1["thread"]["type"] == "RemoteRankError", r1["thread"]
    assert r0["closed"]["type"] == "SessionClosedError", r0["closed"]
    assert r1["closed"]["type"] == "RemoteRankError", r1["closed"]
    assert "SessionClosedError" in r1["closed"]["message"]
    assert r0["closed_async"]["type"] == "SessionClosedError", r0["closed_async"]
    assert r1["closed_async"]["type"] == "RemoteRankError", r1["closed_async"]
    for res in (r0, r1):
        assert res["later"] == [[2.0 * k] * 2 for k in range(3)], res["later"]


@needs_mpi
def test_a_failed_runs_unreceived_tensor_is_never_read_by_a_later_run(tmp_path, monkeypatch):
    """Rank 1 fails and withdraws its receive; a Send that rank 0 posted before it heard of
    the failure stays unreceived. Once the epochs' tags came round again (here at once: one
    epoch), a good run read that stale tensor (2001.5 for 2.0). Every tensor now carries
    its run's number, and a stale one is dropped. Oracle: y = 2x (closed form)."""
    r0, r1 = launch("stale", tmp_path, monkeypatch)
    for res in (r0, r1):
        assert res["failed"] == 30
        assert res["wrong"] == [], res["wrong"]


@needs_mpi
def test_ranks_that_built_different_constants_or_parameters_are_refused(tmp_path, monkeypatch):
    """The fingerprint the ranks compare had names, ops, devices, shapes and dtypes only:
    ranks whose graphs differed in a constant (x * 2 against x * 3) or a parameter (the
    axis of a sum) ran, and rank 0 returned rank 1's graph's values. Now both refuse."""
    r0, r1 = launch("mismatch", tmp_path, monkeypatch)
    for res in (r0, r1):
        for case in ("constant", "axis"):
            assert res[case].get("type") in ("DistributedError", "RemoteRankError"), res[case]
            assert "different graphs" in res[case]["message"], res[case]
        # the same graph on both ranks still runs, and agrees with NumPy
        assert res["same"] == [[[2.0, 4.0], [6.0, 8.0]], [4.0, 6.0]]


@needs_mpi
def test_ranks_that_feed_a_placeholder_different_values_are_refused(tmp_path, monkeypatch):
    """Each rank fed its own x; rank 1's feed was dropped without a word (x lives on
    rank 0), so rank 1 got y of rank 0's x, and run(x) gave back another array than it
    fed. Now the run is refused on every rank, naming the placeholder."""
    r0, r1 = launch("feeds", tmp_path, monkeypatch)
    for res in (r0, r1):
        assert res["differ"].get("type") in ("DistributedError", "RemoteRankError")
        assert "feed different values to placeholder(s) 'x'" in res["differ"]["message"]
        assert res["same"] == [[3.0, 3.0], [6.0, 6.0]]  # y = 2x (closed form)


@needs_mpi
def test_a_rank_that_plans_longer_than_the_timeout_is_not_taken_for_dead(tmp_path,
                                                                       monkeypatch):
    """Planning (1.3 s here, slowed on purpose; a 60,000-node graph's) longer than the
    timeout (1 s) raised RankTimeout on both ranks: each counted its own planning as the
    other's silence, and sent nothing while planning; so did making the executors of a
    run (every run). Now the silence clock starts after planning, and a rank sends
    'alive' messages while it plans and makes its executors. Oracle: y = 2x."""
    r0, r1 = launch("slow_plan", tmp_path, monkeypatch)
    for res in (r0, r1):
        assert res["runs"] == [{"value": [2.0, 2.0]}, {"value": [4.0, 4.0]}], res["runs"]


@needs_mpi
def test_a_failed_cross_rank_run_sets_last_run(tmp_path, monkeypatch):
    """After a failed cross-rank run, last_run kept the previous run's statistics; a run
    in one process (cpu, cpu:1) sets it to the failed run's, which shows how far it got.
    Oracle: that one-process run of the same graph."""
    r0, r1 = launch("last_run", tmp_path, monkeypatch)
    for res in (r0, r1):
        assert res["one_process_changed"] is True
        assert res["across_ranks_changed"] is True
    assert r0["ops"] == ["Placeholder", "Send"]  # rank 0's part of the failed run
    assert {"Recv", "mul"} <= set(r1["ops"])  # rank 1's, up to the check that failed


# -- the scenarios: what each rank runs under mpiexec ------------------------------------------

def scenario_refusals(out: dict) -> None:
    import threading

    import minigraph as mg

    mg.distributed.set_timeout(3.0)
    me = mg.distributed.rank()
    g, x, y = _across_two_ranks()
    sess = mg.Session(g)
    sess.run(y, {x: np.ones(2)})  # (this thread's: the first)
    if me == 0:
        seen: dict = {}
        other = threading.Thread(target=lambda: seen.update(
            _attempt(lambda: sess.run(y, {x: np.full(2, 5.0)}))))
        other.start()
        other.join()
        out["thread"] = seen
    else:
        out["thread"] = _attempt(lambda: sess.run(y, {x: np.full(2, 5.0)}))
    closed = mg.Session(g)
    closed.run(y, {x: np.ones(2)})
    if me == 0:
        closed.close()
    out["closed"] = _attempt(lambda: closed.run(y, {x: np.full(2, 7.0)}))
    if me == 0:  # (run_async refused at once, before its future)
        out["closed_async"] = _attempt(lambda: closed.run_async(y, {x: np.ones(2)}).result())
    else:
        out["closed_async"] = _attempt(lambda: closed.run(y, {x: np.ones(2)}))
    out["later"] = [_attempt(lambda: sess.run(y, {x: np.full(2, float(k))})).get("value")
                    for k in range(3)]


def scenario_stale(out: dict) -> None:
    import minigraph as mg
    from minigraph.runtime import mpi_run

    mg.distributed.set_timeout(10.0)

    def slow(xp, a):  # rank 0: its Send leaves about when rank 1 fails
        time.sleep(float(a) % 1.0 * 1e-3 + 0.01)
        return a * 1.0

    def check(xp, a):  # rank 1: fails after 10 ms for a negative c
        time.sleep(0.01)
        if float(a) < 0:
            raise ValueError("negative input")
        return a * 1.0

    g, x, c, y = sending_while_the_other_fails(slow, check)
    sess = mg.Session(g)
    mpi_run.world().epochs = 1  # the tags come round at once, not after 511 failures
    out["failed"], out["wrong"] = 0, []
    for k in range(30):
        try:
            sess.run(y, {x: 1000.0 + (k * 0.37) % 1.0, c: -1.0})
        except Exception:  # noqa: BLE001 - every one of these runs fails
            out["failed"] += 1
        got = float(sess.run(y, {x: float(k), c: 0.0}))
        if got != 2.0 * k:
            out["wrong"].append([got, 2.0 * k])


def scenario_mismatch(out: dict) -> None:
    import minigraph as mg

    mg.distributed.set_timeout(5.0)
    me = mg.distributed.rank()
    data = np.array([[1.0, 2.0], [3.0, 4.0]])

    def build(k: float, axis: int):
        with mg.Graph() as g:
            with mg.device("rank:0/cpu"):
                x = mg.placeholder(shape=(2, 2), name="x")
            with mg.device("rank:1/cpu"):
                y = x * k
                s = mg.sum(x, axis=axis)
        return mg.Session(g), x, y, s

    sess, x, y, _ = build(2.0 if me == 0 else 3.0, 0)
    out["constant"] = _attempt(lambda: sess.run(y, {x: data}))
    sess, x, _, s = build(2.0, 0 if me == 0 else 1)
    out["axis"] = _attempt(lambda: sess.run(s, {x: data}))
    sess, x, y, s = build(2.0, 0)
    out["same"] = [v.tolist() for v in sess.run([y, s], {x: data})]
    assert out["same"] == [(data * 2.0).tolist(), data.sum(axis=0).tolist()]


def scenario_feeds(out: dict) -> None:
    import minigraph as mg

    mg.distributed.set_timeout(5.0)
    me = mg.distributed.rank()
    g, x, y = _across_two_ranks()
    sess = mg.Session(g)
    out["differ"] = _attempt(lambda: sess.run([x, y], {x: np.full(2, 10.0 * (me + 1))}))
    out["same"] = [v.tolist() for v in sess.run([x, y], {x: np.full(2, 3.0)})]


def scenario_slow_plan(out: dict) -> None:
    import minigraph as mg
    from minigraph.runtime.session import Session

    mg.distributed.set_timeout(1.0)
    g, x, y = _across_two_ranks()
    plan, make_runs = Session._plan, Session._partition_runs
    slow = {"_plan"}  # the first run plans slowly, the second makes its executors slowly

    def slow_plan(self, *args):  # as a graph of many nodes would plan
        if "_plan" in slow:
            time.sleep(1.3)
        return plan(self, *args)

    def slow_runs(self, *args):
        if "_partition_runs" in slow:
            time.sleep(1.3)
        return make_runs(self, *args)

    Session._plan = slow_plan  # type: ignore[method-assign]
    Session._partition_runs = slow_runs  # type: ignore[method-assign]
    sess = mg.Session(g)
    out["runs"] = []
    for k, step in ((1.0, "_plan"), (2.0, "_partition_runs")):
        slow.clear()
        slow.add(step)
        mg.distributed.barrier()  # both ranks start the call together
        out["runs"].append(_attempt(lambda: sess.run(y, {x: np.full(2, k)})))


def scenario_last_run(out: dict) -> None:
    import minigraph as mg
    from minigraph.ops.primitive import Primitive
    from minigraph.ops.shape_rules import same

    mg.distributed.set_timeout(5.0)

    def check(xp, a):
        if float(a.sum()) < 0:
            raise ValueError("negative input")
        return a * 1.0

    for where, (d0, d1) in {"one_process": ("cpu", "cpu:1"),
                            "across_ranks": ("rank:0/cpu", "rank:1/cpu")}.items():
        with mg.Graph() as g:
            with mg.device(d0):
                x = mg.placeholder(shape=(2,), name="x")
            with mg.device(d1):
                y = g.add(Primitive("check", check, same, vjp=[None]), (x * 2.0,), {})
        sess = mg.Session(g, trace=True)
        sess.run(y, {x: np.ones(2)})
        before = sess.last_run
        _attempt(lambda: sess.run(y, {x: np.full(2, -1.0)}))
        out[f"{where}_changed"] = sess.last_run is not before
    out["ops"] = sorted({e.get("op", "") for e in sess.last_run.events})


if __name__ == "__main__":
    test_distributed.run_scenario(globals())
