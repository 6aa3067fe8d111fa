"""Data and model parallelism on virtual CPU devices: what moves, and where memory goes.

a. allreduce of one gradient-sized tensor over n devices: the naive algorithm (gather on
   the first device, add, send back) against the ring (reduce-scatter + all-gather):
   bytes through the busiest device, total bytes, steps, time.
b. the class-sharded classifier: per-device peak memory of a forward+backward with the
   memory-balanced parallel cross-entropy against concatenating the logits on one device
   (target: max/min <= 1.2 for the sharded version). A bar plot goes to
   benchmarks/results/parallel_memory.png.

Run: python benchmarks/bench_parallel.py
"""

from __future__ import annotations

import numpy as np

import minigraph as mg
from common import (RESULTS_DIR, cpu_only, describe, environment, fmt, print_table,
                    save_results, timeit)


def bench_allreduce() -> list[dict]:
    rows = []
    size = 1 << 18  # 256 Ki float64 = 2 MiB
    for n in (2, 3, 4):
        mg.set_virtual_cpus(max(3, n - 1))
        devices = ["cpu"] + [f"cpu:{k}" for k in range(1, n)]
        tensors = [mg.tensor(np.full(size, float(k)), device=d) for k, d in enumerate(devices)]
        for algorithm in ("naive", "ring"):
            out, stats = mg.parallel.allreduce_with_stats(tensors, algorithm)
            assert all(np.allclose(o.numpy(), sum(range(n))) for o in out)
            seconds = timeit(lambda: mg.parallel.allreduce(tensors, algorithm), repeat=5)
            rows.append({"devices": n, "algorithm": algorithm, "ms": seconds * 1e3,
                         "busiest_MiB": stats.bytes_max_device / 2**20,
                         "total_MiB": stats.bytes_total / 2**20, "steps": stats.steps})
    print("\n== a. allreduce of a 2 MiB tensor ==")
    print_table([[r["devices"], r["algorithm"], fmt(r["busiest_MiB"]), fmt(r["total_MiB"]),
                  r["steps"], fmt(r["ms"])] for r in rows],
                ["devices", "algorithm", "busiest device sends MiB", "total MiB", "steps", "ms"])
    print("ring: each device sends 2(n-1)/n of the tensor, evenly; naive: the first device "
          "sends n-1 tensors and receives n-1")
    return rows


def peaks(fn, devices: list[str]) -> list[int]:
    devs = [mg.device(d) for d in devices]
    base = [d.live_bytes for d in devs]
    for d in devs:
        d.reset_peak()
    fn().backward()
    return [d.peak_bytes - b for d, b in zip(devs, base)]


def bench_memory() -> dict:
    devices = ["cpu", "cpu:1", "cpu:2"]
    n, features, classes = 256, 64, 30_000
    layer = mg.parallel.ShardedLinear(features, classes, devices, seed=0)
    rng = np.random.default_rng(0)
    x = mg.tensor(rng.normal(size=(n, features)))
    labels = mg.tensor(rng.integers(0, classes, size=n))
    sharded = peaks(lambda: mg.parallel.parallel_cross_entropy(layer(x), labels), devices)
    naive = peaks(lambda: mg.cross_entropy(
        mg.concatenate([s.to("cpu") for s in layer(x)], axis=1), labels), devices)
    print(f"\n== b. classifier {features}x{classes} over 3 devices, batch {n}: peak MiB ==")
    print_table([["sharded + parallel cross-entropy"] + [fmt(p / 2**20) for p in sharded]
                 + [fmt(max(sharded) / min(sharded))],
                 ["concatenate logits on cpu"] + [fmt(p / 2**20) for p in naive]
                 + [fmt(max(naive) / max(min(naive), 1))]],
                ["version"] + devices + ["max/min"])
    ratio = max(sharded) / min(sharded)
    print(f"target: sharded max/min <= 1.2  ({'met' if ratio <= 1.2 else 'MISSED'}: {ratio:.2f})")
    _plot(devices, sharded, naive)
    return {"devices": devices, "sharded": sharded, "naive": naive}


def _plot(devices: list[str], sharded: list[int], naive: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = np.arange(len(devices))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(xs - 0.2, [p / 2**20 for p in sharded], 0.4, label="sharded cross-entropy")
    ax.bar(xs + 0.2, [p / 2**20 for p in naive], 0.4, label="concatenated logits")
    ax.set_xticks(xs, devices)
    ax.set_ylabel("peak MiB during forward+backward")
    ax.legend()
    fig.tight_layout()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS_DIR / "parallel_memory.png", dpi=120)


def main() -> None:
    if cpu_only("allreduce and sharded losses run on virtual devices in host memory"):
        return
    env = environment()
    print(describe(env))
    results = {"allreduce": bench_allreduce(), "memory": bench_memory(), "environment": env}
    print(f"\nresults: {save_results('parallel', results)}")


if __name__ == "__main__":
    main()
