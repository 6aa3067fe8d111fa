"""Graded tests of chapter 08: each exercise against minigraph's own implementation.

Schedules, costs and sizes are drawn at random (fixed seeds) and handed to the
exercises as plain Python data; the same inputs go to ``minigraph.parallel.pipeline``.
"""

import numpy as np
import pytest

from minigraph.grading import exercises_fixture
from minigraph.parallel import pipeline as pp

exercises = exercises_fixture()

# what the schedule exercises may not call: pp.schedule, and the private helpers that
# write one stage's list for it (a name of its module, reachable as any other)
NO_SCHEDULES = ("minigraph.parallel.pipeline.schedule",
                "minigraph.parallel.pipeline.scheduling._gpipe",
                "minigraph.parallel.pipeline.scheduling._one_f_one_b")


def as_ops(stage):
    """A stage's passes as a list of (str, int) tuples, however they were returned."""
    return [(str(kind), int(k)) for kind, k in stage]


def sizes(seed, most_stages=6, most_microbatches=10, count=25):
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(1, most_stages + 1)), int(rng.integers(1, most_microbatches + 1)))
            for _ in range(count)]


def random_schedule(rng, p, m):
    """A random schedule that cannot deadlock: passes are picked one at a time, at
    random, among those whose inputs are done, and appended to their stage's list.
    Each stage runs its forwards, and its backwards, in microbatch order."""
    stages = [[] for _ in range(p)]
    done, f, b = set(), [0] * p, [0] * p
    while any(k < m for k in b):
        ready = []
        for s in range(p):
            if f[s] < m and (s == 0 or ("F", s - 1, f[s]) in done):
                ready.append(("F", s, f[s]))
            if b[s] < f[s] and (s == p - 1 or ("B", s + 1, b[s]) in done):
                ready.append(("B", s, b[s]))
        kind, s, k = ready[int(rng.integers(len(ready)))]
        done.add((kind, s, k))
        stages[s].append((kind, k))
        (f if kind == "F" else b)[s] += 1
    return stages


# -- 1. schedules --------------------------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid(*NO_SCHEDULES, why="write the schedule yourself")
def test_gpipe_schedule(exercises):
    for p, m in sizes(0):
        expected = list(pp.schedule("gpipe", stages=p, microbatches=m))
        got = exercises.gpipe_schedule(p, m)
        assert len(got) == p, f"{p} stages"
        assert [as_ops(s) for s in got] == expected, f"p = {p}, m = {m}"


@pytest.mark.points(3)
@pytest.mark.forbid(*NO_SCHEDULES, why="write the schedule yourself")
def test_one_f_one_b_schedule(exercises):
    for p, m in [(4, 8), (1, 3), (3, 1), (5, 2)] + sizes(1):
        expected = list(pp.schedule("1f1b", stages=p, microbatches=m))
        got = exercises.one_f_one_b_schedule(p, m)
        assert len(got) == p, f"{p} stages"
        for s in range(p):
            assert as_ops(got[s]) == expected[s], f"stage {s} of p = {p}, m = {m}"


@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.parallel.pipeline.peak_in_flight", why="count them yourself")
def test_peak_activations(exercises):
    rng = np.random.default_rng(2)
    for p, m in sizes(2):
        for kind in pp.KINDS:
            for s, ops in enumerate(pp.schedule(kind, p, m)):
                assert exercises.peak_activations(ops) == pp.peak_in_flight(ops), \
                    f"{kind}, stage {s} of p = {p}, m = {m}"
        for ops in random_schedule(rng, 2, m):
            assert exercises.peak_activations(ops) == pp.peak_in_flight(ops), ops


# -- 2. bubbles and a simulator ------------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.parallel.pipeline.bubble_closed_form",
                    "minigraph.parallel.pipeline.simulate", *NO_SCHEDULES,
                    why="derive the fraction yourself")
def test_bubble_fraction(exercises):
    rng = np.random.default_rng(3)
    for p, m in sizes(3, most_stages=8, most_microbatches=64):
        expected = pp.bubble_closed_form(p, m)
        assert np.isclose(exercises.bubble_fraction(p, m), expected), f"p = {p}, m = {m}"
        f, b = rng.uniform(0.5, 2.0, size=2)
        sim = pp.simulate(pp.schedule(str(rng.choice(pp.KINDS)), p, m), f, b)
        got = exercises.bubble_fraction(p, m)
        assert np.isclose(got, sim.bubble_fraction), (
            f"p = {p}, m = {m}: bubble fraction {got}, the simulated schedule's is "
            f"{sim.bubble_fraction}")


@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.parallel.pipeline.simulate", "minigraph.parallel.pipeline.schedule", why="simulate the timeline yourself")
def test_makespan_and_bubble(exercises):
    rng = np.random.default_rng(4)
    for p, m in sizes(4):
        sim = pp.simulate(pp.schedule(str(rng.choice(pp.KINDS)), p, m),
                          list(rng.uniform(0.5, 2, size=p)), list(rng.uniform(0.5, 3, size=p)))
        makespan, bubble = exercises.makespan_and_bubble(list(sim.timeline), p)
        assert np.isclose(makespan, sim.makespan) and np.isclose(bubble, sim.bubble_fraction), (
            f"p = {p}, m = {m}: (makespan, bubble) = ({makespan}, {bubble}), expected "
            f"({sim.makespan}, {sim.bubble_fraction})")


def timeline_difference(got, expected):
    """None when the two timelines hold the same events (in any order, times to
    rounding); else the first event that differs, and the one expected in its place:
    what the failure message shows (a bare False taught nothing)."""
    key = lambda e: (int(e[0]), str(e[1]), int(e[2]))  # noqa: E731
    show = lambda e: f"{key(e) + (float(e[3]), float(e[4]))}"  # noqa: E731
    got, expected = sorted(got, key=key), sorted(expected, key=key)
    for a, b in zip(got, expected):
        if key(a) != key(b) or not (np.isclose(a[3], b[3]) and np.isclose(a[4], b[4])):
            return f"event {show(a)}, expected {show(b)} (stage, kind, k, start, end)"
    if len(got) != len(expected):
        return f"{len(got)} events, expected {len(expected)}"
    return None


@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.parallel.pipeline.simulate", "minigraph.parallel.pipeline.schedule", why="simulate the timeline yourself")
def test_simulate_uniform_stages(exercises):
    for p, m in sizes(5):
        for kind in pp.KINDS:
            sched = [as_ops(s) for s in pp.schedule(kind, p, m)]
            sim = pp.simulate(sched, 1.0, 2.0)
            got = exercises.simulate(sched, [1.0] * p, [2.0] * p)
            wrong = timeline_difference(got, sim.timeline)
            assert wrong is None, f"{kind}, p = {p}, m = {m}: {wrong}"


@pytest.mark.points(3)
@pytest.mark.forbid("minigraph.parallel.pipeline.simulate", "minigraph.parallel.pipeline.schedule", why="simulate the timeline yourself")
def test_simulate_matches_pp_simulate(exercises):
    rng = np.random.default_rng(6)
    for p, m in sizes(6, count=30):
        forward = [float(v) for v in rng.integers(1, 5, size=p)]      # exact sums
        backward = [float(v) for v in rng.integers(1, 9, size=p)]
        choice = int(rng.integers(3))
        sched = random_schedule(rng, p, m) if choice == 2 else \
            [as_ops(s) for s in pp.schedule(pp.KINDS[choice], p, m)]
        sim = pp.simulate(sched, forward, backward)
        got = list(exercises.simulate(sched, forward, backward))
        wrong = timeline_difference(got, sim.timeline)
        assert wrong is None, (f"{wrong}; p = {p}, m = {m}, forward {forward}, backward "
                               f"{backward}, schedule {sched}")
        starts = [(e[3], e[0]) for e in got]
        assert starts == sorted(starts), "the timeline is sorted by start time, then stage"


# -- 3. partitioning -----------------------------------------------------------------------

@pytest.mark.points(3)
@pytest.mark.forbid("minigraph.parallel.pipeline.partition", why="search the partition yourself")
def test_partition_minimises_the_slowest_stage(exercises):
    rng = np.random.default_rng(7)
    for trial in range(40):
        n = int(rng.integers(1, 12))
        stages = int(rng.integers(1, n + 1))
        costs = [float(c) for c in (rng.integers(1, 20, size=n) if trial % 2
                                    else rng.uniform(0.1, 5.0, size=n))]
        got = exercises.partition(list(costs), stages)
        got = [[int(i) for i in stage] for stage in got]
        assert len(got) == stages and all(got), f"{stages} non-empty stages: {got}"
        assert sum(got, []) == list(range(n)), f"contiguous stages covering 0..{n - 1}: {got}"
        best = max(pp.stage_times(costs, pp.partition(costs, stages)))
        assert np.isclose(max(pp.stage_times(costs, got)), best), \
            f"costs {costs} into {stages}: your slowest stage is " \
            f"{max(pp.stage_times(costs, got))}, the best is {best}"
