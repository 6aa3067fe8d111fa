"""A Python number that a compiled program reads as data: weak, as in eager mode.

Eager mode hands a Python float to the kernel as it is, and NumPy (NEP 50) lets it take
the dtype of the array it meets: ``x * 0.5`` is float32 for a float32 ``x``. A compiled
program (``mg.trace``, graph and source mode) reads the same float as a 0-d float64 input,
so that one program serves all its values; left at that, ``x * s`` would be float64
there. So while f is recorded, such an argument is a :class:`Weak` around its input
(a graph node, a source variable), and it behaves as the float would in eager mode:

* Python's arithmetic on it and on Python numbers (``s * 3.0``, ``-s``, ``abs(s)``,
  ``s ** 2``, ``s > 0``) gives a weak value, as it gives a Python number there;
* where it meets a value that has a dtype (``x * s``, ``mg.where(c, x, s)``) or enters an
  ``mg`` function (``mg.sin(s)``, which makes a float64 tensor of a float), it is cast
  first to the dtype the Python number would have taken there:
  :func:`~minigraph.ops.shape_rules.promote` with it as a number.

A transformation that turns a float into a tensor in eager mode (the argument ``mg.grad``
differentiates, ``mg.jvp``'s primal) takes :func:`strong` of it. JAX calls such values
weakly typed. A divisor known while f is recorded is checked as Python checks it:
``s / 0`` raises Python's ZeroDivisionError, and so does ``s / i`` in source mode where
the loop index i takes the value 0 (the program would compute inf or nan). What a
program cannot follow is Python's own behaviour that depends on the weak value itself:
``(-s) ** 0.5`` is a complex number and ``1.0 / s`` raises in Python for s = 0, where the
program computes NaN and inf, as NumPy does.

Python's ints are not NumPy's: a bool in arithmetic is an int (``True + True`` is 2,
where NumPy's bool addition is logical or, True), and an int never overflows, where the
program's int64 wraps around. So a weak bool becomes a weak int before arithmetic, and a
weak int carries ``bounds``, the least and the greatest value it can take (a comparison
gives 0 or 1, a literal itself, arithmetic the extremes of its operands'): arithmetic
whose bounds leave int64 is refused while f is recorded, since the one program serves
every value of the float argument.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np

from ..errors import DTypeError
from . import copy as C
from . import elementwise as E
from .primitive import Primitive, bind, bind_one, bind_two, register_kind
from .shape_rules import promote

_NUMBERS = (bool, int, float)
# The Python number a weak value stands for, by its dtype, for promote
AS_NUMBER = {"float64": 1.0, "int64": 1, "bool": True}
# The ints an int64 holds: what a weak int's bounds must stay within
_INT64 = (-2**63, 2**63 - 1)


class Weak:
    """A 0-d value of a recording (``value``: a graph node, a source variable) that
    stands for a Python number: a float argument, or Python's arithmetic on one."""

    __slots__ = ("value", "bounds")
    _priority = 30  # above graph nodes (10) and source variables (20), below every level

    def __init__(self, value: Any, bounds: tuple[int, int] | None = None):
        self.value = value
        # (for an int: the least and the greatest value it can take, None where unknown:
        # a value that a source program joins from two paths; a bool is 0 or 1)
        self.bounds = (0, 1) if value.dtype == "bool" else bounds

    shape: tuple[int, ...] = ()

    @property
    def dtype(self) -> str:
        return self.value.dtype

    @property
    def device(self) -> Any:
        return self.value.device

    def _bind(self, prim: Primitive, args: tuple, params: dict) -> Any:
        """An ``mg`` function of weak values, or an operator where one meets a value with
        a dtype: each weak value cast first to the dtype its number would take."""
        return bind(prim, *cast(args, prim.promoted), **params)

    # -- Python's arithmetic: weak on weak values and numbers, as on Python numbers -------
    def _arith(self, prim: Primitive, a: Any, b: Any) -> Any:
        if _as_number(a) is not None and _as_number(b) is not None:
            if prim in _DIVISIONS:
                _divisor(_as_number(a), b, *_DIVISIONS[prim])
            if prim in _COMPARISONS:  # (bools compare as Python's do: as 0 and 1)
                return Weak(bind_two(prim, _inner(a), _inner(b)))
            a, b = _as_int(a), _as_int(b)  # (Python's arithmetic reads a bool as an int)
            if prim is E.POW and _is_int(a) and _is_int(b):
                a = _int_power_base(a, b)
            out = Weak(bind_two(prim, _inner(a), _inner(b)))
            if out.dtype == "int64":
                out.bounds = _int_bounds(prim.symbol or prim.name, prim, a, b)
            return out
        return bind_two(prim, a, b)  # the other value's dtype decides: _bind casts

    def __add__(self, o: Any) -> Any: return self._arith(E.ADD, self, o)
    def __radd__(self, o: Any) -> Any: return self._arith(E.ADD, o, self)
    def __sub__(self, o: Any) -> Any: return self._arith(E.SUB, self, o)
    def __rsub__(self, o: Any) -> Any: return self._arith(E.SUB, o, self)
    def __mul__(self, o: Any) -> Any: return self._arith(E.MUL, self, o)
    def __rmul__(self, o: Any) -> Any: return self._arith(E.MUL, o, self)
    def __truediv__(self, o: Any) -> Any: return self._arith(E.DIV, self, o)
    def __rtruediv__(self, o: Any) -> Any: return self._arith(E.DIV, o, self)
    def __pow__(self, o: Any) -> Any: return self._arith(E.POW, self, o)
    def __rpow__(self, o: Any) -> Any: return self._arith(E.POW, o, self)
    def __floordiv__(self, o: Any) -> Any: return self._arith(E.FLOOR_DIVIDE, self, o)
    def __rfloordiv__(self, o: Any) -> Any: return self._arith(E.FLOOR_DIVIDE, o, self)
    def __mod__(self, o: Any) -> Any: return self._arith(E.REMAINDER, self, o)
    def __rmod__(self, o: Any) -> Any: return self._arith(E.REMAINDER, o, self)
    def __lt__(self, o: Any) -> Any: return self._arith(E.LESS, self, o)
    def __le__(self, o: Any) -> Any: return self._arith(E.LESS_EQUAL, self, o)
    def __gt__(self, o: Any) -> Any: return self._arith(E.GREATER, self, o)
    def __ge__(self, o: Any) -> Any: return self._arith(E.GREATER_EQUAL, self, o)
    def __eq__(self, o: Any) -> Any: return self._arith(E.EQUAL, self, o)  # type: ignore[override]
    def __ne__(self, o: Any) -> Any: return self._arith(E.NOT_EQUAL, self, o)  # type: ignore[override]
    __hash__ = object.__hash__
    def __neg__(self) -> "Weak": return self._unary("-", E.NEG)
    def __pos__(self) -> "Weak": return _as_int(self)  # (+True is 1)
    def __abs__(self) -> "Weak": return self._unary("abs", E.ABS)

    def _unary(self, sym: str, prim: Primitive) -> "Weak":
        """``-s``, ``abs(s)``: of a bool, of its int (``-True`` is -1), as in Python."""
        a = _as_int(self)
        return Weak(bind_one(prim, a.value, {}), _int_bounds(sym, prim, a))

    def __invert__(self) -> "Weak":
        """``~n``: Python's ``-n - 1`` for an int or a bool (``~True`` is -2); a float
        has none, and Python's TypeError says so."""
        if self.dtype == "float64":
            raise TypeError("bad operand type for unary ~: 'float' (a float argument of a "
                            "function being recorded, as in Python)")
        return -self - 1

    # -- Python's bitwise operators: on bools, logic; on ints, none in minigraph ----------
    def _bitwise(self, sym: str, a: Any, b: Any) -> Any:
        """``a & b``, ``a | b``, ``a ^ b`` of two bools: and, or, exclusive or, as in
        Python; a float has no bitwise operator (Python's TypeError), and minigraph has no
        bitwise operation on ints (a refusal that says so)."""
        kinds = [_python_type(v) for v in (a, b)]
        if kinds == ["bool", "bool"] and sym in _LOGIC:
            return Weak(bind_two(_LOGIC[sym], _inner(a), _inner(b)))
        if "float" in kinds or None in kinds:
            first, second = (k or type(v).__name__ for k, v in zip(kinds, (a, b)))
            raise TypeError(f"unsupported operand type(s) for {sym}: '{first}' and "
                            f"'{second}' (a value computed from an argument of a function "
                            f"being recorded, as in Python)")
        raise _refused(f"the operator {sym} on ints", "minigraph has no bitwise operation on "
                       "integers (only &, | and ^ of two bools: logic)")

    def __and__(self, o: Any) -> Any: return self._bitwise("&", self, o)
    def __rand__(self, o: Any) -> Any: return self._bitwise("&", o, self)
    def __or__(self, o: Any) -> Any: return self._bitwise("|", self, o)
    def __ror__(self, o: Any) -> Any: return self._bitwise("|", o, self)
    def __xor__(self, o: Any) -> Any: return self._bitwise("^", self, o)
    def __rxor__(self, o: Any) -> Any: return self._bitwise("^", o, self)
    def __lshift__(self, o: Any) -> Any: return self._bitwise("<<", self, o)
    def __rlshift__(self, o: Any) -> Any: return self._bitwise("<<", o, self)
    def __rshift__(self, o: Any) -> Any: return self._bitwise(">>", self, o)
    def __rrshift__(self, o: Any) -> Any: return self._bitwise(">>", o, self)

    # (Python's divmod is the pair of its // and %, both weak)
    def __divmod__(self, o: Any) -> tuple: return self // o, self % o
    def __rdivmod__(self, o: Any) -> tuple: return o // self, o % self

    def __round__(self, ndigits: Any = None) -> Any:
        """``round(n)`` of an int or a bool is the int itself, as in Python; a float's
        rounding (to the nearest even) has no operation in minigraph: refused."""
        if self.dtype != "float64" and (ndigits is None or ndigits >= 0):
            return _as_int(self)
        raise _refused("round()", "minigraph has no rounding operation; a float argument "
                       "is data of the recorded program, not a number known now: round it "
                       "before the call, or use s // 1.0 (floor)")

    def __matmul__(self, o: Any) -> Any: return self.value @ o  # (a 0-d value: the error)
    def __rmatmul__(self, o: Any) -> Any: return o @ self.value

    # -- what needs the number itself: the recording's own refusal --------------------------
    def __bool__(self) -> bool: return bool(self.value)
    def __float__(self) -> float: return float(self.value)
    def __int__(self) -> int: return int(self.value)
    def __index__(self) -> int: return self.value.__index__()
    def item(self) -> Any: return self.value.item()
    def numpy(self) -> Any: return self.value.numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        # (without it, NumPy read the value as an opaque object: np.asarray(s) was an
        # object array, which failed later as "dtype object is not supported"; now a
        # graph node's or a source variable's own refusal says what happened, and why)
        return np.asarray(self.value, dtype=dtype, copy=copy)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """NumPy's operator on a NumPy value and this one (``np.float64(2) * s`` calls
        np.multiply) is answered by our own operator, as it is for a Python float; any
        other NumPy function (``np.sqrt(s)``) needs the number, and gets the recording's
        refusal from np.asarray (a TracedValueError naming the argument and its line)."""
        names = _NUMPY_OPERATORS.get(ufunc)
        if method == "__call__" and names is not None and len(inputs) == 2 and not kwargs:
            a, b = inputs
            return getattr(self, names[0])(b) if a is self else getattr(self, names[1])(a)
        return getattr(ufunc, method)(*[np.asarray(x) for x in inputs], **kwargs)

    def _kind(self) -> str:  # (what an error calls it, as ArrayOps._kind)
        return "float argument of a function being recorded (mg.trace, graph or source mode)"

    def __repr__(self) -> str:
        return f"Weak({self.value!r})"


register_kind(Weak)

# The ufunc NumPy calls for an operator -> Weak's method for it, with the weak value on the
# left and on the right (reflected: ``2 < s`` is ``s > 2``)
_NUMPY_OPERATORS = {
    np.add: ("__add__", "__radd__"), np.subtract: ("__sub__", "__rsub__"),
    np.multiply: ("__mul__", "__rmul__"), np.divide: ("__truediv__", "__rtruediv__"),
    np.power: ("__pow__", "__rpow__"), np.floor_divide: ("__floordiv__", "__rfloordiv__"),
    np.remainder: ("__mod__", "__rmod__"), np.matmul: ("__matmul__", "__rmatmul__"),
    np.less: ("__lt__", "__gt__"), np.less_equal: ("__le__", "__ge__"),
    np.greater: ("__gt__", "__lt__"), np.greater_equal: ("__ge__", "__le__"),
    np.equal: ("__eq__", "__eq__"), np.not_equal: ("__ne__", "__ne__")}


# Python's division operators: their symbol and Python's own arithmetic for each
_DIVISIONS = {E.DIV: ("/", operator.truediv), E.FLOOR_DIVIDE: ("//", operator.floordiv),
              E.REMAINDER: ("%", operator.mod)}


def _divisor(number: Any, b: Any, sym: str, fn: Callable[[Any, Any], Any]) -> None:
    """Python's ``a / b`` (``//``, ``%``) on numbers raises ZeroDivisionError where b is
    0, and a program would compute inf or nan there: a divisor known while f is
    recorded is checked now. A Python number by Python's own arithmetic (``fn`` on
    ``number``, the number a stands for), whose error eager mode raises too; a value
    that knows every number it stands for (source mode's loop index) by its
    ``_as_divisor``, which refuses a 0 among them, naming the line."""
    if type(b) in _NUMBERS:
        fn(number, b)  # (Python's ZeroDivisionError where b is 0; the result is not used)
    elif hasattr(b, "_as_divisor"):
        b._as_divisor(sym, fn)


# Python's comparisons of two numbers (a bool compares as an int: as NumPy's bool does)
_COMPARISONS = frozenset((E.LESS, E.LESS_EQUAL, E.GREATER, E.GREATER_EQUAL, E.EQUAL,
                          E.NOT_EQUAL))
# Python's logic on two bools, as the primitive on bools that computes it
_LOGIC = {"&": E.MINIMUM, "|": E.MAXIMUM, "^": E.NOT_EQUAL}


def _python_type(v: Any) -> str | None:
    """The type of Python number ``v`` is or stands for: "bool", "int" or "float"."""
    n = _as_number(v)
    return None if n is None else type(n).__name__


def _as_int(v: Any) -> Any:
    """``v`` as Python's arithmetic reads it: a bool as the int 0 or 1 (``True + True``
    is 2, where NumPy's bool addition, logical or, gives True)."""
    if type(v) is bool:
        return int(v)
    if type(v) is Weak and v.dtype == "bool":
        return Weak(C.astype(v.value, "int64"), (0, 1))
    return v


def _is_int(v: Any) -> bool:
    return _python_type(v) == "int"


def _bounds(v: Any) -> tuple[int, int] | None:
    """The least and the greatest value of the int ``v``: a Python int's own, a weak
    int's ``bounds``; None where unknown (a source program's loop index)."""
    if type(v) is int:
        return v, v
    return v.bounds if type(v) is Weak else None


def _int_power_base(a: Any, b: Any) -> Any:
    """``a`` for Python's ``a ** b`` of two ints, which is an int for ``b >= 0`` and a
    float for ``b < 0`` (``2 ** -1`` is 0.5; NumPy refuses an int to a negative int power):
    the base as a float where ``b`` is a negative int literal; refused where ``b`` may be
    negative or not, since its value then decides the result's type."""
    if type(b) is int and b < 0:
        return float(a) if type(a) is int else Weak(C.astype(a.value, "float64"))
    bounds = _bounds(b)
    if bounds is not None and bounds[0] < 0:
        raise _refused("the operator ** on ints", f"the exponent may be negative (from "
                       f"{bounds[0]} to {bounds[1]}), and Python's result is then a float, an "
                       f"int otherwise: its value decides the type, which a program fixes "
                       f"beforehand. Write a float base (2.0 ** n) for a float")
    return a


def _int_bounds(sym: str, prim: Primitive, a: Any, b: Any = 0) -> tuple[int, int] | None:
    """The least and the greatest value of Python's int ``a sym b`` (``sym a`` for one
    argument), from those of ``a`` and ``b``; refused where they leave int64, in which
    the program computes it and would wrap around, where Python's int grows."""
    ab, bb = _bounds(a), _bounds(b)
    if ab is None or bb is None:
        return None
    ends = [abs(n) for n in ab + bb]
    if prim in (E.ADD, E.SUB, E.MUL):  # (extremes at the ends of the operands' bounds)
        fn = {E.ADD: operator.add, E.SUB: operator.sub, E.MUL: operator.mul}[prim]
        values = [fn(x, y) for x in ab for y in bb]
    elif prim is E.POW:  # (|a ** b| <= max|a| ** max b, for b >= 0: _int_power_base)
        base = max(ends[:2])
        top = base ** bb[1] if base <= 1 or bb[1] < 64 else 2**64  # (2**64: beyond int64)
        values = [-top if ab[0] < 0 else 0, top]
    elif prim is E.FLOOR_DIVIDE:  # |a // b| <= |a|
        values = [-max(ends[:2]), max(ends[:2])]
    elif prim is E.REMAINDER:  # |a % b| < |b|
        values = [-max(ends[2:]), max(ends[2:])]
    elif prim is E.NEG:
        values = [-ab[1], -ab[0]]
    else:  # abs
        values = [0 if ab[0] <= 0 <= ab[1] else min(ends[:2]), max(ends[:2])]
    low, high = min(values), max(values)
    if low < _INT64[0] or high > _INT64[1]:
        raise _refused(f"the operator {sym} on ints", f"Python's int result can reach "
                       f"{low if low < _INT64[0] else high}, beyond int64 ({_INT64[0]}.."
                       f"{_INT64[1]}), in which the recorded program computes it and would "
                       f"wrap around for some value of the argument (Python's int grows). "
                       f"Compute in floats (2.0 ** 40, not 2 ** 40)")
    return low, high


def _refused(what: str, why: str) -> DTypeError:
    """The refusal of ``what`` on a weak value, naming the user's line (graph/graph.py's
    helpers, imported here: the graph package imports this one)."""
    from ..graph.graph import describe_location, user_location

    return DTypeError(f"{what}, with a value computed from a float or bool argument of a "
                      f"function being recorded (mg.trace, graph or source mode), is not "
                      f"supported: {why} (at {describe_location(user_location())})")


def _as_number(v: Any) -> Any:
    """The Python number ``v`` is, or stands for in promotion; None for a value with a
    dtype. A weak value stands for a number of its kind; so does a value that a recording
    knows only as a Python number computed when its program runs, which says of which
    kind by its ``_as_number`` (source mode's loop index, an int, and a condition on
    one, a bool: ``s * i`` is Python's float arithmetic there, weak)."""
    if type(v) is Weak:
        return AS_NUMBER.get(v.dtype, 1.0)
    if type(v) in _NUMBERS:
        return v
    return getattr(v, "_as_number", None)


def _inner(v: Any) -> Any:
    return v.value if type(v) is Weak else v


def cast(args: tuple, promoted: tuple[int, ...] | None = None) -> tuple:
    """``args`` with each weak value replaced by its value in the dtype its Python number
    would take among them (NEP 50, as :func:`promote` says): ``x * s`` reads ``s`` in
    ``x``'s float32, ``mg.sin(s)`` in float64; and on their device, since a number has
    none (the float's input lives on the default device, x on any). Only the arguments
    at the positions ``promoted`` (all if None), the primitive's, decide the dtype, and
    only they take it: ``where(c, s, x)`` takes x's dtype whatever c's, and a weak
    condition keeps its own (0.1 cast to x's int64 would be 0, false)."""
    among = range(len(args)) if promoted is None else promoted
    dtype = promote(*(a if (n := _as_number(a)) is None else n
                      for a in (args[k] for k in among)
                      if not isinstance(a, (tuple, list, str, type(None)))))
    device = next((a.device for a in args if type(a) is not Weak and  # (a Device: not
                   hasattr(getattr(a, "device", None), "name")), None)  # NumPy's "cpu")
    return tuple(a if type(a) is not Weak else
                 _as(a, dtype if k in among else a.dtype, device)
                 for k, a in enumerate(args))


def _as(weak: Weak, dtype: str, device: Any) -> Any:
    """``weak``'s value in ``dtype`` on ``device``; an int that ``dtype`` may not hold is
    refused (NumPy raises OverflowError for the Python int in eager mode; a cast wraps)."""
    if dtype == "int32" and weak.bounds is not None:
        (low, high), info = weak.bounds, np.iinfo(np.int32)
        if low < info.min or high > info.max:
            raise _refused("an int meeting an int32 value", f"the int can take values "
                           f"from {low} to {high}, and int32 holds {info.min}..{info.max} "
                           f"(NumPy raises OverflowError for such a Python int; a cast "
                           f"would wrap)")
    value = C.astype(weak.value, dtype, copy=False)
    if device is not None and device.name != value.device.name:
        value = C.to_device(value, device)
    return value


def strong(x: Any) -> Any:
    """``x``, and a weak value as the 0-d tensor of its own dtype that eager mode makes
    of a Python number (``mg.tensor(2.0)`` is float64)."""
    return x.value if type(x) is Weak else x
