"""One end of the request/response channel between the grader and the sandbox.

Either side may ask the other to act: the grader asks the sandbox to call the student's
``mean``; while that call runs, the student's code may call back a function the test
passed in (``forward_gradient(f, xs)`` calls the grader's ``f``), and that callback may
in turn ask the sandbox to multiply two of the student's ``Dual`` numbers. Calls nest
strictly, so one thread per side suffices: a side waiting for its answer serves the
requests that arrive meanwhile, and the answer it waits for is always the next
response. A message is a request ``{"id", "op", ...}`` or a response ``{"re": id, "ok":
value}`` / ``{"re": id, "error": {...}}``; values are encoded by :mod:`.wire`.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from minigraph.grading import wire
from minigraph.grading.messages import message_of


class RemoteError(Exception):
    """The other side answered a request with an error (carried as plain data)."""

    def __init__(self, info: dict):
        super().__init__(str(info.get("message", "")))
        self.info = info


class Peer:
    """Sends requests, serves the other side's requests while waiting for answers."""

    side = "?"  # "grader" or "sandbox": the owner named in this side's handles

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd
        self.exported: dict[int, Any] = {}     # handle id -> object this side owns
        self._ids = itertools.count(1)
        self._refs = itertools.count(1)

    # values ---------------------------------------------------------------------------

    def export(self, obj: Any) -> dict:
        ref = next(self._refs)
        self.exported[ref] = obj
        return {"$ref": ref, "owner": self.side, "type": type(obj).__name__,
                "name": str(getattr(obj, "__name__", ""))[:100], "callable": callable(obj)}

    def encode(self, value: Any) -> Any:
        return wire.encode(value, self.export)

    def decode(self, data: Any) -> Any:
        return wire.decode(data, self._resolve)

    def _resolve(self, ref: dict) -> Any:
        if ref.get("owner") == self.side:
            try:
                return self.exported[int(ref["$ref"])]
            except (KeyError, TypeError, ValueError):
                raise wire.WireError(f"unknown handle {ref.get('$ref')!r}") from None
        return self.foreign(ref)

    def foreign(self, ref: dict) -> Any:
        """A stand-in for an object the other side owns."""
        raise NotImplementedError

    # requests ---------------------------------------------------------------------------

    def receive_next(self) -> dict:
        """The next message from the other side (the grader adds its deadlines)."""
        return wire.receive(self.read_fd)

    def send(self, message: dict) -> None:
        """Write a message to the other side (the grader adds a deadline)."""
        wire.send(self.write_fd, message)

    def request(self, op: str, **fields) -> Any:
        """Ask the other side to do ``op``; serve its requests until the answer comes."""
        ident = next(self._ids)
        self.send({"id": ident, "op": op, **fields})
        while True:
            message = self.receive_next()
            if "re" in message:
                if message["re"] != ident:
                    raise wire.WireError(f"an answer to request {message['re']!r} while "
                                         f"waiting for {ident}")
                if "error" in message:
                    raise RemoteError(message["error"] if isinstance(message["error"], dict)
                                      else {"message": str(message["error"])})
                return self.decode(message.get("ok"))
            self.serve(message)

    def serve(self, message: dict) -> None:
        """Answer one request of the other side."""
        try:
            handler: Callable | None = getattr(self, "op_" + str(message.get("op")), None)
            if handler is None:
                raise wire.WireError(f"unknown request {str(message.get('op'))[:60]!r}")
            answer = {"re": message.get("id"), "ok": self.encode(handler(message))}
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure becomes an answer
            answer = {"re": message.get("id"), "error": self.error_info(exc)}
        try:
            self.send(answer)
        except wire.MessageTooLarge as exc:  # (nothing was written: the error goes instead)
            self.send({"re": message.get("id"), "error": self.error_info(exc)})

    def error_info(self, exc: BaseException) -> dict:
        return {"type": type(exc).__name__, "message": message_of(exc)}
