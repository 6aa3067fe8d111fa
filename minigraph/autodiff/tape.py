"""Reverse mode with a tape: define-by-run (the textbook's (e.*)-(g.*)).

Two halves, and a guard between them:

**Recording.** :func:`apply` is the eager interpreter behind every operation on tensors.
It runs the kernel at once and, when an argument requires a gradient, writes the tape
entry ``(primitive, parameters, sequence number, *arguments)`` on the result: one tuple,
so that a recorded op leaves two objects (the tensor and its entry) for Python's garbage
collector to walk, whose full passes over a long tape would otherwise cost more per op
the longer the tape (an op without parameters shares one empty dict, ``NO_PARAMS``, for
the same reason). The sequence numbers count up, so they *are* the tape's order: the
forward evaluation order (a.1)-(a.5).

**The reverse sweep.** :func:`sweep` hands the entries that lead to the output, in
sequence order, to the one reverse sweep of the library (``backward.reverse_sweep``),
which walks them backwards and gives each entry's adjoint to its primitive's VJP rules;
they add their shares into the adjoints of the arguments, exactly (f.1)-(f.5)::

    gz = 1;  ga += gz;  gb += gz;  gy += ga * x;  gx += ga * y;  gx += gb * cos(x)

Finding the entries is an explicit-stack traversal and sorting by sequence number, so
a chain of 100,000 operations needs no recursion. An adjoint is dropped as soon as its
entry is processed, so memory falls as the sweep goes. The VJP rules are ordinary
minigraph code: run while recording (``create_graph=True``), the sweep writes its own
tape, and a second sweep over it gives second derivatives. Without ``retain_graph`` the
entries are released after the sweep, as in PyTorch, so a second ``backward()`` raises.

**Reverse mode as a transformation** (``mg.vjp``, ``mg.grad``, the last section, and
``mg.jacrev`` built on them in ``api.py``) records the same entries on boxes of a level
of its own instead of on tensors, so that it runs on any value kind and nests in every
other transformation.

**In-place updates** (``x -= y``, :func:`update_in_place`) write into a tensor's array
outside recording; each write is stamped with a sequence number, and the sweep refuses
an entry that reads an array written after the entry was made.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import threading
import weakref
from typing import AbstractSet, Any, Callable, Iterable, NoReturn, Sequence

import numpy as np

from ..device import get_device
from ..errors import (DeviceError, DTypeError, GradientError, MinigraphError, ShapeError,
                      mixed_devices)
from ..ops import copy as C
from ..ops.operators import (ArrayOps, check_in_place, passed_as_is,
                             rebinding, refuse_aliased, refuse_captured, refuse_untracked,
                             updated, user_frame)
from ..ops.primitive import KINDS, Primitive, bind, register_eager, register_kind
from ..ops.shape import host_index, set_items
from ..ops.shape_rules import FLOATS, promote, shape_of
from ..ops.weak import Weak
from .argnums import (Argnums, normalize_argnums, not_data, refuse_integers, refuse_keywords,
                      refuse_non_functions, refuse_pytrees, single)
from .backward import Entry, collector_paused, reverse_sweep
from .levels import ValueInside, escaped, new_level, running, transformation
from .reads import ReadOnlyWrite, read_only, refusal_of_a_write, refused_read_only
from ..tensor import Tensor, _check_nested, owner, shared, tensor, write_target, zeros

_NUMBERS = (float, int, bool)


# -- gradient mode -------------------------------------------------------------------------

class _GradMode(threading.local):
    """This thread's recording flag, and the flags that the blocks open in this thread
    found when they were entered (a stack: blocks nest, so the last one entered is the
    first one left, whichever object each block is)."""

    enabled = True

    def __init__(self) -> None:  # (run once per thread, on its first use)
        self.saved: list[bool] = []


_mode = _GradMode()

# The blocks that switch recording off and are open, in all threads together: one item
# each. While there is none, recording is on in every thread, and the eager interpreter
# does not read the thread-local flag: ``not _blocks_off or _mode.enabled``. (Reading a
# threading.local costs about a tenth of what NumPy's own call on a small array does, on
# every op.) A list rather than a count: ``append`` and ``pop`` are single steps that no
# other thread can interleave, where ``count += 1`` would need a lock, taken and given
# back twice by every backward(), which switches recording off for its sweep.
_blocks_off: list[None] = []


class _SetGradMode:
    """Context manager (and decorator) that switches recording on or off.

    What it restores on exit is kept in the thread's own stack (``_GradMode.saved``),
    not on the object: one ``no_grad()`` object may be entered twice, nested or from two
    threads at once, and each exit still restores what its own entry found."""

    __slots__ = ("enabled",)

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self) -> None:
        _mode.saved.append(_mode.enabled)
        if not self.enabled:
            _blocks_off.append(None)  # (counted before the flag is off, uncounted after)
        _mode.enabled = self.enabled

    def __exit__(self, *exc: object) -> None:
        _mode.enabled = _mode.saved.pop()
        if not self.enabled:
            _blocks_off.pop()

    def __call__(self, fn: Callable) -> Callable:
        if inspect.isgeneratorfunction(fn):  # (the call only makes the generator: the
            # block would be over before its body ran, which would be recorded after all)
            raise TypeError(f"{'enable_grad' if self.enabled else 'no_grad'}() as a "
                            f"decorator of the generator function {fn.__name__}: the block "
                            f"would end before its body runs; write the with block inside it")

        @functools.wraps(fn)
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
    return not _blocks_off or _mode.enabled


def grad_mode_depth() -> int:
    """How many ``no_grad``/``enable_grad`` blocks are open in this thread. A
    transformation notes it when it starts: the blocks open then do not stop its own level
    (torch.func's rule: ``mg.grad`` under ``mg.no_grad()`` still differentiates), the
    blocks opened inside f do; and every level outside it keeps its own blocks. So in
    ``with mg.no_grad(): g = mg.grad(h)(x)``, inside an f being differentiated, h is
    recorded for g and not for f's derivative (first-order MAML). A level records when
    ``_mode.enabled or len(_mode.saved) <= depth``: the innermost block opened since it
    started, if any, decides (:func:`records_since`)."""
    return len(_mode.saved)


def records_since(depth: int) -> bool:
    """Whether a level that started with ``depth`` blocks open records now (see
    :func:`grad_mode_depth`). (``Box._bind`` writes the same test inline: it runs per op.)"""
    return _mode.enabled or len(_mode.saved) <= depth


# -- recording: the eager interpreter ----------------------------------------------------------

_sequence = itertools.count()

# The parameters of an entry without any (``x * y``, ``mg.sin(x)``): one dict for all of
# them, never written. A fresh ``{}`` per entry would be a third object per recorded op
# (after the tensor and its entry), and Python's collector counts every one: on a long
# tape it then walks the survivors more often (see the module's docstring).
NO_PARAMS: dict[str, Any] = {}


def apply(prim: Primitive, args: tuple, params: dict) -> Tensor:
    """Run ``prim`` on tensors now; record it on the tape if a gradient may be needed.

    This is the hot path of define-by-run: every ``x * y`` comes here. Most calls are
    one tensor, or two without parameters, on one CPU device (``x * y``, ``mg.sin(x)``,
    ``x.sum(0)``); :func:`apply_one` and :func:`apply_two` take them on short paths
    (``primitive.bind_one`` and ``bind_two`` call them directly), which do what
    :func:`_apply_general` does in fewer steps (a third of the Python time per op on
    small tensors).
    """
    if len(args) == 1:
        return apply_one(prim, args[0], params)
    if len(args) == 2 and not params:
        return apply_two(prim, args[0], args[1])
    return _apply_general(prim, args, params)


def apply_one(prim: Primitive, x: Any, params: dict) -> Tensor:
    """:func:`apply` for one argument: ``mg.sin(x)``, ``x.sum(axis=0)``, ``x.reshape(...)``."""
    if type(x) is Tensor and x.device.context is None and prim is not _TO_DEVICE:
        device = x.device
        if prim.view and isinstance(x.data, np.generic):  # (see _apply_general)
            x._own_array()
        try:
            if not params:
                data = prim.impl(device.xp, x.data)
            elif prim.impl_with is not None:  # (the dict as it is: see Primitive.impl_with)
                data = prim.impl_with(device.xp, x.data, params)
            else:
                data = prim.impl(device.xp, x.data, **params)
        except MinigraphError:
            raise
        except Exception as exc:
            _raise_kernel_error(prim, (x,), params, exc)
        # (the flag's slot, read as the tensor's own interpreter: the public property
        # checks writes, and a call to read it would cost every eager op)
        if x._requires_grad and prim.differentiable and (not _blocks_off or _mode.enabled):
            return Tensor(data, device, True, (prim, params or NO_PARAMS, next(_sequence), x))
        return Tensor(data, device)
    return _apply_general(prim, (x,), params)


def apply_two(prim: Primitive, x: Any, y: Any) -> Tensor:
    """:func:`apply` for two arguments without parameters: ``x * y``, ``x @ w``, and a
    tensor with a Python number, ``lr * g`` (the number stays "weak", as in NumPy)."""
    tx, ty = type(x), type(y)
    if tx is Tensor and (ty is Tensor and x.device is y.device or ty in _NUMBERS):
        device = x.device
    elif ty is Tensor and tx in _NUMBERS:
        device = y.device
    else:
        return _apply_general(prim, (x, y), {})
    if device.context is not None:  # a GPU: _apply_general enters its context
        return _apply_general(prim, (x, y), {})
    try:
        data = prim.impl(device.xp, x.data if tx is Tensor else x, y.data if ty is Tensor else y)
    except MinigraphError:
        raise
    except Exception as exc:
        _raise_kernel_error(prim, (x, y), {}, exc)
    if ((tx is Tensor and x._requires_grad) or (ty is Tensor and y._requires_grad)) \
            and prim.differentiable and (not _blocks_off or _mode.enabled):
        return Tensor(data, device, True, (prim, NO_PARAMS, next(_sequence), x, y))
    return Tensor(data, device)


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
            if prim.view and isinstance(a.data, np.generic):  # a kernel's 0-d result, a
                # NumPy scalar, has no memory for a view (c.reshape(1), c[None]) to share:
                # it becomes c's own 0-d array first, so that a write into one shows in
                # the other, as for any array (Tensor._own_array)
                a._own_array()
            arrays.append(a.data)
            if a._requires_grad:
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
        _raise_kernel_error(prim, args, params, exc)
    if prim is _TO_DEVICE:  # the one primitive whose result lives on another device
        device = params["device"]
    if track and prim.differentiable and (not _blocks_off or _mode.enabled):
        return Tensor(data, device, True, (prim, params or NO_PARAMS, next(_sequence), *args))
    return Tensor(data, device)


_TO_DEVICE = C.TO_DEVICE


def _apply_converting(prim: Primitive, args: tuple, params: dict) -> Tensor:
    """``apply`` for arguments that are not all tensors and numbers: lists and arrays
    become tensors on the device of the tensor arguments, or with no tensor argument at
    all (``mg.add(array, 2)``, ``mg.sin(2.0)``), on the default device."""
    if not args:  # (apply would come back here for ever)
        raise TypeError(f"{prim.name}: needs at least one argument")
    tensors = [a for a in args if isinstance(a, Tensor)]
    device = tensors[0].device if tensors else get_device(None)
    # Exact Python numbers stay weak beside any other argument, which becomes a strong
    # tensor (NumPy's rule, NEP 50: 2 + a float32 array is float32, as shape_rules.promote
    # gives it); only where all are numbers (mg.sin(2.0)) do they become tensors. NumPy
    # scalars (np.float64 is a float subclass) have a dtype of their own, as in NumPy.
    weak = any(type(a) not in _NUMBERS for a in args)
    converted = []
    for k, a in enumerate(args):
        if type(a) is Tensor or (weak and type(a) in _NUMBERS):
            converted.append(a)
            continue
        try:
            converted.append(tensor(a, device=device))
        except (TypeError, ValueError) as exc:  # (None, a str, a ragged list: say which op)
            raise type(exc)(f"{prim.name}: argument {k} ({type(a).__name__}) is not a "
                            f"tensor, an array or a number: {exc}") from None
    return apply(prim, tuple(converted), params)


register_eager(apply, apply_one, apply_two)


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
    return mixed_devices(prim.name, names, _describe(args))


def _raise_kernel_error(prim: Primitive, args: tuple, params: dict,
                        exc: Exception) -> NoReturn:
    """Raise what :func:`_kernel_error` makes of ``exc``, from it; ``exc`` itself as it
    came where that is it (it was raised as its own cause)."""
    error = _kernel_error(prim, args, params, exc)
    if error is exc:
        raise exc
    raise error from exc


def _kernel_error(prim: Primitive, args: tuple, params: dict, exc: Exception) -> Exception:
    """The error to raise for ``exc``, which the kernel of ``prim`` raised on ``args``:
    one that names the op and the shapes, of the shape rule's type where it finds the
    fault. An op that runs the user's code (checkpoint's f) passes on what it raised as
    it is: f's own error, or one its ops already told, and its shape rule would run f
    again."""
    if prim.runs_user_code:
        return exc
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items() if k not in ("device", "source"))
    where = f"{prim.name}({_describe(args)}{', ' + shown if shown else ''})"
    try:  # the shape rule explains a mismatch better than the kernel's message
        prim.shape(*args, **params)
    except MinigraphError as rule_error:
        return type(rule_error)(f"{rule_error} [in {where}]")
    except Exception:
        pass
    if exc.__cause__ is None:  # a raw kernel error (NumPy's): its words tell what failed.
        # (One made from another, by this function inside a checkpointed f, already names
        # its op and the shapes, so it mentions "shape" whatever failed: it keeps its type.)
        if isinstance(exc, IndexError):
            return IndexError(f"{where}: {exc}")
        if "broadcast" in str(exc) or "shape" in str(exc) or "dimension" in str(exc):
            return ShapeError(f"{where}: {exc}")
        if isinstance(exc, TypeError):
            return DTypeError(f"{where}: {exc}")
    try:
        return type(exc)(f"{where}: {exc}")
    except Exception:  # (an exception whose __init__ takes other arguments, the user's
        return exc     # own raised in f: passed on as it is, with its attributes)


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
#   dual numbers do): every mode gives the same result. Only another holder of the same
#   tensor (``z = x`` before ``x -= y``, a list with x in it), or a view of it, would tell
#   the difference: it would keep the old value, where an unrecorded write shows through
#   it, so an update that such a holder in the updating function sees is refused
#   (``ops/operators.refuse_aliased``; PyTorch tracks versions of one tensor instead).
#   Except for a leaf that requires a gradient (a
#   parameter): rebinding would silently leave the parameter as it was, so that raises,
#   as in PyTorch. So does an update of a *view* (``v = h[:2]; v += 1``, a reshape, a
#   transpose): unrecorded, the write shows through in h; rebinding v would leave h as
#   it was, another value for the same line (PyTorch rewrites its graph for views; we
#   refuse). Item assignment, ``x[i] = y``, can only write, so it refuses while being
#   recorded. (Inside ``mg.grad``, ``f`` sees boxes, which cannot be written into:
#   ``x += 1`` rebinds x to ``x + 1``, recorded, under the same refusal of aliases.)
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
    if type(other) in KINDS and type(other) is not Tensor:  # a transformation's value: it
        # cannot be written into x's array (as recorded): x's name is bound to x op other
        refuse_captured(f"{prim.name} in place ({_describe((x, other))})", x, other)
        return updated(prim, x, other)
    if _mode.enabled and (x.requires_grad or getattr(other, "requires_grad", False)):
        if x.requires_grad and x._entry is None:
            raise GradientError(
                f"{prim.name} in place ({_describe((x, other))}): the tensor is a leaf that "
                f"requires a gradient, and gradients are being recorded, so the update would "
                f"make a new tensor and leave this one as it was. Update parameters inside "
                f"`with mg.no_grad():`, as an optimizer step does, or write {rebinding()}")
        if _a_view(x):
            view = "a view" if x._entry is None else f"a view (made by {x._entry[0].name})"
            raise GradientError(
                f"{prim.name} in place ({_describe((x, other))}): the tensor is {view} "
                f"of another tensor's memory, and gradients are being recorded, so "
                f"the update would make a new tensor and leave the one it views as it was (without "
                f"recording, the write shows through, as in NumPy). Write {rebinding()}, or "
                f"build the whole new value (mg.where, mg.concatenate)")
        if not (isinstance(other, Tensor) or type(other) in _NUMBERS or type(other) in KINDS):
            other = tensor(other, device=x.device)  # (an np.float64 is typed: as below)
        _check_in_place(prim, x, other)  # (as an update without recording refuses)
        where = f"{prim.name} in place ({_describe((x, other))})"
        if x.requires_grad and not prim.differentiable:  # (x's history would be lost)
            refuse_untracked(prim, where)
        refuse_aliased(x, where)
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
            and other.data.dtype == x.data.dtype and x.dtype[0] == "f"):
        # (the common case, p -= lr * g, needs no rule: floats of one dtype keep it; ints
        # do not always: x /= y is a float)
        _check_in_place(prim, x, other)
    try:
        # (NumPy's flag refuses a write into a NumPy array that a guard made read-only;
        # another array, or a NumPy scalar, which the write replaces, asks the guard)
        if type(x.data) is not np.ndarray and read_only(x):
            raise refusal_of_a_write()
        if x.device.context is not None:
            with x.device.context:
                _write_into(x, prim, write, value)
        else:
            _write_into(x, prim, write, value)
    except Exception as exc:
        if refused_read_only(exc):  # (an array reads.py made read-only while f runs)
            raise ReadOnlyWrite(_kernel_error(prim, (x, other), {}, exc),
                                array=x.data) from exc
        _raise_kernel_error(prim, (x, other), {}, exc)
    _stamp(x)
    return x


def _write_into(x: Tensor, prim: Primitive, write: Callable[[Any, Any], Any],
                value: Any) -> None:
    """``x``'s array ``op=`` value. An integer (or bool) array gets the op's kernel's
    result, then copied in: NumPy's integer loops can stop part way with an error (an
    integer array ``**`` a negative integer), which left x half written, and answer 0 for
    ``x //= 0``, which the kernel refuses. A float loop never stops part way
    (floating-point errors are reported once it has finished), so it writes into x
    itself: an optimizer's update of a large parameter, ``p -= lr * g``, costs no copy.
    (A 0-d kernel result is a NumPy scalar, which no write changes: it is replaced, by
    the kernel's result where it is an integer, for the same checks.)"""
    if x.dtype[0] not in "iub":  # ("int64", "uint8", "bool")
        x.data = write(x.data, value)
    elif isinstance(x.data, np.generic):
        x.data = prim.impl(x.device.xp, x.data, value)
    else:
        x.data[...] = prim.impl(x.device.xp, x.data, value)


def _a_view(x: Tensor) -> bool:
    """Whether ``x``'s array is (a view of) another tensor's: made by a view primitive
    (reshape, transpose, basic indexing, identity ...), or, unrecorded, a view at all."""
    entry = x._entry
    if entry is None:
        return owner(x.data) is not x.data
    prim = entry[0]
    return getattr(prim, "view", False) and prim.made_a_view(x.shape, entry[1])


def assign_item(x: Tensor, index: Any, value: Any) -> None:
    """``x[index] = value``: NumPy's item assignment into x's array, stamped as a write
    (see the rules above); refused while recorded, where it could only write."""
    if type(value) in KINDS:
        raise TypeError(f"x[...] = value: the value belongs to a transformation or a graph "
                        f"({value._kind()}), and a write into a tensor would take it out of "
                        f"there: build the new value with mg.where or mg.concatenate instead")
    if _mode.enabled and (x.requires_grad or getattr(value, "requires_grad", False)):
        raise GradientError(
            f"x[...] = value ({_describe((x, value))}) while gradients are being recorded: "
            f"an item assignment writes into the tensor, and the tape records operations "
            f"that make new tensors. Build the new value (mg.where(mask, value, x), "
            f"mg.concatenate of the pieces), or assign inside `with mg.no_grad():`")
    if type(value) is Tensor:
        if value.device is not x.device:
            raise DeviceError(f"x[...] = value: x lives on {x.device.name}, the value on "
                              f"{value.device.name}; move it with .to('{x.device.name}')")
    elif isinstance(value, (list, tuple)):  # Python numbers, weak as one number is: x's
        # dtype where each of them fits it (a ragged list, refused first, is NumPy's error)
        _check_nested(value, "x[...] = value")
        numbers = np.asarray(value).ravel().tolist()
        odd = [n for n in numbers if type(n) not in _NUMBERS]
        if odd:  # (None, a str: NumPy made an array of objects, or of text)
            raise TypeError(f"x[...] = value: the value holds a {type(odd[0]).__name__} "
                            f"({odd[0]!r}); a list assigned into a tensor must hold numbers "
                            f"only (bool, int or float)")
        value = tensor(value, dtype=x.dtype if promote(x, *numbers) == x.dtype else None,
                       device=x.device)
    elif type(value) not in _NUMBERS:
        value = tensor(value, device=x.device)
    if promote(x, value) != x.dtype:  # (the rule of x -= y: NumPy would cast, 2.5 into 2)
        raise DTypeError(f"x[...] = value ({_describe((x, value))}): a value of dtype "
                         f"{promote(value)} would be cast to the tensor's {x.dtype}; an "
                         f"update in place keeps the tensor's dtype: convert the value first "
                         f"(mg.astype(value, '{x.dtype}'))")
    if type(value) is Tensor:
        value = value.data
    where = tuple(host_index(i, "x[...] = value")
                  for i in (index if isinstance(index, tuple) else (index,)))
    try:
        if type(x.data) is not np.ndarray and read_only(x):  # (see update_in_place)
            raise refusal_of_a_write()
        if isinstance(x.data, np.generic):  # a 0-d kernel result: a NumPy scalar, which
            x.data = np.array(x.data)       # cannot be written into
        if x.device.context is not None:
            with x.device.context:
                set_items(x.device, x.data, where, value)
        else:
            set_items(x.device, x.data, where, value)
    except Exception as exc:  # (NumPy checks everything before it writes anything)
        error = ShapeError if "broadcast" in str(exc) else type(exc)
        made = error(f"x[...] = value ({_describe((x,))}, index {index!r}): {exc}")
        if refused_read_only(exc):  # (see update_in_place)
            raise ReadOnlyWrite(made, array=x.data) from exc
        raise made from exc
    _stamp(x)


def _check_in_place(prim: Primitive, x: Tensor, other: Any) -> None:
    """The primitive's shape rule: the result must keep ``x``'s shape and dtype."""
    check_in_place(prim, x, other, f"{prim.name} in place ({_describe((x, other))})")


def _stamp(x: Tensor) -> None:
    """Count a write into ``x`` (into its ``write_target``)."""
    global _last_write
    target = write_target(x)
    key = id(target)
    if key in _written:
        ref = _written[key][0]
    else:  # forgotten when the array is freed, before its id can be reused
        try:
            # (mypy cannot infer a lambda with a default argument; weakref calls it with
            # the reference alone)
            ref = weakref.ref(target, lambda _, key=key: _written.pop(key, None))  # type: ignore[misc]
        except TypeError:  # memory owned by an object without weak references (bytes):
            ref = target   # kept alive, so that its id is never another array's
    _last_write = next(_sequence)
    _written[key] = (ref, _last_write)
    if _recording:  # (a vjp running f: which of its entries came before the write, where)
        frame = user_frame()
        line = None if frame is None else (frame.f_code.co_filename, frame.f_lineno)
        for rec in _recording:
            rec.writes.append((len(rec.entries), key, line))


def write_stamp(x: Tensor) -> int:
    """The stamp of the last in-place write into tensor ``x`` (-1: never written)."""
    entry = _written.get(id(write_target(x)))
    return -1 if entry is None else entry[1]


def last_write() -> int:
    """The stamp of the latest in-place write into any tensor."""
    return _last_write


def refuse_changed(tensors: Sequence[Any], done: int, mode: str) -> None:
    """``vjp_fn(g)`` after a value that f read, or computed, was changed in place since
    ``mg.vjp`` ran f (stamp ``done``): the pullback would read the new value and give the
    derivative of another function. PyTorch's version counters refuse the same."""
    k = written_since(tensors, done)
    if k is not None:
        raise GradientError(
            f"vjp_fn(g): a tensor that f read or computed ({_as_written(tensors[k])}) "
            f"was changed in place (x += ..., x[i] = ...) after mg.vjp ran f; the pullback "
            f"({mode}) would read the new "
            f"value and give the derivative of another function. Update it after calling "
            f"vjp_fn, or call mg.vjp again after the update")


def written_since(tensors: Sequence[Any], since: int) -> int | None:
    """The position of the first of ``tensors`` written in place after the stamp ``since``
    (None where none was; an entry that is not a tensor never was): did f write into its
    arguments?"""
    if _last_write == since:  # (nothing anywhere was written: one comparison)
        return None
    return next((k for k, t in enumerate(tensors)
                 if type(t) is Tensor and write_stamp(t) > since), None)


def _check_writes(recorded: list[Tensor]) -> None:
    """Refuse a sweep over an entry whose result or arguments were written after it."""
    for t in recorded:
        assert t._entry is not None  # a recorded tensor has its entry
        prim, _, seq, *args = t._entry
        if seq > _last_write:
            continue
        for a in (t, *args):
            stamp = _written.get(id(write_target(a))) if type(a) is Tensor else None
            if stamp is not None and stamp[1] > seq:
                what = f"its result ({_describe((a,))})" if a is t else \
                    f"an argument ({_describe((a,))})"
                viewed = _viewed(a)
                happened = f"{prim.name} recorded {what}, and that tensor was changed in " \
                    f"place afterwards" if viewed is None else f"a tensor ({viewed}) was " \
                    f"changed in place after {prim.name} recorded {what}, a view of it"
                raise GradientError(
                    f"backward: {happened} (x -= ..., x[i] = ...): the value it recorded, "
                    f"which its derivative may need, is gone. Update tensors in place after "
                    f"backward(), or write x = x - y to keep the old value")


def _as_written(t: Tensor) -> str:
    """``t``'s shape (and dtype), or where t is a view, the shape of the tensor whose
    memory it views, which was written (see :func:`_viewed`), and then the view's."""
    viewed = _viewed(t)
    return f"shape {t.shape} {t.dtype}" if viewed is None else \
        f"{viewed}, read through a view of it of shape {t.shape}"


def _viewed(t: Tensor) -> str | None:
    """Where ``t`` is a view (``weight.T``), the tensor whose memory it views, which a
    write changed (``weight``), as an error names it: the tensor the user wrote, not the
    view a record read; None where t is no view."""
    target = write_target(t)
    if target is t or target is t.data:
        return None
    return (f"shape {tuple(target.shape)} {t.device.dtype_name(target.dtype)} on "
            f"{t.device.name}")


# -- the reverse sweep ----------------------------------------------------------------------------

def _entries(outputs: Iterable[Tensor], stop: AbstractSet[int], create_graph: bool = False
             ) -> tuple[list[Entry], list[Tensor]]:
    """The tape behind ``outputs`` as the sweep's entries, ``(primitive, params, tensor,
    arguments)`` in evaluation order, and the leaves reached.

    A tensor in ``stop`` is treated as a leaf even if it was computed: ``grad`` asks for
    the derivative with respect to it, not beyond it. ``create_graph``: the sweep records
    its own work (see :func:`_as_recorded`).
    """
    seen: set[int] = set()
    found: list[tuple[int, Tensor, tuple]] = []  # (sequence number, tensor, its entry)
    leaves = []
    stack = [t for t in outputs if t._requires_grad]
    while stack:
        t = stack.pop()
        k = id(t)
        if k in seen:
            continue
        seen.add(k)
        entry = t._entry
        if entry is None or k in stop:
            leaves.append(t)
            continue
        if entry[0] is RELEASED:
            raise GradientError(
                f"backward: the tape behind this tensor ({_describe((t,))}) was used by an "
                f"earlier backward() and released, as PyTorch does (its saved values are "
                f"gone). Pass retain_graph=True to the first backward() to go through it "
                f"again; the gradients then add up in .grad")
        if entry[2] < _last_switch:  # (rare: a leaf's flag switched since: see switched)
            recorded = _as_recorded(entry, create_graph)
            found.append((entry[2], t, recorded))
            stack += [a for a, now in zip(entry[3:], recorded[3:])  # (not what stands in
                      if a is now and type(a) is Tensor and a._requires_grad]  # for one)
            continue
        found.append((entry[2], t, entry))
        for a in entry[3:]:
            if type(a) is Tensor and a._requires_grad:
                stack.append(a)
    # The tape in evaluation order: by sequence number. (The numbers are unique, so the
    # triples never compare their tensors.)
    found.sort()
    return [(e[0], e[1], t, e[3:]) for _, t, e in found], leaves


# A leaf's requires_grad switched after it was used. PyTorch's rule: an argument counts
# for an entry only if it required a gradient both when the entry was recorded and now,
# at the sweep. (``x.requires_grad_()`` after ``y = (x * c).sum() + (x * x).sum()``, c
# tracked, gives x no gradient from y: the sweep used to follow x through ``x * c``,
# recorded because of c, and not through the unrecorded ``x * x``, a silent partial
# gradient.) The sweep reads the flag as it is now; a switched leaf keeps the sequence
# numbers of its last switches (``Tensor._switches``), by which an entry recorded before
# them reads the flag it saw. Recording pays nothing for it: an entry made after the
# latest switch of any leaf, the common case, is taken as it is.

_last_switch = -1  # (-1: no leaf's flag was ever switched)
_SWITCHES_KEPT = 64  # (a flag switched off and on around each of 32 steps between a
# record and its backward; PyTorch keeps none of this, its graph holds what it recorded)


def switched(history: tuple[int, ...]) -> tuple[int, ...]:
    """A leaf's ``_switches`` once its flag switches now, from the ones before (``(-1,)``
    where there were none): ``(horizon, *stamps)``, the sequence numbers of its last
    switches and of the last one forgotten (-1: none), so that a flag switched at every
    step of a loop (a GAN's frozen discriminator) keeps its last 64."""
    global _last_switch
    _last_switch = next(_sequence)
    horizon, *stamps = history
    stamps.append(_last_switch)
    if len(stamps) > _SWITCHES_KEPT:
        horizon = stamps.pop(0)
    return (horizon, *stamps)


def _as_recorded(entry: tuple, create_graph: bool = False) -> tuple:
    """``entry`` as it was recorded: each argument that requires a gradient now and did
    not then replaced by a tensor of the same values which this sweep neither follows nor
    gives an adjoint (:func:`_entries` does not follow it): one over the same data; with
    ``create_graph``, one computed from the argument (``a * 1.0``, exact), so that the
    gradient's own record reads the argument, as PyTorch's saved tensor is the argument
    itself: a second derivative through it (``x.grad`` of ``x * w * w``, recorded before
    ``w.requires_grad_()``, depends on w) is not lost."""
    seq = entry[2]
    return entry[:3] + tuple(
        _standing_in(a, create_graph) if type(a) is Tensor and a._requires_grad
        and not _tracked_at(a, seq) else a for a in entry[3:])


def _standing_in(a: Tensor, create_graph: bool) -> Tensor:
    """What stands in for ``a`` in an entry recorded before ``a`` required a gradient
    (:func:`_as_recorded`)."""
    if not create_graph:
        return shared(a.data, a.device)
    with _SetGradMode(True):
        return a * 1.0


def _tracked_at(a: Tensor, seq: int) -> bool:
    """Whether ``a``, which requires a gradient now, did when the entry ``seq`` was
    recorded: its flag has switched an even number of times since."""
    horizon, *stamps = getattr(a, "_switches", (-1,))  # (unset: never switched)
    if seq < horizon:
        raise GradientError(
            f"backward: the requires_grad flag of a tensor ({_describe((a,))}) was switched "
            f"more than {_SWITCHES_KEPT} times since an operation on it was recorded, and "
            f"whether that operation tracked it is no longer known. Call backward() before "
            f"switching the flag again, or compute the value again after the last switch")
    return sum(s > seq for s in stamps) % 2 == 0


class _Released:
    """What a released tape entry holds instead of its primitive (see ``sweep``)."""

    name = "released"


RELEASED = _Released()
# What a released tensor's ``_entry`` becomes: the same tuple for all of them, so that
# releasing a long tape allocates nothing.
RELEASED_ENTRY = (RELEASED, NO_PARAMS, -1)


def sweep(outputs: list[Tensor], seeds: list[Tensor], stop: AbstractSet[int] = frozenset(),
          create_graph: bool = False) -> tuple[list[tuple[Tensor, Tensor]], list[Entry]]:
    """Propagate adjoints from ``outputs`` back to the leaves: ``[(leaf, adjoint)]``, and
    the entries swept (for :func:`release`).

    The tape's entries, oldest first, go to the one reverse sweep
    (``backward.reverse_sweep``); the rules run on the tensors themselves, and record
    their own work when ``create_graph`` is on.
    """
    with collector_paused():  # (reading the tape allocates as much as sweeping it)
        entries, leaves = _entries(outputs, stop, create_graph)
        if entries and _last_write > entries[0][2]._entry[2]:  # a write since the oldest
            _check_writes([e[2] for e in entries])
        with _SetGradMode(create_graph):
            adjoint = reverse_sweep(entries, zip(outputs, seeds), _tracked)
        return [(leaf, adjoint[id(leaf)]) for leaf in leaves if id(leaf) in adjoint], entries


def release(entries: list[Entry]) -> None:
    """Drop the saved values of swept entries: a second sweep through them raises
    instead of silently adding the same gradient twice (PyTorch's ``retain_graph=False``)."""
    for e in entries:
        e[2]._entry = RELEASED_ENTRY


def _tracked(a: Any) -> bool:
    return type(a) is Tensor and a._requires_grad


def _seed(out: Tensor, grad: Any, who: str) -> Tensor:
    """The adjoint the sweep starts from: 1 for a scalar, else the caller's ``grad``."""
    if grad is None:
        if out.data.size != 1:
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
    if g.dtype != out.dtype:  # (a float32 seed of a float64 output: the sweep would run
        # in float32 from there, 1e40 overflowing; PyTorch's engine casts it too)
        g = C.astype(g, out.dtype)
    return g


# Held while backward() adds its gradients into the leaves' .grad: a read of .grad and
# the write of the sum, in two threads at once, would lose one thread's share (PyTorch's
# engine accumulates under a lock too).
_ACCUMULATING = threading.Lock()


def backward(out: Tensor, grad: Any = None, create_graph: bool = False,
             retain_graph: bool | None = None) -> None:
    """``out.backward()``: add d(out)/d(leaf) to ``leaf.grad`` for every leaf behind it.

    PyTorch's rules: the tape is released afterwards unless ``retain_graph=True``
    (``create_graph=True`` retains it too), so a second ``backward()`` through it raises;
    a gradient has its leaf's dtype, and is the leaf's own array (see :func:`_own`).
    """
    if not out.requires_grad:
        if out.dtype not in FLOATS:  # (a comparison, a cast to an integer: never recorded)
            raise GradientError(
                f"backward(): this tensor has dtype {out.dtype}; only floating values have "
                f"gradients (a comparison or a cast to an integer or bool stops them): "
                f"differentiate a floating value")
        raise GradientError(
            "backward(): this tensor does not require a gradient: no input of its "
            "computation had requires_grad=True (or it was computed under mg.no_grad())")
    seed = _seed(out, grad, "backward()")
    retain = create_graph if retain_graph is None else retain_graph
    # the memory handed out so far: the caller's seed, then the leaves' gradients
    handed = {id(owner(seed.data))} if seed is grad else set()
    adjoints, entries = sweep([out], [seed], create_graph=create_graph)
    # Every new .grad is computed before any is set, and the tape is released only then:
    # a failure (an accumulation that cannot add up) leaves the leaves and the tape as
    # they were, and backward() can be called again.
    owned = []
    for leaf, g in adjoints:
        g = _own(g, handed)
        if g.data.dtype != leaf.data.dtype:
            g = C.astype(g, leaf.dtype, copy=False)
        owned.append((leaf, g))
    with _ACCUMULATING:  # (two threads' backward() into one leaf: each sum sees the other)
        # PyTorch's AccumulateGrad: into the existing .grad's array, so that a tensor
        # held as p.grad (grads = [q.grad for q in params]) still is p.grad, and a later
        # change through it (clipping, scaling) reaches the optimizer. A new tensor where
        # that array cannot take the sum in place (see _accumulates_into).
        into = [(held, g) for leaf, g in owned
                if (held := leaf._grad) is not None and _accumulates_into(held, g)]
        new = [(leaf, g if leaf._grad is None else leaf._grad + g) for leaf, g in owned
               if leaf._grad is None or not _accumulates_into(leaf._grad, g)]
        for held, g in into:  # (float arrays of one shape and dtype: this cannot fail)
            held.data += g.data
            _stamp(held)  # (a write: a tape entry that read the gradient refuses to run)
        for leaf, g in new:
            leaf._grad = g  # (shape, dtype and device are the leaf's: the setter's checks hold)
    if not retain:
        release(entries)


def _accumulates_into(held: Tensor, g: Tensor) -> bool:
    """Whether backward() adds ``g`` into the array of ``held`` (a leaf's ``.grad``) in
    place: a writable NumPy array of g's shape and dtype, with neither on a tape
    (create_graph=True: the sum is recorded, a new tensor, as PyTorch's). A NumPy scalar
    (a 0-d result), a read-only or broadcast array, another library's array: a new one."""
    return type(held.data) is np.ndarray and \
        held.data.flags.writeable and held.data.shape == g.data.shape and \
        held.data.dtype == g.data.dtype and not (held.requires_grad or g.requires_grad)


def _own(g: Tensor, handed: set[int]) -> Tensor:
    """``g``, or a copy of it where its array is not its own: memory in ``handed`` (the
    caller's, or another gradient's: ``x + y`` gives both the same adjoint), or a view
    (a broadcast one cannot even be written). Adds its memory to ``handed``."""
    memory = owner(g.data)
    if id(memory) in handed or memory is not g.data:
        if g.requires_grad:  # (backward(create_graph=True)): a copy on the tape, so that
            with enable_grad():  # the gradient stays differentiable (PyTorch's clone)
                g = C.astype(g, g.dtype)
        else:
            g = Tensor(g.device.copy_from(g.data, g.device), g.device)  # (any library)
        memory = g.data
    handed.add(id(memory))
    return g


def own_results(values: Sequence[Any], handed: "set[int] | None" = None) -> list[Any]:
    """What a transformation hands its caller: each plain tensor its own array (see
    :func:`_own`), apart from the others and from the memory in ``handed``. A tensor on a
    tape, or a value of another transformation, belongs to an outer computation: it stays
    as it is (that one's own exit hands it over)."""
    handed = set() if handed is None else handed
    return [_own(t, handed) if type(t) is Tensor and not t.requires_grad else t
            for t in values]


def memory_of(values: Sequence[Any]) -> set[int]:
    """The memory of the plain tensors among ``values``: a transformation's arguments,
    which its results must not share (``own_results``' ``handed``): f = lambda x: x, or
    mg.astype(x, x.dtype) under vmap, would hand the caller's x back as its result."""
    return {id(owner(v.data)) for v in values if type(v) is Tensor}


# -- reverse mode as a transformation: vjp and grad -------------------------------------------
#
# ``mg.vjp(f, x, y)`` records f at a level of its own (``levels.py``): each argument is put
# in a :class:`Box`, and every operation that reaches a box is run on the values inside
# (``bind`` one level down) and written on this call's own tape as an entry of
# ``backward.reverse_sweep``. Whatever the values inside are (tensors, dual numbers of a
# ``jvp`` around this call, boxes of an outer ``grad``, graph nodes, source variables,
# batched values of ``vmap``), the operations on them are their own interpreter's
# business, and so are the VJP rules the sweep runs on them: that is why ``grad`` of
# ``grad``, ``jvp`` of ``grad`` and ``grad`` inside a graph all come out right. It is the
# design of HIPS autograd's boxes and of JAX's tracers, and PyTorch's ``create_graph``
# without a flag: an outer transformation sees the inner sweep's operations because they
# are operations on its values.


class _Recording:
    """The tape of one ``vjp`` call: its level, its entries in evaluation order, and the
    writes in place made while f ran: (how many entries there were, the memory written)."""

    __slots__ = ("level", "depth", "who", "entries", "writes")

    def __init__(self, who: str = "vjp") -> None:
        self.level = new_level()
        self.who = who  # (the transformation, for the error on an escaped box)
        self.depth = grad_mode_depth()  # (the blocks this level ignores: grad_mode_depth)
        self.entries: list[tuple] = []
        self.writes: list[tuple[int, int, tuple[str, int] | None]] = []


# The recordings whose f is running (nested vjp calls): every write is logged in each.
_recording: list[_Recording] = []


class Box(ValueInside, ArrayOps):
    """A value being differentiated by one ``vjp`` call (the call's ``_Recording``)."""

    # (__weakref__: weakref.ref(box) and weakref.finalize in f, as on a tensor)
    __slots__ = ("value", "tape", "_priority", "__weakref__")

    def __init__(self, value: Any, tape: _Recording):
        self.value = value
        self.tape = tape
        self._priority = tape.level

    shape = property(lambda self: shape_of(self.value))
    dtype = property(lambda self: self.value.dtype)
    device = property(lambda self: self.value.device)

    def _bind(self, prim: Primitive, args: tuple, params: dict) -> Any:
        rec = self.tape
        if rec.level not in running:
            raise escaped(f"mg.{rec.who}", prim.name)
        values = [a.value if type(a) is Box and a.tape is rec else a for a in args]
        out = bind(prim, *values, **params)
        if not (prim.differentiable and (_mode.enabled or len(_mode.saved) <= rec.depth)):
            return out  # a constant at this level (mg.no_grad() inside f, comparisons ...)
        box = Box(out, rec)
        if np.ndarray in map(type, args):  # a NumPy operand, which the rules read at the
            args = tuple(tensor(a, device=out.device) if type(a) is np.ndarray else a
                         for a in args)  # sweep: a copy, on the device eager mode puts it
        rec.entries.append((prim, params, box, args))
        return box

    def _inside(self) -> Any:  # (what float(box), box.item() ... read: ValueInside)
        return self.value

    def __repr__(self) -> str:
        return f"Box(level={self.tape.level}, {self.value!r})"


register_kind(Box)


def _differentiable(x: Any, position: int, who: str) -> Any:
    """``x`` as a value to differentiate: tensors and values of other transformations
    as they are, numbers and arrays as tensors (a recorded function's float too: its
    ``Weak`` becomes the float64 tensor eager mode makes); only floating dtypes. Anything
    else (a Module, a dict, a string ...) is refused as graph and source mode refuse it
    (``tensor()`` said only "dtype object is not supported")."""
    if type(x) is Weak:  # (inline: this runs per argument of every mg.grad call)
        x = x.value
    if not isinstance(x, Tensor):
        if type(x) not in KINDS:
            try:  # (what mg.tensor takes: numbers, nested lists, arrays, buffers)
                x = tensor(x)
            except (TypeError, ValueError) as exc:  # (a DTypeError is a TypeError)
                if isinstance(x, (list, tuple)):  # (a ragged list: tensor() says where)
                    raise
                raise not_data(x, position, who) from exc
        elif shape_of(x) is None:  # (a derivative has its argument's shape)
            raise ShapeError(f"{who}: argument {position} has an unknown shape (a graph "
                             f"placeholder made with shape=None); {who} needs it: give the "
                             f"placeholder a shape")
    refuse_integers(x.dtype, position, who)
    return x


def cotangent(out: Any, g: Any, who: str) -> Any:
    """The adjoint the sweep starts from: 1 for a scalar output, else the caller's ``g``."""
    shape = shape_of(out)
    if g is None:
        if math.prod(shape) != 1:
            raise GradientError(
                f"{who}: the output has shape {shape}; a gradient is defined for a scalar "
                f"output only. Reduce it first (e.g. out.sum()) or pass the output's "
                f"gradient explicitly")
        return C.ones_like(out)
    if not (isinstance(g, Tensor) or type(g) in KINDS):
        g = tensor(g, dtype=out.dtype, device=out.device)
    if shape_of(g) != shape:
        raise ShapeError(f"{who}: the gradient has shape {shape_of(g)}, the output {shape}")
    if isinstance(g, Tensor) and isinstance(out, Tensor) and g.device is not out.device:
        raise DeviceError(f"{who}: the gradient lives on {g.device.name}, the output on "
                          f"{out.device.name}")
    return g


def vjp(f: Callable[..., Any], *primals: Any) -> tuple[Any, Callable[..., tuple]]:
    """``out, vjp_fn = mg.vjp(f, x, y)``; ``vjp_fn(g)`` gives (g·∂out/∂x, g·∂out/∂y)."""
    out, vjp_fn = recorded_vjp(f, primals, "vjp")
    return own_results([out], memory_of(primals))[0], vjp_fn


def recorded_vjp(f: Callable[..., Any], primals: tuple, who: str
                 ) -> tuple[Any, Callable[..., tuple]]:
    """``vjp(f, *primals)`` for the transformation ``who`` (grad, jacrev ...), whose
    name its errors give."""
    refuse_non_functions(f, who)
    if not primals:
        raise TypeError(f"{who}: give at least one primal to differentiate with respect to")
    refuse_pytrees(primals, range(len(primals)), who, "primal")
    rec = _Recording(who)
    boxes = [Box(_differentiable(p, i, who), rec) for i, p in enumerate(primals)]
    _recording.append(rec)
    running.add(rec.level)  # (levels.level_running, written out: a call of its own per grad)
    try:
        out = f(*boxes)  # (an outer no_grad does not stop it: rec.depth)
    finally:
        running.discard(rec.level)
        _recording.remove(rec)
    if rec.writes:
        _refuse_written_after_read(rec)
    if isinstance(out, (int, float)):  # f ignored its inputs: a constant
        out = tensor(float(out))
    if type(out) is Box and out.tape is rec:
        out_box, value = out, out.value
    elif isinstance(out, Tensor) or type(out) in KINDS:
        out_box, value = None, out  # computed without the inputs: every gradient is zero
    else:
        several = " (for several outputs, one call per output, or mg.stack them)" \
            if isinstance(out, (tuple, list, dict)) else ""
        raise TypeError(f"{who}: f must return a tensor, got {type(out).__name__}{several}")

    def is_ours(a: Any) -> bool:
        return type(a) is Box and a.tape is rec

    def unbox(a: Any) -> Any:
        return a.value if type(a) is Box and a.tape is rec else a

    done = _last_write  # (the module's own stamp: read directly on this per-call path)

    def vjp_fn(g: Any = None) -> tuple:
        seed = cotangent(value, g, "vjp_fn(g)")
        if out_box is None:
            return tuple(C.zeros_like(b.value) for b in boxes)
        if _last_write != done:  # (a write since: into a value the rules read?)
            read = [unbox(v) for e in rec.entries for v in (e[2], *e[3])]
            refuse_changed(read, done, "mode 'tape'")
        adjoint = reverse_sweep(rec.entries, [(out_box, seed)], is_ours, unbox)
        return hand_over([as_gradient(adjoint.get(id(b)), b.value) for b in boxes], seed, g)

    return value, transformation(vjp_fn, "vjp")


def _refuse_written_after_read(rec: _Recording) -> None:
    """f changed a tensor in place after an entry of its record had read it (``z = x * y``,
    then ``y *= 2.0``): the VJP rules would read the new value and give the derivative of
    another function. Refused, as ``backward()`` refuses it (``_check_writes``)."""
    first_read: dict[int, tuple[int, Any, Tensor]] = {}  # memory -> the first entry reading it
    for k, (prim, _, out, args) in enumerate(rec.entries):
        for v in (out, *args):
            v = v.value if type(v) is Box and v.tape is rec else v
            if type(v) is Tensor:
                first_read.setdefault(id(write_target(v)), (k, prim, v))
    for count, key, line in rec.writes:
        if key not in first_read or first_read[key][0] >= count:
            continue  # (written before any entry read it, or never read: nothing lost)
        _, prim, read = first_read[key]
        where = "" if line is None else f", at {line[0]}, line {line[1]}"
        raise GradientError(
            f"f changed a tensor ({_as_written(read)}) in place{where}, after "
            f"{prim.name} had read it (as y *= 2.0 after z = x * y): the derivative of "
            f"{prim.name} would read the new value, which is another function's. Write a "
            f"new value (y = y * 2.0), or change the tensor before it is used")


def hand_over(grads: list, seed: Any, g: Any) -> tuple:
    """A ``vjp_fn``'s gradients as the caller's own arrays, apart from each other and from
    the caller's ``g`` (the gradient of ``x + 0.0`` is g itself), in every mode."""
    handed = {id(owner(seed.data))} if seed is g and type(seed) is Tensor else set()
    return tuple(own_results(grads, handed))


# (mg.vjp itself takes the values: a function source mode reads may call it on its own)
transformation(vjp, "vjp")


def as_gradient(g: Any, x: Any) -> Any:
    """An input's adjoint as its gradient: zeros where no path led, x's dtype (a float32
    parameter used in float64 arithmetic still gets a float32 gradient, as in PyTorch and
    JAX), on x's device (forward mode's tangent lives where f's output was computed).
    Every mode's gradient goes through here: the tape's, forward mode's, the
    reverse-graph pass's (nodes) and source mode's (lines of the adjoint program)."""
    if g is None:
        return C.zeros_like(x)
    if isinstance(g, (int, float)):  # a rule's share can be a Python number (x * 2.0)
        return C.ones_like(x) * g
    if g.dtype != x.dtype:
        g = C.astype(g, x.dtype, copy=False)
    if g.device is not x.device:
        g = C.to_device(g, x.device)
    return g


def value_and_grad(f: Callable[..., Any], argnums: Argnums = 0,
                   who: str = "grad") -> Callable:
    """Tape mode behind ``mg.value_and_grad(f, mode="tape")`` and ``mg.grad``; ``who``
    is the function the user called, which errors name."""

    checked: dict[int, tuple[int, ...]] = {}  # argument count -> the normalised argnums

    def wrapped(*args: Any, **kwargs: Any) -> tuple:
        if kwargs:  # (the cached call's path: no call for none)
            refuse_keywords(kwargs, who)
        nums = checked.get(len(args))
        if nums is None:
            nums = checked[len(args)] = normalize_argnums(argnums, len(args), who)
        refuse_pytrees(args, nums, who)
        inputs = [_differentiable(args[i], i, who) for i in nums]  # (errors say who)
        with passed_as_is(args, nums, who):
            out, vjp_fn = recorded_vjp(lambda *xs: f(*put(args, nums, xs)), tuple(inputs),
                                       who)
        if math.prod(shape_of(out)) != 1:
            raise GradientError(f"{who}: f must return a scalar, it returned shape "
                                f"{shape_of(out)}; use mg.jacrev for a vector output")
        grads = vjp_fn()
        if type(out) is Tensor:  # (f may return an argument, or a view of one)
            out = own_results([out], memory_of(args))[0]
        return out, grads[0] if single(argnums) else grads

    return wrapped


def put(args: tuple | list, nums: tuple[int, ...], values: tuple) -> list:
    """``args`` with ``values`` in the positions ``nums`` (the arguments differentiated)."""
    args = list(args)
    for i, v in zip(nums, values):
        args[i] = v
    return args
