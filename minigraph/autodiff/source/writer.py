"""The writer: the program being written, where ``SrcVar._bind`` appends its lines.

:meth:`_Writer.op` runs the primitive's shape rule (so errors are found while the program
is written, at the user's line), writes ``x + 0`` or ``x * 1`` as ``x``
(:func:`_identity`) and appends ``t = prim(...)`` to the current block;
:meth:`_Writer.into` switches to another block (a loop body, a branch).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ...device import Device, get_device
from ...errors import DeviceError, MinigraphError
from ...ops import copy as C
from ...ops import shape as SH
from ...ops.primitive import Primitive, bind
from ...tensor import Tensor
from .errors import SourceTransformError, Where, _located, _refusal
from .program import Line, Op
from .values import SrcVar, _concrete


class _Writer:
    """The program being written: the current block, and the user's line we are at."""

    def __init__(self) -> None:
        self.block: list = []
        self.role = "temp"  # role of new variables: "temp" (forward) or "rtemp" (reverse)
        self.where: Where | None = None
        self.hints: dict[int, tuple[Any, str]] = {}  # id(constant) -> (constant, name)
        self.reserved: set[str] = set()  # every name of the functions read

    @contextlib.contextmanager
    def into(self, block: list) -> Iterator[list]:
        saved, self.block = self.block, block
        try:
            yield block
        finally:
            self.block = saved

    def refuse(self, construct: str, why: str = "") -> SourceTransformError:
        where = self.where or Where("?", "?", 0)
        return _refusal(construct, where, why)

    def emit(self, targets: tuple, expr: Any, kind: str = "") -> None:
        self.block.append(Line(targets, expr, kind))

    def new(self, like: Any, role: str, hint: Any = None, active: bool = False) -> SrcVar:
        return SrcVar(like.shape, like.dtype, like.device, active, role, hint)

    def op(self, prim: Primitive, args: tuple, params: dict) -> SrcVar:
        """Append ``t = prim(*args, **params)``; ``t``'s shape and dtype come from the
        primitive's shape rule, so errors are found while the program is written."""
        try:
            shape, dtype = prim.shape(*(_concrete(a) for a in args),
                                      **{k: _concrete(v) for k, v in params.items()})
        except MinigraphError as exc:
            raise _located(exc, self.where) from None
        shape = tuple(shape)
        device = self.device_of(prim, args, params)
        same = _identity(prim, args, shape, dtype)
        if same is not None:
            return same
        active = prim.differentiable and any(type(a) is SrcVar and a.active for a in args)
        out = SrcVar(shape, dtype, device, active, self.role)
        self.emit((out,), Op(prim, tuple(args), dict(params)))
        return out

    def device_of(self, prim: Primitive, args: tuple, params: dict) -> Device:
        devices = {a.device.name: a.device for a in args if isinstance(a, (SrcVar, Tensor))}
        if len(devices) > 1:
            raise _located(DeviceError(
                f"{prim.name}: arguments live on different devices "
                f"({' and '.join(sorted(devices))}); minigraph never copies silently"),
                self.where)
        if prim is C.TO_DEVICE:
            return params["device"]
        return next(iter(devices.values())) if devices else get_device(None)

    def index_by_loop(self, x: SrcVar, parts: tuple) -> SrcVar:
        """``x[i]`` with a loop index: the shape must not depend on the index's value."""
        shapes = {SH.GETITEM.shape(x, index=_concrete(parts, k))[0] for k in (0, 1)}
        if len(shapes) > 1:
            raise self.refuse("an index whose shape changes with the loop index",
                              f"this one gives shapes {sorted(shapes)}; the program is "
                              "written once for every iteration")
        return bind(SH.GETITEM, x, index=parts)


def _identity(prim: Primitive, args: tuple, shape: tuple, dtype: str) -> SrcVar | None:
    """``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``, ``x ** 1`` are ``x`` (same shape, dtype)."""
    if len(args) != 2:
        return None
    x, y = args

    def keep(v: Any) -> SrcVar | None:
        return v if type(v) is SrcVar and v.shape == shape and v.dtype == dtype else None

    def number(v: Any, k: int) -> bool:
        return type(v) in (int, float) and v == k

    name = prim.name
    if name in ("add", "sub", "mul", "div", "pow"):
        unit = 0 if name in ("add", "sub") else 1
        if number(y, unit):
            return keep(x)
        if name in ("add", "mul") and number(x, unit):
            return keep(y)
    return None
