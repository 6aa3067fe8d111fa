"""``mg.Session``: run a graph [3.1.2, 3.1.4].

``sess.run(fetches, feed_dict)`` does what TensorFlow 1's session did:

1. check the feeds against their placeholders (shape, dtype) and put them on the
   placeholders' devices;
2. keep only the nodes the fetches need (a fed node's own inputs are not needed);
3. run those nodes in FIFO topological order (``graph/topo.py``), each node's kernel on
   its device's array namespace;
4. return the fetched values as NumPy values, in the structure of ``fetches`` (a node,
   a name, or lists, tuples and dicts of them).

A failing node raises an error that names the node, its op and the line of user code
that created it. Nothing is left half-done: variables are assigned only after the whole
run has succeeded, so a failed run leaves them as they were and the session usable.
This executor is serial; the scheduler with worker threads comes with the runtime
chapter, behind the same interface.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np

from ..errors import DeviceError, MinigraphError, ShapeError
from ..graph.graph import Graph, GraphError, Node, default_graph, describe_location
from ..graph.topo import fifo_order, needed
from ..tensor import Tensor


class NodeError(MinigraphError, RuntimeError):
    """A node's kernel failed while the graph ran."""


class FeedError(MinigraphError, ValueError):
    """A missing or ill-fitting value in ``feed_dict``."""


class RunStats:
    """What the last ``run`` did: ``order`` is the node names in start order."""

    def __init__(self, order: list[str]):
        self.order = order

    def __repr__(self) -> str:
        return f"<RunStats: {len(self.order)} nodes>"


class Session:
    """Runs (parts of) a graph; ``workers=1`` is the deterministic serial FIFO order."""

    def __init__(self, graph: Graph | None = None, workers: int = 1):
        if workers != 1:
            raise ValueError(f"Session(workers={workers}): this executor is serial; the "
                             f"thread-pool scheduler is not built yet, use workers=1")
        self.graph = graph if graph is not None else default_graph()
        self.workers = workers
        self.last_run: RunStats | None = None
        self._plans: dict[tuple, list[Node]] = {}

    def run(self, fetches: Any, feed_dict: dict | None = None) -> Any:
        """Compute ``fetches`` (a node or a structure of nodes) and return NumPy values."""
        flat = [self._node(f) for f in _flatten(fetches)]
        feeds = self._feeds(feed_dict or {})
        order = self._plan(flat, feeds)
        values, assigns = self._execute(order, feeds, flat)
        for var, value in assigns:  # only now: a failed run changes no variable
            var.value = value
        self.last_run = RunStats([n.name for n in order])
        results = iter([_to_numpy(n, values[id(n)]) for n in flat])
        return _rebuild(fetches, results)

    # -- preparing a run ---------------------------------------------------------------
    def _node(self, f: Any) -> Node:
        node = self.graph[f] if isinstance(f, str) else f
        if not isinstance(node, Node):
            raise GraphError(f"run: cannot fetch a {type(f).__name__}; fetch graph nodes")
        if node.graph is not self.graph:
            raise GraphError(f"run: node '{node.name}' belongs to graph {node.graph.name!r}, "
                             f"not to this session's graph {self.graph.name!r}")
        return node

    def _feeds(self, feed_dict: dict) -> dict[int, Any]:
        feeds = {}
        for key, value in feed_dict.items():
            node = self._node(key)
            feeds[id(node)] = _check_feed(node, value)
        return feeds

    def _plan(self, fetches: list[Node], feeds: dict[int, Any]) -> list[Node]:
        key = (len(self.graph.nodes), tuple(map(id, fetches)), tuple(sorted(feeds)))
        if key not in self._plans:
            keep = needed(fetches, set(feeds))
            self._plans[key] = fifo_order(self.graph.nodes, keep, set(feeds))
        return self._plans[key]

    # -- running -----------------------------------------------------------------------
    def _execute(self, order: list[Node], feeds: dict[int, Any],
                 fetches: list[Node]) -> tuple[dict[int, Any], list]:
        values: dict[int, Any] = {}
        assigns: list[tuple[Node, Any]] = []
        for node in order:
            if id(node) in feeds:
                values[id(node)] = feeds[id(node)]
            else:
                values[id(node)] = compute(node, values, assigns, fetches)
        return values, assigns


def compute(node: Node, values: dict[int, Any], assigns: list, fetches: list[Node]) -> Any:
    """The value of one node, given the values of its inputs."""
    if node.op in ("Const", "Variable"):
        return node.value
    if node.op == "Placeholder":
        users = ", ".join(f"'{f.name}'" for f in fetches[:3])
        raise FeedError(f"placeholder '{node.name}' (created at {describe_location(node.location)})"
                        f" needs a value: the fetches {users} depend on it; pass it in "
                        f"feed_dict={{{node.name}: ...}}")
    if node.op == "Assign":
        value = values[id(node.args[1])]
        assigns.append((node.args[0], value))
        return value
    arrays = []
    for a in node.args:
        if isinstance(a, Node):
            if a.device is not node.device:
                raise DeviceError(
                    f"node '{node.name}' on {node.device.name} reads '{a.name}' from "
                    f"{a.device.name} (created at {describe_location(node.location)}); "
                    f"a value crosses devices only through an explicit x.to(device)")
            arrays.append(values[id(a)])
        else:
            arrays.append(a)
    try:
        with node.device.context or nullcontext():
            return node.prim.impl(node.device.xp, *arrays, **node.params)
    except Exception as exc:
        shapes = ", ".join(str(getattr(v, "shape", v)) for v in arrays)
        raise NodeError(f"node '{node.name}' ({node.op}) failed on inputs of shapes "
                        f"[{shapes}]: {exc}\n  the node was created at "
                        f"{describe_location(node.location)}") from exc


def _check_feed(node: Node, value: Any) -> Any:
    """The fed value as an array on the node's device, after checking shape and dtype."""
    host = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
    if node.dtype is not None and not np.can_cast(host.dtype, node.dtype, "same_kind"):
        raise FeedError(f"feed for '{node.name}': a value of dtype {host.dtype} cannot be fed "
                        f"to a node of dtype {node.dtype}")
    if node.shape is not None and tuple(host.shape) != node.shape:
        raise ShapeError(f"feed for '{node.name}': a value of shape {tuple(host.shape)} cannot "
                         f"be fed to a node of shape {node.shape} "
                         f"(created at {describe_location(node.location)})")
    return node.device.asarray(host, dtype=node.dtype)


def _to_numpy(node: Node, value: Any) -> Any:
    out = np.asarray(node.device.to_numpy(value))
    return out[()] if out.ndim == 0 else out


# -- fetch structures: a node, or lists / tuples / dicts of them ---------------------------

def _flatten(fetches: Any) -> list:
    if isinstance(fetches, dict):
        return [leaf for v in fetches.values() for leaf in _flatten(v)]
    if isinstance(fetches, (list, tuple)):
        return [leaf for v in fetches for leaf in _flatten(v)]
    return [fetches]


def _rebuild(fetches: Any, results: Any) -> Any:
    if isinstance(fetches, dict):
        return {k: _rebuild(v, results) for k, v in fetches.items()}
    if isinstance(fetches, (list, tuple)):
        return type(fetches)(_rebuild(v, results) for v in fetches)
    return next(results)
