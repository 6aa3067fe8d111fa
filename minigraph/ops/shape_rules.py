"""Shape and dtype rules shared by the primitives.

A rule takes the abstract values of the arguments (anything with ``.shape`` and
``.dtype``, or a Python number) and returns ``(shape, dtype_name)`` without computing
anything. Graph mode uses them to know every node's result before the graph runs; the
test suite checks each rule against the shape and dtype the kernel really produces.

Dtypes follow NumPy 2 (NEP 50): a Python number is "weak" and takes the dtype of the
array it meets (``float32_array * 2.0`` stays float32); two arrays promote
(``float32 + int64 -> float64``).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ..errors import AxisError, DTypeError, ShapeError

FLOATS = ("float32", "float64")
DTYPES = FLOATS + ("int64", "int32", "bool")  # every dtype minigraph computes in


def dtype_name(dtype: Any, who: str = "dtype") -> str:
    """A dtype as minigraph names it: a name (``"float32"``) as it is, NumPy's dtype or
    scalar type (``np.float32``) by its name, as NumPy users write ``x.astype(np.float32)``.
    Anything else (PyTorch's ``torch.float32``) is refused with a DTypeError that names
    ``who`` and the value: NumPy's own "Cannot interpret ... as a data type" named neither
    the function nor what a dtype may be."""
    if isinstance(dtype, str):
        return dtype
    try:
        return np.dtype(dtype).name
    except TypeError:
        kind = f"{type(dtype).__module__}.{type(dtype).__name__}"  # (torch.dtype)
        raise DTypeError(f"{who}: {dtype!r} (a {kind}) is not a dtype "
                         f"minigraph reads; give its name (one of {', '.join(DTYPES)}) or "
                         f"NumPy's dtype (np.float32)") from None


def supported_dtype(who: str, dtype: Any) -> str:
    """``dtype``'s name if minigraph computes in it (:data:`DTYPES`), else a DTypeError
    that names ``who``: no kernel, device or rule knows float16 or int8."""
    name = dtype_name(dtype, who)
    if name not in DTYPES:
        raise DTypeError(f"{who}: dtype {name} is not supported; use one of "
                         f"{', '.join(DTYPES)}")
    return name


_RANK = {"bool": 0, "int32": 1, "int64": 2, "float32": 3, "float64": 4}


_NO_SHAPE = object()
_LISTS = (list, tuple)  # nested lists of numbers: arrays, once an op's kernel is given them


def shape_of(v: Any) -> tuple[int, ...]:
    """The shape of any value kind: a Python number has shape ``()``, a nested list of
    numbers the shape NumPy gives it (the eager interpreter makes it a tensor; a rule that
    took it for a number gave ``mg.sum([[1, 2], [3, 4]], axis=0)`` back unsummed).
    Anything else without a shape is taken for a number: see :func:`input_shape`."""
    shape: Any = getattr(v, "shape", _NO_SHAPE)
    if shape is _NO_SHAPE:
        return _list_shape("", v) if type(v) in _LISTS else ()
    return shape


def input_shape(op: str, what: str, v: Any) -> tuple[int, ...]:
    """The shape of ``v``, a value the user hands to ``op`` as its ``what`` (a layer's
    input, a loss's target), as :func:`shape_of` reads it; but where shape_of takes
    anything without a shape for a number, of shape ``()`` (a None or a str passed on
    to a layer was told "the input has shape ()"), this refuses what is not a tensor,
    an array, a number or a nested list of numbers with a ``TypeError`` naming ``op``
    and the type, as PyTorch does ("argument 'input' must be Tensor, not NoneType")."""
    shape: Any = getattr(v, "shape", _NO_SHAPE)
    if shape is not _NO_SHAPE:
        return shape  # (the common case, read at once: a tensor, an array, a graph node)
    if type(v) in _LISTS:
        return _list_shape(f"{op}: the {what} is ", v)
    if isinstance(v, (int, float)):  # (a bool is an int)
        return ()
    raise TypeError(f"{op}: the {what} must be a tensor, an array, a number or a nested "
                    f"list of numbers, not {type(v).__name__}")


def _list_shape(where: str, v: Any) -> tuple[int, ...]:
    """NumPy's shape of the nested list ``v``; for a ragged one (rows of several
    lengths), which has none, a ShapeError that ``where`` begins (NumPy's own error
    speaks of "setting an array element with a sequence", naming no op)."""
    try:
        return np.shape(v)
    except ValueError:
        raise ShapeError(f"{where}a nested list whose rows have different lengths "
                         f"(ragged): it has no shape, and is no array") from None


def dtype_of(v: Any) -> str | None:
    """The dtype name of a value (``"float32"``); ``None`` for a weak Python number; for a
    nested list, the dtype NumPy (and ``mg.tensor``) makes of it. Only Python's own
    numbers are weak: ``np.float64`` subclasses float, but NumPy (NEP 50) treats its
    scalars as strong (``float32_array * np.float64(0.1)`` is float64)."""
    if type(v) in (bool, int, float):
        return None
    if type(v) in _LISTS:
        return dtype_name(np.asarray(v).dtype)
    dtype = v.dtype  # a name for minigraph's values, a dtype object for NumPy arrays
    return dtype if isinstance(dtype, str) else getattr(dtype, "name", str(dtype))


def rank(op: str, x: Any) -> int:
    """The number of axes of ``x``; for a graph value of unknown shape (a placeholder made
    with ``shape=None``), a :class:`ShapeError` that names it: an op that needs the rank
    cannot guess it."""
    shape = shape_of(x)
    if shape is None:
        name = getattr(x, "name", None)
        raise ShapeError(f"{op}: needs the rank of its argument{f' {name!r}' if name else ''}, "
                         f"whose shape is unknown until the graph runs; give the placeholder a "
                         f"shape (mg.placeholder(shape=(...)))")
    return len(shape)


def integer(op: str, what: str, n: Any) -> int:
    """``n`` as an int (a NumPy integer too); a float, a bool or anything else is refused
    with a ``DTypeError`` (a ``TypeError``) naming the op, as NumPy refuses them (a float
    axis or size used to fail deep inside, with "'float' object is not iterable" or
    "'<=' not supported"); minigraph's own class, which the caller catches as such."""
    if not isinstance(n, (bool, np.bool_)):
        try:
            return operator.index(n)
        except TypeError:
            pass
    raise DTypeError(f"{op}: {what} must be an integer, got {type(n).__name__} {n!r}")


def sizes(op: str, shape: Any, infer: bool = False) -> tuple[int, ...]:
    """A shape given by the user as a tuple of ints, each >= 0 (or, with ``infer``, one
    of them -1, as reshape takes it): an integer n means (n,), as in NumPy; a list or
    tuple of integers is the shape (NumPy's integers too; a float, whose 2.5 would be
    cut, is refused)."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{op}: a shape is an integer or a tuple of integers, got "
                        f"{type(shape).__name__} {shape!r}")
    out = tuple(integer(op, f"every size of the shape {tuple(shape)}", n) for n in shape)
    if infer and (out.count(-1) > 1 or any(n < -1 for n in out)):
        raise ShapeError(f"{op}: a size must be >= 0, or -1 for one size to be inferred, "
                         f"got shape {out}")
    if not infer and any(n < 0 for n in out):
        raise ShapeError(f"{op}: a size must be >= 0, got shape {out}")
    return out


def operands(op: str, xs: Any) -> list[Any]:
    """The operands an op takes as one sequence (stack, concatenate, add_n), as a list."""
    if not isinstance(xs, (str, bytes)):
        try:
            xs = list(xs)  # (a tensor or array too: its rows, as NumPy takes it)
        except TypeError:
            pass
        else:
            for k, x in enumerate(xs):  # (a str or None was read as a shape () operand)
                if x is None or isinstance(x, (str, bytes)):
                    raise TypeError(f"{op}: element {k} is {x!r}, not a tensor or a number")
            return xs
    raise TypeError(f"{op}: takes a list or tuple of tensors, got {type(xs).__name__}")


def check_axis(op: str, axis: int, x: Any, new: int = 0) -> int:
    """``axis`` as an index among the axes of ``x`` (plus ``new`` axes the op adds, as
    stack does); negative counts from the end, as in NumPy. Out of range, an
    :class:`AxisError` that names the op, the axis, the shape and the rank, never a
    silent wrap-around to another axis."""
    if type(axis) is not int:
        axis = integer(op, "axis", axis)
    ndim = rank(op, x) + new
    if not -ndim <= axis < ndim:
        raise AxisError(f"{op}: axis {axis} is out of range for a tensor of shape "
                        f"{tuple(shape_of(x))} (rank {ndim}; valid axes {-ndim} to {ndim - 1})")
    return axis % ndim


def broadcast_shapes(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy broadcasting: align shapes on the right; sizes must match or be 1."""
    if shapes and shapes.count(shapes[0]) == len(shapes):
        return tuple(shapes[0])  # all the same (the common case: no work to do)
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(-ndim, 0):
        sizes = {s[i] for s in shapes if len(s) >= -i} - {1}
        if len(sizes) > 1:  # (each shape's size there, in argument order, as given)
            given = [s[i] if len(s) >= -i else "none" for s in shapes]
            raise ShapeError(f"{op}: shapes {' and '.join(map(str, shapes))} do not "
                             f"broadcast (axis {i}: sizes {', '.join(map(str, given))})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def promote(*values: Any, op: str = "promote") -> str:
    """The result dtype of combining ``values`` (arrays strong, Python numbers weak), for
    ``op``, which an error names (a NumPy uint8 scalar among them: no dtype of ours)."""
    strong = [d for d in map(dtype_of, values) if d is not None]
    if strong and strong[0] in FLOATS and strong.count(strong[0]) == len(strong):
        return strong[0]  # one float dtype: weak Python numbers take it (the common case)
    if not strong:  # only Python numbers: NumPy's defaults
        if any(type(v) is float for v in values):
            return "float64"
        return "bool" if all(type(v) is bool for v in values) else "int64"
    for d in strong:
        if d not in _RANK:
            supported_dtype(op, d)
    best = max(strong, key=_RANK.__getitem__)
    if best not in FLOATS:
        if any(type(v) is float for v in values):  # (weak ones: see dtype_of)
            return "float64"  # a Python float meets integers: NumPy's default float
        if best == "bool" and any(type(v) is int for v in values):
            return "int64"
    if best == "float32" and any(d in ("int32", "int64") for d in strong):
        return "float64"  # NumPy: float32 with an int64 array needs float64
    return best


def elementwise(name: str):
    """The rule of a broadcasting elementwise op whose result dtype is promoted."""
    def rule(*args: Any, **params: Any) -> tuple:
        return broadcast_shapes(name, *map(shape_of, args)), promote(*args, op=name)
    return rule


def floating(name: str):
    """Like :func:`elementwise`, but integers become float64 (``sin``, ``exp``, ...)."""
    promoted = elementwise(name)

    def rule(*args: Any, **params: Any) -> tuple:
        shape, dtype = promoted(*args)
        return shape, dtype if dtype in FLOATS else "float64"
    return rule


def adjoint(name: str):
    """The rule of a VJP kernel ``(g, y)`` that selects from ``g`` (``relu_grad``): the
    adjoint ``g`` and the value ``y`` broadcast together, in ``g``'s dtype (a Python
    number's: NumPy's default, float64 for a float)."""
    def rule(g: Any, y: Any, **params: Any) -> tuple:
        return broadcast_shapes(name, shape_of(g), shape_of(y)), promote(g)
    return rule


def comparison(name: str):
    """The rule of ``<``, ``==``, ...: broadcast shapes, bool result."""
    def rule(*args: Any, **params: Any) -> tuple:
        return broadcast_shapes(name, *map(shape_of, args)), "bool"
    return rule


def same(x: Any, **params: Any) -> tuple:
    """The result has the argument's shape and dtype."""
    return shape_of(x), dtype_of(x)


def reduced(x: Any, axis: tuple[int, ...] | None, keepdims: bool) -> tuple[int, ...]:
    """The shape left after reducing ``axis`` (all axes for ``None``)."""
    shape = shape_of(x)
    axes = range(len(shape)) if axis is None else axis
    if keepdims:
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)
