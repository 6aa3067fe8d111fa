"""Graph passes: rewrite a graph before running it, as a define-and-run framework can.

Each pass takes a graph and the nodes that will be fetched, and returns a
:class:`PassResult`: a *new* graph (the original is left as it was, so nodes the user
holds stay valid), a ``mapping`` from old nodes to new ones (to fetch and feed), and
``changes``, a line of text per change, so a student can see what the pass did.

* ``prune``: keep only what the fetches need;
* ``cse`` (common-subexpression elimination): two nodes with the same op, the same
  inputs and the same parameters compute the same value; keep the first;
* ``fold_constants``: a node whose inputs are all constants is computed now and becomes
  a constant;
* ``simplify``: ``x * 1``, ``x + 0``, ``x - 0`` and ``x / 1`` are ``x`` (the reverse-graph
  pass leaves many: it seeds a scalar output's adjoint with ones).

``optimize`` runs the four in that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import numpy as np

from ..device import Device
from .graph import Graph, Node
from .topo import fifo_order, needed


@dataclass
class PassResult:
    graph: Graph
    mapping: dict[int, Node]  # id(old node) -> new node
    changes: list[str] = field(default_factory=list)

    def __getitem__(self, old: Node) -> Node:
        """The new node standing for ``old``."""
        return self.mapping[id(old)]

    def __str__(self) -> str:
        return "\n".join(self.changes) if self.changes else "(no change)"


def _copy(new: Graph, n: Node, args: tuple, control: tuple = ()) -> Node:
    """A copy of ``n`` in graph ``new``, reading the (new) arguments ``args``."""
    return new._register(Node(new, n.name, n.op, n.prim, args, n.params, n.shape, n.dtype,
                              n.device, n.location, n.value, control))


Rewrite = Callable[[Graph, Node, tuple, tuple], Node]


def _rebuild(graph: Graph, fetches: Sequence[Node], rewrite: Rewrite) -> PassResult:
    """Visit the nodes the fetches need, in topological order, and let ``rewrite`` give
    each one's replacement in a new graph (a copy, an earlier node, a constant)."""
    new = Graph(graph.name)
    mapping: dict[int, Node] = {}
    for n in fifo_order(graph.nodes, needed(fetches)):
        args = tuple(mapping[id(a)] if isinstance(a, Node) else a for a in n.args)
        control = tuple(mapping[id(c)] for c in n.control_inputs)
        mapping[id(n)] = rewrite(new, n, args, control)
    return PassResult(new, mapping)


def prune(graph: Graph, fetches: Sequence[Node]) -> PassResult:
    """Keep only the nodes ``fetches`` depend on."""
    result = _rebuild(graph, fetches, _copy)
    result.changes = [f"prune: removed {n.name} ({n.op})" for n in graph.nodes
                      if id(n) not in result.mapping]
    return result


def _key(n: Node, args: tuple) -> tuple | None:
    """What makes two nodes compute the same value; None for nodes never merged."""
    if n.prim is None:
        return None  # placeholders, constants, variables and assignments stay distinct
    params = tuple(sorted((k, value_key(v)) for k, v in n.params.items()))
    return (n.op, n.device.name, params,
            tuple(("node", id(a)) if isinstance(a, Node) else value_key(a) for a in args))


def value_key(v: object) -> Hashable:
    """A key equal for two parameters exactly when they are the same value of the same type.

    Neither ``repr`` nor ``==`` will do: NumPy elides a large array's ``repr`` to "...",
    so two different arrays print alike; and ``1 == 1.0 == True`` and ``0.0 == -0.0``,
    yet ``x ** 1`` and ``x ** 1.0`` have different dtypes and ``1 / -0.0`` is ``-inf``.
    So a float is keyed by its bits (``float.hex`` keeps the sign of zero and tells NaNs
    apart from numbers), an array by its dtype, shape and bytes, and a value of a type
    this function does not know by its identity: such nodes merge only if they share
    the very object, which is never wrong.
    """
    if v is None or isinstance(v, (bool, int, str, bytes)):
        return type(v), v  # (bool before int would not matter: the type is in the key)
    if isinstance(v, float):
        return float, v.hex()
    if isinstance(v, (np.ndarray, np.generic)):
        a = np.ascontiguousarray(v)
        return type(v), a.dtype.str, a.shape, a.tobytes()
    if isinstance(v, (tuple, list)):
        return type(v), tuple(value_key(x) for x in v)
    if isinstance(v, dict):
        return dict, tuple(sorted((repr(k), value_key(x)) for k, x in v.items()))
    if isinstance(v, slice):
        return slice, value_key(v.start), value_key(v.stop), value_key(v.step)
    if isinstance(v, Device):
        return Device, v.name
    return "object", id(v)


def cse(graph: Graph, fetches: Sequence[Node]) -> PassResult:
    """Merge nodes that compute the same value (same op, inputs, parameters, device)."""
    seen: dict[tuple, Node] = {}
    changes: list[str] = []

    def rewrite(new: Graph, n: Node, args: tuple, control: tuple) -> Node:
        key = None if control else _key(n, args)  # ordered nodes are never merged
        if key is not None and key in seen:
            changes.append(f"cse: {n.name} computes the same as {seen[key].name}")
            return seen[key]
        copy = _copy(new, n, args, control)
        if key is not None:
            seen[key] = copy
        return copy

    result = _rebuild(graph, fetches, rewrite)
    result.changes = changes
    return result


def fold_constants(graph: Graph, fetches: Sequence[Node]) -> PassResult:
    """Compute now every node whose inputs are all constants; it becomes a Const."""
    from ..runtime.scheduler import Step, compute

    changes: list[str] = []

    def rewrite(new: Graph, n: Node, args: tuple, control: tuple) -> Node:
        nodes = [a for a in args if isinstance(a, Node)]
        if n.prim is None or not nodes or control or any(a.op != "Const" for a in nodes):
            return _copy(new, n, args, control)
        probe = Node(new, n.name, n.op, n.prim, args, n.params, n.shape, n.dtype, n.device,
                     n.location)
        value = compute(Step(probe), {id(a): a.value for a in nodes}, [], [])
        shown = repr(n.device.to_numpy(value).tolist())
        changes.append(f"fold_constants: {n.name} ({n.op}) is the constant "
                       f"{shown if len(shown) < 60 else shown[:57] + '...'}")
        return new._register(Node(new, n.name, "Const", None, (), {}, n.shape, n.dtype,
                                  n.device, n.location, value))

    result = _rebuild(graph, fetches, rewrite)
    result.changes = changes
    return result


# op -> (the neutral value, the argument positions where it is neutral)
NEUTRAL = {"mul": (1, (0, 1)), "add": (0, (0, 1)), "sub": (0, (1,)), "div": (1, (1,))}


def _is_constant(a: object, value: float) -> bool:
    """Whether ``a`` is the number ``value``, or a Const node all of whose elements are."""
    if isinstance(a, Node):
        return a.op == "Const" and bool((a.device.to_numpy(a.value) == value).all())
    return type(a) in (int, float) and a == value


def _neutral_operand(n: Node, args: tuple) -> Node | None:
    """The argument ``n`` merely passes on (``x`` in ``x * 1``), if there is one."""
    if n.op not in NEUTRAL or len(args) != 2:
        return None
    value, positions = NEUTRAL[n.op]
    for k in positions:
        other = args[1 - k]
        if _is_constant(args[k], value) and isinstance(other, Node) \
                and other.shape == n.shape and other.dtype == n.dtype:
            return other  # same shape and dtype: dropping the op changes nothing
    return None


def simplify(graph: Graph, fetches: Sequence[Node]) -> PassResult:
    """Drop the operations with a neutral operand: x * 1, x + 0, x - 0, x / 1."""
    changes: list[str] = []

    def rewrite(new: Graph, n: Node, args: tuple, control: tuple) -> Node:
        kept = None if control else _neutral_operand(n, args)
        if kept is None:
            return _copy(new, n, args, control)
        changes.append(f"simplify: {n.name} ({n.op}) is just {kept.name}")
        return kept

    result = _rebuild(graph, fetches, rewrite)
    result.changes = changes
    return result


def optimize(graph: Graph, fetches: Sequence[Node]) -> PassResult:
    """prune, cse, fold_constants, simplify; the mapping goes from the original graph.

    Every pass rebuilds only the nodes the fetches need, so the first rebuild (cse's)
    prunes too: pruning is reported here without a rebuild of its own (on a 10^5-node
    chain each rebuild takes seconds).
    """
    keep = needed(fetches)
    result = PassResult(graph, {id(n): n for n in graph.nodes if id(n) in keep},
                        [f"prune: removed {n.name} ({n.op})" for n in graph.nodes
                         if id(n) not in keep])
    current = list(fetches)
    for step in (cse, fold_constants, simplify):
        nxt = step(result.graph, current)
        result = PassResult(nxt.graph, {k: nxt.mapping[id(v)] for k, v in result.mapping.items()
                                        if id(v) in nxt.mapping}, result.changes + nxt.changes)
        current = [nxt.mapping[id(f)] for f in current]
    return result
