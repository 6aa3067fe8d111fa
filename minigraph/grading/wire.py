"""How values cross the trust boundary between the grader and the sandbox: plain data only.

Both sides send each other JSON messages, each framed by its length (8 bytes, big endian).
A value is encoded as JSON where JSON suffices, and as a tagged object otherwise::

    (1, 2)             {"$tuple": [1, 2]}
    {"a": 1}           {"$dict": [["a", 1]]}          (any hashable plain key)
    {1, 2}             {"$set": [1, 2], "frozen": false}
    np.array(...)      {"$array": "<base64 of the .npy bytes>"}   (np.load(allow_pickle=False))
    np.float32(1.5)    {"$scalar": "<base64 .npy>"}
    mg.tensor(...)     {"$tensor": "<base64 .npy>", "device": "cpu:1"}
    np.dtype("f4")     {"$dtype": "float32"}
    ValueError("m")    {"$exception": "ValueError", "message": "m"}
    anything else      {"$ref": 7, "owner": "sandbox", "type": "Dual", "callable": true}

Why not pickle: unpickling runs code chosen by whoever wrote the bytes, so one pickle from
the student's side would run the student's code inside the grader. NumPy's .npy format
with ``allow_pickle=False`` carries dtype, shape and bytes and nothing executable; object
arrays are refused. A ``$ref`` is a *handle*: the object stays in the process that owns it,
and the other side can only ask that process to act on it (call it, read an attribute,
apply ``+``); see :mod:`minigraph.grading.proxy`. Decoding never imports or calls anything
named by the message; exception types are rebuilt only from a fixed list of built-ins.
"""

from __future__ import annotations

import base64
import builtins
import io
import json
import os
import select
import struct
import time
from typing import Any, Callable

import numpy as np

#: the largest message either side accepts (a bigger one is an error, not a hang). The
#: grader parses what the sandbox sends, outside the sandbox's memory limit, and JSON of
#: nested empty lists ("[],[],...") takes about 26 times its size in Python objects: 32 MB
#: bounds that near 1 GB, and holds any answer an exercise gives (arrays travel as .npy
#: bytes in base64: 24 MB of them)
MAX_MESSAGE = 32 * 1024 * 1024
_HEADER = struct.Struct(">Q")
#: the most items (zero sizes of the shape counted as 1) an array with no data may have
MAX_EMPTY_ITEMS = 1 << 16
#: the deepest nesting of lists, tuples, dicts and sets a value may have: encode and
#: decode recurse once per level, and the interpreter's own limit would end them with
#: a bare RecursionError
MAX_DEPTH = 100

#: exception types rebuilt as themselves; any other arrives as RuntimeError
SAFE_EXCEPTIONS = {name: getattr(builtins, name) for name in (
    "ArithmeticError", "AssertionError", "AttributeError", "BufferError", "EOFError",
    "Exception", "FloatingPointError", "IndexError", "KeyError", "LookupError",
    "MemoryError", "NameError", "NotImplementedError", "OSError", "OverflowError",
    "RecursionError", "RuntimeError", "StopIteration", "TimeoutError", "TypeError",
    "UnboundLocalError", "ValueError", "ZeroDivisionError", "PermissionError",
    "FileNotFoundError", "ImportError", "ModuleNotFoundError", "SyntaxError",
    "UnicodeError", "IndentationError")}


class WireError(Exception):
    """A message that breaks the protocol (too big, not JSON, a bad tag)."""


class ChannelClosed(WireError):
    """The other side closed its end (it exited or was killed)."""


class ChannelTimeout(WireError):
    """No message arrived before the deadline."""


class MessageTooLarge(WireError):
    """A message over MAX_MESSAGE, refused before a byte of it is written: the channel
    stays usable, so the side that made it can answer with this error instead."""


# -- values ---------------------------------------------------------------------------------

def _npy(array: np.ndarray) -> str:
    if array.dtype.hasobject:
        raise TypeError("arrays of Python objects cannot cross the sandbox boundary")
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _from_npy(text: str) -> np.ndarray:
    """The array of a ``$array``, ``$scalar`` or ``$tensor``, checked before it is built.

    MAX_MESSAGE bounds the bytes, not what they describe: a .npy header may announce
    10**9 rows of nothing (shape (10**9, 0)) or 10**15 items of a dtype of 0 bytes
    (``<U0``) in 200 bytes, and the grader then makes an object per row or loops per item
    when a test iterates the answer, in its own process, outside every limit. So the
    header is read first: a dtype of 0 bytes is refused, and the shape (its zero sizes
    counted as 1) may describe no more items than the bytes hold, or ``MAX_EMPTY_ITEMS``
    for an array with no data."""
    raw = base64.b64decode(text, validate=True)
    buffer = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(buffer)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}[version]
        shape, _, dtype = read_header(buffer)
    except (ValueError, KeyError) as exc:
        raise WireError(f"an array whose .npy header cannot be read: {exc}") from None
    if dtype.itemsize == 0:
        raise WireError(f"an array of dtype {dtype.str!r}, whose items have 0 bytes, "
                        "cannot cross the sandbox boundary")
    rows = 1
    for size in shape:
        rows *= max(int(size), 1)
    if rows > max(len(raw) // dtype.itemsize, MAX_EMPTY_ITEMS):
        raise WireError(f"an array of shape {tuple(shape)} and dtype {dtype.str!r} in "
                        f"{len(raw)} bytes: its shape describes more items than its data "
                        f"holds (at most {MAX_EMPTY_ITEMS} rows of nothing may cross)")
    buffer.seek(0)
    return np.load(buffer, allow_pickle=False)


def encode(value: Any, export: Callable[[Any], dict], depth: int = 0) -> Any:
    """``value`` as JSON-ready data; ``export(obj)`` makes the ``$ref`` of anything else.
    ``depth``: how deep in the value this is (over MAX_DEPTH is an error)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"the value is nested too deeply to send across the sandbox "
                         f"boundary (lists, tuples, dicts or sets more than {MAX_DEPTH} "
                         f"levels deep)")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and type(value) in (int, bool):
        return value
    if type(value) is float:
        return value
    if isinstance(value, np.ndarray):
        return {"$array": _npy(value)}
    if isinstance(value, np.generic):
        return {"$scalar": _npy(np.asarray(value))}
    if isinstance(value, np.dtype):
        return {"$dtype": value.str if value.names else value.name}
    inner = depth + 1
    if type(value) is list:
        return [encode(v, export, inner) for v in value]
    if type(value) is tuple:
        return {"$tuple": [encode(v, export, inner) for v in value]}
    if type(value) is dict:
        return {"$dict": [[encode(k, export, inner), encode(v, export, inner)]
                          for k, v in value.items()]}
    if type(value) in (set, frozenset):
        return {"$set": [encode(v, export, inner) for v in value],
                "frozen": type(value) is frozenset}
    if type(value).__name__ == "Tensor" and type(value).__module__.startswith("minigraph"):
        return {"$tensor": _npy(np.asarray(value.numpy())), "device": str(value.device.name)}
    if isinstance(value, BaseException) and type(value).__module__ == "builtins":
        return {"$exception": type(value).__name__, "message": str(value)}
    return export(value)


def decode(data: Any, resolve: Callable[[dict], Any], depth: int = 0) -> Any:
    """The value ``data`` encodes; ``resolve(ref)`` turns a ``$ref`` into an object.
    ``depth``: how deep in the value this is (over MAX_DEPTH is an error)."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if depth > MAX_DEPTH:
        raise WireError(f"a value nested too deeply (more than {MAX_DEPTH} levels)")
    inner = depth + 1
    if isinstance(data, list):
        return [decode(v, resolve, inner) for v in data]
    if not isinstance(data, dict) or len(data) == 0:
        raise WireError(f"unexpected value in a message: {type(data).__name__}")
    if "$array" in data:
        return _from_npy(data["$array"])
    if "$scalar" in data:
        return _from_npy(data["$scalar"])[()]
    if "$tuple" in data:
        return tuple(decode(v, resolve, inner) for v in data["$tuple"])
    if "$dict" in data:
        return {_hashable(decode(k, resolve, inner)): decode(v, resolve, inner)
                for k, v in data["$dict"]}
    if "$set" in data:
        items = {_hashable(decode(v, resolve, inner)) for v in data["$set"]}
        return frozenset(items) if data.get("frozen") else items
    if "$dtype" in data:
        return np.dtype(str(data["$dtype"]))
    if "$tensor" in data:
        import minigraph as mg
        return mg.tensor(_from_npy(data["$tensor"]), device=str(data["device"]))
    if "$exception" in data:
        kind = SAFE_EXCEPTIONS.get(str(data["$exception"]), RuntimeError)
        return kind(str(data.get("message", "")))
    if "$ref" in data:
        return resolve(data)
    raise WireError(f"unknown tag in a message: {sorted(data)[:3]}")


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        raise WireError(f"a dict key or set item of type {type(value).__name__} "
                        "is not hashable") from None
    return value


# -- messages -------------------------------------------------------------------------------

def send(fd: int, message: dict, deadline: float | None = None) -> None:
    """Write ``message`` on ``fd``; ChannelTimeout once ``deadline`` (monotonic) passes
    with the other side not reading (the grader's side: a sandbox that sends a request
    and never reads the answer must not block the grader in a write, where no timeout
    reaches it). With a deadline, the pipe takes at most PIPE_BUF bytes a write, which
    select's "writable" promises not to block."""
    body = json.dumps(message, separators=(",", ":")).encode("utf-8")
    if len(body) > MAX_MESSAGE:
        raise MessageTooLarge(
            f"the value is {len(body) / 2**20:.1f} MiB as a message, over the "
            f"{MAX_MESSAGE >> 20} MiB that cross between the grader and the sandbox; "
            f"return a smaller value (an array is sent with its data)")
    data = _HEADER.pack(len(body)) + body
    view = memoryview(data)
    while view:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([], [fd], [], wait)[1]:
                raise ChannelTimeout("the other side did not read before the deadline")
            written = os.write(fd, view[:select.PIPE_BUF])
        else:
            written = os.write(fd, view)
        view = view[written:]


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise ChannelTimeout("no answer before the deadline")
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise ChannelClosed("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, deadline: float | None = None) -> dict:
    """The next message on ``fd``; ChannelTimeout once ``deadline`` (monotonic) passes."""
    (length,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    if length > MAX_MESSAGE:
        raise WireError(f"a message of {length} bytes is over the {MAX_MESSAGE} byte limit")
    try:
        message = json.loads(_read_exactly(fd, length, deadline))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"a message that is not valid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise WireError("a message that is not a JSON object")
    return message
