"""Neural-network primitives: softmax, log_softmax, one_hot and cross_entropy.

They could be written from exp, sum and log, but as primitives they get numerically
stable kernels (subtract the row maximum first) and short derivative rules:

* softmax ``p``:  ``gx = p * (g - sum(g * p))``
* log_softmax ``l``:  ``gx = g - exp(l) * sum(g)``
* cross_entropy (mean over the batch of ``-log p[label]``):  ``gx = (p - onehot) * g / N``
"""

from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from . import copy as C
from . import elementwise as E
from . import reduce as R
from . import shape_rules as S
from .primitive import bind, primitive


def _softmax_kernel(xp: Any, x: Any, axis: int) -> Any:
    e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    return e / xp.sum(e, axis=axis, keepdims=True)


def _log_softmax_kernel(xp: Any, x: Any, axis: int) -> Any:
    z = x - xp.max(x, axis=axis, keepdims=True)
    return z - xp.log(xp.sum(xp.exp(z), axis=axis, keepdims=True))


SOFTMAX = primitive(
    "softmax", _softmax_kernel, lambda x, axis: S.same(x),
    jvp=[lambda t, out, x, axis: out * (t - R.sum(t * out, axis, True))],
    vjp=[lambda g, out, x, axis: out * (g - R.sum(g * out, axis, True))],
    cost="expensive")

LOG_SOFTMAX = primitive(
    "log_softmax", _log_softmax_kernel, lambda x, axis: S.same(x),
    jvp=[lambda t, out, x, axis: t - R.sum(E.exp(out) * t, axis, True)],
    vjp=[lambda g, out, x, axis: g - E.exp(out) * R.sum(g, axis, True)],
    cost="expensive")


def _one_hot_kernel(xp: Any, labels: Any, num_classes: int, dtype: str) -> Any:
    classes = xp.arange(num_classes, device=labels.device)
    return xp.astype(labels[..., None] == classes, getattr(xp, dtype))


ONE_HOT = primitive(
    "one_hot", _one_hot_kernel,
    lambda labels, num_classes, dtype: (S.shape_of(labels) + (num_classes,), dtype))


def _cross_entropy_kernel(xp: Any, logits: Any, labels: Any) -> Any:
    dtype = "float32" if logits.dtype == xp.float32 else "float64"
    picked = _log_softmax_kernel(xp, logits, 1) * _one_hot_kernel(
        xp, labels, logits.shape[1], dtype)
    return -xp.sum(picked) / logits.shape[0]


def _cross_entropy_shape(logits: Any, labels: Any) -> tuple:
    ls, ys = S.shape_of(logits), S.shape_of(labels)
    if len(ls) != 2 or ys != ls[:1]:
        raise ShapeError(f"cross_entropy: expected logits (N, C) and labels (N,), "
                         f"got shapes {ls} and {ys}")
    return (), S.dtype_of(logits)


def _ce_residual(logits: Any, labels: Any) -> Any:
    """(p - onehot) / N: the derivative of the mean cross-entropy by the logits."""
    n, c = S.shape_of(logits)
    return (softmax(logits, 1) - one_hot(labels, c, logits.dtype)) / n


CROSS_ENTROPY = primitive(
    "cross_entropy", _cross_entropy_kernel, _cross_entropy_shape,
    jvp=[lambda t, out, logits, labels: R.sum(_ce_residual(logits, labels) * t), None],
    vjp=[lambda g, out, logits, labels: _ce_residual(logits, labels) * g, None],
    cost="expensive")


def softmax(x: Any, axis: int = -1) -> Any:
    """exp(x) / sum(exp(x)) along ``axis``, computed stably."""
    return bind(SOFTMAX, x, axis=axis % len(S.shape_of(x)))


def log_softmax(x: Any, axis: int = -1) -> Any:
    """log(softmax(x)) along ``axis``, computed stably."""
    return bind(LOG_SOFTMAX, x, axis=axis % len(S.shape_of(x)))


def one_hot(labels: Any, num_classes: int, dtype: str = "float64") -> Any:
    """Rows of zeros with a one at each label (no gradient)."""
    return bind(ONE_HOT, labels, num_classes=num_classes, dtype=str(dtype))


def cross_entropy(logits: Any, labels: Any) -> Any:
    """Mean over the batch of -log softmax(logits)[label]; labels are integer classes."""
    if S.dtype_of(labels) not in ("int64", "int32"):
        raise TypeError(f"cross_entropy: labels must be integers, got dtype {S.dtype_of(labels)}")
    return bind(CROSS_ENTROPY, logits, labels)
