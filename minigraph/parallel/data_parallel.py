"""Data parallelism: split the batch, copy the model, add up the gradients [d2l 12.5].

Every device holds a full copy (``replicate``) of the parameters and a slice
(``scatter``) of the batch; it computes the gradient of its slice's loss on its own;
then ``allreduce`` gives every device the sum of all devices' gradients, so every copy
takes the same step and the copies stay equal. The sum over slices is the gradient of
the whole batch, so the step equals the single-device step.

``allreduce`` moves tensors between devices with ``Tensor.to``: every copy is a real
one, and ``allreduce_with_stats`` counts the bytes of each copy as it is made, per
(source device, destination device), in ``CommStats.moved``. The same functions build a
graph when given graph nodes; ``mg.Session(g).run`` then counts the copies of its
Send/Recv pairs in ``sess.last_run.bytes_moved``. What each algorithm should send is
``cost_model.bytes_sent``; the tests hold the counters to it.

* ``"naive"``: gather every tensor on the first device, add, and send the sum back;
  the first device sends (n - 1) S bytes and receives as many (S: one tensor's bytes).
* ``"ring"``: cut each tensor into n chunks; in n - 1 steps of *reduce-scatter* each
  device passes one chunk to its right neighbour, which adds it to its own, until every
  device holds one chunk of the total; in n - 1 steps of *all-gather* the finished
  chunks go round the ring. Each device sends 2 (n - 1) / n S bytes: less than 2 S
  however many devices there are, and spread evenly over all the links.
* ``"parameter_server"``: device k serves chunk k (a parameter server sharded over the
  devices, PipeDream's setting): every device pushes each other chunk to its server,
  which adds them up and sends the sum to every device. The same 2 (n - 1) / n S per
  device as the ring, in 2 steps, every device talking to every other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np  # host numbers: the losses of two shares, alone and together

from ..device import get_device, nbytes
from ..errors import DTypeError, ShapeError
from ..graph.graph import Node
from ..ops import shape as SH
from ..ops import shape_rules as S
from ..ops.copy import astype
from ..tensor import Tensor, host_values, tensor, zeros


@dataclass
class CommStats:
    """What an allreduce moved: the bytes sent in all, the bytes *sent* by the device that
    sends most, the number of communication steps, and ``moved``, the bytes of every
    copy counted per (source device, destination device) link, as
    ``sess.last_run.bytes_moved`` counts a graph's. ``bytes_total`` and
    ``bytes_max_device`` are sums of ``moved``. (For graph nodes ``moved`` holds what
    each copy will move when the graph runs; the run's counters are the measurement.)"""

    algorithm: str
    bytes_total: int
    bytes_max_device: int
    steps: int
    moved: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)

    @property
    def bytes_sent(self) -> dict[str, int]:
        """Bytes sent per source device."""
        return _sent(self.moved)


def _links() -> dict[tuple[str, str], int]:
    return {}  # (source device, destination device) -> bytes


def _sent(moved: dict[tuple[str, str], int]) -> dict[str, int]:
    sent: dict[str, int] = {}
    for (src, _), n in moved.items():
        sent[src] = sent.get(src, 0) + n
    return sent


def _stats(algorithm: str, steps: int, moved: dict[tuple[str, str], int]) -> CommStats:
    return CommStats(algorithm, sum(moved.values()), max(_sent(moved).values(), default=0),
                     steps, moved)


def _send(t: Any, device: Any, moved: dict[tuple[str, str], int]) -> Any:
    """``t.to(device)``, counting the copy's bytes on its link when the devices differ
    (an eager tensor: the bytes of the array that arrived; a graph node: the bytes its
    Send will copy)."""
    src, dst = t.device.name, get_device(device).name
    out = t.to(device)
    if src != dst:
        moved[(src, dst)] = moved.get((src, dst), 0) + nbytes(
            out.data if isinstance(out, Tensor) else out)
    return out


def scatter(x: Any, devices: Sequence[str]) -> list[Tensor]:
    """Split ``x`` along dimension 0 into ``len(devices)`` parts, one per device (a
    graph node too: its parts are slices of it, sent with ``.to``)."""
    devices = _check_devices(devices, "scatter")
    if not devices:
        raise ValueError("scatter: no devices to split x over")
    x = x if isinstance(x, (Tensor, Node)) else tensor(x)
    if x.shape is None:
        raise ShapeError("scatter: x is a graph node of a shape unknown until the graph "
                         "runs; the parts' bounds need its length: give the placeholder "
                         "a shape")
    if len(x.shape) == 0:  # (x.shape[0] raised Python's IndexError)
        raise ShapeError(f"scatter: x is a 0-d tensor (a scalar); it is split along "
                         f"dimension 0, so it needs at least one dimension")
    n = x.shape[0]
    bounds = [n * k // len(devices) for k in range(len(devices) + 1)]
    return [x[bounds[k]:bounds[k + 1]].to(d) for k, d in enumerate(devices)]


def replicate(params: Sequence[Tensor], devices: Sequence[str]) -> list[list[Tensor]]:
    """One copy of ``params`` per device: ``replicas[k][j]`` is param j on device k
    (arrays and graph nodes too)."""
    devices = _check_devices(devices, "replicate")
    params = [p if isinstance(p, (Tensor, Node)) else tensor(p) for p in params]
    return [[p.to(d) for p in params] for d in devices]


def _check_devices(devices: Any, who: str) -> list:
    """``devices`` as a list of device names, from any iterable of them (a tuple, a NumPy
    array, a generator), but not one name: a string is a sequence too, and "cpu" was
    split over the devices 'c', 'p' and 'u'. (``not devices`` of a NumPy array raised
    NumPy's "truth value of an array is ambiguous".)"""
    if isinstance(devices, str):
        raise TypeError(f"{who}: devices is a list of device names, got the string "
                        f"{devices!r}; write [{devices!r}]")
    try:
        return list(devices)
    except TypeError:
        raise TypeError(f"{who}: devices is a list of device names, got "
                        f"{type(devices).__name__} {devices!r:.60}") from None


def gather(xs: Sequence[Tensor], device: str) -> Tensor:
    """Concatenate parts (along dimension 0) on ``device`` (arrays and graph nodes too).
    The parts are checked where they are, before the copies: concatenate's error named
    itself, and said every part was on ``device``."""
    # (one tensor's rows were taken for the parts and joined: (3, 2) came back as (6,))
    if isinstance(xs, (Tensor, Node, np.ndarray)):
        raise TypeError(f"gather: xs is a list of parts, one per device, got one tensor "
                        f"of shape {xs.shape}; write [x]")
    parts = [x if isinstance(x, (Tensor, Node)) else tensor(x) for x in xs]
    if not parts:
        raise ValueError("gather: no parts to concatenate; give one per device")
    known = [p.shape for p in parts if p.shape is not None]  # (a node's may be unknown)
    if any(len(s) == 0 for s in known) or len({tuple(s[1:]) for s in known}) > 1:
        listing = ", ".join(f"{'unknown' if p.shape is None else tuple(p.shape)} on "
                            f"{p.device.name}" for p in parts)
        raise ShapeError(f"gather: the parts are joined along dimension 0, so each needs "
                         f"one, and the same shape after it; got {listing}")
    return SH.concatenate([p.to(device) for p in parts], axis=0)


def allreduce(tensors: Sequence[Tensor], algorithm: str = "ring") -> list[Tensor]:
    """Every device gets the sum of ``tensors`` (one per device), on its own device."""
    return allreduce_with_stats(tensors, algorithm)[0]


def allreduce_with_stats(tensors: Sequence[Tensor],
                         algorithm: str = "ring") -> tuple[list[Tensor], CommStats]:
    """``allreduce``, and what it moved between devices."""
    tensors = list(tensors)
    for k, t in enumerate(tensors):  # (a number had no .shape: Python's AttributeError)
        if not isinstance(t, (Tensor, Node)):
            raise TypeError(f"allreduce: tensors[{k}] is a {type(t).__name__}, not a Tensor "
                            f"(or a graph node); "
                            f"give one tensor per device (x.to(device), or "
                            f"mg.parallel.scatter / replicate)")
    if not tensors:
        raise ValueError("allreduce: no tensors to add up; give one tensor per device")
    for k, t in enumerate(tensors):  # (an unknown shape gave the copies no size to count)
        if t.shape is None:
            raise ShapeError(f"allreduce: tensors[{k}] is a graph node of a shape unknown "
                             f"until the graph runs; the algorithms cut tensors into "
                             f"chunks by size: give the placeholder a shape")
    shapes = {t.shape for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"allreduce: every device must give the same shape, got {sorted(shapes)}")
    dtypes = {str(t.dtype) for t in tensors}
    if len(dtypes) != 1:  # (the sum would take the widest, and change the others' dtype)
        raise DTypeError(f"allreduce: every device must give the same dtype, as "
                         f"torch.distributed's all_reduce asks, got {sorted(dtypes)}")
    algorithms = {"naive": _naive, "ring": _ring, "parameter_server": _parameter_server}
    if algorithm not in algorithms:
        raise ValueError(f"allreduce: algorithm is 'ring', 'naive' or 'parameter_server', "
                         f"got {algorithm!r}")
    out, stats = algorithms[algorithm](tensors)
    # Each result is a tensor of its own, as MPI's Allreduce writes a buffer of its own:
    # not an input (one device: nothing to add), nor another device's result (two
    # devices of one name, where a send is no copy).
    for k, t in enumerate(out):
        if any(t is u for u in tensors) or any(t is u for u in out[:k]):
            out[k] = astype(t, str(t.dtype))
    return out, stats


def _naive(tensors: list[Tensor]) -> tuple[list[Tensor], CommStats]:
    root, moved = tensors[0].device, _links()
    total = tensors[0]
    for t in tensors[1:]:  # every other device sends its tensor once
        total = total + _send(t, root, moved)
    out = [total] + [_send(total, t.device, moved) for t in tensors[1:]]  # the sum, n - 1 times
    return out, _stats("naive", 2 if len(tensors) > 1 else 0, moved)


def _ring(tensors: list[Tensor]) -> tuple[list[Tensor], CommStats]:
    n, shape = len(tensors), tensors[0].shape
    if n == 1:
        return [tensors[0]], CommStats("ring", 0, 0, 0)
    chunks, moved = _chunks(tensors), _links()
    for step in range(n - 1):  # reduce-scatter: device i passes chunk (i - step) to i + 1
        moves = [(i, (i - step) % n) for i in range(n)]
        arriving = [_send(chunks[i][c], tensors[(i + 1) % n].device, moved) for i, c in moves]
        for (i, c), piece in zip(moves, arriving):
            j = (i + 1) % n
            chunks[j][c] = chunks[j][c] + piece
    for step in range(n - 1):  # all-gather: device i passes finished chunk (i + 1 - step)
        moves = [(i, (i + 1 - step) % n) for i in range(n)]
        arriving = [_send(chunks[i][c], tensors[(i + 1) % n].device, moved) for i, c in moves]
        for (i, c), piece in zip(moves, arriving):
            chunks[(i + 1) % n][c] = piece
    out = [SH.reshape(SH.concatenate(chunks[i], axis=0), shape) for i in range(n)]
    return out, _stats("ring", 2 * (n - 1), moved)


def _chunks(tensors: list[Tensor]) -> list[list[Tensor]]:
    """``chunks[i][c]``: device i's chunk c of its flattened tensor (``cost_model.chunks``
    gives their sizes)."""
    n = len(tensors)
    flat = [SH.reshape(t, (-1,)) for t in tensors]
    size = flat[0].shape[0]
    cuts = [size * k // n for k in range(n + 1)]
    return [[f[cuts[c]:cuts[c + 1]] for c in range(n)] for f in flat]


def _parameter_server(tensors: list[Tensor]) -> tuple[list[Tensor], CommStats]:
    n, shape = len(tensors), tensors[0].shape
    if n == 1:
        return [tensors[0]], CommStats("parameter_server", 0, 0, 0)
    chunks, moved = _chunks(tensors), _links()
    sums = []
    for c in range(n):  # push: every device sends chunk c to its server, device c
        server = tensors[c].device
        total = chunks[c][c]
        for i in range(n):
            if i != c:
                total = total + _send(chunks[i][c], server, moved)
        sums.append(total)
    # pull: server c sends the sum of chunk c to every other device
    out = [SH.reshape(SH.concatenate([sums[c] if c == i else _send(sums[c], t.device, moved)
                                      for c in range(n)], axis=0), shape)
           for i, t in enumerate(tensors)]
    return out, _stats("parameter_server", 2, moved)


def data_parallel_grads(loss: Callable[..., Tensor], params: Sequence[Tensor], x: Any, y: Any,
                        devices: Sequence[str], algorithm: str = "ring") -> list[list[Tensor]]:
    """The gradient of a batch-mean ``loss(params, x, y)`` computed data-parallel.

    Returns, per device, the gradients of all params (equal on every device). Each
    device's loss is the mean over its slice, so it is weighted by the slice's share of
    the batch before the allreduce adds the slices up. A loss that sums over the batch
    (``nn.CrossEntropyLoss(reduction="sum")`` inside) has its slices' losses added as
    they are: ``loss.reduction = "sum"`` says so, else a test finds it, on each call
    (``_share_weight``), or refuses a loss it cannot tell.
    """
    who = "data_parallel_grads"
    devices = _check_devices(devices, who)  # (a generator: read once, used thrice)
    _same_rows(x, y, who)
    xs, ys = scatter(x, devices), scatter(y, devices)
    replicas = replicate(params, devices)
    total = _batch_size(xs[0].shape, sum(xk.shape[0] for xk in xs), who)
    weight = _share_weight(loss, zip(replicas, xs, ys), who)
    local = [_weighted_grads(loss, pk, xk, yk, start, total, weight, who)
             for xk, yk, pk, start in zip(xs, ys, replicas, _starts(xs))]
    summed = [allreduce([local[k][j] for k in range(len(devices))], algorithm)
              for j in range(len(params))]
    return [[summed[j][k] for j in range(len(params))] for k in range(len(devices))]


def device_names(devices: Sequence[Any]) -> list[str]:
    devices = _check_devices(devices, "device_names")
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
    # (a rank outside the world silently got an empty share; world 0 divided by zero)
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"shard: world must be an int >= 1 (the number of ranks), "
                         f"got {world!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"shard: rank must be an int in 0..{world - 1} for a world of "
                         f"{world}, got {rank!r}")
    if x.ndim == 0:
        raise ShapeError("shard: x is a 0-d tensor (a scalar); it is split along "
                         "dimension 0, so it needs at least one dimension")
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
    the whole batch's gradient, the value one process would compute. (A loss that sums
    over the batch is added up unweighted, as in ``data_parallel_grads``.)
    """
    from .. import distributed

    who = "data_parallel_grads_across_ranks"
    _same_rows(x, y, who)
    # (x.shape below: a list has none, as data_parallel_grads accepts lists)
    x, y = (v if isinstance(v, Tensor) else tensor(v) for v in (x, y))
    total = _batch_size(tuple(x.shape), x.shape[0], who)
    # (the shares in rank order on every rank: every rank takes the same decision)
    world, rank = distributed.world_size(), distributed.rank()
    shares = [(params, shard(x, r, world), shard(y, r, world)) for r in range(world)]
    _, xs, ys = shares[rank]

    def share() -> tuple[list[Tensor], dict]:
        weight = _share_weight(loss, shares, who)  # (it runs the loss too: agreed on)
        # The gradients are values: where the parameters require a gradient
        # (model.parameters()), grad's results are on the tape, for a second derivative,
        # and all_reduce, which has no derivative, refuses a tensor on the tape.
        grads = _weighted_grads(loss, params, xs, ys, _starts([s[1] for s in shares])[rank],
                                total, weight, who)
        return [g.detach() for g in grads], {}

    # (agreed on before the all-reduce: a rank whose loss fails on its rows, a bad label,
    # raises its own error and every other rank hears of it, instead of waiting in the
    # all-reduce for a rank that will not come)
    return allreduce_across_ranks(distributed._agree(who, share))


def _same_rows(x: Any, y: Any, who: str) -> None:
    """x and y split along their first axis must be one batch: each share's y must be
    its x's labels (rows 2k, 2k + 1 of x with row k of y would broadcast in the loss, as
    no device alone would let them: one device's loss refuses the shapes)."""
    xs, ys = S.shape_of(x), S.shape_of(y)
    if not xs or not ys or xs[0] != ys[0]:
        raise ShapeError(f"{who}: x has shape {tuple(xs or ())} and y {tuple(ys or ())}; "
                         f"both need the batch along their first axis, with as many rows, "
                         f"to be split into shares")


def _batch_size(shape: tuple, total: int, who: str) -> int:
    if total == 0:  # (the mean of a loss over no rows is 0/0)
        raise ValueError(f"{who}: the batch is empty (x has shape {shape}); there is no "
                         f"mean loss to differentiate")
    return total


def _starts(xs: Sequence[Any]) -> list[int]:
    """The batch row at which each share of ``xs`` (contiguous rows, in order) starts."""
    return [sum(x.shape[0] for x in xs[:k]) for k in range(len(xs))]


# The rows an error names: "label 3 (row 0)", "label 3 (at (0, 1))" (the row comes first).
_ROW = re.compile(r"\((row |at \()(\d+)")  # ("label 3 (row 0)", "label 3 (at (0, 1))")


def _rows_in_batch(message: str, start: int) -> str:
    """``message`` with the rows it names counted in the batch: row r of a share (or a
    microbatch) whose first row is row ``start`` of the batch is row start + r."""
    return _ROW.sub(lambda m: f"({m[1]}{start + int(m[2])}", message)


def _loss(loss: Callable[..., Tensor], params: Sequence[Tensor], x: Any, y: Any,
          start: int, who: str) -> Any:
    """``loss(params, x, y)`` on the share of rows ``start``.. of the batch, in the user's
    terms: a scalar tensor, or an error naming ``who``, the loss and the share's rows,
    with the rows its message names counted in the batch (a bad label at row 5 was said
    to be at row 1, of the share on cpu:1; a vector was refused by grad, as "f")."""
    name = getattr(loss, "__name__", type(loss).__name__)
    try:
        value = loss(list(params), x, y)
    except Exception as exc:
        message = (f"{who}: the loss {name} failed on the share of rows {start}.."
                   f"{start + x.shape[0] - 1} of the batch (on {x.device.name}), rows "
                   f"counted in the batch: {_rows_in_batch(str(exc), start)}")
        try:
            told = type(exc)(message)
        except Exception:  # (an exception whose __init__ takes other arguments, the
            told = None      # user's own: passed on as it is)
        if told is None:
            raise
        raise told from exc
    if not hasattr(value, "shape"):  # (a tensor, a graph node, or grad's box of one)
        raise TypeError(f"{who}: the loss {name} must return a scalar tensor, the mean (or "
                        f"the sum) of its rows' losses; it returned {value!r:.60}")
    if value.shape is not None and tuple(value.shape) not in ((), (1,)):
        raise ValueError(f"{who}: the loss {name} must return a scalar, it returned shape "
                         f"{tuple(value.shape)}; reduce it (a mean or a sum over the rows)")
    return value


def _share_weight(loss: Any, shares: Iterable[tuple[Sequence[Tensor], Tensor, Tensor]],
                  who: str) -> bool:
    """Whether each share's loss is weighted by its share of the batch: yes for a mean,
    no for a sum (``nn.CrossEntropyLoss(reduction="sum")`` inside), whose shares add up
    as they are. Weighting a sum by n / total divided its gradient by the number of
    devices, without a word. ``loss.reduction`` says which, if set; else the loss is
    evaluated on two shares' rows (``shares``: (params, x, y), in order), each alone and
    both together: a mean of the two is the mean of their rows, a sum their sum. A loss
    that is neither (a max, the square of a mean, a penalty on the weights that every
    share would add once) is refused: the shares' gradients add up to the batch's for a
    mean or a sum only. Every pair of neighbouring shares is read (a weighted mean whose
    first two shares weigh the same reads as a mean there), and they must agree; where
    the readings cannot tell (``_reading``: losses of 0), the pair counts for nothing,
    and if none tells, the loss is refused: a guess divided a sum's gradient by the
    number of devices. (A term of no row's, a penalty on the weights, whose value is too
    small to show beside the loss's, below sqrt(eps) of it, is not seen: a loss with
    one is not for this function, which adds a share's gradient per device.) The verdict is not remembered: it is one batch's
    reading, and another batch may read otherwise. One share that holds every row is
    weighted 1 either way."""
    from ..autodiff.tape import no_grad

    reduction = getattr(loss, "reduction", None)
    shares = list(shares)  # (each with its first row, counted before the empty are dropped)
    starts = _starts([share[1] for share in shares])
    located = [(start, *share) for start, share in zip(starts, shares) if share[1].shape[0]]
    if reduction is None and len(located) < 2:
        return True  # (n / total is 1: a mean's weight and a sum's)
    readings = []  # (alone, alone, together) of each pair that told nothing
    verdicts = set()  # (every pair is read: a weighted mean whose first two shares weigh
    pairs = zip(located, located[1:]) if reduction is None else ()  # the same read as one)
    for (start0, params, x0, y0), (start1, _, x1, y1) in pairs:
        x1, y1 = x1.to(x0.device), y1.to(y0.device)
        with no_grad():
            value = _loss(loss, params, x0, y0, start0, who)
            first = float(value.item())
            second = float(_loss(loss, params, x1, y1, start1, who).item())
            both = float(_loss(loss, params, SH.concatenate([x0, x1], axis=0),
                               SH.concatenate([y0, y1], axis=0), start0, who).item())
        verdict = _reading(first, second, both, x0.shape[0], x1.shape[0], _resolution(value))
        if verdict is None:
            readings.append((first, second, both))
        elif verdict not in ("mean", "sum"):
            reduction = verdict
            break
        else:
            verdicts.add(verdict)
    if reduction is None and len(verdicts) > 1:
        reduction = "neither: some pairs of shares read as a mean and others as a sum"
    elif reduction is None and verdicts:
        reduction = verdicts.pop()
    if reduction is None:
        raise ValueError(f"{who}: cannot tell whether the loss is a mean or a sum over the "
                         f"batch: on pairs of shares, alone and together, it was "
                         f"{readings}, where a mean and a sum read the same; set "
                         f"loss.reduction = 'mean' or 'sum'")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"{who}: the loss's reduction is {reduction!s}; the shares' "
                         f"gradients add up to the batch's only for a mean (weighted by the "
                         f"shares' sizes) or a sum (added as they are) over rows; set "
                         f"loss.reduction = 'mean' or 'sum' if it is one")
    return reduction != "sum"


def _reading(first: float, second: float, both: float, n0: int, n1: int,
             eps: float) -> str | None:
    """What a loss of ``first`` on n0 rows, ``second`` on n1 others and ``both`` on the
    n0 + n1 together is: "mean" (both is their mean weighted by rows), "sum" (their sum),
    "neither ...", or None where it cannot tell: a loss that is not finite, or 0 (so,
    within its dtype's resolution ``eps``), or readings that fit both. The comparisons
    are relative, to sqrt(eps) of the values: the rows are added in another order."""
    values = (first, second, both)
    largest = max(abs(v) for v in values)
    if not all(np.isfinite(v) for v in values) or largest <= eps:
        return None
    tolerance = np.sqrt(eps) * largest
    mean = (n0 * first + n1 * second) / (n0 + n1)
    is_mean, is_sum = abs(both - mean) <= tolerance, abs(both - (first + second)) <= tolerance
    if is_mean != is_sum:
        return "mean" if is_mean else "sum"
    if is_mean:
        return None
    return (f"neither: two shares' rows read {first} and {second} alone and {both} "
            f"together, not their mean ({mean}) nor their sum ({first + second})")


def _resolution(value: Tensor) -> float:
    """The machine epsilon of ``value``'s dtype (float64's for an integer loss)."""
    dtype = np.asarray(host_values(value)).dtype
    return float(np.finfo(dtype if dtype.kind == "f" else np.float64).eps)


def _weighted_grads(loss: Callable[..., Tensor], params: Sequence[Tensor], x: Tensor,
                    y: Tensor, start: int, total: int, weighted: bool,
                    who: str) -> list[Tensor]:
    """The gradients of this share's mean loss times its share of the batch, ``n / total``
    (of its loss as it is, for a sum: ``weighted`` False); the share's first row is row
    ``start`` of the batch. A share with no rows (a batch smaller than the number of
    devices or ranks) adds nothing: zeros, without evaluating a mean over no rows, which
    is 0/0."""
    from ..autodiff.api import grad

    n = x.shape[0]
    if n == 0:
        return [zeros(p.shape, p.dtype, p.device) for p in params]
    scale = n / total if weighted else 1.0
    return list(grad(lambda *ps: _loss(loss, ps, x, y, start, who) * scale,
                     argnums=tuple(range(len(params))))(*params))
