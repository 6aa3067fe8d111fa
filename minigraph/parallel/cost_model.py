"""The communication cost model of chapters 07 and 08: the bytes each device sends.

One unit everywhere: **bytes a device sends** in one synchronisation of a tensor of S
bytes over n devices. That is what a run counts (``sess.last_run.bytes_moved`` per
(source, destination) link; ``bytes_sent`` per source device) and what an eager
``allreduce_with_stats`` counts in ``CommStats.moved``. Links are taken as full duplex:
a device sends and receives at once, each direction at ``bandwidth`` bytes per second,
so a synchronisation takes (bytes the busiest device sends) / bandwidth.

The three algorithms minigraph implements (``mg.parallel.allreduce(..., algorithm)``):

* ``"naive"`` (d2l's): every device sends its tensor to device 0, which adds them up
  and sends the sum back. Device 0 sends (n - 1) S, every other device S.
* ``"ring"``: the tensor is cut into n chunks c_0 .. c_{n-1} (``chunks``); n - 1 steps
  of reduce-scatter, then n - 1 of all-gather, each device sending one chunk to its
  right neighbour per step. In the reduce-scatter device i sends every chunk but
  c_{i+1}, in the all-gather every chunk but c_{i+2}: S - c_{i+1} + S - c_{i+2}, that is
  2 (n - 1) S / n when the chunks are equal.
* ``"parameter_server"``: a parameter server sharded over the devices themselves
  (PipeDream's setting): device k serves chunk k. Every device pushes its other n - 1
  chunks to their servers, and each server sends its summed chunk to the n - 1 others:
  device k sends S - c_k + (n - 1) c_k, again 2 (n - 1) S / n for equal chunks. In bytes
  it is the ring's twin; it takes 2 steps instead of 2 (n - 1), and every device talks
  to every other.

:func:`sync_factor` is the busiest device's bytes over S for equal chunks; the
partitioner of chapter 08 charges a stage replicated on m workers
``sync_factor(algorithm, m) * w / bandwidth`` (``SYNC_FACTORS`` in
``pipeline/partitioning.py`` reads it from here).

:data:`PIPEDREAM_TEXT` keeps the estimates of the PipeDream source analysis (section
4.1.1, "how to compute"), as the text states them, for chapter 08 to quote: a parameter
server 4 (m - 1) |w_i| / m, and for all_reduce "each worker sends (m - 1) |w_i| / m
bytes and receives as many". Neither is in this unit. The parameter-server figure adds
the bytes received to the bytes sent (2 (m - 1) w / m each way); the all_reduce figure
is one phase of a ring: a ring allreduce sends (m - 1) w / m in its reduce-scatter and
as much again in its all-gather, 2 (m - 1) w / m per worker, which the counters confirm.
Taken as bytes sent, the text's all_reduce charge is half of what moves.
"""

from __future__ import annotations

from typing import Callable

ALGORITHMS = ("naive", "ring", "parameter_server")

# The PipeDream text's per-worker estimates, as written (see the module docstring): not
# this model's unit, never used by the partitioner; chapter 08 quotes and flags them.
PIPEDREAM_TEXT: dict[str, Callable[[int], float]] = {
    "parameter_server": lambda m: 4 * (m - 1) / m,   # sent + received
    "allreduce": lambda m: (m - 1) / m,              # one of the ring's two phases
}


def _check(algorithm: str, n: int, who: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"{who}: algorithm is one of {list(ALGORITHMS)}, got {algorithm!r}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{who}: the number of devices must be an int >= 1, got {n!r}")


def chunks(elements: int, n: int) -> list[int]:
    """The sizes (in elements) of the n chunks a flat tensor is cut into: chunk c is
    elements ``floor(E c / n) .. floor(E (c + 1) / n) - 1``, as ``scatter`` cuts a batch."""
    if n < 1:
        raise ValueError(f"chunks: a tensor is cut into n >= 1 chunks, got n = {n}")
    cuts = [elements * c // n for c in range(n + 1)]
    return [b - a for a, b in zip(cuts, cuts[1:])]


def bytes_sent(algorithm: str, elements: int, n: int, itemsize: int = 8) -> list[int]:
    """Bytes each of ``n`` devices sends in one allreduce of a tensor of ``elements``
    elements of ``itemsize`` bytes, exactly (chunks that differ by one element
    included), in device order."""
    _check(algorithm, n, "bytes_sent")
    # (negative sizes gave negative bytes)
    for what, v, low in (("elements", elements, 0), ("itemsize", itemsize, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"bytes_sent: {what} must be an int >= {low}, got {v!r}")
    if n == 1:
        return [0]
    c = chunks(elements, n)
    if algorithm == "naive":
        per = [(n - 1) * elements] + [elements] * (n - 1)
    elif algorithm == "ring":
        per = [2 * elements - c[(i + 1) % n] - c[(i + 2) % n] for i in range(n)]
    else:  # parameter_server
        per = [elements - c[k] + (n - 1) * c[k] for k in range(n)]
    return [e * itemsize for e in per]


def steps(algorithm: str, n: int) -> int:
    """Communication steps (each with its own latency): the ring's 2 (n - 1) against 2."""
    _check(algorithm, n, "steps")
    if n == 1:
        return 0
    return 2 * (n - 1) if algorithm == "ring" else 2


def sync_factor(algorithm: str, n: int) -> float:
    """Bytes the busiest of ``n`` devices sends per byte of the tensor, chunks equal:
    naive n - 1, ring and sharded parameter server 2 (n - 1) / n."""
    _check(algorithm, n, "sync_factor")
    return float(n - 1) if algorithm == "naive" else 2 * (n - 1) / n


def sync_time(algorithm: str, n: int, nbytes: float, bandwidth: float) -> float:
    """Seconds to synchronise ``nbytes`` over ``n`` devices at ``bandwidth`` bytes/s
    per direction: the busiest device's bytes over the bandwidth (latency left out)."""
    if not bandwidth > 0:
        raise ValueError(f"sync_time: bandwidth must be > 0 bytes/s, got {bandwidth}")
    return sync_factor(algorithm, n) * nbytes / bandwidth
