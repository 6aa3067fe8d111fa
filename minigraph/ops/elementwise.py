"""Elementwise primitives: arithmetic, the functions of the textbook, comparisons.

Each entry is the whole truth about one operation: its kernel, its shape rule, and its
derivative rules, one per argument (see ``primitive.py``). The rules read like the
textbook's equations; ``mul``'s are (b.3) and (f.4)/(f.5):

    jvp:  da = dx * y + x * dy          vjp:  gx += ga * y,  gy += ga * x

Binary operations broadcast like NumPy. A gradient flowing back into a broadcast
argument is summed back to that argument's shape (``sum_to``), so ``x + b`` with ``x``
of shape (32, 10) and ``b`` of shape (10,) gives ``b`` a gradient of shape (10,).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import batch_rules as B
from . import copy as C
from . import reduce as R
from . import shape_rules as S
from ..errors import DTypeError, ShapeError
from .primitive import Each, bind, bind_one, bind_two, primitive, ufunc_out

if TYPE_CHECKING:  # (for annotations only: both modules import this one)
    from ..autodiff.batching import BatchTracer
    from ..tensor import Tensor


def _unbroadcast(*rules):
    """Wrap per-argument VJP rules so each result is summed to its argument's shape."""
    def wrap(i, rule):
        if rule is None:
            return None

        def vjp(g, out, *args):
            share = rule(g, out, *args)
            # (S.shape_of written out: this runs for every backward step of every
            # binary op; a Python number has no shape, i.e. shape ().)
            shape = getattr(args[i], "shape", ())
            return share if getattr(share, "shape", ()) == shape else R.sum_to(share, shape)
        return vjp
    return [wrap(i, r) for i, r in enumerate(rules)]


def as_floating(xp: Any, x: Any) -> Any:
    """``x`` as an op of ``S.floating``'s rule computes on it: integers and bools in
    float64. NumPy's ufuncs would pick float16 for a bool, a dtype minigraph has not, and
    softmax's ``x - max(x)`` in integer arithmetic wraps around (int64: 3 - (-2**63) is
    negative). (A NumPy array's ``dtype.kind`` answers at once; the namespace's
    ``isdtype`` is a Python function: this runs for every eager ``sin``.)"""
    if type(x) is np.ndarray:
        return x if x.dtype.kind == "f" else x.astype(np.float64)
    return x if xp.isdtype(x.dtype, "real floating") else xp.astype(x, xp.float64)


def _no_bool_power() -> DTypeError:
    return DTypeError("pow: a bool to a bool power is not supported (NumPy would compute "
                      "it in int8, a dtype minigraph has not); cast one of them to int64 "
                      "or a float first")


def _pow_shape(x: Any, y: Any) -> tuple:
    """Broadcast and promoted, as NumPy; a bool to a bool power refused (see the kernel)."""
    if _bool(x) and _bool(y):
        raise _no_bool_power()
    return S.elementwise("pow")(x, y)


def _sub_shape(x: Any, y: Any) -> tuple:
    """Broadcast and promoted; a bool minus a bool refused here, as NumPy's kernel refuses
    it, so that a traced or graph program says so where the user wrote it."""
    if _bool(x) and _bool(y):
        raise DTypeError("sub: a bool minus a bool is not supported (as in NumPy): use "
                         "mg.not_equal for exclusive or, or cast to int64 first")
    return S.elementwise("sub")(x, y)


def _neg_shape(x: Any) -> tuple:
    """``x``'s shape and dtype; the negative of a bool refused, as ``_sub_shape`` does."""
    if _bool(x):
        raise DTypeError("neg: the negative of a bool is not supported (as in NumPy): use "
                         "mg.equal(x, False) for logical not, or cast to int64 first")
    return S.same(x)


def _bool(v: Any) -> bool:
    """A Python bool, or a value of dtype bool."""
    return type(v) is bool or S.dtype_of(v) == "bool"


def _pow_kernel(xp: Any, x: Any, y: Any) -> Any:
    """``x ** y``. NumPy computes a bool to a bool power (a Python bool on either side
    too), or to a Python int power, in int8: the first is refused, the second computed in
    int64, as the shape rule says."""
    if _bool(x) and _bool(y):
        raise _no_bool_power()  # (here too: eager mode runs the kernel alone)
    if getattr(x, "dtype", None) == xp.bool and type(y) is int:
        x = xp.astype(x, xp.int64)
    return x ** y


def _still(t: Any, term: Any) -> Any:
    """A JVP's ``term``, the tangent ``t`` times the derivative, with 0 where ``t`` is 0:
    an element whose input does not move does not move the output, even where the
    derivative is inf or nan (sqrt's and log's at 0, 1 / y's at y = 0, exp's beyond 709,
    cos's at inf ...) and the product reads 0 * inf = nan. Forward-mode ``grad`` and
    ``jacfwd`` put such zeros in every element of a tangent but one, and the nan spread
    through a sum to the other elements: grad(sqrt(x).sum()) at [0, 4, 1] was [inf, nan,
    nan] in forward mode, [inf, 0.25, 0.5] in reverse mode. (torch.func.jacfwd and
    jax.jacfwd keep the nan.) A nonzero tangent keeps its inf or nan, as the mathematics
    says. Cheap: only a term with an inf or a nan is looked at, and only its nan elements
    where t is 0 change (0 * inf and 0 / 0 give nan).

    Only for a tangent that no outer transformation differentiates (:func:`_plain`): the
    derivative of t * J with respect to t is J, inf at such an element, and a 0 put in
    would have none (jacfwd of a jvp in its tangent gave 0 for inf); a graph's or a source
    program's tangent may be differentiated later, so it too keeps its term. (Where the
    outer transformation differentiates the primal instead, the value is right, but the
    derivative of a masked element still reads 0 * inf = nan: NumPy's where evaluates
    both sides.)"""
    if not _plain(t) or _all_finite(term):
        return term
    return where(t == 0, where(term == term, term, 0.0), term)  # (nan != nan)


@functools.cache
def _plain_classes() -> "tuple[type[Tensor], type[BatchTracer]]":
    """minigraph's Tensor and vmap's BatchTracer, imported at the first call (both modules
    import this one)."""
    from ..autodiff.batching import BatchTracer
    from ..tensor import Tensor

    return Tensor, BatchTracer


def _plain(t: Any) -> bool:
    """Whether ``t`` is a value no transformation differentiates: a tensor that requires
    no gradient, or a vmap batch of one (vmap differentiates nothing)."""
    tensor, batch = _plain_classes()
    for _ in range(100):  # (levels of vmap: a bound, as in operators.innermost)
        if type(t) is tensor:
            return not t._requires_grad
        if type(t) is not batch:
            return False
        t = t._inside()
    return False


def _all_finite(v: Any) -> bool:
    """Whether every number of ``v`` is known to be finite: a Python number, or a tensor,
    also under a transformation's wrappers (``_inside``: a box's value, a dual number's
    primal, a vmap batch) or held as ``value`` (a weak number's tensor, an ``explain``
    symbol's, a source program's constant's). False where the numbers are not known
    before the program runs: a graph node, a source variable."""
    tensor_class = _plain_classes()[0]
    for _ in range(100):  # (levels of nesting: a bound, as in operators.innermost)
        if isinstance(v, tensor_class):
            if getattr(v.data, "ndim", None) == 0:  # (one number: Python's test is a
                return math.isfinite(v.data)         # tenth of NumPy's all(isfinite))
            xp = v.device.xp
            return bool(xp.all(xp.isfinite(v.data)))
        if type(v) in (int, float):
            return math.isfinite(v)
        inside = getattr(v, "_inside", None)
        if inside is not None:
            v = inside()
        elif isinstance(getattr(v, "value", None), tensor_class):
            v = v.value
        else:
            return False
    return False


# -- arithmetic -----------------------------------------------------------------------
# The rules use Python's operators: on a tensor, a dual number, a graph node or a source
# variable they call the functions below, and on plain numbers they stay plain numbers.

ADD = primitive(
    "add", lambda xp, x, y: x + y, S.elementwise("add"),
    jvp=[lambda t, out, x, y: t, lambda t, out, x, y: t],
    vjp=_unbroadcast(lambda g, out, x, y: g, lambda g, out, x, y: g),
    out=ufunc_out("add"), batch=B.elementwise("add"),
    symbol="+", neutral=(-0.0, (0, 1)))  # (x + 0.0 is +0.0 where x is -0.0)

SUB = primitive(
    "sub", lambda xp, x, y: x - y, _sub_shape,
    jvp=[lambda t, out, x, y: t, lambda t, out, x, y: -t],
    vjp=_unbroadcast(lambda g, out, x, y: g, lambda g, out, x, y: -g),
    out=ufunc_out("subtract"), batch=B.elementwise("sub"),
    symbol="-", neutral=(0, (1,)))

MUL = primitive(  # (b.3): da = dx * y + x * dy        (f.4), (f.5): gy = ga * x, gx = ga * y
    "mul", lambda xp, x, y: x * y, S.elementwise("mul"),
    jvp=[lambda t, out, x, y: _still(t, t * y), lambda t, out, x, y: _still(t, x * t)],
    vjp=_unbroadcast(lambda g, out, x, y: g * y, lambda g, out, x, y: g * x),
    out=ufunc_out("multiply"), batch=B.elementwise("mul"),
    symbol="*", neutral=(1, (0, 1)))

DIV = primitive(
    "div", lambda xp, x, y: x / y, S.floating("div"),
    jvp=[lambda t, out, x, y: _still(t, t / y),
         lambda t, out, x, y: _still(t, -t * out / y)],
    vjp=_unbroadcast(lambda g, out, x, y: g / y, lambda g, out, x, y: -g * out / y),
    out=ufunc_out("divide"), batch=B.elementwise("div"),
    symbol="/", neutral=(1, (1,)))

NEG = primitive(
    "neg", lambda xp, x: -x, _neg_shape,
    jvp=[lambda t, out, x: -t],
    vjp=[lambda g, out, x: -g],
    out=ufunc_out("negative"), batch=B.elementwise("neg"),
    symbol="-")

def _pow_dx(g: Any, out: Any, x: Any, y: Any) -> Any:
    """g * y * x ** (y - 1), and 0 where y == 0: x ** 0 is constant, its derivative 0 even
    at x = 0, where the formula reads 0 * inf, and even where g is inf or nan (sqrt(x ** 0
    - 1) at its 0): selected with where (or zeros), never g times 0 (PyTorch's values)."""
    if isinstance(y, (int, float)):
        return C.zeros_like(g) if y == 0 else g * (y * x ** (y - 1))
    return where(y == 0, 0.0, g * (y * x ** (y - 1)))


def _pow_dy(g: Any, out: Any, x: Any, y: Any) -> Any:
    """g * log(x) * x ** y, and 0 where x == 0 and y >= 0: there 0 ** y is constant in y
    (0 or 1), while the formula reads -inf * 0 (PyTorch's value)."""
    if isinstance(x, (int, float)):  # 2.0 ** y
        if x > 0:
            return g * (math.log(x) * out)
        return g * (where(y >= 0, 0.0, -math.inf * out) if x == 0 else math.nan * out)
    share = log(x) * out
    if isinstance(y, (int, float)):
        return g * (where(x == 0, 0.0, share) if y >= 0 else share)
    return g * where(x == 0, where(y >= 0, 0.0, share), share)


# d(x ** y) = y * x ** (y - 1) * dx + log(x) * x ** y * dy
POW = primitive(
    "pow", _pow_kernel, _pow_shape,
    jvp=[lambda t, out, x, y: _still(t, _pow_dx(t, out, x, y)),
         lambda t, out, x, y: _still(t, _pow_dy(t, out, x, y))],
    vjp=_unbroadcast(_pow_dx, _pow_dy),
    out=ufunc_out("pow"), batch=B.elementwise("pow"),
    symbol="**", neutral=(1, (1,)))


def _no_two_bools(name: str, x: Any, y: Any) -> None:
    """NumPy's ``//`` and ``%`` of two bools give int8, which minigraph does not have."""
    if (type(x) is bool or S.dtype_of(x) == "bool") and \
            (type(y) is bool or S.dtype_of(y) == "bool"):
        raise DTypeError(f"{name} of two bools: NumPy computes it in int8, which minigraph "
                         f"does not have; convert one first (mg.astype(x, 'int64'))")


def _integer(v: Any) -> bool:
    """An integer or bool value: a Python int or bool, or an array of such a dtype
    (NumPy's kind; another namespace's dtype by its name, ``array_api_strict.int64``)."""
    if type(v) in (int, bool):
        return True
    dtype = getattr(v, "dtype", None)
    kind = getattr(dtype, "kind", None)
    if kind is not None:
        return kind in ("i", "u", "b")
    return dtype is not None and ("int" in str(dtype) or "bool" in str(dtype))


def _has_zero(xp: Any, y: Any) -> bool:
    """Whether the integer or bool divisor ``y`` is 0 (False) somewhere."""
    if type(y) in (int, bool):
        return y == 0
    if "bool" in str(y.dtype):  # (the Array API compares no bool with an int)
        return not bool(xp.all(y))
    return bool(xp.any(y == 0))


def _floored(name: str) -> tuple[Any, Any]:
    """The kernel and the shape rule of ``//`` or ``%``: NumPy's, broadcast and promoted,
    two bools refused in both (eager mode runs the kernel alone)."""
    promoted = S.elementwise(name)

    def kernel(xp: Any, x: Any, y: Any) -> Any:
        _no_two_bools(name, x, y)
        if _integer(x) and _integer(y) and _has_zero(xp, y):
            # (NumPy answers 0 with a warning, a wrong number that flows on silently)
            raise ZeroDivisionError(
                f"{name}: integer division by zero (x {'//' if name == 'floor_divide' else '%'}"
                f" 0 has no integer value; Python and PyTorch raise too, NumPy gives 0). "
                f"Divide floats for inf and nan, or mask the zeros first")
        return x // y if name == "floor_divide" else x % y

    def rule(x: Any, y: Any) -> tuple:
        _no_two_bools(name, x, y)
        return promoted(x, y)
    return kernel, rule


# x // y and x % y, floored as Python's and NumPy's are (the remainder has y's sign):
# (no ``out`` kernel: every runtime calls the kernel, which refuses integer zeros)
# x % y = x - (x // y) * y. x // y is constant between its jumps, so it has no
# derivative rule (its result is a constant, a zero gradient almost everywhere, as JAX
# gives it; PyTorch raises); x % y has d(x % y) = dx - (x // y) dy, as PyTorch's.
FLOOR_DIVIDE = primitive(
    "floor_divide", *_floored("floor_divide"),
    batch=B.elementwise("floor_divide"), differentiable=False,
    symbol="//")

REMAINDER = primitive(
    "remainder", *_floored("remainder"),
    jvp=[lambda t, out, x, y: t,
         lambda t, out, x, y: _still(t, -t * floor_divide(x, y))],
    vjp=_unbroadcast(lambda g, out, x, y: g, lambda g, out, x, y: -g * floor_divide(x, y)),
    batch=B.elementwise("remainder"),
    symbol="%")


def _mask(condition: Any, like: Any) -> Any:
    """A 0/1 mask of ``like``'s dtype: ``g * (mask(x > 0) - mask(x < 0))`` is abs's rule,
    g * sign(x), as PyTorch's (nan where g is inf and x is 0: 0 * inf). A rule that must
    give 0 where it does not select, whatever g is, uses ``where`` (maximum below)."""
    # like is a tangent or an adjoint, which has a dtype (dtype_of is None only for a
    # Python number)
    return C.astype(condition, cast(str, S.dtype_of(like)), copy=False)


def _selected(g: Any, loses: Any, ties: Any) -> Any:
    """An argument's share of maximum's (minimum's) derivative: ``g`` where it is
    selected, 0 where the other one is (``loses``), ``g / 2`` at a tie (``ties``).

    At x == y the function is not differentiable; the derivative is split evenly, as
    torch.maximum and jax.numpy.maximum split it, and as mg.max and mg.min split theirs
    (reduce.py): maximum(x, y) and max(stack([x, y])) have one derivative. The argument
    not selected gets 0 with where, not g times a 0/1 mask, which gives nan where g is inf
    or nan (0 * inf): sqrt(maximum(x, 0)) at x = -1 is constant nearby, its derivative 0,
    as PyTorch's. Where the value is nan (a nan argument: no comparison holds), both get
    g, as in PyTorch's gradient."""
    return where(loses, 0.0, where(ties, g * 0.5, g))


# One rule serves the JVP (g a tangent) and the VJP (g an adjoint).
MAXIMUM = primitive(
    "maximum", lambda xp, x, y: xp.maximum(x, y), S.elementwise("maximum"),
    jvp=[lambda t, out, x, y: _selected(t, x < y, x == y),
         lambda t, out, x, y: _selected(t, x > y, x == y)],
    vjp=_unbroadcast(lambda g, out, x, y: _selected(g, x < y, x == y),
                     lambda g, out, x, y: _selected(g, x > y, x == y)),
    out=ufunc_out("maximum"), batch=B.elementwise("maximum"),
    public="maximum")

MINIMUM = primitive(
    "minimum", lambda xp, x, y: xp.minimum(x, y), S.elementwise("minimum"),
    jvp=[lambda t, out, x, y: _selected(t, x > y, x == y),
         lambda t, out, x, y: _selected(t, x < y, x == y)],
    vjp=_unbroadcast(lambda g, out, x, y: _selected(g, x > y, x == y),
                     lambda g, out, x, y: _selected(g, x < y, x == y)),
    out=ufunc_out("minimum"), batch=B.elementwise("minimum"),
    public="minimum")

# -- functions ---------------------------------------------------------------------------

ABS = primitive(  # d|x| = sign(x) dx, 0 at x = 0 (as PyTorch and JAX): a subgradient there
    "abs", lambda xp, x: xp.abs(x), S.same,
    jvp=[lambda t, out, x: t * (_mask(x > 0, t) - _mask(x < 0, t))],
    vjp=[lambda g, out, x: g * (_mask(x > 0, g) - _mask(x < 0, g))],
    out=ufunc_out("absolute"), batch=B.elementwise("abs"),
    public="abs")

EXP = primitive(
    "exp", lambda xp, x: xp.exp(as_floating(xp, x)), S.floating("exp"),
    jvp=[lambda t, out, x: _still(t, t * out)],
    vjp=[lambda g, out, x: g * out],
    out=ufunc_out("exp"), batch=B.elementwise("exp"),
    public="exp")

LOG = primitive(
    "log", lambda xp, x: xp.log(as_floating(xp, x)), S.floating("log"),
    jvp=[lambda t, out, x: _still(t, t / x)],
    vjp=[lambda g, out, x: g / x],
    out=ufunc_out("log"), batch=B.elementwise("log"),
    public="log")

SIN = primitive(  # (b.4): db = cos(x) * dx        (f.5): gx += gb * cos(x)
    "sin", lambda xp, x: xp.sin(as_floating(xp, x)), S.floating("sin"),
    jvp=[lambda t, out, x: _still(t, t * cos(x))],
    vjp=[lambda g, out, x: g * cos(x)],
    out=ufunc_out("sin"), batch=B.elementwise("sin"),
    public="sin")

COS = primitive(
    "cos", lambda xp, x: xp.cos(as_floating(xp, x)), S.floating("cos"),
    jvp=[lambda t, out, x: _still(t, -(t * sin(x)))],
    vjp=[lambda g, out, x: -(g * sin(x))],
    out=ufunc_out("cos"), batch=B.elementwise("cos"),
    public="cos")

TANH = primitive(
    "tanh", lambda xp, x: xp.tanh(as_floating(xp, x)), S.floating("tanh"),
    jvp=[lambda t, out, x: t * (1.0 - out * out)],
    vjp=[lambda g, out, x: g * (1.0 - out * out)],
    out=ufunc_out("tanh"), batch=B.elementwise("tanh"),
    public="tanh")


def _sigmoid_kernel(xp: Any, x: Any) -> Any:
    """1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below: exp of -|x| never overflows,
    and the second form keeps the tiny values (float32 sigmoid(-20) = 2.06e-9, where
    1 - 1/(1 + e^20) and the tanh form round to 0)."""
    x = as_floating(xp, x)
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _log_sigmoid_kernel(xp: Any, x: Any) -> Any:
    """log(sigmoid(x)) = min(x, 0) - log(1 + e^-|x|): finite for every finite x."""
    x = as_floating(xp, x)
    return xp.minimum(x, 0.0) - xp.log1p(xp.exp(-xp.abs(x)))


SIGMOID = primitive(
    "sigmoid", _sigmoid_kernel, S.floating("sigmoid"),
    jvp=[lambda t, out, x: t * (out * (1.0 - out))],
    vjp=[lambda g, out, x: g * (out * (1.0 - out))],
    batch=B.elementwise("sigmoid"),
    public="sigmoid")

LOG_SIGMOID = primitive(  # d log(sigmoid(x)) = (1 - sigmoid(x)) dx = sigmoid(-x) dx
    "log_sigmoid", _log_sigmoid_kernel, S.floating("log_sigmoid"),
    jvp=[lambda t, out, x: t * sigmoid(-x)],
    vjp=[lambda g, out, x: g * sigmoid(-x)],
    batch=B.elementwise("log_sigmoid"),
    public="log_sigmoid")

_NUMPY_ZEROS: dict[Any, Any] = {}  # dtype -> a 0-d NumPy zero of that dtype


def _zero(x: Any) -> Any:
    """The 0 of ``maximum(x, 0)``, of ``x``'s dtype so the result keeps it.

    For a NumPy array or scalar, a 0-d zero of its dtype, made once per dtype: NumPy reads it
    faster than a Python number, a third of the time of a small relu. Otherwise 0.0 for
    a float array and 0 for any other, Python numbers, which the Array API lets meet any
    array of their kind (its dtypes have no ``kind``)."""
    if type(x) is np.ndarray or isinstance(x, np.generic):  # (a 0-d result: np.bool_ ...)
        zero = _NUMPY_ZEROS.get(x.dtype)
        if zero is None:
            zero = _NUMPY_ZEROS[x.dtype] = np.zeros((), x.dtype)
        return zero
    return 0.0 if getattr(x.dtype, "kind", None) == "f" else 0


def _relu_grad_kernel(xp: Any, g: Any, y: Any, out: Any = None) -> Any:
    """``g`` where ``y > 0``, else 0. Multiplying by the mask is one pass, where NumPy's
    ``where(mask, g, 0)`` takes 1.5-6x as long; but 0 * inf is nan, so where g holds an
    inf or a nan, ``where`` picks instead (relu is constant there: sqrt(relu(x)) at
    x = -1 has derivative 0, as in PyTorch). ``out`` may be y's own buffer (a compiled
    program reuses it): y is read once, into the mask, before anything is written.
    The mask is "not y <= 0", not "y > 0": at a NaN input the gradient passes, as in
    PyTorch's threshold_backward and in maximum(x, 0)'s rule here."""
    stopped = y <= 0
    if type(stopped) is bool:  # y was a Python number: all of g (an array) or none of it
        result = xp.zeros_like(g) if stopped else xp.asarray(g, copy=True)
    else:
        positive = xp.logical_not(stopped)
        finite = math.isfinite(g) if type(g) in (int, float) else bool(xp.all(xp.isfinite(g)))
        if finite:
            mask = _factor(xp, positive, g)
            return xp.multiply(g, mask) if out is None else xp.multiply(g, mask, out=out)
        result = xp.where(positive, g, _zero(g) if hasattr(g, "dtype") else 0.0)
    if out is not None:
        out[...] = result
        result = out
    return result


def _factor(xp: Any, mask: Any, g: Any) -> Any:
    """The mask ``y > 0`` as a factor of ``g``. NumPy and CuPy multiply by a bool array,
    or by NumPy's bool scalar (the mask of a 0-d y), as by 0/1 in ``g``'s own dtype (a
    Python 1.0 in its place made an integer g's product float64, against the rule); the
    Array API wants the mask cast to ``g``'s dtype first."""
    if type(mask) is np.ndarray or type(mask) is np.bool_:
        return mask
    return xp.astype(mask, g.dtype if hasattr(g, "dtype") else xp.asarray(g).dtype)


# relu's VJP as a primitive of its own, as TensorFlow's ReluGrad (PyTorch's
# threshold_backward): g * (y > 0) in one kernel. It is linear in g, so its rules for g
# are itself; the mask is piecewise constant in y, so its derivative by y is zero almost
# everywhere, and a None rule contributes nothing.
RELU_GRAD = primitive(
    "relu_grad", _relu_grad_kernel, S.adjoint("relu_grad"),
    jvp=[lambda t, out, g, y: relu_grad(t, y), None],
    vjp=_unbroadcast(lambda gg, out, g, y: relu_grad(gg, y), None),  # (g may broadcast)
    out=lambda xp, g, y, out: _relu_grad_kernel(xp, g, y, out),
    batch=B.elementwise("relu_grad"),
    public="relu_grad")


# The derivative at 0 is taken as 0, as in PyTorch. The rules read the output (out > 0
# exactly where x > 0), so that x is not needed after the forward pass: graph mode can
# then compute relu in x's buffer.
RELU = primitive(
    "relu", lambda xp, x: xp.maximum(x, _zero(x)), S.same,
    jvp=[lambda t, out, x: relu_grad(t, out)],
    vjp=[lambda g, out, x: relu_grad(g, out)],
    out=lambda xp, x, out: xp.maximum(x, _zero(x), out=out), batch=B.elementwise("relu"),
    public="relu")

SQRT = primitive(
    "sqrt", lambda xp, x: xp.sqrt(as_floating(xp, x)), S.floating("sqrt"),
    jvp=[lambda t, out, x: _still(t, t / (2.0 * out))],
    vjp=[lambda g, out, x: g / (2.0 * out)],
    out=ufunc_out("sqrt"), batch=B.elementwise("sqrt"),
    public="sqrt")


def _where_shape(c: Any, x: Any, y: Any) -> tuple:
    return S.broadcast_shapes("where", *map(S.shape_of, (c, x, y))), S.promote(x, y)


def _where_kernel(xp: Any, c: Any, x: Any, y: Any) -> Any:
    # A Python bool condition (where(2.0 > 0, x, y)): NumPy takes it, the Array API wants
    # an array.
    return xp.where(xp.asarray(c) if isinstance(c, bool) else c, x, y)


WHERE = primitive(
    "where", _where_kernel, _where_shape,
    jvp=[None, lambda t, out, c, x, y: where(c, t, 0.0), lambda t, out, c, x, y: where(c, 0.0, t)],
    vjp=_unbroadcast(None, lambda g, out, c, x, y: where(c, g, 0.0),
                     lambda g, out, c, x, y: where(c, 0.0, g)), batch=B.elementwise("where"),
    public="where", promoted=(1, 2))

def _same_shape(xs: tuple) -> tuple:
    """The one shape of AddN's terms; terms of several shapes are refused (AddN does not
    broadcast, as TensorFlow's: its terms are the shares of one value's adjoint). A
    Python number is added to every element, as by ``+``."""
    shapes = {S.shape_of(x) for x in xs if type(x) not in (bool, int, float)}
    if len(shapes) > 1:  # (each term's shape, in order: which one differs is the point)
        given = [S.shape_of(x) for x in xs]
        raise ShapeError(f"AddN: all terms must have the same shape, got the shapes {given}")
    return shapes.pop() if shapes else ()


def _add_n_shape(*xs: Any) -> tuple:
    return _same_shape(xs), S.promote(*xs)


def _add_arrays(xp: Any, *xs: Any) -> Any:
    """The sum of the terms, always a new array (one term, which only a direct ``bind``
    can give: ``add_n`` returns it without a node, is copied), so that AddN is no
    ``view``: a compiled graph hands an AddN result, such as a gradient with two
    contributions, to its caller without copying it again. The terms' shapes are
    checked here too: eager mode asks the shape rule only when a kernel fails, and ``+``
    would broadcast. (It runs for every adjoint with several contributions: the full
    check only where a term's shape differs from the first's.)"""
    first = getattr(xs[0], "shape", None)
    for x in xs[1:]:
        if getattr(x, "shape", first) != first:
            _same_shape(xs)  # (refuses terms of two shapes; a Python number is let through)
            break
    if len(xs) == 1:
        return xp.asarray(xs[0], copy=True)
    if any(type(x) in _WEAK for x in xs):  # (Python numbers last: they take the arrays'
        xs = tuple(sorted(xs, key=lambda x: type(x) in _WEAK))  # dtype, as one NumPy op;
        # first, 2 + np.True_ made an int64 that widened a float32 term to float64)
    total = xs[0] + xs[1]
    for x in xs[2:]:
        total = total + x
    return total


_WEAK = (int, float, bool)  # Python's numbers, weak beside arrays (NEP 50)


# AddN adds up several terms of one shape; the reverse-graph pass uses it to sum the
# contributions to an adjoint, as TensorFlow does (hence TensorFlow's name for it).
def _write_add_n(prim: Any, args: list[str], params: dict, literal: Any) -> str:
    return f"mg.add_n([{', '.join(args)}])"


ADD_N = primitive(
    "AddN", _add_arrays, _add_n_shape,
    jvp=Each(lambda i: lambda t, out, *xs: t),
    vjp=Each(lambda i: lambda g, out, *xs: g, together=lambda g, out, *xs: [g] * len(xs)),
    batch=B.all_batched("AddN"),  # (AddN does not broadcast: every term gets the batch axis)
    public="add_n", write=_write_add_n)

# -- comparisons (no derivative: their results are bool) ---------------------------------

LESS = primitive("less", lambda xp, x, y: x < y, S.comparison("less"),
                 batch=B.elementwise("less"), differentiable=False,
    symbol="<")
LESS_EQUAL = primitive("less_equal", lambda xp, x, y: x <= y, S.comparison("less_equal"),
                       batch=B.elementwise("less_equal"), differentiable=False,
    symbol="<=")
GREATER = primitive("greater", lambda xp, x, y: x > y, S.comparison("greater"),
                    batch=B.elementwise("greater"), differentiable=False,
    symbol=">")
GREATER_EQUAL = primitive("greater_equal", lambda xp, x, y: x >= y,
                          S.comparison("greater_equal"), batch=B.elementwise("greater_equal"), differentiable=False,
    symbol=">=")
EQUAL = primitive("equal", lambda xp, x, y: x == y, S.comparison("equal"),
                  batch=B.elementwise("equal"), differentiable=False,
    symbol="==")
NOT_EQUAL = primitive("not_equal", lambda xp, x, y: x != y, S.comparison("not_equal"),
                      batch=B.elementwise("not_equal"), differentiable=False,
    symbol="!=")


# -- the public functions ----------------------------------------------------------------

def add(x: Any, y: Any) -> Any:
    """x + y, broadcasting."""
    return bind_two(ADD, x, y)


def sub(x: Any, y: Any) -> Any:
    """x - y, broadcasting."""
    return bind_two(SUB, x, y)


def mul(x: Any, y: Any) -> Any:
    """x * y, broadcasting (the textbook's (a.3))."""
    return bind_two(MUL, x, y)


def div(x: Any, y: Any) -> Any:
    """x / y, broadcasting; true division (integers give float64)."""
    return bind_two(DIV, x, y)


def neg(x: Any) -> Any:
    """-x."""
    return bind_one(NEG, x, {})


def pow(x: Any, y: Any) -> Any:  # noqa: A001 - the operator's own name
    """x ** y, broadcasting."""
    return bind_two(POW, x, y)


def floor_divide(x: Any, y: Any) -> Any:
    """x // y, floored (``-7 // 2 == -4``), broadcasting; no gradient flows through it."""
    return bind_two(FLOOR_DIVIDE, x, y)


def remainder(x: Any, y: Any) -> Any:
    """x % y, with the sign of y as in Python and NumPy (``-7 % 2 == 1``), broadcasting."""
    return bind_two(REMAINDER, x, y)


def maximum(x: Any, y: Any) -> Any:
    """Elementwise maximum; at ties the gradient is split evenly between ``x`` and ``y``
    (as in PyTorch and JAX, and as ``mg.max`` splits it)."""
    return bind_two(MAXIMUM, x, y)


def minimum(x: Any, y: Any) -> Any:
    """Elementwise minimum; at ties the gradient is split evenly between ``x`` and ``y``
    (as in PyTorch and JAX, and as ``mg.min`` splits it)."""
    return bind_two(MINIMUM, x, y)


def abs(x: Any) -> Any:  # noqa: A001 - NumPy's and PyTorch's name (builtin abs(x) calls it)
    """|x|, elementwise; its derivative at 0 is taken as 0, as in PyTorch and JAX."""
    return bind_one(ABS, x, {})


def exp(x: Any) -> Any:
    """e ** x."""
    return bind_one(EXP, x, {})


def log(x: Any) -> Any:
    """Natural logarithm."""
    return bind_one(LOG, x, {})


def sin(x: Any) -> Any:
    """Sine (the textbook's (a.4))."""
    return bind_one(SIN, x, {})


def cos(x: Any) -> Any:
    """Cosine."""
    return bind_one(COS, x, {})


def tanh(x: Any) -> Any:
    """Hyperbolic tangent."""
    return bind_one(TANH, x, {})


def sigmoid(x: Any) -> Any:
    """The logistic function 1 / (1 + e ** -x)."""
    return bind_one(SIGMOID, x, {})


def log_sigmoid(x: Any) -> Any:
    """log(sigmoid(x)), computed without forming sigmoid(x) (finite for large |x|)."""
    return bind_one(LOG_SIGMOID, x, {})


def relu(x: Any) -> Any:
    """max(x, 0); its derivative at 0 is taken as 0, as in PyTorch."""
    return bind_one(RELU, x, {})


def relu_grad(g: Any, y: Any) -> Any:
    """``g * (y > 0)``: relu's VJP, given the output ``y = relu(x)``. The rules of
    ``relu`` call it; it appears in generated adjoint code as ``mg.relu_grad(gb, b)``."""
    return bind_two(RELU_GRAD, g, y)


def sqrt(x: Any) -> Any:
    """Square root."""
    return bind_one(SQRT, x, {})


def add_n(xs: "list[Any] | tuple[Any, ...]") -> Any:
    """The sum of several values of one shape (one AddN node in a graph)."""
    xs = S.operands("add_n", xs)
    if not xs:  # (as concatenate: an empty sum has no shape, dtype or device to take)
        raise ShapeError("add_n: needs at least one term")
    return xs[0] if len(xs) == 1 else bind(ADD_N, *xs)


def where(condition: Any, x: Any, y: Any) -> Any:
    """``x`` where ``condition`` holds, else ``y`` (no gradient to the condition)."""
    return bind(WHERE, condition, x, y)


def less(x: Any, y: Any) -> Any:
    return bind_two(LESS, x, y)


def less_equal(x: Any, y: Any) -> Any:
    return bind_two(LESS_EQUAL, x, y)


def greater(x: Any, y: Any) -> Any:
    return bind_two(GREATER, x, y)


def greater_equal(x: Any, y: Any) -> Any:
    return bind_two(GREATER_EQUAL, x, y)


def equal(x: Any, y: Any) -> Any:
    return bind_two(EQUAL, x, y)


def not_equal(x: Any, y: Any) -> Any:
    return bind_two(NOT_EQUAL, x, y)
