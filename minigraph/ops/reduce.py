"""Reductions: sum, mean, max, min over some axes, and ``sum_to`` (undoing a broadcast).

Every reduction's VJP is the same idea: the adjoint of a reduced value is spread back
over the elements that were reduced. ``_expand`` puts the removed axes back (as size 1)
and broadcasts; ``sum`` gives each element the whole adjoint, ``mean`` a 1/n share, and
``max`` and ``min`` give it to the elements that attained the result (split evenly at
ties).
"""

from __future__ import annotations

import builtins
import math
from typing import Any, Callable, TypeAlias

import numpy as np

from . import batch_rules as B
from . import copy as C
from . import shape_rules as S
from ..errors import ShapeError
from .primitive import PRIMITIVES, bind, bind_one, primitive

Axis: TypeAlias = "int | tuple[int, ...] | None"


def _reduce_shape(x: Any, axis: tuple[int, ...] | None, keepdims: bool) -> tuple:
    """A max keeps the dtype of ``x``."""
    return S.reduced(x, axis, keepdims), S.dtype_of(x)


def _reduce_shape_as(other: str) -> Any:
    """The rule of a reduction whose result has dtype ``other`` unless ``x`` is floating,
    as its kernel gives it: NumPy's and the Array API's sum adds integers and bools in
    the default integer, int64; NumPy's mean divides them in float64. (A graph node that
    said int32 while its kernel gave int64 misled every rule after it.)"""
    def rule(x: Any, axis: tuple[int, ...] | None, keepdims: bool) -> tuple:
        dtype = S.dtype_of(x)
        return S.reduced(x, axis, keepdims), dtype if dtype in S.FLOATS or dtype is None \
            else other
    return rule


def _expand(g: Any, x: Any, axis: tuple[int, ...] | None, keepdims: bool) -> Any:
    """Broadcast a reduced value ``g`` back to the shape of ``x``.

    (This module defines ``sum`` and ``max`` as minigraph functions; Python's own are
    reached as ``builtins.sum`` and ``builtins.max``.)
    """
    if not keepdims:
        g = _reshape(g, S.reduced(x, axis, keepdims=True))
    return g if S.shape_of(g) == S.shape_of(x) else bind(PRIMITIVES["broadcast_to"], g,
                                                         shape=S.shape_of(x))


def _reshape(x: Any, shape: tuple[int, ...]) -> Any:
    """reshape through the table: shape.py uses sum_to, so this module does not import it."""
    return bind(PRIMITIVES["reshape"], x, shape=tuple(shape))


def _count(x: Any, axis: tuple[int, ...] | None) -> int:
    shape = S.shape_of(x)
    return math.prod(shape[i] for i in (range(len(shape)) if axis is None else axis))


def _extreme_share(g: Any, out: Any, x: Any, axis: Any, keepdims: bool) -> Any:
    """The adjoint of a max (or a min): shared by the elements that attain it."""
    hit = C.astype(x == _expand(out, x, axis, keepdims), x.dtype, copy=False)  # 1: x is out
    return _expand(g, x, axis, keepdims) * hit / _expand(sum(hit, axis, True), x, axis, True)


# NumPy's ``x.sum()`` and ``x.max()`` are Python wrappers around these ufunc reductions
# (same dtypes, same errors); calling the ufunc saves the wrapper, a third of the time of
# a small sum. (Typed as plain callables: NumPy's stubs make ``keepdims`` keyword-only,
# but ``reduce`` takes it by position, as the kernel below passes it.)
# (One bound method, kept: ``np.add.reduce`` makes a new one at each access, and the
# kernels below recognise the sum's by identity.)
_ADD_REDUCE: Callable[..., Any] = np.add.reduce
_NUMPY_REDUCTIONS: dict[str, Callable[..., Any]] = {"sum": _ADD_REDUCE,
                                                    "max": np.maximum.reduce,
                                                    "min": np.minimum.reduce}

#: The most terms per result that a float16/float32 sum adds in its own dtype (_wide_sum);
#: an array of no more elements cannot have more terms, so its sum is not looked at
_ROUNDING_RISK = 4096


def _wide_sum(xp: Any, x: Any, axis: Any, keepdims: bool, mean: bool = False) -> Any:
    """The sum (or mean) of a float16/float32 ``x`` with more than 4096 terms per result,
    accumulated in float64 and rounded back to x's dtype once; None for any other ``x``,
    which the caller sums as it does.

    NumPy sums pairwise (error about log2(n) roundings) only along the axis that is
    contiguous in memory; along another axis, a batch's axis 0, it adds the rows one by
    one, and the error grows with n: the sum over axis 0 of a (10^6, 4) float32 array of
    0.1 came out 100958 instead of 100000 (PyTorch's cascade sum: 99999.9), and so did
    array-api-strict's, which is NumPy's. Accumulated in float64, n roundings of 1e-16
    stay far below float32's resolution. (Smaller sums keep the float32 accumulation of
    the hand-written NumPy a benchmark compares with: 4096 roundings of 6e-8 are 2e-4 at
    the very worst, and about 4e-6 typically.) ``axis``: a tuple, as the primitive's
    parameter, or an int, as a kernel passes it."""
    if str(x.dtype).rpartition(".")[2] not in ("float32", "float16"):
        return None
    axes = axis if type(axis) is tuple else (axis,)
    terms = x.size if axis is None else math.prod([x.shape[i] for i in axes])
    if terms <= _ROUNDING_RISK:
        return None
    total = xp.sum(x, axis=axis, dtype=xp.float64, keepdims=keepdims)
    return xp.astype(total / terms if mean else total, x.dtype)


def reduction_kernel(name: str) -> Callable[..., Any]:
    """The kernel ``kernel(xp, x, axis, keepdims)`` of the reduction ``name`` (sum, mean
    or max): ``xp.<name>(x, axis, keepdims)``.

    On NumPy, sum and max call the ufunc reductions above. NumPy's and CuPy's arrays also
    have methods (``x.mean(...)``) that do what the namespace functions do without their
    Python wrappers (2-3 µs on a small NumPy array: most of the time of a row-wise
    softmax on a batch); Array API arrays have only the functions. The kernel is made
    once per name, so the eager call runs one Python function, not two.
    """
    ufunc = _NUMPY_REDUCTIONS.get(name)

    def kernel(xp: Any, x: Any, axis: "int | tuple[int, ...] | None", keepdims: bool) -> Any:
        if ufunc is not None and type(x) is np.ndarray:
            if ufunc is _ADD_REDUCE and x.size > _ROUNDING_RISK:
                wide = _wide_sum(xp, x, axis, keepdims)
                if wide is not None:
                    return wide
            # positional, as the ufunc's reduce takes them: (x, axis, dtype, out, keepdims)
            return ufunc(x, axis, None, None, keepdims)
        method = getattr(x, name, None)
        if method is not None:
            return method(axis=axis, keepdims=keepdims)
        if name in ("sum", "mean"):  # (an Array API namespace: array-api-strict's rows
            wide = _wide_sum(xp, x, axis, keepdims, name == "mean")  # add up as NumPy's)
            if wide is not None:
                return wide
        return getattr(xp, name)(x, axis=axis, keepdims=keepdims)
    return kernel


sum_kernel = reduction_kernel("sum")
max_kernel = reduction_kernel("max")
min_kernel = reduction_kernel("min")
_numpy_mean = reduction_kernel("mean")
_INTP = np.intp


def mean_kernel(xp: Any, x: Any, axis: "tuple[int, ...] | None", keepdims: bool) -> Any:
    """``xp.mean(x, axis, keepdims)``. On a NumPy float array, NumPy's own steps
    (``numpy/_core/_methods.py``, ``_mean``: the sum's ufunc reduction, divided by the
    count as an ``intp``) without the checks and conversions of its Python wrapper, which
    take three times as long as the sum itself on a small array: the same bits. Integers
    (summed in float64), float16 and empty reductions (a warning) go to NumPy's mean."""
    if type(x) is np.ndarray and x.dtype.char in "fd":
        shape = x.shape
        n = x.size if axis is None else math.prod([shape[i] for i in axis])
        if n:
            wide = _wide_sum(xp, x, axis, keepdims, mean=True) \
                if x.size > _ROUNDING_RISK else None
            if wide is not None:
                return wide
            total = _ADD_REDUCE(x, axis, None, None, keepdims)
            if type(total) is np.ndarray:
                return np.true_divide(total, _INTP(n), out=total, casting="unsafe")
            return total.dtype.type(total / _INTP(n))
    return _numpy_mean(xp, x, axis, keepdims)


def with_params(kernel: Callable[..., Any], ufunc: Callable[..., Any] | None = None
                ) -> Callable[[Any, Any, dict], Any]:
    """``kernel(xp, x, axis, keepdims)`` given its parameters as the dict itself: the
    primitive's ``impl_with``, which the eager interpreter calls where ``kernel(xp, x,
    **params)`` would make Python unpack the dict into keywords first. With the NumPy
    ``ufunc`` that ``kernel`` calls on a NumPy array, the same call, one call sooner."""
    def call(xp: Any, x: Any, params: dict) -> Any:
        return kernel(xp, x, params["axis"], params["keepdims"])

    if ufunc is None:
        return call
    reduce = ufunc  # (a name mypy knows is not None inside call_ufunc)

    def call_ufunc(xp: Any, x: Any, params: dict) -> Any:
        if type(x) is np.ndarray:
            if reduce is _ADD_REDUCE and x.size > _ROUNDING_RISK:
                wide = _wide_sum(xp, x, params["axis"], params["keepdims"])
                if wide is not None:
                    return wide
            return reduce(x, params["axis"], None, None, params["keepdims"])
        return kernel(xp, x, params["axis"], params["keepdims"])
    return call_ufunc


def write_reduction(prim: Any, args: list[str], params: dict,
                    literal: Callable[[Any], str]) -> str:
    """``mg.sum(x, axis=1)`` as a user writes it: one axis as an int, no default keepdims."""
    words = list(args)
    axis = params["axis"]
    if axis is not None:
        words.append(f"axis={literal(axis[0] if len(axis) == 1 else axis)}")
    if params["keepdims"]:
        words.append("keepdims=True")
    return f"mg.{prim.public}({', '.join(words)})"


SUM = primitive(
    "sum", sum_kernel, _reduce_shape_as("int64"),
    jvp=[lambda t, out, x, axis, keepdims: sum(t, axis, keepdims)],
    vjp=[lambda g, out, x, axis, keepdims: _expand(g, x, axis, keepdims)],
    cost="expensive", batch=B.reduction("sum"),
    public="sum", write=write_reduction,
    impl_with=with_params(sum_kernel, _NUMPY_REDUCTIONS["sum"]))

MEAN = primitive(
    "mean", mean_kernel, _reduce_shape_as("float64"),
    jvp=[lambda t, out, x, axis, keepdims: mean(t, axis, keepdims)],
    vjp=[lambda g, out, x, axis, keepdims: _expand(g, x, axis, keepdims) / _count(x, axis)],
    cost="expensive", batch=B.reduction("mean"),
    public="mean", write=write_reduction, impl_with=with_params(mean_kernel))


def _extreme_jvp(t: Any, out: Any, x: Any, axis: Any, keepdims: bool) -> Any:
    """The tangent of a max (or a min): the mean of the tangents of the elements that
    attain it."""
    hit = C.astype(x == _expand(out, x, axis, keepdims), x.dtype, copy=False)
    return sum(t * hit, axis, keepdims) / sum(hit, axis, keepdims)


MAX = primitive(
    "max", max_kernel, _reduce_shape, jvp=[_extreme_jvp], vjp=[_extreme_share],
    cost="expensive", batch=B.reduction("max"),
    public="max", write=write_reduction,
    impl_with=with_params(max_kernel, _NUMPY_REDUCTIONS["max"]))

MIN = primitive(  # max's rules: they look for the elements equal to the result
    "min", min_kernel, _reduce_shape, jvp=[_extreme_jvp], vjp=[_extreme_share],
    cost="expensive", batch=B.reduction("min"),
    public="min", write=write_reduction,
    impl_with=with_params(min_kernel, _NUMPY_REDUCTIONS["min"]))


def normalize_axis(x: Any, axis: "int | tuple[int, ...] | list[int] | None",
                   who: str = "reduction") -> tuple | None:
    """``axis`` as a sorted tuple of non-negative ints (``None``: all axes)."""
    if axis is None:
        return None
    ndim = S.rank(who, x)
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    if not all(type(a) is int for a in axes):
        axes = tuple(S.integer(who, "axis", a) for a in axes)
    if ndim == 0 and all(a in (0, -1) for a in axes):
        out = [0] * len(axes)  # a 0-d tensor's "axis 0", which 0 and -1 both name
    else:
        out = [S.check_axis(who, a, x) for a in axes]
    if len(set(out)) != len(out):
        raise ShapeError(f"{who}: axis {axis} names an axis twice (tensor of rank {ndim})")
    return () if ndim == 0 else tuple(sorted(out))  # (a 0-d tensor over its axis 0: over
    # no axis at all, as NumPy's sum of a 0-d array over axis 0)


# ``axis=None``, every axis, is the common call: it needs no normalising, and its
# parameters are one dict for all such calls (never written: a tape entry, a graph node
# keeps it as it is), rather than a new one per call.
_ALL_AXES: dict[str, Any] = {"axis": None, "keepdims": False}


def _params(x: Any, axis: Axis, keepdims: bool, who: str) -> dict[str, Any]:
    if not isinstance(keepdims, (bool, np.bool_)):  # (a str is true: it kept the axes)
        raise TypeError(f"{who}: keepdims must be a bool, got {type(keepdims).__name__} "
                        f"{keepdims!r}")
    return {"axis": None if axis is None else normalize_axis(x, axis, who),
            "keepdims": bool(keepdims)}


def sum(x: Any, axis: Axis = None, keepdims: bool = False) -> Any:  # noqa: A001
    """Sum over ``axis`` (all axes by default), like ``numpy.sum``."""
    return bind_one(SUM, x, _ALL_AXES if axis is None and not keepdims else
                    _params(x, axis, keepdims, "sum"))


def mean(x: Any, axis: Axis = None, keepdims: bool = False) -> Any:
    """Mean over ``axis`` (all axes by default), like ``numpy.mean``."""
    return bind_one(MEAN, x, _ALL_AXES if axis is None and not keepdims else
                    _params(x, axis, keepdims, "mean"))


def max(x: Any, axis: Axis = None, keepdims: bool = False) -> Any:  # noqa: A001
    """Maximum over ``axis``; the gradient is split evenly between tied maxima."""
    return bind_one(MAX, x, _ALL_AXES if axis is None and not keepdims else
                    _params(x, axis, keepdims, "max"))


def min(x: Any, axis: Axis = None, keepdims: bool = False) -> Any:  # noqa: A001
    """Minimum over ``axis``; the gradient is split evenly between tied minima."""
    return bind_one(MIN, x, _ALL_AXES if axis is None and not keepdims else
                    _params(x, axis, keepdims, "min"))


def sum_to(x: Any, shape: tuple[int, ...]) -> Any:
    """Sum ``x`` down to ``shape``: the adjoint of broadcasting ``shape`` to ``x.shape``."""
    if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):
        shape = S.sizes("sum_to", shape)  # (the common case checks once)
    xshape = S.input_shape("sum_to", "input", x)
    if xshape == tuple(shape):  # (a list or a NumPy value becomes a tensor, as in any op)
        return sum(x, ()) if isinstance(x, (list, tuple, np.ndarray, np.generic)) else x
    if xshape is None:  # (a graph node whose shape depends on a placeholder of any shape)
        raise ShapeError(f"sum_to: x's shape is known only when the graph runs, so which "
                         f"axes to sum down to {tuple(shape)} is not; give its placeholder "
                         f"a shape")
    lead = len(xshape) - len(shape)
    if lead < 0 or any(n != 1 and n != xshape[lead + i] for i, n in enumerate(shape)):
        raise ShapeError(f"sum_to: shape {tuple(shape)} does not broadcast to x's shape "
                         f"{xshape}, so x cannot be summed down to it")
    stretched = tuple(lead + i for i, n in enumerate(shape) if n == 1 and xshape[lead + i] != 1)
    if not stretched:  # only new leading axes (a bias's gradient): the sum has the shape
        return sum(x, tuple(range(lead)))
    return _reshape(sum(x, tuple(range(lead)) + stretched, keepdims=True), tuple(shape))
