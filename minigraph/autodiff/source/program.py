"""The program: lines, loops and branches, the data the transformation writes and reads.

A block is a list of statements: :class:`Line` (``targets = expr``, the expression an
:class:`Op`, a :class:`Ref` or a :class:`Fill`), :class:`For` and :class:`If`, which hold
blocks of their own. ``_vars``, ``_uses``, ``_walk`` and ``_defined`` read them.
"""

from __future__ import annotations

from typing import Any, Iterator

from ...ops.primitive import Primitive
from .values import Index, SrcVar


class Op:
    """``prim(*args, **params)``: one primitive, the three-address form's right side."""
    __slots__ = ("prim", "args", "params")

    def __init__(self, prim: Primitive, args: tuple, params: dict):
        self.prim, self.args, self.params = prim, args, params


class Ref:
    """``a, b = x, y``: copies of references (aliases, loop and branch joins, push)."""
    __slots__ = ("values",)

    def __init__(self, values: tuple):
        self.values = tuple(values)


class Fill:
    """A new tensor of one value: the seed ``gz = 1``, a zero adjoint, a number made a tensor."""
    __slots__ = ("value", "shape", "dtype", "device")

    def __init__(self, value: float, like: SrcVar):
        self.value, self.shape, self.dtype, self.device = value, like.shape, like.dtype, like.device


class Line:
    """``targets = expr``; ``kind`` marks the special lines: carry, join, push, pop."""
    __slots__ = ("targets", "expr", "kind")

    def __init__(self, targets: tuple, expr: Any, kind: str = ""):
        self.targets, self.expr, self.kind = tuple(targets), expr, kind


class For:
    """``for index in range(...)`` (or ``reversed(range(...))`` in the reverse sweep).

    ``carry`` pairs each loop variable with the value it has at the end of the body.
    """
    __slots__ = ("index", "range", "body", "reverse", "carry", "dropped")

    def __init__(self, index: Index, rng: range, body: list, reverse: bool = False,
                 carry: tuple = ()):
        self.index, self.range, self.body, self.reverse = index, rng, body, reverse
        self.carry = tuple(carry)
        self.dropped = False


class If:
    """``if cond: then else: orelse``; ``joins`` are the variables both branches assign."""
    __slots__ = ("cond", "then", "orelse", "joins", "dropped")

    def __init__(self, cond: Any, then: list, orelse: list, joins: tuple = ()):
        self.cond, self.then, self.orelse, self.joins = cond, then, orelse, tuple(joins)
        self.dropped = False


def _vars(v: Any) -> Iterator[SrcVar]:
    if type(v) is SrcVar:
        yield v
    elif isinstance(v, (tuple, list)):
        for x in v:
            yield from _vars(x)


def _uses(stmt: Any) -> list[SrcVar]:
    """The variables a line reads (a loop's or branch's own condition for If)."""
    if isinstance(stmt, If):
        return list(_vars(stmt.cond))
    e = stmt.expr
    if isinstance(e, Op):
        return list(_vars(e.args))
    if isinstance(e, Ref):
        return list(_vars(e.values))
    return []


def _walk(block: list) -> Iterator[Any]:
    """Every statement of a block and of its nested blocks (an explicit stack)."""
    stack = list(reversed(block))
    while stack:
        stmt = stack.pop()
        yield stmt
        if isinstance(stmt, For):
            stack.extend(reversed(stmt.body))
        elif isinstance(stmt, If):
            stack.extend(reversed(stmt.orelse))
            stack.extend(reversed(stmt.then))


def _defined(block: list) -> set[int]:
    """Ids of the variables assigned anywhere in ``block``."""
    return {id(t) for s in _walk(block) if isinstance(s, Line) for t in s.targets}
