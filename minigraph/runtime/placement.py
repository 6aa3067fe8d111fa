"""Placement: which device runs each node [3.1.4].

The rules when a graph is built (``graph.py``): a node takes the device of the innermost
``with mg.device(...)`` scope; without a scope it sits with its first input; with no
input, on the default device. Gradient nodes are built inside their forward node's
device scope, so they sit with it.

``auto_place(graph, devices)`` is the optional automatic placer: a greedy list
scheduler that spreads independent branches over devices. It visits the nodes in
topological order and puts each on the device where it would *finish* first, given

* when each device is free again (the work already put on it),
* when the node's inputs are ready there (an input on another device first has to be
  sent: its bytes over ``BANDWIDTH``),
* the node's estimated run time (``estimate``: multiply-adds over ``FLOPS``).

Inputs (placeholders, constants, variables) stay where they are, and so does an explicit
copy (``x.to("cpu:1")``, a primitive whose table entry says ``transfer``): its device is
where the program asked the value to go. Greedy means it never
revisits a choice, so it is fast and simple, not optimal; a chain stays on one device
(moving it would only add transfers), two independent branches of equal cost end up on
two devices. The result is a copy of the graph with new devices (its variables the
original's, as every pass's: ``passes.SharedVariable``); partitioning then adds the
Send/Recv pairs.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..device import get_device
from ..graph.graph import Graph, Node, check_graph
from ..graph.passes import PassResult, copy_node

FLOPS = 1e9        # multiply-adds per second assumed for every device
BANDWIDTH = 1e9    # bytes per second assumed between two devices
OVERHEAD = 5e-6    # seconds every node costs, however small


def estimate(node: Node) -> float:
    """Estimated seconds to run ``node``: the flops its table entry counts (m*n*k for a
    matmul), otherwise one per element of the result."""
    if node.prim is None or node.shape is None:
        return 0.0
    shapes = [getattr(a, "shape", ()) for a in node.args]
    if node.prim.flops is not None and all(s is not None for s in shapes):
        return OVERHEAD + node.prim.flops(node.shape, *shapes) / FLOPS
    return OVERHEAD + math.prod(node.shape) / FLOPS


def _bytes(node: Node) -> int:
    size = 4 if node.dtype in ("float32", "int32") else 8
    return size * math.prod(node.shape or ())


def auto_place(graph: Graph, devices: Sequence[str]) -> PassResult:
    """A copy of ``graph`` with its computing nodes spread over ``devices`` (greedy)."""
    check_graph(graph, "auto_place")
    devs = [get_device(d) for d in devices]
    free_at = {d.name: 0.0 for d in devs}
    finish: dict[int, float] = {}
    new = Graph(graph.name)
    mapping: dict[int, Node] = {}
    changes = []
    for n in graph.nodes:
        if n.prim is None:  # inputs and state stay where they were put
            chosen, end = n.device, 0.0
        elif n.prim.transfer:  # a copy stays where it copies to (its kernel's device
            # parameter): moved, it would say one device and hold its value on another
            chosen, end = n.device, _arrival(n, n.device, finish, mapping)
        else:
            chosen, end = min(((d, _finish(n, d, free_at, finish, mapping)) for d in devs),
                              key=lambda pair: pair[1])
            free_at[chosen.name] = end
        finish[id(n)] = end
        args = tuple(mapping[id(a)] if isinstance(a, Node) else a for a in n.args)
        # (the passes' copy: a Variable's shares the original's state, not a snapshot)
        control = tuple(mapping[id(c)] for c in n.control_inputs)
        mapping[id(n)] = copy_node(new, n, args, control, chosen)
        if chosen is not n.device:
            changes.append(f"auto_place: {n.name} ({n.op}) on {chosen.name}")
    return PassResult(new, mapping, changes, source=graph)


def _finish(n: Node, device, free_at: dict, finish: dict, mapping: dict) -> float:
    """When ``n`` would finish on ``device``: after the device is free and the inputs
    have arrived there."""
    return max(_arrival(n, device, finish, mapping), free_at[device.name]) + estimate(n)


def _arrival(n: Node, device, finish: dict, mapping: dict) -> float:
    """When the last of ``n``'s inputs has arrived on ``device``."""
    ready = 0.0
    for i in n.predecessors:
        arrive = finish[id(i)]
        if mapping[id(i)].device is not device and any(i is a for a in n.inputs):
            arrive += _bytes(i) / BANDWIDTH  # a control edge carries no bytes
        ready = max(ready, arrive)
    return ready
