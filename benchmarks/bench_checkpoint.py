"""Recomputation (``mg.checkpoint``): the memory it saves and the time it costs.

Run: ``python benchmarks/bench_checkpoint.py`` (about a minute). Prints two tables and
writes ``benchmarks/results/checkpoint.json``. The gradients are checked against PyTorch
*before* anything is measured; memory is measured in bytes and time in interleaved
rounds (``common.measure``), never asserted (DESIGN.md, "Performance").

The model is DESIGN.md's: a 16-layer tanh MLP, 128 wide, batch 2048, float64, its loss
the mean square of the output. One training step (forward, loss, backward) is run plain
and with the layers cut into 4 segments of 4, each ``mg.checkpoint``-ed (Chen et al.'s
√n segments; GPipe's re-materialisation).

a. On the tape (``loss.backward()``): the peak of the device's live bytes during the
   step (``mg.Device.peak_bytes``: every tensor alive at once, from its creation to its
   release), and the time. Target: peak <= 0.6x, time <= 1.4x the plain step.
   ``torch.utils.checkpoint`` on the same step shows what PyTorch pays in time.
b. In graph mode (``mg.grad(..., mode="graph")``, compiled once, then run): the peak of
   NumPy's own allocations during one call (``tracemalloc``; a compiled function's
   values are arrays, not tensors) and the time. No target: for comparison.
"""

from __future__ import annotations

import datetime
import gc
import sys
import tracemalloc
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find common.py however we are run
from common import (cpu_only, describe, environment, fmt, have_torch, measure,  # noqa: E402
                    pin_blas_threads, print_rounds, print_table, save_results)

THREADS = pin_blas_threads()  # before NumPy loads its BLAS: one thread, as PyTorch gets

import numpy as np  # noqa: E402

import minigraph as mg  # noqa: E402

DEPTH, WIDTH, BATCH, SEGMENTS = 16, 128, 2048, 4
MEMORY_TARGET, TIME_TARGET = 0.6, 1.4
MB = 1e6


def make_params(rng: np.random.Generator) -> list[np.ndarray]:
    params = []
    for _ in range(DEPTH):
        params += [rng.normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH), rng.normal(size=WIDTH) * 0.1]
    return params


def layers(h: Any, *params: Any) -> Any:
    """tanh(h @ w + b) for each (w, b) of ``params``: one segment."""
    for w, b in zip(params[0::2], params[1::2]):
        h = mg.tanh(h @ w + b)
    return h


segment = mg.checkpoint(layers)


def loss(x: Any, params: Any, run: Callable[..., Any]) -> Any:
    """The MLP, each segment of DEPTH / SEGMENTS layers computed by ``run``."""
    per, h = DEPTH // SEGMENTS, x
    for s in range(SEGMENTS):
        h = run(h, *params[2 * per * s: 2 * per * (s + 1)])
    return (h * h).mean()


def tape_step(x: Any, params: list, run: Callable[..., Any]) -> list:
    """One step on the tape; returns the gradients and leaves .grad empty."""
    loss(x, params, run).backward()
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    return grads


def torch_step(torch: Any, x: Any, params: list, checkpointed: bool) -> list:
    from torch.utils.checkpoint import checkpoint

    def run(h: Any, *ps: Any) -> Any:
        for w, b in zip(ps[0::2], ps[1::2]):
            h = torch.tanh(h @ w + b)
        return h

    per, h = DEPTH // SEGMENTS, x
    for s in range(SEGMENTS):
        ps = params[2 * per * s: 2 * per * (s + 1)]
        h = checkpoint(run, h, *ps, use_reentrant=False) if checkpointed else run(h, *ps)
    (h * h).mean().backward()
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    return grads


def device_peak(fn: Callable[[], Any]) -> int:
    """Peak live bytes on the cpu device during one call of ``fn``, above those alive
    before it (the result is dropped first)."""
    cpu = mg.device("cpu")
    gc.collect()
    base = cpu.live_bytes
    cpu.reset_peak()
    result = fn()
    peak = cpu.peak_bytes - base
    del result
    return peak


def allocated_peak(fn: Callable[[], Any]) -> int:
    """Peak bytes NumPy allocated during one call of ``fn`` (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    del result
    return peak


def verdict(ratio: float, target: float) -> str:
    return "MET" if ratio <= target else "MISSED"


def main() -> int:
    if cpu_only("bench_checkpoint measures a CPU's memory and time"):
        return 0
    print(describe(environment()))
    rng = np.random.default_rng(0)
    x0, p0 = rng.normal(size=(BATCH, WIDTH)), make_params(rng)
    x = mg.tensor(x0)
    params = [mg.tensor(p, requires_grad=True) for p in p0]
    activation = BATCH * WIDTH * 8
    print(f"\n{DEPTH}-layer tanh MLP, {WIDTH} wide, batch {BATCH}, float64 (one activation "
          f"{activation / MB:.2f} MB), {SEGMENTS} checkpointed segments of "
          f"{DEPTH // SEGMENTS} layers, {THREADS} BLAS thread(s)")

    # -- gradients first: against PyTorch, plain and checkpointed alike ----------------------
    plain_grads = tape_step(x, params, layers)
    ckpt_grads = tape_step(x, params, segment)
    graph_plain = mg.grad(lambda *ps: loss(x, ps, layers), argnums=tuple(range(2 * DEPTH)),
                          mode="graph")
    graph_ckpt = mg.grad(lambda *ps: loss(x, ps, segment), argnums=tuple(range(2 * DEPTH)),
                         mode="graph")
    frozen = [mg.tensor(p) for p in p0]
    torch = None
    if have_torch():
        import torch

        torch.set_num_threads(int(THREADS))
        xt = torch.tensor(x0)
        pt = [torch.tensor(p, requires_grad=True) for p in p0]
        expected = [g.numpy() for g in torch_step(torch, xt, pt, checkpointed=False)]
        for name, grads in (("tape", plain_grads), ("tape, checkpoint", ckpt_grads),
                            ("graph", graph_plain(*frozen)),
                            ("graph, checkpoint", graph_ckpt(*frozen))):
            for g, e in zip(grads, expected):
                np.testing.assert_allclose(g.numpy(), e, rtol=1e-9, atol=1e-12, err_msg=name)
        print("gradients: equal to PyTorch's (rtol 1e-9) on the tape and in graph mode, "
              "plain and checkpointed")

    # -- a. the tape ----------------------------------------------------------------------------
    peaks = {"plain": device_peak(lambda: tape_step(x, params, layers)),
             "checkpoint": device_peak(lambda: tape_step(x, params, segment))}
    methods = {"plain": lambda: tape_step(x, params, layers),
               "checkpoint": lambda: tape_step(x, params, segment)}
    if torch is not None:
        methods["torch plain"] = lambda: torch_step(torch, xt, pt, False)
        methods["torch checkpoint"] = lambda: torch_step(torch, xt, pt, True)
    timed, summary = measure(methods, anchor="plain", rounds=11, batch=0.02)
    print("\na. one step on the tape (forward, loss, backward):")
    print_rounds(summary)
    if torch is not None:
        theirs = timed["torch checkpoint"]["seconds"] / timed["torch plain"]["seconds"]
    rows = [["plain", fmt(peaks["plain"] / MB), "1.00", fmt(timed["plain"]["seconds"] * 1e3, 1),
             "1.00", ""],
            ["checkpoint", fmt(peaks["checkpoint"] / MB),
             fmt(peaks["checkpoint"] / peaks["plain"]),
             fmt(timed["checkpoint"]["seconds"] * 1e3, 1), fmt(timed["checkpoint"]["ratio"]),
             f"<= {MEMORY_TARGET}x / <= {TIME_TARGET}x"]]
    if torch is not None:
        rows.append(["torch.utils.checkpoint", "-", "-",
                     fmt(timed["torch checkpoint"]["seconds"] * 1e3, 1),
                     f"{fmt(theirs)} (of torch plain)", ""])
    print_table(rows, ["step", "peak MB", "/ plain", "ms", "/ plain", "target"])
    memory_ratio = peaks["checkpoint"] / peaks["plain"]
    time_ratio = timed["checkpoint"]["ratio"]
    print(f"(the plain step keeps {peaks['plain'] / activation:.1f} activations at its peak, "
          f"the checkpointed one {peaks['checkpoint'] / activation:.1f}: {SEGMENTS} boundaries, "
          f"one segment's insides, the adjoints)")
    print(f"target: checkpoint peak bytes <= {MEMORY_TARGET}x the plain step  -> "
          f"{memory_ratio:.3f}x  {verdict(memory_ratio, MEMORY_TARGET)}")
    print(f"target: checkpoint time <= {TIME_TARGET}x the plain step  -> {time_ratio:.3f}x "
          f"(best rounds {timed['checkpoint']['best_ratio']:.3f}x)  "
          f"{verdict(time_ratio, TIME_TARGET)}")

    # -- b. graph mode ----------------------------------------------------------------------------
    allocated = {"plain": allocated_peak(lambda: graph_plain(*frozen)),
                 "checkpoint": allocated_peak(lambda: graph_ckpt(*frozen))}
    gtimed, gsummary = measure({"plain": lambda: graph_plain(*frozen),
                                "checkpoint": lambda: graph_ckpt(*frozen)},
                               anchor="plain", rounds=11, batch=0.02)
    print("\nb. the same gradient by a compiled mg.grad(..., mode=\"graph\"):")
    print_rounds(gsummary)
    print_table([["plain", fmt(allocated["plain"] / MB), "1.00",
                  fmt(gtimed["plain"]["seconds"] * 1e3, 1), "1.00"],
                 ["checkpoint", fmt(allocated["checkpoint"] / MB),
                  fmt(allocated["checkpoint"] / allocated["plain"]),
                  fmt(gtimed["checkpoint"]["seconds"] * 1e3, 1),
                  fmt(gtimed["checkpoint"]["ratio"])]],
                ["graph mode", "NumPy peak MB", "/ plain", "ms", "/ plain"])
    print("no target: shown beside the tape's (a compiled graph writes many results in "
          "place already, and each checkpoint node recomputes its segment eagerly)")

    save_results("checkpoint", {
        "when": datetime.datetime.now().isoformat(), "environment": environment(),
        "model": {"depth": DEPTH, "width": WIDTH, "batch": BATCH, "segments": SEGMENTS},
        "tape": {"peak_bytes": peaks, "memory_ratio": memory_ratio, "time": timed,
                 "time_ratio": time_ratio},
        "graph": {"allocated_peak_bytes": allocated, "time": gtimed}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
