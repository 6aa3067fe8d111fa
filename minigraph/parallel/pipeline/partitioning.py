"""Phase 2, partition: contiguous stages that minimise the slowest one (dynamic programming).

See the package docstring (``minigraph/parallel/pipeline/__init__.py``) for the whole picture.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Real
from typing import Any, Callable, Sequence

import numpy as np  # a cost may be a NumPy number, or a 0-d array

from ..cost_model import sync_factor
from .common import PipelineError, is_count
from .profiling import LayerCost, Profile


def as_cost(value: Any, where: str) -> float:
    """``value`` as a cost (a time): a number, finite and >= 0 (NumPy's, a 0-d array or
    torch tensor, a Decimal: what float() reads as one number); else an error naming
    ``where``, the function and the argument. (float() took "2" for 2, and of "ab" or
    None said only that it could not convert it, naming neither.) A str, a bool or an
    array of several numbers is no cost."""
    number = math.nan
    shape, dtype = getattr(value, "shape", ()), str(getattr(value, "dtype", ""))
    if not isinstance(value, (str, bytes, bool, np.bool_)) and tuple(shape) == () and \
            "bool" not in dtype:  # (a 0-d bool array or torch tensor, a one-element array)
        try:
            number = float(value)
        except (TypeError, ValueError):
            pass
    if not (number >= 0 and math.isfinite(number)):
        raise PipelineError(f"{where} is {value!r:.60}; a cost is a number, finite and >= 0")
    return number


def _compute_costs(costs: Any, who: str) -> list[float]:
    """Per-layer costs from a Profile, LayerCosts (forward + backward) or plain numbers."""
    if isinstance(costs, (str, bytes)) or not isinstance(costs, (Profile, Iterable)):
        raise PipelineError(f"{who}: costs is a Profile, LayerCosts or one number per "
                            f"layer, got {costs!r:.60}")  # (a string's letters were layers)
    items = costs.layers if isinstance(costs, Profile) else list(costs)
    return [as_cost(c.compute_time if isinstance(c, LayerCost) else c,
                    f"{who}: the cost of layer {i}") for i, c in enumerate(items)]


def _prefix(values: Sequence[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def partition(costs: Any, stages: int) -> list[list[int]]:
    """Cut the layers into ``stages`` contiguous, non-empty stages whose slowest stage is
    as fast as possible; returns the stages as lists of layer indices.

    ``costs``: a :class:`Profile` (forward + backward time per layer), LayerCosts, or one
    number per layer. best[j][q] is the slowest stage of the best cut of the first j
    layers into q stages:

        best[j][q] = min over i < j of  max(best[i][q - 1], cost of layers i .. j-1)

    O(n^2 p) for n layers: each entry tries every start i of its last stage.
    """
    t = _compute_costs(costs, "partition")
    n = len(t)
    if not is_count(stages) or stages > n:
        raise PipelineError(f"partition: stages must be an int between 1 and the number of "
                            f"layers ({n}), got {stages!r}")
    stages = int(stages)
    pre = _prefix(t)
    best = [[math.inf] * (stages + 1) for _ in range(n + 1)]
    start = [[0] * (stages + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for q in range(1, stages + 1):
        for j in range(q, n + 1):
            for i in range(q - 1, j):
                slowest = max(best[i][q - 1], pre[j] - pre[i])
                if slowest < best[j][q]:
                    best[j][q], start[j][q] = slowest, i
    bounds = [n]
    for q in range(stages, 0, -1):  # walk the choices back from (n, stages)
        bounds.append(start[bounds[-1]][q])
    bounds.reverse()
    return [list(range(bounds[q], bounds[q + 1])) for q in range(stages)]


def stage_times(costs: Any, stages: Sequence[Sequence[int]]) -> list[float]:
    """The cost of each stage: the sum of its layers' costs."""
    t = _compute_costs(costs, "stage_times")
    for stage in stages:  # (t[i] raised Python's IndexError, and -1 read the last layer)
        for i in stage:
            if not is_count(i, 0) or i >= len(t):
                raise PipelineError(f"stage_times: layer {i!r} of stage {list(stage)} is "
                                    f"not one of the {len(t)} layers 0..{len(t) - 1}")
    return [sum(t[i] for i in stage) for stage in stages]


# Bytes a worker of a stage replicated m times *sends* per minibatch to synchronise w bytes
# of weights, over w: chapter 07's cost model (``minigraph/parallel/cost_model.py``), the one
# both chapters use and the run's counters check. A ring allreduce and a parameter server
# sharded over the m workers both send 2 (m - 1) w / m per worker. (The PipeDream text's
# (m - 1) w / m for all_reduce and 4 (m - 1) w / m for a parameter server are kept, flagged,
# in ``cost_model.PIPEDREAM_TEXT``: the first is one phase of the ring, the second adds the
# bytes received.)
SYNC_FACTORS: dict[str, Callable[[int], float]] = {
    "allreduce": lambda m: sync_factor("ring", m),
    "parameter_server": lambda m: sync_factor("parameter_server", m),
}


@dataclass
class PipeDreamPlan:
    """The result of :func:`partition_pipedream`."""

    stages: list[list[int]]      # layer indices per stage
    replicas: list[int]          # workers per stage (data parallelism inside the stage)
    slowest: float               # seconds per minibatch of the slowest pipeline element
    stage_times: list[float]     # per stage: T(stage, replicas)
    comm_times: list[float]      # per cut: 2 a / bandwidth (activations out, gradients back)

    @property
    def workers(self) -> int:
        return sum(self.replicas)


def partition_pipedream(profile: Any, workers: int, bandwidth: float,
                        sync: str = "allreduce") -> PipeDreamPlan:
    """PipeDream's partitioner: contiguous stages, each replicated over some workers,
    using at most ``workers`` workers, minimising the slowest element of the pipeline.

    A stage of layers i..j-1 on m workers takes (PipeDream's T(i -> j, m))

        T = max(sum of compute times, sum of weight-sync times) / m

    (m replicas share the minibatches round-robin; the weight sync of the stage's w bytes
    is ``SYNC_FACTORS[sync](m) * w / bandwidth``: the bytes each worker sends, 2 (m - 1) w / m
    for ``"allreduce"`` (a ring) and for ``"parameter_server"`` (sharded over the m workers),
    over a full-duplex link of ``bandwidth`` bytes/s each way). A cut before layer i costs
    C = 2 a_{i-1} / bandwidth: the activation goes forward and its gradient comes back;
    communication overlaps computation, so it is a pipeline element of its own:

        A[j][m] = min( T(0 -> j, m),
                       min over i < j, m' < m of  max(A[i][m - m'], C_i, T(i -> j, m')) )

    The answer is the best A[n][m] for m <= workers (more workers are not always better:
    synchronisation grows with m).
    """
    layers = list(profile) if isinstance(profile, Iterable) else []  # (None: not iterable)
    if not layers or not all(isinstance(c, LayerCost) for c in layers):
        raise PipelineError("partition_pipedream: needs a Profile (or LayerCosts): it uses "
                            "activation and parameter sizes as well as times")
    if not is_count(workers):
        raise PipelineError(f"partition_pipedream: workers must be an int >= 1, got {workers!r}")
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, Real) or not bandwidth > 0:
        raise PipelineError(f"partition_pipedream: bandwidth must be > 0 bytes/s, got "
                            f"{bandwidth!r}")
    if sync not in SYNC_FACTORS:
        raise PipelineError(f"partition_pipedream: sync is one of {list(SYNC_FACTORS)}, "
                            f"got {sync!r}")
    workers = int(workers)
    cost = _StageCost(layers, bandwidth, SYNC_FACTORS[sync])
    table = _pipedream_table(cost, len(layers), workers)
    m = min(range(1, workers + 1), key=lambda w: table[len(layers)][w][0])
    return _pipedream_plan(cost, table, len(layers), m)


class _StageCost:
    """T(i -> j, m) and C_i from prefix sums of the profile."""

    def __init__(self, layers: list[LayerCost], bandwidth: float, factor: Callable):
        self.compute = _prefix(_compute_costs(layers, "partition_pipedream"))
        self.weights = _prefix([c.parameter_bytes for c in layers])
        self.activations = [c.activation_bytes for c in layers]
        self.bandwidth, self.factor = bandwidth, factor

    def stage(self, i: int, j: int, m: int) -> float:
        sync = self.factor(m) * (self.weights[j] - self.weights[i]) / self.bandwidth
        return max(self.compute[j] - self.compute[i], sync) / m

    def cut(self, i: int) -> float:
        return 2 * self.activations[i - 1] / self.bandwidth


def _pipedream_table(cost: _StageCost, n: int, workers: int) -> list[list[tuple]]:
    """table[j][m] = (A[j][m], choice): choice None for one stage, else (i, m')."""
    table: list[list[tuple[float, tuple[int, int] | None]]] = [
        [(math.inf, None)] * (workers + 1) for _ in range(n + 1)]
    for j in range(1, n + 1):
        for m in range(1, workers + 1):
            best: tuple[float, tuple[int, int] | None] = (cost.stage(0, j, m), None)
            for i in range(1, j):
                for m2 in range(1, m):
                    v = max(table[i][m - m2][0], cost.cut(i), cost.stage(i, j, m2))
                    if v < best[0]:
                        best = (v, (i, m2))
            table[j][m] = best
    return table


def _pipedream_plan(cost: _StageCost, table: list, n: int, m: int) -> PipeDreamPlan:
    stages, replicas, j, slowest = [], [], n, table[n][m][0]
    while True:  # follow the choices back, last stage first
        choice = table[j][m][1]
        i, m2 = (0, m) if choice is None else choice
        stages.append(list(range(i, j)))
        replicas.append(m2)
        if choice is None:
            break
        j, m = i, m - m2
    stages.reverse()
    replicas.reverse()
    times = [cost.stage(s[0], s[-1] + 1, r) for s, r in zip(stages, replicas)]
    comms = [cost.cut(s[0]) for s in stages[1:]]
    return PipeDreamPlan(stages, replicas, slowest, times, comms)
