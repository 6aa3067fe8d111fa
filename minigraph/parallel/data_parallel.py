"""Data parallelism: split the batch, copy the model, add up the gradients [d2l 12.5].

Every device holds a full copy (``replicate``) of the parameters and a slice
(``scatter``) of the batch; it computes the gradient of its slice's loss on its own;
then ``allreduce`` gives every device the sum of all devices' gradients, so every copy
takes the same step and the copies stay equal. The sum over slices is the gradient of
the whole batch, so the step equals the single-device step.

``allreduce`` moves tensors between devices with ``Tensor.to``: every copy is a real
one, so the bytes counted are bytes that really moved.

* ``"naive"``: gather every tensor on the first device, add, and send the sum back;
  the first device sends (n - 1) S bytes and receives as many (S: one tensor's bytes).
* ``"ring"``: cut each tensor into n chunks; in n - 1 steps of *reduce-scatter* each
  device passes one chunk to its right neighbour, which adds it to its own, until every
  device holds one chunk of the total; in n - 1 steps of *all-gather* the finished
  chunks go round the ring. Each device sends 2 (n - 1) / n S bytes: less than 2 S
  however many devices there are, and spread evenly over all the links.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..device import get_device
from ..ops import shape as SH
from ..tensor import Tensor, tensor


@dataclass
class CommStats:
    """What an allreduce moved: the bytes sent in all, the bytes *sent* by the device that
    sends most, and the number of communication steps."""

    algorithm: str
    bytes_total: int
    bytes_max_device: int
    steps: int


def scatter(x: Any, devices: Sequence[str]) -> list[Tensor]:
    """Split ``x`` along dimension 0 into ``len(devices)`` parts, one per device."""
    x = x if isinstance(x, Tensor) else tensor(x)
    n = x.shape[0]
    bounds = [n * k // len(devices) for k in range(len(devices) + 1)]
    return [x[bounds[k]:bounds[k + 1]].to(d) for k, d in enumerate(devices)]


def replicate(params: Sequence[Tensor], devices: Sequence[str]) -> list[list[Tensor]]:
    """One copy of ``params`` per device: ``replicas[k][j]`` is param j on device k."""
    return [[p.to(d) for p in params] for d in devices]


def gather(xs: Sequence[Tensor], device: str) -> Tensor:
    """Concatenate parts (along dimension 0) on ``device``."""
    return SH.concatenate([x.to(device) for x in xs], axis=0)


_ITEMSIZE = {"float64": 8, "float32": 4, "int64": 8, "int32": 4, "bool": 1}


def _nbytes(t: Tensor) -> int:
    return t.size * _ITEMSIZE[t.dtype]


def allreduce(tensors: Sequence[Tensor], algorithm: str = "ring") -> list[Tensor]:
    """Every device gets the sum of ``tensors`` (one per device), on its own device."""
    return allreduce_with_stats(tensors, algorithm)[0]


def allreduce_with_stats(tensors: Sequence[Tensor],
                         algorithm: str = "ring") -> tuple[list[Tensor], CommStats]:
    """``allreduce``, and what it moved between devices."""
    tensors = list(tensors)
    shapes = {t.shape for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"allreduce: every device must give the same shape, got {sorted(shapes)}")
    if algorithm == "naive":
        return _naive(tensors)
    if algorithm == "ring":
        return _ring(tensors)
    raise ValueError(f"allreduce: algorithm is 'ring' or 'naive', got {algorithm!r}")


def _naive(tensors: list[Tensor]) -> tuple[list[Tensor], CommStats]:
    root = tensors[0].device
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t.to(root)
    out = [total] + [total.to(t.device) for t in tensors[1:]]
    n, size = len(tensors), _nbytes(tensors[0])
    # every other device sends its tensor once; the first one sends the sum n - 1 times
    return out, CommStats("naive", 2 * (n - 1) * size, (n - 1) * size, 2)


def _ring(tensors: list[Tensor]) -> tuple[list[Tensor], CommStats]:
    n, shape = len(tensors), tensors[0].shape
    if n == 1:
        return [tensors[0]], CommStats("ring", 0, 0, 0)
    flat = [SH.reshape(t, (-1,)) for t in tensors]
    size = flat[0].shape[0]
    cuts = [size * k // n for k in range(n + 1)]
    # chunks[i][c]: device i's current version of chunk c
    chunks = [[f[cuts[c]:cuts[c + 1]] for c in range(n)] for f in flat]
    sent = [0] * n
    for step in range(n - 1):  # reduce-scatter: device i passes chunk (i - step) to i + 1
        moves = [(i, (i - step) % n) for i in range(n)]
        arriving = [chunks[i][c].to(tensors[(i + 1) % n].device) for i, c in moves]
        for (i, c), piece in zip(moves, arriving):
            j = (i + 1) % n
            chunks[j][c] = chunks[j][c] + piece
            sent[i] += _nbytes(piece)
    for step in range(n - 1):  # all-gather: device i passes finished chunk (i + 1 - step)
        moves = [(i, (i + 1 - step) % n) for i in range(n)]
        arriving = [chunks[i][c].to(tensors[(i + 1) % n].device) for i, c in moves]
        for (i, c), piece in zip(moves, arriving):
            chunks[(i + 1) % n][c] = piece
            sent[i] += _nbytes(piece)
    out = [SH.reshape(SH.concatenate(chunks[i], axis=0), shape) for i in range(n)]
    return out, CommStats("ring", sum(sent), max(sent), 2 * (n - 1))


def data_parallel_grads(loss: Callable[..., Tensor], params: Sequence[Tensor], x: Any, y: Any,
                        devices: Sequence[str], algorithm: str = "ring") -> list[list[Tensor]]:
    """The gradient of a batch-mean ``loss(params, x, y)`` computed data-parallel.

    Returns, per device, the gradients of all params (equal on every device). Each
    device's loss is the mean over its slice, so it is weighted by the slice's share of
    the batch before the allreduce adds the slices up.
    """
    from ..autodiff.api import grad

    xs, ys = scatter(x, devices), scatter(y, devices)
    replicas = replicate(params, devices)
    total = sum(xk.shape[0] for xk in xs)
    local = []
    for xk, yk, pk in zip(xs, ys, replicas):
        g = grad(lambda *ps: loss(list(ps), xk, yk) * (xk.shape[0] / total),
                 argnums=tuple(range(len(pk))))(*pk)
        local.append(list(g))
    summed = [allreduce([local[k][j] for k in range(len(devices))], algorithm)
              for j in range(len(params))]
    return [[summed[j][k] for j in range(len(params))] for k in range(len(devices))]


def device_names(devices: Sequence[Any]) -> list[str]:
    return [get_device(d).name for d in devices]


# -- across MPI ranks ------------------------------------------------------------------------
# The same idea with processes instead of devices: every rank holds a full copy of the
# parameters (the same seed gives the same ones), takes its share of the batch, and
# ``mg.distributed.all_reduce`` (MPI's Allreduce, a ring or a tree inside MPI) adds the
# gradients up. Run these under ``mpiexec -n 2``; alone they are a world of one.

def shard(x: Any, rank: int | None = None, world: int | None = None) -> Tensor:
    """This rank's share of ``x`` along dimension 0 (contiguous rows, as ``scatter``)."""
    from .. import distributed

    x = x if isinstance(x, Tensor) else tensor(x)
    rank = distributed.rank() if rank is None else rank
    world = distributed.world_size() if world is None else world
    n = x.shape[0]
    return x[n * rank // world:n * (rank + 1) // world]


def allreduce_across_ranks(tensors: Sequence[Tensor], op: str = "sum") -> list[Tensor]:
    """Every rank gets, for each tensor, the sum (or mean) over all ranks."""
    from .. import distributed

    return [distributed.all_reduce(t, op) for t in tensors]


def data_parallel_grads_across_ranks(loss: Callable[..., Tensor], params: Sequence[Tensor],
                                     x: Any, y: Any) -> list[Tensor]:
    """The gradient of a batch-mean ``loss(params, x, y)``, each rank computing its share.

    Every rank passes the whole batch ``x, y`` (or the same seed to make it) and the same
    ``params``; each computes the gradient of the mean loss over its rows, weighted by
    its rows' share of the batch, and the all-reduce adds the shares up: every rank gets
    the whole batch's gradient, the value one process would compute.
    """
    from ..autodiff.api import grad

    xs, ys = shard(x), shard(y)
    total = x.shape[0]
    local = grad(lambda *ps: loss(list(ps), xs, ys) * (xs.shape[0] / total),
                 argnums=tuple(range(len(params))))(*params)
    return allreduce_across_ranks(list(local))
