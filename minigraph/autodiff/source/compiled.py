"""The compiled program: the steps in order, for one input signature, give a ``Program``.

:func:`_transform` makes source variables of the arguments (:func:`_inputs`), normalises
the function (``normalize.py``) and writes its adjoint (``adjoint.py``); :func:`_finish`
tidies (``tidy.py``), writes the texts (``render.py``, assembled by :func:`_texts`) and
compiles them into a :class:`Program`. A straight-line program is also a graph
(:func:`_kernels`), which graph compilation turns into kernels on arrays; a program with
loops or run-time ifs, which no graph holds, is written again with kernel calls
(:class:`_LoopKernels`).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import re
import sys
from collections import Counter
from typing import Any, Callable, NamedTuple, cast

import numpy as np

from ...codegen import BUILTINS, LITERALS, Names, define
from ...device import Device, get_device
from ...errors import GradientError
from ...graph.compile import CompiledFunction, _naming_failures, compile_graph, own_copy
from ...graph.graph import Graph, Node
from ...ops.operators import caller_held
from ...ops.primitive import KINDS
from ...ops.weak import Weak, strong
from ...tensor import Tensor, tensor
from ..argnums import not_data, refuse_integers
from ..reads import recording
from ..signature import Captured, constant_arguments, is_weak
from .adjoint import _adjoint_of, _Reverse
from .normalize import _Normaliser
from .program import Fill, For, If, Line, Op, Ref, _uses, _walk, _Writer
from .reading import _refusal, _Source
from .render import _Text
from .tidy import _Namer, _const_name, _name_all, _program_vars, _prune, _tidy
from .values import Cond, Index, SrcVar, _constant, _parts, _writing


class Program:
    """One function's value-and-gradient program for one input signature.

    ``source`` is the text (``mg.`` calls) and ``fn`` its compiled function,
    ``forward_source`` the normalised primal (``primal`` compiles it on first use).
    ``kernels`` is the same program as a graph compiled to kernels on arrays
    (``graph/compile.py``), returning (value, *gradients), and ``gradient_kernels`` the
    gradients alone (a :class:`_LoopKernels` each for a program with loops or run-time
    ifs); both None where there is no such path (several devices, a GPU). A program for
    ``mg.vjp`` (``seeded``) takes one more parameter after f's, the output's adjoint
    ``gz``, where a gradient's starts from ``gz = 1``.
    """

    def __init__(self, signature: tuple, source: str, forward_source: str, fn: Callable,
                 single: bool, namespace: dict, name: str):
        self.signature, self.source, self.forward_source = signature, source, forward_source
        self.fn, self.single, self.namespace, self.name = fn, single, namespace, name
        self.captured = Captured(())  # the tensors it read from outside (set when built)
        self.kernels: CompiledFunction | _LoopKernels | None = None
        self.gradient_kernels: CompiledFunction | _LoopKernels | None = None

    @functools.cached_property
    def primal(self) -> Callable:
        """f's value alone, by the normalised primal's text: ``mg.vjp``'s value."""
        return define(self.forward_source, self.name, f"<source primal {self.name} "
                      f"{id(self.forward_source):x}>", dict(self.namespace))

    @property
    def raw(self) -> Callable | None:
        """The kernel function on arrays, returning (value, *gradients) as arrays."""
        return None if self.kernels is None else self.kernels.raw

    @property
    def raw_source(self) -> str | None:
        return None if self.kernels is None else self.kernels.source

    def __repr__(self) -> str:
        return f"<source_grad program\n{self.source}>"


class _LoopKernels:
    """A program with loops or run-time ifs as kernels on arrays: its text written with
    kernel calls (``render.py``), used as graph compilation's ``CompiledFunction`` is:
    ``raw`` takes the arrays and returns (value, *gradients), or the gradients alone with
    ``value=False``; ``wrap`` hands each over as a tensor of its own. Each is copied
    (no analysis of which array may be an input's, a constant's or another result's: a
    loop's results are scalars or small, and the copy costs less than the analysis)."""

    def __init__(self, source: str, fn: Callable, devices: list[Device], value: bool = True):
        self.source, self.devices = source, devices[1 - value:]
        self.raw = fn if value else lambda *arrays: fn(*arrays)[1:]

    def wrap(self, values: Any) -> tuple[Tensor, ...]:
        return tuple(Tensor(own_copy(v, d), d) for v, d in zip(values, self.devices))


def _transform(src: _Source, args: tuple, nums: tuple[int, ...], single: bool,
               signature: tuple, seeded: bool = False, who: str = "grad") -> Program:
    """Read, normalise, reverse, tidy and compile ``src`` for these arguments; ``seeded``:
    the program of a vjp, whose output may have any shape and whose reverse sweep starts
    from the output's adjoint passed in as one more parameter; ``who``: the function the
    user called (grad, value_and_grad, vjp ...), which errors name."""
    writer = _Writer(who)
    params = _program_params(list(inspect.signature(src.fn).parameters))
    saved, _writing.writer = _writing.writer, writer
    try:
        inputs, call_args = _inputs(src, args, nums, params, writer, signature, who)
        norm = _Normaliser(writer, taken={*params, *_GLOBALS})
        names = [p.name for p in inspect.signature(src.fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        norm.passed = {names[k]: what for k, what in
                       caller_held(args, nums, who).items()
                       if k < len(names)}
        constants = constant_arguments(args, signature)  # (a function passed: its reads)
        with recording(src.fn, "source_grad", constants) as run:
            out = _output(norm.call(src, call_args, {}), writer, src, who, scalar=not seeded)
        written_by_f = run.written_by_f  # (its own log of its runs: not guarded)
        forward = writer.block
        _prune(forward, {id(out)})  # (a value f computes and never uses sends no adjoint)
        writer.block, writer.role = [], "rtemp"
        reverse = _Reverse(writer)
        seed = _adjoint_of(out) if seeded else None
        grads = reverse.run(forward, out, inputs, seed)
        backward = writer.block
    finally:
        _writing.writer = saved
    runtime = [a for a in map(strong, call_args) if type(a) is SrcVar]  # (read at run time)
    return _finish(src, params, runtime, forward, backward, out, grads, reverse.pairs,
                   writer, single, signature, seed, written_by_f, norm.index_names,
                   norm.places, constants, reverse.origins)


# The names the program's text reads from its namespace, the builtins its literals call
# included (``float('inf')``: codegen.BUILTINS). A parameter of f named like one would
# hide it (``def grad_f(mg, x): a = mg.sin(x)``), and so would one starting with _, as
# the globals of the kernel text do (``_k_sin``, ``_xp``): such a parameter is renamed
# in the program (``mg_1``), which is called by position. (Loop indices likewise:
# normalize.py's ``index_name``.)
_GLOBALS = ("mg", "range", "reversed", *BUILTINS)


def _program_params(names: list[str]) -> list[str]:
    """f's parameter names as the program's: the user's, unless they would hide a global."""
    taken, params = set(names) | set(_GLOBALS), []
    for name in names:
        if name in _GLOBALS or name.startswith("_"):
            base = name.strip("_") or "arg"
            name = next(f"{base}_{k}" for k in itertools.count(1) if f"{base}_{k}" not in taken)
            taken.add(name)
        params.append(name)
    return params


def _inputs(src: _Source, args: tuple, nums: tuple, params: list[str],
            writer: _Writer, signature: tuple, who: str) -> tuple[list[SrcVar], tuple]:
    """Source variables for the run-time arguments (tensors, another transformation's
    values, and what :func:`_value` makes a tensor); other arguments stay Python values.
    A weak Python float (its signature says so) is f's as a ``Weak`` of its variable: it
    takes the dtype of the tensors it meets, as in eager mode (``ops/weak.py``)."""
    call_args: list = []
    for k, a in enumerate(args):
        value = _value(a, k in nums)
        if not isinstance(value, Tensor) and type(value) not in KINDS:
            if k in nums:
                raise not_data(a, k, who)
            call_args.append(a)
            continue
        dtype = str(value.dtype)
        if k in nums:
            refuse_integers(dtype, k, who)
        var = SrcVar(tuple(value.shape), dtype, value.device, k in nums, "input")
        var.name = params[k]
        call_args.append(Weak(var) if is_weak(signature[k]) else var)
    writer.where = src.where()
    # the gradients come in argnums' order: argnums=(1, 0) gives (d/dy, d/dx)
    return [call_args[k] for k in nums], tuple(call_args)


def _value(a: Any, differentiated: bool) -> Any:
    """An argument as the ``mg.`` program takes it: arrays and numbers to differentiate
    become tensors; other Python values are the program's own (built in). A weak number
    to differentiate is the tensor of its value, as eager mode makes one of a float."""
    if differentiated:
        a = strong(a)
    if isinstance(a, (np.ndarray, float, np.floating)) or \
            (differentiated and isinstance(a, (int, np.integer, np.bool_, list, tuple))):
        return tensor(a)
    return a


def _output(out: Any, writer: _Writer, src: _Source, who: str, scalar: bool = True
            ) -> SrcVar:
    """f's returned value as a variable of the program; a gradient's must be a scalar.
    ``who``: the function the user called, which errors name."""
    out = strong(out)
    if isinstance(out, Tensor):
        out = _constant(out)
    elif type(out) in (int, float):
        const = SrcVar((), "float64", get_device(None), False, "const")
        writer.emit((const,), Fill(float(out), const))
        out = const
    if type(out) in KINDS and type(out) not in (SrcVar, Index):
        # (a vmap's batched value, a tape's box, a jvp's dual number, a graph's node)
        raise _refusal(
            f"f returning a {type(out).__name__}, a value of a transformation around this one",
            src.where(), "f reads it from outside its arguments (a variable of the enclosing "
            "function, or one kept in a list, dict or object), and the program written "
            "from f cannot. Pass it to f as an argument, or use mode='tape', which runs f "
            "itself", who)
    if type(out) is not SrcVar:
        raise TypeError(f"{who}: f must return a tensor, got {type(out).__name__} "
                        f"[source_grad: {src.where()}]")
    if scalar and math.prod(out.shape) != 1:
        raise GradientError(f"{who}: f must return a scalar, it returned shape {out.shape}; "
                            f"use mg.jacrev for a vector output")
    return out


def _finish(src: _Source, params: list[str], runtime: list[SrcVar], forward: list,
            backward: list, out: SrcVar, grads: list[SrcVar], pairs: list, writer: _Writer,
            single: bool, signature: tuple, seed: SrcVar | None = None,
            written_by_f: frozenset[int] = frozenset(),
            indices: set[str] | frozenset[str] = frozenset(),
            places: dict[int, tuple[Line, tuple[str, int]]] | None = None,
            constants: tuple = (),
            origins: dict[int, tuple[Line, Line]] | None = None) -> Program:
    """Dead code, the stack, names, text, compile. A ``seed`` (a vjp's program) is the
    last parameter, after f's. ``written_by_f``: the lists and dicts f wrote while it
    was read (``reads.recording``), which the program does not guard. ``indices``: the
    names the loop indices were given (``normalize.py``), already in the text;
    ``places``: the user's line of each forward line (``_Normaliser.places``);
    ``constants``: f's constant arguments (``signature.constant_arguments``), whose
    reads the program guards as f's; ``origins``: the forward line whose VJP rule wrote
    each reverse line (``_Reverse.origins``)."""
    out = _tidy(forward, backward, out, grads, pairs)
    whole = forward + backward
    # (the name the def statement gives: the function's __name__ may be no identifier)
    name = f"{'vjp' if seed is not None else 'grad'}_{src.node.name}"
    # Every name the texts use is taken: the parameters, the globals, the stack, the
    # loop indices, and the names their def statements bind in the namespace (the
    # program's, the primal's), which a constant of that name would be replaced by.
    namer = _Namer(set(params) | {*_GLOBALS, "stack", "_stack", *indices, name,
                                  src.node.name}, writer.reserved)
    consts: dict[int, tuple[Any, str]] = {}
    _name_all(namer, forward, backward, out, consts, writer.hints, seed)
    _collect_consts(whole, namer, consts, writer.hints)
    if seed is not None:
        runtime = runtime + [seed]
    returned = [out] + grads
    loops = any(isinstance(s, (For, If)) for s in whole)
    source, primal, kernel_text = _texts(
        src.node.name, params, forward, backward, out, grads, single, consts, namer,
        [cast(str, v.name) for v in runtime] if loops else None, seed)
    namespace = {"mg": sys.modules["minigraph"]}
    namespace.update({cname: value for value, cname in consts.values()})
    fn = define(source, name, f"<source_grad {name} {id(source):x}>", namespace)
    prog = Program(signature, source, primal, fn, single, namespace, src.node.name)
    prog.captured = Captured((value for value, _ in consts.values()), src.fn, written_by_f,
                             constants)
    device = out.device  # kernels on arrays: one device, not a GPU (its own context)
    if device.context is None and all(v.device is device for v in
                                      runtime + list(_program_vars(whole))):
        # Where a kernel's failure says its line was written: the user's line of a
        # forward line, and of the forward line a reverse line differentiates (as graph
        # mode places a gradient node); f's def for the others (the stack's, the loops'
        # and the branches' adjoint bookkeeping)
        known, start = places or {}, (src.filename, src.node.lineno)
        made_by = origins or {}

        def where(line: Line) -> tuple[str, int]:
            line = made_by[id(line)][1] if id(line) in made_by else line
            return known[id(line)][1] if id(line) in known else start
        if not loops:
            prog.kernels, prog.gradient_kernels = _kernels(name, runtime, whole, returned,
                                                           where)
        else:
            assert kernel_text is not None  # (written for every program with loops)
            prog.kernels, prog.gradient_kernels = _loop_kernels(name, *kernel_text, consts,
                                                                returned, whole, where)
    return prog


def _collect_consts(block: list, namer: _Namer, consts: dict, hints: dict) -> None:
    """Name every non-literal value a line uses (tensors, arrays) as a constant."""
    for stmt in _walk(block):
        if isinstance(stmt, Line) and isinstance(stmt.expr, Op):
            for v in _parts((stmt.expr.args, tuple(stmt.expr.params.values()))):
                if not isinstance(v, (SrcVar, Index, Cond, Device)) and type(v) not in LITERALS \
                        and v is not Ellipsis:
                    _const_name(v, namer, consts, hints)


def _texts(name: str, params: list[str], forward: list, backward: list, out: SrcVar,
           grads: list[SrcVar], single: bool, consts: dict, namer: _Namer,
           kernel_params: list[str] | None, seed: SrcVar | None = None
           ) -> tuple[str, str, tuple[str, Names] | None]:
    """The program's text (``mg.`` calls) and the normalised primal's; with
    ``kernel_params`` (the arguments read at run time), also the program with kernel
    calls, taking those and returning (value, *gradients), and the names it binds. A
    ``seed`` is the program's last parameter (a vjp's: ``def vjp_f(x, y, gz)``)."""
    counts = Counter(id(v) for s in _walk(forward + backward) for v in _uses(s))
    for v in [out] + grads:
        counts[id(v)] += 1
    plan = _Text(consts, counts)  # which temporaries are written inline
    plan.block(backward, 1, inline=True)
    for v in _program_vars(backward):  # final names of the reverse temporaries left
        assert v.name is not None  # (_name_all named every variable of the program)
        if v.role == "rtemp" and v.name.startswith("_t") and id(v) not in plan.used:
            v.name = namer.fresh(None)
    stack = "_stack" if "stack" in namer.reserved else "stack"
    pushes = any(isinstance(s, Line) and s.kind == "push" for s in _walk(forward))
    names = cast("list[str]", [g.name for g in grads])  # (named by _name_all too)
    ret = names[0] if single else f"({', '.join(names)}{',' if len(names) == 1 else ''})"

    def program(text: _Text, params: list[str], ret: str) -> str:
        body = [f"    {stack} = []  # what the reverse sweep needs of each loop iteration"
                ] if pushes else []
        body.append("    # forward sweep: the evaluation trace (a.*), one primitive per line")
        body += text.block(forward, 1, inline=False)
        body.append("    # reverse sweep: the adjoint trace (g.*), in reverse order")
        body += text.block(backward, 1, inline=True)
        return _function(f"{prefix}_{name}", params, body, ret, consts)

    prefix, seeds = ("grad", []) if seed is None else ("vjp", [cast(str, seed.name)])
    source = program(_Text(consts, counts, plan.used, stack), params + seeds,
                     f"{out.name}, {ret}")
    primal = _Text(consts, counts, plan.used, stack=None)  # (it needs no stack)
    primal_source = _function(name, params, primal.block(forward, 1, inline=False),
                              cast(str, out.name), consts)
    if kernel_params is None:
        return source, primal_source, None
    text = _Text(consts, counts, plan.used, stack, kernels=True)
    kernels = program(text, kernel_params, f"{out.name}, {', '.join(names)}")
    return source, primal_source, (kernels, cast(Names, text.names))


def _function(name: str, params: list[str], body: list[str], ret: str, consts: dict) -> str:
    """``def name(params):``, a comment naming the constants, the body, ``return ret``."""
    shown = [f"{cname}: {value.shape} {value.dtype} on {value.device.name}"
             if isinstance(value, Tensor) else f"{cname}: {type(value).__name__}"
             for value, cname in consts.values()]
    if shown:
        body = ["    # constants, captured when this program was built: " + "; ".join(shown)
                ] + body
    return f"def {name}({', '.join(params)}):\n" + "\n".join(body + [f"    return {ret}"]) + "\n"


class _Failed(NamedTuple):
    """What a failure of a line of the kernel text names (``scheduler.node_failure``
    reads these of a graph node): the variable it assigns, its primitive, its arguments
    and the user's line that wrote it."""
    name: str
    op: str
    args: tuple
    location: tuple[str, int]


def _loop_kernels(name: str, source: str, names: Names, consts: dict, returned: list[SrcVar],
                  lines: list, where: Callable[[Line], tuple[str, int]]
                  ) -> tuple[_LoopKernels, _LoopKernels]:
    """A program with loops or run-time ifs as kernels on arrays: the text ``render.py``
    wrote with kernel calls, defined with the kernels, the device's array module and the
    constants' arrays; once for (value, *gradients) and once for the gradients alone.
    A kernel that fails raises the ``NodeError`` graph compilation's does, naming the
    variable its line assigns and the user's line (``where``) that wrote it."""
    namespace = {**names.namespace, "_xp": returned[0].device.xp}
    namespace.update({cname: value.data if isinstance(value, Tensor) else value
                      for value, cname in consts.values()})
    raw = define(source, name, f"<source_grad {name} kernels {id(source):x}>", namespace)
    # each line ``v = _k_div(...)`` of the text: the program's line of that variable and
    # primitive (a loop's variable is assigned on several lines), and the names of the
    # arguments it reads by name (not those written into it inline)
    kernels = {given: cast(tuple, key)[1] for key, given in names.given.items()
               if cast(tuple, key)[0] == "kernel"}  # (_k_div -> div)
    ops: dict[tuple[str | None, str], Line] = {}
    for s in _walk(lines):
        if isinstance(s, Line) and isinstance(s.expr, Op):
            ops.setdefault((s.targets[0].name, s.expr.prim.name), s)
    at: dict[int, tuple[Any, list[str | None]]] = {}
    for k, text in enumerate(source.splitlines(), 1):
        target, _, call = text.strip().partition(" = ")
        line = ops.get((target, kernels.get(call.split("(", 1)[0], "")))
        if line is not None:
            e = cast(Op, line.expr)
            read = [a.name if type(a) is SrcVar and re.search(rf"\b{a.name}\b", call)
                    else None for a in e.args]
            at[k] = (_Failed(cast(str, line.targets[0].name), e.prim.name, e.args,
                             where(line)), read)
    raw = _naming_failures(raw, cast("dict[int, tuple[Node, list[str | None]]]", at))
    devices = [v.device for v in returned]
    return _LoopKernels(source, raw, devices), _LoopKernels(source, raw, devices, value=False)


def _kernels(name: str, runtime: list[SrcVar], lines: list, returned: list[SrcVar],
             where: Callable[[Line], tuple[str, int]]
             ) -> tuple[CompiledFunction, CompiledFunction]:
    """A straight-line program as kernels on arrays: its lines as a graph
    (``minigraph/graph``) that graph compilation compiles, once for (value, *gradients)
    and once for the gradients alone (without the lines only the value needs), with what
    it does for every graph: buffers reused in place, arrays freed after their last use,
    results that are the caller's own."""
    device = returned[0].device
    graph, nodes = Graph(name), cast("dict[int, Any]", {})
    placed: list[tuple[Any, tuple[str, int]]] = []  # a line's node, the user's line

    def node(v: Any) -> Any:  # a variable's node; numbers, arrays as graph.add takes them
        if type(v) is SrcVar and id(v) not in nodes:  # a tensor f read: a constant
            nodes[id(v)] = graph.constant(v.value, name=v.name)
        return nodes[id(v)] if type(v) is SrcVar else v

    with device:
        for v in runtime:
            nodes[id(v)] = graph.add_special("Placeholder", (), v.shape, v.dtype, v.name)
        for line in lines:
            e, names = line.expr, [t.name for t in line.targets]
            if isinstance(e, Op):
                made = [graph.add(e.prim, tuple(map(node, e.args)), e.params, names[0])]
            elif isinstance(e, Ref):  # another name for the same node
                made = [node(v) for v in e.values]
            else:  # a Fill
                made = [graph.constant(Tensor(device.full(e.shape, e.value, e.dtype), device),
                                       name=names[0])]
            if not isinstance(e, Ref):  # (a node made here, for this line)
                placed.append((made[0], where(line)))
            nodes.update(zip(map(id, line.targets), made))
    for n in graph.nodes:  # (where it was built: not a line of f to write in a comment)
        n.location = None
    inputs, outputs = [nodes[id(v)] for v in runtime], [node(v) for v in returned]
    compiled = (compile_graph(graph, inputs, outputs, name),
                compile_graph(graph, inputs, outputs[1:], name))
    for n, at in placed:  # (once the texts are written: a kernel's failure names it)
        n.location = at
    return compiled
