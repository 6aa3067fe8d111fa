"""Runtime statistics, trace files, session settings, explain's formulas and the drawings'
gradient passes, checked against independent oracles.

The oracles: bytes counted by hand (a float64 is 8 bytes, a bool 1), PyTorch's autograd,
closed-form derivatives, and the file system itself. No minigraph mode is checked against
another.
"""

from __future__ import annotations

import json
import math
import os
import stat

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.autodiff.explain import evaluation_trace, explain, reverse_trace
from minigraph.errors import DTypeError
from minigraph.runtime.profile import TraceError
from minigraph.viz import draw

SETTINGS = (dict(), dict(trace=True), dict(debug=True))


def _stats(sess: mg.Session) -> tuple:
    st = sess.last_run
    return st.total_bytes, st.peak_bytes["cpu"], st.lower_bound["cpu"]


# -- 1. a NumPy scalar handed on is one buffer --------------------------------------------

def test_a_scalar_handed_on_is_counted_once_traced_or_not():
    """stop_gradient(sum(x)) and v.assign(sum(x)) hand on sum's NumPy scalar, yet traced
    and debug runs counted it twice (16 bytes for 8): the scalar was keyed by its node.
    Hand count: sum's 8 bytes are the only allocation."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(1000,), name="x")
        s = mg.sum(x)
        handed_on = [mg.stop_gradient(s), mg.variable(0.0, name="v").assign(s)]
    for fetch in handed_on:
        for settings in SETTINGS:
            sess = mg.Session(g, **settings)
            sess.run(fetch, {x: np.ones(1000)})
            assert _stats(sess) == (8, 8, 8), (fetch.name, settings)


def test_a_scalar_made_by_an_index_then_handed_on_is_counted_once():
    """sin(y)[0] makes a new NumPy scalar (8 bytes) and stop_gradient hands it on: a
    default session counted 48 bytes. Hand count: 4 * 8 (sin) + 8 = 40."""
    with mg.Graph() as g:
        y = mg.placeholder(shape=(4,), name="y")
        out = mg.stop_gradient(mg.sin(y)[0])
    for settings in SETTINGS:
        sess = mg.Session(g, **settings)
        sess.run(out, {y: np.ones(4)})
        assert sess.last_run.total_bytes == 40, settings


def test_a_scalar_sent_to_another_device_is_counted_once_on_its_own():
    """A Send's value is its input's: a 0-d sum sent from cpu to cpu:1 was counted twice
    on cpu (16 bytes). Hand count: sum's 8 bytes are the only allocation on cpu."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(100,), name="x")
        s = mg.sum(x)
        with mg.device("cpu:1"):
            y = s * 2.0
    sess = mg.Session(g)
    assert sess.run(y, {x: np.ones(100)}) == 200.0
    assert sess.last_run.total_bytes_by_device["cpu"] == 8
    assert sess.last_run.peak_bytes["cpu"] == 8


def test_equal_scalars_of_different_nodes_stay_different_buffers():
    """Two comparisons are both np.True_ (one object: NumPy has one), two sums of equal
    value two objects: each is a value of its own, counted once each, and their views
    add nothing. Also after the planned walk gave up at a reshape that copies (the
    fallback): the two np.True_ live then, and the scalars handed on come after it.
    Hand count: x * 2 (96) + 2 sums (16) + 2 bools (2) + the reshape's copy (96) + its
    sum (8) + the add (8) = 226; stop_gradient of a constant adds nothing."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3, 4), name="x")
        c = mg.constant(np.float64(2.5))
        b1 = mg.sum(x) > 0.0
        b2 = mg.sum(x * 2.0) > 0.0
        r = mg.reshape(mg.transpose(x), (12,))  # (a copy: the plan assumed a view)
        y = mg.sum(r) + mg.stop_gradient(c)
        fetches = [mg.stop_gradient(b1), mg.stop_gradient(b2), y]
    for settings in SETTINGS:
        sess = mg.Session(g, **settings)
        out = sess.run(fetches, {x: np.ones((3, 4))})
        assert out[0] is np.True_ and out[1] is np.True_ and out[2] == 14.5
        assert sess.last_run.total_bytes == 226, settings


# -- 2. a failed to_chrome_trace leaves the file as it was --------------------------------

def _graph() -> tuple[mg.Graph, mg.Node, mg.Node]:
    with mg.Graph() as g:
        x = mg.placeholder(shape=(100,), name="x")
        y = mg.sin(x) * 2.0
        z = mg.exp(y) + y
    return g, x, z


def test_a_failed_chrome_trace_leaves_the_existing_file(tmp_path, monkeypatch):
    """to_chrome_trace opened (emptied) the file before building the trace, so an
    untraced run's TraceError left it empty; a failure while writing must leave it too,
    and no temporary file behind."""
    g, x, z = _graph()
    path = str(tmp_path / "trace.json")
    traced = mg.Session(g, trace=True)
    traced.run(z, {x: np.ones(100)})
    traced.last_run.to_chrome_trace(path)
    before = open(path).read()
    assert len(json.loads(before)["traceEvents"]) > 0

    plain = mg.Session(g)
    plain.run(z, {x: np.ones(100)})
    with pytest.raises(TraceError):
        plain.last_run.to_chrome_trace(path)
    assert open(path).read() == before

    def full_disk(*args):
        raise OSError("No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        traced.last_run.to_chrome_trace(path)
    assert open(path).read() == before
    assert os.listdir(tmp_path) == ["trace.json"]


def test_a_chrome_trace_is_written_through_a_link_and_keeps_the_files_mode(tmp_path):
    """The atomic write replaced a link at the path by a file (the file it pointed to kept
    the old trace) and gave a private file the umask's mode: ``open(path, "w")`` writes
    through the link and keeps the mode."""
    g, x, z = _graph()
    traced = mg.Session(g, trace=True)
    traced.run(z, {x: np.ones(100)})
    target, link = tmp_path / "real.json", tmp_path / "trace.json"
    target.write_text("old")
    os.chmod(target, 0o600)
    link.symlink_to(target)
    traced.last_run.to_chrome_trace(str(link))
    assert link.is_symlink()
    assert len(json.loads(target.read_text())["traceEvents"]) > 0
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600


# -- 3. the session's settings: checked, and honoured when changed ----------------------

@pytest.mark.parametrize("setting", [dict(trace="no"), dict(recycle="no"), dict(debug="off"),
                                     dict(trace=None), dict(debug=1)])
def test_session_settings_must_be_bools(setting):
    """Session(g, trace="no") traced, recycle="no" recycled, debug="off" poisoned: any
    object was taken by its truthiness. Refused, at construction and when set later."""
    (name, value), = setting.items()
    with pytest.raises(TypeError, match=f"{name} must be True or False"):
        mg.Session(mg.Graph(), **setting)
    sess = mg.Session(mg.Graph())
    with pytest.raises(TypeError, match=f"{name} must be True or False"):
        setattr(sess, name, value)
    with pytest.raises(TypeError, match="workers must be an int"):
        sess.workers = "2"
    with pytest.raises(ValueError, match="workers must be >= 1"):
        sess.workers = 0


def test_changing_trace_after_the_first_run_takes_effect():
    """After sess.trace = True the run took the memory plan made for an untraced run: it
    said traced, with no events and an empty Chrome trace. Expected: one event per node
    (5 nodes), and the memory curve; back to False, an untraced run."""
    g, x, z = _graph()
    sess = mg.Session(g)
    sess.run(z, {x: np.ones(100)})
    assert not sess.last_run.traced
    sess.trace = True
    sess.run(z, {x: np.ones(100)})
    st = sess.last_run
    assert st.traced and [e["name"] for e in st.events] == ["x", "sin", "mul", "exp", "add"]
    assert sum(e["ph"] == "X" for e in st.chrome_trace()["traceEvents"]) == 5
    assert len(st.memory_curve) > 0
    sess.trace = False
    sess.run(z, {x: np.ones(100)})
    assert not sess.last_run.traced


def test_changing_recycle_and_debug_after_the_first_run_takes_effect():
    """The memory plan decided with recycle=True was used after sess.recycle = False,
    and the planned walk (which never poisons) after sess.debug = True.

    Hand count, FIFO order x, m, sin (800 bytes), sin_1 (400), sum (8): then sin's
    buffer is freed; recycled, it waits in the pool for mul, and sum_1 (8) makes the
    peak 1216 held while 1208 were live at most; not recycled, it goes at once and the
    peak held is the peak live, 1208."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(100,), name="x")
        m = mg.placeholder(shape=(50,), name="m")
        t = x * (mg.sum(mg.sin(x)) + mg.sum(mg.sin(m)))
    feeds = {x: np.ones(100), m: np.ones(50)}
    sess = mg.Session(g)
    sess.run(t, feeds)
    assert (sess.last_run.peak_bytes["cpu"], sess.last_run.lower_bound["cpu"]) == (1216, 1208)
    sess.recycle = False
    sess.run(t, feeds)
    assert (sess.last_run.peak_bytes["cpu"], sess.last_run.lower_bound["cpu"]) == (1208, 1208)
    sess.recycle = True
    sess.run(t, feeds)
    assert sess.last_run.peak_bytes["cpu"] == 1216
    sess.debug = True  # poisons what it frees: node by node, never the planned walk
    out = sess.run(t, feeds)
    assert sess._accounting == "dynamic"
    np.testing.assert_allclose(out, 100 * math.sin(1.0) + 50 * math.sin(1.0), rtol=1e-12)


# -- 4. explain's formulas compute the values printed after them --------------------------

def _evaluate(lines: list[str], env: dict) -> dict:
    """Each ``(k) name = formula = value`` line's formula evaluated, in order, with the
    values the formulas before it computed (not their short printed values)."""
    env = dict(env)
    for line in lines:
        name, rest = line.split(") ", 1)[1].split(" = ", 1)
        formula = rest.rpartition(" = ")[0]
        if formula:
            env[name] = eval(formula, {"cos": math.cos, "sin": math.sin}, env)  # noqa: S307
    return env


def test_explain_writes_constants_in_formulas_with_every_digit():
    """explain wrote constants with 6 significant digits: (x - 1.0000004) ** 2 at x = 1
    printed "a = x - 1 = -4e-07", and the printed formulas gave a gradient of 0.
    Oracle: torch.autograd, the printed formulas evaluated by Python."""
    c = 1.0000004
    lines = evaluation_trace(lambda x: (x - c) ** 2, x=1.0)
    lines += reverse_trace(lambda x: (x - c) ** 2, x=1.0)
    xt = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    zt = (xt - c) ** 2
    (gt,) = torch.autograd.grad(zt, xt)
    env = _evaluate(lines, {"x": 1.0, "gz": 1.0})
    assert env["z"] == zt.item() and env["gx"] == gt.item()
    assert "(a.2) a = x - 1.0000004 = -4e-07" in lines  # (the value after = stays short)
    # short constants are written as before (the textbook's traces)
    text = explain(lambda x, y: x * y + mg.sin(x) * 2.0 - 0.5, x=2.0, y=3.0)
    assert "c = b * 2 = 1.81859" in text and "z = d - 0.5 = 7.31859" in text


def test_explain_writes_float32_and_array_constants_with_every_digit():
    """A float32 constant is float32(0.1) = 0.10000000149011612 in a float64 formula,
    and an array constant [0.123456789, 2.0] was written [0.1235 2.    ]: the printed
    gradient formula summed other numbers. Oracle: torch.autograd."""
    lines = reverse_trace(lambda x: x * mg.tensor(np.float32(0.1)), x=3.0)
    xt = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    (gt,) = torch.autograd.grad(xt * torch.tensor(0.1, dtype=torch.float32), xt)
    assert _evaluate(lines, {"gz": 1.0})["gx"] == gt.item()

    w = np.array([0.123456789, 2.0])
    text = explain(lambda x: mg.sum(x * mg.tensor(w)), x=1.0)
    line = next(l for l in text.splitlines() if "(g.3) gx = " in l)
    printed = line[line.index("[") + 1:line.index("]")]
    np.testing.assert_array_equal(np.array(printed.split(), dtype=float), w)


def test_explain_refuses_an_integer_input_by_name():
    """explain(f, x=2, y=3) failed inside the tensor constructor ("only floating-point
    tensors can require gradients"), naming neither explain nor the input."""
    with pytest.raises(DTypeError, match=r"explain: .*pass floats \(e\.g\. 2\.0 rather than "
                                         r"2\).*input x = 2"):
        explain(lambda x, y: x * y + mg.sin(x), x=2, y=3.0)
    with pytest.raises(DTypeError, match="input y = True"):
        explain(lambda x, y: x * y, x=2.0, y=True)


# -- 6. gradient passes inside a name scope -------------------------------------------

def test_gradient_passes_inside_a_name_scope_are_told_apart():
    """Inside name_scope("model") both passes went to model/gradients/, and the drawing
    coloured the first as a second pass (it read the first name component, model).
    Expected: model/gradients/ then model/gradients_1/, as outside a scope. Oracle for the
    values: d/dx (x sin x) = sin x + x cos x, and its derivative 2 cos x - x sin x."""
    with mg.Graph() as g:
        with mg.name_scope("model"):
            x = mg.placeholder(shape=(), name="x")
            y = mg.sin(x) * x
            n0 = len(g.nodes)
            (gx,) = mg.gradients(y, [x])
            n1 = len(g.nodes)
            (ggx,) = mg.gradients(gx, [x])
            n2 = len(g.nodes)
        (top,) = mg.gradients(y, [x])  # (at the top: gradients/, as before)
    first, second = g.nodes[n0:n1], g.nodes[n1:n2]
    assert {n.name.rsplit("/", 1)[0] for n in first} == {"model/gradients"}
    assert {n.name.rsplit("/", 1)[0] for n in second} == {"model/gradients_1"}
    assert top.name.startswith("gradients/")
    assert {draw._kind(n) for n in first} == {"reverse graph (gradients/)"}
    assert {draw._kind(n) for n in second} == {"second pass (gradients_1/, ...)"}
    v1, v2 = mg.Session(g).run([gx, ggx], {x: 0.7})
    assert v1 == pytest.approx(math.sin(0.7) + 0.7 * math.cos(0.7), rel=1e-14)
    assert v2 == pytest.approx(2 * math.cos(0.7) - 0.7 * math.sin(0.7), rel=1e-14)


def test_a_session_runs_only_on_the_devices_it_was_given():
    """DESIGN.md's contract lists ``devices`` among the Session's options, but
    Session(g, devices=[...]) was refused as an unexpected keyword. Now, as TensorFlow's
    device_filters, a run that needs a node on another device is refused naming the node
    and its line, before anything runs; one on the devices given runs as before (closed
    form: z = 2x + 1)."""
    with mg.Graph() as g:
        x = mg.placeholder((2,), name="x")
        y = x * 2.0
        with mg.device("cpu:1"):
            z = y + 1.0
    both = mg.Session(g, devices=["cpu", "cpu:1"])
    assert both.devices == ["cpu", "cpu:1"]
    np.testing.assert_array_equal(both.run(z, {x: np.ones(2)}), [3.0, 3.0])
    only_cpu = mg.Session(g, devices=["cpu"])
    np.testing.assert_array_equal(only_cpu.run(y, {x: np.ones(2)}), [2.0, 2.0])
    with pytest.raises(mg.errors.DeviceError,
                       match=r"node 'add' is placed on cpu:1, which this session may not use "
                             r"\(devices=\['cpu'\]\).*z = y \+ 1\.0"):
        only_cpu.run(z, {x: np.ones(2)})
    for wrong in ("cpu", [], 3):
        with pytest.raises(TypeError, match="devices is a list of device names"):
            mg.Session(g, devices=wrong)
    assert mg.Session(g, devices=np.array(["cpu", "cpu:1"])).devices == ["cpu", "cpu:1"]
    # a node fed a value does not run: its device is not the session's concern (TF1)
    np.testing.assert_array_equal(only_cpu.run(z, {x: np.ones(2), z: np.zeros(2)}), [0, 0])
    with pytest.raises(mg.errors.DeviceError):
        mg.Session(g, devices=["tpu:7"])
