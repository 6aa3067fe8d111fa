"""Chapter 08, pipeline parallelism: the exercises.

Write each function below where it says ``raise NotImplementedError``; then run

    minigraph grade chapters/08-pipeline-parallelism

Everything comes to you as plain Python data:

* a *pass* is a pair ``("F", k)`` (the forward of microbatch k) or ``("B", k)`` (its
  backward), k = 0, 1, ..., m - 1;
* a *schedule* for p stages is a list of p lists of passes: ``schedule[s]`` is the
  order in which stage s runs its passes;
* *costs* are plain numbers, one per layer or one per stage.

The tests compare what you return with ``pp.schedule``, ``pp.peak_in_flight``,
``pp.bubble_closed_form``, ``pp.simulate`` and ``pp.partition`` / ``pp.stage_times``
(``from minigraph.parallel import pipeline as pp``; the modules are in
``minigraph/parallel/pipeline/``) on random sizes and costs.
"""

import math


# -- 1. schedules --------------------------------------------------------------------------

def gpipe_schedule(stages, microbatches):
    """GPipe: every stage runs all m forwards, then all m backwards, each in microbatch
    order.

    >>> gpipe_schedule(2, 2)
    [[('F', 0), ('F', 1), ('B', 0), ('B', 1)], [('F', 0), ('F', 1), ('B', 0), ('B', 1)]]
    """
    ### BEGIN SOLUTION
    one = [("F", k) for k in range(microbatches)] + [("B", k) for k in range(microbatches)]
    return [list(one) for _ in range(stages)]
    ### END SOLUTION


def one_f_one_b_schedule(stages, microbatches):
    """1F1B (PipeDream-Flush) for p = ``stages`` stages and m = ``microbatches``.

    Stage s (0 = the first stage, p - 1 = the last) runs

    1. *warm-up*: the forwards of the first w = min(p - 1 - s, m) microbatches;
    2. *steady state*: then, while forwards are left, one forward and one backward:
       F(w), B(0), F(w + 1), B(1), ... (the backward of the oldest microbatch whose
       forward has run);
    3. *drain*: then the backwards that are left, oldest first.

    Forwards and backwards each go in microbatch order. The last stage has no warm-up:
    it alternates F0 B0 F1 B1 ...

    >>> one_f_one_b_schedule(2, 3)[0]
    [('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
    """
    ### BEGIN SOLUTION
    out = []
    for s in range(stages):
        warmup = min(stages - 1 - s, microbatches)
        ops = [("F", k) for k in range(warmup)]
        for k in range(microbatches - warmup):
            ops += [("F", warmup + k), ("B", k)]
        ops += [("B", k) for k in range(microbatches - warmup, microbatches)]
        out.append(ops)
    return out
    ### END SOLUTION


def peak_activations(ops):
    """The most microbatches whose activations one stage holds at the same time, when it
    runs the passes ``ops`` in order: a forward starts holding its microbatch's
    activations, the backward of the same microbatch releases them.

    >>> peak_activations([("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)])
    2
    """
    ### BEGIN SOLUTION
    held = peak = 0
    for kind, _ in ops:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak
    ### END SOLUTION


# -- 2. bubbles and a simulator ------------------------------------------------------------

def bubble_fraction(stages, microbatches):
    """The idle fraction (the *bubble*) of GPipe and of 1F1B when all p stages take the
    same time: the idle time of all stages over p x makespan, in closed form.

    Hint: with forward f and backward b per stage and microbatch, every stage is busy
    m (f + b). Under GPipe the last forward ends on the last stage at (m + p - 1) f; the
    backwards then take as long again, with b in place of f. 1F1B has the same makespan.
    """
    ### BEGIN SOLUTION
    return (stages - 1) / (microbatches + stages - 1)
    ### END SOLUTION


def simulate(schedule, forward, backward):
    """Play a schedule and time every pass; transfers between stages take no time.

    ``forward[s]`` and ``backward[s]`` are the times of one microbatch's forward and
    backward on stage s. Each stage runs its passes strictly in the order of
    ``schedule[s]``, one at a time, each as early as possible:

    * F(s, k) can start once F(s - 1, k) has ended (stage 0: at once);
    * B(s, k) can start once F(s, k) and B(s + 1, k) have ended (the last stage: once
      its F(s, k) has ended);
    * and not before the stage's previous pass has ended.

    Returns the timeline: a list of events ``(stage, kind, k, start, end)``, one per
    pass, sorted by start time and then by stage. (You may assume the schedule does not
    deadlock; ``pp.simulate`` raises when it does.)
    """
    ### BEGIN SOLUTION
    p = len(schedule)
    end = {}
    position, free, events = [0] * p, [0.0] * p, []
    remaining = sum(len(ops) for ops in schedule)
    while remaining:
        progressed = False
        for s in range(p):
            while position[s] < len(schedule[s]):
                kind, k = schedule[s][position[s]]
                if kind == "F":
                    deps = [(s - 1, "F", k)] if s > 0 else []
                else:
                    deps = [(s, "F", k)] + ([(s + 1, "B", k)] if s < p - 1 else [])
                if any(d not in end for d in deps):
                    break
                start = max([free[s]] + [end[d] for d in deps])
                free[s] = end[(s, kind, k)] = start + (forward[s] if kind == "F" else backward[s])
                events.append((s, kind, k, start, free[s]))
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("the schedule deadlocks")
    return sorted(events, key=lambda e: (e[3], e[0]))
    ### END SOLUTION


def makespan_and_bubble(timeline, stages):
    """The makespan (the end of the last pass) and the bubble fraction (1 - busy time of
    all stages / (stages x makespan)) of a timeline."""
    ### BEGIN SOLUTION
    makespan = max((e[4] for e in timeline), default=0.0)
    busy = sum(e[4] - e[3] for e in timeline)
    return makespan, (0.0 if makespan == 0 else 1.0 - busy / (stages * makespan))
    ### END SOLUTION


# -- 3. partitioning -----------------------------------------------------------------------

def partition(costs, stages):
    """Cut the layers 0 .. n - 1 into ``stages`` contiguous, non-empty stages so that the
    slowest stage (the largest sum of its layers' costs) is as fast as possible.

    Dynamic programming: best[j][q], the slowest stage of the best cut of the first j
    layers into q stages, is the minimum over i of max(best[i][q - 1], cost of layers
    i .. j - 1). Remember which i gave each minimum to recover the stages.

    Returns the stages as lists of layer indices, e.g. ``[[0, 1, 2], [3, 4], [5]]``.

    >>> partition([1, 2, 3, 4, 5, 6], 3)
    [[0, 1, 2], [3, 4], [5]]
    """
    ### BEGIN SOLUTION
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    best = [[math.inf] * (stages + 1) for _ in range(n + 1)]
    choice = [[0] * (stages + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for q in range(1, stages + 1):
        for j in range(q, n + 1):
            for i in range(q - 1, j):
                slowest = max(best[i][q - 1], prefix[j] - prefix[i])
                if slowest < best[j][q]:
                    best[j][q], choice[j][q] = slowest, i
    bounds = [n]
    for q in range(stages, 0, -1):
        bounds.append(choice[bounds[-1]][q])
    bounds.reverse()
    return [list(range(bounds[q], bounds[q + 1])) for q in range(stages)]
    ### END SOLUTION
