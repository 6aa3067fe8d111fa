"""Tensor: an array on a device, plus what reverse mode needs to know about it.

A tensor holds ``data`` (an array of its device's namespace: NumPy, CuPy, ...), its
``device``, and two autodiff fields: ``requires_grad`` and ``grad``. A tensor made by an
operation while gradients are recorded also keeps ``_entry``, its line of the tape:
which primitive made it, with which parameters, when, and from which arguments
(``(primitive, parameters, sequence number, *arguments)``, see ``autodiff/tape.py``).
Operators and methods come from ``ArrayOps`` and call the primitives, so a Tensor
computes eagerly: define-by-run. ``x -= y``, the other augmented assignments and
``x[i] = y`` write into ``x``'s array outside recording (``tape.update_in_place``,
``tape.assign_item``).

Copies and interchange (PyTorch's conventions, see "Copies, pickles, DLPack" below):
``copy.copy``, ``copy.deepcopy`` and ``pickle`` give a new tensor with its own copy of
the values (a device travels by its name); ``__dlpack__`` hands the array to NumPy,
PyTorch or CuPy without a copy (a tensor that requires a gradient, only copied or
detached); ``tolist()`` gives Python numbers.
"""

from __future__ import annotations

import copy
import copyreg
import numbers
import operator
import sys
import weakref
from typing import Any

import numpy as np

from .device import Device, get_device, scoped_device
from .device import nbytes as array_nbytes  # (__init__ has a local named nbytes)
from .errors import DeviceError, DTypeError, GradientError
from .ops import elementwise as E
from .ops.operators import ArrayOps
from .ops.shape import same_device
from .ops.shape_rules import DTYPES, FLOATS, dtype_name, sizes, supported_dtype

FLOAT_DTYPES = FLOATS  # (the floating dtypes: shape_rules holds the one list)


def host_values(t: "Tensor") -> Any:
    """``t``'s values on the host, for the library's own reading: on a CPU device the
    tensor's own array, not to be handed to the user as it is (``Tensor.numpy``)."""
    return t.device.to_numpy(t.data)


def owner(array: Any) -> Any:
    """The array that owns ``array``'s memory (NumPy and CuPy keep it as ``.base``)."""
    base = getattr(array, "base", None)
    return array if base is None else base


def write_target(t: "Tensor") -> Any:
    """What a write into ``t`` changes: the array that owns its memory (so a write
    through a view counts for every tensor sharing it), or ``t`` itself where it holds a
    NumPy scalar (the 0-d result of a kernel), which has no memory. Writes are counted,
    and guarded, per target.

    The target must not change once a write was counted on it, or the count is lost. A
    tensor holding a NumPy scalar has therefore never been written: a write first makes
    the scalar a 0-d array of the tensor's own (``Tensor._own_array``), which stays its
    array, and counts on that. (Only a guard keys such a tensor by itself,
    ``reads.read_only_arrays``; while it does, the scalar is kept as it is.)"""
    data = t.data
    return t if isinstance(data, np.generic) else owner(data)


class Tensor(ArrayOps):
    """An n-dimensional array on a device; records its history when gradients are needed."""

    __slots__ = ("data", "device", "_requires_grad", "_grad", "_entry", "_nbytes",
                 "_switches", "__weakref__")
    # (Set only once a leaf's requires_grad is switched: when, in the tape's sequence
    # numbers, for the entries recorded before (tape.switched). Unset, the common case,
    # costs the eager interpreter nothing: the tape reads it with getattr.)
    _switches: tuple[int, ...]
    data: Any  # (the array itself: a slot, where other kinds refuse it: ops/operators.py)
    _priority = 0  # the eager interpreter: below graph nodes and dual numbers (primitive.bind)
    _noun = "tensor"
    # (Tensor is not registered with register_kind: bind runs the eager interpreter
    # whenever no registered kind is among the arguments.)

    def __init__(self, data: Any, device: Device = None,  # type: ignore[assignment]
                 requires_grad: bool = False, entry: tuple | None = None):
        # (The library's own constructor: ``data`` is already an array of ``device``. The
        # default None only lets ``mg.Tensor([1.0, 2.0])``, PyTorch's torch.Tensor habit,
        # reach the except clauses below, which point to mg.tensor; they cost nothing
        # until they catch.)
        self.data = data
        self.device = device
        self._requires_grad = requires_grad  # (the slot itself: the library's own flag)
        self._grad: Tensor | None = None  # (the slot itself: no check for None)
        self._entry = entry
        # Memory accounting per device: count the bytes of arrays that own their memory
        # (a NumPy view, e.g. from reshape, shares its base's bytes and counts nothing).
        # This runs for every eager op, hence the try (free when nothing is raised)
        # rather than a getattr with a default for the common case, a NumPy array.
        try:
            nbytes = 0 if data.base is not None else data.nbytes
        except AttributeError:  # arrays without .base/.nbytes (array-api-strict ...)
            if not hasattr(data, "shape"):
                raise TypeError(_not_the_constructor(data)) from None
            nbytes = 0 if getattr(data, "base", None) is not None else array_nbytes(data)
        self._nbytes = nbytes
        try:
            live = device.live_bytes + nbytes
        except AttributeError:
            raise TypeError(_not_the_constructor(data, device)) from None
        device.live_bytes = live
        if live > device.peak_bytes:
            device.peak_bytes = live

    def __del__(self) -> None:
        # Give the bytes back to the device's counter. A finaliser must never raise:
        # nobody can catch its exception (Python prints it to stderr), and it runs on
        # tensors that __init__ never finished (an exception before ``_nbytes`` was set,
        # a ``Tensor.__new__`` that a failed unpickle left behind) and during interpreter
        # shutdown, when attributes and modules may already be gone.
        try:
            self.device.live_bytes -= self._nbytes
        except Exception:
            pass

    # -- what a tensor is -------------------------------------------------------------------
    # (ArrayOps declares ``shape`` as an attribute for its methods to read, and never
    # assigns it: a read-only property provides it, which mypy cannot know)
    @property
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.data.shape  # a tuple in NumPy, CuPy and the Array API

    @property
    def ndim(self) -> int:
        return self.data.ndim  # (the array's own count, without making the shape tuple)

    @property
    def dtype(self) -> str:
        """The dtype's name: ``"float64"``, ``"float32"``, ``"int64"`` or ``"bool"``."""
        return self.device.dtype_name(self.data.dtype)

    @property
    def is_leaf(self) -> bool:
        """True for a tensor the user made (not the result of a recorded operation)."""
        return self._entry is None

    def numpy(self) -> Any:
        """The values as a NumPy array: on a CPU device the tensor's own array, as
        PyTorch's ``.numpy()`` (an in-place update shows through it, both ways: a compiled
        program that holds the tensor compares its values on every call, see
        ``signature.Captured``); from a GPU a copy.

        For a tensor that requires a gradient, a read-only view of it: ``backward()``
        reads such values, and a write through NumPy would pass the tape's guard unseen
        (``autodiff/tape.py``) and change the gradient without a word. PyTorch refuses
        ``.numpy()`` there; ``t.detach().numpy()`` is the writable array in both."""
        return self._handed_out(self.device.to_numpy(self._own_array()))

    def _handed_out(self, array: Any) -> Any:
        """The values on the host, ``array``, as the user gets them: where it is the
        tensor's own memory, a read-only view of it if backward() reads it (above), else
        the memory itself.

        The own memory is the array itself on a NumPy device, and on an array-api-strict
        device the NumPy array its Array wraps (``_array``, which ``Device.to_numpy``
        hands out); a GPU's values come as a copy."""
        data = self.data
        own = array is data or array is getattr(data, "_array", None)
        if own and self.requires_grad:
            array = array.view()
            array.flags.writeable = False
        return array

    def item(self) -> "float | int | bool":
        """The value of a one-element tensor as a Python number."""
        return self._number("item()")

    def _number(self, conversion: str) -> "float | int | bool":
        """``item()``, refused for more than one element in the words of the
        ``conversion`` the user wrote (``float(t)``, ...), not of item()."""
        if self.size != 1:
            raise ValueError(f"{conversion}: the tensor has {self.size} elements (shape "
                             f"{self.shape}); only a one-element tensor converts to a number")
        return host_values(self).reshape(()).item()

    def tolist(self) -> Any:
        """The values as (nested lists of) Python numbers, as NumPy's ``tolist``.

        A 0-d tensor gives a number, not a list. The numbers are Python's ``float``,
        ``int`` and ``bool``, copied: changing them changes nothing in the tensor.
        """
        return host_values(self).tolist()

    def detach(self) -> "Tensor":
        """The same data, cut from the tape (no gradient flows through it), as PyTorch's:
        a write into one shows in the other. (A reduction's 0-d result holds a NumPy
        scalar, which has no memory to share: it becomes a 0-d array of the tensor's own,
        which both tensors then hold.)"""
        return shared(self._own_array(), self.device)

    def _own_array(self) -> Any:
        """``data``, made a 0-d array where it is a NumPy scalar, before its memory is
        shared (``detach``, ``numpy``, ``np.asarray``, DLPack) or written (``x -= 1``,
        ``x[i] = v``): a kernel's 0-d result is kept as NumPy's scalar, whose ops are
        faster, but no write changes a scalar, so a write on one side would not show on
        the other, and the tape would count it on the tensor, not on the array that
        a later read makes (see ``write_target``).

        While a guard holds the tensor read-only by its identity (``reads.read_only``:
        a scalar has no read-only flag), the scalar stays: an array made now would carry
        no guard, and the next write would go through. The caller gets a read-only copy
        instead; no write can reach the tensor meanwhile anyway."""
        data = self.data
        if isinstance(data, np.generic):
            from .autodiff.reads import read_only  # (reads.py imports this module)

            array = np.asarray(data)
            if read_only(self):
                array.flags.writeable = False
                return array
            self.data = data = array
        return data

    @property
    def grad(self) -> "Tensor | None":
        """The gradient ``backward()`` accumulated into this tensor (None before any)."""
        return self._grad

    @grad.setter
    def grad(self, value: "Tensor | None") -> None:
        """PyTorch's rule: None, or a tensor of this one's shape, dtype and device. Another
        would fail at the next accumulation, after the tape was used up, or make a
        float32 parameter's gradient float64 without a word."""
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"grad: a gradient is a Tensor or None, got "
                                f"{type(value).__name__}")
            if value.shape != self.shape or value.dtype != self.dtype \
                    or value.device is not self.device:
                raise GradientError(
                    f"grad: cannot assign a gradient of shape {value.shape} {value.dtype} on "
                    f"{value.device.name} to a tensor of shape {self.shape} {self.dtype} on "
                    f"{self.device.name}; they must agree")
            if value is self:  # (the next backward() would add into the tensor itself)
                raise GradientError("grad: a tensor cannot be its own gradient (PyTorch "
                                    "refuses it too); assign a copy: x.grad = x * 1.0")
        self._grad = value

    @property
    def requires_grad(self) -> bool:
        """Whether operations on this tensor are recorded for ``backward()``."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        # PyTorch's checks. An integer tensor has no gradient (its sweep would compute
        # one in its dtype: 2 for d(2.5 t)/dt). A recorded result's flag is its history's:
        # switching it off would silently cut the gradient that flows through it.
        flag = as_flag("requires_grad", flag)
        if flag and self.dtype not in FLOAT_DTYPES:
            raise DTypeError(f"only floating-point tensors can require gradients, "
                             f"this one has dtype {self.dtype}")
        if self._entry is not None and not flag:
            raise GradientError(
                "requires_grad: only a leaf tensor's flag can change, and this one is the "
                "result of a recorded operation; for a value without that history, use "
                "y.detach() (or compute it under mg.no_grad())")
        if flag != self._requires_grad:  # (the entries recorded until now keep the flag
            # they saw, as in PyTorch: see tape.switched)
            self._switches = _tape().switched(getattr(self, "_switches", (-1,)))
        self._requires_grad = flag

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        """Mark a leaf tensor as an input whose gradient ``backward()`` should fill."""
        self.requires_grad = flag
        return self

    def backward(self, grad: Any = None, create_graph: bool = False,
                 retain_graph: bool | None = None) -> None:
        """Accumulate d(self)/d(leaf) into ``leaf.grad`` for every leaf that requires it
        (PyTorch's ``retain_graph``: without it, a second backward() raises)."""
        if grad is not None and (isinstance(grad, (str, bytes))
                                 or not (isinstance(grad, (Tensor, numbers.Number, list, tuple))
                                         or hasattr(grad, "shape"))):
            # (a str reached NumPy's "could not convert string to float", naming nothing)
            raise TypeError(f"backward(): grad is the output's gradient, a tensor (or a "
                            f"number or an array) of shape {self.shape}, or None; got a "
                            f"{type(grad).__name__}")
        _tape().backward(self, grad, create_graph, retain_graph)

    # -- in-place updates: write into this tensor's array (see autodiff/tape.py) -----------
    # (A NumPy scalar becomes the tensor's own 0-d array before a write: the write goes
    # into that array and is counted on it, as on any array; see write_target.)
    def _update(self, prim: Any, write: Any, other: Any) -> "Tensor":
        self._own_array()
        return _tape().update_in_place(self, prim, write, other)

    def __setitem__(self, index: Any, value: Any) -> None:
        # (an index tensor on another device is refused, as x[i] refuses it: the tape
        # reads its values through a copy)
        same_device("x[...] = value", (self, *(index if isinstance(index, tuple) else (index,))))
        self._own_array()
        _tape().assign_item(self, index, value)

    def __iadd__(self, other: Any) -> "Tensor":
        return self._update(E.ADD, operator.iadd, other)

    def __isub__(self, other: Any) -> "Tensor":
        return self._update(E.SUB, operator.isub, other)

    def __imul__(self, other: Any) -> "Tensor":
        return self._update(E.MUL, operator.imul, other)

    def __itruediv__(self, other: Any) -> "Tensor":
        return self._update(E.DIV, operator.itruediv, other)

    def __ifloordiv__(self, other: Any) -> "Tensor":
        return self._update(E.FLOOR_DIVIDE, operator.ifloordiv, other)

    def __imod__(self, other: Any) -> "Tensor":
        return self._update(E.REMAINDER, operator.imod, other)

    def __ipow__(self, other: Any) -> "Tensor":  # type: ignore[misc]
        return self._update(E.POW, operator.ipow, other)

    # -- Python conversions -------------------------------------------------------------------
    def __float__(self) -> float:
        return float(self._number("float(t)"))

    def __int__(self) -> int:
        return int(self._number("int(t)"))

    def __complex__(self) -> complex:  # (else Python's complex() calls __float__)
        return complex(self._number("complex(t)"))

    def __bool__(self) -> bool:
        if self.size != 1:  # (item() would say item(), which the user did not call)
            raise ValueError(f"bool() of a tensor of {self.size} elements (shape {self.shape}) "
                             f"is ambiguous, as in NumPy and PyTorch: reduce it to one "
                             f"element first (mg.max, mg.sum, a comparison of the result)")
        return bool(self.item())

    def __contains__(self, value: Any) -> bool:
        """``v in t``: whether some element equals ``v`` (broadcast), as NumPy's and
        PyTorch's ``in``; without it Python iterated the rows, and a 0-d tensor refused."""
        equal = self == value
        if type(equal) is bool:  # (``None in t``: == leaves None to Python, which compares
            return equal         # identities: False, as NumPy answers)
        return bool(self.device.to_numpy(equal.data).any())

    def __index__(self) -> int:
        """A one-element integer tensor as an index: ``range(n)``, ``xs[i]`` (PyTorch's)."""
        if self.dtype not in ("int64", "int32"):
            raise TypeError(f"only an integer tensor can be an index; this one is {self.dtype}")
        return int(self._number("operator.index(t) (a tensor used as an index)"))

    def __format__(self, spec: str) -> str:
        """``f"{loss:.4f}"`` formats a one-element tensor's number, as PyTorch's does;
        without a format spec, a tensor is its text (what print shows)."""
        if not spec:
            return str(self)
        if self.size != 1:
            raise TypeError(f"format spec {spec!r}: it formats a one-element tensor's number, "
                            f"and this tensor has {self.size} elements (shape {self.shape}); "
                            f"format x.tolist() or each element")
        return format(self.item(), spec)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        """NumPy's protocol: ``np.asarray(t)`` is ``t.numpy()`` (the tensor's own array on
        a CPU device), ``np.array(t)`` a copy. NumPy 2 passes ``copy`` on and trusts the
        answer: ignoring it made ``np.array(t)`` the tensor's own array, so writing into
        that copy changed the tensor.

        A tensor that requires a gradient is refused while recording is on, as PyTorch
        refuses it: NumPy functions that are not ufuncs (``np.dot``, ``np.linalg.norm``)
        read it through here, and their result, computed outside the tape, would carry
        no gradient back to it (``np.dot(a, x)`` added to a loss lost a's share)."""
        if self._requires_grad and _tape().is_grad_enabled():
            raise GradientError(
                "NumPy read a tensor that requires a gradient (np.asarray, or a NumPy "
                "function such as np.dot or np.linalg.norm): NumPy's result is not "
                "recorded, so no gradient would flow back through it. Use the mg. function "
                "(mg.matmul, mg.sum, ...), or t.detach() (or t.numpy()) for its values")
        if copy is False and self.device.context is not None:
            raise ValueError(f"np.asarray(..., copy=False): this tensor lives on {self.device}, "
                             f"so a NumPy array of it is always a copy (copy=None allows one)")
        host = self.device.to_numpy(self.data if copy is True else self._own_array())
        if copy is not True:  # (np.asarray(t): the tensor's own array, as t.numpy())
            host = self._handed_out(host)
        return np.asarray(host, dtype=dtype, copy=copy)

    # -- copies, pickles, DLPack -----------------------------------------------------------------
    # PyTorch's rules, with one difference said below. A copy is a new *leaf* with its own
    # copy of the values, the same dtype, shape, device and requires_grad:
    #
    # * ``copy.copy(t)`` and ``pickle``: no ``grad`` (PyTorch pickles none either), and a
    #   tensor made by a recorded operation comes back as a leaf: its tape line (which
    #   holds the primitive and its arguments) is history, not a value. PyTorch's
    #   ``copy.copy`` shares the storage; minigraph copies the values, as NumPy's
    #   ``copy.copy`` of an array does, so that ``c -= 1`` never changes ``t``.
    # * ``copy.deepcopy(t)``: also a deep copy of ``t.grad``; refused for a tensor on the
    #   tape, as PyTorch refuses it: a deep copy promises an equal object, and the
    #   tape line (what made ``t``, from which arguments) is not something to copy.
    #
    # A device is pickled by its name and found again with ``mg.get_device(name)`` where
    # the pickle is loaded (see ``_device_by_name``); a copy in the same process keeps
    # the same Device object.

    def __copy__(self) -> "Tensor":
        return _rebuild(self.device.copy_from(self.data, self.device), self.device,
                        self.requires_grad)

    def __deepcopy__(self, memo: dict[int, Any]) -> "Tensor":
        if self._entry is not None:
            raise GradientError(
                f"copy.deepcopy: this tensor (shape {self.shape}, {self.dtype} on "
                f"{self.device.name}) was made by a recorded operation "
                f"({self._entry[0].name}); only leaves (tensors the user made) can be "
                f"deep-copied, as in PyTorch. Copy t.detach() for its values, or deep-copy "
                f"the leaves it was computed from")
        new = self.__copy__()
        memo[id(self)] = new
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        return new

    def __reduce_ex__(self, protocol: Any) -> tuple:
        # (rebuild function, its arguments): the values as a host NumPy array, which
        # pickles by value, and the device as its name (a Device holds a module, xp,
        # which cannot be pickled, and is one object per process anyway).
        return (_unpickle, (host_values(self), self.device.name,
                            self.requires_grad))

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: "bool | None" = None) -> Any:
        """Hand the values to another library: ``np.from_dlpack(t)``, ``torch.from_dlpack(t)``.

        This is the array's own ``__dlpack__`` (NumPy >= 2, CuPy), so **the memory is
        shared, not copied** (unless the consumer asks ``copy=True``): the consumer's
        array and this tensor are one buffer, as with ``t.numpy()`` on the CPU. A write on
        either side (``t -= 1``, an optimizer step, ``torch_view.add_(1)``) is seen by
        both. Copy on the consumer's side (``np.from_dlpack(t).copy()``) to get values of
        your own. The consumer only gets values: no gradient flows back through them.
        A tensor that requires a gradient is refused unless the consumer asks for a copy,
        as PyTorch refuses it: a write on the consumer's side would change a value that
        ``backward()`` reads, unseen by the tape (``t.numpy()`` is a read-only view there,
        but PyTorch ignores DLPack's read-only flag). ``t.detach()`` exports the memory.
        A reversed view (``x[::-1]``, a negative stride) is exported as a copy (below).
        """
        if self.requires_grad and not copy:
            raise BufferError(
                f"__dlpack__: this tensor ({self.shape} {self.dtype}) requires a gradient, "
                f"and the consumer's array would share its memory: a write there (torch's "
                f"add_, ...) would change a value backward() reads, unseen by the tape. "
                f"Export t.detach() (the same memory, cut from the tape) or ask for a copy "
                f"(np.from_dlpack(t, copy=True)); PyTorch refuses such an export too")
        data = self.data if copy else self._own_array()
        if not hasattr(data, "__dlpack__"):  # a NumPy scalar (0-d result of a kernel),
            data = self.device.xp.asarray(data)  # a copy asked for: immutable, so exact
        elif any(stride < 0 for stride in getattr(data, "strides", ())):
            # A reversed view (x[::-1]) has a negative stride, which DLPack allows but
            # PyTorch cannot read: torch.from_dlpack (and torch.tensor) abort the whole
            # process. Such a tensor exports a C-ordered copy, which copy=None permits.
            if copy is False:
                raise BufferError(
                    f"__dlpack__: this tensor ({self.shape} {self.dtype}) is a reversed view "
                    f"(strides {data.strides}), which not every consumer can read (PyTorch "
                    f"aborts), so it is only exported as a copy; copy=False cannot share it")
            data = self.device.copy_from(data, self.device)
        # Pass on only what the consumer gave: older producers accept only ``stream``.
        given = {"stream": stream, "max_version": max_version, "dl_device": dl_device,
                 "copy": copy}
        return data.__dlpack__(**{k: v for k, v in given.items() if v is not None})

    def __dlpack_device__(self) -> tuple[Any, int]:
        """(DLPack device type, index) of the memory: (1, 0) for the CPU, (2, N) for cuda:N."""
        data = self.data
        if not hasattr(data, "__dlpack_device__"):
            data = self.device.xp.asarray(data)
        return data.__dlpack_device__()

    def __repr__(self) -> str:
        body = repr(host_values(self)).replace("array(", "tensor(", 1)
        if body.endswith(")"):
            body = body[:-1]
        else:  # a NumPy scalar's repr has no "array(" around it
            body = f"tensor({body}"
        if "dtype=" not in body:
            body += f", dtype={self.dtype}"
        extra = f", device={self.device.name}"
        if self._entry is not None:
            extra += f", grad_fn=<{self._entry[0].name}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return body + extra + ")"



_TAPE = __package__ + ".autodiff.tape"


def _tape() -> Any:
    """The module ``autodiff/tape.py``, which builds on Tensor and so is imported after it.

    Found in ``sys.modules``: one dictionary lookup. (The statement ``from .autodiff.tape
    import backward`` inside a method resolves the package's name on every call, 2 µs: a
    twentieth of a scalar ``backward()``.)"""
    module = sys.modules.get(_TAPE)
    if module is None:  # (minigraph's __init__ imports it: only while it is being imported)
        from .autodiff import tape as module
    return module


def shared(data: Any, device: Device) -> Tensor:
    """A tensor over memory another tensor already counts (``detach``): counted once."""
    t = Tensor.__new__(Tensor)
    t.data, t.device, t._requires_grad, t._grad, t._entry, t._nbytes = data, device, False, \
        None, None, 0
    return t


def _rebuild(data: Any, device: Device, requires_grad: bool) -> Tensor:
    """A leaf tensor over ``data``, an array of ``device`` that nobody else holds."""
    t = Tensor(data, device)
    t.requires_grad = requires_grad
    return t


def _device_by_name(name: str, what: str = "a device") -> Device:
    """The device called ``name`` in this process, for an object being unpickled."""
    try:
        return get_device(name)
    except DeviceError as exc:
        raise DeviceError(
            f"cannot unpickle {what} on device {name!r}: that device does not exist in "
            f"this process ({exc}). Load it where the device exists, or make "
            f"it exist first (mg.set_virtual_cpus(n) for cpu:n)") from None


def _unpickle(values: Any, device_name: str, requires_grad: bool) -> Tensor:
    """Rebuild a pickled tensor: its values copied onto the device of that name here."""
    dev = _device_by_name(device_name, "a tensor")
    return _rebuild(dev.asarray(values, copy=True), dev, requires_grad)


# A Device (in a module's attributes, say) pickles as its name, like a tensor's device.
# (Registered with copyreg because a Device's __slots__ hold its array module, which no
# pickle can hold; ``copy.deepcopy`` uses the same rule, and gets the same object back.)
copyreg.pickle(Device, lambda d: (_device_by_name, (d.name,)))


def _not_the_constructor(data: Any, device: Any = None) -> str:
    """What ``mg.Tensor(...)`` says when it is called as ``torch.Tensor`` is."""
    given = f"{type(data).__name__}" + ("" if device is None else f", {device!r}")
    return (f"Tensor({given}): mg.Tensor(array, device) wraps an array already on a minigraph "
            f"Device and is the library's own; make a tensor with mg.tensor(data, "
            f"dtype=..., device=..., requires_grad=...), as torch.tensor")


_NUMPY_DTYPES = frozenset(np.dtype(name) for name in DTYPES)  # NumPy's of minigraph's dtypes


def tensor(data: Any, dtype: str | None = None, device: "str | Device | None" = None,
           requires_grad: bool = False) -> Tensor:
    """Make a tensor from Python data, a NumPy array or another tensor (always a copy).

    Dtypes follow NumPy: Python floats give float64, ints int64, bools bool; a NumPy
    array keeps its dtype. ``device`` defaults to the innermost ``mg.device`` scope;
    outside any scope, a copy of a tensor stays on that tensor's device (PyTorch's rule
    for ``torch.tensor(t)``), and other data goes to ``"cpu"``.

    Nested lists must be rectangular (a ragged one is refused, naming where), and must
    hold numbers, not tensors: ``mg.stack`` combines tensors.
    """
    if requires_grad is not False and requires_grad is not True:
        requires_grad = as_flag("tensor()", requires_grad)
    if device is None and isinstance(data, Tensor) and scoped_device() is None:
        device = data.device  # (a copy does not silently move to another device)
    dev = get_device(device)
    if type(data) is float and dtype is None:  # (the common leaf, mg.tensor(2.0): float64)
        return Tensor(dev.asarray(data), dev, requires_grad)
    if data is None or isinstance(data, (str, bytes)):  # (NumPy makes an object or a
        # string array of it, and the error spoke of a dtype the caller never named)
        raise DTypeError(f"tensor(): cannot make a tensor of {data!r} (a "
                         f"{type(data).__name__}); expected a number, nested lists of "
                         f"numbers, an array or a tensor")
    if isinstance(data, (list, tuple)):
        _check_nested(data)
    if isinstance(data, Tensor):
        data = data.device.to_numpy(data.data) if data.device is not dev else data.data
    copy = True if hasattr(data, "shape") else None  # an array is copied, as in PyTorch
    name = None if dtype is None else dtype_name(dtype, "tensor()")
    if name is not None:
        supported_dtype("tensor()", name)  # (the dtype asked for, before anything is copied)
    if copy is None:  # Python data: NumPy's rules give its dtype on every device (another
        data = _from_python(data, name)  # namespace may differ: array-api-strict's
        # wrapped 2**63 to int64); checked below as an array is, against ``name``
    if isinstance(data, (np.ndarray, np.generic)):
        if name is None:
            if data.dtype not in _NUMPY_DTYPES:  # (a set lookup: dtype.name is slow)
                supported_dtype("tensor()", data.dtype)  # (before another device has it)
        elif data.dtype != name and (why := unheld(data, name)) is not None:
            raise DTypeError(f"tensor(): {why}")
    elif name is not None and hasattr(data, "__array__"):  # (another library's array on
        try:                                               # the host, a torch tensor's:
            host = np.asarray(data)                        # looked at as NumPy's, a view)
        except Exception:  # noqa: BLE001  (on a GPU, or a torch tensor that requires a
            host = None    # gradient: its own library casts it, unchecked)
        if host is not None and host.dtype != name and (why := unheld(host, name)):
            raise DTypeError(f"tensor(): {why}")
    try:
        array = dev.asarray(data, dtype=name, copy=copy)
    except TypeError:  # (another library's array of a dtype NumPy has not: torch's
        # bfloat16 said only "Got unsupported ScalarType BFloat16")
        native = str(getattr(data, "dtype", "")).rpartition(".")[2]  # (torch.bfloat16)
        if not native or native in DTYPES:
            raise
        raise DTypeError(f"tensor(): dtype {native} (of a {type(data).__name__}) is not "
                         f"supported; convert it first to one of {', '.join(DTYPES)}") from None
    t = Tensor(array, dev)
    supported_dtype("tensor()", t.dtype)  # (another library's array: a torch int8 ...)
    if requires_grad:
        if t.dtype not in FLOAT_DTYPES:
            raise DTypeError(f"only floating-point tensors can require gradients, "
                             f"this one has dtype {t.dtype}")
        t._requires_grad = True  # (checked just above: the setter would check again)
    return t


def as_flag(who: str, value: Any, what: str = "requires_grad") -> bool:
    """``value`` as an on/off setting takes it (``requires_grad``, a Session's ``trace``):
    True or False (a NumPy bool too), else a TypeError, as PyTorch's. Python's truth
    would read ``requires_grad="False"`` as True, and turn gradients on with the word
    that meant off."""
    if value is True or value is False or isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{who}: {what} must be True or False, got {value!r} (a "
                    f"{type(value).__name__})")


def _too_wide(name: str | None) -> DTypeError:
    """The refusal of a Python int that does not fit in the dtype ``name`` (or int64)."""
    return DTypeError(f"tensor(): an integer in the data does not fit in {name or 'int64'}; "
                      f"minigraph's widest integer is int64")


def unheld(array: Any, target: str) -> str | None:
    """Why NumPy's cast of the NumPy array ``array`` to the dtype ``target`` would not
    keep its numbers, in words for an error; None where it keeps them. NumPy casts
    without a word: an int beyond ``target``'s range wraps around (2**40 is 0 in int32),
    a NaN or an infinity made an int is int64's least value, a finite float beyond
    float32's range becomes inf. Only a cast that narrows or changes kind can do that,
    so only such a cast is looked at (a bool holds any number, as its truth). A float
    made an int keeps only its integer part, as in NumPy and PyTorch: the caller refuses
    the change of kind where it must (a feed, ``graph.py``)."""
    dtype, to = array.dtype, np.dtype(target)
    if to.kind == "b" or array.size == 0 or np.can_cast(dtype, to, "safe"):
        return None
    # (the least and the greatest number first, two passes without a copy: NaN makes
    # both NaN; only an array that does not pass looks at each number)
    low, high = array.min(), array.max()
    with np.errstate(invalid="ignore", over="ignore"):  # (NumPy's warnings: said below)
        if to.kind == "f":  # (an int never reaches float32's range: it only rounds)
            top = np.finfo(to).max
            if dtype.kind != "f" or -top <= low and high <= top:
                return None
            lost = np.isfinite(array) & ~np.isfinite(array.astype(to))
            if np.any(lost):
                return (f"{array[lost].flat[0].item()!r} would become inf in {target}, "
                        f"whose largest number is {top.item():.6g}")
            return None
        if dtype.kind == "f":
            if not (np.isfinite(low) and np.isfinite(high)):
                value = array[~np.isfinite(array)].flat[0]
                return (f"{value.item()!r} has no integer value (a cast to {target} would "
                        f"make it {value.astype(to).item()})")
            low, high = np.trunc(low), np.trunc(high)  # (the part the cast keeps)
    info = np.iinfo(to)
    low, high = low.item(), high.item()
    if low < info.min or high > info.max:
        made = "other numbers" if dtype.kind == "f" else "them wrapped around"
        return (f"values {low!r}..{high!r} do not fit dtype {target} ({info.min}.."
                f"{info.max}); a cast would give {made}")
    return None


def _from_python(given: Any, name: str | None) -> Any:
    """Python data as NumPy's array, in NumPy's own dtype (the caller checks the cast to
    ``name`` as an array's), except where that dtype would lose what ``name`` keeps:
    ints beside floats (NumPy's float64 rounds 10**17 + 3; to an int dtype, each
    number is converted by itself, exactly, and compared with what NumPy's own array
    says, which an array among the data was cast from without a check: 1e10 in int32
    wrapped), and ints beyond int64 (uint64 or objects: refused)."""
    try:
        native = np.asarray(given)
    except OverflowError:
        raise _too_wide(name) from None
    if native.dtype.kind in "uO" and _beyond_int64(given):  # (NumPy makes uint64, or
        raise _too_wide(name)  # object, of such an int: a dtype nobody asked for)
    if name is None or native.dtype.kind != "f" or np.dtype(name).kind not in "iu":
        return native if native.dtype.kind != "O" or name is None else \
            np.asarray(given, dtype=name)  # (Fraction, Decimal: NumPy's own conversion)
    why = unheld(native, name)  # (a NaN, or a number out of range, by NumPy's floats)
    try:
        exact = np.asarray(given, dtype=name)
    except (OverflowError, ValueError):
        exact = None
    if exact is not None and np.array_equal(exact, np.trunc(native)):
        return exact  # (2**63 - 1 beside 0.5: float64 rounds it beyond int64, but it fits)
    raise DTypeError(f"tensor(): {why}" if why is not None else
                     f"tensor(): the data's numbers do not fit dtype {name}")


def _beyond_int64(data: Any) -> bool:
    """Whether Python ``data`` holds an int outside int64, which NumPy would keep as
    uint64 (up to 2**64 - 1) or as Python objects."""
    try:
        np.asarray(data, dtype=np.int64)
    except OverflowError:
        return True
    except (TypeError, ValueError):  # (something else made the dtype: None, a str ...)
        pass
    return False


def _check_nested(data: "list | tuple", who: str = "tensor()") -> None:
    """Refuse, before NumPy sees them, nested lists that would come out wrong (``who``:
    what a ragged list's error calls the operation):

    * a tensor among the elements (but a 0-d one, a number): NumPy would make an object
      array, or an extra axis
      (``mg.tensor((x,))`` had shape (1, *x.shape)), and an element being differentiated
      would silently lose its derivative (a gradient of 0). ``mg.stack`` combines
      tensors, and records;
    * a ragged list (``[[1.0, 2.0], [3.0]]``, ``[[1.0, 2.0], np.array([3.0])]``): NumPy's
      error names neither the argument nor the place; this one does, as PyTorch's
      ("expected sequence of length 2 at dim 1 (got 1)"). The expected lengths are those
      of the first element at each depth (an array's shape, where it is one).
    """
    from .ops.primitive import KINDS

    expected: list[int] = []  # the length along each dim, read down the first elements
    first: Any = data
    while isinstance(first, (list, tuple)):
        expected.append(len(first))
        first = first[0] if first else None
    expected += getattr(first, "shape", ())  # (an array among the rows: its own axes)
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        seq, dim = stack.pop()
        if dim < len(expected) and len(seq) != expected[dim]:
            raise ValueError(f"{who}: data is a ragged nested list: expected a sequence of "
                             f"length {expected[dim]} at dim {dim}, got {len(seq)}; every "
                             f"row must have the same length")
        for k, item in enumerate(seq):
            if isinstance(item, (list, tuple)):
                if dim + 1 >= len(expected):
                    raise ValueError(f"{who}: data is a ragged nested list: expected a "
                                     f"number at dim {dim + 1}, got a {type(item).__name__} "
                                     f"of length {len(item)}")
                stack.append((item, dim + 1))
            elif (isinstance(item, Tensor) and item.requires_grad) or type(item) in KINDS:
                raise GradientError(
                    f"tensor(): element {k} of the list is a value being differentiated "
                    f"({type(item).__name__} of shape {tuple(item.shape)}); tensor() copies "
                    f"numbers and would drop it from the derivative (a silent gradient of "
                    f"0). Use mg.stack([...]) to combine tensors and keep their derivatives")
            elif isinstance(item, Tensor) and item.shape != ():  # (a 0-d one is a number,
                raise TypeError(                                    # as in PyTorch)
                    f"tensor(): element {k} of the {type(seq).__name__} is a Tensor of shape "
                    f"{item.shape}; tensor() takes numbers (nested lists of them), not a "
                    f"sequence of tensors. Use mg.stack([...]) to combine tensors, or pass "
                    f"the tensor itself")
            elif not hasattr(item, "shape"):
                if dim + 1 < len(expected):
                    raise ValueError(f"{who}: data is a ragged nested list: expected a "
                                     f"sequence of length {expected[dim + 1]} at dim "
                                     f"{dim + 1}, got a {type(item).__name__}")
            elif tuple(item.shape) != tuple(expected[dim + 1:]):  # (an array, a 0-d tensor)
                raise ValueError(f"{who}: data is a ragged nested list: expected "
                                 f"{_nested(expected[dim + 1:])} at dim {dim + 1}, got a "
                                 f"{type(item).__name__} of shape {tuple(item.shape)}")


def _nested(shape: list[int]) -> str:
    """What ``_check_nested`` expects at a place: a number, or a sequence of ``shape``."""
    if not shape:
        return "a number"
    return f"a sequence of length {shape[0]}" + (f" (shape {tuple(shape)})"
                                                  if len(shape) > 1 else "")


def as_tensor(value: Any, like: Tensor | None = None) -> Tensor:
    """``value`` as a tensor: tensors pass through; other values go to ``like``'s device."""
    if isinstance(value, Tensor):
        return value
    return tensor(value, device=None if like is None else like.device)


def zeros(shape: "tuple[int, ...] | int", dtype: Any = "float64",
          device: "str | Device | None" = None) -> Tensor:
    """A tensor of zeros (``dtype=None`` is float64, as in NumPy)."""
    return _filled("zeros", shape, 0, dtype, device)


def ones(shape: "tuple[int, ...] | int", dtype: Any = "float64",
         device: "str | Device | None" = None) -> Tensor:
    """A tensor of ones (``dtype=None`` is float64, as in NumPy)."""
    return _filled("ones", shape, 1, dtype, device)


def full(shape: "tuple[int, ...] | int", value: "float | int", dtype: Any = "float64",
         device: "str | Device | None" = None) -> Tensor:
    """A tensor of ``shape`` filled with ``value`` (``dtype=None`` is the value's dtype,
    as in NumPy: int64 for an int)."""
    if dtype is None:
        dtype = np.asarray(value).dtype
    return _filled("full", shape, value, dtype, device)


def _filled(who: str, shape: Any, value: "float | int", dtype: Any,
            device: "str | Device | None") -> Tensor:
    if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):
        shape = sizes(who, shape)  # (an int is (n,); anything else but integers is refused)
    dev = get_device(device)
    # (a name, or NumPy's dtype or type: np.dtype(None) is float64, NumPy's default; the
    # device's full would take None as "the value's dtype", int64 for zeros)
    name = supported_dtype(f"{who}()", dtype)
    return Tensor(dev.full(shape, value, name), dev)
