"""Recomputation (``mg.checkpoint``): the memory it saves and the time it costs.

Run: ``python benchmarks/bench_checkpoint.py`` (about a minute). Prints two tables and
writes ``benchmarks/results/checkpoint.json``. The gradients are checked against PyTorch
*before* anything is measured; memory is measured in bytes and time in interleaved
rounds (``common.measure``), never asserted (DESIGN.md, "Performance").

The model is DESIGN.md's: a 16-layer tanh MLP, 128 wide, batch 2048, float64, its loss
the mean square of the output. One training step (forward, loss, backward) is run plain
and with the layers cut into 4 segments of 4 (Chen et al.'s √n segments; GPipe's
re-materialisation), in two ways:

* all 4 segments ``mg.checkpoint``-ed: the target row;
* the first 3 checkpointed and the last run plain, as PyTorch's
  ``torch.utils.checkpoint.checkpoint_sequential`` does: the last segment's backward
  comes right after its forward, so recomputing it costs a forward and saves little.
  On minigraph's tape it saves less than in PyTorch: the sweep keeps every value it
  recorded until it ends, so the last segment's insides stay alive through the whole
  backward.

One extra forward adds F / (F + B) of the plain step's arithmetic, F and B being the
forward's and the backward's times: a third if the backward costs two forwards (the
textbook's rule of thumb), about half here, where tanh makes the forward dear and
128-wide matmuls keep the backward cheap; the row "forward alone" measures it. Against
it works the memory saved: the plain step's peak does not stay in the allocator between
steps, so every step pays page faults for fresh memory that the checkpointed one does
not (the "page faults" column).

a. On the tape (``loss.backward()``): the peak of the device's live bytes during the
   step (``mg.Device.peak_bytes``: every tensor alive at once, from its creation to its
   release), and the time. Target: peak <= 0.6x, time <= 1.4x the plain step.
   PyTorch's plain and checkpointed steps, timed in the same rounds, show what it pays.
   The minor page faults per step count the fresh memory each step touches.
b. In graph mode (``mg.grad(..., mode="graph")``, compiled once, then run): the peak of
   NumPy's own allocations during one call (``tracemalloc``; a compiled function's
   values are arrays, not tensors) and the time. No target: for comparison.
"""

from __future__ import annotations

import datetime
import gc
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find common.py however we are run
from common import (allocated_peak, cpu_only, describe, environment, fmt, have_torch, measure,  # noqa: E402
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


# How each of the SEGMENTS segments runs, per strategy (the first is the anchor).
STRATEGIES = {"plain": [layers] * SEGMENTS,
              "checkpoint all 4": [segment] * SEGMENTS,
              "checkpoint 3, last plain": [segment] * (SEGMENTS - 1) + [layers]}
TARGET_ROW = "checkpoint all 4"


def loss(x: Any, params: Any, runs: list[Callable[..., Any]]) -> Any:
    """The MLP, segment s (DEPTH / SEGMENTS layers) computed by ``runs[s]``."""
    per, h = DEPTH // SEGMENTS, x
    for s, run in enumerate(runs):
        h = run(h, *params[2 * per * s: 2 * per * (s + 1)])
    return (h * h).mean()


def tape_step(x: Any, params: list, runs: list[Callable[..., Any]]) -> list:
    """One step on the tape; returns the gradients and leaves .grad empty."""
    loss(x, params, runs).backward()
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    return grads


def torch_step(torch: Any, x: Any, params: list, checkpointed: int) -> list:
    """PyTorch's step with the first ``checkpointed`` segments checkpointed."""
    from torch.utils.checkpoint import checkpoint

    def run(h: Any, *ps: Any) -> Any:
        for w, b in zip(ps[0::2], ps[1::2]):
            h = torch.tanh(h @ w + b)
        return h

    per, h = DEPTH // SEGMENTS, x
    for s in range(SEGMENTS):
        ps = params[2 * per * s: 2 * per * (s + 1)]
        h = checkpoint(run, h, *ps, use_reentrant=False) if s < checkpointed else run(h, *ps)
    (h * h).mean().backward()
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    return grads


def forward_only(x: Any, params: list) -> Any:
    """The 16 layers' forward alone, nothing recorded: F."""
    with mg.no_grad():
        return loss(x, params, STRATEGIES["plain"])


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


def page_faults(fn: Callable[[], Any], calls: int = 3) -> float | None:
    """Minor page faults per call of ``fn``: each is a page of fresh memory touched for the
    first time (None where the ``resource`` module is missing)."""
    try:
        import resource
    except ImportError:
        return None
    fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls



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
          f"{activation / MB:.2f} MB), cut into {SEGMENTS} segments of "
          f"{DEPTH // SEGMENTS} layers, {THREADS} BLAS thread(s)")

    # -- gradients first: against PyTorch, for every strategy, tape and graph mode ------------
    nums = tuple(range(2 * DEPTH))
    graph_steps = {name: mg.grad(lambda *ps, runs=runs: loss(x, ps, runs), argnums=nums,
                                 mode="graph") for name, runs in STRATEGIES.items()}
    frozen = [mg.tensor(p) for p in p0]
    torch = None
    if have_torch():
        import torch

        torch.set_num_threads(int(THREADS))
        xt = torch.tensor(x0)
        pt = [torch.tensor(p, requires_grad=True) for p in p0]
        expected = [g.numpy() for g in torch_step(torch, xt, pt, checkpointed=0)]
        for name, runs in STRATEGIES.items():
            for mode, grads in (("tape", tape_step(x, params, runs)),
                                ("graph", graph_steps[name](*frozen))):
                for g, e in zip(grads, expected):
                    np.testing.assert_allclose(g.numpy(), e, rtol=1e-9, atol=1e-12,
                                               err_msg=f"{name}, {mode}")
        print("gradients: equal to PyTorch's (rtol 1e-9) for every strategy, on the tape and "
              "in graph mode")

    # -- a. the tape ----------------------------------------------------------------------------
    peaks = {name: device_peak(lambda runs=runs: tape_step(x, params, runs))
             for name, runs in STRATEGIES.items()}
    faults = {name: page_faults(lambda runs=runs: tape_step(x, params, runs))
              for name, runs in STRATEGIES.items()}
    methods: dict[str, Callable[[], Any]] = {
        name: (lambda runs=runs: tape_step(x, params, runs)) for name, runs in STRATEGIES.items()}
    theirs = {"torch plain": 0, "torch checkpoint all 4": SEGMENTS,
              "torch checkpoint 3, last plain": SEGMENTS - 1}
    methods["forward alone (F)"] = lambda: forward_only(x, params)
    if torch is not None:
        methods.update({name: (lambda k=k: torch_step(torch, xt, pt, k))
                        for name, k in theirs.items()})
    timed, summary = measure(methods, anchor="plain", rounds=15, batch=0.02)
    print("\na. one step on the tape (forward, loss, backward):")
    print_rounds(summary)
    rows = []
    for name in STRATEGIES:
        rows.append([name, fmt(peaks[name] / MB), fmt(peaks[name] / peaks["plain"]),
                     f"{peaks[name] / activation:.1f}",
                     "-" if faults[name] is None else f"{faults[name]:.0f}",
                     fmt(timed[name]["seconds"] * 1e3, 1), fmt(timed[name]["ratio"]),
                     fmt(timed[name]["best_ratio"]),
                     f"<= {MEMORY_TARGET}x / <= {TIME_TARGET}x" if name == TARGET_ROW else ""])
    rows.append(["forward alone (F)", "-", "-", "-", "-",
                 fmt(timed["forward alone (F)"]["seconds"] * 1e3, 1),
                 fmt(timed["forward alone (F)"]["ratio"]),
                 fmt(timed["forward alone (F)"]["best_ratio"]), ""])
    if torch is not None:
        for name in theirs:
            ratio = statistics.median(a / b for a, b in zip(timed[name]["rounds"],
                                                            timed["torch plain"]["rounds"]))
            rows.append([name, "-", "-", "-", "-", fmt(timed[name]["seconds"] * 1e3, 1),
                         f"{fmt(ratio)} of torch plain", "", ""])
    print_table(rows, ["step", "peak MB", "/ plain", "activations", "page faults", "ms",
                       "/ plain", "best rounds", "target"])
    memory_ratio = peaks[TARGET_ROW] / peaks["plain"]
    time_ratio = timed[TARGET_ROW]["ratio"]
    share = timed["forward alone (F)"]["ratio"]
    print(f"(activations: the peak in units of one layer's output; the checkpointed steps "
          f"hold the {SEGMENTS} boundaries, one segment's insides and the adjoints. The "
          f"forward alone, nothing kept, is {share:.2f} of the plain step: recomputing "
          f"every layer adds about that much arithmetic, while the smaller peak touches "
          f"fewer fresh pages, the page faults column)")
    print(f"target: checkpoint peak bytes <= {MEMORY_TARGET}x the plain step  -> "
          f"{memory_ratio:.3f}x  {verdict(memory_ratio, MEMORY_TARGET)}")
    print(f"target: checkpoint time <= {TIME_TARGET}x the plain step  -> {time_ratio:.3f}x "
          f"(best rounds {timed[TARGET_ROW]['best_ratio']:.3f}x)  "
          f"{verdict(time_ratio, TIME_TARGET)}")

    # -- b. graph mode ----------------------------------------------------------------------------
    allocated = {name: allocated_peak(lambda step=step: step(*frozen), warm_up=False)
                 for name, step in graph_steps.items()}
    gtimed, gsummary = measure({name: (lambda step=step: step(*frozen))
                                for name, step in graph_steps.items()},
                               anchor="plain", rounds=7, batch=0.02)
    print("\nb. the same gradient by a compiled mg.grad(..., mode=\"graph\"):")
    print_rounds(gsummary)
    print_table([[name, fmt(allocated[name] / MB), fmt(allocated[name] / allocated["plain"]),
                  fmt(gtimed[name]["seconds"] * 1e3, 1), fmt(gtimed[name]["ratio"])]
                 for name in graph_steps],
                ["graph mode", "NumPy peak MB", "/ plain", "ms", "/ plain"])
    print("no target: shown beside the tape's (a compiled graph writes many results in "
          "place already, and each checkpoint node recomputes its segment eagerly)")

    save_results("checkpoint", {
        "when": datetime.datetime.now().isoformat(), "environment": environment(),
        "model": {"depth": DEPTH, "width": WIDTH, "batch": BATCH, "segments": SEGMENTS},
        "tape": {"peak_bytes": peaks, "page_faults": faults, "memory_ratio": memory_ratio,
                 "time": timed,
                 "time_ratio": time_ratio},
        "graph": {"allocated_peak_bytes": allocated, "time": gtimed}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
