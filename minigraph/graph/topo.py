"""Topological orders of a graph: Kahn's algorithm with a FIFO ready queue [3.1.4].

A node may run once all of its inputs have run. Kahn's algorithm keeps, for every
node, the number of inputs still missing (its in-degree); the nodes with none are
*ready* and wait in a first-in first-out queue. Running a node lowers the count of
each of its consumers, and a consumer whose count reaches zero joins the queue. The
roots enter the queue in creation order and consumers in creation order as they
become ready, so the order is deterministic. For z = x*y + sin(x) it is
x, y, sin, mul, add: ``sin`` becomes ready as soon as ``x`` has run, while ``mul``
still waits for ``y``; any order that respects the edges gives the same values, which
is what lets a scheduler run ``sin`` and ``mul`` at the same time.

Everything here is iterative (explicit stacks and queues), so a chain of 100,000
nodes is no problem.
"""

from __future__ import annotations

from collections import deque
from typing import AbstractSet, Iterable

from .graph import GraphError, Node, describe_location


def needed(fetches: Iterable[Node], stop: AbstractSet[int] = frozenset()) -> set[int]:
    """ids of the nodes the fetches depend on; the search stops at nodes in ``stop``
    (fed values: what they would have been computed from is not needed)."""
    seen: set[int] = set()
    stack = list(fetches)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if id(n) not in stop:
            stack.extend(n.predecessors)
    return seen


def dependencies(members: list[Node], stop: AbstractSet[int] = frozenset()
                 ) -> tuple[dict[int, int], dict[int, list[Node]]]:
    """Kahn's counts for ``members``: each one's number of inputs among them (its
    in-degree; none for a node in ``stop``, which is fed), and each one's consumers among
    them, in the order of ``members``."""
    keep = {id(n) for n in members}
    missing: dict[int, int] = {}
    consumers: dict[int, list[Node]] = {}
    for n in members:
        count = 0
        if id(n) not in stop:
            for i in n.predecessors:
                if id(i) in keep:
                    count += 1
                    consumers.setdefault(id(i), []).append(n)
        missing[id(n)] = count
    return missing, consumers


def fifo_order(nodes: list[Node], keep: set[int],
               stop: AbstractSet[int] = frozenset()) -> list[Node]:
    """The nodes of ``nodes`` (a graph's creation order) whose id is in ``keep``, in
    FIFO topological order. Inputs of nodes in ``stop`` are ignored (they are fed)."""
    members = [n for n in nodes if id(n) in keep]
    missing, consumers = dependencies(members, stop)
    ready = deque(n for n in members if missing[id(n)] == 0)
    order = []
    while ready:
        n = ready.popleft()
        order.append(n)
        for c in consumers.get(id(n), ()):
            missing[id(c)] -= 1
            if missing[id(c)] == 0:
                ready.append(c)
    if len(order) != len(members):
        stuck = [n for n in members if missing[id(n)] > 0]
        raise GraphError(
            f"the graph has a cycle: {len(stuck)} nodes never become ready, e.g. "
            f"'{stuck[0].name}' ({stuck[0].op}) created at {describe_location(stuck[0].location)}")
    return order


def refuse_reads_after_assigns(plan: list[Node], who: str = "run") -> None:
    """Refuse a plan whose result would depend on assignments taking effect during the
    run: a node that reads a variable and is ordered after an Assign to it by a control
    dependency, and two Assigns to one variable.

    A run reads every variable as it was when the run began and stores its assignments
    when it ends (``Session.run``'s commit; ``compile_graph``'s last lines, ``who``):
    that is what makes a failed run change nothing and concurrent runs serialisable.
    TensorFlow 1 instead lets an assignment take effect at once, so ``with
    control_dependencies([v.assign(...)]): r = v * 1.0`` reads the new value there; here
    ``r`` would read the old one, a silent difference, so it is an error. (A node that only *computes from* the Assign's value, a gradient say, reads
    the value from before the run, the one the value was computed from, as it should.)

    ``plan`` is in topological order. An Assign is ordered before a node when a path of
    edges leads from the Assign to the node through a control edge. One walk carries, per
    node, the Assigns upstream of it by any path (``upstream``) and those ordered before it
    (``ordered``: upstream of one of its control inputs, or ordered before one of its
    inputs), each set as the bits of a Python int. Only the Assigns of a variable read
    under a control edge get a bit (:func:`_watched`; no other can be reported): a plan
    without control edges, a chain of ``s = s + v.assign(v + x)`` say, carries no bits,
    and the walk is linear. (Sets of Assign nodes per node made that chain quadratic:
    each link held every Assign before it.)"""
    bit = _watched(plan)
    upstream: dict[int, int] = {}
    ordered: dict[int, int] = {}
    assigned: dict[int, Node] = {}  # id(variable) -> its Assign in this plan
    for n in plan:
        up = after = 0
        for p in n.inputs:
            up |= upstream.get(id(p), 0)
            after |= ordered.get(id(p), 0)
        for c in n.control_inputs:
            up |= upstream.get(id(c), 0)
            after |= upstream.get(id(c), 0)
        # (an Assign ordered before n was walked already, and so was at most one Assign
        # of each variable: a second raised below when it was walked)
        for var in n.inputs if after else ():
            a = assigned.get(id(var))
            if a is not None and after & bit.get(id(a), 0):
                raise GraphError(
                    f"{who}: '{n.name}' ({n.op}, created at {describe_location(n.location)}) "
                    f"reads variable '{var.name}' under a control dependency on "
                    f"'{a.name}', which assigns it in the same run. A run reads each "
                    f"variable as it was before the run and stores its assignments when it "
                    f"ends (so a failed run changes nothing): '{n.name}' would read the "
                    f"old value. Fetch '{a.name}' itself (its value is the one assigned), "
                    f"or read '{var.name}' in a second run.")
        if n.op == "Assign":
            other = assigned.setdefault(id(n.args[0]), n)
            if other is not n:
                raise GraphError(
                    f"{who}: '{other.name}' and '{n.name}' (created at "
                    f"{describe_location(n.location)}) both assign variable "
                    f"'{n.args[0].name}' in one run; a run stores its assignments when it "
                    f"ends, each computed from the value before the run, so one would be "
                    f"lost. Run them in two runs.")
            up |= bit.get(id(n), 0)
        if up:
            upstream[id(n)] = up
        if after:
            ordered[id(n)] = after


def _watched(plan: list[Node]) -> dict[int, int]:
    """``{id(Assign): its bit}`` for the Assigns of ``plan`` that assign a variable read by
    a node under a control edge (one that has a control input, or reads, along data
    edges, a node that has one): only such a node can be ordered after an Assign."""
    controlled: set[int] = set()
    read: set[int] = set()  # ids of the nodes the controlled nodes read
    for n in plan:
        if n.control_inputs or any(id(p) in controlled for p in n.inputs):
            controlled.add(id(n))
            read.update(id(a) for a in n.inputs)
    assigns = [n for n in plan if n.op == "Assign" and id(n.args[0]) in read]
    return {id(a): 1 << k for k, a in enumerate(assigns)}
