"""Interchange: values in from other libraries (DLPack), and state dicts to files and back.

* ``mg.from_dlpack(x)`` makes a tensor from any array that speaks DLPack, the protocol
  NumPy (>= 2), PyTorch, CuPy and JAX share: ``mg.from_dlpack(torch_tensor)``. The other
  direction is ``Tensor.__dlpack__`` (tensor.py): ``np.from_dlpack(t)``,
  ``torch.from_dlpack(t)``.
* ``mg.save(model.state_dict(), "model.npz")`` and ``mg.load("model.npz")`` keep a state
  dict in a NumPy ``.npz`` archive: a zip of ``.npy`` files, one per key. Loading never
  unpickles (``allow_pickle=False``), so a file from someone else cannot run code here,
  which a pickle (and hence ``torch.load`` without ``weights_only``) can.

Who owns the memory is said in each docstring. In short: DLPack *shares* memory (that is
its purpose), so ``Tensor.__dlpack__`` hands out the tensor's own buffer, as ``t.numpy()``
does; ``mg.from_dlpack`` *copies* by default, so that an in-place update in minigraph
(``x -= y``, an optimizer step) never silently writes into another library's array;
``copy=False`` shares, when you want that and know it.
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
import zlib
from collections import OrderedDict
from typing import IO, Any, Mapping

import numpy as np  # the archive format is NumPy's

from .device import Device, get_device
from .errors import DeviceError, DTypeError, MinigraphError
from .files import write_atomically
from .ops.shape_rules import DTYPES
from .tensor import Tensor, host_values, shared

# DLPack's device types (dlpack.h, DLDeviceType) that minigraph has devices for.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


class ArchiveError(MinigraphError, ValueError):
    """A file ``mg.load`` refuses, or a state dict ``mg.save`` cannot store."""


# -- DLPack ----------------------------------------------------------------------------------

def from_dlpack(x: Any, device: "str | Device | None" = None, copy: bool = True) -> Tensor:
    """A tensor with the values of ``x``, any object with ``__dlpack__`` (a PyTorch
    tensor, a NumPy or CuPy array, a minigraph tensor).

    The tensor is made on the device where ``x``'s memory is (CPU memory on ``"cpu"``,
    GPU N on ``"cuda:N"``; a minigraph tensor's own device, ``"cpu:1"`` say), or on
    ``device`` if given (then the values are moved there, which is always a copy). Its
    dtype is ``x``'s; float32, float64, int64, int32 and bool are supported. It is a
    leaf that does not require a gradient.

    Memory: with ``copy=True`` (the default) the tensor gets its own copy of the values,
    so ``x`` and the tensor are independent afterwards: ``t -= 1`` leaves ``x`` as it was.
    (PyTorch's ``torch.from_dlpack`` shares instead.) With ``copy=False`` the tensor
    shares ``x``'s memory, without a copy: writing into either changes both, and the
    bytes are not counted in the device's memory counters (``x``'s library owns them).
    A PyTorch view marked as negated (``z.conj().imag``) is copied with its sign applied;
    with ``copy=False`` it is refused (its memory holds the negatives).
    """
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise TypeError(f"from_dlpack: a {type(x).__name__} has no __dlpack__ method; use "
                        f"mg.tensor(...) for Python data, or pass an array of a library "
                        f"that supports DLPack (NumPy >= 2, PyTorch, CuPy)")
    if isinstance(x, Tensor):
        # DLPack only says "CPU memory", which cpu:1 is too: a minigraph tensor says
        # which device it is on, and its values stay there (as torch.from_dlpack keeps
        # cuda:1), so that copy=False never puts cpu:1's memory in a "cpu" tensor
        source = x.device
    else:
        kind, index = x.__dlpack_device__()
        source = _device_of(int(kind), int(index), type(x).__name__)
    if copy and isinstance(x, Tensor):  # (its values, copied below: no write reaches x, so
        x = x.detach()                  # a tensor that requires a gradient may export them)
    # PyTorch marks some views as negated (z.conj().imag) instead of negating their memory,
    # and its __dlpack__ exports the memory without the sign: read as it is, every value
    # would come out negated. (Asked by name, so minigraph need not import torch.)
    if callable(getattr(x, "is_neg", None)) and x.is_neg():
        if not copy:
            what = f"{type(x).__module__}.{type(x).__qualname__}"  # torch.Tensor
            raise TypeError(f"from_dlpack: the {what} is a negated view (its is_neg() is "
                            f"True): its memory holds the values' negatives, so it cannot "
                            f"be shared; use copy=True, or x.resolve_neg()")
        x = x.resolve_neg()  # a copy with the sign applied (this one is copied anyway)
    try:
        data = source.xp.from_dlpack(x)  # shares x's memory (DLPack's contract)
    except (BufferError, TypeError, RuntimeError, ValueError) as exc:
        raise TypeError(f"from_dlpack: cannot read the {type(x).__name__} through DLPack: "
                        f"{exc}") from exc
    name = source.dtype_name(data.dtype)
    if name not in DTYPES:
        raise DTypeError(f"from_dlpack: dtype {name} is not supported; convert the "
                         f"{type(x).__name__} to one of {', '.join(DTYPES)} first")
    target = source if device is None else get_device(device)
    if target is source and not copy:
        # The tape's write guard keys shared memory by the array that owns it (tensor.py,
        # write_target); the array from_dlpack made owns a capsule of its own, so a write
        # through it went unseen for x. Share x's own array (a minigraph tensor's, as
        # x.detach() does), or a view of it (a NumPy array's), instead.
        if isinstance(x, Tensor):
            return shared(x.data, source)  # (its bytes are counted once, for x)
        return Tensor(x[...] if isinstance(x, np.ndarray) else data, source)
    if target is not source and not copy:
        raise DeviceError(f"from_dlpack: copy=False shares memory, but the values are on "
                          f"{source.name} and device={target.name!r} was asked for; moving "
                          f"them is a copy (use copy=True)")
    return Tensor(target.copy_from(data, source), target)


def _device_of(kind: int, index: int, what: str) -> Device:
    """The minigraph device for DLPack's (device type, index)."""
    if kind in (_DL_CPU, _DL_CUDA_HOST):  # host memory (pinned host memory too)
        return get_device("cpu")
    if kind in (_DL_CUDA, _DL_CUDA_MANAGED):
        return get_device(f"cuda:{index}")  # explains what is missing if CuPy is absent
    raise DeviceError(f"from_dlpack: the {what} lives on DLPack device type {kind} "
                      f"(index {index}), which minigraph has no device for; minigraph "
                      f"reads CPU and CUDA memory. Move it to the CPU first")


# -- files -----------------------------------------------------------------------------------

def save(state_dict: Mapping[str, Any], path: "str | os.PathLike[str]") -> None:
    """Write a dict of name -> tensor (or NumPy array) to ``path``, a NumPy ``.npz`` archive.

    The file is exactly ``path`` (no ``.npz`` is added). Keys are kept in order, values
    with their dtype and shape (tensors are copied to the host). Everything is checked
    first: a value that is not a tensor or an array, a dtype minigraph cannot load back
    (float16, object, ...), or a key that cannot be a name in the archive raises, and
    nothing is written. The archive is written whole or not at all (``files.py``): a
    failure (a full disk, an interrupt) leaves an existing file as it was, never
    half-written; otherwise it is written as ``open(path, "wb")`` writes, through a link,
    with ``open``'s mode for a new file and the old mode for a replaced one.

    ``np.load(path)`` reads the file too; PyTorch users get ``torch.from_numpy`` of each.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"save: expected a dict of name -> tensor (model.state_dict()), got "
                        f"a {type(state_dict).__name__}")
    arrays = [(_entry_name(key), _host_array(key, value)) for key, value in state_dict.items()]

    def write(f: IO[bytes]) -> None:
        # What np.savez does, written out: np.savez(file, **dict) would take a key named
        # "file" or "allow_pickle" for its own argument.
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
            for entry, array in arrays:
                with z.open(entry, "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)

    write_atomically(path, write)


def _entry_name(key: Any) -> str:
    """The archive member for ``key`` (``key + ".npy"``), checked to come back as ``key``."""
    if not isinstance(key, str):
        raise TypeError(f"save: keys must be strings, got {key!r} ({type(key).__name__})")
    entry = key + ".npy"
    # zipfile rewrites some names (it cuts at a NUL, turns the OS separator into "/"):
    # such a key would come back as another key, so it is refused.
    if not key or zipfile.ZipInfo(entry).filename != entry:
        raise ArchiveError(f"save: the key {key!r} cannot be stored in an .npz archive "
                           f"(empty, or with a character a zip name cannot hold, such as NUL); "
                           f"rename it")
    # A zip stores a name as UTF-8 with a 2-byte length: refused here, before anything is
    # written, rather than half-way through the archive.
    try:
        size = len(entry.encode("utf-8"))
    except UnicodeEncodeError:  # (a lone surrogate, from a badly decoded file name)
        raise ArchiveError(f"save: the key {key!r} is not valid Unicode (UTF-8 cannot "
                           f"encode it), so a zip name cannot hold it; rename it") from None
    if size > 0xFFFF:
        raise ArchiveError(f"save: the key {key[:20]!r}... is {size} bytes long in UTF-8; a "
                           f"zip name holds at most 65535; use a shorter key")
    return entry


def _host_array(key: str, value: Any) -> np.ndarray:
    """``value`` as a host NumPy array that ``load`` will give back unchanged."""
    if isinstance(value, Tensor):
        array = np.asarray(host_values(value))
    elif isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
    else:
        kind = type(value)  # (by its module too: a torch.Tensor is not a minigraph Tensor)
        what = kind.__qualname__ if kind.__module__ == "builtins" else \
            f"{kind.__module__}.{kind.__qualname__}"
        raise TypeError(f"save: the value for {key!r} is a {what}; only minigraph tensors "
                        f"and NumPy arrays are stored: convert it first (mg.from_dlpack(value) "
                        f"for another library's array, mg.tensor(value) for Python data)")
    if array.dtype.hasobject or array.dtype.name not in DTYPES:
        raise DTypeError(f"save: the value for {key!r} has dtype {array.dtype}, which "
                         f"mg.load cannot give back; use one of {', '.join(DTYPES)}")
    return array


# What a damaged zip can raise from zipfile (a bad CRC, a short file, a bad length field,
# an unknown compression method, a seek to a negative offset): all become ArchiveError.
_DAMAGED = (zipfile.BadZipFile, EOFError, struct.error, zlib.error, RuntimeError, OSError,
            ValueError)


def load(path: "str | os.PathLike[str]",
         device: "str | Device | None" = "cpu") -> "OrderedDict[str, Tensor]":
    """Read an archive written by ``mg.save`` (or ``np.savez``): an ordered dict of tensors.

    Keys come in the order they were saved; each tensor is a new leaf on ``device``
    (``"cpu"`` unless given; ``None`` means the current default device), with its own
    memory. Nothing is ever unpickled: an archive holding an object array (which only a
    pickle can give back, and a pickle can run any code) is refused, naming the key,
    and so is a file that is not an ``.npz`` archive.

    A damaged file is refused, never loaded wrong: each entry is read to its end, where
    zipfile checks its CRC-32 (a checksum of the bytes, which catches a flipped bit in a
    header that would otherwise give another shape or dtype), and the archive must hold
    as many entries as its end record says. Every such refusal is an :class:`ArchiveError`
    naming the file and, where it is known, the entry.
    """
    dev = get_device(device)
    where = repr(os.fspath(path))
    out: OrderedDict[str, Tensor] = OrderedDict()
    with open(os.fspath(path), "rb") as f:  # (a missing file: the OS's FileNotFoundError)
        if f.read(6) == b"\x93NUMPY":  # the magic string of one .npy file
            raise ArchiveError(f"load: {where} holds a single array (.npy), not an .npz "
                               f"archive of named arrays; use np.load for it")
        try:
            f.seek(0)
            archive = zipfile.ZipFile(f)
        except _DAMAGED as exc:
            raise ArchiveError(f"load: {where} is not an .npz archive that can be read "
                               f"without unpickling, or its zip directory is damaged "
                               f"({type(exc).__name__}: {exc})") from None
        with archive:
            # zipfile reads the central directory without checking that it found as many
            # entries as the end record declares: a corrupted length there hides entries.
            # (_EndRecData is zipfile's own reader of that record; it knows zip64. It is
            # private, so typeshed does not list it.)
            members = archive.infolist()
            end_record = zipfile._EndRecData(f)  # type: ignore[attr-defined]
            declared = end_record[zipfile._ECD_ENTRIES_TOTAL]  # type: ignore[attr-defined]
            if declared != len(members):
                raise ArchiveError(f"load: {where} is damaged: its end record says it has "
                                   f"{declared} entries, its directory lists {len(members)}")
            for member in members:
                # Each member by its own name: archive[key] finds the member "a.npy" for
                # the key "a.npy" (which holds the key "a") before "a.npy.npy".
                name = member.filename
                key = name[:-len(".npy")] if name.endswith(".npy") else name
                if key == name:  # a member that is not a .npy file
                    raise ArchiveError(f"load: {where}: the entry {key!r} is not a NumPy "
                                       f"array (.npy)")
                try:
                    data = archive.read(member)  # to its end: zipfile checks the CRC-32
                except _DAMAGED as exc:
                    raise ArchiveError(f"load: {where}: the entry {key!r} is damaged "
                                       f"({type(exc).__name__}: {exc})") from None
                out[key] = Tensor(dev.asarray(_npy_array(where, key, data), copy=True), dev)
    return out


def _npy_array(where: str, key: str, data: bytes) -> np.ndarray:
    """The array in ``data``, the bytes of one ``.npy`` file, which it must fill exactly."""
    stream = io.BytesIO(data)
    try:
        array = np.lib.format.read_array(stream, allow_pickle=False)
    except (ValueError, TypeError) as exc:  # an object array (only a pickle reads one), a
        # header that does not parse, data shorter than the header says
        raise ArchiveError(f"load: {where}: the entry {key!r} is not an array that can be "
                           f"read without unpickling; refused ({exc})") from None
    if stream.tell() != len(data):  # (a header that says fewer elements than are there)
        raise ArchiveError(f"load: {where}: the entry {key!r} has "
                           f"{len(data) - stream.tell()} bytes after the data its header "
                           f"describes (shape {array.shape}, {array.dtype}); refused")
    if not array.dtype.isnative:  # a big-endian file, on a little-endian machine
        array = array.astype(array.dtype.newbyteorder("="))
    if array.dtype.name not in DTYPES:
        raise DTypeError(f"load: {where}: the entry {key!r} has dtype {array.dtype}; "
                         f"minigraph supports {', '.join(DTYPES)}")
    return array
