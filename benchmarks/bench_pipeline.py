"""Pipeline parallelism: GPipe against 1F1B, simulated and run for real.

Run: ``python benchmarks/bench_pipeline.py`` (a few seconds). Prints four sections and
writes to ``benchmarks/results/``:

* ``pipeline_timelines.png``: the simulated timelines of GPipe and 1F1B for p = 4 stages
  and m = 8 microbatches (backward = 2 x forward), with the microbatches whose
  activations each stage holds over time, as in the GPipe and PipeDream figures;
* ``pipeline_measured.png``: the same two schedules *measured* on minigraph's runtime
  (an MLP cut into 4 stages on cpu, cpu:1, cpu:2, cpu:3);
* ``pipeline.json``: every number printed, and the environment.

a. The bubble (idle fraction) as m grows, p = 4: both schedules against the closed form
   (p - 1) / (m + p - 1), and the activations stage 0 holds (GPipe m, 1F1B p).
b. PipeDream's first two phases on a real model: the profile (PipeDream's text form, also
   written to ``pipeline_profile.txt``), the dynamic-programming partition into 4 stages,
   and PipeDream's plans with replication for 8 workers at several bandwidths.
c. The real pipelined step under both schedules: its gradients are checked against the
   plain (non-pipelined) step *before* anything is reported; then the order each device
   ran, the values that crossed devices, the peak live bytes per device and the time
   per step. Times are reported, never asserted (DESIGN.md, "Performance").
d. GPipe against 1F1B, measured, on notebook 08's model (batch 256, widths
   32-64-256-256-64-10, its DP partition into 4 stages): the two schedules run
   alternately, 7 rounds, and each keeps its fastest run (``pp.fastest_runs``); the
   ratio of the two fastest makespans, 1F1B / GPipe, for 4 repetitions, next to the
   range of single runs. One measured run is one moment of the machine, and other work
   only ever adds time to it; the fastest of interleaved runs compares the schedules
   (chapter 08, section 5, quotes these figures).

BLAS is pinned to one thread (as in ``bench_runtime.py``): the four device executors are
threads of one process, and on a small machine BLAS thread pools of their own would
oversubscribe the cores. The batch is large next to the layer widths, as in the models
pipelines are made for, so that activations, not weight gradients, dominate memory.
"""

from __future__ import annotations

import datetime
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find common.py however we are run
from common import (RESULTS_DIR, THREAD_VARS, blas_threads, cpu_only, describe,  # noqa: E402
                    environment, fmt, print_table, save_results)

# One BLAS thread per call, set before NumPy is imported: four device executors share this
# machine's cores, and BLAS pools of their own would only fight over them.
for _var in THREAD_VARS:
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

import minigraph as mg  # noqa: E402
from minigraph import nn  # noqa: E402
from minigraph.parallel import pipeline as pp  # noqa: E402

P, M = 4, 8                      # the figure: 4 stages, 8 microbatches
FORWARD, BACKWARD = 1.0, 2.0     # a backward costs about two forwards
MICROBATCHES = [1, 2, 4, 8, 16, 32, 64]
BATCH, SIZES = 2048, [128, 256, 256, 256, 256, 10]  # the real model: an MLP with tanh
WORKERS, BANDWIDTHS = 8, [10e9, 1e9, 1e8]             # PipeDream's plans: 8 workers
SMALL_BATCH = 32
STEPS = 5
NOTEBOOK_BATCH, NOTEBOOK_SIZES = 256, [32, 64, 256, 256, 64, 10]  # d: notebook 08's model
ROUNDS, REPETITIONS = 7, 4       # d: alternating runs per schedule, and how many times


# -- a. simulations ---------------------------------------------------------------------------

def bubble_table() -> list[dict[str, Any]]:
    rows = []
    for m in MICROBATCHES:
        sims = {k: pp.simulate(pp.schedule(k, P, m), FORWARD, BACKWARD) for k in pp.KINDS}
        rows.append({"m": m, "closed_form": pp.bubble_closed_form(P, m),
                     **{f"{k}_bubble": s.bubble_fraction for k, s in sims.items()},
                     **{f"{k}_makespan": s.makespan for k, s in sims.items()},
                     **{f"{k}_peak_stage0": s.peak_activations[0] for k, s in sims.items()}})
    return rows


def report_bubbles(rows: list[dict[str, Any]]) -> None:
    print_table([[r["m"], fmt(r["closed_form"], 3), fmt(r["gpipe_bubble"], 3),
                  fmt(r["1f1b_bubble"], 3), r["gpipe_peak_stage0"], r["1f1b_peak_stage0"]]
                 for r in rows],
                ["m", "(p-1)/(m+p-1)", "GPipe bubble", "1F1B bubble",
                 "GPipe act. stage 0", "1F1B act. stage 0"])


def timeline_figure() -> dict[str, Any]:
    sims = {k: pp.simulate(pp.schedule(k, P, M), FORWARD, BACKWARD) for k in pp.KINDS}
    fig = pp.draw_comparison({"GPipe" if k == "gpipe" else "1F1B": s for k, s in sims.items()})
    fig.savefig(RESULTS_DIR / "pipeline_timelines.png", dpi=120)
    for k, s in sims.items():
        print(f"{k:>5}: makespan {s.makespan:g}, bubble {s.bubble_fraction:.3f}, "
              f"activations held per stage {s.peak_activations}")
    return {k: {"makespan": s.makespan, "bubble_fraction": s.bubble_fraction,
                "peak_activations": s.peak_activations} for k, s in sims.items()}


# -- b. profile and partition -------------------------------------------------------------------

def make_model(sizes: list[int] = SIZES) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b, seed=k))
        if k < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def profile_and_partition(model: nn.Sequential, x: np.ndarray) -> dict[str, Any]:
    prof = pp.profile(model, x)
    print(prof.to_text(), end="")
    prof.save(RESULTS_DIR / "pipeline_profile.txt")
    stages = pp.partition(prof, P)
    times = pp.stage_times(prof, stages)
    print(f"\nDP partition into {P} stages: {stages}")
    print("stage times (ms): " + ", ".join(f"{t * 1e3:.3f}" for t in times)
          + f"; slowest / mean = {max(times) / statistics.mean(times):.2f}")
    plans = pipedream_plans({BATCH: prof, SMALL_BATCH: pp.profile(model, x[:SMALL_BATCH])})
    return {"profile": [vars(c) for c in prof], "stages": stages, "stage_times": times,
            "pipedream": plans}


def pipedream_plans(profiles: dict[int, pp.Profile]) -> list[dict[str, Any]]:
    """PipeDream's plans for the model at two batch sizes and several bandwidths: with a
    large batch, activations outweigh the weights and data parallelism wins; with a small
    batch and a slow network, a pipeline does."""
    rows = []
    for batch, prof in profiles.items():
        for bandwidth in BANDWIDTHS:
            plan = pp.partition_pipedream(prof, WORKERS, bandwidth)
            rows.append({"batch": batch, "bandwidth": bandwidth, "stages": plan.stages,
                         "replicas": plan.replicas, "slowest": plan.slowest})
    print(f"\nPipeDream's plans for {WORKERS} workers, allreduce weight sync:")
    print_table([[r["batch"], f"{r['bandwidth'] / 1e9:g}", r["stages"], r["replicas"],
                  fmt(r["slowest"] * 1e3, 3)] for r in rows],
                ["batch", "GB/s", "stages", "replicas", "slowest ms"])
    return rows


# -- c. the real pipelined step ------------------------------------------------------------------

def plain_gradients(model: nn.Sequential, loss_fn: Any, x: np.ndarray,
                    labels: np.ndarray) -> tuple[float, list[np.ndarray]]:
    model.zero_grad()
    loss = loss_fn(model(mg.tensor(x)), mg.tensor(labels))
    loss.backward()
    grads = [p.grad.numpy() for p in model.parameters()]
    model.zero_grad()
    return loss.item(), grads


def real_runs(model: nn.Sequential, stages: list[list[int]], x: np.ndarray,
              labels: np.ndarray) -> dict[str, Any]:
    loss_fn = nn.CrossEntropyLoss()
    loss, grads = plain_gradients(model, loss_fn, x, labels)
    devices = ["cpu"] + [f"cpu:{s}" for s in range(1, P)]
    out, runs = {}, {}
    for kind in pp.KINDS:
        pipe = pp.Pipeline(model, loss_fn, stages, devices, schedule=kind, microbatches=M)
        run = pipe.run(x, labels)  # builds the graph; checked before anything is timed
        err = max(float(np.abs(g - e).max() / (np.abs(e).max() + 1e-300))
                  for g, e in zip(run.grads, grads))
        if abs(run.loss - loss) > 1e-12 * abs(loss) or err > 1e-10:
            raise AssertionError(f"{kind}: pipelined gradients differ from the plain step "
                                 f"(loss {run.loss} vs {loss}, relative error {err:.2e})")
        seconds = []
        for _ in range(STEPS):
            t0 = time.perf_counter()
            run = pipe.run(x, labels)
            seconds.append(time.perf_counter() - t0)
        runs[kind] = run
        out[kind] = {"max_relative_grad_error": err, "seconds_per_step": statistics.median(seconds),
                     "order_matches_schedule": run.order == list(pipe.schedule),
                     "peak_activations": run.peak_activations, "peak_bytes": run.peak_bytes,
                     "sends": run.sends}
    t0 = time.perf_counter()
    for _ in range(STEPS):
        plain_gradients(model, loss_fn, x, labels)
    out["plain_tape_seconds_per_step"] = (time.perf_counter() - t0) / STEPS
    draw_measured(runs)
    return out


def report_real(res: dict[str, Any]) -> None:
    rows = []
    for kind in pp.KINDS:
        r = res[kind]
        rows.append([kind, f"{r['max_relative_grad_error']:.1e}", r["order_matches_schedule"],
                     " ".join(map(str, r["peak_activations"])),
                     " ".join(f"{b / 1e6:.2f}" for b in r["peak_bytes"]), r["sends"],
                     fmt(r["seconds_per_step"] * 1e3, 1)])
    print_table(rows, ["schedule", "grad err", "order = schedule", "act. held per stage",
                       "peak MB per device", "sends", "ms/step"])
    print(f"plain step on one device (tape): {res['plain_tape_seconds_per_step'] * 1e3:.1f} ms")


def draw_measured(runs: dict[str, pp.PipelineRun]) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 2.4 * len(runs)), layout="constrained")
    for ax, (kind, run) in zip(fig.subplots(len(runs), 1, squeeze=False)[:, 0], runs.items()):
        t0 = min(e[3] for e in run.timeline)
        shifted = [(s, k, i, (a - t0) * 1e3, (b - t0) * 1e3) for s, k, i, a, b in run.timeline]
        pp.draw_timeline(shifted, len(run.order), ax, f"{kind}, measured on minigraph's runtime")
        ax.set_xlabel("time (ms)")
    fig.savefig(RESULTS_DIR / "pipeline_measured.png", dpi=120)


# -- d. GPipe against 1F1B, measured: the fastest of alternating runs -----------------------

def makespan(run: pp.PipelineRun) -> float:
    """Seconds from the start of a run's first pass to the end of its last."""
    return max(e[4] for e in run.timeline) - min(e[3] for e in run.timeline)


def fastest_timelines() -> dict[str, Any]:
    """Notebook 08's model under both schedules: ``REPETITIONS`` times, the fastest of
    ``ROUNDS`` alternating runs of each, and every single run's makespan."""
    model = make_model(NOTEBOOK_SIZES)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NOTEBOOK_BATCH, NOTEBOOK_SIZES[0]))
    labels = rng.integers(0, NOTEBOOK_SIZES[-1], size=NOTEBOOK_BATCH)
    stages = pp.partition(pp.profile(model, x), P)
    pipes = {kind: pp.Pipeline(model, nn.CrossEntropyLoss(), stages, schedule=kind,
                               microbatches=M) for kind in pp.KINDS}
    for pipe in pipes.values():
        pipe.run(x, labels)  # builds the graph
    single: dict[str, list[float]] = {kind: [] for kind in pp.KINDS}

    def timed(kind: str) -> Any:  # a run, whose makespan is also kept among the single runs
        run = pipes[kind].run(x, labels)
        single[kind].append(makespan(run))
        return run

    fastest = []
    for _ in range(REPETITIONS):
        best = pp.fastest_runs({kind: partial(timed, kind) for kind in pp.KINDS},
                               ROUNDS, makespan)
        fastest.append({kind: makespan(run) for kind, run in best.items()})
    # fastest_runs calls each schedule once per round: single runs i are a moment apart
    pairs = [b / g for g, b in zip(single["gpipe"], single["1f1b"])]
    return {"stages": stages, "load_average": os.getloadavg(), "fastest": fastest,
            "single": single, "single_ratios": pairs}


def report_fastest(res: dict[str, Any]) -> None:
    print(f"stages {res['stages']}; load average "
          + " ".join(f"{v:.1f}" for v in res["load_average"]))
    print_table([[i + 1, fmt(f["gpipe"] * 1e3, 1), fmt(f["1f1b"] * 1e3, 1),
                  fmt(f["1f1b"] / f["gpipe"], 2)] for i, f in enumerate(res["fastest"])],
                ["repetition", f"GPipe ms (fastest of {ROUNDS})", f"1F1B ms (fastest of {ROUNDS})",
                 "1F1B/GPipe"])
    single, pairs = res["single"], res["single_ratios"]
    print(f"single runs ({len(pairs)} of each): GPipe {min(single['gpipe']) * 1e3:.0f} to "
          f"{max(single['gpipe']) * 1e3:.0f} ms, 1F1B {min(single['1f1b']) * 1e3:.0f} to "
          f"{max(single['1f1b']) * 1e3:.0f} ms; 1F1B/GPipe in one round "
          f"{min(pairs):.2f} to {max(pairs):.2f}")


def main() -> None:
    if cpu_only("the pipeline schedules run on virtual CPU devices"):
        return
    with blas_threads(1):  # also when NumPy is already loaded (minigraph bench)
        run()


def run() -> None:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(describe(env))

    print(f"\n== a. simulated: p = {P} stages, forward {FORWARD:g}, backward {BACKWARD:g} ==")
    figure = timeline_figure()
    bubbles = bubble_table()
    report_bubbles(bubbles)

    model = make_model()
    rng = np.random.default_rng(0)
    x, labels = rng.normal(size=(BATCH, SIZES[0])), rng.integers(0, SIZES[-1], size=BATCH)
    print(f"\n== b. profile and partition: MLP {BATCH}x{'-'.join(map(str, SIZES))}, float64 ==")
    parts = profile_and_partition(model, x)

    print(f"\n== c. real pipelined step: {P} stages on cpu..cpu:{P - 1}, m = {M} ==")
    real = real_runs(model, parts["stages"], x, labels)
    report_real(real)

    print(f"\n== d. GPipe against 1F1B, measured: notebook 08's model, the fastest of "
          f"{ROUNDS} alternating runs, {REPETITIONS} times ==")
    fastest = fastest_timelines()
    report_fastest(fastest)

    path = save_results("pipeline", {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "environment": env, "stages": P, "microbatches": M,
        "forward": FORWARD, "backward": BACKWARD,
        "simulated": figure, "bubbles": bubbles, "partition": parts, "real": real,
        "fastest_of_alternating_runs": fastest})
    print(f"\nwrote {path}, {RESULTS_DIR / 'pipeline_timelines.png'}, "
          f"{RESULTS_DIR / 'pipeline_measured.png'}")


if __name__ == "__main__":
    main()
