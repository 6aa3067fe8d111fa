"""Writing the text: ``mg.`` calls (``.source``), or kernel calls for a loop's program.

The second half of step 4. :class:`_Text` turns the program's statements into lines of
Python, with the parentheses Python's precedence needs (:func:`_infix`), writing the
reverse sweep's single-use temporaries into the line that reads them
(``gx = ga * y + gb * mg.cos(x)``). What a line says about one primitive (its ``mg.``
call, the literals of its parameters) is written by the code generator graph compilation
uses too (``minigraph/codegen.py``); what is written here is the program's own:
operators, indexing, loops, branches, the stack, and the inlining.

A straight-line program runs on arrays as graph compilation compiles it (``compiled.py``'s
``_kernels``). Graphs have no loops, so a program with a loop or an ``if`` decided at run
time is written a second time here, by a ``_Text(..., kernels=True)``, whose
``codegen.Names`` name the kernels: each primitive's line calls its kernel on arrays
(``_k_sin(_xp, x)``) instead of ``mg.sin(x)``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import AbstractSet, Any, Callable, cast

from ...codegen import Names, literal, mg_call
from ...device import Device
from ...ops.primitive import ATOM, CMP, PRECEDENCE, UNARY
from .program import Fill, For, Line, Op, _uses
from .tidy import _program_vars
from .values import Cond, Index, SrcVar


def _infix(sym: str, left: tuple[str, int], right: tuple[str, int]) -> tuple[str, int]:
    """``left sym right`` with the parentheses Python's precedence needs."""
    prec = PRECEDENCE[sym]
    if sym == "**":  # right-associative, and tighter than a unary minus on its left
        need_left, need_right = left[1] > prec, right[1] >= UNARY
    elif prec == CMP:  # comparisons chain: parenthesise both sides
        need_left, need_right = left[1] > prec, right[1] > prec
    else:  # left-associative: a - (b - c)
        need_left, need_right = left[1] >= prec, right[1] > prec
    lt = left[0] if need_left else f"({left[0]})"
    rt = right[0] if need_right else f"({right[0]})"
    return f"{lt} {sym} {rt}", prec


@dataclass
class _Inline:
    """A reverse temporary read once, waiting to be written into the line that reads it."""
    text: str  # its expression
    prec: int  # the expression's precedence
    reads: set[str]  # the names it reads: a later line assigning one ends the wait
    line: str  # its own line, written where no reader took it
    used: bool = False  # written into its reader's line


class _Waiting:
    """The reverse temporaries waiting for a reader (:meth:`_Text.block`), by id and by
    each name they read. A line assigning names ends the waits of the temporaries that
    read one of them, found by name: a sum of n shares has n temporaries waiting while
    the other lines are written, and looking at every one of them at every line made
    writing a long program take time quadratic in its length."""

    def __init__(self) -> None:
        self.by_id: dict[int, _Inline] = {}  # id(temp) -> the temporary
        # name -> the temporaries that read it: (id, temporary), including some that
        # stopped waiting since (a reader took them, or another name ended the wait)
        self.by_name: dict[str | None, list[tuple[int, _Inline]]] = {}

    def add(self, key: int, entry: _Inline) -> None:
        self.by_id[key] = entry
        for name in entry.reads:
            self.by_name.setdefault(name, []).append((key, entry))

    def take(self, key: int) -> _Inline | None:
        """The temporary ``key`` for the line that reads it, if it is still waiting."""
        return self.by_id.pop(key, None)

    def end(self, names: AbstractSet[str | None]) -> None:
        """Assigning ``names`` ends the wait of every temporary that reads one of them."""
        for name in names:
            for key, entry in self.by_name.pop(name, ()):
                if self.by_id.get(key) is entry:
                    del self.by_id[key]


class _Text:
    """Turns program statements into lines of Python, inlining single-use temporaries."""

    def __init__(self, consts: dict, counts: Counter, inlined: set[int] | None = None,
                 stack: str | None = "stack", kernels: bool = False):
        self.consts = consts  # id(value) -> (value, name)
        # With ``kernels``, kernels on arrays instead of mg. calls: the names of kernels
        # and devices (``_k_sin``, ``_dev_cpu``), bound in ``names.namespace``. They start
        # with _, as the program's own names (tidy.py) never do but _t1 and _stack; the
        # array namespace ``_xp`` and the stack are the text's own (compiled.py binds _xp).
        self.names = Names("_", ("_xp", "_stack"), self.spell) if kernels else None
        self.counts = counts  # how often each variable is read
        # The temporaries to write inline, as a first pass (``inlined`` None, planning)
        # chose them: those whose text is short; ``used`` are those really written inline.
        self.inlined, self.used = inlined, cast("set[int]", set())
        self.stack = stack  # the stack's name; None: the stack's pushes are not written

    # -- values ------------------------------------------------------------------------------
    def value(self, v: Any, subst: dict) -> tuple[str, int]:
        if type(v) is SrcVar:
            return subst.get(id(v), (v.name, ATOM))
        if isinstance(v, (Index, Cond)):
            return v.text, v.prec
        negative = type(v) in (int, float) and (v < 0 or math.copysign(1, v) < 0)
        return self.literal(v), UNARY if negative else ATOM

    def literal(self, v: Any) -> str:
        if self.names is not None:
            return self.names.literal(v)
        return literal(v, cast(Callable[[Any], str], self.spell))  # (no device is None)

    def spell(self, v: Any) -> str | None:
        """What has no literal text: a loop's index by its expression, a constant by the
        name the program gave it, a device by its name (kernels: bound, None)."""
        if isinstance(v, (Index, Cond)):
            return v.text
        if isinstance(v, Device):
            return None if self.names is not None else repr(v.name)
        return self.consts[id(v)][1]

    # -- expressions ---------------------------------------------------------------------------
    def op(self, e: Op, subst: dict) -> tuple[str, int]:
        args = [self.value(a, subst) for a in e.args]
        if self.names is not None:  # (one device: compiled.py binds its namespace, _xp)
            words = [a[0] for a in args]
            return self.names.kernel_call(e.prim, words, e.params, "_xp"), ATOM
        sym = e.prim.symbol  # the table says how the op is written
        if sym in PRECEDENCE and len(args) == 2:
            return _infix(sym, args[0], args[1])
        if sym == "-" and len(args) == 1:
            return "-" + (args[0][0] if args[0][1] >= UNARY else f"({args[0][0]})"), UNARY
        if sym == "[]":
            return self.getitem(args[0], e.params["index"]), ATOM
        return mg_call(e.prim, [a[0] for a in args], e.params, self.literal), ATOM

    def getitem(self, x: tuple[str, int], index: tuple) -> str:
        def part(p: Any) -> str | None:
            if p is None or isinstance(p, (int, Index)) and not isinstance(p, bool):
                return "None" if p is None else self.literal(p)
            if p is Ellipsis:
                return "..."
            if isinstance(p, slice) and all(q is None or isinstance(q, (int, Index))
                                            for q in (p.start, p.stop, p.step)):
                s = ":".join("" if q is None else self.literal(q)
                             for q in (p.start, p.stop, p.step))
                return s[:-1] if s.endswith(":") and p.step is None else s
            return None
        parts = [part(p) for p in index]
        if any(p is None for p in parts):
            return f"mg.getitem({x[0]}, {self.literal(index)})"
        base = x[0] if x[1] >= ATOM else f"({x[0]})"
        # (no None among the parts: that case returned above)
        return f"{base}[{', '.join(cast('list[str]', parts)) if parts else '()'}]"

    def fill(self, f: Fill) -> str:
        if self.names is not None:  # (a new array on every call: the caller may keep it)
            device = self.names.device(f.device)
            return f"{device}.full({f.shape!r}, {self.literal(f.value)}, {f.dtype!r})"
        # mg.zeros and mg.ones only for exactly +0 and 1: -0.0 == 0, but mg.zeros would
        # drop its sign (1 / -0.0 is -inf); True == 1, but a bool is written as itself
        if type(f.value) is not bool and f.value in (0, 1) and math.copysign(1, f.value) > 0:
            which = "ones" if f.value == 1 else "zeros"
            return f"mg.{which}({f.shape!r}, {f.dtype!r}, {f.device.name!r})"
        return f"mg.tensor({self.literal(f.value)}, {f.dtype!r}, {f.device.name!r})"

    # -- statements ----------------------------------------------------------------------------
    def line(self, line: Line, subst: dict) -> str:
        names = ", ".join(t.name for t in line.targets)
        if line.kind == "push":
            vals = ", ".join(self.value(v, subst)[0] for v in line.expr.values)
            saved = vals if len(line.expr.values) == 1 else f"({vals})"
            return f"{self.stack}.append({saved})"
        if line.kind == "pop":
            return f"{names} = {self.stack}.pop()"
        e = line.expr
        if isinstance(e, Op):
            return f"{names} = {self.op(e, subst)[0]}"
        if isinstance(e, Fill):
            return f"{names} = {self.fill(e)}"
        return f"{names} = {', '.join(self.value(v, subst)[0] for v in e.values)}"

    def block(self, stmts: list, depth: int, inline: bool) -> list[str]:
        """The lines of ``stmts``, indented ``depth`` times. With ``inline``, a reverse
        temporary waits (``pending``) until a line reads it, which takes its text, or a
        line assigns a name it reads; one that no reader took is written on its own."""
        pad = "    " * depth
        out: list[str | _Inline] = []  # lines, and temporaries that a reader may take
        pending = _Waiting()
        for stmt in stmts:
            if isinstance(stmt, Line) and stmt.kind == "push" and self.stack is None:
                continue
            if isinstance(stmt, Line):
                subst, reads = self.substitute(stmt, pending)
                entry = self.candidate(stmt, subst, reads) if inline else None
                # (assigning its targets ends the waits of the temporaries that read
                # them; the line's own temporary, which may read one, waits after)
                pending.end({t.name for t in stmt.targets})
                if entry is not None:
                    pending.add(id(stmt.targets[0]), entry)
                    out.append(entry)
                else:
                    out.append(pad + self.line(stmt, subst))
            else:
                pending.end({v.name for v in _program_vars([stmt])})
                out += self.compound(stmt, depth, inline)
        return [x if isinstance(x, str) else pad + x.line for x in out
                if isinstance(x, str) or not x.used]

    def substitute(self, stmt: Line, pending: _Waiting) -> tuple[dict, set[str]]:
        subst, reads = {}, set()
        for v in _uses(stmt):
            entry = pending.take(id(v))
            if entry is not None:
                subst[id(v)] = (entry.text, entry.prec)
                reads |= entry.reads
                entry.used = True
                self.used.add(id(v))
            assert v.name is not None  # (_name_all named every variable of the program)
            reads.add(v.name)
        return subst, reads

    def candidate(self, stmt: Line, subst: dict, reads: set[str]) -> _Inline | None:
        """A reverse temporary read once becomes part of its reader's line."""
        t = stmt.targets[0] if len(stmt.targets) == 1 else None
        if t is None or stmt.kind or t.role != "rtemp" or self.counts[id(t)] != 1 or \
                not isinstance(stmt.expr, Op):
            return None
        text, prec = self.op(stmt.expr, subst)
        if len(text) > 64 if self.inlined is None else id(t) not in self.inlined:
            return None
        return _Inline(text, prec, reads, self.line(stmt, subst))

    def compound(self, stmt: Any, depth: int, inline: bool) -> list[str]:
        pad = "    " * depth
        if isinstance(stmt, For):
            r = stmt.range
            rng = (f"range({r.stop})" if r.start == 0 and r.step == 1 else
                   f"range({r.start}, {r.stop})" if r.step == 1 else
                   f"range({r.start}, {r.stop}, {r.step})")
            head = f"for {stmt.index.text} in {'reversed(' + rng + ')' if stmt.reverse else rng}:"
            return [pad + head] + self.block(stmt.body, depth + 1, inline)
        cond = stmt.cond.text if isinstance(stmt.cond, Cond) else stmt.cond.name
        then = self.block(stmt.then, depth + 1, inline)
        orelse = self.block(stmt.orelse, depth + 1, inline)
        if not then:
            return [f"{pad}if not ({cond}):"] + orelse
        return [f"{pad}if {cond}:"] + then + ([f"{pad}else:"] + orelse if orelse else [])

