"""One model, every execution style, over model sizes (chapter 04's figure).

Run: ``python benchmarks/bench_modes.py`` (about 30 s on 2 cores). Prints one table per size and
a combined table, writes ``benchmarks/results/modes.json`` and ``benchmarks/results/modes.png``.

**What is measured.** The loss and its gradients with respect to the four weights of an
MLP, ``cross_entropy(tanh(x @ w1 + b1) @ w2 + b2, labels)``, float64, batch 32, 10
classes, hidden width ``w`` in 4, 16, 64, 256, 1024 with the input width tied to it
(``x`` is (32, w), ``w1`` (w, w), ``w2`` (w, 10)). Each size is computed by:

* ``numpy`` (anchor): forward, softmax cross-entropy and backprop written by hand;
* ``tape``: define-by-run, leaves with ``requires_grad=True`` (gradients cleared each
  call), ``loss.backward()``;
* ``session``: define-and-run, a ``Graph`` of placeholders with ``mg.gradients``, and
  ``mg.Session(g).run([loss, *grads], feed_dict)`` on every call (NumPy values out);
* ``compiled``: the same graph through ``mg.compile_graph(g, inputs, outputs).raw``,
  NumPy arrays in and out (no ``Tensor`` per value, no optimisation passes);
* ``graph mode``: ``mg.value_and_grad(loss, argnums, mode="graph")`` on tensors (trace,
  gradients pass, optimise, compile: once per signature, before timing);
* ``traced``: ``mg.trace`` of a function that returns the loss and ``mg.gradients`` of
  it, on tensors (the recording ran once, before timing);
* ``source``: ``mg.value_and_grad(loss, argnums, mode="source")`` on tensors, a generated
  adjoint program (``mg.source_grad``); if it cannot transform the loss, the output says so;
* ``pytorch``: ``torch.autograd.grad`` of the same loss, float64, where installed.

Forward mode (``mode="forward"``) is checked at the smallest size but not timed: it runs
one pass per parameter element, so it grows with the number of parameters, not with the
kernels; the output prints how many passes each size would need.

**How to read it.** Cells are the time of a method divided by the NumPy anchor's,
measured a few milliseconds apart (``common.measure``: interleaved rounds, median of the
ratio within each round). At small widths the kernels take microseconds and the ratio
shows the Python cost each style pays per operation (the tape creates a ``Tensor`` and a
tape entry per op, ``Session`` schedules every node, the compiled function only calls
kernels). At large widths the matrix products dominate and every ratio heads towards 1.

Every method's loss and gradients are checked against the anchor (relative error <= 1e-10)
*before* anything is timed; times are only reported, never asserted (DESIGN.md,
"Performance"). BLAS threads are pinned before NumPy is imported, as in ``bench_graph.py``
(``OMP_NUM_THREADS=2 python benchmarks/bench_modes.py`` runs with two).

``minigraph bench --device cuda:0`` draws the same figure on a GPU: every method's
tensors, the anchor's arrays (CuPy) and PyTorch's tensors live there, the Session is fed
device arrays (it returns NumPy values, as its contract says), and every timing is
synchronised (``common.synchronizer``). Forward mode is still checked on the CPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find common.py however we are run
from common import (RESULTS_DIR, THREAD_VARS, array_library, bench_device,  # noqa: E402
                    blas_threads, check_close, describe, environment, fmt, have_torch, measure,
                    on_gpu, pin_blas_threads, print_rounds, print_table, result_name,
                    save_results, synchronizer, to_host, torch_device)

THREADS = pin_blas_threads()  # before NumPy (or PyTorch) is imported

import datetime  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

import minigraph as mg  # noqa: E402
from bench_graph import mlp_loss, numpy_mlp  # noqa: E402  (bench_graph's table b)

US = 1e6  # seconds -> microseconds
BATCH = 32
CLASSES = 10
WIDTHS = (4, 16, 64, 256, 1024)
ROUNDS = 21           # interleaved rounds per size
BATCH_SECONDS = 0.02  # each method's batch of calls per round lasts about this long
RTOL = 1e-10

ANCHOR = "numpy"
LIB = "CuPy" if on_gpu() else "NumPy"  # the anchor's library (on a GPU, CuPy)
TAPE, SESSION, COMPILED = "tape", "session", "compiled"
GRAPH, TRACED, SOURCE, TORCH = "graph mode", "traced", "source", "pytorch"
DESCRIPTIONS = {
    ANCHOR: f"hand-written {LIB} backprop (anchor)",
    TAPE: "define-by-run: tape, loss.backward()",
    SESSION: "define-and-run: Session(g).run(fetches, feed_dict)",
    COMPILED: "compiled: compile_graph(g, ins, outs).raw, arrays",
    GRAPH: 'graph mode: value_and_grad(mode="graph"), tensors',
    TRACED: "traced: mg.trace(loss and mg.gradients), tensors",
    SOURCE: 'source: value_and_grad(mode="source"), tensors',
    TORCH: "pytorch: autograd.grad, float64",
}
STYLE = {  # colour and marker per method in the plot; anchors grey
    ANCHOR: ("0.35", "s"), TORCH: ("0.65", "D"), TAPE: ("tab:orange", "o"),
    SESSION: ("tab:red", "v"), COMPILED: ("tab:blue", "^"), GRAPH: ("tab:cyan", "<"),
    TRACED: ("tab:purple", ">"), SOURCE: ("tab:green", "P"),
}

Method = Callable[[], tuple[Any, tuple[Any, ...]]]  # returns (loss, 4 gradients)


# ===============================================================================================
# the problem at each width (the loss and its NumPy anchor are bench_graph.py's table b)
# ===============================================================================================

def problem(width: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Weights (w1, b1, w2, b2), inputs x and labels for one hidden width."""
    rng = np.random.default_rng(width)
    params = [rng.standard_normal((width, width)) / np.sqrt(width),
              rng.standard_normal(width) * 0.1,
              rng.standard_normal((width, CLASSES)) / np.sqrt(width),
              rng.standard_normal(CLASSES) * 0.1]
    return params, rng.standard_normal((BATCH, width)), rng.integers(0, CLASSES, BATCH)


def parameter_count(width: int) -> int:
    return width * width + width + width * CLASSES + CLASSES


# ===============================================================================================
# the methods, one builder per execution style
# ===============================================================================================

def tape_method(params: list[np.ndarray], x: mg.Tensor, labels: mg.Tensor) -> Method:
    """Leaves made once (``mg.tensor`` copies its array: 8 MB for w1 at w=1024, which is
    not the tape's cost); each call clears their gradients, as ``zero_grad`` would."""
    ws = [mg.tensor(p, device=bench_device(), requires_grad=True) for p in params]

    def tape() -> tuple[Any, tuple[Any, ...]]:
        for w in ws:
            w.grad = None
        loss = mlp_loss(*ws, x, labels)
        loss.backward()
        return loss, tuple(w.grad for w in ws)
    return tape


def graph_methods(params: list[Any], x: Any, labels: Any) -> dict[str, Method]:
    """Define-and-run: one graph with placeholders and gradient nodes, run by a Session
    and, compiled, as a Python function on raw arrays (of the benchmark device)."""
    width = x.shape[1]
    with mg.Graph() as g, mg.device(bench_device()):
        w1 = mg.placeholder((width, width), name="w1")
        b1 = mg.placeholder((width,), name="b1")
        w2 = mg.placeholder((width, CLASSES), name="w2")
        b2 = mg.placeholder((CLASSES,), name="b2")
        xs = mg.placeholder((BATCH, width), name="x")
        ys = mg.placeholder((BATCH,), dtype="int64", name="labels")
        loss = mlp_loss(w1, b1, w2, b2, xs, ys)
        grads = mg.gradients(loss, [w1, b1, w2, b2])
    sess = mg.Session(g)
    fetches = [loss, *grads]
    feed = dict(zip([w1, b1, w2, b2, xs, ys], [*params, x, labels]))
    raw = mg.compile_graph(g, [w1, b1, w2, b2, xs, ys], fetches, name="mlp_grad").raw
    arrays = [*params, x, labels]

    def session() -> tuple[Any, tuple[Any, ...]]:
        value, *gs = sess.run(fetches, feed)
        return value, tuple(gs)

    def compiled() -> tuple[Any, tuple[Any, ...]]:
        value, *gs = raw(*arrays)
        return value, tuple(gs)
    return {SESSION: session, COMPILED: compiled}


def loss_and_gradients(w1: Any, b1: Any, w2: Any, b2: Any, x: Any, labels: Any) -> tuple:
    """What ``mg.trace`` records: the loss and its gradients, as graph values."""
    loss = mlp_loss(w1, b1, w2, b2, x, labels)
    return (loss, *mg.gradients(loss, [w1, b1, w2, b2]))


def traced_method(args: list[mg.Tensor]) -> Method:
    traced = mg.trace(loss_and_gradients)
    traced(*args)  # records and compiles here, outside the timing

    def run() -> tuple[Any, tuple[Any, ...]]:
        value, *gs = traced(*args)
        return value, tuple(gs)
    return run


def source_method(args: list[mg.Tensor]) -> tuple[Method | None, str]:
    """Source transformation, or None and the reason when it cannot handle the loss."""
    try:
        vg = mg.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3), mode="source")
        vg(*args)  # the transformation runs here, once
    except Exception as exc:  # noqa: BLE001  (reported, not hidden)
        return None, f"{type(exc).__name__}: {exc}"
    return (lambda: vg(*args)), "ok"


def torch_method(params: list[np.ndarray], x: np.ndarray, labels: np.ndarray) -> Method:
    import torch
    import torch.nn.functional as F

    device = torch_device()
    tw = [torch.tensor(p, device=device, requires_grad=True) for p in params]
    tx, ty = torch.tensor(x, device=device), torch.tensor(labels, device=device)

    def run() -> tuple[Any, tuple[Any, ...]]:
        loss = F.cross_entropy(torch.tanh(tx @ tw[0] + tw[1]) @ tw[2] + tw[3], ty)
        return loss, torch.autograd.grad(loss, tw)
    return run


def methods_for(width: int) -> tuple[dict[str, Method], dict[str, str]]:
    """Every method for one width, and notes on the ones left out."""
    params, x, labels = problem(width)
    args = [mg.tensor(a, device=bench_device()) for a in [*params, x, labels]]
    xp = array_library()  # NumPy, or CuPy on a GPU
    arrays = [xp.asarray(a) for a in [*params, x, labels]]
    graph_vg = mg.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3), mode="graph")
    graph_vg(*args)  # trace, gradients pass and compile, outside the timing
    methods: dict[str, Method] = {
        ANCHOR: lambda: numpy_mlp(*arrays, xp=xp),
        TAPE: tape_method(params, args[4], args[5]),
        **graph_methods(arrays[:4], arrays[4], arrays[5]),
        GRAPH: lambda: graph_vg(*args),
        TRACED: traced_method(args),
    }
    notes: dict[str, str] = {}
    source, why = source_method(args)
    if source is not None:
        methods[SOURCE] = source
    else:
        notes[SOURCE] = f"source mode cannot transform the loss: {why}"
    if torch_device() is not None:
        methods[TORCH] = torch_method(params, x, labels)
    else:
        notes[TORCH] = ("PyTorch not installed" if not have_torch() else
                        f"this PyTorch has no {bench_device()}")
    return methods, notes


# ===============================================================================================
# checks before timing
# ===============================================================================================

def check(methods: dict[str, Method], width: int) -> float:
    """Every method's loss and gradients against the anchor's; the worst relative error."""
    want_loss, want = methods[ANCHOR]()
    want_loss, want = to_host(want_loss), [to_host(w) for w in want]  # (from a GPU too)
    worst = 0.0
    for name, method in methods.items():
        loss, grads = method()
        assert len(grads) == len(want), \
            f"w={width} {name}: {len(grads)} gradients, expected {len(want)}"
        pairs = [("loss", loss, want_loss)] + [(f"grad {k}", g, w)
                                               for k, (g, w) in enumerate(zip(grads, want))]
        for what, got, ref in pairs:
            worst = max(worst, check_close(f"w={width} {name} {what}", got, ref, RTOL))
    return worst


def check_forward_mode(width: int) -> float:
    """Forward mode on the smallest size (it is not timed): worst relative error."""
    params, x, labels = problem(width)
    args = [mg.tensor(a) for a in [*params, x, labels]]
    loss, grads = mg.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3), mode="forward")(*args)
    want_loss, want = numpy_mlp(*params, x, labels)
    errs = [check_close(f"forward mode, w={width}, loss", loss, want_loss, RTOL)]
    errs += [check_close(f"forward mode, w={width}, grad {k}", g, w, RTOL)
             for k, (g, w) in enumerate(zip(grads, want))]
    return max(errs)


# ===============================================================================================
# reporting
# ===============================================================================================

def print_size(results: dict[str, dict[str, Any]]) -> None:
    rows = [[DESCRIPTIONS[name], fmt(r["seconds"] * US, 1), fmt(r["ratio"], 2),
             fmt(r["best_ratio"], 2)] for name, r in results.items()]
    print_table(rows, ["method", "µs", f"x {LIB}", "best rounds"])


def print_combined(sweep: dict[int, dict[str, dict[str, Any]]]) -> None:
    """Rows: methods; columns: widths; cells: median ratio to NumPy (NumPy row: µs)."""
    names = list(DESCRIPTIONS)
    widths = list(sweep)
    anchor_row = [f"{LIB.lower()} µs (anchor)"]
    rows = [anchor_row + [fmt(sweep[w][ANCHOR]["seconds"] * US, 1) for w in widths]]
    for name in (n for n in names if n != ANCHOR):
        if any(name in sweep[w] for w in widths):
            rows.append([name] + [fmt(sweep[w][name]["ratio"], 2) if name in sweep[w] else "-"
                                  for w in widths])
    print_table(rows, [f"x {LIB}"] + [f"w={w}" for w in widths])


def slowest_method(results: dict[str, dict[str, Any]]) -> str:
    """The method with the largest ratio to NumPy at one size (PyTorch included)."""
    return max(results, key=lambda name: results[name]["ratio"])


def conclusion(sweep: dict[int, dict[str, dict[str, Any]]]) -> list[str]:
    """What the numbers say, in a few lines computed from them."""
    small, large = min(sweep), max(sweep)
    lines = []
    for w, where in ((small, "smallest"), (large, "largest")):
        ours = {n: r["ratio"] for n, r in sweep[w].items() if n not in (ANCHOR, TORCH)}
        fastest, slowest = min(ours, key=ours.get), max(ours, key=ours.get)
        lines.append(f"w={w} ({where}): minigraph methods take {ours[fastest]:.2f}x "
                     f"({fastest}) to {ours[slowest]:.2f}x ({slowest}) {LIB}'s time; "
                     f"tape / compiled = {ours[TAPE] / ours[COMPILED]:.1f}")
    top_small, top_large = slowest_method(sweep[small]), slowest_method(sweep[large])
    r_small, r_large = sweep[small][top_small]["ratio"], sweep[large][top_large]["ratio"]
    if r_large < r_small:
        lines.append(f"the slowest method falls from {r_small:.1f}x {LIB} ({top_small}, w={small}) "
                     f"to {r_large:.2f}x ({top_large}, w={large}): per-op Python overhead "
                     "dominates small models, the kernels' time large ones")
    else:
        lines.append(f"the ratios do not converge: the slowest method is {r_small:.1f}x {LIB} "
                     f"({top_small}) at w={small} and {r_large:.2f}x ({top_large}) at w={large}")
    return lines


def plot(sweep: dict[int, dict[str, dict[str, Any]]], path: Path) -> None:
    """Left: time per call against width, log-log; right: ratio to NumPy against width."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = list(sweep)
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(12, 5.4))
    for name, description in DESCRIPTIONS.items():
        ws = [w for w in widths if name in sweep[w]]
        if not ws:
            continue
        color, marker = STYLE[name]
        style = {"color": color, "marker": marker, "label": description,
                 "ls": "--" if name in (ANCHOR, TORCH) else "-"}
        ax_t.plot(ws, [sweep[w][name]["seconds"] * US for w in ws], **style)
        ax_r.plot(ws, [sweep[w][name]["ratio"] for w in ws], **style)
    ax_r.axhline(1.0, color="0.35", lw=0.8)
    for ax, label in ((ax_t, "µs per call (loss and 4 gradients)"), (ax_r, f"time / {LIB}'s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.set_xlabel(f"hidden width w (input width w, batch {BATCH}, {CLASSES} classes)")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
    ax_t.set_title("time per call, log-log", fontsize=10)
    ax_r.set_title(f"ratio to hand-written {LIB} (1 = the kernels' time)", fontsize=10)
    top = max(sweep[w][n]["ratio"] for w in widths for n in sweep[w])
    ticks = [t for t in (1, 1.5, 2, 3, 5, 10, 20, 50, 100) if t <= top * 1.2]
    ax_r.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    ax_r.minorticks_off()
    handles, labels = ax_t.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle(f"MLP loss and gradients, float64, on {bench_device()}: one model, every "
                 "execution style", fontsize=11)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ===============================================================================================
# main
# ===============================================================================================

def pin_torch_threads() -> int | None:
    """PyTorch gets as many threads as BLAS (None without PyTorch)."""
    if torch_device() is None:
        return None
    import torch
    torch.set_num_threads(int(THREADS))
    return torch.get_num_threads()


def main() -> None:
    with blas_threads(int(THREADS)) as how:  # also with NumPy loaded (minigraph bench)
        run(how)


def run(how: list[str]) -> None:
    started = time.perf_counter()
    torch_threads = pin_torch_threads()
    env = environment()
    print(describe(env))
    print("threads: " + " ".join(f"{v}={os.environ.get(v)}" for v in THREAD_VARS)
          + (f"; torch.get_num_threads()={torch_threads}" if torch_threads else "")
          + f"; BLAS: {'; '.join(how) or 'not verified'}")
    print(f"\nMLP cross_entropy(tanh(x @ w1 + b1) @ w2 + b2, labels), float64, batch {BATCH}, "
          f"{CLASSES} classes, x (32, w), w1 (w, w): loss and gradients w.r.t. w1, b1, w2, b2, "
          f"on {bench_device()}")
    err = check_forward_mode(WIDTHS[0])
    print(f"forward mode: checked at w={WIDTHS[0]} (rel. error {err:.1e}), not timed: one pass "
          "per parameter element, " + ", ".join(f"{parameter_count(w):,} at w={w}"
                                                for w in WIDTHS))

    sweep: dict[int, dict[str, dict[str, Any]]] = {}
    per_size: dict[str, Any] = {}
    notes_seen: set[str] = set()
    for width in WIDTHS:
        methods, notes = methods_for(width)
        worst = check(methods, width)
        print(f"\n== w={width}: {parameter_count(width):,} parameters; every method checked "
              f"against NumPy (worst relative error {worst:.1e}) ==")
        for note in notes.values():
            if note not in notes_seen:
                print(f"note: {note}")
                notes_seen.add(note)
        results, rounds = measure(methods, anchor=ANCHOR, rounds=ROUNDS, batch=BATCH_SECONDS,
                                  sync=synchronizer())
        print_size(results)
        print_rounds(rounds)
        sweep[width] = results
        per_size[str(width)] = {"parameters": parameter_count(width), "worst_rel_error": worst,
                                "notes": notes, "results": results, "rounds": rounds}

    print(f"\n== all sizes: time / hand-written {LIB}'s (median ratio within rounds) ==")
    print_combined(sweep)
    lines = conclusion(sweep)
    for line in lines:
        print(line)
    print("no target: DESIGN.md sets none for this figure (chapter 04, section 6)")

    name = result_name("modes")
    path = save_results(name, {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "environment": env,
        "device": bench_device(),
        "threads": {"pinned_to": int(THREADS), "torch_threads": torch_threads},
        "model": f"cross_entropy(tanh(x @ w1 + b1) @ w2 + b2, labels), float64, "
                 f"batch {BATCH}, {CLASSES} classes, x (batch, w), w1 (w, w), w2 (w, 10)",
        "methods": DESCRIPTIONS,
        "unit": "seconds per call (median over the clean interleaved rounds); ratio: "
                "median over those rounds of method / NumPy anchor",
        "widths": per_size,
        "conclusion": lines,
    })
    plot(sweep, RESULTS_DIR / f"{name}.png")
    print(f"\nwrote {path} and {RESULTS_DIR / f'{name}.png'} "
          f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
