"""Neural-network primitives: softmax, log_softmax, one_hot and nll_loss; cross_entropy.

They could be written from exp, sum and log, but as primitives they get numerically
stable kernels (subtract the row maximum first) and short derivative rules:

* softmax ``p``:  ``gx = p * (g - sum(g * p))``
* log_softmax ``l``:  ``gx = g - exp(l) * sum(g)``
* nll_loss (mean over the batch of ``-l[label]``):  ``gl = -onehot * g / N``

The last two are primitives of their own, ``log_softmax_grad`` and ``nll_loss_grad``
(PyTorch's ``_log_softmax_backward_data`` and ``nll_loss_backward``): one kernel each
instead of five small ones, and on NumPy ``nll_loss_grad`` writes ``-g / N`` at the
labels of a zero matrix instead of making a one-hot matrix and multiplying.

``cross_entropy(logits, labels)`` is ``nll_loss(log_softmax(logits), labels)``, as in
PyTorch: its gradient ``(p - onehot) / N`` comes out of the two rules above, and the
backward pass reuses the forward pass's log-probabilities (``exp(l)`` is the softmax)
instead of computing the softmax again.

Under ``mg.vmap`` softmax and its kin work along the same axis, one further right; the
two losses, which average over the batch of one example, are batched as the masked
mean ``-mean(sum(where(one_hot, logp, 0)))`` written with other primitives.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, cast

import numpy as np
from array_api_compat import device as array_device

from ..errors import AxisError, DTypeError, ShapeError
from . import batch_rules as B
from . import elementwise as E
from . import copy as C
from . import reduce as R
from . import shape as SH
from . import shape_rules as S
from .primitive import Primitive, bind, names_user_line, primitive


def _softmax_kernel(xp: Any, x: Any, axis: int) -> Any:
    x = E.as_floating(xp, x)
    if x.shape[axis] == 0:  # (no maximum to subtract: an empty result, as PyTorch's)
        return xp.empty_like(x)
    e = xp.exp(x - R.max_kernel(xp, x, axis, True))
    e /= R.sum_kernel(xp, e, axis, True)  # (e is this kernel's own array)
    return e


def _log_softmax_kernel(xp: Any, x: Any, axis: int) -> Any:
    x = E.as_floating(xp, x)
    if x.shape[axis] == 0:
        return xp.empty_like(x)
    z = x - R.max_kernel(xp, x, axis, True)
    z -= xp.log(R.sum_kernel(xp, xp.exp(z), axis, True))
    return z


SOFTMAX = primitive(
    "softmax", _softmax_kernel, lambda x, axis: S.floating("softmax")(x),
    jvp=[lambda t, out, x, axis: out * (t - R.sum(t * out, axis, True))],
    vjp=[lambda g, out, x, axis: out * (g - R.sum(g * out, axis, True))],
    cost="expensive", batch=B.along_axis("softmax"),
    public="softmax")

LOG_SOFTMAX = primitive(
    "log_softmax", _log_softmax_kernel, lambda x, axis: S.floating("log_softmax")(x),
    jvp=[lambda t, out, x, axis: t - R.sum(E.exp(out) * t, axis, True)],
    vjp=[lambda g, out, x, axis: log_softmax_grad(g, out, axis)],
    cost="expensive", batch=B.along_axis("log_softmax"),
    public="log_softmax")


def _exp_times_sum(xp: Any, g: Any, y: Any, axis: int) -> Any:
    """``exp(y) * sum(g, axis, keepdims=True)``, a new array, in floating point: integers
    and bools as float64, as the shape rule says (NumPy's exp of a bool is float16, a
    dtype minigraph has not). For a Python number ``y``, exp(y) has ``g``'s shape, dtype
    and device (the Array API's exp takes arrays only)."""
    if hasattr(y, "shape"):
        e = xp.exp(E.as_floating(xp, y))
    else:
        e = xp.exp(xp.full(g.shape, y, dtype=g.dtype, device=array_device(g)))
    s = R.sum_kernel(xp, g, axis, True)
    if e.shape == g.shape and e.dtype == g.dtype:
        e *= s  # (e is this kernel's own array, and holds the product's shape and dtype)
        return e
    return e * s  # y broadcast against g, or dtypes differ: a new array of the product's


def _log_softmax_grad_kernel(xp: Any, g: Any, y: Any, axis: int) -> Any:
    g = E.as_floating(xp, g)
    return g - _exp_times_sum(xp, g, y, axis)


def _log_softmax_grad_out(xp: Any, g: Any, y: Any, axis: int, out: Any) -> Any:
    g = E.as_floating(xp, g)
    e = _exp_times_sum(xp, g, y, axis)  # g and y are read before out is written
    return xp.subtract(g, e, out=out)


def _log_softmax_grad_shape(g: Any, y: Any, axis: int) -> tuple:
    """g and y broadcast together, the axis one of g's; the dtype that of a floating op:
    integers and bools count as float64, and float32 stays only if nothing else is."""
    S.check_axis("log_softmax_grad", axis, g)
    shape = S.broadcast_shapes("log_softmax_grad", S.shape_of(g), S.shape_of(y))
    floats = {d if d in S.FLOATS else "float64" for d in map(S.dtype_of, (g, y))
              if d is not None}  # (a Python number takes the other's dtype)
    return shape, "float32" if floats == {"float32"} else "float64"


def _log_softmax_grad_dg(gg: Any, out: Any, g: Any, y: Any, axis: int) -> Any:
    """The share of g in ``g - exp(y) * s``, ``s = sum(g, axis, keepdims=True)``: g reaches
    the result directly and through s, and where g broadcast (against a bigger y) each
    path's share is summed back to the shape it came from."""
    gs = S.shape_of(g)
    if S.shape_of(gg) == gs:  # (the usual case: g has the result's shape)
        return gg - R.sum(gg * E.exp(y), axis, True)
    return R.sum_to(gg, gs) - R.sum_to(gg * E.exp(y), gs[:axis] + (1,) + gs[axis + 1:])


def _log_softmax_grad_batched(dims: tuple, g: Any, y: Any, axis: int) -> Any:
    """Both arguments batched, ``axis`` one further right. The kernel sums ``g`` along
    ``axis`` of ``g``'s own shape, so one example's ``g`` and ``y`` must have one rank."""
    if B.rank(g, dims[0]) != B.rank(y, dims[1]):
        raise ShapeError(f"log_softmax_grad under vmap: g and y must have the same rank for "
                         f"one example, got shapes {S.shape_of(g)} and {S.shape_of(y)} "
                         f"(batched: {dims})")
    size = B.size_of(dims, (g, y))
    return bind(LOG_SOFTMAX_GRAD, B.materialize(g, dims[0], size),
                B.materialize(y, dims[1], size), axis=axis + 1)


# g - exp(y) * sum(g): linear in g; through y only exp(y) changes, elementwise.
LOG_SOFTMAX_GRAD = primitive(
    "log_softmax_grad", _log_softmax_grad_kernel, _log_softmax_grad_shape,
    jvp=[lambda t, out, g, y, axis: log_softmax_grad(t, y, axis),
         lambda t, out, g, y, axis: -(t * E.exp(y)) * R.sum(g, axis, True)],
    vjp=[_log_softmax_grad_dg,
         lambda gg, out, g, y, axis: R.sum_to(-(gg * E.exp(y)) * R.sum(g, axis, True),
                                              S.shape_of(y))],  # (y may have broadcast)
    cost="expensive", out=_log_softmax_grad_out, batch=_log_softmax_grad_batched,
    public="log_softmax_grad")


def _one_hot_kernel(xp: Any, labels: Any, num_classes: int, dtype: str) -> Any:
    check_label_range(xp, labels, num_classes, "one_hot")
    classes = xp.arange(num_classes, device=array_device(labels))
    return xp.astype(labels[..., None] == classes, getattr(xp, dtype))


# Strict, as PyTorch's F.one_hot: a label outside 0 .. num_classes - 1 raises. (JAX and
# TensorFlow give it a row of zeros; a loss built on such a row would silently leave the
# example out.)
ONE_HOT = primitive(
    "one_hot", _one_hot_kernel,
    lambda labels, num_classes, dtype: (S.shape_of(labels) + (num_classes,), dtype),
    batch=B.elementwise("one_hot"), differentiable=False,
    public="one_hot", positional=("num_classes", "dtype"))  # the new axis is the last: batched labels just work


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # by size in bytes


def check_label_range(xp: Any, labels: Any, classes: int, who: str) -> None:
    """Every label in 0 .. classes - 1, or an IndexError naming the first bad one. Every
    kernel that reads labels checks them: NumPy would wrap -1 to the last class and fail
    on an index past the end with a message about arrays, not labels."""
    if 0 in labels.shape:
        return
    if type(labels) is np.ndarray and labels.dtype.kind == "i" and labels.itemsize in _UNSIGNED:
        # One reduction checks both ends: read as unsigned integers of the same size, a
        # negative label is huge. (The check runs in every cross-entropy step: two
        # reductions were a tenth of a small MLP's compiled gradient.)
        if np.maximum.reduce(labels.view(_UNSIGNED[labels.itemsize]), None) < classes:
            return
    if hasattr(labels, "min"):  # NumPy's and CuPy's own methods: a third of the wrapper's time
        low, high = int(labels.min()), int(labels.max())
    else:
        low, high = int(xp.min(labels)), int(xp.max(labels))
    if low < 0 or high >= classes:
        bad = low if low < 0 else high
        at = int(xp.argmax(xp.astype(xp.reshape(labels == bad, (-1,)), xp.int64)))
        where = f"row {at}" if labels.ndim == 1 else \
            f"at {tuple(int(i) for i in np.unravel_index(at, labels.shape))}"
        raise IndexError(f"{who}: label {bad} ({where}) is out of range for {classes} "
                         f"classes: labels must lie in 0..{classes - 1}")


def _nll_kernel(xp: Any, logp: Any, labels: Any) -> Any:
    # The rule's check here too: eager mode asks the rule only when a kernel fails, and
    # labels of shape (N, 1) would broadcast against the rows, an N x N grid, silently.
    _check_batch("nll_loss", "log-probabilities", logp.shape, labels.shape)
    check_label_range(xp, labels, logp.shape[1], "nll_loss")
    picked = logp[_rows(xp, labels), labels]  # l[i, label_i]: integer-array indexing
    return -R.sum_kernel(xp, picked, None, False) / logp.shape[0]


def _rows(xp: Any, labels: Any) -> Any:
    """``0 .. N-1`` on the labels' device: the row of each label. (NumPy's own ``arange``
    for NumPy labels: the namespace's, with its device lookup, takes six times as long.)"""
    n = labels.shape[0]
    return np.arange(n) if type(labels) is np.ndarray else \
        xp.arange(n, device=array_device(labels))


def _check_batch(who: str, what: str, ls: tuple, ys: tuple) -> None:
    """``what`` must be (N, C) and the labels (N,)."""
    if len(ls) != 2 or ys != ls[:1]:
        raise ShapeError(f"{who}: expected {what} (N, C) and labels (N,), "
                         f"got shapes {ls} and {ys}")


def _nll_shape(logp: Any, labels: Any) -> tuple:
    """A scalar, in floating point: the kernel divides by N (integers give float64)."""
    _check_batch("nll_loss", "log-probabilities", S.shape_of(logp), S.shape_of(labels))
    dtype = S.dtype_of(logp)
    return (), dtype if dtype in S.FLOATS else "float64"


def _nll_batched(dims: tuple, logp: Any, labels: Any) -> Any:
    """nll_loss of each example: ``-mean over N of logp[n, labels[n]]``. The kernel picks
    with integer-array indexing, which cannot take a batch of labels; a mask can.
    (``where``, not ``logp * one_hot``: 0 * -inf would be nan.)"""
    _nll_shape(B.example(logp, dims[0]), B.example(labels, dims[1]))  # its checks
    from ..tensor import Tensor  # (the tensor module imports this one)

    if type(labels) is Tensor:  # its labels are checked here, or one_hot would name itself
        check_label_range(labels.device.xp, labels.data, S.shape_of(logp)[-1], "nll_loss")
    mask = one_hot(labels, S.shape_of(logp)[-1], "bool")
    return -R.mean(R.sum(E.where(mask, logp, 0.0), -1), -1)


# (annotated: its own rules name it, and mypy cannot infer a name from itself. logp is
# an array, so dtype_of(logp) is a name, never None)
NLL_LOSS: Primitive = primitive(  # linear in logp: its JVP is itself
    "nll_loss", _nll_kernel, _nll_shape,
    jvp=[lambda t, out, logp, labels: bind(NLL_LOSS, t, labels), None],
    vjp=[lambda g, out, logp, labels: nll_loss_grad(g, labels, S.shape_of(logp)[1],
                                                    cast(str, S.dtype_of(logp))), None],
    cost="expensive", batch=_nll_batched,
    public="nll_loss")


def _nll_grad_kernel(xp: Any, g: Any, labels: Any, num_classes: int, dtype: str) -> Any:
    """-onehot * g / N. On NumPy: -g / N written at the labels of a zero matrix (integer
    array assignment, which the Array API does not have)."""
    _check_grad(S.shape_of(g), labels.shape)  # (the rule's checks: see _nll_kernel)
    check_label_range(xp, labels, num_classes, "nll_loss_grad")
    n = labels.shape[0]
    if type(labels) is np.ndarray:
        out = np.zeros((n, num_classes), dtype)
        out[_rows(xp, labels), labels] = -g / n
        return out
    scale = -g / n  # (an array in the result's dtype: a float64 g would promote float32)
    if hasattr(scale, "dtype"):
        scale = xp.astype(scale, getattr(xp, dtype))
    return _one_hot_kernel(xp, labels, num_classes, dtype) * scale


def _check_grad(gs: tuple, ys: tuple) -> None:
    """nll_loss_grad's adjoint ``g`` is the loss's, a scalar, and the labels are (N,)."""
    if gs != ():
        raise ShapeError(f"nll_loss_grad: the adjoint of the loss is a scalar, got shape {gs}")
    if len(ys) != 1:
        raise ShapeError(f"nll_loss_grad: expected labels (N,), got shape {ys}")


def _nll_grad_shape(g: Any, labels: Any, num_classes: int, dtype: str) -> tuple:
    _check_grad(S.shape_of(g), S.shape_of(labels))
    return S.shape_of(labels) + (num_classes,), dtype


def _nll_grad_batched(dims: tuple, g: Any, labels: Any, num_classes: int, dtype: str) -> Any:
    """``-one_hot(labels) * g / N`` for each example: g's batch axis (if any) becomes a
    (B, 1, 1) column that scales every example's one-hot matrix."""
    _nll_grad_shape(B.example(g, dims[0]), B.example(labels, dims[1]), num_classes, dtype)
    from ..tensor import Tensor  # (the tensor module imports this one)

    if type(labels) is Tensor:  # (checked here, or one_hot would name itself: _nll_batched)
        check_label_range(labels.device.xp, labels.data, num_classes, "nll_loss_grad")
    if dims[0] is not None:
        g = SH.reshape(g, S.shape_of(g) + (1, 1))
    n = S.shape_of(labels)[-1]
    return C.astype(one_hot(labels, num_classes, dtype) * (-g / n), dtype, copy=False)


# Linear in g, and its transpose is nll_loss itself: sum(G * -onehot / N) = nll_loss(G).
NLL_LOSS_GRAD = primitive(
    "nll_loss_grad", _nll_grad_kernel, _nll_grad_shape,
    jvp=[lambda t, out, g, labels, num_classes, dtype:
         nll_loss_grad(t, labels, num_classes, dtype), None],
    vjp=[lambda gg, out, g, labels, num_classes, dtype: bind(NLL_LOSS, gg, labels), None],
    cost="expensive", batch=_nll_grad_batched,
    public="nll_loss_grad", positional=("num_classes", "dtype"))


@names_user_line
def softmax(x: Any, axis: int = -1) -> Any:
    """exp(x) / sum(exp(x)) along ``axis``, computed stably. A 0-d ``x`` is one class on
    its own, as in PyTorch (axis 0 or -1): its softmax is 1.0."""
    if S.input_shape("softmax", "input", x) == ():
        return SH.reshape(softmax(_one_class("softmax", x, axis), 0), ())
    return bind(SOFTMAX, x, axis=S.check_axis("softmax", axis, x))


@names_user_line
def log_softmax(x: Any, axis: int = -1) -> Any:
    """log(softmax(x)) along ``axis``, computed stably; 0.0 for a 0-d ``x``, as in
    PyTorch (see ``softmax``)."""
    if S.input_shape("log_softmax", "input", x) == ():
        return SH.reshape(log_softmax(_one_class("log_softmax", x, axis), 0), ())
    return bind(LOG_SOFTMAX, x, axis=S.check_axis("log_softmax", axis, x))


def _one_class(op: str, x: Any, axis: Any) -> Any:
    """A 0-d ``x`` as a row of one class, shape (1,): the rule and the kernels need an
    axis to work along. PyTorch takes axis 0 or -1 for a 0-d tensor; so does this."""
    if S.integer(op, "axis", axis) not in (0, -1):
        raise AxisError(f"{op}: axis {axis} is out of range for a tensor of shape () "
                        f"(one class: valid axes -1 and 0, as in PyTorch)")
    return SH.reshape(x, (1,))


@names_user_line
def one_hot(labels: Any, num_classes: int, dtype: str = "float64") -> Any:
    """Rows of zeros with a one at each label (no gradient). A label outside
    ``0 .. num_classes - 1`` raises, as in PyTorch (JAX gives it a row of zeros), and so
    do labels that are not integers (a float label matched no class: a row of zeros)."""
    _check_labels("one_hot", labels)
    return bind(ONE_HOT, labels, num_classes=_num_classes("one_hot", num_classes),
                dtype=S.supported_dtype("one_hot", dtype))


def _num_classes(who: str, n: Any) -> int:
    """A count of classes as an int >= 0 (NumPy's ints too), or a ValueError naming ``who``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"{who}: num_classes must be an int >= 0, got {n!r}")
    return int(n)


@names_user_line
def nll_loss(logp: Any, labels: Any) -> Any:
    """Mean over the batch of ``-logp[i, labels[i]]``: the negative log-likelihood of
    integer class labels under log-probabilities ``logp`` of shape (N, C)."""
    _check_labels("nll_loss", labels)
    return bind(NLL_LOSS, logp, labels)


@names_user_line
def log_softmax_grad(g: Any, y: Any, axis: int = -1) -> Any:
    """``g - exp(y) * sum(g, axis)``: log_softmax's VJP, given its output ``y``. The
    axis is ``g``'s: it is the one summed (``y`` broadcasts, as in the formula)."""
    return bind(LOG_SOFTMAX_GRAD, g, y,
                axis=S.check_axis("log_softmax_grad", axis, g))


@names_user_line
def nll_loss_grad(g: Any, labels: Any, num_classes: int, dtype: str = "float64") -> Any:
    """``-one_hot(labels) * g / N``: nll_loss's VJP for the loss's adjoint ``g`` (a
    scalar), an (N, num_classes) matrix."""
    _check_labels("nll_loss_grad", labels)
    return bind(NLL_LOSS_GRAD, g, labels,
                num_classes=_num_classes("nll_loss_grad", num_classes),
                dtype=S.supported_dtype("nll_loss_grad", dtype))


@names_user_line
def binary_cross_entropy_with_logits(logits: Any, targets: Any) -> Any:
    """Mean of -(t log sigmoid(x) + (1 - t) log sigmoid(-x)), PyTorch's
    ``binary_cross_entropy_with_logits``: from the logits, so it stays finite (and its
    gradient sigmoid(x) - t exact) however large |x| is. ``logits`` and ``targets`` must
    have one shape, as in PyTorch: logits (N, 1) against targets (N,) would broadcast to
    an N x N grid of pairs and average those, silently."""
    logits = check_same_shape("binary_cross_entropy_with_logits", ("logits", "targets"),
                              logits, targets)
    # (minigraph's functions, not Python's operators: they read nested lists too, where
    # 1.0 - [0.0, 1.0] and -[0.5] are not defined)
    picked = E.add(E.mul(targets, E.log_sigmoid(logits)),
                   E.mul(E.sub(1.0, targets), E.log_sigmoid(E.neg(logits))))
    return R.mean(E.neg(picked))


def check_same_shape(op: str, what: tuple[str, str], x: Any, y: Any) -> Any:
    """``x``, once ``y`` is known to have its shape: ``op`` (a loss) pairs the elements of
    its two arguments, ``what[0]`` and ``what[1]``, without broadcasting, as PyTorch
    does; a prediction (N, 1) against a target (N,) would broadcast to an N x N grid of
    pairs and be averaged, silently.

    Shapes known now are compared now, and a ShapeError names ``op``. A shape known
    only when a graph runs (a placeholder of ``shape=None``) is compared then: ``x``
    comes back as ``add_n([x, zeros_like(y)])``, and AddN's kernel refuses terms of two
    shapes (the run fails with a NodeError that shows the user's line, and names the
    node ``op/AddN``: the check is made under a name scope of ``op``). The sum holds
    x's numbers (a -0.0 becomes 0.0), in the dtype x and y promote to, as the loss's
    result is; AddN's rules pass x's gradient and tangent on unchanged, and zeros_like
    has none for y."""
    xs, ys = S.input_shape(op, what[0], x), S.input_shape(op, what[1], y)
    if xs is None or ys is None:
        graph = getattr(x, "graph", None) or getattr(y, "graph", None)  # (a graph's node)
        with graph.name_scope(op) if graph is not None else nullcontext():
            return E.add_n([x, C.zeros_like(y)])
    if tuple(xs) != tuple(ys):
        raise ShapeError(f"{op}: the {what[0]} {tuple(xs)} and the {what[1]} {tuple(ys)} "
                         f"must have the same shape (no broadcasting here)")
    return x


@names_user_line
def cross_entropy(logits: Any, labels: Any) -> Any:
    """Mean over the batch of -log softmax(logits)[label]; labels are integer classes."""
    _check_labels("cross_entropy", labels)
    ls, ys = S.input_shape("cross_entropy", "logits", logits), S.shape_of(labels)
    if ls is not None and ys is not None:  # (checked here: log_softmax would take any shape)
        _check_batch("cross_entropy", "logits", ls, ys)
    SH.same_device("cross_entropy", (logits, labels))  # (before log_softmax, nll_loss)
    return nll_loss(log_softmax(logits, 1), labels)


def _check_labels(who: str, labels: Any) -> None:
    if type(labels) is int:  # (one label as a Python int: a number has no dtype)
        return
    S.input_shape(who, "labels", labels)  # (a None, a str, a ragged list: no labels at all)
    dtype = S.dtype_of(labels)
    if dtype in ("int64", "int32"):  # (the dtypes every kernel here indexes with)
        return
    if dtype is not None and dtype.startswith(("int", "uint")):  # integers of another
        # size: a NumPy array's (minigraph's tensors have int64 and int32 only)
        raise DTypeError(f"{who}: labels must have dtype int64 or int32, got {dtype}; "
                        f"convert them first: labels.astype(np.int64)")
    raise DTypeError(f"{who}: labels must be integers, got dtype {dtype} (class indices "
                    f"of dtype int64 or int32)")
