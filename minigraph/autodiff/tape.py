"""Reverse mode with a tape: define-by-run (the textbook's (e.*)-(g.*)).

Two halves, and a guard between them:

**Recording.** :func:`apply` is the eager interpreter behind every operation on tensors.
It runs the kernel at once and, when an argument requires a gradient, writes the tape
entry ``(primitive, parameters, sequence number, *arguments)`` on the result: one tuple,
so that a recorded op leaves two objects (the tensor and its entry) for Python's garbage
collector to walk, whose full passes over a long tape would otherwise cost more per op
the longer the tape. The sequence numbers count up, so they *are* the tape's order: the
forward evaluation order (a.1)-(a.5).

**The reverse sweep.** :func:`sweep` walks the entries that lead to the output in
*decreasing* sequence number, the reverse of the evaluation order, and hands each
entry's adjoint to its primitive's VJP rules, which add their shares into the adjoints
of the arguments, exactly (f.1)-(f.5)::

    gz = 1;  ga += gz;  gb += gz;  gy += ga * x;  gx += ga * y;  gx += gb * cos(x)

Finding the entries is an explicit-stack traversal and sorting by sequence number, so
a chain of 100,000 operations needs no recursion. An adjoint is dropped as soon as its
entry is processed, so memory falls as the sweep goes. The VJP rules are ordinary
minigraph code: run while recording (``create_graph=True``), the sweep writes its own
tape, and a second sweep over it gives second derivatives.

**In-place updates** (``x -= y``, :func:`update_in_place`) write into a tensor's array
outside recording; each write is stamped with a sequence number, and the sweep refuses
an entry that reads an array written after the entry was made.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Callable, Iterable

from ..device import get_device
from ..errors import DeviceError, DTypeError, GradientError, MinigraphError, ShapeError
from ..ops import copy as C
from ..ops.primitive import Primitive, register_eager
from ..tensor import FLOAT_DTYPES, Tensor, tensor, zeros

_NUMBERS = (float, int, bool)


# -- gradient mode -------------------------------------------------------------------------

class _GradMode(threading.local):
    enabled = True


_mode = _GradMode()


class _SetGradMode:
    """Context manager (and decorator) that switches recording on or off."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self) -> None:
        self.prev = _mode.enabled
        _mode.enabled = self.enabled

    def __exit__(self, *exc: object) -> None:
        _mode.enabled = self.prev

    def __call__(self, fn: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _SetGradMode(self.enabled):
                return fn(*args, **kwargs)
        return wrapper


def no_grad() -> _SetGradMode:
    """``with mg.no_grad():`` compute without recording (inference, optimizer steps)."""
    return _SetGradMode(False)


def enable_grad() -> _SetGradMode:
    """``with mg.enable_grad():`` record again inside a ``no_grad`` block."""
    return _SetGradMode(True)


def is_grad_enabled() -> bool:
    return _mode.enabled


# -- recording: the eager interpreter ----------------------------------------------------------

_sequence = itertools.count()


def apply(prim: Primitive, args: tuple, params: dict) -> Tensor:
    """Run ``prim`` on tensors now; record it on the tape if a gradient may be needed.

    This is the hot path of define-by-run: every ``x * y`` comes here. Most calls are
    one tensor, or two without parameters, on one CPU device (``x * y``, ``mg.sin(x)``,
    ``x.sum(0)``); they take the two short paths below, which do what
    :func:`_apply_general` does in fewer steps (a third of the Python time per op on
    small tensors).
    """
    if not params and len(args) == 2:
        x, y = args
        if type(x) is Tensor and type(y) is Tensor and x.device is y.device \
                and x.device.context is None:
            try:
                data = prim.impl(x.device.xp, x.data, y.data)
            except MinigraphError:
                raise
            except Exception as exc:
                raise _kernel_error(prim, args, params, exc) from exc
            if (x.requires_grad or y.requires_grad) and prim.differentiable and _mode.enabled:
                return Tensor(data, x.device, True, (prim, params, next(_sequence), x, y))
            return Tensor(data, x.device)
    elif len(args) == 1:
        x = args[0]
        if type(x) is Tensor and x.device.context is None and prim is not _TO_DEVICE:
            try:
                if params:  # x.sum(axis=0), x.reshape(...)
                    data = prim.impl(x.device.xp, x.data, **params)
                else:
                    data = prim.impl(x.device.xp, x.data)
            except MinigraphError:
                raise
            except Exception as exc:
                raise _kernel_error(prim, args, params, exc) from exc
            if x.requires_grad and prim.differentiable and _mode.enabled:
                return Tensor(data, x.device, True, (prim, params, next(_sequence), x))
            return Tensor(data, x.device)
    return _apply_general(prim, args, params)


def _apply_general(prim: Primitive, args: tuple, params: dict) -> Tensor:
    """``apply`` for any arguments: tensors (all on one device), Python numbers, and
    anything else, which :func:`_apply_converting` turns into tensors first."""
    device = None
    track = False
    arrays = []
    for a in args:
        if type(a) is Tensor:
            if device is None:
                device = a.device
            elif a.device is not device:
                raise _device_error(prim, args)
            arrays.append(a.data)
            if a.requires_grad:
                track = True
        elif type(a) in _NUMBERS:
            arrays.append(a)  # Python numbers stay "weak", as in NumPy: x32 * 2.0 is float32
        else:
            return _apply_converting(prim, args, params)
    if device is None:
        return _apply_converting(prim, args, params)
    try:
        if device.context is not None:  # a GPU: run on it (see Device.context)
            with device.context:
                data = prim.impl(device.xp, *arrays, **params)
        else:
            data = prim.impl(device.xp, *arrays, **params)
    except MinigraphError:
        raise
    except Exception as exc:
        raise _kernel_error(prim, args, params, exc) from exc
    if prim is _TO_DEVICE:  # the one primitive whose result lives on another device
        device = params["device"]
    if track and prim.differentiable and _mode.enabled:
        return Tensor(data, device, True, (prim, params, next(_sequence), *args))
    return Tensor(data, device)


_TO_DEVICE = C.TO_DEVICE


def _apply_converting(prim: Primitive, args: tuple, params: dict) -> Tensor:
    """``apply`` for arguments that are not all tensors and numbers: lists and arrays
    become tensors on the device of the tensor arguments; with no tensor argument at
    all (``mg.sin(2.0)``), everything becomes a tensor on the default device."""
    tensors = [a for a in args if isinstance(a, Tensor)]
    device = tensors[0].device if tensors else get_device(None)
    # Exact Python numbers stay weak; NumPy scalars (np.float64 is a float subclass)
    # have a dtype of their own, as in NumPy, and become tensors.
    return apply(prim, tuple(a if type(a) is Tensor or (tensors and type(a) in _NUMBERS)
                             else tensor(a, device=device) for a in args), params)


register_eager(apply)


def _describe(args: tuple) -> str:
    parts = []
    for a in args:
        if isinstance(a, Tensor):
            parts.append(f"shape {a.shape} {a.dtype} on {a.device.name}")
        else:
            parts.append(repr(a))
    return ", ".join(parts)


def _device_error(prim: Primitive, args: tuple) -> DeviceError:
    names = sorted({a.device.name for a in args if isinstance(a, Tensor)})
    return DeviceError(
        f"{prim.name}: arguments live on different devices ({' and '.join(names)}): "
        f"{_describe(args)}. minigraph never copies silently; move one with "
        f"x.to('{names[0]}')")


def _kernel_error(prim: Primitive, args: tuple, params: dict, exc: Exception) -> Exception:
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items() if k not in ("device", "source"))
    where = f"{prim.name}({_describe(args)}{', ' + shown if shown else ''})"
    if isinstance(exc, IndexError):
        return IndexError(f"{where}: {exc}")
    try:  # the shape rule explains a mismatch better than the kernel's message
        prim.shape(*args, **params)
    except MinigraphError as rule_error:
        return type(rule_error)(f"{rule_error} [in {where}]")
    except Exception:
        pass
    if "broadcast" in str(exc) or "shape" in str(exc) or "dimension" in str(exc):
        return ShapeError(f"{where}: {exc}")
    if isinstance(exc, TypeError):
        return DTypeError(f"{where}: {exc}")
    return type(exc)(f"{where}: {exc}")


# -- in-place updates, and the guard that keeps the tape's values true ---------------------------
#
# ``x -= y`` on a tensor writes into x's array, as in NumPy and PyTorch, so that the
# plain training loop
#
#     with mg.no_grad():
#         for p in params:
#             p -= lr * p.grad
#
# updates the parameters themselves, without a new array per step. Two rules keep the
# tape true:
#
# * The tape records values, not writes. While recording, ``x -= y`` where x or y
#   requires a gradient computes ``x - y`` as a new tensor, recorded, and rebinds the
#   name x to it, as Python does for values that cannot change (and as graph nodes and
#   dual numbers do): every mode gives the same result. Except for a leaf that requires
#   a gradient (a parameter): rebinding would silently leave the parameter as it was,
#   so that raises, as in PyTorch. (``mg.grad`` hands ``f`` its arguments through
#   ``identity``, so ``x += 1`` inside ``f`` is the recorded case.)
# * A write must not change a value that a tape entry recorded. Each write is stamped
#   with the next sequence number, on the array that owns the memory (a view's base), so
#   a write through a view counts for every tensor that shares the memory. Sequence
#   numbers are the tape's order, so an entry reads a changed value exactly when one of
#   its arrays carries a later stamp; the sweep then refuses to run instead of computing
#   a wrong gradient (PyTorch's version counters, as one number per array). Arrays
#   without ``.base`` (array-api-strict) are stamped as themselves, so a write through
#   one of their views goes unseen.

_written: dict[int, tuple[Any, int]] = {}  # id(array) -> (weak reference, stamp of last write)
_last_write = -1  # the latest stamp: a sweep of entries all made after it checks nothing


def update_in_place(x: Tensor, prim: Primitive, write: Callable[[Any, Any], Any],
                    other: Any) -> Tensor:
    """``x op= other`` (``write`` is ``operator.isub`` & co.): see the rules above."""
    if _mode.enabled and (x.requires_grad or getattr(other, "requires_grad", False)):
        if x.requires_grad and x._entry is None:
            raise GradientError(
                f"{prim.name} in place ({_describe((x, other))}): the tensor is a leaf that "
                f"requires a gradient, and gradients are being recorded, so the update would "
                f"make a new tensor and leave this one as it was. Update parameters inside "
                f"`with mg.no_grad():`, as an optimizer step does, or write x = x - y")
        return apply(prim, (x, other), {})  # recorded: x op other, a new tensor
    if type(other) is Tensor:
        if other.device is not x.device:
            raise _device_error(prim, (x, other))
        value = other.data
    elif type(other) in _NUMBERS:
        value = other
    else:
        other = tensor(other, device=x.device)
        value = other.data
    if not (type(other) is Tensor and other.data.shape == x.data.shape
            and other.data.dtype == x.data.dtype):
        _check_in_place(prim, x, other)  # (the common case, p -= lr * g, needs no rule)
    try:
        if x.device.context is not None:
            with x.device.context:
                x.data = write(x.data, value)
        else:
            x.data = write(x.data, value)
    except Exception as exc:
        raise _kernel_error(prim, (x, other), {}, exc) from exc
    _stamp(x.data)
    return x


def _check_in_place(prim: Primitive, x: Tensor, other: Any) -> None:
    """The primitive's shape rule: the result must keep ``x``'s shape and dtype."""
    shape, dtype = prim.shape(x, other)
    where = f"{prim.name} in place ({_describe((x, other))})"
    if tuple(shape) != x.shape:
        raise ShapeError(f"{where}: the result has shape {tuple(shape)}; an in-place update "
                         f"keeps the tensor's shape {x.shape}")
    if dtype != x.dtype:
        raise DTypeError(f"{where}: the result has dtype {dtype}; an in-place update keeps "
                         f"the tensor's dtype {x.dtype}")


def _owner(array: Any) -> Any:
    """The array that owns ``array``'s memory (NumPy and CuPy keep it as ``.base``)."""
    base = getattr(array, "base", None)
    return array if base is None else base


def _stamp(array: Any) -> None:
    global _last_write
    owner = _owner(array)
    key = id(owner)
    if key in _written:
        ref = _written[key][0]
    else:  # forgotten when the array is freed, before its id can be reused
        try:
            ref = weakref.ref(owner, lambda _, key=key: _written.pop(key, None))
        except TypeError:  # memory owned by an object without weak references (bytes):
            ref = owner    # kept alive, so that its id is never another array's
    _last_write = next(_sequence)
    _written[key] = (ref, _last_write)


def _check_writes(recorded: list[Tensor]) -> None:
    """Refuse a sweep over an entry whose result or arguments were written after it."""
    for t in recorded:
        prim, _, seq, *args = t._entry
        if seq > _last_write:
            continue
        for a in (t, *args):
            stamp = _written.get(id(_owner(a.data))) if type(a) is Tensor else None
            if stamp is not None and stamp[1] > seq:
                what = f"its result ({_describe((a,))})" if a is t else \
                    f"an argument ({_describe((a,))})"
                raise GradientError(
                    f"backward: {prim.name} recorded {what}, and that tensor was changed "
                    f"in place afterwards (x -= ..., x += ...): the value it recorded, "
                    f"which its derivative may need, is gone. Update tensors in place after "
                    f"backward(), or write x = x - y to keep the old value")


# -- the reverse sweep ----------------------------------------------------------------------------

def _entries(outputs: Iterable[Tensor], stop: set[int]) -> tuple[list[Tensor], list[Tensor]]:
    """The recorded tensors behind ``outputs``, latest first, and the leaves reached.

    A tensor in ``stop`` is treated as a leaf even if it was computed: ``grad`` asks for
    the derivative with respect to it, not beyond it.
    """
    seen: set[int] = set()
    recorded, leaves = [], []
    stack = [t for t in outputs if t.requires_grad]
    while stack:
        t = stack.pop()
        k = id(t)
        if k in seen:
            continue
        seen.add(k)
        if t._entry is None or k in stop:
            leaves.append(t)
            continue
        recorded.append(t)
        for a in t._entry[3:]:
            if type(a) is Tensor and a.requires_grad:
                stack.append(a)
    recorded.sort(key=_sequence_number, reverse=True)  # the tape, read backwards
    return recorded, leaves


def _sequence_number(t: Tensor) -> int:
    return t._entry[2]


def sweep(outputs: list[Tensor], seeds: list[Tensor], stop: set[int] = frozenset(),
          create_graph: bool = False) -> list[tuple[Tensor, Tensor]]:
    """Propagate adjoints from ``outputs`` back to the leaves: ``[(leaf, adjoint)]``."""
    recorded, leaves = _entries(outputs, stop)
    if recorded and _last_write > recorded[-1]._entry[2]:  # a write since the oldest entry
        _check_writes(recorded)
    adjoint: dict[int, Any] = {}
    for out, seed in zip(outputs, seeds):
        adjoint[id(out)] = seed if id(out) not in adjoint else adjoint[id(out)] + seed
    with _SetGradMode(create_graph):
        for t in recorded:
            g = adjoint.pop(id(t), None)  # freed once used: the adjoint is no longer needed
            if g is None:
                continue
            prim, params, _, *args = t._entry
            for i, a in enumerate(args):
                if type(a) is not Tensor or not a.requires_grad or prim.vjp[i] is None:
                    continue
                if params:
                    share = prim.vjp[i](g, t, *args, **params)
                else:  # (no empty **params: the call is the sweep's most frequent step)
                    share = prim.vjp[i](g, t, *args)
                k = id(a)
                adjoint[k] = adjoint[k] + share if k in adjoint else share
    return [(leaf, adjoint[id(leaf)]) for leaf in leaves if id(leaf) in adjoint]


def _seed(out: Tensor, grad: Any, who: str) -> Tensor:
    """The adjoint the sweep starts from: 1 for a scalar, else the caller's ``grad``."""
    if grad is None:
        if out.size != 1:
            raise GradientError(
                f"{who}: the output has shape {out.shape}; a gradient is defined for a "
                f"scalar output only. Reduce it first (e.g. out.sum()) or pass the "
                f"output's gradient explicitly: {who.split('(')[0]}(grad=...)")
        return Tensor(out.device.full(out.shape, 1, out.data.dtype), out.device)
    g = grad if isinstance(grad, Tensor) else tensor(grad, dtype=out.dtype, device=out.device)
    if g.shape != out.shape:
        raise ShapeError(f"{who}: the gradient has shape {g.shape}, the output {out.shape}")
    if g.device is not out.device:
        raise DeviceError(f"{who}: the gradient lives on {g.device.name}, the output on "
                          f"{out.device.name}")
    return g


def backward(out: Tensor, grad: Any = None, create_graph: bool = False) -> None:
    """``out.backward()``: add d(out)/d(leaf) to ``leaf.grad`` for every leaf behind it."""
    if not out.requires_grad:
        raise GradientError(
            "backward(): this tensor does not require a gradient: no input of its "
            "computation had requires_grad=True (or it was computed under mg.no_grad())")
    seed = _seed(out, grad, "backward()")
    for leaf, g in sweep([out], [seed], create_graph=create_graph):
        leaf.grad = g if leaf.grad is None else leaf.grad + g


# -- the functional interface: vjp, grad, jacrev ----------------------------------------------

def track(x: Any, who: str) -> tuple[Tensor, bool]:
    """``x`` as a tensor to differentiate with respect to, and whether we are nested.

    The function sees its argument through ``identity``: a new name, recorded. A tensor
    that is already being recorded (we are inside another ``grad``) gets one so that the
    inner derivative is taken with respect to that new variable only, while the outer
    sweep still sees the path through it; without it, nested derivatives of the same
    tensor would be confused with each other. Any other argument becomes a fresh leaf,
    and gets one so that ``f`` may write ``x += 1`` as in every other mode: an update of
    a recorded value is recorded, of a leaf refused (see :func:`update_in_place`).
    """
    nested = isinstance(x, Tensor) and x.requires_grad and _mode.enabled
    if nested:
        t = x
    else:
        t = x.detach() if isinstance(x, Tensor) else tensor(x)
        if t.dtype not in FLOAT_DTYPES:
            raise DTypeError(f"{who}: cannot differentiate with respect to an argument of "
                             f"dtype {t.dtype}; pass floats (e.g. 2.0 rather than 2)")
        t.requires_grad = True
    with enable_grad():
        return C.identity(t), nested


def vjp(f: Callable[..., Any], *primals: Any) -> tuple[Any, Callable[..., tuple]]:
    """``out, vjp_fn = mg.vjp(f, x, y)``; ``vjp_fn(g)`` gives (g·∂out/∂x, g·∂out/∂y)."""
    if not primals:
        raise TypeError("vjp: give at least one primal to differentiate with respect to")
    from .forward import Dual

    if any(type(p) is Dual for p in primals):
        return _vjp_of_duals(f, primals)
    inputs, nested = zip(*(track(p, "vjp") for p in primals))
    with enable_grad():
        out = _result(f(*inputs), "vjp")
    create_graph = any(nested)
    stop = {id(x) for x in inputs}

    def vjp_fn(g: Any = None) -> tuple:
        seed = _seed(out, g, "vjp_fn(g)")
        adj = {id(x): a for x, a in sweep([out], [seed], stop, create_graph and _mode.enabled)}
        return tuple(adj[id(x)] if id(x) in adj else _zeros_like(x) for x in inputs)

    return (out if create_graph else out.detach()), vjp_fn


def _result(out: Any, who: str) -> Tensor:
    if isinstance(out, Tensor):
        return out
    if isinstance(out, (int, float)):  # f ignored its inputs: a constant
        return tensor(float(out))
    raise TypeError(f"{who}: f must return a Tensor, got {type(out).__name__}")


def _vjp_of_duals(f: Callable[..., Any], primals: tuple) -> tuple[Any, Callable[..., tuple]]:
    """Reverse mode over forward mode inputs (``mg.grad`` inside ``mg.jvp``).

    With inputs ``p + t eps`` the function returns ``out_p + out_t eps``. The derivative
    along ``t`` of the VJP ``g . d out_p / dp`` is ``d (g . out_t) / dp`` (the Hessian
    is symmetric), so a second sweep, from ``out_t``, gives the tangent of the gradient.
    """
    from .forward import Dual

    level = max(p.level for p in primals if type(p) is Dual)
    pairs = [(p.primal, p.tangent) if type(p) is Dual and p.level == level else (p, None)
             for p in primals]
    if any(type(pp) is Dual for pp, _ in pairs):
        raise NotImplementedError("vjp: reverse mode over two nested levels of forward mode "
                                  "is not supported; nest grad inside jvp only once")
    tracked, nested = zip(*(track(pp, "vjp") for pp, _ in pairs))
    create_graph = any(nested)
    inputs = [x if t is None else Dual(x, t, level) for x, (_, t) in zip(tracked, pairs)]
    with enable_grad():
        out = f(*inputs)
    out_p, out_t = (out.primal, out.tangent) if type(out) is Dual else (_result(out, "vjp"), None)
    stop = {id(x) for x in tracked}

    def vjp_fn(g: Any = None) -> tuple:
        seed = _seed(out_p, g, "vjp_fn(g)")
        record = create_graph and _mode.enabled
        gp = {id(x): a for x, a in sweep([out_p], [seed], stop, record)}
        gt = ({id(x): a for x, a in sweep([out_t], [seed], stop, record)}
              if out_t is not None else {})
        return tuple(Dual(gp[id(x)] if id(x) in gp else _zeros_like(x),
                          gt[id(x)] if id(x) in gt else _zeros_like(x), level)
                     for x in tracked)

    return out, vjp_fn


def _zeros_like(x: Tensor) -> Tensor:
    return zeros(x.shape, x.dtype, x.device)


def value_and_grad(f: Callable[..., Any], argnums: "int | tuple[int, ...]" = 0) -> Callable:
    """Tape mode behind ``mg.value_and_grad(f, mode="tape")``."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    def wrapped(*args: Any) -> tuple:
        out, vjp_fn = vjp(lambda *xs: f(*_put(args, nums, xs)), *(args[i] for i in nums))
        if out.size != 1:
            raise GradientError(f"grad: f must return a scalar, it returned shape {out.shape}; "
                                f"use mg.jacrev for a vector output")
        grads = vjp_fn()
        return out, grads[0] if isinstance(argnums, int) else grads

    return wrapped


def _put(args: tuple, nums: tuple[int, ...], values: tuple) -> list:
    args = list(args)
    for i, v in zip(nums, values):
        args[i] = v
    return args


def jacrev(f: Callable[..., Any], argnums: "int | tuple[int, ...]" = 0) -> Callable:
    """The Jacobian by reverse mode: one sweep per *output* element (cost O(m))."""
    from .forward import assemble_jacobian, basis

    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    def jac(*args: Any) -> Any:
        out, vjp_fn = vjp(lambda *xs: f(*_put(args, nums, xs)), *(args[i] for i in nums))
        rows = [vjp_fn(basis(out, k)) for k in range(out.size)]
        jacs = tuple(assemble_jacobian([r[j] for r in rows], out.shape, rows_are="outputs",
                                       in_shape=_shape(args[i]))
                     for j, i in enumerate(nums))
        return jacs[0] if isinstance(argnums, int) else jacs

    return jac


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(getattr(x, "shape", ()))
