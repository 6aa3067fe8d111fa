"""Chapter 06, section 6: one graph, two processes.

Run it with ``mpiexec -n 2 python -m minigraph.examples.mpi_textbook`` (``--trace
FILE`` writes the Chrome trace of the textbook run, every rank on one timeline).

1. The textbook's z = x*y + sin(x), with x on rank 0 and y, z on rank 1: every rank
   builds the same graph, runs it, and prints the same values.
2. Two independent branches of 512x512 float64 matmuls: both on rank 0, then one on each
   rank, with the bytes that crossed between the processes. The speed-up needs one core
   per rank: BLAS gets one thread per process (``one_blas_thread``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import minigraph as mg
from minigraph.examples import one_blas_thread


def textbook() -> tuple[mg.Graph, dict, list]:
    """z = x*y + sin(x) and its gradients, x on rank 0, y and z on rank 1."""
    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            x = mg.placeholder(shape=(), name="x")
        with mg.device("rank:1/cpu"):
            y = mg.placeholder(shape=(), name="y")
            z = x * y + mg.sin(x)
        gx, gy = mg.gradients(z, [x, y])
    return g, {x: 2.0, y: 3.0}, [z, gx, gy]


def branches(where: tuple[str, str], n: int = 512, depth: int = 4) -> tuple[mg.Graph, dict, object]:
    """Two independent chains of ``depth`` matmuls (+ tanh), one on each of ``where``,
    added on the first."""
    with mg.Graph() as g:
        with mg.device("rank:0/cpu"):
            a = mg.placeholder(shape=(n, n), name="a")
            b = mg.placeholder(shape=(n, n), name="b")
        ends = []
        for start, dev in zip((a, b), where):
            with mg.device(dev):
                h = start
                for _ in range(depth):
                    h = mg.tanh(h @ h * (1.0 / n))
                ends.append(h)
        with mg.device(where[0]):
            out = ends[0] + ends[1]
    rng = np.random.default_rng(0)
    return g, {a: rng.normal(size=(n, n)), b: rng.normal(size=(n, n))}, out


def time_runs(runs: list[tuple[mg.Session, object, dict]], repeat: int) -> list[float]:
    """Median seconds of each run (every rank runs; rank 0's clock). The runs take turns,
    round after round, so that a machine that speeds up or slows down meanwhile (another
    program, the clock) changes all of them alike."""
    for sess, fetch, feeds in runs:
        sess.run(fetch, feeds)  # warm-up: plans, fingerprints, buffers
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeat):
        for seconds, (sess, fetch, feeds) in zip(times, runs):
            mg.distributed.barrier()
            start = time.perf_counter()
            sess.run(fetch, feeds)
            seconds.append(time.perf_counter() - start)
    return [statistics.median(s) for s in times]


def main() -> None:
    one_blas_thread()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="write the textbook run's Chrome trace here")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    mg.distributed.init()
    me, world = mg.distributed.rank(), mg.distributed.world_size()
    if world != 2:
        raise SystemExit("run it on two ranks: mpiexec -n 2 python -m minigraph.examples.mpi_textbook")

    g, feeds, fetches = textbook()
    sess = mg.Session(g)
    z, gx, gy = sess.run(fetches, feeds)
    print(f"rank {me}: z = {z:.12f} (6 + sin 2 = {6 + np.sin(2):.12f}), "
          f"dz/dx = {gx:.12f} (3 + cos 2 = {3 + np.cos(2):.12f}), dz/dy = {gy:.1f}", flush=True)
    mg.distributed.barrier()
    assert sess.last_run is not None  # (set by the run above)
    if me == 0:
        moved = sess.last_run.bytes_moved
        print("bytes moved by Send/Recv:", {f"{a} -> {b}": n for (a, b), n in moved.items()})
        print("events, every rank on one timeline:")
        for e in sess.last_run.events:
            print(f"  {e['ts']:9.1f} us  rank {e['rank']}  {e['name']:<22} {e['op']}")
    if args.trace and me == 0:
        sess.last_run.to_chrome_trace(args.trace)
        print("Chrome trace written to", args.trace)

    one = branches(("rank:0/cpu", "rank:0/cpu"))
    two = branches(("rank:0/cpu", "rank:1/cpu"))
    s1, s2 = mg.Session(one[0]), mg.Session(two[0])
    v1, v2 = s1.run(one[2], one[1]), s2.run(two[2], two[1])
    t1, t2 = time_runs([(s1, one[2], one[1]), (s2, two[2], two[1])], args.repeat)
    assert s2.last_run is not None  # (set by the runs above)
    if me == 0:
        print(f"\ntwo branches of 4 matmuls 512x512 float64 (same values: "
              f"{np.array_equal(v1, v2)})")
        print(f"  both on rank 0      : {t1 * 1e3:7.1f} ms")
        print(f"  one on each rank    : {t2 * 1e3:7.1f} ms   speed-up {t1 / t2:.2f}x")
        print(f"  bytes across ranks  : {s2.last_run.bytes_across_ranks} per run "
              f"({s2.last_run.bytes_moved})")


if __name__ == "__main__":
    main()
