"""Transformation levels: how nested transformations keep their values apart.

Every transformation that wraps values (``jvp``'s dual numbers, ``vjp``'s recorded
boxes, ``vmap``'s batched values) takes a fresh *level* from one counter when it starts.
A wrapped value carries the level that made it, and ``bind`` (``ops/primitive.py``)
hands each operation to the interpreter of the highest level among its arguments; that
interpreter unwraps its own values and calls ``bind`` again, one level down. A value of
a lower level is a constant to a higher one. This is JAX's rule of trace levels: in
``grad(lambda y: grad(f)(x, y))`` the inner ``grad`` is started later, so its level is
higher, and its values carry the outer one's perturbation inside them.

Levels start at 100, above the two kinds that never nest by levels: graph nodes (10)
and source variables (20), which are always the innermost, concrete-most interpreters.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..errors import GradientError, MinigraphError

_counter = itertools.count(100)


def new_level() -> int:
    """A level above every level handed out before."""
    return next(_counter)


# The levels whose transformation is running: a level leaves when its call returns (or
# raises). A value of a level no longer here escaped its transformation (``leak.append(x)``
# inside f, used after the call): its interpreter is gone, so an operation on it has no
# meaning, and carrying on would hand later top-level calls a wrapped value (and append to
# a finished tape forever). Its ``_bind`` refuses instead, as JAX raises its
# UnexpectedTracerError. (A set of the running levels, not of the finished ones: it stays
# as small as the nesting.)
running: set[int] = set()


class EscapedValueError(MinigraphError, RuntimeError):
    """A value of a transformation used after the transformation returned."""


@contextmanager
def level_running(level: int) -> Iterator[None]:
    """``with level_running(level):`` around the call of f: the level's values are alive
    inside, and escaped ones after (see :data:`running`)."""
    running.add(level)
    try:
        yield
    finally:
        running.discard(level)


def escaped(name: str, op: str) -> EscapedValueError:
    """The error for a value of the transformation ``name`` used by the op ``op`` after
    the transformation returned (the user's line is the traceback's last)."""
    return EscapedValueError(
        f"{op}: a value of {name} escaped the function it was computed in (stored in a "
        f"list or a global?) and was used after {name} returned; return it from the "
        f"function instead")


def transformation(fn: Callable[..., Any], name: str,
                   of: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Mark ``fn`` as made by a transformation (``fn.transformation`` names it): source
    transformation lets such a function see the values of its program, since every
    transformation runs on any kind of value. ``of`` is the function transformed, which
    takes the same arguments: it becomes ``fn.__wrapped__``, as ``functools.wraps`` (and
    JAX's transformations) set it, so ``inspect.signature(fn)`` names f's parameters
    (source mode writes them into the function that calls ``fn``: ``reading.py``)."""
    fn.transformation = name  # type: ignore[attr-defined]
    if of is not None:
        fn.__wrapped__ = of  # type: ignore[attr-defined]
    return fn


class ValueInside:
    """What Python asks of a value a transformation wraps, answered by the value inside
    (``_inside()``: a ``vjp`` box's content, a dual number's primal), as a tensor answers
    in define-by-run: ``if x > 0:``, ``float(x)``, ``int(x)``, ``x.item()``.
    Where the value inside has no value (a graph node), its own error says so.

    The number drops the derivative, as PyTorch's ``float(x)`` does: asking for a number is
    asking for a constant (``tolist()`` likewise gives numbers). ``numpy()`` and
    ``np.asarray(x)`` refuse, as PyTorch's do on a tensor that requires a gradient: an
    array looks like the value itself, derivative and all."""

    __slots__ = ()

    def _inside(self) -> Any:
        raise NotImplementedError

    def __bool__(self) -> bool:
        return bool(self._inside())

    def __float__(self) -> float:
        return float(self._inside())

    def __int__(self) -> int:
        return int(self._inside())

    def item(self) -> Any:
        return self._inside().item()

    def tolist(self) -> Any:
        return self._inside().tolist()

    def numpy(self) -> Any:
        raise _no_array("numpy()")

    def _no_array_of(self, what: str) -> str:  # (x.data, DLPack: ops/operators.py)
        return str(_no_array(what))

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        # (np.asarray(x) and np.array(x) ask this first; without it, NumPy read x as a
        # sequence and made an object array, which failed later without saying why)
        raise _no_array("np.asarray()")


def _no_array(what: str) -> GradientError:
    return GradientError(
        f"{what}: this value is being differentiated (inside mg.grad, mg.vjp, mg.jvp "
        "...), and a NumPy array would silently drop its derivative. Use minigraph "
        "functions on it, or x.detach().numpy() if a constant is really meant")
