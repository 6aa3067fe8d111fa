"""What a run reports and how it is shown: memory counts with fed nodes, the plan cache,
trace threads and transfer arrows, closing from a callback, DOT text, drawings, explain."""

from __future__ import annotations

import shutil
import subprocess
import threading

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import minigraph as mg  # noqa: E402
from minigraph.autodiff.explain import explain  # noqa: E402
from minigraph.runtime import scheduler, session  # noqa: E402
from minigraph.runtime.profile import RunStats  # noqa: E402
from minigraph.viz import draw, timeline  # noqa: E402


def _sin_read_only_by_a_fed_node():
    """sin(x) is in the plan through a control dependency; its one data reader, cos,
    is fed."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(1000,), name="x")
        a = mg.sin(x)
        b = mg.cos(a)
        with mg.control_dependencies([a]):
            e = mg.exp(x)
        out = b * e
    return g, out, {x: np.ones(1000), b: np.full(1000, 2.0)}


def test_fed_node_does_not_count_as_a_reader():
    """A fed node was counted as a reader of its inputs: run first, it counted sin's
    readers down before sin existed, and the planned run failed with a bare KeyError
    (every run after it too); a traced run kept sin alive to the end (peak 24000 B)."""
    g, out, feeds = _sin_read_only_by_a_fed_node()
    expected = 2.0 * np.exp(np.ones(1000))
    s = mg.Session(g)
    for _ in range(2):
        np.testing.assert_allclose(s.run(out, feeds), expected)
    t = mg.Session(g, trace=True)
    np.testing.assert_allclose(t.run(out, feeds), expected)
    # hand count: sin (8000 B) is read by nobody and dies at once; exp and mul live
    st = t.last_run
    assert (st.peak_bytes["cpu"], st.lower_bound["cpu"], st.total_bytes) == (16000, 16000, 24000)


def test_plan_is_cached_only_once_its_memory_plan_is_made(monkeypatch):
    """The plan was cached before its memory plan: when making the memory plan failed,
    every later run of the same fetches failed on a bare KeyError."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="x")
        y = mg.sin(x) * 2.0
    real = session.plan_memory

    def fails_once(*args):
        monkeypatch.setattr(session, "plan_memory", real)
        raise RuntimeError("planning failed")

    monkeypatch.setattr(session, "plan_memory", fails_once)
    s = mg.Session(g)
    with pytest.raises(RuntimeError, match="planning failed"):
        s.run(y, {x: np.arange(3.0)})
    np.testing.assert_allclose(s.run(y, {x: np.arange(3.0)}), np.sin(np.arange(3.0)) * 2.0)


def test_threaded_run_holds_no_bytes_for_a_fed_out_node():
    """A fed node with an out kernel (a fed matmul) took a buffer from the pool in a
    threaded run and dropped it without counting it as given back: ``held`` stayed
    above what live values and the pool held. At the end the pool is empty, so held
    must equal live."""
    n = 100
    with mg.Graph() as g:
        x = mg.placeholder(shape=(n, n), name="x")
        m = [mg.matmul(x, x + float(k)) for k in range(4)]
        chains = []
        for h in m:
            for _ in range(6):
                h = mg.cos(mg.sin(h))
            chains.append(h)
        out = chains[0] + chains[1] + chains[2] + chains[3]
    feeds = {x: np.full((n, n), 0.01)}
    feeds.update({mk: np.full((n, n), 0.1 * k) for k, mk in enumerate(m)})
    expected = 0.0
    for k in range(4):
        h = np.full((n, n), 0.1 * k)
        for _ in range(6):
            h = np.cos(np.sin(h))
        expected = expected + h
    s = mg.Session(g, workers=2, trace=True)
    for _ in range(3):
        np.testing.assert_allclose(s.run(out, feeds), expected)
        _, _, live, held = s.last_run.memory_curve[-1]
        assert held == live
        assert s.last_run.peak_bytes["cpu"] <= s.last_run.total_bytes


def test_trace_thread_0_is_the_caller():
    """Threads were numbered in the order they first finished a node: when every root
    is expensive the caller runs none, and a pool worker became 'thread 0 (caller)'."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(50, 50), name="x")
        m1 = x @ x
        m2 = (x * 2.0) @ x
        out = m1 @ m2
    ran_on = {}
    real = scheduler.Run._event

    def event(self, node, start, end):
        ran_on[node.name] = threading.get_ident()
        return real(self, node, start, end)

    s = mg.Session(g, workers=2, trace=True)
    try:
        scheduler.Run._event = event
        s.run(out, {m1: np.ones((50, 50)), m2: np.ones((50, 50))})
    finally:
        scheduler.Run._event = real
    for e in s.last_run.events:
        assert (e["tid"] == 0) == (ran_on[e["name"]] == threading.get_ident()), e["name"]


def test_transfer_arrow_never_points_back_in_time():
    """The arrow from a Send to its Recv started at the end of the Send's slice, but the
    Recv can start before the Send's thread reads the clock again: the arrow went back
    in time. It starts where the tensor was handed over (the Send's start if the event
    does not say)."""
    send = {"name": "send", "op": "Send", "cost": "cheap", "ts": 10.0, "dur": 5.0,
            "pid": "cpu", "tid": 0, "key": "k"}
    recv = {"name": "recv", "op": "Recv", "cost": "cheap", "ts": 12.0, "dur": 1.0,
            "pid": "cpu:1", "tid": 0, "key": "k"}
    stats = RunStats(["send", "recv"], [send, recv], {}, {}, {}, [])
    flow = {e["ph"]: e["ts"] for e in stats.chrome_trace()["traceEvents"] if e["ph"] in "sf"}
    assert flow["s"] <= flow["f"]
    # a real run: the hand-over lies inside the Send's slice, and before the Recv starts
    with mg.Graph() as g:
        x = mg.placeholder(shape=(100, 100), name="x")
        with mg.device("cpu:1"):
            b = mg.sin(x.to("cpu:1")) @ mg.cos(x.to("cpu:1"))
        z = mg.tanh(x @ x) + b.to("cpu")
    s = mg.Session(g, workers=2, trace=True)
    for _ in range(5):
        s.run(z, {x: np.full((100, 100), 0.01)})
        sends = [e for e in s.last_run.events if e["op"] == "Send"]
        assert sends and all(0 <= e["handed"] <= e["dur"] for e in sends)
        ends: dict = {}
        for e in s.last_run.chrome_trace()["traceEvents"]:
            if e["ph"] in ("s", "f"):
                ends.setdefault(e["id"], {})[e["ph"]] = e["ts"]
        assert all(t["s"] <= t["f"] for t in ends.values())


def test_close_in_a_done_callback_on_the_background_thread():
    """close() from a run_async future's done callback, which runs on the session's
    background thread, raised RuntimeError('cannot join current thread') and left the
    background pool alive."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(200, 200), name="x")
        y = x
        for _ in range(30):
            y = mg.tanh(y @ x)
        z = y.sum()
    s = mg.Session(g)
    slow = s.run_async(z, {x: np.eye(200) * 0.5})  # keeps the thread busy meanwhile
    done = threading.Event()
    result: dict = {}

    def callback(future):
        result["thread"] = threading.current_thread().name
        try:
            s.close()
            result["ok"] = True
        except Exception as exc:  # noqa: BLE001 - the test reports it
            result["error"] = exc
        done.set()

    fast = s.run_async(x.sum(), {x: np.ones((200, 200))})
    fast.add_done_callback(callback)
    assert done.wait(20)
    assert result["thread"].startswith("minigraph-async")  # (where the bug was)
    assert result.get("ok"), result.get("error")
    assert fast.result() == 40000.0 and np.isfinite(slow.result())
    assert s._background is None
    with pytest.raises(mg.runtime.session.SessionClosedError):
        s.run(x.sum(), {x: np.ones((200, 200))})


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
def test_to_dot_escapes_quotes_and_backslashes():
    """Names went into DOT quoted strings as they are: a '"' made invalid DOT, and a
    backslash started an escape (a node named 'p\\N' was drawn as 'pn0')."""
    def plain(text):
        r = subprocess.run(["dot", "-Tplain"], input=text, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    with mg.Graph(name='my "graph"') as g:
        x = mg.placeholder(shape=(), dtype="float64", name="p\\N")
        mg.sin(x) + mg.placeholder(shape=(), dtype="float64", name='say "hi"')
    out = plain(g.to_dot())
    assert '"p\\\\N\\nPlaceholder' in out.splitlines()[1]  # Graphviz's text of the label
    assert 'say \\"hi\\"' in out
    with mg.Graph() as g:
        x = mg.placeholder(shape=(2,), dtype="float64", name='in"put')
        with mg.device("cpu:1"):
            y = mg.sin(x)
        mg.sin(y)
    assert 'in\\"put' in plain(mg.partition(g).to_dot())


def test_explain_refuses_inputs_named_like_tangents_or_adjoints():
    """Inputs named dx (with an x) or ga (with an intermediate a) shared their names
    with the tangent and adjoint the traces print: dz = dx * dx + x * ddx, read as
    written, was not the derivative."""
    with pytest.raises(ValueError, match="'dx'.*tangent of 'x'"):
        explain(lambda x, dx: x * dx, x=2.0, dx=3.0)
    with pytest.raises(ValueError, match="'ga'.*adjoint of 'a'"):
        explain(lambda x, ga: mg.sin(x) * ga + x, x=2.0, ga=3.0)
    with pytest.raises(ValueError, match="'gz'"):
        explain(lambda x, gz: x * gz, x=2.0, gz=3.0)
    # names that only start like one are fine: d(x * delta)/dx = delta = 3
    assert "(g.3) gx = gz * delta = 3" in explain(lambda x, delta: x * delta, x=2.0, delta=3.0)


def test_explain_prints_an_index_array_by_its_values():
    """An integer-array index was printed as its type, index=(ndarray,): two indices
    with different derivatives gave the same text."""
    for idx in ([0, 0, 1], [1, 1, 0]):
        text = explain(lambda x, y: (mg.stack([x, y])[np.array(idx)] * 1.0).sum(), x=0.5, y=2.0)
        assert f"index=({idx},)" in text  # ([0, 0, 1] as Python writes the list)
        assert "ndarray" not in text
    long = np.arange(40) % 2
    text = explain(lambda x, y: mg.stack([x, y])[long].sum(), x=0.5, y=2.0)
    assert "index=([0, 1, 0, ..., 1, 0, 1],)" in text


def test_drawn_names_are_not_mathtext(tmp_path):
    """Node names went to matplotlib as they are: 'a$^$b' raised a mathtext parse error
    and '$x_1$' was drawn as math, not as the name."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="a$^$b")
        x1 = mg.placeholder(shape=(3,), name="$x_1$")
        y = mg.sin(x) * x1
    fig = draw.draw_forward_and_gradient(g)
    fig.savefig(tmp_path / "graph.png")
    texts = {t.get_text(): t for ax in fig.axes for t in ax.texts}
    assert {"a$^$b", "$x_1$"} <= set(texts)
    assert not texts["$x_1$"]._preprocess_math("$x_1$")[1]  # drawn literally
    s = mg.Session(g, trace=True)
    s.run(y, {x: np.ones(3), x1: np.ones(3)})
    ax = timeline.gantt(s.last_run, min_label_width=0.0)
    ax.figure.savefig(tmp_path / "gantt.png")


def test_plot_memory_of_a_run_that_allocated_nothing():
    """timeline.plot_memory raised min()'s 'empty sequence' for a run whose memory
    curve is empty (it fetched a view of a feed); its memory is 0 throughout."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="x")
        y = mg.reshape(x, (3, 1))
    s = mg.Session(g, trace=True)
    s.run(y, {x: np.ones(3)})
    assert s.last_run.memory_curve == [] and s.last_run.total_bytes == 0
    ax = timeline.plot_memory(s.last_run)
    assert ax.lines and all(np.all(np.asarray(line.get_ydata()) == 0) for line in ax.lines)
