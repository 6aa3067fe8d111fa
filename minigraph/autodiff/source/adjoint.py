"""The adjoint: the VJP rules run on source variables, backwards, (g.1)-(g.5).

Step 3 of the overview (see ``__init__.py``). :class:`_Reverse` walks the normalised
program backwards. Each maximal run of straight-line code is handed to the one reverse
sweep of every mode, ``autodiff/backward.py``'s :func:`reverse_sweep`, whose VJP rules,
run on source variables, write the lines of the adjoint. What a straight-line record does
not have is reversed here: a loop by a loop over ``reversed(range(...))``
(:class:`_LoopCtx` holds its accumulators), an ``if`` by an ``if`` on the same condition.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Iterator

from ...errors import MinigraphError
from ...ops import copy as C
from ...ops.shape_rules import promote
from ..backward import Entry, reverse_sweep
from ..tape import as_gradient
from .program import Fill, For, If, Line, Op, Ref, _defined, _uses, _walk, _Writer
from .values import SrcVar


def _active(a: Any) -> bool:
    """Whether argument ``a`` takes an adjoint: a variable that depends on an input."""
    return type(a) is SrcVar and a.active


def _adjoint_of(v: SrcVar, dtype: str | None = None) -> SrcVar:
    """A new variable for v's adjoint, ``gv`` (tidy.py names it g + v's name), of v's dtype
    or ``dtype``: the adjoint of a float32 x that meets float64 values is float64 until
    :meth:`_Reverse.gradient` casts it, as the tape's is (``tape.as_gradient``)."""
    return SrcVar(v.shape, dtype or v.dtype, v.device, False, "adjoint", v)


def _as(total: SrcVar, var: SrcVar) -> SrcVar:
    """``total`` in ``var``'s dtype, for the line ``var = total``: a variable of the program
    has one dtype (an accumulator in a loop, an adjoint joined after an if), and the
    shares added into it may be wider (a float64 share of a float32 variable's)."""
    return total if total.dtype == var.dtype else C.astype(total, var.dtype, copy=False)


def _checked(v: SrcVar, share: Any) -> SrcVar:
    """A share of v's adjoint, which the VJP rules, run on source variables, must write."""
    if type(share) is not SrcVar:
        raise MinigraphError(f"source_grad: internal error: a VJP rule gave "
                             f"{type(share).__name__} for {v!r}")
    return share


def _entries(line: Line) -> list[Entry]:
    """A line as the sweep's entries ``(primitive, params, output, args)``: ``a, b = x, y``
    is an identity (a copy) per target, whose adjoint is the copy's adjoint."""
    e = line.expr
    if isinstance(e, Op):
        return [(e.prim, e.params, line.targets[0], e.args)]
    if isinstance(e, Ref):
        return [(C.IDENTITY, {}, t, (v,)) for t, v in zip(line.targets, e.values)]
    return []  # a Fill reads nothing: no adjoint flows through it


class _LoopCtx:
    """A loop being reversed: the variables defined inside it, and the accumulators
    (``gw = gw + ...``) of variables defined outside it that receive adjoints inside."""
    __slots__ = ("defined", "accs")

    def __init__(self, defined: set[int]):
        self.defined = defined
        self.accs: dict[int, tuple[SrcVar, SrcVar]] = {}


class _Reverse:
    """Writes the reverse sweep: adjoints flow from each statement to the variables it read.

    ``shares[id(v)]`` lists v's adjoint contributions not yet added, in the order they
    arrived: latest reader first, since the walk runs backwards (the same convention as
    :func:`reverse_sweep`'s, which adds them in the readers' evaluation order, (f.5)).
    """

    def __init__(self, writer: _Writer):
        self.w = writer
        self.loops: list[_LoopCtx] = []
        self.vars: dict[int, SrcVar] = {}  # id -> variable, for every share recorded
        # (forward, reverse) loops and branches inside loops, inner first: the regions
        # whose values the stack saves (see _insert_stack)
        self.pairs: list[tuple[Any, Any]] = []
        # id(reverse line) -> (that line, the forward line whose VJP rule wrote it): where
        # a kernel of the reverse sweep fails, compiled.py names the user's line of the op
        self.origins: dict[int, tuple[Line, Line]] = {}

    def run(self, forward: list, out: SrcVar, inputs: list[SrcVar],
            seed: SrcVar | None = None) -> list[SrcVar]:
        """The reverse sweep of ``forward`` from ``gz = 1``, (g.1), or from ``seed``, the
        output's adjoint as a parameter of the program (``mg.vjp``'s); the inputs'
        adjoints."""
        shares: dict[int, list] = {}
        if out.active:
            if seed is None:
                seed = _adjoint_of(out)  # (g.1): gz = 1
                self.w.emit((seed,), Fill(1, seed))
            shares[id(out)] = [seed]
        self.block(forward, shares)
        grads = [self.complete(x, shares) for x in reversed(inputs)][::-1]
        return [self.gradient(g, x) if g is not None else self.zeros(x)
                for g, x in zip(grads, inputs)]

    @staticmethod
    def gradient(g: SrcVar, x: SrcVar) -> SrcVar:
        """x's adjoint in x's dtype (``tape.as_gradient``): ``gx_1 = mg.astype(gx,
        'float32')`` for a float32 x used in float64 arithmetic, named as x's too."""
        cast = as_gradient(g, x)
        if cast is not g:
            cast.role, cast.hint = "adjoint", x
        return cast

    def zeros(self, like: SrcVar) -> SrcVar:
        z = _adjoint_of(like)
        self.w.emit((z,), Fill(0, z))
        return z

    # -- sums and names ----------------------------------------------------------------------
    @staticmethod
    def total(parts: list) -> SrcVar | None:
        """The sum of shares (arrived latest reader first) in the readers' order, (f.5)."""
        return sum(parts[-2::-1], parts[-1]) if parts else None

    def named(self, v: SrcVar, g: Any) -> SrcVar:
        """v's whole adjoint ``g`` as ``gv``: a sum just written is renamed gv, (g.5);
        anything else gets an alias line ``gb = gz``, (g.2) and (g.3)."""
        g = _checked(v, g)
        if g.role == "rtemp" and g.hint is None:
            g.role, g.hint = "adjoint", v  # the sum itself becomes gv
            return g
        if g.role == "adjoint" and g.hint is v:
            return g
        alias = _adjoint_of(v, g.dtype)  # (g's dtype, which gradient() casts to v's)
        self.w.emit((alias,), Ref((g,)))
        return alias

    def complete(self, v: SrcVar, shares: dict) -> SrcVar | None:
        """v's whole adjoint ``gv``, once all of v's readers have been reversed."""
        total = self.total(shares.pop(id(v), []))
        return None if total is None else self.named(v, total)

    def assign(self, var: SrcVar, parts: list) -> None:
        """``var = sum of parts`` (or zeros when there is none)."""
        total = self.total(parts)
        self.w.emit((var,), Ref((_as(total, var),)) if total is not None else Fill(0, var))

    def add(self, v: SrcVar, share: Any, shares: dict) -> None:
        """Record a share of v's adjoint; inside a loop, outer variables accumulate."""
        share = _checked(v, share)
        acc = self.accumulator(v, share)
        if acc is not None:
            self.w.emit((acc,), Ref((_as(acc + share, acc),)))  # gw = gw + ...
        else:
            self.vars[id(v)] = v
            shares.setdefault(id(v), []).append(share)

    def accumulator(self, v: SrcVar, share: SrcVar) -> SrcVar | None:
        """The accumulator ``gv`` if v is defined outside a loop being reversed (of the
        dtype of v and its first ``share``)."""
        for ctx in self.loops:  # the outermost loop v is defined outside of
            if id(v) not in ctx.defined:
                if id(v) not in ctx.accs:
                    ctx.accs[id(v)] = (v, _adjoint_of(v, promote(v, share)))
                return ctx.accs[id(v)][1]
        return None

    # -- straight-line code ---------------------------------------------------------------
    def block(self, stmts: list, shares: dict) -> None:
        """Reverse a block: its runs of lines by the sweep, its loops and branches here."""
        runs = [(lines, list(group)) for lines, group in
                itertools.groupby(stmts, key=lambda s: isinstance(s, Line))]
        for lines, group in reversed(runs):
            if lines:
                self.straight(group, shares)
                continue
            for stmt in reversed(group):
                if isinstance(stmt, For):
                    self.loop(stmt, shares)
                else:
                    self.branch(stmt, shares)

    def straight(self, lines: list[Line], shares: dict) -> None:
        """Reverse straight-line code with :func:`reverse_sweep`: seeded with the shares
        its outputs have from later statements, it hands the shares of the variables it
        read but did not define (its leaves) on to the statements before it. Each line it
        writes is said to come from the forward line it differentiates (:meth:`made_at`)."""
        entries = [e for line in lines for e in _entries(line)]
        made_by = {id(out): line for line in lines for _, _, out, _ in _entries(line)}
        seeds = [(out, g) for _, _, out, _ in entries for g in shares.pop(id(out), [])]
        for line in lines:  # a Fill reads nothing: the adjoint of what it fills ends here
            if isinstance(line.expr, Fill):  # (a loop's start ``h = 0.0`` has one, gh)
                for t in line.targets:
                    shares.pop(id(t), None)
        read = {id(a): a for *_, args in entries for a in args}
        leaves = reverse_sweep(entries, seeds, _active, completed=self.named,
                               scope=lambda out: self.made_at(made_by[id(out)]),
                               sum_leaves=False)
        for k, parts in leaves.items():
            for share in parts:  # (one by one: in a loop, each is added to gw on its line)
                self.add(read[k], share, shares)

    @contextlib.contextmanager
    def made_at(self, forward: Line) -> Iterator[None]:
        """The lines written inside come from ``forward``'s VJP rule (:attr:`origins`),
        as graph mode makes a gradient node at its forward node's line."""
        block, start = self.w.block, len(self.w.block)
        yield
        for line in block[start:]:
            self.origins[id(line)] = (line, forward)

    # -- loops ------------------------------------------------------------------------------
    def loop(self, fwd: For, shares: dict) -> None:
        """Reverse a loop: ``for i in reversed(range(n))``, the body's adjoint inside.

        The loop variables' adjoints (``gh``) are carried backwards: the adjoint of h at
        the end of an iteration is given to the value h was assigned from, and the
        adjoint h's start value collects becomes ``gh`` for the iteration before. A loop
        none of whose variables has an adjoint after it (nothing differentiated reads
        them) has no reverse loop: the values it would carry back are zeros.
        """
        after = {id(lv): (lv, self.complete(lv, shares)) for lv, _ in fwd.carry if lv.active}
        if all(g is None for _, g in after.values()):
            return  # nothing read after the loop has an adjoint: none flows into it
        # (a loop variable that nothing after the loop reads and no iteration reads, only
        # assigns, has a zero adjoint throughout: it gets no gh)
        read = {id(v) for stmt in _walk(fwd.body) for v in _uses(stmt)}
        la = {k: (lv, g if g is not None else self.zeros(lv)) for k, (lv, g) in after.items()
              if g is not None or k in read}
        ctx = _LoopCtx(_defined(fwd.body))
        self.loops.append(ctx)
        body: list = []  # the reverse loop's statements
        # the adjoint shares inside the body (as ``shares``), from gh: the body's last
        # line, the carry ``h = d``, is a copy, so the sweep gives gh to d
        inner = {k: [g] for k, (_, g) in la.items()}
        with self.w.into(body):
            self.block(fwd.body, inner)
            updates = [(var, self.total(inner.pop(id(lv), []))) for lv, var in la.values()]
            moved = [(var, _as(t, var)) for var, t in updates if t is not None and t is not var]
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
            shares[id(v)] = [acc]
            self.vars[id(v)] = v  # (a branch around the loop merges it: branch's outer)

    # -- branches ---------------------------------------------------------------------------
    def branch(self, fwd: If, shares: dict) -> None:
        """Reverse an if with an if on the same condition: the branch that ran forward
        is the branch whose adjoint runs. Outer variables' adjoints are merged."""
        seeds = {}
        for j in fwd.joins:  # complete: their readers come after the if
            g = self.complete(j, shares) if j.active else None
            if g is not None:
                seeds[id(j)], self.vars[id(j)] = g, j
        blocks: tuple[list, list]  # the reverse branches' statements
        blocks, lefts = ([], []), []
        for stmts, block in zip(fwd.blocks, blocks):
            local = {k: [g] for k, g in seeds.items()}
            with self.w.into(block):
                self.block(stmts, local)
            lefts.append(local)
        outer = {k: self.vars[k] for left in lefts for k in left}  # from before the if
        for v in outer.values():
            parts = [shares.get(id(v), []) + local.get(id(v), []) for local in lefts]
            acc = _adjoint_of(v, promote(v, *(p for ps in parts for p in ps)))  # (the wider)
            for block, ps in zip(blocks, parts):
                with self.w.into(block):  # (the branch's shares arrived after the outer ones)
                    self.assign(acc, ps)
            shares[id(v)] = [acc]
        rev = If(fwd.cond, blocks[0], blocks[1])
        self.w.block.append(rev)
        if self.loops:  # a branch's values are saved by the branch that computed them
            self.pairs.append((fwd, rev))
