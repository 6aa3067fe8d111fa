"""Compile a graph into Python source: symbolic programming's compile/exec [3.1.2].

``compile_graph(graph, inputs, outputs)`` writes a straight-line Python function, one
line per node in FIFO topological order, and turns it into code with ``compile`` and
``exec``. The text stays in ``fn.source``::

    def compiled(x, y):
        sin = k_sin(xp, x)  # line 3
        mul = k_mul(xp, x, y)  # line 3
        add = k_add(xp, mul, sin)  # line 3
        return (add,)

Each line calls a primitive's kernel (``k_mul`` is the ``mul`` entry's ``impl``)
directly on arrays: no ``bind``, no tape, no Python objects per value. That is why a
compiled graph runs much faster than the same function executed eagerly: all the
decisions (which op, which device, which order) were taken once, at compile time. (The
comment is the line of the user's code that made the node.) The lines are written by
the code generator that source transformation uses too (``minigraph/codegen.py``);
what is decided here is the graph's part: the order, and the memory.

One of those decisions is about memory. When an elementwise node reads a value for the
last time, and that value has the node's shape and dtype, the node can write its result
into the value's buffer instead of allocating a new one (TensorFlow's executor calls this
*forwarding* an input buffer). The line then calls the primitive's ``out`` kernel::

    add = ko_add(xp, matmul, b, out=matmul)  # in place: last use of matmul

A buffer is forwarded only if nothing else can see it: not an input (the caller's
array), not a constant or variable, not an output, and no view of it exists (no reader
is a primitive marked ``view``, a reshape, transpose ... that could share its memory);
see :func:`in_place_plan`.

What the function does with state and failures is what a Session's run does: where it
reads or assigns a variable, it runs under the graph's state lock (a Session's runs take
it too, so concurrent calls and runs lose no update); an Assign's variable stores a copy
of the value, made after every line has run (so a failed call changes no variable, and
no array the caller holds, fed or returned, is the variable's); a kernel that fails
raises the Session's ``NodeError``, which names the node and the user's line that made
it (:func:`_naming_failures` finds it from the traceback).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..autodiff.backward import collector_paused
from ..codegen import Names, define
from ..device import Device
from ..tensor import Tensor
from .graph import (Graph, GraphError, Node, check_assigned, check_feedable, check_graph,
                    check_nodes, describe_location, fed_value, reads_across)
from .topo import fifo_order, needed, refuse_reads_after_assigns

if TYPE_CHECKING:  # (only for an annotation: signature imports the tape at run time)
    from ..autodiff.signature import Captured


class CompiledFunction:
    """A graph compiled to Python. Call it with tensors, arrays or numbers."""

    captured: Captured  # the tensors it read from outside (set by mg.trace's _compile)

    def __init__(self, source: str, fn: Any, inputs: list[Node], outputs: list[Node],
                 lines: dict[int, tuple[Node, list[str | None]]] | None = None,
                 single: bool = False):
        self.source = source
        self.raw = _naming_failures(fn, lines or {})  # takes and returns device arrays
        self.inputs = inputs
        self.outputs = outputs
        self.single = single  # compiled for one output node: a call returns its tensor
        # Per output: its device, and whether the caller must get a copy. A constant's
        # or variable's value is the graph's own buffer (a zero gradient, say), returned
        # by every call; an input returned as an output (the gradient of x * y with
        # respect to y is x) is the caller's array, whatever node the input is (a
        # placeholder, or an inner node fed as a Session.run feeds it); two outputs over
        # one buffer would be two tensors that change together; a view (reshape,
        # transpose ...) is its argument's buffer, and a broadcast one cannot even be
        # written. The caller gets values of its own, never those, as the tape's
        # gradients are.
        roots = [_buffer_of(n) for n in outputs]
        fed = {id(n) for n in inputs}
        self.devices = [n.device for n in outputs]
        self.copies = [r is not n or r.op in _OWN or id(r) in fed
                       or any(r is q for q in roots[:k])
                       for k, (n, r) in enumerate(zip(outputs, roots))]
        self.copied = any(self.copies)

    def __call__(self, *args: Any) -> Tensor | tuple[Tensor, ...]:
        if len(args) != len(self.inputs):
            raise TypeError(f"compiled function takes {len(self.inputs)} inputs "
                            f"({', '.join(n.name for n in self.inputs)}), got {len(args)}")
        # (each argument checked as a feed is: the code was written for the inputs' shapes
        # and dtypes, and a float cast to an int input would lose its fraction)
        results = self.wrap(self.raw(*[fed_value(n, a) for a, n in zip(args, self.inputs)]))
        return results[0] if self.single else results  # (as Session.run(y) gives y's value)

    def wrap(self, values: Sequence[Any]) -> tuple[Tensor, ...]:
        """The raw function's results as the caller's tensors (copied where said above)."""
        if not self.copied:
            return tuple(map(Tensor, values, self.devices))
        return tuple([Tensor(own_copy(v, device) if copy else v, device)
                      for v, device, copy in zip(values, self.devices, self.copies)])

    def __repr__(self) -> str:
        return f"<CompiledFunction\n{self.source}>"


_OWN = ("Const", "Variable")  # nodes whose value lives on the graph itself


def _naming_failures(fn: Any, lines: dict[int, tuple[Node, list[str | None]]]) -> Any:
    """``fn``, whose failure raises the error a Session's run raises (``NodeError``: the
    node, the shapes it read, the user's line that made it) instead of a kernel's bare
    error pointing into generated code. ``lines`` maps a line of the generated source to
    its node and the variables its arguments are in.

    One ``try`` around the whole call, none per line: a ``try`` that raises nothing
    costs nothing, and the failing line is found afterwards, from the traceback."""
    filename = fn.__code__.co_filename

    @functools.wraps(fn)  # (its name; ``run.__wrapped__`` is the generated function)
    def run(*arrays: Any) -> Any:
        try:
            return fn(*arrays)
        except Exception as exc:
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != filename:
                tb = tb.tb_next  # (down to the generated function's own frame)
            if tb is None or tb.tb_lineno not in lines:
                raise  # (not from a node's line: as it is)
            from ..runtime.scheduler import node_failure  # (runtime builds on graph)

            node, names = lines[tb.tb_lineno]
            local = tb.tb_frame.f_locals  # the arrays the failing line read
            read = [local[k] if k is not None else a for k, a in zip(names, node.args)]
            raise node_failure(node, read, exc) from exc

    return run


def _buffer_of(node: Node) -> Node | None:
    """The node whose buffer ``node``'s value may be: the argument of a view (identity,
    reshape, transpose, indexing ...) or the value an Assign stores, else itself; None
    for a view of a value written into the program (not a node)."""
    while True:
        if node.prim is not None and node.prim.view:
            source = node.args[0]
        elif node.op == "Assign":
            source = node.args[1]
        else:
            return node
        if not isinstance(source, Node):
            return None
        node = source


def own_copy(value: Any, device: Device) -> Any:
    """A copy of an array of ``device`` (a NumPy scalar, which cannot be written, as it is)."""
    if type(value) is np.ndarray:
        return value.copy()
    return value if isinstance(value, np.generic) else device.xp.asarray(value, copy=True)


def compile_graph(graph: Graph, inputs: Sequence[Node] | Node,
                  outputs: Sequence[Node] | Node, name: str = "compiled") -> CompiledFunction:
    """Python source computing ``outputs`` from ``inputs``, compiled with compile/exec.
    Each is a list of nodes or one node; the function returns a tuple of tensors, or,
    for one output node (not in a list), its tensor alone, as ``Session.run`` does.

    (With the cyclic garbage collector paused, as the passes and the reverse sweep pause
    it: the bookkeeping below makes a list or two per node while the whole graph is
    alive, and the collector's passes would walk that graph again and again; nothing
    here makes a reference cycle.)"""
    with collector_paused():
        return _compile_graph(graph, inputs, outputs, name)


def _compile_graph(graph: Graph, inputs: Sequence[Node] | Node,
                   outputs: Sequence[Node] | Node, name: str) -> CompiledFunction:
    check_graph(graph, "compile_graph")
    single = isinstance(outputs, Node)
    inputs = check_nodes(graph, inputs, "compile_graph", "input")
    outputs = check_nodes(graph, outputs, "compile_graph", "output")
    for n in inputs:  # (an input is fed at every call)
        check_feedable(n, "compile_graph")
    fed = {id(n) for n in inputs}
    if len(fed) < len(inputs):  # (two parameters of one name: Python refuses the def)
        twice = next(n for k, n in enumerate(inputs) if any(n is m for m in inputs[:k]))
        raise GraphError(f"compile_graph: input '{twice.name}' is given twice (created at "
                         f"{describe_location(twice.location)}); a node takes one value "
                         f"per call, so list it once")
    order = fifo_order(graph.nodes, needed(outputs, fed), fed)
    for n in order:  # (the inputs too: the order holds them)
        if n.device.remote:  # its kernels, and its variables' values, are another process's
            raise GraphError(f"compile_graph: node '{n.name}' ({n.op}) is on "
                             f"{n.device.name}, another process, which runs it and keeps its "
                             f"variables: a compiled function runs in this process only. Run "
                             f"the graph with Session.run on every rank")
    if any(n.op == "Assign" for n in order):  # (its assignments land at the end, as a run's)
        refuse_reads_after_assigns(order, "compile_graph")
    names = Names()
    # The function's own name first: the graph's or the traced function's, which may be
    # no identifier (``<lambda>``, ``checkpoint(f)``, anything a user set as __name__).
    name = names.identifier(name.replace("<lambda>", "lambda_"))
    # Every node's variable first (the user's names, where free), so that the names of
    # kernels and constants, given out while the lines are written, never hide one.
    local: dict[int, str] = {}
    for n in inputs + order:
        if id(n) not in local:  # (the order holds the inputs too)
            local[id(n)] = names.identifier(n.name)
    lines: list[str] = []
    at: dict[int, tuple[Node, list[str | None]]] = {}  # line of source -> its node (errors)
    assigns: list[tuple[str, str, str]] = []  # (variable's holder, value, device) per Assign
    into = in_place_plan(order, fed, outputs)
    dead = last_uses(order, fed, outputs)
    # A program that reads or assigns variables runs under the graph's state lock, as a
    # Session's run of the same nodes does: two threads that each read v and assign v + 1
    # would otherwise both read the old value, and one update would be lost. (Only there:
    # a program without state takes no lock, and runs in parallel with itself.)
    stateful = any(n.op in ("Variable", "Assign") for n in order)
    header = 2 if stateful else 1  # the source's lines before the nodes': def (and with)
    for node in order:
        if id(node) not in fed:
            lines.append(_line(node, local, names, assigns, into.get(id(node))))
            at[len(lines) + header] = (node, [local[id(a)] if isinstance(a, Node) else None
                                              for a in node.args])
            if id(node) in dead:
                freed = ", ".join(local[id(n)] for n in dead[id(node)])
                lines.append(f"    del {freed}  # last use")
    # The variable stores a copy of its own, as a Session's Assign does (scheduler's
    # _special): the value may be the caller's fed array, or a result handed to the
    # caller, who may write into either later; the variable must not change then.
    lines += [f"    {var}.value = {dev}.copy_from({value}, {dev})" for var, value, dev in assigns]
    outs = ", ".join(local[id(n)] for n in outputs)
    lines.append(f"    return ({outs},)" if outputs else "    return ()")
    if stateful:
        from ..runtime.session import _state_lock  # (the runtime builds on graph)

        lock = names.constant(_state_lock(graph), "state_lock")
        lines = [f"    with {lock}:  # variables: one run at a time"] + [
            "    " + line for line in lines]
    params = ", ".join(local[id(n)] for n in inputs)
    source = f"def {name}({params}):\n" + "\n".join(lines) + "\n"
    fn = define(source, name, f"<minigraph compiled {name} {id(source):x}>", names.namespace)
    return CompiledFunction(source, fn, inputs, outputs, at, single)


def in_place_plan(order: list[Node], fed: set[int], outputs: list[Node]) -> dict[int, Node]:
    """Which nodes write into the buffer of which argument: ``{id(node): argument}``.

    A node qualifies if it can run its ``out`` kernel (no dtype promotion: the runtime's
    :func:`~minigraph.runtime.memory.can_write_into`) on one of its own arguments (its
    primitive's ``in_place``), and has a non-scalar result. An argument's buffer can be
    taken if the argument was computed by a kernel here that returns fresh memory (not
    a primitive's ``view``), is read for the last time by this node, has the node's
    shape, dtype and device, is not an output, and no reader of it may alias it (a view
    would see the overwrite).
    """
    from ..runtime.memory import can_write_into  # (the runtime imports graph modules)

    position = {id(n): i for i, n in enumerate(order)}
    last_reader: dict[int, int] = {}
    aliased = {id(n) for n in outputs} | set(fed)
    for i, n in enumerate(order):
        for a in n.inputs:
            last_reader[id(a)] = i
            if n.prim is None or n.prim.view:  # (an Assign's target is its value, too)
                aliased.add(id(a))
    plan: dict[int, Node] = {}
    for n in order:
        # (can_write_into(n) checks that n.prim is not None; mypy cannot see into it)
        if id(n) in fed or not can_write_into(n) or not n.prim.in_place or n.shape == ():  # type: ignore[union-attr]
            continue
        for a in n.inputs:
            if (id(a) not in aliased and a.prim is not None and not a.prim.view
                    and last_reader[id(a)] == position[id(n)] and a.shape == n.shape
                    and a.dtype == n.dtype and a.device is n.device):
                plan[id(n)] = a
                aliased.add(id(a))  # (its buffer now belongs to n)
                break
    return plan


def last_uses(order: list[Node], fed: set[int], outputs: list[Node]) -> dict[int, list[Node]]:
    """``{id(node): the values it reads for the last time}``: the generated code deletes
    those variables after the node's line, so that Python frees an array as soon as
    nothing will read it again, not when the function returns (the peak of a training
    step falls by its largest activation). Not deleted: the inputs (the caller holds
    them anyway), the outputs, the values an Assign stores at the end, and scalars (a
    line to free eight bytes would only make the text longer)."""
    kept = set(fed) | {id(n) for n in outputs}
    kept |= {id(n) for n in order if n.shape == ()}
    kept |= {id(n.args[1]) for n in order if n.op == "Assign"}
    last: dict[int, Node] = {}  # id(value) -> the node that reads it last
    values: dict[int, Node] = {}
    for node in order:
        if id(node) not in fed:
            for a in node.inputs:
                last[id(a)], values[id(a)] = node, a
    dead: dict[int, list[Node]] = {}
    for k, reader in last.items():
        if k not in kept:
            dead.setdefault(id(reader), []).append(values[k])
    return dead


def _moved(arg: str, a: Node, node: Node, names: Names) -> str:
    """The argument ``a`` as ``node``'s kernel reads it: copied to node's device where it
    lives on another (an edge across devices, which a Session makes a Send and a Recv;
    a float given to a function goes with the tensors it meets), else as it is."""
    if not reads_across(node, a):
        return arg
    return f"{names.device(node.device)}.copy_from({arg}, {names.device(a.device)})"


def _line(node: Node, local: dict[int, str], names: Names, assigns: list,
          into: Node | None = None) -> str:
    """The line that computes ``node``: its kernel on its arguments' arrays (its ``out``
    kernel writing into ``into``'s buffer), or a constant's, a variable's value."""
    target = local[id(node)]
    if node.op == "Placeholder":
        raise GraphError(f"compile: placeholder '{node.name}' is needed but is not an input")
    if node.op in ("Const", "Variable"):
        return f"    {target} = {names.constant(node, 'node_' + target)}.value  # {node.op}"
    if node.op == "Assign":
        var, value = node.args
        assigns.append((names.constant(var, "node_" + local[id(var)]), local[id(value)],
                        names.device(node.device)))
        if value.shape is None or value.dtype is None:  # (checked now: see check_assigned)
            return (f"    {target} = {names.constant(check_assigned, 'check_assigned')}("
                    f"{names.constant(node, 'node_' + target)}, {local[id(value)]})"
                    f"  # Assign to {var.name}")
        return f"    {target} = {local[id(value)]}  # Assign to {var.name}"
    assert node.prim is not None  # an operation (the special nodes returned above)
    args = [(_moved(local[id(a)], a, node, names) if isinstance(a, Node)
             else names.literal(a, f"p_{target}_{k}")) for k, a in enumerate(node.args)]
    call = names.kernel_call(node.prim, args, node.params, names.xp(node.device),
                             None if into is None else local[id(into)], f"p_{target}_")
    where = "" if node.location is None else f"  # line {node.location[1]}"
    if into is not None:
        where += f"{'  #' if not where else ';'} in place: last use of {local[id(into)]}"
    return f"    {target} = {call}{where}"
