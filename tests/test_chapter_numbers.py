"""The deterministic numbers the chapters quote, derived again from the library.

Node counts, bytes, orders, makespans and closed forms do not depend on the machine, so
each one here is computed with minigraph and compared with the number the chapter's text
prints. A test fails in either case: the library changed (update the text), or the text
was edited away from what the library gives (fix the text). Timings are not here: no
test asserts on time; the chapters quote them with the benchmark and machine they came
from.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import minigraph as mg
import minigraph.parallel.pipeline as pp

ROOT = Path(__file__).resolve().parent.parent


def chapter(prefix: str) -> str:
    (path,) = ROOT.glob(f"chapters/{prefix}-*/README.md")
    return path.read_text(encoding="utf-8")


def notebook_cells(prefix: str) -> list[str]:
    """The text of each cell of a notebook (markdown and code)."""
    (path,) = ROOT.glob(f"notebooks/{prefix}-*.ipynb")
    return ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]


def notebook(prefix: str) -> str:
    return "\n\n".join(notebook_cells(prefix))


def quoted(text: str, *needles: str) -> None:
    """Each needle appears in the text (whitespace-insensitive), so the number derived
    below is the one the reader sees."""
    flat = re.sub(r"\s+", " ", text)
    for needle in needles:
        assert re.sub(r"\s+", " ", needle) in flat, f"the text no longer says {needle!r}"


# -- chapter 05 -------------------------------------------------------------------------------

def mlp_graph():
    """The MLP of chapter 05's table and notebook section 4."""
    B, SIZES = 64, (256, 128, 128, 10)
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((B, SIZES[0])).astype("float32")
    labels0 = rng.integers(0, SIZES[-1], B)
    with mg.Graph() as gm:
        xm = mg.placeholder((B, SIZES[0]), dtype="float32", name="x")
        labels = mg.placeholder((B,), dtype="int64", name="labels")
        params = []
        for i, (fan_in, fan_out) in enumerate(zip(SIZES[:-1], SIZES[1:]), 1):
            w = rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)
            params += [mg.variable(w.astype("float32"), name=f"w{i}"),
                       mg.variable(np.zeros(fan_out, "float32"), name=f"b{i}")]
        h = xm
        for i in range(3):
            h = h @ params[2 * i] + params[2 * i + 1]
            if i < 2:
                h = mg.tanh(h)
        loss = mg.cross_entropy(h, labels)
        grads = mg.gradients(loss, params)
    return gm, [loss] + grads, {xm: x0, labels: labels0}


def test_chapter_05_mlp_memory_table():
    gm, fetches, feed = mlp_graph()
    stats = {}
    for recycle in (True, False):
        with mg.Session(gm, workers=1, recycle=recycle) as s:
            s.run(fetches, feed)
            stats[recycle] = s.last_run
    total = stats[True].total_bytes
    rows = [total, stats[True].peak_bytes["cpu"], stats[False].peak_bytes["cpu"],
            stats[True].lower_bound["cpu"]]
    text = chapter("05")
    quoted(text, f"gradients, {len(gm.nodes)} nodes", f"# {len(gm.nodes)} nodes")
    quoted(text, *(f"| {b / 1e3:.1f} | {b / total:.2f} |" for b in rows))
    for recycle in (True, False):
        st = stats[recycle]
        quoted(text, f"# recycle={recycle}: keep-everything {st.total_bytes / 1e3:.1f} kB, "
                     f"peak held {st.peak_bytes['cpu'] / 1e3:.1f} kB, "
                     f"lower bound {st.lower_bound['cpu'] / 1e3:.1f} kB")


def test_chapter_05_chain_and_fifo_order():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(256, 256), name="x")
        h = x
        for _ in range(10):
            h = mg.tanh(h) * 0.5
    sess = mg.Session(g, workers=1)
    sess.run(h, {x: np.ones((256, 256))})
    st = sess.last_run
    quoted(chapter("05"), f"# ({st.total_bytes}, {st.peak_bytes['cpu']}, {st.lower_bound['cpu']})")

    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        y = mg.placeholder(shape=(), name="y")
        z = x * y + mg.sin(x)
    sess = mg.Session(g, workers=1)
    sess.run(z, {x: 2.0, y: 3.0})
    quoted(chapter("05"), f"sess.last_run.order                        # {sess.last_run.order}")


def test_chapter_05_order_changes_the_peak():
    def two_reductions(one_at_a_time):
        with mg.Graph() as g:
            x = mg.placeholder(shape=(512, 512), name="x")
            sa = mg.tanh(x).sum()
            if one_at_a_time:
                with mg.control_dependencies([sa]):
                    b = mg.exp(x)
            else:
                b = mg.exp(x)
            out = sa + b.sum()
        sess = mg.Session(g, workers=1)
        sess.run(out, {x: np.ones((512, 512))})
        return sess.last_run

    runs = [two_reductions(False), two_reductions(True)]
    assert runs[1].peak_bytes["cpu"] < runs[0].peak_bytes["cpu"]
    assert runs[0].total_bytes == runs[1].total_bytes
    text = chapter("05")
    for st in runs:
        quoted(text, f"# {st.order} {st.peak_bytes['cpu']} {st.lower_bound['cpu']}")
    quoted(text, f"total bytes ({runs[0].total_bytes:,})")


# -- chapter 03 -------------------------------------------------------------------------------

def test_chapter_03_breadth_first_is_too_early():
    x = 0.5
    exact = math.cos(x) * math.exp(math.sin(x)) * (1 + math.sin(x))
    with mg.Graph() as g:
        xn = mg.placeholder((), name="x")
        an = mg.sin(xn)
        yn = an * mg.exp(an)
        (gxn,) = mg.gradients(yn, [xn])
    got = float(mg.Session(g).run(gxn, {xn: x}))
    assert math.isclose(got, exact, rel_tol=1e-12)
    # breadth-first from y sweeps a with only its share from y: b * cos(x) reaches x
    a, b = math.sin(x), math.exp(math.sin(x))
    too_early = b * math.cos(x)
    text = chapter("03")
    quoted(text, f"# breadth-first {too_early:.6f}, pending counts {exact:.6f}, exact {exact:.6f}",
           f"# {got:.7f}...")
    assert not math.isclose(too_early, exact, rel_tol=1e-3)


# -- chapter 08 -------------------------------------------------------------------------------

def test_chapter_08_partition_and_bubble():
    stages = pp.partition([1, 2, 3, 4, 5, 6], 3)
    times = pp.stage_times([1, 2, 3, 4, 5, 6], stages)
    quoted(chapter("08"), f"# ({stages}, {times})")
    text = chapter("08")
    assert round(100 * pp.bubble_closed_form(4, 8)) == 27
    assert pp.bubble_closed_form(4, 64) < 0.05
    quoted(text, "27 % of the time is lost at m = 8, under 5 % at m = 64")
    assert math.isclose(pp.bubble_closed_form(4, 16), 3 / 19)
    quoted(text, f"3/19 ≈ {round(100 * 3 / 19)} %")
    for m in (8, 16):
        for kind in ("gpipe", "1f1b"):
            sim = pp.simulate(pp.schedule(kind, 4, m), [1.0] * 4, [2.0] * 4)
            assert math.isclose(sim.bubble_fraction, pp.bubble_closed_form(4, m))


HANDMADE = (
    "node0 -- Conv(a) -- forward_compute_time=2.000, backward_compute_time=4.000, "
    "activation_size=8000000.0, parameter_size=100000.000\n"
    "node1 -- Conv(b) -- forward_compute_time=2.000, backward_compute_time=4.000, "
    "activation_size=4000000.0, parameter_size=500000.000\n"
    "node2 -- Linear(c) -- forward_compute_time=0.500, backward_compute_time=1.000, "
    "activation_size=20000.0, parameter_size=60000000.000\n"
    "node3 -- Linear(d) -- forward_compute_time=0.200, backward_compute_time=0.400, "
    "activation_size=4000.0, parameter_size=16000000.000\n")


def test_chapter_08_weight_sync_is_not_cheap():
    cell = next(c for c in notebook_cells("08") if "pp.Profile.from_text(text)" in c)
    ns: dict = {}
    exec(cell[:cell.index("handmade =")], ns)
    assert ns["text"] == HANDMADE, "notebook 08's hand-written profile changed: update this test and the texts"
    profile = pp.Profile.from_text(HANDMADE)
    weights = sum(layer.parameter_bytes for layer in profile)
    compute = sum(layer.compute_time for layer in profile)
    sync = 2 * (4 - 1) / 4 * weights / 1e10
    plan = pp.partition_pipedream(profile, workers=4, bandwidth=1e10)
    assert plan.stages == [[0, 1, 2, 3]] and plan.replicas == [4]
    assert math.isclose(plan.slowest, max(sync, compute) / 4)
    for text in (chapter("08"), notebook("08")):
        quoted(text, f"{weights / 1e6:.1f} MB", f"{sync * 1e3:.1f} ms", f"{compute * 1e3:.1f} ms",
               f"{plan.slowest * 1e3:.3f} ms")
    assert sync > 0.5 * compute  # not "cheap": the same order as the compute


@pytest.mark.parametrize("bandwidth,stages,replicas", [
    (1e10, [[0, 1, 2, 3]], [4]), (3e9, [[0, 1], [2, 3]], [3, 1]),
    (1e9, [[0, 1], [2, 3]], [2, 1]), (1e8, [[0, 1, 2], [3]], [1, 1])])
def test_chapter_08_pipedream_plans(bandwidth, stages, replicas):
    """The plans chapter 08 describes in words, per bandwidth."""
    plan = pp.partition_pipedream(pp.Profile.from_text(HANDMADE), workers=4, bandwidth=bandwidth)
    assert (plan.stages, plan.replicas) == (stages, replicas)
