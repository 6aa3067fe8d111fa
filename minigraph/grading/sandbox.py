"""The sandbox process: the only place where the student's ``exercises.py`` runs.

Started by :mod:`minigraph.grading.proxy` as ``python -I -m minigraph.grading.sandbox
READ_FD WRITE_FD`` (as an unprivileged account where the grader is root, with resource
limits: see :mod:`minigraph.grading.isolation`). It imports ``exercises.py`` from its
working folder when asked, then answers requests: read a name of the module, call a
function or a handle, apply an operator, define one of the test's helper functions
(shipped as source text, run here, counting its calls). Nothing here is trusted by the
grader: every answer is plain data checked by the tests in the grader's process, so
student code that tampers with this module can only change the answers of its own
functions.

Before the import, stdin is /dev/null and stdout/stderr go to a log file: the channel is
on two other descriptors, so ``print`` cannot garble it.
"""

from __future__ import annotations

import codecs
import functools
import importlib.util
import inspect
import math
import operator
import os
import signal
import stat
import sys
import textwrap
import tokenize
from types import ModuleType
from typing import Any

from minigraph.grading import wire
from minigraph.grading.channel import Peer, RemoteError
from minigraph.grading.messages import (STUDENT_FILE, describe_exception, message_of,
                                        student_location)

#: operators the grader may ask for on the student's objects (``2.5 * u + v`` on Duals)
OPERATORS = {name: getattr(operator, name) for name in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "neg", "pos",
    "abs", "getitem", "contains", "lt", "le", "gt", "ge")}
OPERATORS["len"] = len


class SandboxTimeout(Exception):
    """Raised in the student's code when the grader's per-call timeout expires."""


class ForbiddenCall(Exception):
    """The student's solution called a library function its exercise asks them to write."""


class Callback:
    """A function the grader passed in: calling it is a request to the grader."""

    def __init__(self, peer: "SandboxPeer", ref: dict):
        self._peer, self._ref = peer, ref
        self.__name__ = ref.get("name") or "callback"

    def __call__(self, *args, **kwargs):
        try:
            return self._peer.request("call", target=self._ref, args=self._peer.encode(list(args)),
                                      kwargs=self._peer.encode(kwargs))
        except RemoteError as exc:
            kind = wire.SAFE_EXCEPTIONS.get(exc.info.get("type"), RuntimeError)
            raise kind(exc.info.get("message", "")) from None

    def __repr__(self) -> str:
        return f"<function {self.__name__} (the test's)>"


class Counted:
    """One of the test's helper functions, run here; ``calls`` counts its calls."""

    def __init__(self, fn, data: dict):
        self.fn, self.data, self.calls = fn, data, 0
        self.__name__ = getattr(fn, "__name__", "f")

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **self.data, **kwargs)


class SandboxPeer(Peer):
    side = "sandbox"

    def __init__(self, read_fd: int, write_fd: int):
        super().__init__(read_fd, write_fd)
        self.module: ModuleType | None = None
        self.forbidden: dict[str, str] = {}   # name -> why, for the test now running
        self.guarded: dict[str, Any] = {}     # name -> original object, wrapped everywhere

    def foreign(self, ref: dict) -> Any:
        if not ref.get("callable"):
            raise wire.WireError("the grader sent a handle that is not a function")
        return Callback(self, ref)

    def error_info(self, exc: BaseException) -> dict:
        where = student_location(exc)
        info: dict[str, Any] = {"type": type(exc).__name__, "message": message_of(exc),
                                "where": where}
        info["text"] = describe_exception(exc)
        if isinstance(exc, AttributeError) and getattr(exc, "obj", None) is self.module:
            info["missing"] = getattr(exc, "name", None)
        return info

    def serve(self, message: dict) -> None:
        try:
            super().serve(message)
        except (KeyboardInterrupt, SystemExit) as exc:  # sys.exit() inside a function
            code = getattr(exc, "code", None)
            try:
                shown = repr(code)
            except Exception:  # noqa: BLE001 - sys.exit(obj) with a __repr__ that raises
                shown = f"<a {type(code).__name__} object>"
            wire.send(self.write_fd, {"re": message.get("id"), "error": {
                "type": "SystemExit", "where": student_location(exc),
                "message": f"the code called sys.exit({shown})",
                "text": f"SystemExit: the code called sys.exit({shown})"}})

    # requests from the grader -----------------------------------------------------------

    def op_import(self, message: dict) -> Any:
        path = os.path.abspath(STUDENT_FILE)
        spec = importlib.util.spec_from_file_location("exercises", path)
        assert spec is not None and spec.loader is not None  # a .py path always has a loader
        module = importlib.util.module_from_spec(spec)
        sys.modules["exercises"] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # noqa: BLE001 - SystemExit and timeouts included
            sys.modules.pop("exercises", None)
            from minigraph.grading.loader import import_message
            raise ImportFailed(import_message(exc, STUDENT_FILE, message.get("timeout"))) from None
        self.module = module
        return True

    def _target(self, message: dict) -> Any:
        target = message.get("target")
        return self.module if target is None else self.decode(target)

    def op_getattr(self, message: dict) -> Any:
        return getattr(self._target(message), str(message["name"]))

    def op_setattr(self, message: dict) -> Any:
        setattr(self._target(message), str(message["name"]), self.decode(message["value"]))
        return None

    def op_call(self, message: dict) -> Any:
        args = self.decode(message.get("args", []))
        kwargs = self.decode(message.get("kwargs", {}))
        return self._target(message)(*args, **{str(k): v for k, v in kwargs.items()})

    def op_operator(self, message: dict) -> Any:
        function = OPERATORS[str(message["name"])]
        return function(*self.decode(message["args"]))

    def op_isinstance(self, message: dict) -> bool:
        return isinstance(self.decode(message["obj"]), self.decode(message["cls"]))

    def op_define(self, message: dict) -> Counted:
        """A helper function of the test, from its source text, run here, with NumPy's,
        minigraph's and math's names as they were before exercises.py was imported
        (:class:`Pristine`)."""
        namespace = dict(_PRISTINE)
        exec(compile(textwrap.dedent(message["source"]), "<the test's helper>", "exec"),
             namespace)
        return Counted(namespace[message["name"]], self.decode(message.get("data", {})))

    def op_guard(self, message: dict) -> list[str]:
        """Wrap the named library functions everywhere they are bound (before the import
        of exercises.py, so that ``from minigraph import softmax`` gets the wrapper)."""
        missing = []
        for name in message["names"]:
            try:
                ok = name in self.guarded or self._guard(str(name))
            except Exception:  # noqa: BLE001 - a name that cannot be guarded is reported
                ok = False
            if not ok:
                missing.append(name)
        return missing

    def op_forbid(self, message: dict) -> None:
        self.forbidden = {str(n): str(message.get("why", "")) for n in message["names"]}
        return None

    def op_ping(self, message: dict) -> str:
        return "pong"

    # no delegation ------------------------------------------------------------------------

    def _guard(self, name: str) -> bool:
        module_name, _, attr = name.rpartition(".")
        try:
            owner = importlib.import_module(module_name)
            original = getattr(owner, attr)
        except (ImportError, AttributeError, ValueError):
            return False
        self.guarded[name] = original
        peer = self

        def check():
            if name in peer.forbidden:
                raise ForbiddenCall(
                    f"{name} may not be used in this exercise: it asks you to write that "
                    f"part yourself ({peer.forbidden[name] or 'see the exercise text'})")

        if inspect.isclass(original):
            init = original.__init__

            def guarded_init(self, *args, **kwargs):
                check()
                return init(self, *args, **kwargs)
            try:
                # replacing the method is the point: a class is guarded through its __init__
                original.__init__ = guarded_init  # type: ignore[method-assign]
                return True
            except TypeError:  # a built-in type (numpy.broadcast): wrap its name instead
                pass

        @functools.wraps(original, assigned=("__module__", "__name__", "__qualname__", "__doc__"),
                         updated=())
        def guarded(*args, **kwargs):
            check()
            return original(*args, **kwargs)

        for module in list(sys.modules.values()):  # every alias: np.lib.stride_tricks too
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for key, value in list(namespace.items()):
                if value is original:
                    try:
                        setattr(module, key, guarded)
                    except (AttributeError, TypeError):
                        pass
        return True


class Pristine:
    """A module's names as they were when the sandbox started, before the student's file
    ran: a test's helper that asks ``np.shares_memory(a, b)`` or ``np.array_equal`` for a
    verdict gets NumPy's, not a ``numpy.shares_memory = lambda *a: False`` that
    exercises.py put in the module (every helper's answer is still computed in the
    student's process: this stops the one-line patch, not a determined attacker, as the
    module's docstring says of call counts). Names a module loads later, on first use,
    come from the module itself."""

    def __init__(self, module: ModuleType):
        self.__dict__.update(vars(module))
        self.__module = module

    def __getattr__(self, name: str) -> Any:  # (only for names missing from the copy)
        return getattr(self.__module, name)


_PRISTINE: dict[str, Any] = {}  # the helpers' np, mg and math (main fills it)


class ImportFailed(Exception):
    """exercises.py could not be imported; the message is written for students."""


def _on_timeout(signum, frame):
    raise SandboxTimeout("timed out")


#: standard modules imported before the switch of account: where Python is installed in a
#: folder the account cannot read (a root-only home), later imports of these still work.
#: The chapters name timeit and graphlib; the profilers, sched and doctest are what students
#: plausibly reach for. The last eight add about 13 ms to each sandbox's start.
PRELOAD = ("array", "bisect", "collections", "copy", "dataclasses", "decimal", "enum",
           "fractions", "functools", "heapq", "itertools", "json", "math", "operator",
           "random", "re", "statistics", "string", "textwrap", "threading", "time", "typing",
           "queue", "numbers", "cmath", "pprint", "contextlib", "weakref", "abc",
           "timeit", "graphlib", "cProfile", "profile", "pstats", "tracemalloc", "sched",
           "doctest",
           # the codecs a source file may declare (a BOM, ``# -*- coding: cp1252 -*-``):
           # Python looks its codec up when it imports exercises.py and whenever it reads a
           # line of it for a traceback; unimported, that is "unknown encoding". These are
           # the usual ones; the one exercises.py declares is loaded too (_preload_codec)
           "encodings.utf_8_sig", "encodings.latin_1", "encodings.cp1252", "encodings.ascii",
           "encodings.iso8859_15", "encodings.utf_16", "encodings.utf_32")


class UnreadableStdlib:
    """The last finder on ``sys.meta_path`` after the switch of account: an import of a
    standard module that is installed but was not preloaded fails with a message that says
    why, instead of Python's untrue "No module named ..." (the account cannot read the
    folder Python lives in, so the normal finders see nothing there)."""

    def __init__(self, installed: frozenset[str]):
        self.installed = installed   # top-level standard modules found as root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.partition(".")[0] not in self.installed:
            return None   # not a standard module: let Python say it is missing
        if path is not None and any(os.access(p, os.R_OK | os.X_OK) for p in path):
            return None   # its package's folder is readable: the submodule is truly missing
        raise ModuleNotFoundError(
            f"the standard module {fullname!r} cannot be imported in the grader's sandbox: "
            f"it runs as an account that cannot read the Python installation "
            f"({os.path.dirname(os.__file__)}), so only the standard modules loaded before "
            f"the switch of account are available; ask your course staff to add "
            f"{fullname!r} to minigraph.grading.sandbox.PRELOAD", name=fullname)


def _installed_stdlib() -> frozenset[str]:
    """The top-level standard modules present in this installation (read as root)."""
    folder = os.path.dirname(os.__file__)
    found = set(sys.builtin_module_names)
    for where in (folder, os.path.join(folder, "lib-dynload")):
        try:
            found.update(entry.partition(".")[0] for entry in os.listdir(where))
        except OSError:
            pass
    return frozenset(found & sys.stdlib_module_names)


def _preload_codec(path: str) -> None:
    """Load the codec that the source file ``path`` declares (``# -*- coding: cp1251 -*-``,
    any of the 100 or so Python has), so that it works after the switch of account.
    (Loading every codec instead would add about 0.1 s to each sandbox's start.) Only the
    first two lines are read, where Python looks for the declaration; without following
    a link (the folder is the student's) nor waiting on a FIFO. A file that cannot be
    read, or declares no codec Python has, is left to the import, which says why."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    with os.fdopen(fd, "rb") as f:
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):   # (1 MiB at most: as root)
                # (Python's lines: ended by \n, \r\n or a lone \r, as bytes.splitlines
                # ends them; readline would end them at \n only, and a classic-Mac file's
                # second line, the declaration, would not be read as one)
                lines = iter(f.read(1 << 20).splitlines(keepends=True)[:2])
                encoding = tokenize.detect_encoding(lambda: next(lines, b""))[0]
                codecs.lookup(encoding)   # (imports its module of the encodings package)
        except (OSError, SyntaxError, LookupError):
            pass


def _drop_privileges(uid: int, gid: int, parent: int) -> None:
    """Become the sandbox's account for good (real, effective and saved ids), before any
    of the student's code is read. Started as root so that the interpreter, NumPy and
    minigraph load wherever they are installed; nothing of the student's has run yet."""
    from minigraph.grading import isolation
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    _preload_codec(STUDENT_FILE)
    installed = _installed_stdlib()
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    isolation.prctl(isolation.PR_SET_NO_NEW_PRIVS, 1)
    isolation.prctl(isolation.PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by setuid
    isolation.prctl(isolation.PR_SET_DUMPABLE, 1)
    if os.getppid() != parent:  # the grader died before the death signal was armed
        os._exit(1)
    if os.getuid() != uid or os.geteuid() != uid:
        os._exit(1)
    sys.meta_path.append(UnreadableStdlib(installed))


def _open_log(name: str) -> int:
    """The log file, appended to: a regular file, or a new one where something else
    (a symlink, a FIFO, a folder) has taken its name."""
    from minigraph.grading.isolation import new_file

    flags = os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK
    try:
        fd = os.open(name, flags | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        os.close(fd)
    except OSError:  # ELOOP: a symlink; ENXIO: a FIFO nobody reads; EISDIR ...
        pass
    return new_file(name, flags)


def main(argv: list[str]) -> int:
    read_fd, write_fd = int(argv[0]), int(argv[1])
    # the channel is on read_fd/write_fd: the student's prints go to the log file
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    signal.signal(signal.SIGUSR1, _on_timeout)
    parent = os.getppid()
    import numpy  # (the start-up cost is paid before the first test)
    import minigraph
    _PRISTINE.update(np=Pristine(numpy), mg=Pristine(minigraph), math=Pristine(math))
    if len(argv) >= 4:
        _drop_privileges(int(argv[2]), int(argv[3]), parent)
    # Only now, as the account: the folder is the account's, and an earlier sandbox of
    # this submission may have left a symlink there (to a file only root may write) or a
    # FIFO (an open that never returns) in place of the log.
    log = _open_log("output.log")
    os.dup2(log, 1)
    os.dup2(log, 2)
    peer = SandboxPeer(read_fd, write_fd)
    wire.send(write_fd, {"ready": os.getpid()})
    while True:
        try:
            message = wire.receive(read_fd)
        except wire.ChannelClosed:
            return 0
        peer.serve(message)


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]) or 0)
