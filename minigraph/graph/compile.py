"""Compile a graph into Python source: symbolic programming's compile/exec [3.1.2].

``compile_graph(graph, inputs, outputs)`` writes a straight-line Python function, one
line per node in FIFO topological order, and turns it into code with ``compile`` and
``exec``. The text stays in ``fn.source``::

    def compiled(x, y):
        mul = k_mul(xp, x, y)       # x * y          (demo.py:3)
        sin = k_sin(xp, x)          # mg.sin(x)
        add = k_add(xp, mul, sin)
        return (add,)

Each line calls a primitive's kernel (``k_mul`` is the ``mul`` entry's ``impl``)
directly on arrays: no ``bind``, no tape, no Python objects per value. That is why a
compiled graph runs much faster than the same function executed eagerly: all the
decisions (which op, which device, which order) were taken once, at compile time.

One of those decisions is about memory. When an elementwise node reads a value for the
last time, and that value has the node's shape and dtype, the node can write its result
into the value's buffer instead of allocating a new one (TensorFlow's executor calls this
*forwarding* an input buffer). The line then calls the primitive's ``out`` kernel::

    add = ko_add(xp, matmul, b, out=matmul)  # in place: last use of matmul

A buffer is forwarded only if nothing else can see it: not an input (the caller's
array), not a constant or variable, not an output, and no view of it exists (no reader
is a primitive marked ``view``, a reshape, transpose ... that could share its memory);
see :func:`in_place_plan`.
"""

from __future__ import annotations

import keyword
import linecache
import weakref
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..device import Device
from ..tensor import Tensor
from .graph import Graph, GraphError, Node
from .topo import fifo_order, needed

if TYPE_CHECKING:  # (only for an annotation: signature imports the tape at run time)
    from ..autodiff.signature import Captured

_LITERALS = (int, float, bool, str, type(None))


def _literal(v: Any) -> bool:
    """Whether ``repr(v)`` reads back as ``v`` (then it is written into the source)."""
    if isinstance(v, _LITERALS):
        return True
    if isinstance(v, (tuple, list)):
        return all(_literal(x) for x in v)
    if isinstance(v, slice):
        return all(_literal(x) for x in (v.start, v.stop, v.step))
    return False


class _Namer:
    """Python identifiers for node names (``gradients/mul_1`` -> ``gradients_mul_1``)."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken)
        self.names: dict[int, str] = {}

    def __call__(self, node: Node) -> str:
        if id(node) not in self.names:
            base = "".join(c if c.isalnum() or c == "_" else "_" for c in node.name) or "v"
            if base[0].isdigit() or keyword.iskeyword(base):
                base = "v_" + base
            name, k = base, 1
            while name in self.taken:
                name, k = f"{base}_{k}", k + 1
            self.taken.add(name)
            self.names[id(node)] = name
        return self.names[id(node)]


class CompiledFunction:
    """A graph compiled to Python. Call it with tensors, arrays or numbers."""

    captured: Captured  # the tensors it read from outside (set by mg.trace's _compile)

    def __init__(self, source: str, fn: Any, inputs: list[Node], outputs: list[Node]):
        self.source = source
        self.raw = fn  # takes and returns device arrays
        self.inputs = inputs
        self.outputs = outputs
        # Per output: its device, and whether the caller must get a copy. A constant's
        # or variable's value is the graph's own buffer (a zero gradient, say), returned
        # by every call; an input returned as an output (the gradient of x * y with
        # respect to y is x) is the caller's array; two outputs over one buffer would be
        # two tensors that change together; a view (reshape, transpose ...) is its
        # argument's buffer, and a broadcast one cannot even be written. The caller gets
        # values of its own, never those, as the tape's gradients are.
        roots = [_buffer_of(n) for n in outputs]
        self.devices = [n.device for n in outputs]
        self.copies = [r is not n or r.op in _OWN or r.op == "Placeholder"
                       or any(r is q for q in roots[:k])
                       for k, (n, r) in enumerate(zip(outputs, roots))]
        self.copied = any(self.copies)

    def __call__(self, *args: Any) -> tuple[Tensor, ...]:
        if len(args) != len(self.inputs):
            raise TypeError(f"compiled function takes {len(self.inputs)} inputs "
                            f"({', '.join(n.name for n in self.inputs)}), got {len(args)}")
        return self.wrap(self.raw(*[_array(a, n) for a, n in zip(args, self.inputs)]))

    def wrap(self, values: Sequence[Any]) -> tuple[Tensor, ...]:
        """The raw function's results as the caller's tensors (copied where said above)."""
        if not self.copied:
            return tuple(map(Tensor, values, self.devices))
        return tuple([Tensor(own_copy(v, device) if copy else v, device)
                      for v, device, copy in zip(values, self.devices, self.copies)])

    def __repr__(self) -> str:
        return f"<CompiledFunction\n{self.source}>"


_OWN = ("Const", "Variable")  # nodes whose value lives on the graph itself


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


def _array(value: Any, node: Node) -> Any:
    """An argument as the compiled code takes it: an array on the input's device. No copy
    is made where none is needed: the compiled code never writes into its inputs."""
    if isinstance(value, Tensor):
        if value.device is node.device:
            return value.data
        return node.device.copy_from(value.data, value.device)
    return node.device.asarray(value, dtype=node.dtype)


def compile_graph(graph: Graph, inputs: Sequence[Node], outputs: Sequence[Node],
                  name: str = "compiled") -> CompiledFunction:
    """Python source computing ``outputs`` from ``inputs``, compiled with compile/exec."""
    inputs, outputs = list(inputs), list(outputs)
    fed = {id(n) for n in inputs}
    order = fifo_order(graph.nodes, needed(outputs, fed), fed)
    namespace: dict[str, Any] = {}
    namer = _Namer(set(_builtins()))
    lines: list[str] = []
    assigns: list[tuple[str, str]] = []  # (variable's holder, value) of each Assign
    params = [namer(n) for n in inputs]
    into = in_place_plan(order, fed, outputs)
    dead = last_uses(order, fed, outputs)
    for node in order:
        if id(node) not in fed:
            lines.append(_line(node, namer, namespace, assigns, into.get(id(node))))
            if id(node) in dead:
                lines.append(f"    del {', '.join(namer(n) for n in dead[id(node)])}  # last use")
    lines += [f"    {var}.value = {value}" for var, value in assigns]
    outs = ", ".join(namer(n) for n in outputs)
    lines.append(f"    return ({outs},)")
    source = f"def {name}({', '.join(params)}):\n" + "\n".join(lines) + "\n"
    fn = define(source, name, f"<minigraph compiled {name} {id(source):x}>", namespace)
    return CompiledFunction(source, fn, inputs, outputs)


def define(source: str, name: str, filename: str, namespace: dict) -> Any:
    """Execute generated ``source`` and return its function ``name``.

    The text goes into ``linecache`` under ``filename``, so that tracebacks and debuggers
    show the generated lines, and leaves it when the function is garbage-collected (a
    traced function compiles once per signature: the cache must not keep them all).
    """
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    fn = namespace[name]
    weakref.finalize(fn, linecache.cache.pop, filename, None)
    return fn


def _builtins() -> list[str]:
    return ["xp", "range", "len", "print"]


def _xp_name(device: Device, namespace: dict) -> str:
    name = "xp" if device.name == "cpu" else "xp_" + device.name.replace(":", "_")
    namespace[name] = device.xp
    return name


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


def _line(node: Node, namer: _Namer, namespace: dict, assigns: list,
          into: Node | None = None) -> str:
    target = namer(node)
    if node.op == "Placeholder":
        raise GraphError(f"compile: placeholder '{node.name}' is needed but is not an input")
    if node.op in ("Const", "Variable"):
        holder = f"node_{target}"
        namespace[holder] = node
        return f"    {target} = {holder}.value  # {node.op}"
    if node.op == "Assign":
        var, value = node.args
        holder = f"node_{namer(var)}"
        namespace[holder] = var
        assigns.append((holder, namer(value)))
        return f"    {target} = {namer(value)}  # Assign to {var.name}"
    assert node.prim is not None  # an operation (the special nodes returned above)
    kernel = f"k{'' if into is None else 'o'}_{node.prim.name}"
    namespace[kernel] = node.prim.impl if into is None else node.prim.out
    args = [namer(a) if isinstance(a, Node) else repr(a) for a in node.args]
    if into is not None:
        args.append(f"out={namer(into)}")
    for key, value in node.params.items():
        if _literal(value):
            args.append(f"{key}={value!r}")
        else:
            const = f"p_{target}_{key}"
            namespace[const] = value
            args.append(f"{key}={const}")
    where = "" if node.location is None else f"  # line {node.location[1]}"
    if into is not None:
        where += f"{'  #' if not where else ';'} in place: last use of {namer(into)}"
    return f"    {target} = {kernel}({_xp_name(node.device, namespace)}, {', '.join(args)}){where}"
