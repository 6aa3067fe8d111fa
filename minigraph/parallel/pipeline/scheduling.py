"""Phase 3, schedules: per stage, the order of forward and backward passes (GPipe, 1F1B).

See the package docstring (``minigraph/parallel/pipeline/__init__.py``) for the whole picture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from .common import Op, PipelineError, is_count


KINDS = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Schedule:
    """Per stage, the sequence of ("F", k) and ("B", k); ``s[stage]`` is one sequence.

    Every schedule ends with a flush: the optimizer steps after the last op of every
    stage (a synchronous update; the simulation's makespan is the time of the flush).
    """

    kind: str
    microbatches: int
    ops: tuple[tuple[Op, ...], ...]

    @property
    def stages(self) -> int:
        return len(self.ops)

    def __getitem__(self, stage: int) -> list[Op]:
        return list(self.ops[stage])

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[list[Op]]:
        return (list(o) for o in self.ops)

    def __str__(self) -> str:
        rows = [f"stage {s}: " + " ".join(f"{kind}{k}" for kind, k in ops)
                for s, ops in enumerate(self.ops)]
        return f"{self.kind}, {self.stages} stages, {self.microbatches} microbatches\n" + \
            "\n".join(rows)


def schedule(kind: str, stages: int, microbatches: int) -> Schedule:
    """The GPipe or 1F1B schedule for ``stages`` stages and ``microbatches`` microbatches."""
    if kind not in KINDS:
        raise PipelineError(f"schedule: kind is 'gpipe' or '1f1b', got {kind!r}")
    for what, v in (("stages", stages), ("microbatches", microbatches)):
        if not is_count(v):
            raise PipelineError(f"schedule: {what} must be an int >= 1, got {v!r}")
    stages, microbatches = int(stages), int(microbatches)
    make = _gpipe if kind == "gpipe" else _one_f_one_b
    return Schedule(kind, microbatches,
                    tuple(tuple(make(stages, s, microbatches)) for s in range(stages)))


def _gpipe(p: int, s: int, m: int) -> list[Op]:
    """All forwards, then all backwards (in microbatch order, as in PipeDream's figures;
    the GPipe paper draws them in reverse, which gives the same times)."""
    return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]


def _one_f_one_b(p: int, s: int, m: int) -> list[Op]:
    """p - 1 - s warm-up forwards, then one forward one backward, then the drain."""
    warmup = min(p - 1 - s, m)
    ops = [("F", k) for k in range(warmup)]
    for k in range(m - warmup):
        ops += [("F", warmup + k), ("B", k)]
    return ops + [("B", k) for k in range(m - warmup, m)]


def _as_schedule(sched: Any) -> Schedule:
    """A Schedule, or per-stage lists of ops (a hand-made schedule), checked."""
    if not isinstance(sched, Schedule):
        ops = tuple(tuple((str(kind), int(k)) for kind, k in stage) for stage in sched)
        m = 1 + max((k for stage in ops for _, k in stage), default=-1)
        sched = Schedule("custom", m, ops)
    if not sched.ops:
        raise PipelineError("schedule: there are no stages")
    if sched.microbatches < 1:  # (as schedule() refuses microbatches=0)
        raise PipelineError(f"schedule: a schedule needs at least one microbatch; its "
                            f"stages run no ops: {[list(ops) for ops in sched.ops]}")
    expected = sorted((kind, k) for kind in "BF" for k in range(sched.microbatches))
    for s, ops in enumerate(sched.ops):
        if sorted(ops) != expected:
            raise PipelineError(f"schedule: stage {s} must run F and B of each of the "
                                f"{sched.microbatches} microbatches exactly once; it runs "
                                f"{' '.join(kind + str(k) for kind, k in ops)}")
        # Each op's position, found once: ops.index inside the loop was O(m^2) per stage.
        position = {op: i for i, op in enumerate(ops)}
        if any(position[("B", k)] < position[("F", k)] for k in range(sched.microbatches)):
            raise PipelineError(f"schedule: stage {s} runs a backward before its forward")
    return sched


def peak_in_flight(ops: Sequence[Op]) -> int:
    """The most microbatches whose activations a stage running ``ops`` holds at once: a
    forward starts holding them, the backward of the same microbatch releases them."""
    held = peak = 0
    for kind, _ in ops:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak
