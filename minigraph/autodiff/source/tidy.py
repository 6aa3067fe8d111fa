"""Tidying: dead code, the loops' stack, names.

The first half of step 4. :func:`_tidy` runs :func:`_prune`, which removes the lines
nobody reads (backwards liveness), and :func:`_insert_stack`, which makes each forward loop
iteration push what the reverse sweep reads of it, and the reverse loop pop it;
:class:`_Namer` and :func:`_name_all` choose names like the textbook's (a, b, ... for
intermediates, g + name for adjoints, c1, c2 ... or the user's name for constants).
"""

from __future__ import annotations

import itertools
import keyword
import unicodedata
from typing import Any, Iterator

from .program import For, If, Line, Ref, _uses, _walk
from .values import SrcVar


def _tidy(forward: list, backward: list, out: SrcVar, grads: list[SrcVar],
          pairs: list[tuple[Any, Any]]) -> SrcVar:
    """Remove the lines nobody reads and insert the stack; returns the variable that holds
    f's value (a copy of it where the reverse sweep restores it from the stack)."""
    live = {id(out)} | {id(g) for g in grads}
    _prune(forward, _prune(backward, set(live)))  # (what the reverse reads is live)
    if _insert_stack(pairs):
        if any(isinstance(s, Line) and s.kind == "pop" and any(t is out for t in s.targets)
               for s in _walk(backward)):
            kept = SrcVar(out.shape, out.dtype, out.device, out.active, "temp", "z")
            forward.append(Line((kept,), Ref((out,))))
            out = kept
            live.add(id(kept))
        _prune(forward, _prune(backward, set(live)))
    return out


def _prune(block: list, live: set[int], drop: bool = True) -> set[int]:
    """Remove lines whose results nobody reads (backwards liveness); return live-in.

    ``live`` is updated in place (a new set per line would make long programs quadratic).
    """
    keep = []
    for stmt in reversed(block):
        if isinstance(stmt, For):
            live = _prune_loop(stmt, live, drop)
            if not stmt.body:
                stmt.dropped = True
                continue
        elif isinstance(stmt, If):
            live_t = _prune(stmt.then, set(live), drop)
            live_e = _prune(stmt.orelse, set(live), drop)
            if drop and not stmt.then and not stmt.orelse:
                stmt.dropped = True
                continue
            live = live_t | live_e
        elif stmt.kind not in ("push", "pop"):  # (the stack's lines always stay)
            needed = [k for k, t in enumerate(stmt.targets) if id(t) in live]
            if not needed:
                continue
            if drop and isinstance(stmt.expr, Ref) and len(needed) < len(stmt.targets):
                stmt.targets = tuple(stmt.targets[k] for k in needed)
                stmt.expr = Ref(tuple(stmt.expr.values[k] for k in needed))
        if isinstance(stmt, Line):
            live.difference_update(id(t) for t in stmt.targets)
        live.update(id(v) for v in _uses(stmt))  # (a line's arguments, an if's condition)
        keep.append(stmt)
    if drop:
        block[:] = keep[::-1]
    return live


def _prune_loop(loop: For, after: set[int], drop: bool) -> set[int]:
    """A loop's live-in: iterate the body's liveness to a fixed point (the back edge)."""
    live = set(after)
    while True:
        new = after | _prune(loop.body, set(live), drop=False)
        if new == live:
            break
        live = new
    if drop:
        _prune(loop.body, set(live))
    return live


def _exposed(block: list) -> list[SrcVar]:
    """Variables read in ``block`` before it assigns them: what one iteration needs."""
    defined: set[int] = set()
    found: dict[int, SrcVar] = {}
    for stmt in block:
        reads = _uses(stmt) + [v for inner in stmt.blocks for v in _exposed(inner)]
        for v in reads:
            if id(v) not in defined:
                found.setdefault(id(v), v)
        defined |= _must_defined([stmt])
    return list(found.values())


def _must_defined(block: list) -> set[int]:
    """Ids of the variables a block assigns on every path through it: what a line assigns,
    what both branches of an if assign, what a loop's body assigns (a loop runs at least
    once: empty ones vanish)."""
    out: set[int] = set()
    for stmt in block:
        if isinstance(stmt, Line):
            out |= {id(t) for t in stmt.targets}
        else:
            out |= set.intersection(*(_must_defined(inner) for inner in stmt.blocks))
    return out


def _insert_stack(pairs: list[tuple[Any, Any]]) -> bool:
    """The stack: at the end of each forward loop iteration (or branch inside a loop),
    push what the matching reverse block reads of it; pop it where that block starts.
    Inner regions first, so that their pops already define what they restore."""
    used = False
    for fwd, rev in pairs:
        if fwd.dropped or rev.dropped:
            continue
        for forward, reverse in zip(fwd.blocks, rev.blocks):
            inside = _must_defined(forward)
            saved = tuple(v for v in _exposed(reverse) if id(v) in inside)
            if saved:
                carry = bool(forward) and getattr(forward[-1], "kind", "") == "carry"
                forward.insert(len(forward) - carry, Line((), Ref(saved), "push"))
                reverse.insert(0, Line(saved, None, "pop"))
                used = True
    return used


_LETTERS = "abcdefhjkmnpqrstuvwxy"  # no g (adjoints), i, l, o (easily misread), z (output)


class _Namer:
    """Readable, unique names: the user's where free, else a, b, c, ..., then t1, t2 ..."""

    def __init__(self, taken: set[str], reserved: set[str]):
        self.taken = set(taken)  # names given out
        self.reserved = set(reserved)  # the user's names: only a hint may claim one
        self.letters = iter(_LETTERS)
        self.counter = itertools.count(1)
        self.last: dict[str, int] = {}  # base -> the number series(base) gave last

    def free(self, name: str, claim: bool = False) -> bool:
        # (not a name starting with _: the kernel text's globals do, _k_sin and _xp; and
        # only a name in the NFKC form Python reads it in: a __name__ "ｍｇ" is mg)
        return (name.isidentifier() and not keyword.iskeyword(name) and name not in self.taken
                and not name.startswith("_") and (claim or name not in self.reserved)
                and unicodedata.normalize("NFKC", name) == name)

    def take(self, name: str) -> str:
        self.taken.add(name)
        return name

    def fresh(self, hint: str | None = None) -> str:
        if hint and self.free(hint, claim=True):
            return self.take(hint)
        for c in self.letters:
            if self.free(c):
                return self.take(c)
        while True:
            name = f"t{next(self.counter)}"
            if self.free(name):
                return self.take(name)

    def series(self, base: str) -> str:
        """The first free of base1, base2 ... (c1, c2: the constants; gx_1, gx_2 ...).

        A name that is not free never becomes free, so the search resumes after the
        number the base gave last: from 1 each time, the n adjoints of an x that n loops
        read (gx_1 ... gx_n) would cost n^2/2 tries."""
        k = next(k for k in itertools.count(self.last.get(base, 0) + 1)
                 if self.free(f"{base}{k}"))
        self.last[base] = k
        return self.take(f"{base}{k}")


def _program_vars(block: list) -> Iterator[SrcVar]:
    """Every variable of a block, in order: targets and arguments, conditions."""
    for stmt in _walk(block):
        if isinstance(stmt, Line):
            yield from stmt.targets
        yield from _uses(stmt)


def _name_all(namer: _Namer, forward: list, reverse: list, out: SrcVar,
              consts: dict[int, tuple[Any, str]], hints: dict,
              seed: SrcVar | None = None) -> None:
    """Name constants, forward variables (loop and join variables first), adjoints;
    ``seed``, the output's adjoint that a vjp's program takes, is named ``gz`` as an
    adjoint is, even where no line reads it."""
    order = list(_program_vars(forward)) + [out] + list(_program_vars(reverse))
    order += [seed] if seed is not None else []
    for v in order:
        if v.role == "const" and v.value is not None and v.name is None:
            v.name = _const_name(v.value, namer, consts, hints)
    for roles in (("loop", "join"), ("temp", "const")):  # the user's names, where free
        for v in order:
            if v.name is None and v.role in roles and isinstance(v.hint, str) and \
                    namer.free(v.hint, claim=True):
                v.name = namer.take(v.hint)
    if out.name is None and out.role in ("temp", "join"):  # (its own name was not free)
        out.name = namer.fresh("z")
    for v in order:
        if v.name is None and v.role in ("temp", "const", "loop", "join"):
            v.name = namer.fresh(None)
    for v in order:
        if v.role == "adjoint" and v.name is None:  # gx: the adjoint of x (or gx_1 ...)
            base = "g" + v.hint.name
            v.name = namer.take(base) if namer.free(base) else namer.series(base + "_")
    for k, v in enumerate(order):
        if v.name is None:  # reverse temporaries: provisional, renamed after inlining
            v.name = f"_t{k}"


def _const_name(value: Any, namer: _Namer, consts: dict, hints: dict) -> str:
    """The namespace name of a constant: the user's name for it where known (a function's
    own: ``mg.checkpoint(f)``), else c1 ..."""
    if id(value) not in consts:
        hint = hints.get(id(value), (None, getattr(value, "__name__", None)))[1]
        name = hint if hint and namer.free(hint, claim=True) else None
        consts[id(value)] = (value, namer.take(name) if name else namer.series("c"))
    return consts[id(value)][1]
