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
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np

from . import copy as C
from . import elementwise as E
from .primitive import Primitive, bind, bind_one, bind_two, register_kind
from .shape_rules import promote

_NUMBERS = (bool, int, float)
# The Python number a weak value stands for, by its dtype, for promote
AS_NUMBER = {"float64": 1.0, "int64": 1, "bool": True}


class Weak:
    """A 0-d value of a recording (``value``: a graph node, a source variable) that
    stands for a Python number: a float argument, or Python's arithmetic on one."""

    __slots__ = ("value",)
    _priority = 30  # above graph nodes (10) and source variables (20), below every level

    def __init__(self, value: Any):
        self.value = value

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
            return Weak(bind_two(prim, _inner(a), _inner(b)))
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
    def __neg__(self) -> "Weak": return Weak(bind_one(E.NEG, self.value, {}))
    def __pos__(self) -> "Weak": return self
    def __abs__(self) -> "Weak": return Weak(E.abs(self.value))
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
                 _as(a.value, dtype if k in among else a.dtype, device)
                 for k, a in enumerate(args))


def _as(value: Any, dtype: str, device: Any) -> Any:
    value = C.astype(value, dtype, copy=False)
    if device is not None and device.name != value.device.name:
        value = C.to_device(value, device)
    return value


def strong(x: Any) -> Any:
    """``x``, and a weak value as the 0-d tensor of its own dtype that eager mode makes
    of a Python number (``mg.tensor(2.0)`` is float64)."""
    return x.value if type(x) is Weak else x
