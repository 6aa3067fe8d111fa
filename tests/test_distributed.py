"""mg.distributed and graphs across MPI ranks.

The tests start ``mpiexec -n 2 python tests/test_distributed.py SCENARIO OUTDIR``: this
file is also the program every rank runs (the ``scenario_*`` functions below). Each rank
writes what it saw to ``OUTDIR/rank-R.json``, and the test asserts on both files here, in
pytest's process. Oracles: NumPy for the collectives; the same program in one process
(unprefixed devices), in float64, to 1e-12; the textbook's z = x*y + sin(x) with x on rank
0 and y, z on rank 1 (z = 6 + sin 2, dz/dx = 3 + cos 2, dz/dy = 2).

Machines without mpi4py or mpiexec skip the MPI tests with the reason; ``pip install -e
'.[dev]'`` brings both (the ``[mpi]`` extra: mpi4py and the MPICH wheels).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
MPIEXEC = (shutil.which("mpiexec", path=os.path.join(sys.prefix, "bin"))
           or shutil.which("mpiexec"))
HAS_MPI4PY = importlib.util.find_spec("mpi4py") is not None
needs_mpi = pytest.mark.skipif(
    not (HAS_MPI4PY and MPIEXEC),
    reason="needs mpi4py and mpiexec: pip install 'minigraph[mpi]' (or -e '.[dev]')")

# One BLAS thread per rank: two ranks on two cores, no oversubscription. Where the
# mpiexec found is Open MPI's (a system MPI, not the MPICH wheels) and the tests run as
# root, as in a container, Open MPI refuses to start unless told twice that this is meant.
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
       "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def launch(scenario: str, tmp_path: Path, n: int = 2, limit: float = 45.0) -> list[dict]:
    """Run ``scenario`` on ``n`` ranks; return each rank's results. Fails (and kills the
    whole process group) if mpiexec does not end within ``limit`` seconds."""
    out = tmp_path / scenario
    out.mkdir()
    cmd = [MPIEXEC, "-n", str(n), sys.executable, str(HERE), scenario, str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"mpiexec did not end within {limit} s:\n{log.decode()[-3000:]}")
    text = log.decode()
    assert proc.returncode == 0, text[-3000:]
    results = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(n)]
    for r in results:  # no rank's process is left behind
        with pytest.raises(ProcessLookupError):
            os.kill(r["pid"], 0)
    return results


# -- tests in this process (no MPI needed) --------------------------------------------------

def test_importing_minigraph_starts_no_mpi_and_works_without_mpi4py():
    code = (
        "import sys; sys.modules['mpi4py'] = None\n"  # as if mpi4py were not installed
        "import minigraph as mg\n"
        "assert float((mg.tensor(2.0) * 3.0).item()) == 6.0\n"
        "try:\n"
        "    mg.distributed.rank()\n"
        "except mg.distributed.DistributedError as e:\n"
        "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=ENV, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'minigraph[mpi]'" in out.stdout


def test_a_lone_process_knows_rank_names_but_refuses_what_needs_other_ranks():
    import minigraph as mg

    assert "mpi4py" not in sys.modules or True  # (pytest plugins may import it; see above)
    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            x = mg.placeholder(shape=(), name="x")
        with mg.device("rank:1/cpu"):
            z = x * 2.0
    parts = mg.partition(g)
    assert set(parts) == {"rank:0/cpu", "rank:1/cpu"}
    assert [s.key for s in parts.sends()] == ["rank:0/cpu;rank:1/cpu;x"]
    with pytest.raises(mg.distributed.DistributedError, match=r"mpiexec -n 2"):
        mg.Session(g).run(z, {x: 1.0})
    with pytest.raises(mg.DeviceError if hasattr(mg, "DeviceError") else Exception,
                       match="belongs to rank 1"):
        mg.tensor(1.0, device="rank:1/cpu")
    with pytest.raises(Exception, match="bad device name"):
        mg.device("rank:x/cpu")


def test_a_graph_on_rank_zero_alone_runs_in_one_process():
    import minigraph as mg

    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            x = mg.placeholder(shape=(), name="x")
        with mg.device("rank:0/cpu:1"):
            z = x * x + mg.sin(x)
    assert mg.Session(g).run(z, {x: 2.0}) == pytest.approx(4 + np.sin(2.0), rel=1e-12)


# -- tests on two ranks -----------------------------------------------------------------------

@needs_mpi
def test_two_ranks_agree_with_numpy_and_with_one_process(tmp_path):
    r0, r1 = launch("basics", tmp_path)
    for r, res in enumerate((r0, r1)):
        assert (res["rank"], res["world"]) == (r, 2)
        # collectives against NumPy
        a = [np.random.default_rng(k).normal(size=(3, 4)) for k in range(2)]
        np.testing.assert_allclose(res["sum"], a[0] + a[1], rtol=1e-12)
        np.testing.assert_allclose(res["mean"], (a[0] + a[1]) / 2, rtol=1e-12)
        np.testing.assert_array_equal(res["bcast"], a[1])
        assert res["isum"] == [1, 3]
        assert "rank 0: shape (2,)" in res["mismatch"] and "rank 1: shape (3,)" in res["mismatch"]
        # the textbook, x on rank 0 and y, z on rank 1, on both ranks
        z, gx, gy = res["textbook"]
        assert z == pytest.approx(6 + np.sin(2.0), abs=1e-12)
        assert gx == pytest.approx(3 + np.cos(2.0), abs=1e-12)
        assert gy == pytest.approx(2.0, abs=1e-12)
        assert res["textbook_moved"]["rank:0/cpu->rank:1/cpu"] == 8
        assert res["across_ranks"] > 0
        assert res["trace_pids"] == [0, 1]  # one timeline, pid = rank
        assert res["trace_names"] == ["rank 0", "rank 1"]
        # a random graph over four devices of two ranks = the same graph in one process
        for workers in ("1", "2"):
            np.testing.assert_allclose(res[f"dag_{workers}"], res["dag_oracle"], rtol=1e-12)
        np.testing.assert_allclose(res["dag_again"], res["dag_oracle"], rtol=1e-12)
        # data parallelism with all_reduce: the one-process gradient
        for got, want in zip(res["dp_grads"], res["dp_oracle"]):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
        # a model-parallel MLP split by layer across the ranks trains as in one process
        np.testing.assert_allclose(res["mp_losses"], res["mp_oracle"], rtol=1e-12)
        assert res["mp_losses"][-1] < res["mp_losses"][0]
        assert res["mp_params_diff"] < 1e-12
    assert r0["mp_losses"] == r1["mp_losses"]


@needs_mpi
def test_a_failure_on_one_rank_raises_on_every_rank_and_the_session_recovers(tmp_path):
    results = launch("failures", tmp_path)
    for res in results:
        kernel = res["kernel"]
        assert "rank 1" in kernel["message"] and "fail" in kernel["message"], kernel
        assert kernel["seconds"] < 30
        feed = res["feed"]
        assert "rank 0" in feed["message"] and "Placeholder" in feed["message"] or \
            (res["rank"] == 0 and "shape" in feed["message"]), feed
        assert feed["seconds"] < 30
        assert "different graphs" in res["mismatch"]["message"]
        assert res["after"] == pytest.approx(4.0)  # the session still works afterwards
        assert res["agreed"] == [2.0, 3.0] and "different graphs" in res["crosswise"]["message"]
        assert "no_such_node" in res["unknown"]["message"]
        assert res["in_step"] == [2.0, 4.0, 6.0]
        assert res["counted"] == [[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]]
        assert "dtype bool" in res["bad_dtype"]["message"]
        assert "root 0; rank 1" in res["bad_root"]["message"]
        assert "op sum; rank 1" in res["bad_op"]["message"]
        assert res["paired"] == [3.0, 3.0]
    assert results[0]["kernel"]["type"] == "RemoteRankError"
    assert results[1]["kernel"]["type"] == "NodeError"
    assert results[0]["feed"]["type"] == "ShapeError"
    assert results[1]["feed"]["type"] == "RemoteRankError"


@needs_mpi
def test_a_rank_that_does_not_come_to_the_run_times_out_the_others(tmp_path):
    """Rank 0 does not run the plan again; rank 1 waits for its plan (every run compares
    the ranks' plans first: ranks that agreed on two plans once could run them crosswise
    later and pair each other's messages) and times out, saying what it waited for."""
    r0, r1 = launch("timeout", tmp_path)
    assert r1["type"] == "RankTimeout"
    assert "rank 0 sent nothing for 2 s while this rank waited for its plan" in r1["message"]
    assert 1.5 < r1["seconds"] < 10
    assert r0["first"] == r1["first"] == [2.0, 2.0]


@needs_mpi
def test_a_rank_that_never_makes_a_cross_rank_run_times_out_the_first_one(tmp_path):
    """The first cross-rank run of a process makes minigraph's own communicator, a
    collective (Idup) that waits for every rank: rank 1 does not wait forever for a rank 0
    that never comes, but raises after the timeout, saying what it waited for."""
    r0, r1 = launch("no_world", tmp_path)
    assert r1["type"] == "RankTimeout"
    assert "the first cross-rank run waits for every rank" in r1["message"]
    assert 0.9 < r1["seconds"] < 10


@needs_mpi
def test_a_failed_runs_late_send_is_not_read_by_a_later_run(tmp_path):
    """Rank 1 fails while rank 0 is still computing the tensor it sends: rank 0's Send
    was posted after the run had failed and rank 1 had withdrawn its Recv, and stayed
    unmatched. Once the tags wrapped round (511 epochs with MPICH), good runs read the
    failed runs' tensors: y = 2000, 2, 4 for 2, 4, 6. A failed run sends nothing more."""
    for res in launch("late_sends", tmp_path, limit=120.0):
        if "wrapped" not in res:
            pytest.skip(f"this MPI's tags wrap only after {res['epochs']} runs")
        assert res["wrapped"], res
        assert res["after"] == [2.0, 4.0, 6.0]  # y = 2 x, NumPy's and the first run's


@needs_mpi
def test_the_users_messages_on_comm_and_minigraphs_own_do_not_meet(tmp_path):
    """mpi4py's send has tag 0 and recv any tag by default, and minigraph's control
    messages (hello, done) had tag 0 on the same communicator: rank 1's run read rank 0's
    message to rank 1's program as one of its own, and rank 1's program read a message
    of minigraph's. minigraph talks on a duplicate of the world's communicator."""
    r0, r1 = launch("users_messages", tmp_path)
    assert r1["y"] == r0["y"] == [2.0, 4.0]  # y = 2 x (NumPy)
    assert r1["got"] == "rank 0's own message"
    assert r0["got"] == "rank 1's reply"


@needs_mpi
def test_refusals_on_every_rank_instead_of_a_wrong_value(tmp_path):
    """A collective of a tensor that requires a gradient made a new leaf: w.grad missed
    the path through it (2w + ... gave 4, 8 for 8, 16). A cross-rank run from a second
    thread paired with whatever run the other rank made (values of another run's feeds).
    Both now raise, on every rank alike, and the next run is right (y = 2x, NumPy). A
    variable of rank 1 read with numpy() on rank 0 gave its first value (rank 1 commits
    its runs): that refuses, pointing at Session.run. A rank that refused its call alone
    (a feed_dict list, no fetches) left the other to pair with its next call."""
    r0, r1 = ranks = launch("refusals", tmp_path)
    for res in ranks:
        assert res["collective"] == "DistributedError", res
        assert res["thread"] == "DistributedError", res
        assert res["after"] == [2.0, 4.0], res
        assert res["fetched"] == [1.0, 1.0], res  # v + 1 once (closed form)
        assert res["bad_feed"] is not None and res["no_fetch"] is not None, res
    assert r0["variable"] == "GraphError" and r1["variable"] is None, ranks


def test_timeouts_are_numbers_of_seconds_above_zero(monkeypatch):
    """set_timeout(nan) made every wait endless, set_timeout("5") raised Python's '<='
    error, and a bad MINIGRAPH_MPI_TIMEOUT broke import minigraph with a bare
    ValueError."""
    import minigraph as mg

    for bad in (float("nan"), "5x", 0, -1.0, True, None):
        with pytest.raises(ValueError, match="set_timeout: seconds must be a number of "
                                             "seconds > 0"):
            mg.distributed.set_timeout(bad)
    monkeypatch.setattr(mg.distributed, "_timeout", None)
    monkeypatch.setenv("MINIGRAPH_MPI_TIMEOUT", "abc")
    with pytest.raises(ValueError, match="MINIGRAPH_MPI_TIMEOUT must be a number"):
        mg.distributed.timeout()
    monkeypatch.setenv("MINIGRAPH_MPI_TIMEOUT", "2.5")
    assert mg.distributed.timeout() == 2.5


# -- what each rank runs ------------------------------------------------------------------------

def scenario_basics(out: dict) -> None:
    import minigraph as mg
    from minigraph.parallel import LayerSplitMLP, data_parallel_grads_across_ranks

    dist = mg.distributed
    me = dist.rank()
    out["world"] = dist.world_size()
    a = mg.tensor(np.random.default_rng(me).normal(size=(3, 4)))
    out["sum"] = dist.all_reduce(a).numpy().tolist()
    out["mean"] = dist.all_reduce(a, op="mean").numpy().tolist()
    out["bcast"] = dist.broadcast(a, root=1).numpy().tolist()
    out["isum"] = dist.all_reduce(mg.tensor([me, me + 1])).numpy().tolist()
    try:
        dist.all_reduce(mg.tensor(np.zeros(2 + me)))
    except dist.DistributedError as e:
        out["mismatch"] = str(e)

    # the textbook example across two processes
    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            x = mg.placeholder(shape=(), name="x")
        with mg.device("rank:1/cpu"):
            y = mg.placeholder(shape=(), name="y")
            z = x * y + mg.sin(x)
        gx, gy = mg.gradients(z, [x, y])
    sess = mg.Session(g)
    out["textbook"] = [float(v) for v in sess.run([z, gx, gy], {x: 2.0, y: 3.0})]
    out["textbook_moved"] = {f"{a}->{b}": n for (a, b), n in sess.last_run.bytes_moved.items()}
    out["across_ranks"] = sess.last_run.bytes_across_ranks
    trace = sess.last_run.chrome_trace()["traceEvents"]
    out["trace_pids"] = sorted({e["pid"] for e in trace if e["ph"] == "X"})
    out["trace_names"] = sorted(e["args"]["name"] for e in trace if e["name"] == "process_name")

    # a random graph over four devices of two ranks, against the one-process run
    rng = np.random.default_rng(7)
    devices = ["rank:0/cpu", "rank:1/cpu", "rank:0/cpu:1", "rank:1/cpu:1"]
    dag = [(rng.choice(["add", "mul", "tanh", "matmul"]), int(rng.integers(0, k + 1)),
            int(rng.integers(0, k + 1)), devices[int(rng.integers(0, 4))]) for k in range(30)]
    A = np.random.default_rng(3).normal(size=(4, 4)) * 0.5
    g1, x1, last1 = _build_dag(dag, lambda d: d)
    g2, x2, last2 = _build_dag(dag, lambda d: d.split("/")[1])  # one process: cpu, cpu:1
    out["dag_oracle"] = mg.Session(g2).run(last2, {x2: A}).tolist()
    for workers in (1, 2):
        with mg.Session(g1, workers=workers) as s:
            out[f"dag_{workers}"] = s.run(last1, {x1: A}).tolist()
            out["dag_again"] = s.run(last1, {x1: A}).tolist()

    # data parallelism across ranks: each rank its half of the batch, all_reduce adds
    X = np.random.default_rng(11).normal(size=(10, 5))
    Y = np.random.default_rng(12).normal(size=(10, 2))
    W = np.random.default_rng(13).normal(size=(5, 2))
    B = np.zeros(2)

    def loss(ps, xs, ys):
        return ((mg.tanh(xs @ ps[0] + ps[1]) - ys) ** 2).mean()

    params = [mg.tensor(W), mg.tensor(B)]
    out["dp_grads"] = [t.numpy().tolist() for t in
                       data_parallel_grads_across_ranks(loss, params, mg.tensor(X), mg.tensor(Y))]
    one = mg.grad(lambda w, b: loss([w, b], mg.tensor(X), mg.tensor(Y)), argnums=(0, 1))(*params)
    out["dp_oracle"] = [t.numpy().tolist() for t in one]

    # model parallelism: an MLP split by layer across the ranks, trained in graph mode
    Xm = np.random.default_rng(1).normal(size=(16, 6))
    Ym = np.random.default_rng(2).integers(0, 3, 16)
    split = LayerSplitMLP([6, 12, 12, 3], ["rank:0/cpu", "rank:1/cpu"], 16)
    whole = LayerSplitMLP([6, 12, 12, 3], ["cpu"], 16)
    out["mp_losses"] = [split.step(Xm, Ym, 0.5) for _ in range(4)]
    out["mp_oracle"] = [whole.step(Xm, Ym, 0.5) for _ in range(4)]
    out["mp_params_diff"] = max(float(abs(p - q).max()) for p, q in zip(split.params, whole.params))


def _build_dag(dag, place):
    import minigraph as mg

    with mg.Graph() as g:
        with mg.device(place("rank:0/cpu")):
            x = mg.placeholder(shape=(4, 4), name="x")
        nodes = [x]
        for op, i, j, dev in dag:
            with mg.device(place(dev)):
                a, b = nodes[i], nodes[j]
                nodes.append({"tanh": lambda: mg.tanh(a), "matmul": lambda: (a @ b) * 0.25,
                              "add": lambda: a + b, "mul": lambda: a * b}[op]())
    return g, x, nodes[-1]


def _across_two_ranks():
    """The smallest graph that crosses ranks: x on rank 0, y = 2x on rank 1."""
    import minigraph as mg

    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            x = mg.placeholder(shape=(2,), name="x")
        with mg.device("rank:1/cpu"):
            y = x * 2.0
    return g, x, y


def sending_while_the_other_fails(slow, check):
    """y = slow(x) * 2 + check(c): rank 0 computes slow(x) and sends it while rank 1 runs
    check(c), which fails for a negative c (a run that fails while a Send is on its way)."""
    import minigraph as mg
    from minigraph.ops.primitive import Primitive
    from minigraph.ops.shape_rules import same

    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            x = mg.placeholder(shape=(), name="x")
            sx = g.add(Primitive("slow", slow, same, vjp=[None]), (x,), {})
        with mg.device("rank:1/cpu"):
            c = mg.placeholder(shape=(), name="c")
            y = sx * 2.0 + g.add(Primitive("check", check, same, vjp=[None]), (c,), {})
    return g, x, c, y


def _attempt(fn) -> dict:
    start = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test looks at what was raised
        return {"type": type(e).__name__, "message": str(e),
                "seconds": time.monotonic() - start}
    return {"type": None, "message": "", "seconds": time.monotonic() - start}


def scenario_failures(out: dict) -> None:
    import minigraph as mg
    from minigraph.ops.primitive import Primitive
    from minigraph.ops.shape_rules import same

    def impl(xp, a):
        raise RuntimeError("injected failure")

    fail = Primitive("fail", impl, same, vjp=[None])
    me = mg.distributed.rank()
    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            x = mg.placeholder(shape=(2,), name="x")
            ok = (x * x).sum()
        with mg.device("rank:1/cpu"):
            bad = g.add(fail, (mg.sin(x),), {})
            y = bad + 1.0
    sess = mg.Session(g)
    # 1. a kernel fails on rank 1: both ranks raise, naming rank 1 and the op
    out["kernel"] = _attempt(lambda: sess.run(y, {x: np.ones(2)}))
    # 2. rank 0 is fed a value of the wrong shape; rank 1 a good one
    feed = np.ones(3) if me == 0 else np.ones(2)
    out["feed"] = _attempt(lambda: sess.run(ok, {x: feed}))
    # 3. the ranks fetch different things: they are told, they do not wait
    out["mismatch"] = _attempt(lambda: sess.run(ok if me == 0 else [ok, x], {x: np.ones(2)}))
    # 4. the same session still runs
    out["after"] = float(sess.run(ok, {x: np.array([2.0, 0.0])}))
    # 5. plans both ranks agreed on once, run crosswise: A on rank 0, B on rank 1 (rank 0
    #    took B's value for A's, 3.0 for 2.0, when only a plan's first run was compared)
    with mg.Graph() as g2:
        with mg.device("rank:0/cpu"):
            x2 = mg.placeholder(shape=(), name="x")
        with mg.device("rank:1/cpu"):
            a, b = x2 * 2.0, x2 * 3.0
    s2 = mg.Session(g2)
    out["agreed"] = [float(s2.run(a, {x2: 1.0})), float(s2.run(b, {x2: 1.0}))]
    out["crosswise"] = _attempt(lambda: s2.run(a if me == 0 else b, {x2: 1.0}))
    # 6. a fetch only rank 1 cannot find: both raise, and the runs after stay in step
    #    (rank 1 fell one run behind, and got each earlier call's answer from then on)
    out["unknown"] = _attempt(lambda: s2.run("no_such_node" if me == 1 else a, {x2: 1.0}))
    out["in_step"] = [float(s2.run(a, {x2: float(k)})) for k in (1, 2, 3)]
    # 7. a variable on rank 1, updated each run, read on rank 0 (a cached partition held
    #    the variable's value of the run that made it: w stayed 1.0)
    with mg.Graph() as g3:
        with mg.device("rank:1/cpu"):
            w = mg.variable(0.0, name="w")
        with mg.device("rank:0/cpu"):
            increment, twice = w.assign(w + 1.0), w * 2.0
    s3 = mg.Session(g3)
    out["counted"] = [[float(s3.run(increment)), float(s3.run(twice))] for _ in range(3)]
    # 8. collectives whose arguments only one rank gets wrong: every rank raises, and
    #    the next call pairs with the next call (rank 1 waited, then took [101, 101])
    dist = mg.distributed
    bad = mg.tensor([True, False]) if me == 0 else mg.tensor([1.0, 1.0])
    out["bad_dtype"] = _attempt(lambda: dist.all_reduce(bad))
    out["bad_root"] = _attempt(lambda: dist.broadcast(mg.tensor([1.0]), root=me))
    out["bad_op"] = _attempt(lambda: dist.all_reduce(mg.tensor([1.0]), op="mean" if me else "sum"))
    out["paired"] = dist.all_reduce(mg.tensor([1.0, 1.0]) * (me + 1)).tolist()


def scenario_timeout(out: dict) -> None:
    import minigraph as mg

    mg.distributed.set_timeout(2.0)
    g, x, y = _across_two_ranks()
    sess = mg.Session(g)
    out["first"] = sess.run(y, {x: np.ones(2)}).tolist()  # both ranks: the plans agree
    if mg.distributed.rank() == 1:  # rank 0 does not run it again
        out.update(_attempt(lambda: sess.run(y, {x: np.ones(2)})))
    mg.distributed.barrier()


def scenario_no_world(out: dict) -> None:
    import minigraph as mg

    mg.distributed.set_timeout(1.0)
    g, x, y = _across_two_ranks()
    if mg.distributed.rank() == 1:  # rank 0 never makes a cross-rank run
        out.update(_attempt(lambda: mg.Session(g).run(y, {x: np.ones(2)})))
    else:
        time.sleep(2.0)


def scenario_late_sends(out: dict) -> None:
    import time

    import minigraph as mg
    from minigraph.runtime import mpi_run

    def slow(xp, a):  # rank 0 is still computing when rank 1 fails
        time.sleep(0.02)
        return a * 1.0

    def check(xp, a):
        if float(a) < 0:
            raise ValueError("negative input")
        return a * 1.0
    g, x, c, y = sending_while_the_other_fails(slow, check)
    sess = mg.Session(g)
    w = mpi_run.world()
    out["epochs"] = w.epochs
    if w.epochs > 2000:  # (an MPI with a larger tag limit than MPICH's wraps much later)
        return
    for k in range(w.epochs):  # every tag once: the next run's come round again
        _attempt(lambda: sess.run(y, {x: 1000.0 + k, c: -1.0}))
    out["wrapped"] = w.epoch % w.epochs == 0
    out["after"] = [float(sess.run(y, {x: float(k), c: 0.0})) for k in (1, 2, 3)]


def scenario_users_messages(out: dict) -> None:
    import minigraph as mg

    comm = mg.distributed.comm()
    g, x, y = _across_two_ranks()
    sess = mg.Session(g)
    if comm.Get_rank() == 0:
        comm.send("rank 0's own message", dest=1)  # mpi4py's defaults: tag 0
    out["y"] = sess.run(y, {x: np.array([1.0, 2.0])}).tolist()
    if comm.Get_rank() == 1:
        out["got"] = comm.recv(source=0)  # and any tag
        comm.send("rank 1's reply", dest=0)
    else:
        out["got"] = comm.recv(source=1)


def scenario_refusals(out: dict) -> None:
    import threading

    import minigraph as mg

    w = mg.tensor([1.0, 2.0], requires_grad=True)
    out.update(collective=_attempt(lambda: mg.distributed.all_reduce(w * 2.0))["type"])
    g, x, y = _across_two_ranks()
    with g, mg.device("rank:1/cpu"):
        v = mg.variable(np.zeros(2), name="v")
        bump = v.assign(v + 1.0)
    sess = mg.Session(g)
    sess.run(y, {x: np.ones(2)})  # (this thread's: the first)
    sess.run(bump)
    out["variable"] = _attempt(v.numpy)["type"]  # (rank 1 holds it: [1, 1] there)
    out["fetched"] = sess.run(v).tolist()
    seen: dict = {}
    other = threading.Thread(target=lambda: seen.update(
        _attempt(lambda: sess.run(y, {x: np.ones(2)}))))
    other.start()
    other.join()
    out["thread"] = seen.get("type")
    me = mg.distributed.rank()
    # one rank refuses its own call (a list for a dict; no fetches while the other has
    # one): every rank's call fails, and the runs stay paired
    out["bad_feed"] = _attempt(lambda: sess.run(y, [(x, np.ones(2))] if me == 0
                                                else {x: np.ones(2)}))["type"]
    out["no_fetch"] = _attempt(lambda: sess.run([] if me == 0 else y, {x: np.ones(2)}))["type"]
    out["after"] = sess.run(y, {x: np.array([1.0, 2.0])}).tolist()


def run_scenario(scenarios: dict) -> None:
    """What a rank of ``mpiexec -n 2 python FILE SCENARIO OUTDIR`` runs: the function
    ``scenario_SCENARIO`` among ``scenarios`` (a test file's globals), its result written
    to OUTDIR/rank-N.json."""
    scenario, outdir = sys.argv[1], Path(sys.argv[2])
    import minigraph as mg

    mg.distributed.init()
    result = {"rank": mg.distributed.rank(), "pid": os.getpid()}
    scenarios[f"scenario_{scenario}"](result)
    (outdir / f"rank-{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    run_scenario(globals())
