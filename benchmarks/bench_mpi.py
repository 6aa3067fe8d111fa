"""Data parallelism on MPI: a 2-rank step against one rank (issue [5/6]).

    python benchmarks/bench_mpi.py [--steps 7] [--rounds 3] [--batch 1024] [--width 512]

starts jobs ``mpiexec -n 1`` and ``mpiexec -n 2`` of this script in worker mode, in
turns (``--rounds`` of each, so that a drift of the machine's speed hits both alike).
Each rank runs the data-parallel step of ``minigraph.examples.mpi_data_parallel`` (a
512-512-512 tanh MLP, float64: its forward and backward are 512x512 matmuls on the
batch) on its 1/n of the batch and all-reduces the gradients with
``mg.distributed.all_reduce``. BLAS is pinned to one thread per process
(OPENBLAS_NUM_THREADS=1 and the others), so one rank uses one core and two ranks two.
The table gives the median step time, the speed-up (target >= 1.6x on two cores) and
the bytes all-reduced per step. A benchmark, not a test: it asserts nothing on time.
On a machine shared with other work the speed-up is only as good as the idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import cpu_only

THREADS = {v: "1" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def worker(steps: int, batch: int, width: int) -> None:
    import minigraph as mg
    from minigraph.examples.mpi_data_parallel import data_parallel_step, gradient_bytes, problem

    mg.distributed.init()
    params, x, y = problem(width, batch)
    data_parallel_step(params, x, y)  # warm-up
    times = []
    for _ in range(steps):
        mg.distributed.barrier()
        start = time.perf_counter()
        data_parallel_step(params, x, y)
        times.append(time.perf_counter() - start)
    # a step ends when the slowest rank ends: take each step's maximum over ranks
    everyone = mg.distributed.comm().allgather(times)
    step = [max(t[k] for t in everyone) for k in range(steps)]
    if mg.distributed.rank() == 0:
        print(json.dumps({"ranks": mg.distributed.world_size(), "median": statistics.median(step),
                          "bytes": gradient_bytes(params)}))


def main() -> None:
    parser = argparse.ArgumentParser(description="2-rank data-parallel step vs one rank")
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3,
                        help="one-rank and two-rank jobs alternate this many times")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.steps, args.batch, args.width)
    if cpu_only("the ranks are processes on CPU cores, and their arrays are NumPy's"):
        return None
    mpiexec = shutil.which("mpiexec", path=os.path.join(sys.prefix, "bin")) or shutil.which("mpiexec")
    if mpiexec is None:
        raise SystemExit("mpiexec not found: pip install 'minigraph[mpi]'")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, **THREADS, "PYTHONPATH": str(root)}
    # The one-rank and two-rank jobs take turns, round after round, so that a change in the
    # machine's speed meanwhile (another program, the clock) falls on both alike; each job's
    # figure is the median of its rounds' medians.
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(args.rounds):
        for n in (1, 2):
            cmd = [mpiexec, "-n", str(n), sys.executable, __file__, "--worker", "--steps",
                   str(args.steps), "--batch", str(args.batch), "--width", str(args.width)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                raise SystemExit(out.stdout + out.stderr)
            runs[n].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = {n: {**found[0], "median": statistics.median(r["median"] for r in found)}
            for n, found in runs.items()}
    rounds = [one["median"] / two["median"] for one, two in zip(runs[1], runs[2])]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"data-parallel step, {args.width}-{args.width}-{args.width} tanh MLP, batch "
          f"{args.batch}, float64, BLAS 1 thread per rank, {os.cpu_count()} CPUs, "
          f"load average {load:.2f}")
    print(f"{'ranks':>5} {'step (ms)':>10} {'speed-up':>9} {'bytes all-reduced/rank/step':>28}")
    for n, row in rows.items():
        print(f"{n:>5} {row['median'] * 1e3:>10.1f} {rows[1]['median'] / row['median']:>8.2f}x "
              f"{row['bytes'] if n > 1 else 0:>28}")
    print("speed-up of each round: " + ", ".join(f"{r:.2f}x" for r in rounds))
    speedup = rows[1]["median"] / rows[2]["median"]
    print(f"target: a 2-rank data-parallel step >= 1.6x faster than one rank on two cores  "
          f"({'met' if speedup >= 1.6 else 'MISSED'}: {speedup:.2f}x at load average {load:.2f})")


if __name__ == "__main__":
    main()
