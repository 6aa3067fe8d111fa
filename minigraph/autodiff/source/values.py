"""The values the transformation runs on: :class:`SrcVar`, :class:`Index`, :class:`Cond`.

A source variable knows the shape, dtype and device of its value, but has no value: its
``_bind`` asks the writer of the program being written (``_writing.writer``, a
``_Writer`` from ``program.py``) to append a line, and returns the line's result. An
:class:`Index` is a loop index, a Python int known only when the program runs; a
:class:`Cond` is a condition on one (``i == 0``). Their text is written with the
parentheses Python's operator precedences (``ATOM`` ... ``CMP``, from the primitive table)
need.
"""

from __future__ import annotations

import math
import operator
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from ...device import Device
from ...ops import copy as C
from ...ops import shape as SH
from ...ops.operators import ArrayOps
from ...ops.primitive import ADD, ATOM, CMP, MUL, POW, UNARY, Primitive, register_kind
from ...ops.weak import Weak
from ..tape import is_grad_enabled
from .reading import SourceTransformError

if TYPE_CHECKING:  # for annotations only: program.py imports this module
    from .program import _Writer


class _Writing(threading.local):
    writer: "_Writer | None" = None


_writing = _Writing()


def _writer() -> "_Writer":
    w = _writing.writer
    if w is None:
        raise RuntimeError("a source variable was used outside source transformation")
    return w


class SrcVar(ArrayOps):
    """A variable of the program being written: its shape, dtype and device, no value.

    ``mg.sin(v)`` on a source variable appends the line ``t = mg.sin(v)`` to the program
    and returns the source variable ``t`` (see ``_Writer.op``). ``role`` says what it is:
    ``input``, ``temp`` (a forward line's result), ``loop``/``join`` (a variable assigned
    on several paths), ``const`` (a constant of the program), ``adjoint`` (an adjoint
    ``gx``) or ``rtemp`` (a temporary of the reverse sweep). ``hint`` is the user's name
    for it, or for an adjoint the variable whose adjoint it is.
    """

    __slots__ = ("shape", "dtype", "device", "active", "role", "hint", "name", "value",
                 "view_of")
    _priority = 20  # above tensors and graph nodes: operations on it are written down
    __array_ufunc__ = None  # NumPy defers to our operators (np.float64(2) * v)

    def __init__(self, shape: tuple[int, ...], dtype: str, device: Device,
                 active: bool = False, role: str = "temp", hint: Any = None,
                 value: Any = None):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device
        self.active = active  # does it depend on a differentiated input?
        self.role, self.hint, self.value = role, hint, value
        self.name: str | None = None
        # the variable whose memory this one shares in eager mode (a reshape's, an index's
        # argument, at the root of a chain of them), for normalize.py's updates in place
        self.view_of: SrcVar | None = None

    def _bind(self, prim: Primitive, args: tuple, params: dict) -> "SrcVar":
        return _op(prim, args, params)

    def __getitem__(self, index: Any) -> Any:
        parts = index if isinstance(index, tuple) else (index,)
        if any(_contains(p, SrcVar) for p in parts):
            raise _writer().refuse(
                "indexing with a tensor computed in the function",
                "an index must be known when the program is built: numbers, slices, "
                "the loop index, or constant integer arrays")
        if any(_contains(p, Index) for p in parts):
            return _writer().index_by_loop(self, parts)
        return SH.getitem(self, index)

    def _needs_value(self, what: str) -> SourceTransformError:
        return _writer().refuse(
            f"{what} of a value computed in the function",
            "the program is written before any value exists; decide with an if on a "
            "tensor (compared with >, <, ...) or use mg.where, and keep numbers as tensors")

    def __bool__(self) -> bool: raise self._needs_value("the truth value")
    def __float__(self) -> float: raise self._needs_value("float()")
    def __int__(self) -> int: raise self._needs_value("int()")
    def __index__(self) -> int: raise self._needs_value("using as an integer")
    def __array__(self, *a: Any, **k: Any) -> Any: raise self._needs_value("np.asarray()")
    def item(self) -> Any: raise self._needs_value(".item()")
    def numpy(self) -> Any: raise self._needs_value(".numpy()")

    def __repr__(self) -> str:
        return f"SrcVar({self.name or self.role}: {self.shape} {self.dtype})"


register_kind(SrcVar)


def _op(prim: Primitive, args: tuple, params: dict) -> SrcVar:
    """A line of the program for ``prim``. Inside ``with mg.no_grad():`` (in a function
    that f calls: a with block in f itself is refused) the value is marked, as graph mode
    marks it, so that no adjoint flows through it, as on the tape."""
    out = _writer().op(prim, args, params)
    return out if is_grad_enabled() else _writer().op(C.NO_GRAD, (out,), {})


def _constant(t: Any) -> SrcVar:
    """A constant tensor as a variable of the program (named in its namespace)."""
    return SrcVar(t.shape, t.dtype, t.device, False, "const", None, t)


class Index:
    """A Python int known only when the program runs: a loop index, or arithmetic on one
    (a float where Python's is: ``i / 2``, ``0.5 * i``).

    It prints as its text (``i + 1``); for shape rules it stands for every value it takes
    (``values``: an array with an axis per enclosing loop, :func:`_loop_values`), all of
    which must give the same shapes (``program.py``'s ``_Writer.op``). Where it meets a
    weak value (``s * i``, s a float argument: ops/weak.py) it is a Python number of its
    kind (``_as_number``), and the result is weak, as Python's number is.
    """

    __slots__ = ("text", "values", "prec")
    _priority = 20  # ``tensor * i`` is written down too

    def __init__(self, text: str, values: np.ndarray, prec: int = ATOM):
        self.text, self.values, self.prec = text, values, prec

    def _bind(self, prim: Primitive, args: tuple, params: dict) -> SrcVar:
        return _op(prim, args, params)

    @property
    def _as_number(self) -> Any:
        return self.values.flat[0].item()  # (a value it takes: an int, or a float)

    def _arith(self, other: Any, fn: Callable, sym: str, prec: int, right: bool) -> Any:
        """``self sym other``, or ``other sym self`` for the reflected operator (``right``)."""
        if not isinstance(other, Index) and type(other) not in (int, float):
            return NotImplemented
        a, b = _combined(self.values, other.values if isinstance(other, Index) else other)
        first, second = (other, self) if right else (self, other)
        # (** groups from the right: (i ** 2) ** 3 needs its parentheses, i ** (2 ** 3)
        # not; the other operators from the left)
        outer, inner = (prec + 1, prec) if sym == "**" else (prec, prec + 1)
        text = f"{_paren(first, outer)} {sym} {_paren(second, inner)}"
        return Index(text, _python_values(fn, *((b, a) if right else (a, b)), text), prec)

    def _as_divisor(self, sym: str, fn: Callable) -> None:
        """``s / i``, a Python float (a weak value: ``ops/weak.py``) divided by this
        index with Python's ``fn``: refused where the index takes the value 0, as
        ``1.0 / i`` is (:meth:`_arith`); 1.0 stands for the float, since only the
        divisor decides whether Python raises."""
        _python_values(fn, 1.0, self.values, f"(a float) {sym} {_paren(self, MUL + 1)}")

    def __add__(self, o: Any) -> Any: return self._arith(o, operator.add, "+", ADD, False)
    def __radd__(self, o: Any) -> Any: return self._arith(o, operator.add, "+", ADD, True)
    def __sub__(self, o: Any) -> Any: return self._arith(o, operator.sub, "-", ADD, False)
    def __rsub__(self, o: Any) -> Any: return self._arith(o, operator.sub, "-", ADD, True)
    def __mul__(self, o: Any) -> Any: return self._arith(o, operator.mul, "*", MUL, False)
    def __rmul__(self, o: Any) -> Any: return self._arith(o, operator.mul, "*", MUL, True)
    def __truediv__(self, o: Any) -> Any:
        return self._arith(o, operator.truediv, "/", MUL, False)

    def __rtruediv__(self, o: Any) -> Any:
        return self._arith(o, operator.truediv, "/", MUL, True)

    def __floordiv__(self, o: Any) -> Any:
        return self._arith(o, operator.floordiv, "//", MUL, False)

    def __rfloordiv__(self, o: Any) -> Any:
        return self._arith(o, operator.floordiv, "//", MUL, True)

    def __mod__(self, o: Any) -> Any: return self._arith(o, operator.mod, "%", MUL, False)
    def __rmod__(self, o: Any) -> Any: return self._arith(o, operator.mod, "%", MUL, True)
    def __divmod__(self, o: Any) -> Any: return self // o, self % o
    def __rdivmod__(self, o: Any) -> Any: return o // self, o % self
    def __pow__(self, o: Any) -> Any: return self._arith(o, _power, "**", POW, False)
    def __rpow__(self, o: Any) -> Any: return self._arith(o, _power, "**", POW, True)

    def __neg__(self) -> "Index":
        return Index(f"-{_paren(self, UNARY)}", -self.values, UNARY)

    def __abs__(self) -> "Index":
        return Index(f"abs({self.text})", abs(self.values), ATOM)

    def _compare(self, other: Any, fn: Callable, sym: str) -> Any:
        if not isinstance(other, (Index, int, float)):
            return NotImplemented  # i < x.sum(): the tensor's comparison writes a line
        a, b = _combined(self.values, other.values if isinstance(other, Index) else other)
        return Cond(f"{_paren(self, CMP + 1)} {sym} {_paren(other, CMP + 1)}", fn(a, b))

    def __lt__(self, o: Any) -> Any: return self._compare(o, operator.lt, "<")
    def __le__(self, o: Any) -> Any: return self._compare(o, operator.le, "<=")
    def __gt__(self, o: Any) -> Any: return self._compare(o, operator.gt, ">")
    def __ge__(self, o: Any) -> Any: return self._compare(o, operator.ge, ">=")
    def __eq__(self, o: Any) -> Any:  # type: ignore[override]
        return self._compare(o, operator.eq, "==")

    def __ne__(self, o: Any) -> Any:  # type: ignore[override]
        return self._compare(o, operator.ne, "!=")
    __hash__ = None  # type: ignore[assignment]

    def _unknown(self, what: str) -> SourceTransformError:
        return _writer().refuse(
            f"{what} of the loop index {self.text}",
            "the loop index is only known when the program runs: it can index tensors, "
            "take part in arithmetic and in if conditions, not decide anything while the "
            "program is written")

    def __bool__(self) -> bool: raise self._unknown("the truth value")
    def __index__(self) -> int: raise self._unknown("using as a Python int (range, list index)")
    def __int__(self) -> int: raise self._unknown("int()")
    def __float__(self) -> float: raise self._unknown("float()")

    def __repr__(self) -> str:
        return f"Index({self.text})"


register_kind(Index)


class Cond:
    """A condition known only when the program runs, from the loop index: ``i == 0``.
    It is an if's condition, or an argument written as its text (a VJP rule's
    ``where(y == 0, ...)`` for ``x ** i``); ``values``, its value at each of the values of
    the indices it compares, stands for it in shape rules, as an Index's do."""

    __slots__ = ("text", "values")
    prec = CMP

    def __init__(self, text: str, values: np.ndarray):
        self.text, self.values = text, values

    @property
    def _as_number(self) -> bool:  # (a Python bool where it meets a weak value, as Index)
        return bool(self.values.flat[0])

    def __bool__(self) -> bool:
        raise _writer().refuse(f"the truth value of {self.text} outside an if",
                               "use it directly as the condition of an if")

    _as_divisor = Index._as_divisor  # (s / (i > 0): False divides as 0 in Python)


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a ** b`` on the values of loop indices, as Python computes it, or refused where
    NumPy would not: an integer to a negative integer power is an error in NumPy and a
    float in Python (in those iterations only: ``2 ** (i - 1)`` is 0.5, then 1, 2 ...),
    and an integer power past int64 wraps around in NumPy and grows in Python."""
    if a.dtype.kind in "biu" and b.dtype.kind in "biu":
        if (b < 0).any():
            raise _writer().refuse(
                "an integer to a negative integer power, with a loop index",
                "Python's result is a float where the power is negative and an int where "
                "it is not; write the base as a float (2.0 ** (i - 1))")
        with np.errstate(over="ignore"):  # (inf: past the range too)
            past = (np.abs(a.astype(np.float64)) ** b >= 2.0 ** 63).any()
        if past:
            raise _writer().refuse(
                "an integer power of a loop index past the int64 range",
                "write the base as a float (2.0 ** i)")
    return a ** b


def _python_values(fn: Callable, a: Any, b: Any, text: str) -> np.ndarray:
    """``fn(a, b)``, Python's arithmetic ``text`` on the values the loop indices in it
    take (arrays, :func:`_combined`). Refused, naming the user's line, where one of them
    makes Python raise (``1.0 / i``, ``i // 0``, ``i % i`` at i == 0: ZeroDivisionError,
    which eager mode raises in that iteration) or give a complex number (``(i - 2.0) **
    0.5``), where NumPy would give inf or nan: the program is written once for every
    iteration. Inside ifs on loop indices (``if i > 0:``), only the values at which the
    line runs are checked (``_Writer.runs_where``): Python computes it at no other."""
    runs = _writer().runs_where
    try:
        with np.errstate(divide="raise", over="raise", invalid="raise"):
            if not runs:
                return fn(a, b)
            a_all, b_all, *held = np.broadcast_arrays(*_aligned(a, b, *runs))
            where = np.logical_and.reduce(held)
            fn(a_all[where], b_all[where])  # (checked; the values are those below)
        with np.errstate(all="ignore"):  # (inf or nan where the line never runs)
            return fn(a, b)
    except FloatingPointError as exc:  # (NumPy's words, which name no line)
        raise _writer().refuse(
            f"Python arithmetic that fails at a value of the loop index ({text}: {exc})",
            "Python raises there (ZeroDivisionError for a division by 0, as eager mode "
            "does in that iteration) or computes a complex number (a negative number to "
            "a fractional power); the program, written once for every iteration, would "
            "compute inf or nan. Skip that iteration (range(1, n), or if i > 0:), or "
            "compute with tensors (mg.tensor(1.0) / i), whose arithmetic gives inf and "
            "nan as NumPy's does") from None


def _paren(v: Any, prec: int) -> str:
    if isinstance(v, (Index, Cond)):
        return v.text if v.prec >= prec else f"({v.text})"
    return repr(v) if not (isinstance(v, (int, float)) and v < 0) else f"({v!r})"


def _parts(v: Any) -> Iterator[Any]:
    """The values inside ``v``, through tuples, lists and slices (an index's parts)."""
    if isinstance(v, (tuple, list)):
        for x in v:
            yield from _parts(x)
    elif isinstance(v, slice):
        yield from _parts((v.start, v.stop, v.step))
    else:
        yield v


def _contains(v: Any, kind: type | tuple[type, ...]) -> bool:
    return any(isinstance(x, kind) for x in _parts(v))


def _dynamic(v: Any) -> bool:
    """Whether ``v`` is (or holds) something only known when the program runs."""
    return _contains(v, (SrcVar, Index, Cond, Weak))


# Loop indices and arithmetic on them take at most this many values together (the
# loops' iterations, i and j of two nested loops in ``j - i``): every one is checked.
_GRID = 1 << 20
# A shape is checked at most at this many combinations of the values of the indices
# it is computed from (``x[i:j]``); more are refused.
_CASES = 1 << 15


def _loop_values(rng: range, depth: int) -> np.ndarray:
    """The values a loop's index takes, on the axis of its loop: the ``depth``-th of
    the loops around it (a value of an outer index is the same on the inner ones')."""
    return np.arange(rng.start, rng.stop, rng.step).reshape((1,) * depth + (len(rng),))


def _aligned(*values: Any) -> list[np.ndarray]:
    """Indices' values with one axis per loop, for NumPy to broadcast: an index of the
    loops around another (an outer ``i`` beside the inner ``j``) has fewer axes, its
    loops' first ones; a Python number, none."""
    arrays = [np.asarray(v) for v in values]
    n = max(a.ndim for a in arrays)
    return [a.reshape(a.shape + (1,) * (n - a.ndim)) for a in arrays]


def _grid_size(arrays: list[np.ndarray]) -> int:
    return math.prod(np.broadcast_shapes(*(a.shape for a in arrays)))


def _combined(a: Any, b: Any) -> list[np.ndarray]:
    """The values of two operands of arithmetic on loop indices, aligned; refused where
    the loops give them more than ``_GRID`` values together."""
    aligned = _aligned(a, b)
    if _grid_size(aligned) > _GRID:
        raise _writer().refuse(
            f"arithmetic on the indices of nested loops taking more than {_GRID} values "
            "together", "source mode checks the shapes they give at every one; loop over "
            "fewer iterations, or index with each loop's own index")
    return aligned


def _cases(v: Any, ends: frozenset[int] = frozenset()) -> list[Any] | None:
    """``v`` with its loop indices (and conditions on them) replaced by their values:
    once for each combination of values they take together as the loops run (None for
    more than ``_CASES``). The indices in ``ends`` (by id) are replaced by their least
    and their greatest value only (an index that picks an element: its value never
    changes a shape, and is in bounds at every value if it is at these two)."""
    found = list({id(x): x for x in _parts(v) if isinstance(x, (Index, Cond))}.values())
    fixed = [x for x in found if id(x) in ends]
    free = [x for x in found if id(x) not in ends]
    rows: list[tuple] = [()]
    if free:
        aligned = _aligned(*(x.values for x in free))
        if _grid_size(aligned) > _GRID:
            return None
        columns = [g.ravel() for g in np.broadcast_arrays(*aligned)]
        rows = np.unique(np.rec.fromarrays(columns)).tolist()  # (a record keeps each dtype)
    extremes = [{id(x): x.values.min().item() for x in fixed},
                {id(x): x.values.max().item() for x in fixed}] if fixed else [{}]
    if len(rows) * len(extremes) > _CASES:
        return None
    return [_substitute(v, {**end, **dict(zip((id(x) for x in free), row))})
            for end in extremes for row in rows]


def _substitute(v: Any, values: dict[int, Any]) -> Any:
    """``v`` with each loop index (and condition) replaced by its value in ``values``."""
    if isinstance(v, (Index, Cond)):
        return values[id(v)]
    if isinstance(v, tuple):
        return tuple(_substitute(x, values) for x in v)
    if isinstance(v, slice):
        return slice(*(_substitute(x, values) for x in (v.start, v.stop, v.step)))
    return v
