"""The reverse-graph generation pass: ``mg.gradients(ys, xs)`` [3.1.3].

Instead of computing derivatives, this pass *adds nodes* to the graph that will compute
them when the graph runs, following TensorFlow's ``gradients`` algorithm:

1. Keep only the nodes on a path from some ``x`` to some ``y`` (reachable forwards from
   ``xs`` and backwards from ``ys``); nothing else can carry a derivative.
2. Count, for each of them, its consumers among those nodes (its *pending count*).
3. Start from the ``ys``, each with its seed (``grad_ys``, or ones: a non-scalar ``y``
   is seeded with ones, TensorFlow's convention).
4. Take a node whose consumers have all been expanded (pending count 0, kept in a
   queue); expanding it lowers the pending count of each of its inputs. This gives the
   order of the sweep: every node comes after all of its consumers.
5. Run the one reverse sweep (``autodiff/backward.py``, the loop the tape runs too) in
   that order: each node's contributions are added up (one ``AddN`` node when there
   are several), and its primitive's VJP rules run *on graph nodes*: the rules build
   the gradient nodes.

So the same VJP rules, and the same loop, that run on tensors in the tape build the
reverse graph here: there is no second set of derivative rules. The gradient nodes sit under the name
scope ``gradients/`` and on the device of the forward node they differentiate.
Because the result is an ordinary graph, running the pass again on it gives gradients
of gradients.
"""

from __future__ import annotations

import weakref
from collections import deque
from contextlib import contextmanager
from typing import Any, Iterator

from ..autodiff.backward import collector_paused, reverse_sweep
from ..autodiff.tape import as_gradient
from ..errors import DTypeError, GradientError, MinigraphError, ShapeError
from ..ops.copy import IDENTITY
from ..ops.elementwise import add_n
from ..ops.primitive import KINDS
from ..ops.shape_rules import FLOATS, shape_of
from .graph import Graph, GraphError, Node, at_user_line, check_nodes, user_location

def _as_list(v: Any) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _between(ys: list[Node], xs: list[Node]) -> tuple[dict[int, Node], dict[int, int]]:
    """Steps 1 and 2: the nodes on some path from an x to a y, by id, and each one's
    number of consumers among them, its pending count (iterative: no recursion)."""
    # Only the ys' ancestors can be on such a path: the consumers are looked for among
    # them, not in the whole graph (a pipeline differentiates each microbatch's stage in
    # one growing graph: a pass per microbatch over every node was time m^2)
    ancestors, stack = {}, list(ys)
    while stack:
        n = stack.pop()
        if id(n) not in ancestors:
            ancestors[id(n)] = n
            stack.extend(i for i in n.args if isinstance(i, Node))
    consumers: dict[int, list[Node]] = {}
    for n in ancestors.values():  # (``args``, not ``inputs``: see Node.__init__)
        for i in n.args:
            if isinstance(i, Node):
                consumers.setdefault(id(i), []).append(n)
    forward, stack = set(), list(xs)
    while stack:
        n = stack.pop()
        if id(n) not in forward:
            forward.add(id(n))
            stack.extend(consumers.get(id(n), ()))
    # backwards from the ys through what the xs reach: every edge walked is an edge
    # between two of the nodes kept, which is what the pending counts count (a number
    # among the arguments is never in ``forward``: its id is not a live node's)
    between: dict[int, Node] = {}
    pending: dict[int, int] = {}
    stack = [y for y in ys if id(y) in forward]
    while stack:
        n = stack.pop()
        if id(n) not in between:
            between[id(n)] = n
            for i in n.args:
                if id(i) in forward:
                    pending[id(i)] = pending.get(id(i), 0) + 1
                    stack.append(i)
    return between, pending


def _seed(y: Node, g: Any) -> Any:
    """The adjoint a y starts with: ``grad_ys`` or ones of y's shape. A ``grad_ys`` given as
    a number or an array becomes a constant of the graph (as a number it flowed through the
    rules as an eager value, and the gradient of ``sum(x)`` came back as a tensor, not a
    node)."""
    if isinstance(g, Node):
        return g
    if g is not None:
        with y.device:
            return y.graph.constant(g, dtype=y.dtype, name="grad_ys")
    import numpy as np  # a host constant, copied to y's device by mg.constant

    with y.device:
        return y.graph.constant(np.ones(y.shape, dtype=y.dtype), name="ones")


@contextmanager
def _made_at(node: Node) -> Iterator[None]:
    """The gradient nodes of ``node`` are made on its device and said to come from its
    line."""
    with node.device, node.graph.located(node.location):
        yield


def _entry(node: Node) -> tuple:
    """A node as an entry of the sweep: ``(primitive, params, output, args)``. An Assign's
    value is the value it stores, so its adjoint goes to that value, as through a copy
    (PyTorch's ``v.copy_(x)`` passes it on too); the variable's old value gets none."""
    if node.op == "Assign":
        return (IDENTITY, {}, node, node.args[1:])
    return (node.prim, node.params, node, node.args)


def gradients(ys: Any, xs: Any, grad_ys: Any = None) -> list[Node | None]:
    """Add the nodes of d(sum of ys)/d(x) for each x; ``None`` where no path leads."""
    ys, xs = _as_list(ys), _as_list(xs)
    grad_ys = _as_list(grad_ys) if grad_ys is not None else [None] * len(ys)
    # The pass adds several nodes per node of the graph, and makes no garbage that only
    # the cyclic collector could free; running the collector in between would walk the
    # whole graph again and again. (The sweep pauses it too; pausing it for the whole
    # pass, steps 1-4 included, saved a fifth of the time on a 10^4-link chain.)
    with collector_paused():
        try:  # what it refuses before it adds a node names the line of this call
            graph = _check(ys, xs, grad_ys)
            relevant, pending = _between(ys, xs)
            _refuse_unknown_shapes(relevant)
        except MinigraphError as exc:
            at_user_line(exc, user_location())
            raise
        return _gradients(graph, ys, xs, grad_ys, relevant, pending)


def _gradients(graph: Graph, ys: list[Node], xs: list[Node], grad_ys: list[Any],
               relevant: dict[int, Node], pending: dict[int, int]) -> list[Node | None]:
    """The pass itself (steps 3-5 of the module's docstring), given steps 1 and 2's
    ``relevant`` nodes and ``pending`` counts (``_between``)."""
    order = _sweep_order(ys, relevant, pending)
    wanted = {id(x) for x in xs}
    found: dict[int, Any] = {}  # an x that is also an intermediate node: its adjoint
    entries = [_entry(n) for n in reversed(order)
               if n.op == "Assign" or n.prim is not None and n.prim.differentiable]

    def keep(node: Node, g: Any) -> Any:
        if id(node) in wanted:
            found[id(node)] = g
        return g

    # (only an x that is an entry's output has its adjoint completed inside the sweep;
    # the usual xs, placeholders and variables, come back in the sweep's result)
    completed = keep if any(id(out) in wanted for _, _, out, _ in entries) else None
    floats = {k for k, n in relevant.items() if n.dtype in FLOATS}

    def takes_adjoint(a: Any) -> bool:  # (a number's id is never a live node's)
        return id(a) in floats

    # Each adjoint is added up, and its rules run, on its node's device. Where the
    # relevant nodes are all on one device, one scope around the sweep says the same as
    # a scope around each of its steps, which the sweep would enter and leave per node.
    devices = {id(n.device): n.device for n in relevant.values()}
    one_device = next(iter(devices.values())) if len(devices) == 1 else None
    # every gradient node is created by this call: its line is found once, not per node
    with graph.name_scope(_scope_name(graph)), graph.located(user_location()):
        seeds = []
        for y, g in zip(ys, grad_ys):
            if id(y) in relevant:
                with y.device:
                    seeds.append((y, _seed(y, g)))
        if graph.eager_placement:  # a function's program: each gradient node is made at
            # its forward node's line (a kernel error of the gradient then names the line
            # of f that made the op, where the caller's line says only "the first call")
            found.update(reverse_sweep(entries, seeds, takes_adjoint, total=add_n,
                                       completed=completed, scope=_made_at))
        elif one_device is not None:
            with one_device:
                found.update(reverse_sweep(entries, seeds, takes_adjoint, total=add_n,
                                           completed=completed))
        else:
            found.update(reverse_sweep(entries, seeds, takes_adjoint, total=add_n,
                                       completed=completed, scope=lambda n: n.device))
        # (in x's dtype: a float32 placeholder used in float64 arithmetic gets a cast node)
        return [None if id(x) not in found else as_gradient(found[id(x)], x) for x in xs]


def _refuse_unknown_shapes(relevant: dict[int, Node]) -> None:
    """Refuse, by name, a node on a path from an x to a y whose shape is known only when
    the graph runs (it depends on a placeholder of any shape): the VJP rules need the
    shapes when they build the gradient nodes, to sum a broadcast operand's adjoint back
    to its shape and to seed a y with ones. They failed inside with a bare TypeError,
    or, where both operands' shapes were unknown, summed nothing: the gradient of an x
    fed as (3,) came out in the broadcast shape (2, 3)."""
    unknown = next((n for n in relevant.values() if n.shape is None), None)
    if unknown is None:
        return
    # the placeholders of any shape it depends on
    sources: list[str] = []
    stack, seen = [unknown], set()
    while stack:
        n = stack.pop()
        if id(n) not in seen:
            seen.add(id(n))
            if n.op == "Placeholder" and n.shape is None:
                sources.append(f"'{n.name}'")
            stack.extend(a for a in n.args if isinstance(a, Node))
    raise GradientError(f"gradients: '{unknown.name}' ({unknown.op}) has an unknown shape, "
                        f"and the gradient rules need it; give the placeholders it depends "
                        f"on ({', '.join(sorted(sources))}) a shape")


def _sweep_order(ys: list[Node], relevant: dict[int, Node],
                 pending: dict[int, int]) -> list[Node]:
    """Steps 3 and 4: the relevant nodes, each after all of its consumers (``pending``
    counts them, and is used up)."""
    ready = deque(y for y in _unique(ys) if id(y) in relevant and pending.get(id(y), 0) == 0)
    order = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for a in node.args:
            if id(a) in relevant:
                pending[id(a)] -= 1
                if pending[id(a)] == 0:
                    ready.append(a)
    return order


def _scope_name(graph: Graph) -> str:
    """``gradients`` for the first pass, ``gradients_1``, ``gradients_2`` ... after it (as
    in TensorFlow), so the nodes of each pass can be told apart; inside a name scope
    (``model``) the numbers count that scope's passes: ``model/gradients``, then
    ``model/gradients_1``. (The scopes taken, every scope path of every node's name, are
    kept per graph and brought up to date with the nodes added since, and so is the
    next number per enclosing scope: a scan of every node per pass made m passes over a
    growing graph time m^2.)"""
    seen, taken, next_k = _SCOPES.get(graph, (0, set(), {}))
    for n in graph.nodes[seen:]:
        scopes = n.name.split("/")[:-1]  # model/gradients/mul: model, model/gradients
        taken.update("/".join(scopes[:i]) for i in range(1, len(scopes) + 1))
    prefix = graph._prefix  # the enclosing name scope: "model/" (or "" at the top)
    k = next_k.get(prefix, 1)
    name = "gradients" if k == 1 else f"gradients_{k - 1}"
    while prefix + name in taken:
        name, k = f"gradients_{k}", k + 1
    next_k[prefix] = k
    _SCOPES[graph] = (len(graph.nodes), taken, next_k)
    return name


_SCOPES: "weakref.WeakKeyDictionary[Graph, tuple[int, set[str], dict[str, int]]]" = \
    weakref.WeakKeyDictionary()


def _unique(nodes: list[Node]) -> list[Node]:
    seen, out = set(), []
    for n in nodes:
        if id(n) not in seen:
            seen.add(id(n))
            out.append(n)
    return out


def _check(ys: list, xs: list, grad_ys: list) -> Graph:
    if not ys:
        raise GradientError("gradients: no ys to differentiate (an empty list); give the "
                            "value(s) whose gradient you want")
    for v in ys + xs:
        if type(v) in KINDS and not isinstance(v, Node):  # (a transformation's value: a
            # batch of mg.vmap, a box of mg.grad ...)
            raise GraphError(f"gradients: expected graph nodes, got a {v._kind()}: "
                             f"mg.gradients differentiates a graph's nodes, not a "
                             f"transformation's values; differentiate inside the "
                             f"transformation instead (mg.vmap(mg.grad(f)) for "
                             f"per-example gradients)")
        if not isinstance(v, Node):  # (inside a graph already, if a node is given too)
            hint = ("differentiate a graph's nodes with respect to its nodes (a "
                    "placeholder, a variable), not a Python value"
                    if any(isinstance(u, Node) for u in ys + xs) else
                    "build the computation inside `with mg.Graph():`")
            raise GraphError(f"gradients: expected graph nodes, got {type(v).__name__}; "
                             f"{hint}")
    graph = ys[0].graph
    check_nodes(graph, ys + xs, "gradients", "node")  # (one of another graph: named, and where)
    for x in xs:  # (a derivative with respect to x perturbs x, as a feed of x replaces it)
        why = graph.unfeedable.get(id(x))
        if why is not None:
            raise GradientError(f"gradients: cannot differentiate with respect to '{x.name}' "
                                f"({x.op}) in graph {graph.name!r}, which a pass rewrote "
                                f"(graph/passes.py): it cannot be fed, and a derivative "
                                f"with respect to it would be as wrong: {why}. "
                                f"Differentiate in the original graph")
    if len(grad_ys) != len(ys):
        raise GradientError(f"gradients: {len(ys)} ys but {len(grad_ys)} grad_ys")
    for y in ys:
        if y.dtype is not None and y.dtype not in FLOATS:
            raise GradientError(f"gradients: '{y.name}' has dtype {y.dtype}; only floating "
                                f"values have gradients")
    for x in xs:  # (the sweep gives no adjoint to an integer: None, read as "no path")
        if x.dtype is not None and x.dtype not in FLOATS:
            raise DTypeError(f"gradients: cannot differentiate with respect to '{x.name}' "
                             f"({x.op}) of dtype {x.dtype}: a derivative by an integer or "
                             f"a bool is not defined; give it a floating dtype "
                             f"({' or '.join(FLOATS)})")
    for k, (y, g) in enumerate(zip(ys, grad_ys)):  # (TensorFlow's and PyTorch's rule)
        if isinstance(g, Node) and g.shape is None:  # (see _refuse_unknown_shapes)
            raise GradientError(f"gradients: grad_ys[{k}] '{g.name}' has an unknown shape, "
                                f"and the gradient rules need it; give it the shape of "
                                f"'{y.name}'{'' if y.shape is None else ', ' + str(y.shape)}")
        if g is not None and y.shape is not None and shape_of(g) is not None \
                and tuple(shape_of(g)) != tuple(y.shape):
            raise ShapeError(f"gradients: grad_ys[{k}] has shape {tuple(shape_of(g))}, but "
                             f"'{y.name}' has shape {y.shape}: a y's starting adjoint has "
                             f"its shape")
    return graph
