"""Several processes on MPI: ``mg.distributed`` [3.1.4, beyond one process].

Run a script under ``mpiexec -n 2 python script.py``: MPI starts two copies of it, the
*ranks* 0 and 1, in one *world*. Each rank is an ordinary minigraph process with its own
devices; what crosses between ranks goes through MPI, the library HPC programs use to
exchange messages (SINGA and Horovod use it too). minigraph writes no transport of its
own: mpi4py gives Python access to MPI, and the ``[mpi]`` extra installs it with the
MPICH wheels (``pip install 'minigraph[mpi]'`` brings a working ``mpiexec``).

* ``init()`` joins the world (``MPI.COMM_WORLD``; a world of one when started without
  ``mpiexec``); the other functions call it, so calling it is optional. It is
  idempotent, and importing minigraph never starts MPI: mpi4py is imported here, on
  first use.
* ``rank()``, ``world_size()``, ``barrier()``;
* ``all_reduce(t, op="sum" | "mean")``: a new tensor, on ``t``'s device, holding the sum
  (or mean) of every rank's ``t``; ``broadcast(t, root=0)``: a new tensor on ``t``'s
  device holding ``root``'s ``t``. Both are *collectives*: every rank must call them,
  in the same order. Before moving the data they compare every rank's shape and dtype,
  and all ranks raise together if they differ, instead of MPI reading garbage.
* ``set_timeout(seconds)``: how long a graph run waits for news from another rank before
  it gives up (see ``runtime/mpi_run.py``).

Graphs that span ranks (``with mg.device("rank:1/cpu"):``) are run by ``mg.Session``,
which sends their cross-rank tensors with MPI point-to-point messages
(``runtime/mpi_run.py``).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import numpy as np

from .errors import MinigraphError

_comm: Any = None    # MPI.COMM_WORLD once init() has run
_MPI: Any = None     # the mpi4py.MPI module
_timeout: float | None = None  # set_timeout's; else MINIGRAPH_MPI_TIMEOUT's, else 30

# Variables that MPI launchers set in the processes they start (MPICH's hydra, Open MPI,
# PMIx): under one of them, a device name with a rank prefix needs MPI to know our rank.
_LAUNCHER_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


class DistributedError(MinigraphError, RuntimeError):
    """MPI is missing, or ranks disagree (shapes of a collective, graphs of a run)."""


def _mpi() -> Any:
    """The ``mpi4py.MPI`` module, imported on first use (importing it starts MPI)."""
    global _MPI
    if _MPI is None:
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise DistributedError(
                f"mg.distributed needs mpi4py and an MPI library, which are missing here "
                f"({exc}): install them with `pip install 'minigraph[mpi]'` (mpi4py and the "
                f"MPICH wheels, which bring mpiexec), then run `mpiexec -n 2 python "
                f"script.py`") from None
        _MPI = MPI
    return _MPI


def init() -> None:
    """Join the MPI world (idempotent). Alone, without ``mpiexec``, it is a world of one."""
    global _comm
    if _comm is None:
        _comm = _mpi().COMM_WORLD
        if _comm.Get_size() > 1:
            _abort_on_uncaught_errors()


def _abort_on_uncaught_errors() -> None:
    """An exception that ends one rank's program must end the others too: they could be
    waiting in a collective for it forever. So, as ``python -m mpi4py`` does, an uncaught
    exception prints its traceback and then aborts the whole MPI job."""
    import sys

    previous = sys.excepthook

    def hook(kind: Any, value: Any, traceback: Any) -> None:
        previous(kind, value, traceback)
        sys.stderr.flush()
        _comm.Abort(1)

    sys.excepthook = hook


def comm() -> Any:
    """The communicator every rank shares (``MPI.COMM_WORLD``), yours for messages of
    your own: graph runs talk on a duplicate of it, so theirs and yours never meet."""
    init()
    return _comm


def rank() -> int:
    """This process's rank: 0 ... world_size() - 1."""
    return comm().Get_rank()


def world_size() -> int:
    """How many processes the world has."""
    return comm().Get_size()


def barrier() -> None:
    """Wait until every rank has called ``barrier()``."""
    comm().Barrier()


def initialized() -> bool:
    return _comm is not None


def rank_for_names() -> int:
    """This process's rank, for deciding whether ``rank:R/cpu`` is local; 0 when no MPI
    launcher started the process (so a lone process never needs mpi4py for names)."""
    if _comm is None and not any(v in os.environ for v in _LAUNCHER_VARIABLES):
        return 0
    return rank()


def world_for_names() -> int:
    """The world's size, 1 when no MPI launcher started this process."""
    if _comm is None and not any(v in os.environ for v in _LAUNCHER_VARIABLES):
        return 1
    return world_size()


def set_timeout(seconds: float) -> None:
    """How long a graph run waits without news from another rank before it raises."""
    global _timeout
    _timeout = _seconds(seconds, "set_timeout: seconds")


def timeout() -> float:
    """set_timeout's seconds; else the environment's MINIGRAPH_MPI_TIMEOUT, else 30."""
    if _timeout is not None:
        return _timeout
    given = os.environ.get("MINIGRAPH_MPI_TIMEOUT")
    return 30.0 if given is None else _seconds(given, "the environment's MINIGRAPH_MPI_TIMEOUT")


def _seconds(value: Any, what: str) -> float:
    """``value`` as a number of seconds > 0 (NaN never times out; a str, from the
    environment, is read as a number)."""
    try:
        seconds = float(value) if isinstance(value, (str, int, float)) and \
            not isinstance(value, bool) else None
    except ValueError:
        seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{what} must be a number of seconds > 0, got {value!r}")
    return seconds


# -- collectives on tensors -----------------------------------------------------------------

_REDUCE_DTYPES = ("float64", "float32", "int64", "int32")


def _host(t: Any) -> tuple[Any, np.ndarray]:
    """The tensor and a contiguous host copy of its values."""
    from .autodiff.tape import is_grad_enabled
    from .tensor import Tensor, tensor

    t = t if isinstance(t, Tensor) else tensor(t)
    if t.requires_grad and is_grad_enabled():  # (its result was a new leaf: w.grad missed
        raise DistributedError(                 # the path through the collective)
            "the collectives of mg.distributed have no derivative: t requires a gradient, "
            "which would silently stop here; pass t.detach(), or call it under "
            "mg.no_grad()")
    return t, np.asarray(t.device.to_numpy(t.data), order="C")


def _agree(what: str, check: Callable[[], tuple[Any, dict]]) -> Any:
    """``check()``'s result, once every rank has checked its own arguments and all agree.

    ``check`` returns (what the collective needs, this rank's call as a dict: shape,
    dtype, options) or raises. Every rank exchanges its dict, or its error, before any
    data moves: a rank whose arguments are wrong raises its own error, and the others
    raise too, naming it (were it to raise alone, the others would wait in the
    collective, and pair their next call with this one); ranks that called with
    different shapes, dtypes or options (an op, a root) all raise, listing each call."""
    try:
        result, mine = check()
        problem = None
    except Exception as exc:  # noqa: BLE001 - every rank must hear of it
        result, mine, problem = None, None, exc
    everyone = comm().allgather((mine, None if problem is None else
                                 f"{type(problem).__name__}: {problem}"))
    if problem is not None:
        raise problem
    failed = [(r, p) for r, (_, p) in enumerate(everyone) if p is not None]
    if failed:
        raise DistributedError(f"{what}: " + "; ".join(f"rank {r} refused its arguments ({p})"
                                                       for r, p in failed))
    if any(m != everyone[0][0] for m, _ in everyone):
        listing = "; ".join(f"rank {r}: " + ", ".join(f"{k} {v}" for k, v in m.items())
                            for r, (m, _) in enumerate(everyone))
        raise DistributedError(f"{what}: every rank must give a tensor of the same shape and "
                               f"dtype, and the same options, got {listing}")
    return result


def all_reduce(t: Any, op: str = "sum") -> Any:
    """A new tensor on ``t``'s device with the sum (``op="sum"``) or mean (``"mean"``) of
    every rank's ``t``. A collective: every rank calls it. The mean of integers is a
    float64 tensor, as NumPy's is."""
    from .tensor import tensor

    def check() -> tuple[Any, dict]:
        if op not in ("sum", "mean"):
            raise ValueError(f"all_reduce: op is 'sum' or 'mean', got {op!r}")
        t_, array = _host(t)
        if str(array.dtype) not in _REDUCE_DTYPES:
            raise DistributedError(f"all_reduce: cannot add tensors of dtype {array.dtype}; "
                                   f"use one of {', '.join(_REDUCE_DTYPES)}")
        return (t_, array), {"shape": tuple(array.shape), "dtype": str(array.dtype), "op": op}

    t, array = _agree("all_reduce", check)
    out = np.empty_like(array)
    comm().Allreduce(array, out, op=_mpi().SUM)
    if op == "mean":
        out = out / world_size()
    return tensor(out, device=t.device)


def broadcast(t: Any, root: int = 0) -> Any:
    """A new tensor on ``t``'s device with rank ``root``'s ``t``. A collective: every rank
    calls it with a tensor of the same shape and dtype."""
    from .tensor import tensor

    size = world_size()

    def check() -> tuple[Any, dict]:
        # (a NumPy integer is a rank, as Session(workers=np.int64(2)) takes it; True is
        # an int to Python but no rank: it broadcast rank 1's tensor)
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) \
                or not 0 <= root < size:
            raise ValueError(f"broadcast: root must be a rank in 0..{size - 1}, got {root!r}")
        t_, array = _host(t)
        return (t_, array), {"shape": tuple(array.shape), "dtype": str(array.dtype),
                             "root": int(root)}

    t, array = _agree("broadcast", check)
    out = array.copy()  # the root's copy: the result is a new tensor on every rank
    comm().Bcast(out, root=int(root))
    return tensor(out, device=t.device)
