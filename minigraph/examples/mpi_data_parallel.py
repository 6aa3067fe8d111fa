"""Chapter 07, section 4: data and model parallelism on two processes.

Run it with ``mpiexec -n 2 python -m minigraph.examples.mpi_data_parallel``.

1. Data parallelism: every rank holds the same parameters of a 512-512-512 tanh MLP,
   takes half of a batch of 1024, computes its gradient with the tape, and
   ``mg.distributed.all_reduce`` adds the halves' gradients up. The gradient equals the
   one-process gradient; the step is timed against rank 0 doing the whole batch alone.
2. Model parallelism: an MLP split by layer, its first layers on rank 0 and the others on
   rank 1, trained in graph mode (``mg.parallel.LayerSplitMLP``): the activations and
   their gradients cross between the processes as Send/Recv pairs.

BLAS is pinned to one thread per process, so that two ranks use two cores, not four
threads fighting for two. ``benchmarks/bench_mpi.py`` times the data-parallel step in
separate one-rank and two-rank jobs.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import minigraph as mg
from minigraph.examples import one_blas_thread
from minigraph.parallel import LayerSplitMLP, data_parallel_grads_across_ranks


def problem(width: int = 512, batch: int = 1024, seed: int = 0) -> tuple[list, np.ndarray, np.ndarray]:
    """The same parameters and batch on every rank (the same seed)."""
    rng = np.random.default_rng(seed)
    params = [mg.tensor(rng.normal(0, width ** -0.5, (width, width))), mg.tensor(np.zeros(width)),
              mg.tensor(rng.normal(0, width ** -0.5, (width, width))), mg.tensor(np.zeros(width))]
    return params, rng.normal(size=(batch, width)), rng.normal(size=(batch, width))


def loss(ps: list, x: mg.Tensor, y: mg.Tensor) -> mg.Tensor:
    """Mean squared error of a two-layer tanh MLP: four 512x512 weights' worth of matmuls."""
    h = mg.tanh(x @ ps[0] + ps[1])
    return ((h @ ps[2] + ps[3] - y) ** 2).mean()


def data_parallel_step(params: list, x: np.ndarray, y: np.ndarray, lr: float = 0.1) -> list:
    """One SGD step, each rank on its share of the batch; returns the new parameters."""
    grads = data_parallel_grads_across_ranks(loss, params, mg.tensor(x), mg.tensor(y))
    return [mg.tensor(p.numpy() - lr * g.numpy()) for p, g in zip(params, grads)]


def one_process_step(params: list, x: np.ndarray, y: np.ndarray, lr: float = 0.1) -> list:
    """The same step in one process, on the whole batch."""
    grads = mg.grad(lambda *ps: loss(list(ps), mg.tensor(x), mg.tensor(y)),
                    argnums=tuple(range(len(params))))(*params)
    return [mg.tensor(p.numpy() - lr * g.numpy()) for p, g in zip(params, grads)]


def gradient_bytes(params: list) -> int:
    """What each rank all-reduces per step: one gradient per parameter."""
    return sum(p.numpy().nbytes for p in params)


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    one_blas_thread()
    mg.distributed.init()
    me, world = mg.distributed.rank(), mg.distributed.world_size()
    params, x, y = problem()

    # 1. data parallelism: the same step as one process, then timed
    new = data_parallel_step(params, x, y)
    want = one_process_step(params, x, y)
    error = max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in zip(new, want))
    print(f"rank {me}: data-parallel step vs one process: max |difference| = {error:.1e}",
          flush=True)
    # The two take turns, round after round, so that a change in the machine's speed
    # meanwhile (another program, the clock) hits both alike; medians of 7 rounds.
    world_times, one_times = [], []
    for _ in range(7):
        mg.distributed.barrier()  # every rank starts the data-parallel step together
        world_times.append(seconds(lambda: data_parallel_step(params, x, y)))
        if me == 0:  # the other ranks wait at the next barrier meanwhile
            one_times.append(seconds(lambda: one_process_step(params, x, y)))
    mg.distributed.barrier()
    if me == 0:
        t_world, t_one = statistics.median(world_times), statistics.median(one_times)
        size = gradient_bytes(params)
        print(f"\ndata-parallel step, 512-512-512 tanh MLP, batch {x.shape[0]}, float64:")
        print(f"  one process, whole batch : {t_one * 1e3:7.1f} ms")
        print(f"  {world} ranks, 1/{world} batch each : {t_world * 1e3:7.1f} ms   "
              f"speed-up {t_one / t_world:.2f}x")
        print(f"  gradients all-reduced    : {size} bytes per rank per step "
              f"(a ring all-reduce sends 2(n-1)/n of that: {2 * (world - 1) * size // world})")

    # 2. model parallelism: an MLP split by layer across the ranks, trained in graph mode
    rng = np.random.default_rng(1)
    xm, labels = rng.normal(size=(64, 32)), rng.integers(0, 10, 64)
    devices = [f"rank:{r}/cpu" for r in range(world)]
    model = LayerSplitMLP([32, 64, 64, 64, 10], devices, batch=64)
    losses = [model.step(xm, labels, lr=0.5) for _ in range(20)]
    alone = LayerSplitMLP([32, 64, 64, 64, 10], ["cpu"], batch=64)
    alone_losses = [alone.step(xm, labels, lr=0.5) for _ in range(20)]
    if me == 0:
        stats = model.session.last_run
        assert stats is not None  # (set by the steps above)
        print(f"\nmodel parallelism: layers on {model.placement}")
        print(f"  loss {losses[0]:.4f} -> {losses[-1]:.4f} in 20 graph-mode steps; one process: "
              f"{alone_losses[0]:.4f} -> {alone_losses[-1]:.4f} "
              f"(max |difference| {max(abs(a - b) for a, b in zip(losses, alone_losses)):.1e})")
        print(f"  bytes across ranks per step: {stats.bytes_across_ranks} "
              f"{ {f'{a} -> {b}': n for (a, b), n in stats.bytes_moved.items()} }")


if __name__ == "__main__":
    main()
