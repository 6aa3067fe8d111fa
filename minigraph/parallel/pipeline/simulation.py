"""Phase 4a, simulation: play a schedule with per-stage costs; timelines and bubbles.

See the package docstring (``minigraph/parallel/pipeline/__init__.py``) for the whole picture.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np  # host arrays

from .common import Event, PipelineError, is_count
from .partitioning import as_cost
from .scheduling import Schedule, _as_schedule, peak_in_flight


def bubble_closed_form(stages: int, microbatches: int) -> float:
    """The idle fraction of GPipe and 1F1B with uniform stages: (p - 1) / (m + p - 1)."""
    for what, v in (("stages", stages), ("microbatches", microbatches)):
        if not is_count(v):  # (as schedule(): 0 microbatches divided by zero for p = 1)
            raise PipelineError(f"bubble_closed_form: {what} must be an int >= 1, got {v!r}")
    return (stages - 1) / (microbatches + stages - 1)


@dataclass
class Simulation:
    """What :func:`simulate` found; ``timeline`` lists (stage, kind, k, start, end)."""

    schedule: Schedule
    timeline: list[Event]
    forward: list[float]
    backward: list[float]
    comm: list[float]
    makespan: float = field(init=False)
    busy: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.makespan = max((e[4] for e in self.timeline), default=0.0)
        self.busy = [0.0] * self.schedule.stages
        for s, _, _, start, end in self.timeline:
            self.busy[s] += end - start

    @property
    def bubble_fraction(self) -> float:
        """Idle time of all stages over stages x makespan."""
        total = self.schedule.stages * self.makespan
        return 0.0 if total == 0 else 1.0 - sum(self.busy) / total

    @property
    def peak_activations(self) -> list[int]:
        """Per stage, the most microbatches whose activations it holds at once."""
        return [peak_in_flight(ops) for ops in self.schedule.ops]

    def activation_curve(self, stage: int) -> list[tuple[float, int]]:
        """(time, microbatches held) at every change on ``stage``: +1 when a forward
        starts, -1 when the backward of the same microbatch ends."""
        changes: dict[float, int] = {}
        for s, kind, _, start, end in self.timeline:
            if s == stage:  # a backward ending as a forward starts: no change at that time
                t = start if kind == "F" else end
                changes[t] = changes.get(t, 0) + (1 if kind == "F" else -1)
        curve, held = [(0.0, 0)], 0
        for t in sorted(changes):
            held += changes[t]
            curve.append((t, held))
        return curve

    def draw(self, ax: Any = None, title: str | None = None) -> Any:
        """The timeline as in the GPipe and PipeDream figures (see :func:`draw_timeline`)."""
        return draw_timeline(self.timeline, self.schedule.stages, ax, title)

    def draw_activations(self, ax: Any = None) -> Any:
        """Microbatches held per stage over time, one step curve per stage."""
        return draw_activations(self, ax)


def _per_stage(value: Any, n: int, what: str) -> list[float]:
    """``n`` costs: ``value``'s, or ``value`` n times where it is one (a number, a 0-d
    array; a string is one too, which ``as_cost`` refuses: its letters are no costs)."""
    if not isinstance(value, Iterable) or isinstance(value, (str, bytes)) or \
            (isinstance(value, np.ndarray) and value.ndim == 0):
        return [as_cost(value, f"simulate: {what}")] * n
    values = [as_cost(v, f"simulate: {what}[{i}]") for i, v in enumerate(value)]
    if len(values) != n:
        raise PipelineError(f"simulate: {what} needs {n} values (or one for all), "
                            f"got {len(values)}")
    return values


def simulate(sched: Any, forward: Any = 1.0, backward: Any = 1.0,
             comm: Any = 0.0) -> Simulation:
    """Play ``sched`` (a Schedule, or per-stage op lists) and time every pass.

    ``forward`` / ``backward``: the time of one microbatch's pass on each stage (one value
    per stage, or one for all); ``comm``: the time to send an activation or a gradient
    across each cut (p - 1 values, or one). A stage runs its ops in order, each as soon
    as the stage is free and its inputs are there: F(s, k) needs F(s-1, k) plus the
    transfer; B(s, k) needs F(s, k) and B(s+1, k) plus the transfer. Transfers overlap
    computation (PipeDream's asynchronous sends): they delay the receiver, they do not
    occupy either stage. A schedule in which no stage can go on raises (a deadlock).
    """
    try:
        sched = _as_schedule(sched)
    except PipelineError:
        raise
    except (TypeError, ValueError) as exc:  # (None: "'NoneType' object is not iterable")
        raise PipelineError(f"simulate: sched is a Schedule (pp.schedule(...)) or a list of "
                            f"each stage's ops, [('F', 0), ('B', 0), ...], got "
                            f"{sched!r:.60}") from exc
    p = sched.stages
    f, b = _per_stage(forward, p, "forward"), _per_stage(backward, p, "backward")
    c = _per_stage(comm, p - 1, "comm")
    end: dict[tuple[int, str, int], float] = {}
    position, free, timeline = [0] * p, [0.0] * p, []
    remaining = sum(len(ops) for ops in sched.ops)
    while remaining:
        progressed = False
        for s in range(p):
            while position[s] < len(sched.ops[s]):
                kind, k = sched.ops[s][position[s]]
                ready = _ready_time(s, kind, k, end, c, p)
                if ready is None:
                    break  # an input is missing: try the other stages
                start = max(free[s], ready)
                free[s] = end[(s, kind, k)] = start + (f[s] if kind == "F" else b[s])
                timeline.append((s, kind, k, start, free[s]))
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise PipelineError(_deadlock_message(sched, position, end, p))
    timeline.sort(key=lambda e: (e[3], e[0]))
    return Simulation(sched, timeline, f, b, c)


def _dependencies(s: int, kind: str, k: int, p: int) -> list[tuple[tuple[int, str, int], int]]:
    """What (stage, kind, k) waits for, each with the cut it crosses (-1: none)."""
    if kind == "F":
        return [((s - 1, "F", k), s - 1)] if s > 0 else []
    deps = [((s, "F", k), -1)]
    return deps + ([((s + 1, "B", k), s)] if s < p - 1 else [])


def _ready_time(s: int, kind: str, k: int, end: dict, comm: list[float],
                p: int) -> float | None:
    ready = 0.0
    for dep, cut in _dependencies(s, kind, k, p):
        if dep not in end:
            return None
        ready = max(ready, end[dep] + (comm[cut] if cut >= 0 else 0.0))
    return ready


def _deadlock_message(sched: Schedule, position: list[int], end: dict, p: int) -> str:
    waits = []
    for s in range(p):
        if position[s] < len(sched.ops[s]):
            kind, k = sched.ops[s][position[s]]
            missing = [f"{d[1]}{d[2]} of stage {d[0]}"
                       for d, _ in _dependencies(s, kind, k, p) if d not in end]
            waits.append(f"stage {s} waits at {kind}{k} for {', '.join(missing)}")
    return "simulate: the schedule deadlocks: " + "; ".join(waits)


# -- drawings -------------------------------------------------------------------------------

COLORS = {"F": "#8ecae6", "B": "#f4a261"}


def draw_timeline(timeline: Sequence[Event], stages: int, ax: Any = None,
                  title: str | None = None) -> Any:
    """A Gantt chart: one row per stage (stage 0 on top), a box per pass, labelled with
    its microbatch; forwards blue, backwards orange. Returns the Axes."""
    from matplotlib.patches import Patch

    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(10, 0.6 * stages + 1))
    for s, kind, k, start, end in timeline:
        ax.broken_barh([(start, end - start)], (s - 0.4, 0.8), facecolors=COLORS[kind],
                       edgecolors="black", linewidth=0.5)
        ax.text((start + end) / 2, s, str(k), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"stage {s}" for s in range(stages)])
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_xlabel("time")
    ax.legend(handles=[Patch(color=COLORS["F"], label="forward"),
                       Patch(color=COLORS["B"], label="backward")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    if title:
        ax.set_title(title)
    return ax


def draw_activations(sim: Simulation, ax: Any = None) -> Any:
    """Microbatches whose activations each stage holds, over time (step curves)."""
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(5, 3))
    for s in range(sim.schedule.stages):
        t, held = zip(*sim.activation_curve(s))
        ax.step(list(t) + [sim.makespan], list(held) + [held[-1]], where="post",
                label=f"stage {s} (peak {sim.peak_activations[s]})")
    ax.set_xlabel("time")
    ax.set_ylabel("microbatches held")
    ax.legend(fontsize=7)
    return ax


def draw_comparison(sims: dict[str, Simulation]) -> Any:
    """A figure, one row per simulation: its timeline and its activation curves
    (a matplotlib Figure, not registered with pyplot: ``fig.savefig(path)`` writes it)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 2.6 * len(sims)), layout="constrained")
    axes = fig.subplots(len(sims), 2, squeeze=False, gridspec_kw={"width_ratios": [3, 1]})
    for (name, sim), (left, right) in zip(sims.items(), axes):
        sim.draw(left, f"{name}: makespan {sim.makespan:g}, bubble {sim.bubble_fraction:.1%}")
        sim.draw_activations(right)
        right.set_title(f"{name}: activations held")
    return fig
