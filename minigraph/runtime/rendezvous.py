"""The rendezvous: where a Send leaves a tensor and the matching Recv picks it up [3.1.4].

Each transfer has a key, ``"send_device;recv_device;tensor_name"`` (TensorFlow's
rendezvous key, minus the incarnation and frame fields it needs for distributed runs and
loops), with ``^`` in front for a control edge. ``send`` stores the value under the key;
``recv`` hands it to a callback at once if it is there, or as soon as it arrives. A Recv
therefore never blocks a thread: the executor of its device keeps running the other
ready nodes meanwhile. Blocking would deadlock as soon as two devices wait on each other.

``abort(error)`` wakes everybody with the error: when one device's executor fails, the
others stop instead of waiting forever for a tensor that will never come.

Across MPI ranks the same table has a subclass, ``mpi_run.MPIRendezvous``, whose
``send`` of a key bound for another rank posts an MPI message instead, and whose
arrivals come from MPI; the executors do not see the difference.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ..device import nbytes

Callback = Callable[[Any, BaseException | None], None]


def make_key(send_device: str, recv_device: str, tensor_name: str,
             control: bool = False) -> str:
    """A control edge's key starts with ``^`` (TensorFlow's mark of a control input): a
    data edge's starts with a device name, which never does, whatever the tensor's name
    (a node may be called ``"a/control"``, the name of ``a``'s control edge)."""
    return f"{'^' if control else ''}{send_device};{recv_device};{tensor_name}"


class Rendezvous:
    """An in-process table of tensors in flight between device executors."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, Any] = {}
        self._waiting: dict[str, list[Callback]] = {}
        self.error: BaseException | None = None
        self.sent_bytes = 0  # what crossed devices in this run

    def send(self, key: str, value: Any) -> None:
        self._put(key, value)

    def _put(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key`` and hand it to whoever waits for it."""
        with self._lock:
            if key in self._values:
                raise RuntimeError(f"rendezvous: {key!r} was sent twice in one run")
            self._values[key] = value
            self.sent_bytes += nbytes(value)
            waiting = self._waiting.pop(key, [])
        for callback in waiting:
            callback(value, None)

    def recv(self, key: str, callback: Callback) -> None:
        """Call ``callback(value, None)`` when ``key`` arrives, or ``(None, error)``."""
        with self._lock:
            if self.error is not None:
                error, ready = self.error, False
            elif key in self._values:
                error, ready = None, True
            else:
                self._waiting.setdefault(key, []).append(callback)
                return
        callback(self._values[key] if ready else None, error)

    def abort(self, error: BaseException) -> None:
        """Fail every waiting and future ``recv`` with ``error`` (the first one wins)."""
        with self._lock:
            if self.error is None:
                self.error = error
            waiting = [cb for cbs in self._waiting.values() for cb in cbs]
            self._waiting.clear()
        for callback in waiting:
            callback(None, self.error)
