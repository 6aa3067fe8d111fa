"""Devices: where a tensor's memory lives and which array library computes on it.

A :class:`Device` pairs a name (``"cpu"``, ``"cpu:1"``, ``"cuda:0"``) with an *array
namespace* ``xp`` (the module whose functions compute on its arrays) and the native
device object of that namespace. Kernels are written against ``xp``, never against
``numpy`` directly, so one kernel runs on NumPy, on CuPy, and on array-api-strict's
fake devices (which the test suite uses to prove that no code mixes devices).

* ``cpu`` is NumPy (through array-api-compat, which fills NumPy's gaps in the Array API
  standard).
* ``cpu:1`` ... ``cpu:N`` are *virtual* CPU devices: NumPy arrays too, but minigraph keeps
  them apart. An eager op refuses tensors of two devices, exactly as it would for a CPU
  and a GPU, and each device counts its own memory. This lets the multi-device chapters
  run on a laptop. N defaults to 3 (``MINIGRAPH_VIRTUAL_CPUS`` or
  :func:`set_virtual_cpus` changes it).
* ``cuda:N`` is CuPy on GPU N, available where CuPy imports and sees a GPU.
* ``rank:R/cpu``, ``rank:R/cpu:1``, ``rank:R/cuda:0`` are devices of MPI rank R, for
  graphs that span processes (``mg.distributed``, chapter 06 section 6). Every rank
  builds the same graph, so every rank knows every device by the same name; on rank R
  the device ``rank:R/x`` computes here (a device of its own, like a virtual CPU, with
  ``x``'s array library), on the other ranks it is *remote*: it can hold graph nodes,
  but no eager tensor is made on it, because its memory is in another process. An
  unprefixed name (``"cpu"``) is always this process's device.

The memory counters are honest but simple: bytes of live eager tensors that own their
memory (counted when such a tensor is made, uncounted when Python frees it) and the
peak of that figure. A view (a reshape, a transpose, ``detach``) counts nothing, so a
view that outlives the tensor it views is not counted.
"""

from __future__ import annotations

import os
import threading
from contextlib import nullcontext
from typing import Any

import numpy as np  # only for host (NumPy) conversions: the host format of .numpy()
from array_api_compat import is_numpy_namespace, to_device

from .errors import DeviceError, DTypeError

DTYPE_NAMES = ("float32", "float64", "int64", "int32", "bool")
ITEMSIZE = {"float32": 4, "float64": 8, "int64": 8, "int32": 4, "bool": 1}


def nbytes(value: Any) -> int:
    """Bytes of the elements of an array, a tensor or a graph node: ``.nbytes`` where the
    library has it (NumPy, CuPy), else size times item size. Array API arrays need not
    have ``.nbytes`` (array-api-strict's have not): reading it with a default of 0 made
    every memory counter on such a device read 0. The one place this is computed."""
    n = getattr(value, "nbytes", None)
    if n is not None:
        return int(n)
    if not hasattr(value, "shape"):  # a Python number (a rendezvous may carry one)
        return 0
    dtype = str(value.dtype).rsplit(".", 1)[-1]  # ("array_api_strict.float64", "float64")
    size = 1
    for d in value.shape:
        size *= d
    # (a dtype minigraph refuses, uint8 say, is counted too: tensor() refuses it after
    # the Tensor is made, by name; NumPy knows the item size of every such name)
    return size * (ITEMSIZE.get(dtype) or np.dtype(dtype).itemsize)


class Device:
    """A place for tensors: a name, an array namespace ``xp`` and its native device.

    ``with mg.device("cpu:1"):`` makes it the default device for new tensors (and, in
    graph mode, the placement of new nodes).
    """

    __slots__ = ("name", "xp", "native", "context", "supports_out", "live_bytes", "peak_bytes",
                 "_dtypes", "_names", "_numpy", "rank", "remote")

    def __init__(self, name: str, xp: Any, native: Any = None, rank: int | None = None,
                 remote: bool = False):
        self.name = name
        # The MPI rank of a ``rank:R/...`` device (None for an unprefixed name), and
        # whether that rank is another process (then this object only names it).
        self.rank = rank
        self.remote = remote
        self.xp = xp
        self.native = native
        # CuPy allocates and launches kernels on the *current* GPU, so work for cuda:N
        # runs inside ``with cupy.cuda.Device(N):``. Other devices need no context.
        self.context = native if hasattr(native, "__enter__") else None
        # NumPy's and CuPy's functions are ufuncs that can write into a given buffer
        # (out=...), which lets the runtime recycle memory; the Array API has no out=.
        self.supports_out = hasattr(getattr(xp, "add", None), "reduce")
        # array-api-compat's NumPy namespace wraps asarray, full ... in Python functions
        # that cost 1-3 µs each; for NumPy devices we call NumPy itself (same results).
        self._numpy = is_numpy_namespace(xp)
        self.live_bytes = 0
        self.peak_bytes = 0
        # dtype name -> the namespace's dtype object, and back.
        self._dtypes = {n: getattr(xp, n) for n in DTYPE_NAMES if hasattr(xp, n)}
        # An array's ``.dtype`` may be another object than ``xp.float64`` (NumPy gives
        # ``dtype('float64')``), so both spellings map back to the name.
        self._names: dict[Any, str] = {}
        for n, dt in self._dtypes.items():
            self._names[dt] = n
            self._names[xp.zeros((0,), dtype=dt).dtype] = n

    # -- arrays on this device -------------------------------------------------------
    def dtype(self, name: str) -> Any:
        """The namespace's dtype object for a dtype name such as ``"float32"``."""
        try:
            return self._dtypes[name]
        except KeyError:  # (a DTypeError: still the TypeError NumPy users catch)
            raise DTypeError(
                f"unknown dtype {name!r}; minigraph knows {', '.join(self._dtypes)}"
            ) from None

    def dtype_name(self, native_dtype: Any) -> str:
        """The name (``"float64"``) of one of the namespace's dtype objects."""
        name = self._names.get(native_dtype)
        return name if name is not None else str(native_dtype)

    def asarray(self, value: Any, dtype: str | None = None, copy: bool | None = None) -> Any:
        """Make an array on this device from Python data, a NumPy array or a scalar."""
        if self.remote:
            self._check_remote_use()
        dt = None if dtype is None else self.dtype(dtype)
        if self._numpy and copy is not False:  # (np.array copies; np.asarray when it must)
            return np.array(value, dtype=dt) if copy else np.asarray(value, dtype=dt)
        if self.native is None:
            return self.xp.asarray(value, dtype=dt, copy=copy)
        with self.context or nullcontext():
            return self.xp.asarray(value, dtype=dt, device=self.native, copy=copy)

    def full(self, shape: "tuple[int, ...] | int", value: "float | int", dtype: Any) -> Any:
        """An array of ``shape`` filled with ``value``; ``dtype`` is a name or a dtype object."""
        if self.remote:
            self._check_remote_use()
        dt = self.dtype(dtype) if isinstance(dtype, str) else dtype
        if self._numpy:  # (np.array makes a 0-d array in C; np.full is Python, 1 µs)
            return np.array(value, dtype=dt) if shape == () else np.full(shape, value, dtype=dt)
        if self.native is None:
            return self.xp.full(shape, value, dtype=dt)
        with self.context or nullcontext():
            return self.xp.full(shape, value, dtype=dt, device=self.native)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised C-ordered array of ``shape`` (for a kernel's ``out=``)."""
        dt = self.dtype(dtype) if isinstance(dtype, str) else dtype
        if self._numpy:
            return np.empty(shape, dtype=dt)
        if self.native is None:
            return self.xp.empty(shape, dtype=dt)
        with self.context or nullcontext():
            return self.xp.empty(shape, dtype=dt, device=self.native)

    def copy_from(self, array: Any, source: "Device") -> Any:
        """A real copy of ``array`` (living on ``source``) into this device's memory.

        Within one array library the library moves it (``to_device``: a GPU-to-GPU copy
        for CuPy); between libraries it goes through a host NumPy array.
        """
        if source.xp is not self.xp:
            return self.asarray(source.to_numpy(array))
        if self.native is None:  # NumPy to NumPy: virtual CPU devices
            return self.xp.asarray(array, copy=True)
        with self.context or nullcontext():
            moved = to_device(array, self.native)
            return self.xp.asarray(moved, copy=True) if moved is array else moved

    def copy_sent(self, array: Any, source: "Device") -> Any:
        """What a Send from ``source`` hands this device's Recv: :meth:`copy_from`, and
        between virtual CPU devices :func:`copy_keeping_layout`, a copy that kernels walk
        as they walk the original, so that a partitioned run gives the serial run's bits.
        (Only a Send's: the copy may be a read-only broadcast, which a copy that someone
        writes into, a clone or an optimiser's buffer, must not be.)"""
        if self.native is None and source.xp is self.xp and type(array) is np.ndarray:
            return copy_keeping_layout(array)
        return self.copy_from(array, source)

    def _check_remote_use(self) -> None:
        """An array on another rank's device is only a value a graph holds (a constant
        built inside ``with mg.Graph():``); an eager tensor there would compute here while
        claiming to be there, so it is refused."""
        from .graph.graph import _defaults

        if not _defaults.graphs:
            raise self._remote_error("make an eager tensor")

    def _remote_error(self, what: str) -> DeviceError:
        from . import distributed

        return DeviceError(
            f"cannot {what} on {self.name}: that device belongs to rank {self.rank}, and "
            f"this process is rank {distributed.rank_for_names()}. Eager tensors live in "
            f"the process that computes them; build a graph with `with mg.device("
            f"{self.name!r}):` and run it with mg.Session(g).run(...) on every rank")

    def to_numpy(self, array: Any) -> np.ndarray:
        """Copy an array of this device to a host NumPy array."""
        if isinstance(array, np.ndarray):
            return array
        if hasattr(array, "get"):  # CuPy: device-to-host copy
            return array.get()
        if hasattr(array, "_array"):  # array-api-strict wraps a NumPy array
            return np.asarray(array._array)
        return np.asarray(array)

    def synchronize(self) -> None:
        """Wait until the device has finished the work queued on it so far.

        A GPU runs kernels asynchronously (chapter 01, section 7): time GPU work between
        two calls of this. CuPy's ``Device.synchronize`` waits for every stream of the
        GPU, PyTorch's included. CPU devices compute before an operation returns, so
        for them it returns at once.
        """
        if hasattr(self.native, "synchronize"):
            self.native.synchronize()

    # -- memory accounting (Tensor.__init__ and __del__ update live_bytes) ---------------
    def reset_peak(self) -> None:
        """Start a new peak measurement from the bytes alive now."""
        self.peak_bytes = self.live_bytes

    # -- the default-device scope --------------------------------------------------------
    def __enter__(self) -> "Device":
        _scope.stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _scope.stack.pop()

    def __repr__(self) -> str:
        return f"device({self.name!r})"

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.name == other
        return self is other

    def __hash__(self) -> int:
        return hash(self.name)


# ----------------------------------------------------------------------------------------
# The registry of devices
# ----------------------------------------------------------------------------------------

_registry: dict[str, Device] = {}
_virtual_cpus = int(os.environ.get("MINIGRAPH_VIRTUAL_CPUS", "3"))


def copy_keeping_layout(array: np.ndarray) -> np.ndarray:
    """A copy of a NumPy array that NumPy's kernels walk as they walk the original.

    A kernel's bits can depend on its inputs' layout: ``sum`` adds in memory order, and
    an elementwise op lays its result out after its inputs' strides, in which a broadcast
    input (stride 0) has no say. ``np.array(x, copy=True)`` keeps the order of the axes
    but fills a broadcast view in (``mg.add_n`` of a broadcast and a transposed value then
    came out C-ordered instead of Fortran-ordered) and turns a reversed axis forward. So
    a Send between virtual CPU devices copies only the distinct elements (one along a
    broadcast axis, a reversed axis read forward) and puts the same view back on the copy:
    a partitioned run then gives the serial run's bits (``minigraph.fuzz``'s dags).
    """
    strides = [s if n > 1 else 1 for s, n in zip(array.strides, array.shape)]  # (an axis
    if array.size == 0 or all(s > 0 for s in strides):  # of length 1 is walked alike)
        return np.array(array, copy=True)  # (order "K": the axes keep their order)
    index = tuple(slice(0, 1) if s == 0 else slice(None, None, -1) if s < 0 else slice(None)
                  for s in strides)
    copy = np.array(array[index], copy=True)[tuple(  # (a reversed axis reversed again)
        slice(None, None, -1) if s < 0 else slice(None) for s in strides)]
    return np.broadcast_to(copy, array.shape) if 0 in strides else copy


class _Scope(threading.local):
    def __init__(self) -> None:
        self.stack: list[Device] = []


_scope = _Scope()


def _numpy_namespace() -> Any:
    """NumPy's namespace as array-api-compat completes it to the Array API standard."""
    from array_api_compat import array_namespace

    return array_namespace(np.empty(0))


def _make_cpus() -> None:
    xp = _numpy_namespace()
    for name in ["cpu"] + [f"cpu:{i}" for i in range(1, _virtual_cpus + 1)]:
        if name not in _registry:
            # a name that comes back gets its old Device: tensors made on it before still
            # meet new ones there, and their bytes stay on the counters that are read
            retired = _retired_cpus.pop(name, None)
            _registry[name] = retired if retired is not None else Device(name, xp)


# Virtual CPU devices that set_virtual_cpus took out of the registry, kept by name: a
# tensor made there before may still be alive, and ``cpu:2`` must stay one device.
_retired_cpus: dict[str, Device] = {}


def set_virtual_cpus(n: int) -> None:
    """Offer ``n`` virtual CPU devices ``cpu:1`` ... ``cpu:n`` (default 3).

    A device taken away (``cpu:3`` after ``set_virtual_cpus(2)``) can no longer be named,
    but tensors already on it keep working; if it comes back it is the same device.
    """
    global _virtual_cpus
    # checked before anything changes, so that a refused call leaves the devices as they were
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"set_virtual_cpus: n must be an int, got {type(n).__name__} {n!r}")
    if n < 0:
        raise ValueError(f"set_virtual_cpus: n must be >= 0, got {n}")
    # (the virtual ones, cpu:N: a device registered as "cpu:fast" is none of them)
    for name in [k for k in _registry if k[:4] == "cpu:" and k[4:].isdigit() and int(k[4:]) > n]:
        _retired_cpus[name] = _registry.pop(name)
    _virtual_cpus = int(n)
    _make_cpus()


def register_device(name: str, xp: Any, native: Any = None) -> Device:
    """Add (or replace) a device backed by any Array API namespace.

    The test suite uses it to put array-api-strict's fake devices behind minigraph's
    device names, so that an op that mixes devices raises instead of silently working.
    """
    dev = Device(name, xp, native)
    _registry[name] = dev
    _retired_cpus.pop(name, None)  # (the name is this device's now, should it go and come back)
    return dev


def _cuda_device(name: str) -> Device:
    """Make ``cuda:N`` from CuPy, or explain precisely what is missing."""
    index = name.split(":", 1)[1] if ":" in name else "0"
    if not index.isdigit():
        raise DeviceError(f"bad device name {name!r}: expected 'cuda:N' with N a number")
    try:
        import cupy
    except ImportError:
        raise DeviceError(
            f"device {name!r} needs CuPy, which is not installed: "
            "install it with `pip install -e '.[gpu]'` (CuPy for CUDA 12), "
            f"or use one of {devices()}"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver missing or broken
        raise DeviceError(f"device {name!r}: CuPy is installed but CUDA says: {exc}") from None
    if int(index) >= count:
        raise DeviceError(f"device {name!r}: this machine has {count} GPU(s)")
    from array_api_compat import array_namespace

    with cupy.cuda.Device(int(index)):
        xp = array_namespace(cupy.empty(0))
    return Device(f"cuda:{index}", xp, cupy.cuda.Device(int(index)))


def get_device(spec: "str | Device | None" = None) -> Device:
    """The :class:`Device` for a name, or the current default device for ``None``."""
    if spec is None:
        return _scope.stack[-1] if _scope.stack else _registry["cpu"]
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):  # (a list would reach the dict lookup: "unhashable type")
        raise DeviceError(f"unknown device {spec!r}: a device is a name (a str) or a Device; "
                          f"known devices: {', '.join(devices())}")
    dev = _registry.get(spec)
    if dev is not None:
        return dev
    if isinstance(spec, str) and spec.startswith("cuda"):
        dev = _cuda_device(spec)
        _registry[dev.name] = dev
        return dev
    if isinstance(spec, str) and spec.startswith("rank:"):
        dev = _rank_device(spec)
        _registry[dev.name] = dev
        return dev
    raise DeviceError(f"unknown device {spec!r}; known devices: {', '.join(devices())}")


def _rank_device(spec: str) -> Device:
    """``rank:R/x``: a device of this process (R is this rank) or a remote one's name."""
    head, _, local = spec.partition("/")
    number = head[len("rank:"):]
    kind, _, index = local.partition(":")
    if not number.isdigit() or kind not in ("cpu", "cuda") or not (index == "" or index.isdigit()):
        raise DeviceError(f"bad device name {spec!r}: expected 'rank:R/cpu', 'rank:R/cpu:N' "
                          f"or 'rank:R/cuda:N' with R an MPI rank (0, 1, ...)")
    from . import distributed

    rank, name = int(number), f"rank:{int(number)}/{local}"
    if rank == distributed.rank_for_names():
        base = get_device(local)  # this rank's own device: it must exist here
        return Device(name, base.xp, base.native, rank=rank)
    # Another process's device: only its name is known here. Its array namespace is
    # NumPy's, which is all graph building needs (dtype names, host copies of constants).
    return Device(name, _numpy_namespace(), None, rank=rank, remote=True)


def scoped_device() -> Device | None:
    """The device of the innermost ``with mg.device(...)`` block, or None outside any."""
    return _scope.stack[-1] if _scope.stack else None


def device(name: "str | Device") -> Device:
    """The device called ``name``; use it as ``with mg.device("cpu:1"): ...``."""
    return get_device(name)


def cuda_available() -> bool:
    """True where CuPy imports and sees at least one GPU."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def devices() -> list[str]:
    """Names of the devices available here, e.g. ``["cpu", "cpu:1", ..., "cuda:0"]``."""
    names = set(_registry)  # (the devices made so far; the order is decided below)
    if cuda_available():
        import cupy

        names |= {f"cuda:{i}" for i in range(cupy.cuda.runtime.getDeviceCount())}
    return sorted(names, key=_listing_order)


def _listing_order(name: str) -> tuple[bool, str, int]:
    """``cpu``, ``cpu:1``, ``cpu:2``, ..., then the other kinds, each by its index (10 after 9)."""
    kind, _, index = name.partition(":")
    return kind != "cpu", kind, int(index) if index.isdigit() else -1


_make_cpus()
