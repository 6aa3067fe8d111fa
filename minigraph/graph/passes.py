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
* ``simplify``: ``x * 1``, ``x + -0.0``, ``x - 0``, ``x / 1`` and ``x ** 1`` are ``x`` (each
  primitive's table entry says which number is ``neutral`` where; the reverse-graph pass
  leaves many: it seeds a scalar output's adjoint with ones). Where ``x`` is a
  placeholder or a variable, ``y = x * 1`` becomes ``identity(x)``, a view, so that ``y``
  stays a node of its own: fed, or differentiated with respect to, it means what it did.

``optimize`` does the four in one walk over the graph, then prunes what the folds and
drops left unread.

The mapping serves fetches, and feeds of placeholders. A feed of another node (TF1 feeds
any node: a constant, an intermediate) stands in for it only where the pass left it and
its readers as they were: a constant folded into its readers would be ignored, and a node
merged with another would reach the readers of both. The new graph lists such nodes
(``Graph.unfeedable``, with those of its input graph where that was a pass's too), and
Session.run and compile_graph refuse to feed them, saying why, and mg.gradients to
differentiate with respect to them (a derivative perturbs a node as a feed replaces it).
(TF1's Grappler is told the feeds and keeps them; these passes run before any feed is
known.)

A variable is not copied: the new graph's Variable node is a :class:`SharedVariable`,
whose value *is* the original's, so that training through one graph is seen by the
other (TensorFlow's Grappler rewrites a graph the same way: the variable, a resource,
stays one). Sessions of the two graphs take one lock for that state.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from ..autodiff.backward import collector_paused
from ..autodiff.tape import NO_PARAMS
from ..device import Device
from ..ops.copy import IDENTITY
from ..ops.primitive import register_kind
from .graph import Graph, GraphError, Node, check_nodes, describe_location, reads_across
from .topo import fifo_order, needed


@dataclass
class PassResult:
    graph: Graph
    mapping: dict[int, Node]  # id(old node) -> new node
    changes: list[str] = field(default_factory=list)
    source: Graph | None = None  # the pass's input graph, which ``mapping`` maps from
    # why a node of ``source`` that the pass read has no node here (optimize: nothing
    # fetched needs it once its readers were folded or dropped), by id
    removed: dict[int, str] = field(default_factory=dict)
    # how many nodes ``source`` had when the pass ran: a node added later is none the
    # pass read (a graph only grows, so those it read are among the first ``known``)
    known: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.known = 0 if self.source is None else len(self.source.nodes)

    def __getitem__(self, old: Node) -> Node:
        """The new node standing for ``old``; an error that says why there is none (it
        was a bare KeyError of the node's id)."""
        new = self.mapping.get(id(old))
        if new is not None:
            return new
        if not isinstance(old, Node):
            raise GraphError(f"PassResult[...]: expects a node of the pass's input graph, "
                             f"got a {type(old).__name__}")
        if self.source is not None and old.graph is self.source:
            if not any(n is old for n in self.source.nodes[:self.known]):
                raise GraphError(f"PassResult[...]: node '{old.name}' ({old.op}) was created "
                                 f"after the pass ran (at {describe_location(old.location)}), "
                                 f"so the pass's graph has no node for it. Run the pass "
                                 f"again on graph {self.source.name!r}")
            why = self.removed.get(id(old), "nothing fetched when the pass ran needs it")
            raise GraphError(f"PassResult[...]: node '{old.name}' ({old.op}) was pruned: "
                             f"{why}, so the new graph has no node for it. Run the pass "
                             f"with it among the fetches")
        source = "" if self.source is None else f" ({self.source.name!r})"
        raise GraphError(f"PassResult[...]: node '{old.name}' ({old.op}) has no node in the "
                         f"pass's graph: it is not a node of the pass's input graph{source} "
                         f"(it is of graph {old.graph.name!r}, created at "
                         f"{describe_location(old.location)})"
                         + ("" if self.source is not None else
                            ", or the pass pruned it: nothing fetched needed it"))

    def __str__(self) -> str:
        return "\n".join(self.changes) if self.changes else "(no change)"


def copy_node(new: Graph, n: Node, args: tuple, control: tuple = (),
              device: Device | None = None) -> Node:
    """A copy of ``n`` in graph ``new``, reading the (new) arguments ``args`` (on
    ``device``, if given: auto_place's choice); a Variable's copy shares its state."""
    device = n.device if device is None else device
    if n.op == "Variable":
        copy: Node = SharedVariable(new, n, device, control)
    else:
        copy = Node(new, n.name, n.op, n.prim, args, n.params, n.shape, n.dtype, device,
                    n.location, n.value, control)
    carry_unfeedable(new, n, copy)
    return new._register(copy)


def carry_unfeedable(new: Graph, n: Node, replacement: Node) -> None:
    """Why ``n``, a node of a pass's input graph, could not be fed (if it could not: that
    graph was itself a pass's), said of its ``replacement`` in ``new``: a value fed there
    would be as wrong as one fed to ``n``. Without it, a second pass (prune of
    optimize's graph) took such a feed, and it reached the readers of both nodes that
    optimize had merged."""
    why = n.graph.unfeedable.get(id(n))
    if why is not None:
        new.unfeedable.setdefault(id(replacement), why)


class SharedVariable(Node):
    """A pass's copy of a Variable that holds no state of its own: reading or writing its
    ``value`` reads or writes the original's. A copy that held the value it had when the
    pass ran would fork the model: an Assign run through the optimised graph would leave
    the user's graph stale, and the other way round."""

    __slots__ = ("original",)

    def __init__(self, graph: Graph, original: Node, device: Device, control: tuple = ()):
        # the first Variable, not a copy of it (auto_place, then optimize: one state)
        self.original: Node = original.original if isinstance(original, SharedVariable) \
            else original
        # (Node.__init__ stores the value it is given: the original's, stored back)
        super().__init__(graph, original.name, "Variable", None, (), original.params,
                         original.shape, original.dtype, device, original.location,
                         self.original.value, control)
        _share_state_lock(graph, self.original.graph)

    @property
    def value(self) -> Any:
        return self.original.value

    @value.setter
    def value(self, value: Any) -> None:
        self.original.value = value


register_kind(SharedVariable)  # (bind picks an interpreter by exact type: a node's)


def _share_state_lock(new: Graph, graph: Graph) -> None:
    """Runs of ``new`` take ``graph``'s state lock: they read and write its variables."""
    from ..runtime.session import share_state_lock  # (the runtime builds on graph)

    share_state_lock(new, graph)


# A rewrite gives a node's replacement in the new graph (an earlier node, a constant), or
# None to leave it as it is (then it is copied).
Rewrite = Callable[[Graph, Node, tuple, tuple], "Node | None"]


def _rebuild(graph: Graph, fetches: Sequence[Node], rewrites: Sequence[Rewrite],
             keep: set[int] | None = None) -> PassResult:
    """Visit the nodes the fetches need (``keep``, if the caller has found them), in
    topological order, and give each one's replacement in a new graph: the first rewrite
    that has one, else a copy."""
    fetches = check_nodes(graph, fetches, "passes")
    with collector_paused():  # a copy of the graph, garbage-free: see _walk
        return _walk(graph, fetches, rewrites, keep)


def _walk(graph: Graph, fetches: Sequence[Node], rewrites: Sequence[Rewrite],
          keep: set[int] | None) -> PassResult:
    """The loop of :func:`_rebuild`. It makes a node per node of the graph and no garbage
    that only the cyclic collector could free, so the collector is paused meanwhile: it
    would walk the whole growing graph again and again."""
    new = Graph(graph.name)
    mapping: dict[int, Node] = {}
    for n in fifo_order(graph.nodes, needed(fetches) if keep is None else keep):
        args = tuple([mapping[id(a)] if isinstance(a, Node) else a for a in n.args])
        control = tuple([mapping[id(c)] for c in n.control_inputs])
        for rewrite in rewrites:
            replacement = rewrite(new, n, args, control)
            if replacement is not None:
                carry_unfeedable(new, n, replacement)  # (a copy carries it itself)
                break
        else:
            replacement = copy_node(new, n, args, control)
        mapping[id(n)] = replacement
    return PassResult(new, mapping, source=graph)


def prune(graph: Graph, fetches: Sequence[Node]) -> PassResult:
    """Keep only the nodes ``fetches`` depend on."""
    result = _rebuild(graph, fetches, ())
    result.changes = [f"prune: removed {n.name} ({n.op})" for n in graph.nodes
                      if id(n) not in result.mapping]
    return result


def _key(n: Node, args: tuple) -> tuple | None:
    """What makes two nodes compute the same value; None for nodes never merged."""
    if n.prim is None:
        return None  # placeholders, constants, variables and assignments stay distinct
    params = tuple(sorted((k, value_key(v)) for k, v in n.params.items())) if n.params else ()
    return (n.op, n.device.name, params,
            tuple([("node", id(a)) if isinstance(a, Node) else value_key(a) for a in args]))


def value_key(v: object) -> Hashable:
    """A key equal for two parameters exactly when they are the same value of the same type.

    Neither ``repr`` nor ``==`` will do: NumPy elides a large array's ``repr`` to "...",
    so two different arrays print alike; and ``1 == 1.0 == True`` and ``0.0 == -0.0``,
    yet ``x ** 1`` and ``x ** 1.0`` have different dtypes and ``1 / -0.0`` is ``-inf``.
    So a float is keyed by its bits (the sign of zero, and a NaN's sign and payload:
    ``x * -nan`` is ``-nan``; ``float.hex`` wrote ``nan`` for them all), an array by its
    dtype, shape and bytes, and a value of a type this function does not know by its
    identity: such nodes merge only if they share the very object, which is never wrong.
    """
    if v is None or isinstance(v, (bool, int, str, bytes)):
        return type(v), v  # (bool before int would not matter: the type is in the key)
    if isinstance(v, float):
        return float, struct.pack("<d", v)
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
    return _run_pass(graph, fetches, _merging)


def _merging(changes: list[str]) -> Rewrite:
    """cse's rewrite: a node whose key was seen is the node seen; a new one is copied,
    under its key."""
    seen: dict[tuple, Node] = {}

    def rewrite(new: Graph, n: Node, args: tuple, control: tuple) -> Node:
        key = None if control else _key(n, args)  # ordered nodes are never merged
        if key is not None and key in seen:
            changes.append(f"cse: {n.name} computes the same as {seen[key].name}")
            new.unfeedable[id(seen[key])] = (
                f"it stands for '{n.name}' too (the same computation, merged by cse), so a "
                f"value fed here would reach the readers of both")
            return seen[key]
        copy = copy_node(new, n, args, control)
        if key is not None:
            seen[key] = copy
        return copy

    return rewrite


def _run_pass(graph: Graph, fetches: Sequence[Node],
              *passes: Callable[[list[str]], Rewrite], keep: set[int] | None = None
              ) -> PassResult:
    """One walk over the graph with the rewrites of ``passes``, their changes reported."""
    changes: list[str] = []
    result = _rebuild(graph, fetches, [make(changes) for make in passes], keep)
    result.changes = changes
    return result


def fold_constants(graph: Graph, fetches: Sequence[Node]) -> PassResult:
    """Compute now every node whose inputs are all constants; it becomes a Const."""
    return _run_pass(graph, fetches, _folding)


def _folding(changes: list[str]) -> Rewrite:
    from ..runtime.scheduler import NodeError, Step, compute

    def rewrite(new: Graph, n: Node, args: tuple, control: tuple) -> Node | None:
        if n.prim is None or control:
            return None
        nodes = []
        for a in args:
            if isinstance(a, Node):
                if a.op != "Const":
                    return None  # (most nodes: the first input is not a constant)
                nodes.append(a)
        if not nodes:
            return None
        probe = Step(Node(new, n.name, n.op, n.prim, args, n.params, n.shape, n.dtype,
                          n.device, n.location))
        # A constant on another device is read as a run reads it: a transfer's kernel
        # (x.to(device)) copies it itself; for any other node the partition's Send/Recv
        # would bring it over, and so does the copy here. (Step's refusal of such a
        # read is for a plan run without partitioning, which this is not.)
        probe.foreign = None
        values = {id(a): a.value if not reads_across(n, a)
                  else n.device.copy_sent(a.value, a.device) for a in nodes}
        try:  # (a fold that signals, 1 / 0, is left to the run, and to the run's errstate)
            with np.errstate(all="raise"):
                value = compute(probe, values, [], [])
        except NodeError as exc:
            if isinstance(exc.__cause__, FloatingPointError):
                return None
            raise
        for a in nodes:
            new.unfeedable[id(a)] = (f"its value was folded into '{n.name}' "
                                     f"(fold_constants), which would not read a value fed here")
        changes.append(f"fold_constants: {n.name} ({n.op}) is the constant "
                       f"{_shown(n.device.to_numpy(value))}")
        return new._register(Node(new, n.name, "Const", None, (), NO_PARAMS, n.shape, n.dtype,
                                  n.device, n.location, value))

    return rewrite


def _shown(value: Any) -> str:
    """A folded value as a change line shows it: in full if short, else its dtype, shape
    and first items. (A repr of the whole array, cut to one line afterwards, took seconds
    for a 2000x2000 fold.)"""
    array = np.asarray(value)
    if array.size > 8:
        first = ", ".join(repr(v) for v in array.flat[:4].tolist())
        return f"{array.dtype}{list(array.shape)} [{first}, ...]"
    shown = repr(array.tolist())
    return shown if len(shown) < 60 else shown[:57] + "..."


def _neutral_operand(n: Node, args: tuple) -> Node | None:
    """The argument ``n`` merely passes on (``x`` in ``x * 1``), if there is one: the
    primitive's table entry says which number is ``neutral`` where."""
    if n.prim is None or n.prim.neutral is None or len(args) != 2:
        return None
    for k in n.prim.neutral[1]:
        other, unit = args[1 - k], args[k]
        if isinstance(unit, Node):  # a Const node: its array
            if unit.op != "Const":
                continue
            unit = unit.device.to_numpy(unit.value)
        if n.prim.is_neutral(unit, k) and isinstance(other, Node) and other.shape == \
                n.shape and other.dtype == n.dtype and other.device is n.device:
            return other  # same shape, dtype and device: dropping the op changes nothing
    return None


def simplify(graph: Graph, fetches: Sequence[Node]) -> PassResult:
    """Drop the operations with a neutral operand: x * 1, x + -0.0, x - 0, x / 1, x ** 1."""
    return _run_pass(graph, fetches, _simplifying)


def _simplifying(changes: list[str], identities: bool = True) -> Rewrite:
    """``identities``: see :func:`optimize`."""
    def rewrite(new: Graph, n: Node, args: tuple, control: tuple) -> Node | None:
        kept = None if control else _neutral_operand(n, args)
        if kept is not None:
            # (what is fed, and trained)
            source = identities and kept.op in ("Placeholder", "Variable")
            changes.append(f"simplify: {n.name} ({n.op}) is just {kept.name}"
                           + (" (an identity of it)" if source else ""))
            unit = args[1] if args[0] is kept else args[0]
            if isinstance(unit, Node):  # (a Const: its value decided the drop)
                new.unfeedable[id(unit)] = (
                    f"'{n.name}' read it as a neutral operand and was dropped (simplify), "
                    f"so it would not read a value fed here")
            if source:
                # y = x * 1 becomes identity(x), a view: y standing for x itself, a feed of
                # y reached the readers of x too, and x must stay feedable (a placeholder)
                # and differentiable (a variable): marked, it was neither
                return new._register(Node(new, n.name, IDENTITY.name, IDENTITY, (kept,),
                                          NO_PARAMS, n.shape, n.dtype, n.device, n.location))
            if kept.op != "Placeholder":  # (identities=False: fed, a placeholder gives
                new.unfeedable[id(kept)] = (  # y = x * 1 its value in both graphs)
                    f"it stands for '{n.name}' too ({n.op} with a neutral operand, dropped "
                    f"by simplify), so a value fed here would reach the readers of both")
        return kept

    return rewrite


def optimize(graph: Graph, fetches: Sequence[Node], identities: bool = True) -> PassResult:
    """prune, cse, fold_constants, simplify; the mapping goes from the original graph.

    One walk does all four: it visits only the nodes the fetches need (that is the
    pruning), and each node, its inputs already rewritten, is folded if its inputs are
    constants, else dropped if it has a neutral operand, else merged with an earlier
    node that computes the same, else copied. A pass after the other would copy the
    graph once each (on a 10^5-node chain each copy takes seconds), and a fold that
    makes a constant ``1`` would wait for the next pass to simplify the ``x * 1``
    reading it. What the walk copied before its readers were folded or dropped (their
    constant operands) is pruned afterwards: see _drop_dead.

    ``identities=False``: a node that simplifies to a placeholder or a variable is that
    node itself, not an identity of it (see simplify), for a graph that only its fetches
    are read from, with no feed or derivative of another node (``mg.trace``'s and graph
    mode's programs): the identity would be a kernel call on every run.
    """
    fetches = check_nodes(graph, fetches, "optimize")
    keep = needed(fetches)
    pruned = [f"prune: removed {n.name} ({n.op})" for n in graph.nodes if id(n) not in keep]
    simplifying = _simplifying if identities else functools.partial(_simplifying,
                                                                      identities=False)
    result = _run_pass(graph, fetches, _folding, simplifying, _merging, keep=keep)
    result.changes = pruned + result.changes
    return _drop_dead(result, fetches)


def _drop_dead(result: PassResult, fetches: Sequence[Node]) -> PassResult:
    """``result`` without the nodes no fetch needs: the walk copies a node before it meets
    its readers, so the constants a fold read, and the unit of a dropped ``x * 1``, stay
    in its graph (a chain of folds kept each intermediate array). They are taken out of
    the pass's own new graph, which no one else holds yet (a second copy of the graph,
    by prune, took as long as the walk on a 10^5-node chain); the mapping goes on from
    ``result.source``, and a node that goes is said to, and why."""
    walked = result.graph
    live = needed([result.mapping[id(f)] for f in fetches])
    if len(live) == len(walked.nodes):
        return result  # (nothing is dead)
    dead = {id(n) for n in walked.nodes} - live
    walked._drop(dead)
    assert result.source is not None  # (set by _walk)
    mapping: dict[int, Node] = {}
    removed: dict[int, str] = {}
    for old in result.source.nodes:
        now = result.mapping.get(id(old))
        if now is None:
            continue  # (pruned before the walk: said already)
        if id(now) not in dead:
            mapping[id(old)] = now
        else:
            removed[id(old)] = "nothing fetched needs it once its readers were folded or dropped"
            result.changes.append(f"prune: removed {old.name} ({old.op}), read only by what "
                                  f"was folded or dropped")
    return PassResult(walked, mapping, result.changes, result.source, removed)
