"""The runtime: scheduler, cost classes, memory recycling, run statistics, failures."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minigraph as mg
from minigraph.errors import MinigraphError
from minigraph.ops.primitive import Primitive
from minigraph.ops.shape_rules import same
from minigraph.runtime.cost import LARGE_ELEMENTS, static_cost
from minigraph.runtime.session import NodeError

WORKERS = [1, 2, 4, 8]
OPS = ["add", "sub", "mul", "tanh", "sin", "matmul", "rowsum"]


def apply(op, a, b):
    if op in UNWRITABLE:  # (the memory-plan tests' ops without an out kernel)
        return UNWRITABLE[op](a, b)
    if op == "tanh":
        return mg.tanh(a)
    if op == "sin":
        return mg.sin(a)
    if op == "matmul":
        return (a @ b) * 0.25  # keeps values bounded
    if op == "rowsum":
        return a.sum(axis=1, keepdims=True) * 0.1 + b  # broadcasting
    return {"add": a + b, "sub": a - b, "mul": a * b}[op]


@st.composite
def dags(draw, ops=OPS):
    n = draw(st.integers(1, 30))
    return [(draw(st.sampled_from(ops)), draw(st.integers(0, k + 1)), draw(st.integers(0, k + 1)))
            for k in range(n)]


def build(dag):
    with mg.Graph() as g:
        x = mg.placeholder(shape=(4, 4), name="x")
        y = mg.placeholder(shape=(4, 4), name="y")
        nodes = [x, y]
        for op, i, j in dag:
            nodes.append(apply(op, nodes[i], nodes[j]))
    return g, x, y, nodes


X, Y = np.random.default_rng(0).normal(size=(2, 4, 4)) * 0.5


@given(dags())
def test_every_worker_count_gives_the_same_values_and_a_topological_order(dag):
    g, x, y, nodes = build(dag)
    fetches = nodes[2:][-3:]  # the last few nodes: leaves and some inner ones
    eager = [apply_eager(dag)[k] for k in range(len(nodes))][-len(fetches):]
    for w in WORKERS:
        with mg.Session(g, workers=w, debug=True) as sess:
            values = sess.run(fetches, {x: X, y: Y})
            order = sess.last_run.order
        for v, e in zip(values, eager):
            np.testing.assert_array_equal(v, e)  # bit for bit: the same kernels ran
        assert len(order) == len(set(order))  # each node exactly once
        position = {name: k for k, name in enumerate(order)}
        for n in g.nodes:
            if n.name in position:
                assert all(position[i.name] < position[n.name] for i in n.inputs)


def apply_eager(dag):
    values = [mg.tensor(X), mg.tensor(Y)]
    for op, i, j in dag:
        values.append(apply(op, values[i], values[j]))
    return [v.numpy() for v in values]


@given(dags(), st.sampled_from(WORKERS))
def test_memory_invariants(dag, workers):
    g, x, y, nodes = build(dag)
    with mg.Session(g, workers=workers, debug=True) as sess:
        sess.run(nodes[-1], {x: X, y: Y})
        st_ = sess.last_run
    for dev, peak in st_.peak_bytes.items():
        assert st_.lower_bound[dev] <= peak <= st_.total_bytes_by_device[dev]


def test_serial_order_is_fifo():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        y = mg.placeholder(shape=(), name="y")
        z = x * y + mg.sin(x)
    sess = mg.Session(g, workers=1)
    sess.run(z, {x: 2.0, y: 3.0})
    assert sess.last_run.order == ["x", "y", "sin", "mul", "add"]


def _kahn_fifo(g, fetches, fed):
    """The oracle: Kahn's algorithm written out here, on the nodes the fetches need."""
    need, stack = set(), list(fetches)
    while stack:
        n = stack.pop()
        if n.name not in need:
            need.add(n.name)
            stack.extend(() if n.name in fed else n.inputs)
    members = [n for n in g.nodes if n.name in need]
    missing = {n.name: 0 if n.name in fed else len({i.name for i in n.inputs}) for n in members}
    queue, order = [n for n in members if missing[n.name] == 0], []
    while queue:
        n = queue.pop(0)
        order.append(n.name)
        for c in members:
            if c.name not in fed and any(i is n for i in c.inputs):
                missing[c.name] -= 1
                if missing[c.name] == 0:
                    queue.append(c)
    return order


@given(dags())
def test_the_serial_run_walks_kahns_fifo_order(dag):
    # workers=1 walks the plan made once by topo.fifo_order instead of counting inputs
    # down on every run: the order must still be the one Kahn's FIFO queue gives
    g, x, y, nodes = build(dag)
    fetches = nodes[2:][-2:]
    with mg.Session(g, workers=1) as sess:
        sess.run(fetches, {x: X, y: Y})
        sess.run(fetches, {x: X, y: Y})  # (the second run reuses the cached plan)
        assert sess.last_run.order == _kahn_fifo(g, fetches, {"x", "y"})


@given(dags(), st.data())
def test_can_overlap_finds_two_expensive_nodes_that_do_not_wait_for_each_other(dag, data):
    # the oracle: every pair of expensive nodes, their ancestors found by a search
    from minigraph.graph.topo import fifo_order
    from minigraph.runtime.scheduler import can_overlap

    g, x, y, nodes = build(dag)
    plan = fifo_order(g.nodes, {id(n) for n in g.nodes})
    expensive = {n.name for n in plan if data.draw(st.booleans())}

    def ancestors(n):
        seen, stack = set(), list(n.inputs)
        while stack:
            a = stack.pop()
            if a.name not in seen:
                seen.add(a.name)
                stack.extend(a.inputs)
        return seen

    chosen = [n for n in plan if n.name in expensive]
    independent = any(a.name not in ancestors(b) and b.name not in ancestors(a)
                      for i, a in enumerate(chosen) for b in chosen[i + 1:])
    cost = lambda n: "expensive" if n.name in expensive else "cheap"  # noqa: E731
    assert can_overlap(plan, cost) == independent


def test_an_untraced_run_says_how_to_get_its_events():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        z = mg.sin(x)
    sess = mg.Session(g)
    sess.run(z, {x: 1.0})
    assert not sess.last_run.traced and sess.last_run.order == ["x", "sin"]
    assert sess.last_run.peak_bytes["cpu"] > 0  # kept for every run
    for what in ("events", "memory_curve"):
        with pytest.raises(MinigraphError, match=r"not traced.*trace=True"):
            getattr(sess.last_run, what)
    with pytest.raises(MinigraphError, match="trace=True"):
        sess.last_run.gantt()
    traced = mg.Session(g, trace=True)
    traced.run(z, {x: 1.0})
    assert [e["name"] for e in traced.last_run.events] == ["x", "sin"]


@pytest.mark.parametrize("trace", [False, True])  # memory planned / counted at run time
def test_recycling_reuses_buffers_and_lowers_the_peak(trace):
    with mg.Graph() as g:
        x = mg.placeholder(shape=(256, 256), name="x")
        y = x
        for _ in range(20):
            y = mg.tanh(y) * 0.5
    feeds = {x: np.ones((256, 256))}
    recycled = mg.Session(g, recycle=True, trace=trace)
    keep = mg.Session(g, recycle=False, trace=trace)
    a, b = recycled.run(y, feeds), keep.run(y, feeds)
    np.testing.assert_array_equal(a, b)
    assert recycled._accounting == keep._accounting == ("dynamic" if trace else "planned")
    r, k = recycled.last_run, keep.last_run
    one = 256 * 256 * 8
    assert r.total_bytes == k.total_bytes == 40 * one  # 40 results computed
    # keep-everything would hold all 40; freeing after the last reader keeps 2 alive
    assert r.lower_bound["cpu"] == k.lower_bound["cpu"] == 2 * one
    assert k.peak_bytes["cpu"] == k.lower_bound["cpu"]  # no pool: held memory is live memory
    assert r.peak_bytes["cpu"] <= 3 * one  # the pool hands freed buffers to new results


def test_cost_classes():
    with mg.Graph():
        small = mg.placeholder(shape=(4,))
        large = mg.placeholder(shape=(LARGE_ELEMENTS,))
        m = mg.placeholder(shape=(4, 4))
        assert static_cost(small + 1.0) == "cheap"
        assert static_cost(large + 1.0) == "expensive"
        assert static_cost(m @ m) == "expensive"
        assert static_cost(m.reshape(16)) == "cheap"
        assert static_cost(large.sum()) == "expensive"


def test_measured_cost_model_moves_nodes_by_their_moving_average():
    from minigraph.runtime.cost import CHEAP_SECONDS, CostModel

    with mg.Graph() as g:
        m = mg.placeholder(shape=(2, 2), name="m")
        p = m @ m
    model = CostModel()
    assert model.cost(p) == "expensive"  # static class until measured
    model.record(p.name, CHEAP_SECONDS / 10)
    assert model.cost(p) == "expensive"  # one measurement is not trusted yet
    model.record(p.name, CHEAP_SECONDS / 10)
    assert model.cost(p) == "cheap"
    for _ in range(20):
        model.record(p.name, CHEAP_SECONDS * 10)
    assert model.cost(p) == "expensive"
    sess = mg.Session(g, workers=2, cost_model="measured")  # the session feeds the model
    for _ in range(3):
        sess.run(p, {m: np.eye(2)})
    assert sess.costs.count[p.name] == 3


def test_cheap_successors_run_inline_on_the_same_thread():
    with mg.Graph() as g:
        m = mg.placeholder(shape=(64, 64), name="m")
        a = m @ m  # expensive: goes to the pool
        other = (m * 2.0) @ m  # another, which can overlap with a: the run uses the pool
        chain = a
        for _ in range(5):
            chain = chain.reshape(4096).reshape(64, 64)  # cheap: inline after a
    sess = mg.Session(g, workers=4, trace=True)
    sess.run([chain, other], {m: np.eye(64)})
    tids = {e["name"]: e["tid"] for e in sess.last_run.events}
    cheap = [e for e in sess.last_run.events if e["op"] == "reshape"]
    assert {e["tid"] for e in cheap} == {tids[a.name]}


def _boom(message, exc=RuntimeError):
    def impl(xp, x):
        raise exc(message)
    return Primitive("boom", impl, same, vjp=[None])


@pytest.mark.parametrize("workers", WORKERS)
def test_a_failure_stops_the_run_and_the_session_survives(workers):
    with mg.Graph() as g:
        x = mg.placeholder(shape=(8, 8), name="x")
        branches = [mg.tanh(x @ x) for _ in range(6)]
        bad = g.add(_boom("injected"), (branches[2],), {})  # created here
        after = mg.sin(bad) + branches[0]
        ok = branches[1] * 2.0
    sess = mg.Session(g, workers=workers)
    with pytest.raises(NodeError, match=r"(?s)node 'boom' \(boom\) failed.*injected.*test_scheduler.py"):
        sess.run([after, ok], {x: np.ones((8, 8))})
    ran = sess.last_run.order  # how far the failed run got
    assert "boom" in ran and "sin" not in ran and after.name not in ran  # nothing downstream
    assert threading.active_count() < 50  # no thread left behind waiting
    np.testing.assert_allclose(sess.run(ok, {x: np.ones((8, 8))}),
                               2 * np.tanh(np.ones((8, 8)) @ np.ones((8, 8))))


@pytest.mark.parametrize("workers", [1, 4])
def test_ctrl_c_stops_a_run_cleanly(workers):
    with mg.Graph() as g:
        x = mg.placeholder(shape=(4,), name="x")
        stop = g.add(_boom("Ctrl-C", KeyboardInterrupt), (x,), {})
        out = mg.sin(stop)
        fine = mg.cos(x)
    sess = mg.Session(g, workers=workers)
    with pytest.raises(KeyboardInterrupt):
        sess.run(out, {x: np.ones(4)})
    np.testing.assert_allclose(sess.run(fine, {x: np.zeros(4)}), np.ones(4))


def test_a_10000_node_graph_on_4_workers():
    n = 10_000
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        layer = [x * float(k) for k in range(1, 101)]  # 100 independent chains
        for _ in range(n // 100 - 1):
            layer = [mg.sin(v) for v in layer]
        total = mg.add_n(layer)
    serial = mg.Session(g).run(total, {x: 0.5})
    with mg.Session(g, workers=4) as sess:
        assert sess.run(total, {x: 0.5}) == serial
        assert len(sess.last_run.order) == len(g.nodes)


def test_run_async_returns_a_future():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        z = mg.exp(x)
    with mg.Session(g, workers=2) as sess:
        future = sess.run_async(z, {x: 1.0})
        assert future.result(timeout=10) == pytest.approx(np.e)


def test_events_chrome_trace_and_gantt(tmp_path):
    with mg.Graph() as g:
        x = mg.placeholder(shape=(32, 32), name="x")
        z = mg.tanh(x @ x) + mg.sin(x)
    sess = mg.Session(g, workers=2, trace=True)
    sess.run(z, {x: np.ones((32, 32))})
    stats = sess.last_run
    assert {e["name"] for e in stats.events} == set(stats.order)
    for e in stats.events:
        assert e["pid"] == "cpu" and e["dur"] >= 0 and e["cost"] in ("cheap", "expensive")
    trace = json.loads(open(stats.to_chrome_trace(str(tmp_path / "t.json"))).read())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(stats.events)
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    ax = stats.gantt()
    assert len(ax.collections) == len(stats.events)
    stats.plot_memory()


def test_poisoning_catches_a_read_after_free():
    """If recycling freed a value too early, poisoned (NaN) data would reach the result."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(64,), name="x")
        a = mg.sin(x)
        b = mg.cos(a)  # a is read again below, after b: it must not be freed after b
        c = mg.exp(b) + a
    for w in (1, 2):
        with mg.Session(g, workers=w, debug=True) as sess:
            v = sess.run(c, {x: np.linspace(0, 1, 64)})
    expected = np.exp(np.cos(np.sin(np.linspace(0, 1, 64)))) + np.sin(np.linspace(0, 1, 64))
    np.testing.assert_allclose(v, expected)
    assert not np.isnan(v).any()


@pytest.mark.parametrize("workers", [1, 2])
def test_freed_values_really_leave_the_process(workers):
    """The counters are not enough: the run must drop its own references too (measured
    from outside with tracemalloc, which sees NumPy's allocations)."""
    import tracemalloc

    with mg.Graph() as g:
        x = mg.placeholder(shape=(256, 256), name="x")
        y = x
        for _ in range(20):
            y = mg.tanh(y) * 0.5
    one = 256 * 256 * 8
    # recycle=False: no pool to reuse the buffers, so only freeing keeps the peak low
    with mg.Session(g, workers=workers, recycle=False) as sess:
        sess.run(y, {x: np.ones((256, 256))})  # plans the graph first
        tracemalloc.start()
        try:
            sess.run(y, {x: np.ones((256, 256))})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    # the feed, two live values and a little bookkeeping; keeping all 40 would be 40 MB
    assert peak < 5 * one


def test_the_calling_thread_runs_cheap_roots_and_hands_out_expensive_nodes():
    with mg.Graph() as g:
        a = mg.placeholder((64, 64), name="a")
        w1, w2 = mg.constant(np.eye(64), name="w1"), mg.constant(np.eye(64), name="w2")
        out = (a @ w1) + (a @ w2)  # two expensive matmuls, made ready by cheap roots
    with mg.Session(g, workers=2, trace=True) as sess:
        sess.run(out, {a: np.ones((64, 64))})
        events = sess.last_run.events
    caller = next(e["tid"] for e in events if e["name"] == "w1")
    assert all(e["tid"] == caller for e in events if e["name"] in ("a", "w1", "w2"))
    assert all(e["tid"] != caller for e in events if e["cost"] == "expensive")


# -- memory decided at plan time (memory.MemoryPlan) against the dynamic accounting ----------

WRITABLE_OPS = ["add", "sub", "mul", "tanh", "sin", "matmul"]  # each has an out kernel

# Ops computed by a kernel without an out form, each keeping the DAG's shape (4, 4): a
# full sum (a NumPy scalar, then a 0-d buffer), sums over an axis (new arrays), views
# (a transpose, identity, rows reversed, a broadcast; a reshape to (2, 8) and back,
# which copies an array that is not C-ordered), and a sigmoid (of a transposed array
# it returns Fortran order).
UNWRITABLE = {
    "fullsum": lambda a, b: mg.sum(a) * 0.01 + b,
    "rowsum": lambda a, b: a.sum(axis=1, keepdims=True) * 0.1 + b,
    "colsum": lambda a, b: mg.sum(a, axis=0) * 0.1 + b,
    "transpose": lambda a, b: mg.transpose(a),
    "identity": lambda a, b: mg.identity(a),
    "reverse": lambda a, b: a[::-1],
    "broadcast": lambda a, b: mg.broadcast_to(mg.sum(a, axis=0), (4, 4)),
    "reshape": lambda a, b: mg.reshape(mg.reshape(a, (2, 8)), (4, 4)),
    "sigmoid": lambda a, b: mg.sigmoid(a),
}


def same_statistics(planned, dynamic):
    """The statistics a run reports, from a planned and a dynamic (traced) run."""
    a, b = planned.last_run, dynamic.last_run
    assert a.order == b.order
    assert a.peak_bytes == b.peak_bytes
    assert a.lower_bound == b.lower_bound
    assert a.total_bytes_by_device == b.total_bytes_by_device
    assert a.total_bytes == b.total_bytes


def planned_agrees_with_dynamic(g, fetches, feeds, accounting, recycle=True):
    """Run ``fetches`` twice (the first run plans, the second only runs the plan) in a
    session and in a traced one, whose accounting is dynamic: the first's accounting is
    ``accounting``, its values the dynamic run's bit for bit, its statistics the same.
    Returns its last values."""
    planned, dynamic = mg.Session(g, recycle=recycle), mg.Session(g, recycle=recycle, trace=True)
    for _ in range(2):
        got = planned.run(fetches, feeds)
        assert planned._accounting == accounting
        expected = dynamic.run(fetches, feeds)
        same_statistics(planned, dynamic)
        for p, e in zip(got, expected):
            np.testing.assert_array_equal(p, e)
    return got


def count_live_bytes(g, order, fetches, fed):
    """An oracle for a serial run's memory that shares no code with ``memory.Memory``:
    walk the order, add each computed value's bytes, drop a value after its last reader
    in the plan (never a fetched or fed one), and return (bytes produced, the peak of
    live bytes), the run's ``total_bytes`` and liveness lower bound."""
    node = {n.name: n for n in g.nodes}
    ran, fetched, fed = set(order), {f.name for f in fetches}, {n.name for n in fed}
    size = {k: 8 * int(np.prod(node[k].shape)) for k in order}  # float64
    readers = dict.fromkeys(order, 0)
    for k in order:
        for i in {i.name for i in node[k].inputs} & ran:
            readers[i] += 1
    live = peak = total = 0
    for k in order:
        if k not in fed:
            live, total = live + size[k], total + size[k]
            peak = max(peak, live)
        for i in {i.name for i in node[k].inputs} & ran:
            readers[i] -= 1
            if readers[i] == 0 and i not in fetched and i not in fed:
                live -= size[i]
        if readers[k] == 0 and k not in fetched and k not in fed:
            live -= size[k]  # nobody reads it
    return total, peak


@given(dags(ops=WRITABLE_OPS), st.data())
def test_planned_memory_reports_what_the_dynamic_accounting_counts(dag, data):
    g, x, y, nodes = build(dag)
    picks = data.draw(st.lists(st.integers(2, len(nodes) - 1), min_size=1, max_size=3))
    fetches = [nodes[k] for k in picks]  # (repeats too: run([a, a]))
    feeds = {x: X, y: Y}
    if data.draw(st.booleans()):  # an inner node fed: it takes no buffer of its own
        inner = nodes[data.draw(st.integers(2, len(nodes) - 1))]
        feeds[inner] = np.full((4, 4), 0.5)
    recycle = data.draw(st.booleans())
    with mg.Session(g, recycle=recycle) as planned, \
            mg.Session(g, recycle=recycle, trace=True) as dynamic:  # traced: dynamic
        expected = dynamic.run(fetches, feeds)
        total, lower = count_live_bytes(g, dynamic.last_run.order, fetches, feeds)
        assert dynamic.last_run.total_bytes == total  # the dynamic count, checked on its own
        assert dynamic.last_run.lower_bound["cpu"] == lower
        for _ in range(2):  # the first run plans, the second only runs the plan
            values = planned.run(fetches, feeds)
            assert planned._accounting == "planned" and dynamic._accounting == "dynamic"
            same_statistics(planned, dynamic)
            for v, e in zip(values, expected):
                np.testing.assert_array_equal(v, e)  # bit for bit
        for i, v in enumerate(values):  # each value the caller's own
            assert not any(np.shares_memory(v, w) for w in values[i + 1:] if w is not v)


def test_planned_memory_with_constants_variables_and_assign():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="x")
        c = mg.constant(np.arange(3.0), name="c")
        v = mg.variable(np.ones(3), name="v")
        h = mg.sin(x) * c + v
        step = v.assign(mg.tanh(h))
        out = h * 2.0
    planned, dynamic = mg.Session(g), mg.Session(g, trace=True)
    for _ in range(3):  # each run assigns: both sessions see the same variable
        before = v.numpy()
        a = planned.run([out, step], {x: np.linspace(0, 1, 3)})
        v.value = v.device.asarray(before)  # undone, so that the other run starts alike
        b = dynamic.run([out, step], {x: np.linspace(0, 1, 3)})
        assert planned._accounting == "planned"
        same_statistics(planned, dynamic)
        for p, d in zip(a, b):
            np.testing.assert_array_equal(p, d)


def _returns_a_view(xp, a, out=None):
    return a[...]  # ignores out: a view of its input, not the buffer it was given


VIEW = Primitive("view_of_input", _returns_a_view, same, vjp=[None], out=_returns_a_view)


@pytest.mark.parametrize("recycle", [True, False])
def test_a_kernel_that_returns_a_view_makes_the_run_fall_back(recycle):
    with mg.Graph() as g:
        x = mg.placeholder(shape=(8,), name="x")
        kept = mg.exp(x)
        c = mg.sin(x) * mg.cos(x)  # the buffers of sin and cos go to the pool
        viewed = g.add(VIEW, (c,), {})  # takes one of them, but returns a view of c
        e = mg.tanh(viewed) + viewed  # the run goes on, counted node by node ...
        d = mg.sin(e) * kept * c  # ... from the state the plan had reached
    feeds = {x: np.linspace(0, 1, 8)}
    got = planned_agrees_with_dynamic(g, [d, viewed, c], feeds, "fallback", recycle)
    assert not np.shares_memory(got[0], got[1])


def _fails_into(xp, a, out=None):
    raise ValueError("no room")


@pytest.mark.parametrize("recycle", [True, False])
def test_a_failure_in_a_planned_run_reports_how_far_it_got(recycle):
    with mg.Graph() as g:
        x = mg.placeholder(shape=(16,), name="x")
        a = mg.cos(mg.sin(x) * 2.0)
        bad = g.add(Primitive("fails_into", _fails_into, same, vjp=[None], out=_fails_into),
                    (a,), {})
        z = mg.exp(bad) + a
    feeds = {x: np.ones(16)}
    planned, dynamic = mg.Session(g, recycle=recycle), mg.Session(g, recycle=recycle, trace=True)
    for sess in (planned, dynamic):
        with pytest.raises(NodeError, match=r"(?s)fails_into.*no room.*test_scheduler.py"):
            sess.run(z, feeds)
    assert planned._accounting == "planned"
    assert planned.last_run.order[-1] == "fails_into"
    same_statistics(planned, dynamic)
    np.testing.assert_allclose(planned.run(a, feeds), np.cos(np.sin(np.ones(16)) * 2.0))


def test_a_plan_the_model_cannot_know_keeps_the_dynamic_accounting(strict_devices):
    """On the Array API's devices (no out=, and results of their own kinds) the model
    does not know what a kernel returns, even where NumPy's would be planned."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(4, 4), name="x")
        y = (x * 2.0).reshape(16).sum()  # planned on NumPy, not on array-api-strict
    for sess in (mg.Session(g), mg.Session(g, workers=2, debug=True)):
        sess.run(y, {x: np.ones((4, 4))})
        assert sess._accounting == "dynamic"


@pytest.mark.parametrize("case", ["index", "checkpoint"])
def test_a_view_the_model_cannot_foresee_keeps_the_dynamic_accounting(case):
    """An index with an integer array copies, a checkpoint returns whatever its function
    does: views by their primitive, but the model does not assume a view of either."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(4, 4), name="x")
        if case == "index":
            y = mg.sin(x[np.array([0, 2])])  # an integer-array index: a copy
        else:
            y = mg.checkpoint(lambda a: mg.sin(a) * 2.0)(x)  # a view only if f returns a
    sess = mg.Session(g)
    sess.run(y, {x: np.ones((4, 4))})
    assert sess._accounting == "dynamic"


def expected_accounting(g, order, fed, recycle):
    """An oracle for whether a serial run keeps its memory plan, from layouts alone.
    Each node gets an empty NumPy array laid out as its value is: the same view of its
    input's for a view, a new C-ordered array for any other kernel, and for a sigmoid a
    ufunc's result on its input's (which follows the input's layout). A reshape that
    copies breaks the plan's assumption (a view): the run falls back. A sigmoid of an
    array that is not C-ordered breaks it only if a node still to run would take its
    result from the pool (so not without recycling)."""
    ran, fed = set(order), {n.name for n in fed}
    like, maybe = {}, False
    for n in g.nodes:  # (in creation order: inputs first)
        source = like.get(n.inputs[0].name) if n.inputs else None
        if n.name in fed or source is None:
            like[n.name] = np.empty(n.shape)
            continue
        views = {"transpose": lambda: source.T, "identity": lambda: source,
                 "reshape": lambda: source.reshape(n.shape),
                 "getitem": lambda: source[n.params["index"]],
                 "broadcast_to": lambda: np.broadcast_to(source, n.shape),
                 "sigmoid": lambda: np.positive(source)}  # (a ufunc: its layout rule)
        like[n.name] = views.get(n.op, lambda: np.empty(n.shape))()
        if n.name in ran:
            if n.op == "reshape" and not np.shares_memory(like[n.name], source):
                return {"fallback"}
            maybe = maybe or (n.op == "sigmoid" and recycle and not source.flags.c_contiguous)
    return {"planned", "fallback"} if maybe else {"planned"}


@given(dags(ops=WRITABLE_OPS + list(UNWRITABLE)), st.data())
def test_planned_memory_covers_kernels_without_an_out_form(dag, data):
    """The same as a dynamic run with sums (a NumPy scalar, new arrays) and views in the
    plan, planned where every kernel returns what the plan assumed, and falling back
    where one does not (a reshape that copies, a Fortran-ordered result)."""
    g, x, y, nodes = build(dag)
    inner = [n for n in g.nodes if n.op != "Placeholder"]  # (the sums, the views ... too)
    # the last few nodes, which read much of the DAG (about one run in 15 falls back),
    # and any others: a scalar, a view, a reshape's copy
    picks = nodes[2:][-3:] + data.draw(st.lists(st.sampled_from(inner), max_size=3))
    feeds = {x: X, y: Y}
    if data.draw(st.booleans()):
        fed = nodes[data.draw(st.integers(2, len(nodes) - 1))]
        feeds[fed] = np.full((4, 4), 0.5)
    recycle = data.draw(st.booleans())
    with mg.Session(g, recycle=recycle) as planned, \
            mg.Session(g, recycle=recycle, trace=True) as dynamic:
        expected = dynamic.run(picks, feeds)
        accounting = expected_accounting(g, dynamic.last_run.order, feeds, recycle)
        for _ in range(2):
            values = planned.run(picks, feeds)
            assert planned._accounting in accounting
            same_statistics(planned, dynamic)
            for v, e in zip(values, expected):
                assert type(v) is type(e)  # (a NumPy scalar stays one)
                np.testing.assert_array_equal(v, e)  # bit for bit
        for i, v in enumerate(values):  # each value the caller's own
            assert not any(np.shares_memory(v, w) for w in values[i + 1:] if w is not v)


@pytest.mark.parametrize("recycle", [True, False])
def test_a_reshape_that_copies_makes_the_run_fall_back(recycle):
    with mg.Graph() as g:
        x = mg.placeholder(shape=(4, 6), name="x")
        h = mg.exp(x) * 2.0  # its buffer is the run's own
        flat = mg.reshape(h, (24,))  # a view: planned
        viewed = mg.transpose(h)  # a view, of which ...
        copied = mg.reshape(viewed, (24,))  # ... a reshape copies: the plan breaks here
        out = mg.sum(flat * copied) + mg.sum(mg.sin(viewed), axis=0)
    feeds = {x: np.linspace(0, 1, 24).reshape(4, 6)}
    planned_agrees_with_dynamic(g, [out, flat, copied], feeds, "fallback", recycle)


@pytest.mark.parametrize("recycle", [True, False])
def test_a_buffer_held_through_a_view_goes_to_the_pool_as_itself(recycle):
    """When the last user of a buffer is a view of another shape, the pool gets the
    buffer, not the view: a later node of the buffer's shape writes into it."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(4, 6), name="x")
        flat = mg.reshape(mg.exp(x), (24,))  # exp's only reader: its buffer now lives on
        z = mg.sin(flat)  # through the view, which dies here: the buffer goes to the pool
        out = mg.reshape(z, (4, 6)) * 2.0  # a (4, 6) node takes it
    feeds = {x: np.linspace(0, 1, 24).reshape(4, 6)}
    planned_agrees_with_dynamic(g, [out], feeds, "planned", recycle)


def _returns_its_input(xp, a):
    return a  # no view primitive, and yet not a new array


def _reversed(xp, a):
    return a[::-1]  # no view primitive, and yet a view of its input


def _zero_d(xp, a):
    return xp.asarray(xp.sum(a))  # a 0-d array, not the NumPy scalar of a full sum


SAME = Primitive("returns_its_input", _returns_its_input, same, vjp=[None])
REVERSED = Primitive("reversed", _reversed, same, vjp=[None])
ZERO_D = Primitive("zero_d", _zero_d, lambda a: ((), a.dtype), vjp=[None])


@pytest.mark.parametrize("recycle", [True, False])
@pytest.mark.parametrize("odd", ["input", "view", "zero_d", "zero_d_pooled", "fortran",
                                 "fortran_pooled"])
def test_a_kernel_that_returns_another_kind_of_value_makes_the_run_fall_back(recycle, odd):
    """A kernel that returns its input, or a view of it, breaks the plan. A 0-d array where the plan
    assumed a NumPy scalar, or a Fortran-ordered array where it assumed C order, breaks
    it only where the dynamic accounting would have given the array to a node still to
    run (with recycling, a node of its shape after it dies); else the plan holds."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(5, 3), name="x")
        a = mg.sin(x) * 3.0
        if odd == "input":
            b = g.add(SAME, (a,), {})  # Memory counts it as a's memory, not a new array
        elif odd == "view":
            b = g.add(REVERSED, (a,), {})  # the same
        elif odd.startswith("zero_d"):
            zero_d = g.add(ZERO_D, (a,), {})
            if odd == "zero_d_pooled":  # it dies after cos, and sin wants a 0-d buffer
                zero_d = mg.sin(mg.cos(zero_d))
            b = zero_d + a
        else:
            f = mg.sigmoid(mg.transpose(a))  # sigmoid: Fortran order
            if odd == "fortran_pooled":  # it dies after cos, and sin wants a (3, 5) buffer
                f = mg.sin(mg.cos(f))
            b = mg.transpose(f)
        out = mg.cos(b) * a + mg.sum(b, axis=1, keepdims=True)
    breaks = odd in ("input", "view") or (odd.endswith("pooled") and recycle)
    feeds = {x: np.linspace(-1, 1, 15).reshape(5, 3)}
    planned_agrees_with_dynamic(g, [out, b], feeds, "fallback" if breaks else "planned", recycle)


def test_a_training_step_of_a_small_mlp_runs_planned():
    """The benchmark's graph (matmul, add, relu, cross_entropy, mg.gradients; float32)
    has views (transposes), sums, log_softmax and nll_loss (a NumPy scalar), none with an
    out kernel: its runs are planned now, with the dynamic run's values and statistics,
    and the gradients worked out by hand in NumPy."""
    rng = np.random.default_rng(3)
    shapes = {"w1": (8, 16), "b1": (16,), "w2": (16, 5), "b2": (5,), "x": (12, 8)}
    arrays = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    labels = rng.integers(0, 5, size=12)
    with mg.Graph() as g:
        ph = {k: mg.placeholder(s, "float32", name=k) for k, s in shapes.items()}
        ys = mg.placeholder((12,), "int64", name="labels")
        hidden = mg.relu(ph["x"] @ ph["w1"] + ph["b1"])
        loss = mg.cross_entropy(hidden @ ph["w2"] + ph["b2"], ys)
        grads = mg.gradients(loss, [ph[k] for k in ("w1", "b1", "w2", "b2")])
    feeds = {ph[k]: v for k, v in arrays.items()}
    feeds[ys] = labels
    planned, dynamic = mg.Session(g), mg.Session(g, trace=True)
    for _ in range(2):
        got = planned.run([loss, *grads], feeds)
        assert planned._accounting == "planned"
        expected = dynamic.run([loss, *grads], feeds)
        same_statistics(planned, dynamic)
        for p, e in zip(got, expected):
            assert p.dtype == np.float32 and type(p) is type(e)
            np.testing.assert_array_equal(p, e)
    # by hand: softmax minus one-hot, averaged over the batch, through the layers
    w1, b1, w2, b2, x = (arrays[k] for k in ("w1", "b1", "w2", "b2", "x"))
    pre = x @ w1 + b1
    h = np.maximum(pre, 0)
    logits = h @ w2 + b2
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    want_loss = -np.log(p[np.arange(12), labels]).mean()
    d = (p - np.eye(5, dtype=np.float32)[labels]) / 12
    dh = (d @ w2.T) * (pre > 0)
    want = [x.T @ dh, dh.sum(axis=0), h.T @ d, d.sum(axis=0)]
    np.testing.assert_allclose(got[0], want_loss, rtol=1e-5)
    for p_, w in zip(got[1:], want):
        np.testing.assert_allclose(p_, w, rtol=1e-4, atol=1e-6)


def test_two_comparisons_results_are_counted_once_each():
    """NumPy hands out one np.True_: the second comparison's result, the same object,
    was taken for a view of the first and counted no bytes when the run was traced (41
    of the 42 bytes by hand: 8 + 1 + 24 + 8 + 1), where the planned count said 42."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="x")
        p = mg.sum(x) > 0.0
        q = mg.sum(x * 2.0) > 0.0
    for options in ({}, {"trace": True}):
        sess = mg.Session(g, workers=1, **options)
        sess.run([p, q], {x: np.ones(3)})
        assert sess.last_run.total_bytes == 42, options
