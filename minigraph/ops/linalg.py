"""Linear algebra: matrix multiplication.

For ``z = x @ y`` the adjoints are ``gx = gz @ y.T`` and ``gy = x.T @ gz``; for stacks of
matrices ``.T`` swaps the last two axes, and the batch axes are summed back where they
were broadcast. One-dimensional operands follow NumPy: a vector is made a matrix with
a new axis, multiplied, and the new axis is removed again.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ShapeError
from . import batch_rules as B
from . import reduce as R
from . import shape as SH
from . import shape_rules as S
from .primitive import bind_two, primitive, ufunc_out


def _matmul_shape(x: Any, y: Any) -> tuple:
    xs, ys = S.shape_of(x), S.shape_of(y)
    if len(xs) < 2 or len(ys) < 2 or xs[-1] != ys[-2]:
        raise ShapeError(f"matmul: shapes {xs} and {ys} do not fit "
                         f"(inner sizes {xs[-1:] or '?'} and {ys[-2:-1] or '?'})")
    batch = S.broadcast_shapes("matmul", xs[:-2], ys[:-2])
    return batch + (xs[-2], ys[-1]), S.promote(x, y)


def _matmul_flops(out_shape: tuple, a: tuple, b: tuple) -> float:
    """Multiply-adds of a matmul: every element of the result is a dot product of length
    k (the last axis of a)."""
    return math.prod(out_shape) * (a[-1] if a else 1)


def _matmul_kernel(xp: Any, x: Any, y: Any) -> Any:
    """``x @ y`` (the Array API's operator: no library's Python wrapper). For two
    C-ordered NumPy matrices, ``x.dot(y)``: the same BLAS call with the same bits,
    without the ufunc machinery that ``@`` goes through, which takes half the time of a
    4x4 product. (Other layouts may take another BLAS routine in ``dot``: they keep ``@``.
    So does a 1x1 matrix beside a larger one: ``dot`` takes it for a scalar and skips
    the products where it is 0, so that ``[[0]] . [[inf, 1]]`` gives 0 where IEEE
    arithmetic, ``@`` and PyTorch give NaN.)"""
    if type(x) is np.ndarray and type(y) is np.ndarray and x.ndim == 2 == y.ndim \
            and x.flags.c_contiguous and y.flags.c_contiguous and x.size != 1 and y.size != 1:
        return x.dot(y)
    return x @ y


MATMUL = primitive(
    "matmul", _matmul_kernel, _matmul_shape,
    jvp=[lambda t, out, x, y: matmul(t, y), lambda t, out, x, y: matmul(x, t)],
    vjp=[lambda g, out, x, y: R.sum_to(matmul(g, SH.matrix_transpose(y)), S.shape_of(x)),
         lambda g, out, x, y: R.sum_to(matmul(SH.matrix_transpose(x), g), S.shape_of(y))],
    cost="expensive", out=ufunc_out("matmul"), in_place=False,
    # matmul broadcasts its stack axes like an elementwise op: align the ranks so that
    # the batch axis meets the other side's stack axes (or nothing), never a matrix axis
    batch=B.elementwise("matmul"),
    symbol="@", flops=_matmul_flops)


def matmul(x: Any, y: Any) -> Any:
    """Matrix product ``x @ y`` with NumPy's rules for vectors and stacks."""
    try:  # (ndim, not shape: a tensor's count of axes is one read, its shape a new tuple)
        matrices = x.ndim > 1 and y.ndim > 1
    except (AttributeError, TypeError):  # a Python number; a graph node of unknown shape
        matrices = False
    if matrices:  # matrices or stacks of them, the common case: the primitive itself
        return bind_two(MATMUL, x, y)
    # (what is not an operand, None or a str, has no shape: refused naming it, not read
    # as a number of shape ())
    xs, ys = S.input_shape("matmul", "first operand", x), S.input_shape("matmul",
                                                                         "second operand", y)
    if xs is None or ys is None:  # a graph node of unknown shape: decided when it runs
        return bind_two(MATMUL, x, y)
    if not xs or not ys:
        raise ShapeError(f"matmul: operands must have at least one axis, got shapes {xs} and {ys}")
    SH.same_device("matmul", (x, y))  # (before a vector is made a matrix: see same_device)
    if len(xs) > 1 and len(ys) > 1:  # matrices given as nested lists (they have no ndim)
        return bind_two(MATMUL, x, y)
    if xs[-1] != ys[0 if len(ys) == 1 else -2]:  # (refused before a reshape is made: in
        raise ShapeError(f"matmul: shapes {xs} and {ys} do not match: {xs[-1]} columns "
                         f"against {ys[0 if len(ys) == 1 else -2]} rows")  # a graph, a node)
    if len(xs) == 1 and len(ys) == 1:
        return SH.reshape(matmul(SH.reshape(x, (1, -1)), SH.reshape(y, (-1, 1))), ())
    if len(xs) == 1:
        out = matmul(SH.reshape(x, (1, -1)), y)
        return SH.reshape(out, S.shape_of(out)[:-2] + S.shape_of(out)[-1:])
    return SH.reshape(matmul(x, SH.reshape(y, (-1, 1))), xs[:-1])  # (y a vector)
