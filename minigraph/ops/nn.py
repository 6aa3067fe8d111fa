"""Neural-network primitives: softmax, log_softmax, one_hot and nll_loss; cross_entropy.

They could be written from exp, sum and log, but as primitives they get numerically
stable kernels (subtract the row maximum first) and short derivative rules:

* softmax ``p``:  ``gx = p * (g - sum(g * p))``
* log_softmax ``l``:  ``gx = g - exp(l) * sum(g)``
* nll_loss (mean over the batch of ``-l[label]``):  ``gl = -onehot * g / N``

``cross_entropy(logits, labels)`` is ``nll_loss(log_softmax(logits), labels)``, as in
PyTorch: its gradient ``(p - onehot) / N`` comes out of the two rules above, and the
backward pass reuses the forward pass's log-probabilities (``exp(l)`` is the softmax)
instead of computing the softmax again.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device as array_device

from ..errors import ShapeError
from . import elementwise as E
from . import reduce as R
from . import shape_rules as S
from .primitive import bind, primitive


def _softmax_kernel(xp: Any, x: Any, axis: int) -> Any:
    e = xp.exp(x - R.reduce_kernel("max", xp, x, axis, True))
    e /= R.reduce_kernel("sum", xp, e, axis, True)  # (e is this kernel's own array)
    return e


def _log_softmax_kernel(xp: Any, x: Any, axis: int) -> Any:
    z = x - R.reduce_kernel("max", xp, x, axis, True)
    z -= xp.log(R.reduce_kernel("sum", xp, xp.exp(z), axis, True))
    return z


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
    classes = xp.arange(num_classes, device=array_device(labels))
    return xp.astype(labels[..., None] == classes, getattr(xp, dtype))


ONE_HOT = primitive(
    "one_hot", _one_hot_kernel,
    lambda labels, num_classes, dtype: (S.shape_of(labels) + (num_classes,), dtype))


def _nll_kernel(xp: Any, logp: Any, labels: Any) -> Any:
    n = logp.shape[0]
    rows = xp.arange(n, device=array_device(labels))
    return -xp.sum(logp[rows, labels]) / n  # l[i, label_i]: integer-array indexing


def _nll_shape(logp: Any, labels: Any) -> tuple:
    ls, ys = S.shape_of(logp), S.shape_of(labels)
    if len(ls) != 2 or ys != ls[:1]:
        raise ShapeError(f"nll_loss: expected log-probabilities (N, C) and labels (N,), "
                         f"got shapes {ls} and {ys}")
    return (), S.dtype_of(logp)


def _nll_adjoint(g: Any, logp: Any, labels: Any) -> Any:
    """-onehot * g / N: the derivative of the mean negative log-likelihood by ``logp``."""
    n, c = S.shape_of(logp)
    return one_hot(labels, c, S.dtype_of(logp)) * (-g / n)


NLL_LOSS = primitive(
    "nll_loss", _nll_kernel, _nll_shape,
    jvp=[lambda t, out, logp, labels: R.sum(_nll_adjoint(t, logp, labels)), None],
    vjp=[lambda g, out, logp, labels: _nll_adjoint(g, logp, labels), None],
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


def nll_loss(logp: Any, labels: Any) -> Any:
    """Mean over the batch of ``-logp[i, labels[i]]``: the negative log-likelihood of
    integer class labels under log-probabilities ``logp`` of shape (N, C)."""
    _check_labels("nll_loss", labels)
    return bind(NLL_LOSS, logp, labels)


def cross_entropy(logits: Any, labels: Any) -> Any:
    """Mean over the batch of -log softmax(logits)[label]; labels are integer classes."""
    _check_labels("cross_entropy", labels)
    ls, ys = S.shape_of(logits), S.shape_of(labels)
    if ls is not None and ys is not None and (len(ls) != 2 or ys != ls[:1]):
        raise ShapeError(f"cross_entropy: expected logits (N, C) and labels (N,), "
                         f"got shapes {ls} and {ys}")
    return nll_loss(log_softmax(logits, 1), labels)


def _check_labels(who: str, labels: Any) -> None:
    if S.dtype_of(labels) not in ("int64", "int32"):
        raise TypeError(f"{who}: labels must be integers, got dtype {S.dtype_of(labels)}")
