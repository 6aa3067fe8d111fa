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
