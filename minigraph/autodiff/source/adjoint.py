"""The adjoint: the VJP rules run on source variables, backwards, (g.1)-(g.5).

Step 3 of the overview (see ``__init__.py``). :class:`_Reverse` walks the normalised
program backwards and runs each line's primitive VJP rules, the ones the tape uses, on
source variables, so that they write the lines of the reverse sweep. A loop is reversed by
a loop over ``reversed(range(...))`` (:class:`_LoopCtx` holds its accumulators), an ``if``
by an ``if`` on the same condition.
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import MinigraphError
from .program import Fill, For, If, Line, Op, Ref, _defined, _walk
from .values import SrcVar
from .writer import _Writer


class _LoopCtx:
    """A loop being reversed: the variables defined inside it, and the accumulators
    (``gw = gw + ...``) of variables defined outside it that receive adjoints inside."""
    __slots__ = ("defined", "accs")

    def __init__(self, defined: set[int]):
        self.defined = defined
        self.accs: dict[int, tuple[SrcVar, SrcVar]] = {}


class _Reverse:
    """Writes the reverse sweep: adjoints flow from each line to the variables it read.

    ``shares[id(v)]`` lists v's adjoint contributions ``(position, share)`` not yet added.
    A variable's adjoint is complete when the sweep reaches its definition (every reader
    comes after it), and is then written as the sum of its shares, in the readers'
    evaluation order, as the textbook writes (f.5): ``gx = ga * y + gb * cos(x)``.
    """

    def __init__(self, writer: _Writer, forward: list):
        self.w = writer
        self.position = {id(s): k for k, s in enumerate(_walk(forward))}
        self.loops: list[_LoopCtx] = []
        self.vars: dict[int, SrcVar] = {}  # id -> variable, for every share recorded
        # (forward, reverse) loops and branches inside loops, inner first: the regions
        # whose values the stack saves (see _insert_stack)
        self.pairs: list[tuple[Any, Any]] = []

    def run(self, forward: list, out: SrcVar, inputs: list[SrcVar]) -> list[SrcVar]:
        shares: dict[int, list] = {}
        if out.active:
            seed = self.w.new(out, "adjoint", out)  # (g.1): gz = 1
            self.w.emit((seed,), Fill(1, seed))
            shares[id(out)] = [(math.inf, seed)]
        self.block(forward, shares)
        grads = [self.complete(x, shares) for x in reversed(inputs)][::-1]
        return [g if g is not None else self.zeros(x) for g, x in zip(grads, inputs)]

    def zeros(self, like: SrcVar) -> SrcVar:
        z = self.w.new(like, "adjoint", like)
        self.w.emit((z,), Fill(0, z))
        return z

    # -- straight-line code ---------------------------------------------------------------
    def block(self, stmts: list, shares: dict) -> None:
        for stmt in reversed(stmts):
            if isinstance(stmt, For):
                self.loop(stmt, shares)
            elif isinstance(stmt, If):
                self.branch(stmt, shares)
            elif stmt.kind != "carry" and isinstance(stmt.expr, Op):
                self.op_line(stmt, shares)
            elif stmt.kind != "carry" and isinstance(stmt.expr, Ref):
                self.ref_line(stmt, shares)

    def op_line(self, line: Line, shares: dict) -> None:
        """``out = prim(*args)``: each read argument gets ``prim.vjp[i](gout, out, *args)``."""
        out = line.targets[0]
        g = self.complete(out, shares) if out.active else None
        if g is None:
            return
        prim, args, params = line.expr.prim, line.expr.args, line.expr.params
        for i, a in enumerate(args):
            rule = prim.vjp[i] if type(a) is SrcVar and a.active else None
            if rule is not None:
                self.add(a, rule(g, out, *args, **params), self.position[id(line)], shares)

    def ref_line(self, line: Line, shares: dict) -> None:
        """``a, b = x, y``: the adjoint of a copy is the adjoint of the original."""
        gs = [self.complete(t, shares) if t.active else None for t in line.targets]
        for v, g in zip(line.expr.values, gs):
            if g is not None and type(v) is SrcVar and v.active:
                self.add(v, g, self.position[id(line)], shares)

    def total(self, entries: list) -> SrcVar | None:
        """The sum of shares in evaluation order of their readers (a new variable)."""
        terms = [s for _, s in sorted(entries, key=lambda e: e[0])]
        if not terms:
            return None
        result = terms[0]
        for t in terms[1:]:
            result = result + t
        return result

    def complete(self, v: SrcVar, shares: dict) -> SrcVar | None:
        """v's whole adjoint ``gv``, once all of v's readers have been reversed."""
        total = self.total(shares.pop(id(v), []))
        if total is None:
            return None
        if total.role == "rtemp" and total.hint is None:
            total.role, total.hint = "adjoint", v  # the sum itself becomes gv
            return total
        if total.role == "adjoint" and total.hint is v:
            return total
        alias = self.w.new(v, "adjoint", v)  # gb = gz: (g.2), (g.3)
        self.w.emit((alias,), Ref((total,)))
        return alias

    def add(self, v: SrcVar, share: Any, position: float, shares: dict) -> None:
        """Record a share of v's adjoint; inside a loop, outer variables accumulate."""
        if type(share) is not SrcVar:
            raise MinigraphError(f"source_grad: internal error: a VJP rule gave "
                                 f"{type(share).__name__} for {v!r}")
        acc = self.accumulator(v)
        if acc is not None:
            self.w.emit((acc,), Ref((acc + share,)))  # gw = gw + ...
            return
        self.vars[id(v)] = v
        shares.setdefault(id(v), []).append((position, share))

    def accumulator(self, v: SrcVar) -> SrcVar | None:
        """The accumulator ``gv`` if v is defined outside a loop being reversed."""
        for ctx in self.loops:  # the outermost loop v is defined outside of
            if id(v) not in ctx.defined:
                if id(v) not in ctx.accs:
                    ctx.accs[id(v)] = (v, self.w.new(v, "adjoint", v))
                return ctx.accs[id(v)][1]
        return None

    def carried_adjoint(self, lv: SrcVar, shares: dict) -> SrcVar:
        """``gh``: the adjoint of loop variable h, carried backwards through the loop."""
        total = self.total(shares.pop(id(lv), []))
        if total is not None and (total.role == "rtemp" and total.hint is None or
                                  total.role == "adjoint" and total.hint is lv):
            total.role, total.hint = "adjoint", lv  # only the loop reads it: reuse it
            return total
        var = self.w.new(lv, "adjoint", lv)
        self.w.emit((var,), Ref((total,)) if total is not None else Fill(0, var))
        return var

    def assign(self, var: SrcVar, entries: list) -> None:
        """``var = sum of entries`` (or zeros when there is none)."""
        total = self.total(entries)
        self.w.emit((var,), Ref((total,)) if total is not None else Fill(0, var))

    # -- loops ------------------------------------------------------------------------------
    def loop(self, fwd: For, shares: dict) -> None:
        """Reverse a loop: ``for i in reversed(range(n))``, the body's adjoint inside.

        The loop variables' adjoints (``gh``) are carried backwards: the adjoint of h at
        the end of an iteration is given to the value h was assigned from, and the
        adjoint h's start value collects becomes ``gh`` for the iteration before.
        """
        where = self.position[id(fwd)]
        la = {id(lv): (lv, self.carried_adjoint(lv, shares)) for lv, _ in fwd.carry
              if lv.active}
        ctx = _LoopCtx(_defined(fwd.body))
        self.loops.append(ctx)
        body: list  # the reverse loop's statements
        inner: dict[int, list]  # the adjoint shares inside the body (as ``shares``)
        body, inner = [], {}
        with self.w.into(body):
            for lv, end in fwd.carry:
                if id(lv) in la and type(end) is SrcVar and end.active:
                    self.add(end, la[id(lv)][1], math.inf, inner)
            self.block(fwd.body, inner)
            updates = [(var, self.total(inner.pop(id(lv), []))) for lv, var in la.values()]
            moved = [(var, t) for var, t in updates if t is not None and t is not var]
            if moved:
                self.w.emit(tuple(p[0] for p in moved), Ref(tuple(p[1] for p in moved)))
            for var, t in updates:
                if t is None:
                    self.w.emit((var,), Fill(0, var))
        self.loops.pop()
        if inner:
            raise MinigraphError("source_grad: internal error: adjoints left in a loop body")
        for v, acc in ctx.accs.values():
            self.assign(acc, shares.pop(id(v), []))
        rev = For(fwd.index, fwd.range, body, reverse=True)
        self.w.block.append(rev)
        self.pairs.append((fwd, rev))
        for v, acc in list(ctx.accs.values()) + list(la.values()):
            shares[id(v)] = [(where, acc)]

    # -- branches ---------------------------------------------------------------------------
    def branch(self, fwd: If, shares: dict) -> None:
        """Reverse an if with an if on the same condition: the branch that ran forward
        is the branch whose adjoint runs. Outer variables' adjoints are merged."""
        where = self.position[id(fwd)]
        seeds = {}
        for j in fwd.joins:  # complete: their readers come after the if
            g = self.complete(j, shares) if j.active else None
            if g is not None:
                seeds[id(j)], self.vars[id(j)] = g, j
        blocks: tuple[list, list]  # the reverse branches' statements
        blocks, lefts = ([], []), []
        for stmts, block in zip((fwd.then, fwd.orelse), blocks):
            local = {k: [(math.inf, g)] for k, g in seeds.items()}
            with self.w.into(block):
                self.block(stmts, local)
            lefts.append(local)
        outer = {k: self.vars[k] for left in lefts for k in left}  # from before the if
        for v in outer.values():
            acc = self.w.new(v, "adjoint", v)
            for block, local in zip(blocks, lefts):
                with self.w.into(block):
                    self.assign(acc, shares.get(id(v), []) + local.get(id(v), []))
            shares[id(v)] = [(where, acc)]
        rev = If(fwd.cond, blocks[0], blocks[1])
        self.w.block.append(rev)
        if self.loops:  # a branch's values are saved by the branch that computed them
            self.pairs.append((fwd, rev))
