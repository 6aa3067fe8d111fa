"""The compiled program: the steps in order, for one input signature, give a ``Program``.

:func:`_transform` makes source variables of the arguments (:func:`_inputs`), normalises
the function (``normalize.py``) and writes its adjoint (``adjoint.py``); :func:`_finish`
tidies (``tidy.py``), writes the texts (``render.py``, assembled by :func:`_texts`) and
compiles them (:func:`_build_program`) into a :class:`Program`.
"""

from __future__ import annotations

import ast
import inspect
import math
import sys
from collections import Counter
from typing import Any, Callable, cast

import numpy as np

from ...device import Device, get_device
from ...errors import DTypeError, GradientError
from ...codegen import define
from ...ops.primitive import KINDS
from ...tensor import FLOAT_DTYPES, Tensor, tensor
from ..signature import Captured
from .adjoint import _Reverse
from .normalize import _Normaliser
from .program import Fill, For, If, Line, Op, Ref, _uses, _vars, _walk, _Writer
from .reading import _Source
from .render import _LITERALS, _Text
from .tidy import _Namer, _const_name, _insert_stack, _name_all, _program_vars, _prune
from .values import Index, SrcVar, _parts, _writing


class Program:
    """One function's value-and-gradient program for one input signature.

    ``source`` is the text (``mg.`` calls), ``forward_source`` the normalised primal,
    ``raw_source`` the same program calling kernels on arrays; ``fn`` and ``raw`` are
    their compiled functions.
    """

    def __init__(self, signature: tuple, source: str, forward_source: str, fn: Callable,
                 raw_source: str | None, raw: Callable | None, out: SrcVar,
                 grads: list[SrcVar], single: bool):
        self.signature, self.source, self.forward_source = signature, source, forward_source
        self.fn, self.raw_source, self.raw = fn, raw_source, raw
        self.captured = Captured(())  # the tensors it read from outside (set when built)
        self.out_device = out.device
        self.grad_devices = [g.device for g in grads]
        self.single = single
        # Which of (value, *gradients) the raw variant returns over memory that is not
        # this call's own (set when built, see _copies): copied for the caller. None
        # where there is none (the common case: nothing to look at per call).
        self.copies: list[bool] | None = None
        # The kernel variant of the gradients alone (mg.grad), for straight-line
        # programs: without the lines only f's value needs. (None: run ``raw``.)
        self.raw_gradients: Callable | None = None
        self.raw_gradients_source: str | None = None
        self.gradient_copies: list[bool] | None = None  # (for (None, *gradients))

    def __repr__(self) -> str:
        return f"<source_grad program\n{self.source}>"


def _compile(source: str, name: str, namespace: dict) -> Callable:
    return define(source, name, f"<source_grad {name} {id(source):x}>", namespace)


def _transform(src: _Source, args: tuple, nums: tuple[int, ...], single: bool,
               signature: tuple) -> Program:
    """Read, normalise, reverse, tidy and compile ``src`` for these arguments."""
    writer = _Writer()
    params = list(inspect.signature(src.fn).parameters)
    saved, _writing.writer = _writing.writer, writer
    try:
        inputs, call_args = _inputs(src, args, nums, params, writer)
        norm = _Normaliser(writer)
        out = _output(norm.call(src, call_args, {}), writer, src)
        forward = writer.block
        writer.block, writer.role = [], "rtemp"
        reverse = _Reverse(writer)
        grads = reverse.run(forward, out, inputs)
        backward = writer.block
    finally:
        _writing.writer = saved
    return _finish(src, params, forward, backward, out, grads, reverse.pairs, writer,
                   single, signature)


def _inputs(src: _Source, args: tuple, nums: tuple, params: list[str],
            writer: _Writer) -> tuple[list[SrcVar], tuple]:
    """Source variables for the run-time arguments; other arguments stay Python values."""
    call_args: list = []
    for k, a in enumerate(args):
        value = _as_runtime(a, k in nums)
        if value is None:
            call_args.append(a)
            continue
        shape, dtype, device = value
        if k in nums and dtype not in FLOAT_DTYPES:
            raise DTypeError(f"grad: cannot differentiate with respect to argument {k} of "
                             f"dtype {dtype}; pass floats (e.g. 2.0 rather than 2)")
        var = SrcVar(shape, dtype, device, k in nums, "input")
        var.name = params[k]
        call_args.append(var)
    writer.where = src.where()
    # the gradients come in argnums' order: argnums=(1, 0) gives (d/dy, d/dx)
    return [call_args[k] for k in nums], tuple(call_args)


def _as_runtime(a: Any, differentiated: bool) -> tuple | None:
    """(shape, dtype, device) of an argument passed at run time, None for a static one."""
    if isinstance(a, Tensor) or type(a) in KINDS:  # a tensor, or another transformation's
        return tuple(a.shape), str(a.dtype), a.device
    if isinstance(a, (np.ndarray, float)) or (differentiated and type(a) in (int, bool)):
        t = tensor(a)
        return t.shape, t.dtype, t.device
    return None


def _output(out: Any, writer: _Writer, src: _Source) -> SrcVar:
    """f's returned value as a variable of the program; it must be one scalar."""
    if isinstance(out, Tensor):
        out = SrcVar(out.shape, out.dtype, out.device, False, "const", None, out)
    elif type(out) in (int, float):
        const = SrcVar((), "float64", get_device(None), False, "const")
        writer.emit((const,), Fill(float(out), const))
        out = const
    if type(out) is not SrcVar:
        raise TypeError(f"grad: f must return a Tensor, got {type(out).__name__} "
                        f"[source_grad: {src.where()}]")
    if math.prod(out.shape) != 1:
        raise GradientError(f"grad: f must return a scalar, it returned shape {out.shape}; "
                            f"use mg.jacrev for a vector output")
    return out


def _finish(src: _Source, params: list[str], forward: list, backward: list, out: SrcVar,
            grads: list[SrcVar], pairs: list, writer: _Writer, single: bool,
            signature: tuple) -> Program:
    """Dead code, the stack, names, text, compile."""
    in_forward = {id(s) for s in forward}
    live = {id(out)} | {id(g) for g in grads}
    whole = forward + backward
    _prune(whole, set(live))
    if _insert_stack(pairs):
        if any(isinstance(s, Line) and s.kind == "pop" and any(t is out for t in s.targets)
               for s in _walk(whole)):  # the reverse sweep restores it: return a copy
            kept = SrcVar(out.shape, out.dtype, out.device, out.active, "temp", "z")
            copy = Line((kept,), Ref((out,)))
            in_forward.add(id(copy))
            at = sum(1 for s in whole if id(s) in in_forward)
            whole.insert(at, copy)
            out, live = kept, live | {id(kept)}
        _prune(whole, set(live))
    forward[:] = [s for s in whole if id(s) in in_forward]
    backward[:] = [s for s in whole if id(s) not in in_forward]
    namer = _Namer(set(params) | {"mg", "range", "reversed", "stack", "_stack"},
                   writer.reserved)
    consts: dict[int, tuple[Any, str]] = {}
    _name_all(namer, forward, backward, out, consts, writer.hints)
    _collect_consts(whole, namer, consts, writer.hints)
    texts = _texts(src.fn.__name__, params, forward, backward, out, grads, single,
                   consts, namer)
    return _build_program(src.fn.__name__, texts, consts, out, grads, signature, single,
                          forward + backward)


def _collect_consts(block: list, namer: _Namer, consts: dict, hints: dict) -> None:
    """Name every non-literal value a line uses (tensors, arrays) as a constant."""
    for stmt in _walk(block):
        if isinstance(stmt, Line) and isinstance(stmt.expr, Op):
            for v in _parts((stmt.expr.args, tuple(stmt.expr.params.values()))):
                if not isinstance(v, (SrcVar, Index, Device)) and type(v) not in _LITERALS \
                        and v is not Ellipsis:
                    _const_name(v, namer, consts, hints)


def _texts(name: str, params: list[str], forward: list, backward: list, out: SrcVar,
           grads: list[SrcVar], single: bool, consts: dict, namer: _Namer) -> dict:
    """The program's texts: ``False`` (mg calls) and ``True`` (kernels), each with its
    renderer; ``"forward"``, the normalised primal; for a straight-line program,
    ``"gradients"``, the kernel text of the gradients alone (``mg.grad``), its renderer
    and its lines: without the lines only f's value needs (``z = a + b``)."""
    counts = Counter(id(v) for s in _walk(forward + backward)
                     for v in (_uses(s) if isinstance(s, (Line, If)) else ()))
    for v in [out] + grads:
        counts[id(v)] += 1
    plan = _Text(consts, False, counts)  # which temporaries are written inline
    plan.planning = True
    plan.block(backward, 1, inline=True)
    for v in _program_vars(backward):  # final names of the reverse temporaries left
        assert v.name is not None  # (_name_all named every variable of the program)
        if v.role == "rtemp" and v.name.startswith("_t") and id(v) not in plan.used:
            v.name = namer.fresh(None)
    stack = "_stack" if "stack" in namer.reserved else "stack"
    pushes = any(isinstance(s, Line) and s.kind == "push" for s in _walk(forward))
    # the kernel variants free each array after its last use (see _free_dead)
    arrays = {v.name for v in _program_vars(forward + backward) if v.shape != ()}
    names = cast("list[str]", [g.name for g in grads])  # (named by _name_all too)
    ret = names[0] if single else f"({', '.join(names)}{',' if len(names) == 1 else ''})"

    def render(raw: bool, ahead: list, behind: list, returned: list[SrcVar],
               ret: str) -> tuple[str, _Text]:
        text = _Text(consts, raw, counts)
        text.inlined, text.stack = plan.used, stack
        text.escaping = _escaping(ahead + behind, returned)
        source = _assemble(f"grad_{name}", params, text.block(ahead, 1, inline=False),
                           text.block(behind, 1, inline=True), ret, consts,
                           stack if pushes else None)
        return (_free_dead(source, arrays) if raw else source), text

    texts: dict[Any, Any] = {raw: render(raw, forward, backward, [out] + grads,
                                         f"{out.name}, {ret}") for raw in (False, True)}
    primal = _copy(forward, pushes=False)  # (the normalised primal needs no stack)
    _prune(primal, {id(out)})
    lines = _Text(consts, False, counts).block(primal, 1, inline=False)
    texts["forward"] = (f"def {name}({', '.join(params)}):\n" + _constants_comment(consts) +
                        "\n".join(lines + [f"    return {out.name}"]) + "\n")
    if not any(isinstance(s, (For, If)) for s in forward + backward):
        ahead, behind = _copy(forward), _copy(backward)  # (new lines: pruning them
        lean = ahead + behind                             # leaves the program as it is)
        _prune(lean, {id(g) for g in grads})
        in_ahead = {id(s) for s in ahead}
        texts["gradients"] = render(True, [s for s in lean if id(s) in in_ahead],
                                    [s for s in lean if id(s) not in in_ahead], grads,
                                    ret) + (lean,)
    return texts


def _free_dead(source: str, arrays: set[str | None]) -> str:
    """``source`` with ``del a, b  # last use`` after the statement of the function's
    body that reads the arrays ``a`` and ``b`` for the last time, so that Python frees
    them as soon as nothing will read them again, not when the program returns (the
    peak of a training step falls by its activations). Only variables that a statement
    of the body itself assigns (so they are bound wherever the program got to), and that
    hold arrays: a line to free a scalar would only make the text longer."""
    body = cast(ast.FunctionDef, ast.parse(source).body[0]).body
    bound: set[str] = set()
    last: dict[str, int] = {}  # name -> index of the statement that reads it last
    for k, stmt in enumerate(body):
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                last[node.id] = k
        if isinstance(stmt, ast.Assign):
            bound.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    dead: dict[int, list[str]] = {}
    for name, k in last.items():
        if name in bound and name in arrays and not isinstance(body[k], ast.Return):
            dead.setdefault(k, []).append(name)
    lines = source.splitlines()
    for k in sorted(dead, reverse=True):  # (from the end: the line numbers stay right)
        end = cast(int, body[k].end_lineno)
        lines.insert(end, f"    del {', '.join(dead[k])}  # last use")
    return "\n".join(lines) + "\n"


def _escaping(block: list, returned: list[SrcVar]) -> set[int]:
    """Ids of the returned variables and of everything they may be a copy of."""
    found = {id(v) for v in returned}
    copies = [s for s in _walk(block) if isinstance(s, Line) and isinstance(s.expr, Ref)]
    grew = True
    while grew:
        grew = False
        for line in copies:
            if any(id(t) in found for t in line.targets):
                new = {id(v) for v in _vars(line.expr.values)} - found
                found |= new
                grew = grew or bool(new)
    return found


def _assemble(name: str, params: list[str], forward: list[str], backward: list[str],
              ret: str, consts: dict, stack: str | None) -> str:
    lines = [f"def {name}({', '.join(params)}):"]
    if stack:
        lines.append(f"    {stack} = []  # what the reverse sweep needs of each loop iteration")
    lines.append("    # forward sweep: the evaluation trace (a.*), one primitive per line")
    lines += forward
    lines.append("    # reverse sweep: the adjoint trace (g.*), in reverse order")
    lines += backward
    lines.append(f"    return {ret}")
    return lines[0] + "\n" + _constants_comment(consts) + "\n".join(lines[1:]) + "\n"


def _constants_comment(consts: dict) -> str:
    if not consts:
        return ""
    shown = []
    for value, cname in consts.values():
        if isinstance(value, Tensor):
            shown.append(f"{cname}: {value.shape} {value.dtype} on {value.device.name}")
        else:
            shown.append(f"{cname}: {type(value).__name__}")
    return "    # constants, captured when this program was built: " + "; ".join(shown) + "\n"


def _copy(block: list, pushes: bool = True) -> list:
    """A copy of a block's structure (lines are shared, loops and ifs copied), without
    the stack's pushes if ``pushes`` is false."""
    out: list[For | If | Line] = []
    for s in block:
        if isinstance(s, For):
            out.append(For(s.index, s.range, _copy(s.body, pushes), s.reverse, s.carry))
        elif isinstance(s, If):
            out.append(If(s.cond, _copy(s.then, pushes), _copy(s.orelse, pushes), s.joins))
        elif pushes or s.kind != "push":
            out.append(Line(s.targets, s.expr, s.kind))
    return out


def _build_program(name: str, texts: dict, consts: dict, out: SrcVar,
                   grads: list[SrcVar], signature: tuple, single: bool,
                   lines: list) -> Program:
    mg = sys.modules["minigraph"]
    source, _ = texts[False]
    namespace: dict[str, Any] = {"mg": mg}
    namespace.update({cname: value for value, cname in consts.values()})
    fn = _compile(source, f"grad_{name}", namespace)
    raw_source, text = texts[True]
    raw = None
    if _raw_ok(consts, text, out, grads):
        raw = _compile(raw_source, f"grad_{name}", _raw_namespace(text, consts, out))
    prog = Program(signature, source, texts["forward"], fn, raw_source if raw else None,
                   raw, out, grads, single)
    prog.captured = Captured(value for value, _ in consts.values())
    copies = _copies(lines, [out] + grads)
    prog.copies = copies if any(copies) else None
    if raw is not None and "gradients" in texts:
        gradients_source, text, lean = texts["gradients"]
        prog.raw_gradients_source = gradients_source
        prog.raw_gradients = _compile(gradients_source, f"grad_{name}",
                                      _raw_namespace(text, consts, out))
        copies = [False] + _copies(lean, grads)
        prog.gradient_copies = copies if any(copies) else None
    return prog


def _raw_namespace(text: _Text, consts: dict, out: SrcVar) -> dict[str, Any]:
    """What a kernel text reads: its fills, kernels, devices, namespace and constants."""
    devices = dict(text.devices)
    ns: dict[str, Any] = {**text.fills, **text.kernels, **devices}
    ns["_xp"] = next(iter(devices.values())).xp if devices else out.device.xp
    ns.update({cname: (value.data if isinstance(value, Tensor) else value)
               for value, cname in consts.values()})
    return ns


def _copies(block: list, returned: list[SrcVar]) -> list[bool]:
    """Per returned variable, whether its array may be memory that is not the call's
    own: an input (the caller's), a constant or a fill the program keeps, or the array
    of another returned variable (``gx = gz; gy = gz``). A variable's array is its own
    or, through a copy of the reference (``gb = gz``) or a view (``mg.reshape``,
    ``mg.broadcast_to`` ...), another's; a view is copied too (a broadcast one cannot be
    written). The caller gets values of its own, as in every mode."""
    sources: dict[int, list[Any]] = {}  # id(variable) -> what its array may also be
    foreign: set[int] = set()  # variables over memory that is not the call's own
    for stmt in _walk(block):
        if not isinstance(stmt, Line):
            continue
        e = stmt.expr
        if stmt.kind == "pop" or isinstance(e, Fill):  # (a pop restores what was pushed)
            foreign.update(id(t) for t in stmt.targets)
        elif isinstance(e, Ref):
            for t, v in zip(stmt.targets, e.values):
                sources.setdefault(id(t), []).append(v)
        elif isinstance(e, Op) and e.prim.view:
            foreign.add(id(stmt.targets[0]))
            sources.setdefault(id(stmt.targets[0]), []).append(e.args[0] if e.args else None)
    copies: list[bool] = []
    seen: set[int] = set()  # the variables whose arrays earlier returned ones may be
    for v in returned:
        reached, todo, own = set(), [v], True
        while todo:
            w = todo.pop()
            if type(w) is not SrcVar or w.role in ("input", "const"):
                own = False  # the caller's array, or one the program keeps
            elif id(w) not in reached:
                reached.add(id(w))
                todo += sources.get(id(w), [])
        copies.append(not own or bool(reached & foreign) or bool(reached & seen))
        seen |= reached
    return copies


def _raw_ok(consts: dict, text: _Text, out: SrcVar, grads: list[SrcVar]) -> bool:
    """Kernels on arrays need one device without a GPU context (NumPy-like arrays)."""
    devices = {d.name: d for d in text.devices.values()}
    devices[out.device.name] = out.device
    devices.update({g.device.name: g.device for g in grads})
    for value, _ in consts.values():
        if isinstance(value, Tensor):
            devices[value.device.name] = value.device
    return len({id(d.xp) for d in devices.values()}) == 1 and len(devices) == 1 and \
        all(d.context is None for d in devices.values())
