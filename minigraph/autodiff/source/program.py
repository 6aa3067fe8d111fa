"""The program: lines, loops and branches, and the writer that appends them.

A block is a list of statements: :class:`Line` (``targets = expr``, the expression an
:class:`Op`, a :class:`Ref` or a :class:`Fill`), :class:`For` and :class:`If`, which hold
blocks of their own (``.blocks``: a loop's body, a branch's two, none for a line).
``_vars``, ``_uses``, ``_walk`` and ``_defined`` read them.

:class:`_Writer` is the program being written, where ``SrcVar._bind`` appends its lines:
:meth:`_Writer.op` runs the primitive's shape rule (so errors are found while the program
is written, at the user's line), writes ``x * 1`` or ``x - 0`` as ``x``
(:func:`_identity`) and appends ``t = prim(...)`` to the current block;
:meth:`_Writer.into` switches to another block (a loop body, a branch).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ...device import Device, get_device
from ...errors import MinigraphError, mixed_devices
from ...ops import copy as C
from ...ops import shape as SH
from ...ops.primitive import Primitive, bind
from ...tensor import Tensor
from .reading import SourceTransformError, Where, _located, _refusal
from .values import _CASES, Cond, Index, SrcVar, _cases, _parts


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
        self.value = value
        self.shape, self.dtype, self.device = like.shape, like.dtype, like.device


class Line:
    """``targets = expr``; ``kind`` marks the special lines: carry, join, push, pop."""
    __slots__ = ("targets", "expr", "kind")
    blocks: tuple[list, ...] = ()  # (a line holds no block)

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

    @property
    def blocks(self) -> tuple[list, ...]:
        return (self.body,)


class If:
    """``if cond: then else: orelse``; ``joins`` are the variables both branches assign."""
    __slots__ = ("cond", "then", "orelse", "joins", "dropped")

    def __init__(self, cond: Any, then: list, orelse: list, joins: tuple = ()):
        self.cond, self.then, self.orelse, self.joins = cond, then, orelse, tuple(joins)
        self.dropped = False

    @property
    def blocks(self) -> tuple[list, ...]:
        return (self.then, self.orelse)


def _vars(v: Any) -> list[SrcVar]:
    """The variables inside ``v`` (a line's arguments, a tuple of them)."""
    return [x for x in _parts(v) if type(x) is SrcVar]


def _uses(stmt: Any) -> list[SrcVar]:
    """The variables a statement itself reads: a line's arguments, an if's condition
    (not what the blocks inside it read)."""
    if isinstance(stmt, If):
        return _vars(stmt.cond)
    e = getattr(stmt, "expr", None)  # (a For reads no variable: its range is known)
    if isinstance(e, Op):
        return _vars(e.args)
    if isinstance(e, Ref):
        return _vars(e.values)
    return []


def _walk(block: list) -> Iterator[Any]:
    """Every statement of a block and of the blocks nested in it, in program order."""
    for stmt in block:
        yield stmt
        for inner in stmt.blocks:
            yield from _walk(inner)


def _defined(block: list) -> set[int]:
    """Ids of the variables assigned anywhere in ``block``."""
    return {id(t) for s in _walk(block) if isinstance(s, Line) for t in s.targets}


class _Writer:
    """The program being written: the current block, and the user's line we are at;
    ``who``, the function the user called (grad, value_and_grad, vjp ...), is named
    first by a refusal."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.block: list = []
        self.role = "temp"  # role of new variables: "temp" (forward) or "rtemp" (reverse)
        self.where: Where | None = None
        self.hints: dict[int, tuple[Any, str]] = {}  # id(constant) -> (constant, name)
        self.reserved: set[str] = set()  # every name of the functions read
        self.nesting: list[Where] = []  # the lines of the blocks we are inside
        # the values of the conditions on loop indices (values.Cond) of the run-time ifs
        # around the line being written: True where it runs (the else branch's negated)
        self.runs_where: list[Any] = []

    @contextlib.contextmanager
    def into(self, block: list) -> Iterator[list]:
        saved, self.block = self.block, block
        try:
            yield block
        finally:
            self.block = saved

    def refuse(self, construct: str, why: str = "") -> SourceTransformError:
        where = self.where or Where("?", "?", 0)
        return _refusal(construct, where, why, self.who)

    def emit(self, targets: tuple, expr: Any, kind: str = "") -> None:
        self.block.append(Line(targets, expr, kind))

    def op(self, prim: Primitive, args: tuple, params: dict) -> SrcVar:
        """Append ``t = prim(*args, **params)``; ``t``'s shape and dtype come from the
        primitive's shape rule, so errors are found while the program is written."""
        shape, dtype = self.shape(prim, args, params)
        device = self.device_of(prim, args, params)
        same = _identity(prim, args, shape, dtype)
        if same is not None:
            return same
        active = prim.differentiable and any(type(a) is SrcVar and a.active for a in args)
        out = SrcVar(shape, dtype, device, active, self.role)
        if args and type(args[0]) is SrcVar and prim.made_a_view(shape, params):
            out.view_of = args[0] if args[0].view_of is None else args[0].view_of
        self.emit((out,), Op(prim, tuple(args), dict(params)))
        return out

    def device_of(self, prim: Primitive, args: tuple, params: dict) -> Device:
        devices = {a.device.name: a.device for a in args if isinstance(a, (SrcVar, Tensor))}
        if len(devices) > 1:
            given = ", ".join(f"shape {a.shape} {a.dtype} on {a.device.name}"
                              for a in args if isinstance(a, (SrcVar, Tensor)))
            raise _located(mixed_devices(prim.name, sorted(devices), given), self.where)
        if prim is C.TO_DEVICE:
            return params["device"]
        return next(iter(devices.values())) if devices else get_device(None)

    def shape(self, prim: Primitive, args: tuple, params: dict) -> tuple[tuple, str]:
        """The shape and dtype of ``prim(*args, **params)`` by the primitive's shape rule,
        the same at every value of the loop indices among them, at each of which it is
        computed (the program is written once for every iteration: ``c[i % 2::2]`` is
        refused). An index that is a whole argument (``x * i``) or picks an element
        (``x[i]``) never sets a shape: its least and greatest values are checked."""
        picks = [*args, *(params["index"] if prim is SH.GETITEM else ())]
        cases = _cases((args, tuple(params.values())),
                       frozenset(id(a) for a in picks if isinstance(a, (Index, Cond))))
        if cases is None:
            raise self.refuse(f"{prim.name} on loop indices taking more than {_CASES} "
                              "combinations of values",
                              "source mode checks the shape at every one; loop over fewer "
                              "iterations, or index so that the shape cannot change")
        results = set()
        for case_args, case_params in cases:
            try:
                shape, dtype = prim.shape(*case_args, **dict(zip(params, case_params)))
            except MinigraphError as exc:
                raise _located(exc, self.where) from None
            results.add((tuple(shape), dtype))
        if len(results) > 1:
            raise self.refuse(f"{prim.name} with a shape that changes with the loop index",
                              f"at the values the loop's indices take it gives shapes "
                              f"{sorted(str(r[0]) for r in results)}; the program is "
                              "written once for every iteration")
        return results.pop()

    def index_by_loop(self, x: SrcVar, parts: tuple) -> SrcVar:
        """``x[i]`` with a loop index (its shape is checked at every value: :meth:`shape`)."""
        return bind(SH.GETITEM, x, index=parts)


def _identity(prim: Primitive, args: tuple, shape: tuple, dtype: str) -> SrcVar | None:
    """``x`` for ``x - 0``, ``1 * x``, ``x ** 1`` and the like (the number the primitive's
    table entry calls ``neutral``), if the result has x's shape and dtype."""
    if prim.neutral is None or len(args) != 2:
        return None
    for k in prim.neutral[1]:
        x, y = args[1 - k], args[k]
        if type(y) in (int, float) and prim.is_neutral(y, k) and type(x) is SrcVar and \
                (x.shape, x.dtype) == (shape, dtype):
            return x
    return None
