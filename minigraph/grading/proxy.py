"""The grader's side of the trust boundary: the ``exercises`` proxy and its sandbox.

A graded test takes the ``exercises`` fixture and writes ``exercises.mean(xs)`` as if it
held the student's module. It holds an :class:`ExercisesProxy`: ``exercises.mean`` is a
:class:`RemoteRef` (a handle to the function in the sandbox) and calling it sends the
arguments as plain data (:mod:`.wire`) to the sandbox process (:mod:`.sandbox`), which
calls the student's function and sends back its result as plain data. What comes back is
NumPy arrays, numbers, strings, tuples ... built by the grader from bytes: never an object
of the student's, so no ``__eq__`` of theirs can run inside an ``assert``.

An object that is not plain data (an instance of the student's ``Dual``, the function
``compile_source`` returns) stays in the sandbox and arrives as a :class:`RemoteRef`:
calling it, reading or setting an attribute and the arithmetic operators (``u * v``) are
requests to the sandbox; comparing, hashing and truth are the handle's own (identity),
so a handle cannot pretend to equal an expected value. A function the test passes in
(``forward_gradient(f, xs)``) stays in the grader: the sandbox calls it back.

:class:`Sandbox` starts the process (with :mod:`.isolation`), imports exercises.py in it,
enforces the per-call timeout and the whole submission's time limit, and starts a fresh
process after a crash or a timeout, so that each costs only the test it happens in.
"""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from minigraph.grading import isolation, wire
from minigraph.grading.channel import Peer, RemoteError
from minigraph.grading.messages import describe_exit

#: seconds the student's code gets, after the timeout signal, to give control back
GRACE = 2.0
#: seconds the sandbox may take to start (an interpreter importing NumPy and minigraph)
STARTUP_LIMIT = 60.0


class SandboxFailure(Exception):
    """The sandbox could not answer (a crash, a timeout, a failed import): the message is
    written for students and becomes the test's output as it is."""

    def __init__(self, text: str):
        super().__init__(text)
        self._minigraph_text = text


@dataclass
class SandboxSettings:
    """How to run the student's exercises.py (see :mod:`.isolation`)."""
    exercises: Path                       # the student's file
    timeout: float = 10.0                 # per call, seconds
    total_timeout: float = 300.0          # the whole submission, seconds
    limits: isolation.Limits = field(default_factory=isolation.Limits)
    isolate: bool = True                  # a separate account (as root) and the limits
    workdir: Path | None = None           # a private folder for the sandbox's folder
    shared: tuple[str, ...] | None = None  # where its account's files are looked for
                                           # (None: isolation.shared_folders())


def student_error(info: dict) -> BaseException:
    """The exception a test sees for an error in the student's code: the built-in type
    when it is one (``pytest.raises(ValueError)`` works), else RuntimeError; its message
    for the report is the sandbox's description, location included."""
    kind = wire.SAFE_EXCEPTIONS.get(str(info.get("type")), RuntimeError)
    if info.get("missing"):
        exc = AttributeError(f"module 'exercises' has no attribute '{info['missing']}'")
    else:
        exc = kind(str(info.get("message", "")))
    text = str(info.get("text") or f"{info.get('type')}: {info.get('message')}")
    if info.get("type") == "ImportFailed":
        text = str(info.get("message"))
    # an attribute of the grader's own on a built-in exception (messages.py reads it)
    exc._minigraph_text = text[:4000]  # type: ignore[attr-defined]
    return exc


class RemoteRef:
    """A handle to an object that stays in the sandbox."""

    __slots__ = ("_sandbox", "_ref", "_generation")

    def __init__(self, sandbox: "Sandbox", ref: dict, generation: int):
        object.__setattr__(self, "_sandbox", sandbox)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_generation", generation)

    @property
    def type_name(self) -> str:
        """The name of the object's type in the sandbox (``"Dual"``)."""
        return str(self._ref.get("type"))

    def _ask(self, op: str, **fields) -> Any:
        if self._generation != self._sandbox.generation:
            raise SandboxFailure("this object lived in a sandbox process that has since been "
                                 "stopped (after a crash or a timeout)")
        return self._sandbox.request(op, target=self._ref, **fields)

    def __call__(self, *args, **kwargs):
        peer = self._sandbox.peer
        return self._ask("call", args=peer.encode(list(args)), kwargs=peer.encode(kwargs))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __setattr__(self, name: str, value) -> None:
        self._ask("setattr", name=name, value=self._sandbox.peer.encode(value))

    def __instancecheck__(self, instance) -> bool:  # isinstance(x, exercises.Dual)
        if not isinstance(instance, RemoteRef):
            return False
        return bool(self._sandbox.request("isinstance", obj=instance._ref, cls=self._ref))

    def _operator(self, name: str, *args):
        if self._generation != self._sandbox.generation:
            raise SandboxFailure("this object lived in a sandbox process that has since been "
                                 "stopped (after a crash or a timeout)")
        return self._sandbox.request("operator", name=name, args=self._sandbox.peer.encode(list(args)))

    # ``bool(ref)``, ``ref == x``, ``ref != x``: Python's defaults answered these without
    # the object (a handle is truthy, and unequal to everything but itself), so an object
    # returned where a truth value or a number belongs passed ``assert exercises.f(x)``
    # and ``assert exercises.f(x) != wrong``. The student's own __bool__ and __eq__ cannot
    # be asked instead: an object that says yes to everything would pass every test. So a
    # test that reads a truth value from a handle fails, saying what came back.
    def __bool__(self) -> bool:
        raise self._not_a_value()

    def __eq__(self, other: object) -> bool:
        raise self._not_a_value()

    def __ne__(self, other: object) -> bool:
        raise self._not_a_value()

    __hash__ = object.__hash__  # (defining __eq__ would remove it; handles stay hashable)

    def _not_a_value(self) -> TypeError:
        return TypeError(f"the submission returned a {self.type_name} object where a value was "
                         f"expected (a number, bool, string, array or tensor); an object of "
                         f"the submission's own type has no truth value or equality that the "
                         f"grader can trust")

    def __repr__(self) -> str:
        kind = "function" if self._ref.get("type") == "function" else f"{self.type_name} object"
        name = self._ref.get("name") or ""
        return f"<{kind} {name}>".replace(" >", ">")


def _binary(name: str, reflected: bool = False):
    if reflected:
        return lambda self, other: self._operator(name, other, self)
    return lambda self, other: self._operator(name, self, other)


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul"):
    setattr(RemoteRef, f"__{_name}__", _binary(_name))
    setattr(RemoteRef, f"__r{_name}__", _binary(_name, reflected=True))
for _name in ("neg", "pos", "abs"):
    setattr(RemoteRef, f"__{_name}__", lambda self, _n=_name: self._operator(_n, self))
setattr(RemoteRef, "__getitem__", lambda self, key: self._operator("getitem", self, key))

setattr(RemoteRef, "__len__", lambda self: int(self._operator("len", self)))


# ``for x in ref``, ``zip``, ``list``, ``x in ref`` and ``reversed(ref)``: without these,
# Python falls back to calling __getitem__ with 0, 1, 2 ... and stops at the first
# IndexError, which the student's object raises when it likes: a handle whose len() says
# n then iterated over no item at all, and every check in a loop over it passed. So a
# handle is iterated as exactly len() items, and an IndexError before that is an error.
def _items(self: RemoteRef, backwards: bool = False) -> Iterator[Any]:
    n = len(self)  # asked once: the student's __len__ may answer differently each time
    for i in (range(n - 1, -1, -1) if backwards else range(n)):
        try:
            item = self._operator("getitem", self, i)
        except IndexError:
            raise TypeError(f"the submission returned a {self.type_name} object whose len() "
                            f"is {n} but whose item {i} raised IndexError: it cannot be "
                            f"iterated") from None
        yield item


setattr(RemoteRef, "__iter__", lambda self: _items(self))
setattr(RemoteRef, "__reversed__", lambda self: _items(self, backwards=True))
setattr(RemoteRef, "__contains__", lambda self, value: any(item == value for item in self))


class GraderPeer(Peer):
    side = "grader"

    def __init__(self, sandbox: "Sandbox", read_fd: int, write_fd: int):
        super().__init__(read_fd, write_fd)
        self.sandbox = sandbox

    def foreign(self, ref: dict) -> RemoteRef:
        return RemoteRef(self.sandbox, ref, self.sandbox.generation)

    def export(self, obj: Any) -> dict:
        if isinstance(obj, RemoteRef):  # one of the sandbox's own objects, going back
            if obj._generation != self.sandbox.generation:
                raise SandboxFailure("this object lived in a sandbox process that has since "
                                     "been stopped (after a crash or a timeout)")
            return obj._ref
        if not callable(obj) or isinstance(obj, type):
            raise TypeError(f"a {type(obj).__name__} cannot be sent to the sandbox: send "
                            "plain data (numbers, strings, lists, tuples, dicts, arrays, "
                            "tensors) or a function")
        return super().export(obj)

    def receive_next(self) -> dict:
        return self.sandbox.receive_next()

    def send(self, message: dict) -> None:
        # (the call's deadline and the grace after it: a sandbox that stops reading its
        # channel times out like one that stops answering)
        wire.send(self.write_fd, message, max(self.sandbox._deadline, time.monotonic()) + GRACE)

    def op_call(self, message: dict) -> Any:  # the student's code calls the test's function
        function = self.decode(message["target"])
        args = self.decode(message.get("args", []))
        kwargs = self.decode(message.get("kwargs", {}))
        return function(*args, **{str(k): v for k, v in kwargs.items()})


class Sandbox:
    """The sandbox process for one student's exercises.py, restarted when it must be."""

    def __init__(self, settings: SandboxSettings, guard: list[str] | None = None):
        self.settings = settings
        self.guard = list(guard or [])
        self.generation = 0
        self.processes = 0                  # how many sandbox processes were started
        self.proc: subprocess.Popen | None = None
        self.peer: GraderPeer | None = None
        self.account: isolation.Account | None = None
        self.import_failed: str | None = None
        self.exhausted: str | None = None   # the whole submission's time is spent
        self.started_at = time.monotonic()
        self.used = 0.0                     # seconds spent waiting for the student's code
        self._depth = 0
        self.forbidden: list[str] = []      # library functions the running test forbids
        self.forbid_why = ""
        self.sent_forbidden: tuple[list[str], str] = ([], "")   # what the sandbox knows
        self._deadline = 0.0
        self._signalled = False
        self._root = isolation.is_root() and settings.isolate
        self._dir: Path | None = None
        self._made: Path | None = None   # the folder _spawn made for the sandbox, if any
        self._ready = False

    # the process ------------------------------------------------------------------------

    def spawn(self) -> None:
        """Start the sandbox process now (it imports NumPy and minigraph while the grader
        collects the tests); the import of exercises.py waits for the first request."""
        if self.proc is None and not (self.exhausted or self.import_failed):
            self._spawn()

    def _start(self) -> None:
        if self.proc is None:
            self._spawn()
        self._handshake()

    def _spawn(self) -> None:
        if self._root and self.account is None:
            self.account = isolation.claim_account(self.settings.shared)
        if self._dir is None:
            parent = self.settings.workdir
            if parent is None:  # a folder of our own, removed by close()
                parent = self._made = isolation.private_dir("minigraph-sandbox-")
            self._dir = isolation.sandbox_dir(Path(parent), self.account)
        isolation.copy_for_sandbox(Path(self.settings.exercises), self._dir, self.account)
        child_reads, grader_writes = os.pipe()
        grader_reads, child_writes = os.pipe()
        extra = 0 if self._root else isolation.processes_of_user(os.getuid())
        limits = self.settings.limits
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self._dir),
               "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}
        drop = [] if self.account is None else [str(self.account.uid), str(self.account.gid)]

        def prepare():
            if self.settings.isolate:
                isolation.limit_child(limits, extra)
            else:
                isolation.prctl(isolation.PR_SET_PDEATHSIG, signal.SIGKILL)

        # (as root: in a view of its own, where the grader's command line and the folder
        # of the submission, with the others beside it, are hidden)
        python_paths = [sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path]
        needed = [self._dir, Path(__file__).parents[2], *(Path(p) for p in python_paths if p)]
        hide = isolation.folder_to_hide(Path(self.settings.exercises).resolve().parent, needed)
        python = [*isolation.private_view(hide), sys.executable, "-I", "-m",
                  "minigraph.grading.sandbox"]
        if not self.settings.isolate:  # a source checkout that is not installed
            python = [sys.executable, "-m", "minigraph.grading.sandbox"]
            env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
        self.proc = subprocess.Popen(
            python + [str(child_reads), str(child_writes)] + drop, cwd=self._dir, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(child_reads, child_writes), start_new_session=True, preexec_fn=prepare)
        os.close(child_reads)
        os.close(child_writes)
        self.processes += 1
        self.generation += 1
        self.peer = GraderPeer(self, grader_reads, grader_writes)
        self._ready = False

    def _handshake(self) -> None:
        if self._ready:
            return
        self._ready = True
        assert self.peer is not None  # _start spawned the process: proc and peer go together
        try:
            wire.receive(self.peer.read_fd, time.monotonic() + STARTUP_LIMIT)
        except wire.WireError:
            self._stop()
            raise SandboxFailure(
                f"the sandbox process could not start (is minigraph importable by the sandbox "
                f"account? is the memory limit, {self.settings.limits.memory_mb} MB "
                f"(--memory), enough to start Python with NumPy?)") from None
        self.sent_forbidden = ([], "")   # what the sandbox knows
        if self.guard:
            self.request("guard", names=self.guard)
        try:
            self.request("import", timeout=self.settings.timeout)
        except SandboxFailure as exc:
            if "could not be imported" not in str(exc):
                text = str(exc)
                text = text.replace("timed out: still running after",
                                    "exercises.py could not be imported: importing it took longer than")
                if text.startswith("crashed: "):
                    text = "exercises.py could not be imported: it crashed the process (" + \
                        text[len("crashed: "):].split(" (os._exit")[0] + ")"
                if text.startswith("exercises.py could not be imported: importing it took"):
                    text = text.split("(", 1)[0].rstrip() + " (a loop at module level?)"
                exc = SandboxFailure(text)
            self.import_failed = str(exc)
            raise exc from None
        except BaseException as exc:
            text = getattr(exc, "_minigraph_text", None) or str(exc)
            self.import_failed = text
            raise SandboxFailure(text) from None

    def _stop(self) -> None:
        """End the sandbox process and every process it started."""
        proc, self.proc = self.proc, None
        if self.peer is not None:
            for fd in (self.peer.read_fd, self.peer.write_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.peer = None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()  # before anything else reaps it: its exit status is the crash report
        if self.account is not None:
            isolation.kill_account(self.account.uid)
        elif self.settings.isolate:  # the harness is a subreaper: orphans came back to it
            isolation.kill_descendants()

    def close(self) -> None:
        """End the sandbox and remove what it left; the account is released even where
        something could not be removed (the OSError then says what)."""
        self._stop()
        try:
            if self.account is not None:
                isolation.end_account(self.account.uid, self.settings.shared)
            if self._made is not None:  # after the kills: nothing can write there any more
                made, self._made, self._dir = self._made, None, None
                isolation.remove_trees([made])
        finally:
            if self.account is not None:
                isolation.release_account(self.account)
                self.account = None

    # requests -----------------------------------------------------------------------------

    def ensure(self) -> None:
        if self.exhausted:
            raise SandboxFailure(self.exhausted)
        if self.import_failed:
            raise SandboxFailure(self.import_failed)
        if self.proc is None or not self._ready:
            self._start()

    def request(self, op: str, **fields) -> Any:
        """Send a request; raise the student's error, or a SandboxFailure."""
        outermost = self._depth == 0
        if outermost:
            if op not in ("import", "guard"):
                self.ensure()
                # the reason too: two tests may forbid the same names for different reasons
                if (self.forbidden, self.forbid_why) != self.sent_forbidden and op != "forbid":
                    self.request("forbid", names=self.forbidden, why=self.forbid_why)
                    self.sent_forbidden = (list(self.forbidden), self.forbid_why)
            now = time.monotonic()
            left = self.settings.total_timeout - self.used
            self._deadline = now + min(self.settings.timeout, max(left, 0.0))
            self._signalled, self._call_started = False, now
        self._depth += 1
        try:
            # ensure() (or, for import and guard, the handshake) started the process
            assert self.peer is not None
            return self.peer.request(op, **fields)
        except RemoteError as exc:
            info = exc.info
            if info.get("type") == "SandboxTimeout":
                raise self._timeout_failure(info.get("where", "")) from None
            raise student_error(info) from None
        except wire.ChannelTimeout:
            self._stop()
            raise self._timeout_failure("", stopped=True) from None
        except wire.ChannelClosed:
            returncode = self.proc.poll() if self.proc else None
            if self.proc is not None and returncode is None:
                try:
                    returncode = self.proc.wait(1.0)
                except subprocess.TimeoutExpired:
                    pass
            self._stop()
            raise SandboxFailure(f"crashed: {describe_exit(returncode)} (os._exit, a segfault, "
                                 "the memory limit, ...)") from None
        except wire.WireError as exc:
            self._stop()
            raise SandboxFailure(f"the sandbox broke the protocol: {exc}") from None
        finally:
            self._depth -= 1
            if outermost:
                self.used += time.monotonic() - self._call_started

    def receive_next(self) -> dict:
        """The next message; at the deadline, interrupt the student's code (SIGUSR1), and
        after ``GRACE`` more seconds give up (ChannelTimeout)."""
        assert self.peer is not None  # called by the peer, while it waits for an answer
        while True:
            try:
                return wire.receive(self.peer.read_fd, self._deadline)
            except wire.ChannelTimeout:
                if self._signalled or self.proc is None:
                    raise
                self._signalled = True
                try:
                    os.kill(self.proc.pid, signal.SIGUSR1)
                except OSError:
                    pass
                self._deadline = time.monotonic() + GRACE

    def _timeout_failure(self, where: str, stopped: bool = False) -> SandboxFailure:
        total = self.used + (time.monotonic() - self._call_started) >= self.settings.total_timeout
        if total:
            self.exhausted = (f"not run: the whole submission ran out of its "
                              f"{self.settings.total_timeout:g} s (--total-timeout)")
            self._stop()
            return SandboxFailure(f"timed out: the whole submission ran out of its "
                                  f"{self.settings.total_timeout:g} s (--total-timeout)")
        if stopped:
            return SandboxFailure(
                f"timed out: still running after {self.settings.timeout:g} s, and it did not stop "
                "when interrupted (does it catch every exception?), so the grader stopped the "
                "test process")
        text = (f"timed out: still running after {self.settings.timeout:g} s (an infinite loop, "
                "or far too slow?)")
        return SandboxFailure(text + (f"\n  at {where}" if where else ""))


class ExercisesProxy:
    """What the ``exercises`` fixture returns: the student's module, seen from the grader."""

    def __init__(self, sandbox: Sandbox):
        object.__setattr__(self, "_sandbox", sandbox)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._sandbox.request("getattr", target=None, name=name)

    def __setattr__(self, name, value):
        raise AttributeError("the tests cannot change the student's module")

    def __repr__(self) -> str:
        return "<module 'exercises' from 'exercises.py'>"


def in_sandbox(exercises: ExercisesProxy, function, **data) -> RemoteRef:
    """Run one of the test's helper functions in the sandbox, where minigraph values that
    cannot cross (graph nodes, the tracers of ``mg.jvp``) live: ``function``'s source
    is sent as text and defined there, with ``np``, ``mg`` and ``math`` in scope and
    ``data`` (plain data) passed as keyword arguments on every call. The handle it
    returns can be passed to the student's functions; ``handle.calls`` counts the calls
    (counted in the sandbox, so a determined student could change it: use it to catch
    wrong algorithms, not as a proof).

        def layer(x, *, w):
            return mg.tanh(w @ x)
        f = in_sandbox(exercises, layer, w=w)
    """
    sandbox: Sandbox = object.__getattribute__(exercises, "_sandbox")
    source = inspect.getsource(function)
    sandbox.ensure()
    assert sandbox.peer is not None  # ensure() started the process
    return sandbox.request("define", source=source, name=function.__name__,
                           data=sandbox.peer.encode(data))
