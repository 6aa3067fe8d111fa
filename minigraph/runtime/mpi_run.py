"""Running a graph that spans MPI ranks [3.1.4, beyond one process].

Every rank builds the same graph (SPMD: single program, multiple data) and calls
``sess.run(fetches, feeds)`` with the same fetches and feeds. Each rank then:

1. checks the feeds and plans the run, exactly as in one process;
2. on every run, sends every other rank a *fingerprint* of its plan (node names,
   ops, devices, shapes, dtypes, parameters, constants' values) and a digest of each
   feed, and compares theirs: two ranks that built different graphs would wait for
   tensors that never come, or compute another graph's values, and a feed that differs
   between ranks would be read on one rank only, so they are told at once instead.
   While a rank plans, it sends *alive* messages (see below), so that a long planning
   is not mistaken for a dead rank;
3. partitions the graph (``partition.py``): every rank computes the same partition, so
   every rank knows every Send/Recv key, and the MPI *tag* of a key, a number derived
   from the key's CRC-32, is the same everywhere;
4. runs only its own partitions (devices ``rank:R/...`` with R its rank), one executor
   thread each. A Send to another rank posts a non-blocking MPI send (``Isend``). The
   calling thread meanwhile *progresses* the run: it asks MPI for any tensor that has
   arrived (a matched probe, ``Improbe``), receives it and hands it to the rendezvous,
   which wakes the Recv node, as in one process;
5. sends every other rank a *done* message with the fetched values it computed, its
   trace events and the bytes it sent, and waits for theirs: every rank returns every
   fetched value, and ``sess.last_run`` shows every rank's events on one timeline.

Failures. A rank whose run raises (a kernel error, a bad feed, Ctrl-C) sends every other
rank an *abort* message naming itself, the node and its op; a rank that receives it stops
its executors and raises :class:`RemoteRankError`. The failing rank raises its own error,
with ``rank R:`` in front. A rank that hears nothing from another one for
``mg.distributed.set_timeout`` seconds (default 30) while it waits for it raises
:class:`RankTimeout`, naming the keys of the Recvs that are waiting. Ranks send each other
an *alive* message every quarter of the timeout while they run, so a long kernel on one
rank is not mistaken for a dead one. Every message carries the run's number, so a late
one from a failed run (sent before its sender heard of the failure) is recognised and
dropped when it is read: a control message (hello, alive, done, abort) by the control
loop, a tensor by the progress loop, which reads every tensor that arrives. After a
failure every rank also moves to a new *epoch*, which shifts all data tags.

Every refusal of a cross-rank run (from a second thread, on a closed session, a bad feed)
happens inside the run, after it took its number, and is told to the other ranks as an
abort: a rank that refused alone would pair its next run with the others' current one.

Control messages are pickled Python objects (mpi4py's lowercase API), which is fine
between the ranks of one job; tensors travel as raw buffers (the uppercase API), on a
communicator of their own, with their shape and dtype known to both sides from the graph,
and their layout (the order of their axes in memory, reversed and broadcast axes) in the
message, so that a kernel of the receiving rank walks them as in one process.
"""

from __future__ import annotations

import hashlib
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, cast

import numpy as np

from .. import distributed
from ..device import get_device
from ..errors import MinigraphError
from ..graph.graph import Node, describe_location
from .partition import Partition
from .profile import RunStats
from .rendezvous import Rendezvous
from .scheduler import Run

CONTROL = 0  # the tag of control messages; data tags start at 1
HEADER = 8  # bytes in front of every tensor sent: the number of its run (an int64),
# followed by the tensor's layout (_packed)


class RemoteRankError(MinigraphError, RuntimeError):
    """Another rank's run failed; the message names the rank, the node and its op."""


class RankTimeout(MinigraphError, TimeoutError):
    """No news from another rank for longer than ``mg.distributed.timeout()``."""


@dataclass
class Route:
    """A cross-rank Send/Recv key as MPI sees it."""

    key: str
    peer: int          # the rank at the other end
    tag: int           # without the epoch (see _World.tag)
    shape: tuple
    dtype: str
    node: str          # the Recv's (or Send's) name, for messages


class _World:
    """What one process remembers between runs: how many cross-rank runs it has made
    (every rank makes the same ones, in the same order), the epoch, and control
    messages that arrived early (for a run this rank has not started yet)."""

    def __init__(self) -> None:
        MPI = distributed._mpi()
        _check_thread_level(MPI)
        # A communicator of our own, so that the user's messages on mg.distributed.comm()
        # and ours never meet (mpi4py's send has tag 0, our control tag, and its recv
        # takes any tag). Making it is collective: every rank makes its first cross-rank
        # run at the same point of the program, and creates the world there; a rank
        # that does not come is waited for as long as a run waits for news.
        # Tensors travel on a second one, which control messages never reach: a rank
        # takes whatever tensor has arrived there (MPIRendezvous.progress).
        self.comm, request = distributed.comm().Idup()
        self.data, data_request = distributed.comm().Idup()
        deadline = time.monotonic() + distributed.timeout()
        while not MPI.Request.Testall([request, data_request]):
            if time.monotonic() > deadline:
                raise RankTimeout(
                    f"rank {distributed.rank()}: the first cross-rank run waits for every "
                    f"rank to start its own, and some rank did not for "
                    f"{distributed.timeout():g} s. Did every rank call Session.run with the "
                    f"same fetches?")
            time.sleep(0.001)
        self.thread: threading.Thread | None = None  # the one that makes the runs (claim)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        # (guards run_id and outbox: a refused run from another thread, and the
        # heartbeat thread, use them too)
        self.lock = threading.Lock()
        self.run_id = 0
        self.epoch = 0
        self.planning: _Conversation | None = None  # the run that plans now (_heartbeat)
        self.early: list[tuple[int, int, str, Any]] = []  # (source, run, kind, payload)
        self.outbox: list[Any] = []  # requests of control messages still in flight
        tag_ub = self.comm.Get_attr(MPI.TAG_UB) or 32767
        self.keyspace = min(1 << 20, (tag_ub + 1) // 16)  # tags per epoch
        self.epochs = (tag_ub - 1) // self.keyspace

    def beat(self) -> None:
        """The heartbeat thread: while a run plans, an *alive* message to every other
        rank each quarter of the timeout. (One thread for the process's life: a thread
        started for each run cost a millisecond a run. It looks every 50 ms, so that a
        timeout lowered meanwhile is kept.)"""
        last = 0.0
        while True:
            time.sleep(0.05)
            talk = self.planning
            if talk is not None and time.monotonic() - last > distributed.timeout() / 4:
                last = time.monotonic()
                talk.tell_all("alive", None)

    def claim(self) -> bool:
        """Whether the calling thread may make a cross-rank run. Ranks pair their runs in
        the order they make them; runs from two threads of a rank would pair in whatever
        order the threads happened to come (values of another run's feeds, silently): so
        every run comes from one thread, the first that makes one, as long as it lives.
        One that ended (a closed session's background thread) leaves the role to the next
        thread that runs. (The Thread is kept, not its ident: Python gives a dead thread's
        ident to a new one, which then passed or not by chance.)"""
        me = threading.current_thread()
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = me
            return self.thread is me

    def tag(self, route: Route, epoch: int) -> int:
        return 1 + (epoch % self.epochs) * self.keyspace + route.tag

    def next_run(self) -> tuple[int, int]:
        """The number of a new cross-rank run (every rank numbers its runs alike), and
        its epoch: the one the failures of the runs before it left, taken now, as a run
        refused on another thread meanwhile moves the world to the next one."""
        with self.lock:
            self.run_id += 1
            return self.run_id, self.epoch

    def send_control(self, dest: int, run: int, kind: str, payload: Any) -> None:
        with self.lock:
            self.outbox.append(self.comm.isend((run, kind, payload), dest=dest, tag=CONTROL))

    def flush(self, wait: float = 0.0) -> None:
        """Forget control sends that completed; with ``wait``, give them that long."""
        deadline = time.monotonic() + wait
        while True:
            with self.lock:
                self.outbox = [r for r in self.outbox if not r.Test()]
                pending = bool(self.outbox)
            if not pending or time.monotonic() >= deadline:
                return
            time.sleep(0.001)


_world: _World | None = None

_THREAD_LEVELS = ("SINGLE", "FUNNELED", "SERIALIZED", "MULTIPLE")  # MPI's, from the lowest


def _check_thread_level(MPI: Any) -> None:
    """Refuse an MPI that does not let several threads call it at once: a run does (its
    executors post tensors, the heartbeat thread its messages, the calling thread probes
    for arrivals), and below ``MPI_THREAD_MULTIPLE`` that hung, or failed an assertion
    inside MPICH, instead of raising."""
    level = MPI.Query_thread()
    if level < MPI.THREAD_MULTIPLE:
        name = next((f"MPI_THREAD_{n}" for n in _THREAD_LEVELS
                     if getattr(MPI, f"THREAD_{n}") == level), f"level {level}")
        raise distributed.DistributedError(
            f"rank {distributed.rank()}: a run across ranks calls MPI from several threads "
            f"at once, which needs the thread level MPI_THREAD_MULTIPLE, but MPI was "
            f"initialised with {name}: leave mpi4py.rc.thread_level at its default, "
            f"\"multiple\" (it is read when mpi4py.MPI is first imported), and use an MPI "
            f"library built with thread support")


def world() -> _World:
    global _world
    if _world is None:
        import atexit

        _world = _World()
        threading.Thread(target=_world.beat, name="minigraph-heartbeat", daemon=True).start()
        # The last control messages must leave before MPI finalizes (mpi4py finalizes
        # at exit too; handlers run last-registered first, so this one runs before).
        atexit.register(_world.flush, 2.0)
    return _world


class _Conversation:
    """The control messages of one run: who has said what, and since when we have
    heard nothing from each rank."""

    def __init__(self, w: _World, run: int):
        self.w, self.run = w, run
        self.peers = [r for r in range(w.size) if r != w.rank]
        now = time.monotonic()
        self.heard = {p: now for p in self.peers}  # last news from each rank
        self.beat = now
        self.inbox: dict[str, dict[int, Any]] = {}  # kind -> {rank: payload}

    def poll(self) -> None:
        """Read control messages; raise if a rank aborted; send our heartbeat."""
        w, now = self.w, time.monotonic()
        w.flush()
        status = distributed._mpi().Status()
        while w.comm.iprobe(source=distributed._mpi().ANY_SOURCE, tag=CONTROL, status=status):
            source = status.Get_source()
            run, kind, payload = w.comm.recv(source=source, tag=CONTROL)
            w.early.append((source, run, kind, payload))
        keep = []
        for source, run, kind, payload in w.early:
            if run > self.run:
                keep.append((source, run, kind, payload))  # for a run we have not begun
            elif run == self.run:
                self.heard[source] = now
                if kind == "abort":
                    raise _remote_error(payload)
                self.inbox.setdefault(kind, {})[source] = payload
            # run < self.run: a late message of a finished or failed run: dropped
        w.early = keep
        if now - self.beat > distributed.timeout() / 4:
            self.beat = now
            for p in self.peers:
                w.send_control(p, self.run, "alive", None)

    def heard_from(self, rank: int) -> None:
        self.heard[rank] = time.monotonic()

    def restart_clock(self) -> None:
        """Count silence from now: the time this rank spent planning was its own."""
        now = time.monotonic()
        self.heard = {p: now for p in self.peers}

    def silent(self, ranks: "set[int] | list[int]") -> int | None:
        """A rank among ``ranks`` we have not heard from for longer than the timeout."""
        now, limit = time.monotonic(), distributed.timeout()
        return next((r for r in ranks if now - self.heard[r] > limit), None)

    def tell_all(self, kind: str, payload: Any) -> None:
        for p in self.peers:
            self.w.send_control(p, self.run, kind, payload)

    def wait_all(self, kind: str, what: str) -> dict[int, Any]:
        """Wait for a ``kind`` message from every other rank."""
        pause = _Pause()
        while True:
            self.poll()
            got = self.inbox.get(kind, {})
            missing = [p for p in self.peers if p not in got]
            if not missing:
                return got
            late = self.silent(missing)
            if late is not None:
                raise RankTimeout(
                    f"rank {self.w.rank}: rank {late} sent nothing for "
                    f"{distributed.timeout():g} s while this rank waited for its {what}: did "
                    f"every rank call Session.run with the same graph, fetches and feeds? "
                    f"(mg.distributed.set_timeout changes the limit)")
            pause.wait()


class _Pause:
    """Sleep between polls: short while things happen, up to 1 ms when nothing does
    (polling in a tight loop would take the core the kernels need)."""

    def __init__(self) -> None:
        self.seconds = 2e-5

    def wait(self, progressed: bool = False) -> None:
        self.seconds = 2e-5 if progressed else min(self.seconds * 2, 1e-3)
        time.sleep(self.seconds)


class MPIRendezvous(Rendezvous):
    """The rendezvous of one rank: local keys as in one process, keys that cross ranks
    over MPI. A tensor travels behind a header holding its run's number (``HEADER``) and
    its layout (``_packed``)."""

    def __init__(self, w: _World, run: int, epoch: int, outgoing: dict[str, Route],
                 incoming: dict[str, Route]):
        super().__init__()
        self.w, self.run = w, run
        self.outgoing = outgoing
        self.tags = {key: w.tag(route, epoch) for key, route in outgoing.items()}
        self.sends: list[tuple[Any, np.ndarray]] = []  # (request, buffer kept alive)
        # (sender, tag) -> the Route of a tensor still to come; a dict, so that each
        # arrival costs the same however many are still to come
        self.expected = {(route.peer, w.tag(route, epoch)): route for route in incoming.values()}
        self.owing: dict[int, int] = {}  # rank -> how many of the Recvs it owes us
        for route in incoming.values():
            self.owing[route.peer] = self.owing.get(route.peer, 0) + 1

    def send(self, key: str, value: Any) -> None:
        route = self.outgoing.get(key)
        if route is None:
            return super().send(key, value)
        array = np.asarray(value)
        if array.shape != route.shape or array.dtype != np.dtype(route.dtype):
            raise RuntimeError(  # a wrong buffer would be read as garbage on the other side
                f"Send {key!r}: the value has shape {array.shape} and dtype {array.dtype}, "
                f"but the graph says {route.shape} {route.dtype}")
        message = _packed(self.run, array)
        with self._lock:
            if self.error is not None:  # the run failed: nobody will read this tensor
                return
            request = self.w.data.Isend(message, dest=route.peer, tag=self.tags[key])
            self.sends.append((request, message))
            self.sent_bytes += array.nbytes

    def progress(self) -> list[int]:
        """Receive the tensors that arrived, and deliver this run's; return the ranks
        they came from.

        Each arrival is found by a matched probe (``Improbe``), which costs the same
        however many tensors are still to come (testing a posted receive per expected
        tensor at every poll made a run quadratic in its cross-rank edges), and is
        received into a buffer of its own size. One of a failed run, sent before its
        sender heard of the failure, is received and dropped here: its run number is
        not ours (it may even have the tag of one of ours, once the epochs came round)."""
        MPI = distributed._mpi()
        status = MPI.Status()
        senders = []
        while (found := self._probe(status)) is not None:
            message = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
            found.Recv(message)
            peer = status.Get_source()
            senders.append(peer)
            route = self.expected.get((peer, status.Get_tag()))
            if route is None or message[:HEADER].view(np.int64)[0] != self.run:
                continue  # a failed run's (even of another shape): dropped
            del self.expected[(peer, status.Get_tag())]
            self._put(route.key, _unpacked(message, route))
            self.owing[route.peer] -= 1
            if not self.owing[route.peer]:
                del self.owing[route.peer]
        return senders

    def _probe(self, status: Any) -> Any:
        """A tensor that arrived (an MPI ``Message``), or None. A few probes in a row:
        MPICH's probe moves arrived messages into its queue only every few calls, so one
        probe per poll saw a tensor several polls late (up to a millisecond each)."""
        MPI = distributed._mpi()
        for _ in range(4):
            found = self.w.data.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            if found is not None:
                return found
        return None

    def sends_done(self) -> bool:
        with self._lock:
            self.sends = [(r, b) for r, b in self.sends if not r.Test()]
            return not self.sends

    def waiting_on(self) -> dict[int, list[str]]:
        """The ranks that owe us tensors, and the keys of those Recvs."""
        owed: dict[int, list[str]] = {}
        for route in self.expected.values():
            owed.setdefault(route.peer, []).append(route.key)
        return owed

    def cancel(self) -> None:
        """Expect nothing more (a failed run's tensors may never come; those that do
        are dropped by a later run's ``progress``)."""
        self.expected, self.owing = {}, {}


def _packed(run: int, array: np.ndarray) -> np.ndarray:
    """The message that carries ``array`` of run number ``run`` to another rank.

    A kernel's bits can depend on its inputs' layout (``sum`` adds in memory order), so
    a value reaches the other rank laid out as a Send in one process hands it over
    (``device.copy_keeping_layout``): a transposed value as a transpose, not C-ordered.
    Behind the run's number, the layout: two int64s an axis, ``order`` (the axes from
    the outermost in memory to the innermost) and each axis's ``step`` (1; -1, reversed:
    its elements lie backwards; 0, broadcast: one element, repeated). Then the distinct
    elements, each once, read forward, in that order (for a C-ordered array, its bytes
    as they are); ``_unpacked`` puts the same view back on them."""
    steps = [1 if n <= 1 or s > 0 else -1 if s < 0 else 0
             for n, s in zip(array.shape, array.strides)]
    distinct = array[(...,) + tuple(slice(0, 1) if step == 0 else slice(None, None, step)
                                    for step in steps)]  # (the ... keeps a 0-d one an array)
    # (a stable sort: axes of equal strides, of length 1, keep their order)
    order = sorted(range(array.ndim), key=lambda a: -distinct.strides[a])
    layout = np.array(order + steps, dtype=np.int64)
    body = HEADER + layout.nbytes
    message = np.empty(body + distinct.size * array.itemsize, dtype=np.uint8)
    message[:HEADER] = np.array([run], dtype=np.int64).view(np.uint8)
    message[HEADER:body] = layout.view(np.uint8)
    elements = message[body:].view(array.dtype).reshape([distinct.shape[a] for a in order])
    elements[...] = distinct.transpose(order)  # (the one copy: into the message)
    return message


def _unpacked(message: np.ndarray, route: Route) -> np.ndarray:
    """The array that ``_packed`` put in ``message``, as a view of the message with the
    layout it had on the sending rank (a broadcast one is read-only, as in one process)."""
    ndim = len(route.shape)
    layout = [int(v) for v in message[HEADER:HEADER + 16 * ndim].view(np.int64)]
    order, steps = layout[:ndim], layout[ndim:]
    elements = message[HEADER + 16 * ndim:].view(route.dtype)
    distinct = elements.reshape([1 if steps[a] == 0 else route.shape[a] for a in order])
    distinct = distinct.transpose(np.argsort(order))[(...,) + tuple(
        slice(None, None, step or 1) for step in steps)]
    return np.broadcast_to(distinct, route.shape) if 0 in steps else distinct


def run_across_ranks(session: Any, resolve: Callable[[], list[Node]], feed_dict: dict
                     ) -> tuple[list[Node], dict, list]:
    """``Session.run`` for a graph that spans ranks: see the module's docstring. The
    fetches are ``resolve()``'s, found inside the run (an error there is every rank's);
    returns them, the values and the assignments."""
    if distributed.world_for_names() == 1:  # say so before starting MPI for nothing
        _check_placement(session._plan(resolve(), session._feeds(feed_dict)).plan, 1)
    w = world()
    # The run's number first: every refusal below (another thread, a closed session, a
    # bad feed) uses it up and tells the other ranks, whose runs of it fail too, so that
    # every rank's next run has the same number. (A rank that refused before taking it
    # paired its next run with the others' current one: another call's values, silently.)
    number, epoch = w.next_run()
    talk = _Conversation(w, number)
    rendezvous: MPIRendezvous | None = None
    runs: list[tuple[str, Run]] = []  # this rank's partitions' runs, once made
    try:
        # (first: a closed session or a bad fetch is refused as such from any thread, and
        # a refused call makes no thread the one that runs)
        fetches = resolve()
        if not w.claim():
            raise distributed.DistributedError(
                f"rank {w.rank}: cross-rank runs come from one thread of each process (the "
                f"first one's, while it lives): ranks pair their runs in the order they make "
                f"them, and runs from two threads would pair in whatever order the threads "
                f"come. Make them from one thread (or all with one Session's run_async, "
                f"which has one thread)")
        with _heartbeat(talk):  # (planning may outlast the timeout: the others must know)
            feeds = session._feeds(feed_dict)
            planned = session._plan(fetches, feeds)
            plan = planned.plan
            _check_placement(plan, w.size)
            fingerprint = planned.fingerprint
            if fingerprint is None:
                fingerprint = planned.fingerprint = _fingerprint(plan, fetches)
        talk.restart_clock()
        # (every run, not only a plan's first: ranks that agreed on two plans may run
        # them crosswise later, and would pair each other's messages without a word)
        _compare_plans(talk, fingerprint, len(plan), _feed_digests(plan, feeds))
        with _heartbeat(talk):  # (a large partition's executors take a while to make)
            parts = session._partition(fetches, feeds)
            outgoing, incoming = _routes(parts, w)
            rendezvous = MPIRendezvous(w, number, epoch, outgoing, incoming)
            wall, start = time.time(), time.perf_counter()
            mine = [name for name in parts if not get_device(name).remote]
            runs = session._partition_runs(parts, mine, fetches, feeds, rendezvous, start)
        talk.restart_clock()  # (this rank's own work is no silence of the others: their
        # 'alive' messages wait, unread, in the queue meanwhile)
        threads = session._start_executors(runs)
        _progress(talk, rendezvous, threads, [run for _, run in runs])
        values, assigns = session._collect(parts, [run for _, run in runs])
        _finish_sends(talk, rendezvous)
        here = RunStats.merge([run for _, run in runs]) if runs else None
        done = _done_payload(w.rank, fetches, values, here, wall)
        talk.tell_all("done", done)
        others = talk.wait_all("done", "'done' message (its fetched values)")
        everyone = {w.rank: done, **others}
        session.last_run = _merge_stats(everyone)
        for payload in others.values():
            for index, value in payload["values"].items():
                values[id(fetches[index])] = value
        w.flush()
        return fetches, values, assigns
    except BaseException as exc:
        if rendezvous is not None:
            rendezvous.abort(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            rendezvous.cancel()
        if runs:  # a failed run's statistics show how far it got, as in one process
            session.last_run = RunStats.merge([run for _, run in runs])
        with w.lock:  # every rank's run fails, so every rank moves on to the same epoch
            w.epoch += 1
        if not isinstance(exc, RemoteRankError):
            talk.tell_all("abort", _describe(w.rank, exc))
            w.flush(wait=1.0)
            _name_rank(exc, w.rank)
        raise


@contextmanager
def _heartbeat(talk: _Conversation) -> Iterator[None]:
    """Let the world's heartbeat thread speak for this run while this thread does long
    work of its own (planning), during which it polls nothing."""
    talk.w.planning = talk
    try:
        yield
    finally:
        talk.w.planning = None


def _progress(talk: _Conversation, rendezvous: MPIRendezvous, threads: list[threading.Thread],
              runs: list) -> None:
    """While the executors run: deliver arrivals, read control messages, watch the time."""
    pause = _Pause()
    while any(t.is_alive() for t in threads):
        arrived = rendezvous.progress()
        for rank in arrived:
            talk.heard_from(rank)
        try:
            talk.poll()
            late = talk.silent(set(rendezvous.owing))  # (the ranks, not every key: per pass)
            if late is not None:
                owed = rendezvous.waiting_on()
                keys = ", ".join(repr(k) for k in owed[late])
                raise RankTimeout(
                    f"rank {talk.w.rank}: Recv of {keys} timed out: rank {late} sent nothing "
                    f"for {distributed.timeout():g} s. Did every rank call Session.run with "
                    f"the same graph, fetches and feeds? (mg.distributed.set_timeout changes "
                    f"the limit)")
        except BaseException as exc:
            rendezvous.abort(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            for t in threads:  # the executors stop at once: every Recv was woken
                t.join()
            raise
        if any(run.error is not None for run in runs):
            for t in threads:
                t.join()
            return
        pause.wait(bool(arrived))


def _finish_sends(talk: _Conversation, rendezvous: MPIRendezvous) -> None:
    pause = _Pause()
    while not rendezvous.sends_done():
        talk.poll()
        pause.wait()


def _check_placement(plan: list[Node], size: int) -> None:
    for n in plan:
        if n.device.rank is None:
            raise distributed.DistributedError(
                f"node '{n.name}' ({n.op}), created at {describe_location(n.location)}, is on "
                f"'{n.device.name}', a device without a rank prefix, in a graph that spans MPI "
                f"ranks. Every rank builds the same graph, so an unprefixed device would be a "
                f"different process on each rank: place it with `with mg.device("
                f"'rank:R/{n.device.name}'):`")
        if n.device.rank >= size:
            raise distributed.DistributedError(
                f"node '{n.name}' ({n.op}) is on {n.device.name}, but this world has {size} "
                f"process(es): run the program with `mpiexec -n {n.device.rank + 1} python ...`")


def _fingerprint(plan: list[Node], fetches: list[Node]) -> str:
    """A digest of what every rank must agree on: each node's name, op, device, shape,
    dtype, arguments (its inputs' names, and numbers such as the 2.0 of ``x * 2.0``),
    control inputs and parameters (an axis, a dtype), each constant's value, and the
    fetches. (A variable's value is not in it: each rank keeps its own copy, current only
    on its own rank.)"""
    digest = hashlib.sha1()
    for n in plan:
        digest.update(repr((n.name, n.op, n.device.name, n.shape, n.dtype,
                            _describe_param(n.args), _describe_param(n.control_inputs),
                            _describe_param(n.params))).encode())
        if n.op == "Const":
            digest.update(_bytes_of(n.device.to_numpy(n.value)))
    digest.update(repr([f.name for f in fetches]).encode())
    return digest.hexdigest()


def _describe_param(value: Any) -> Any:
    """A parameter as text that is the same on every rank that built the same graph: an
    object's default repr holds its address, which differs between processes."""
    if isinstance(value, dict):
        return sorted((repr(k), _describe_param(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_describe_param(v) for v in value]
    if isinstance(value, Node):
        return f"node {value.name}"
    if isinstance(value, np.ndarray):
        return hashlib.sha1(_bytes_of(value)).hexdigest()
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes,
                                           np.generic, np.dtype)):
        return repr(value)
    return getattr(value, "__qualname__", type(value).__qualname__)  # a function, a class


def _bytes_of(value: Any) -> bytes:
    """A NumPy value's shape, dtype and bytes."""
    array = np.ascontiguousarray(value)
    return repr((array.shape, str(array.dtype))).encode() + array.tobytes()


def _feed_digests(plan: list[Node], feeds: dict[int, Any]) -> dict[str, str]:
    """A digest of each fed value, by placeholder name: every rank must feed the same
    (a placeholder lives on one rank, which alone reads its feed: another rank's feed of
    it would be dropped without a word)."""
    return {n.name: hashlib.sha1(_bytes_of(n.device.to_numpy(feeds[id(n)]))).hexdigest()
            for n in plan if id(n) in feeds}


def _compare_plans(talk: _Conversation, fingerprint: str, size: int,
                   feeds: dict[str, str]) -> None:
    talk.tell_all("hello", (fingerprint, size, feeds))
    theirs = talk.wait_all("hello", "plan")
    differ = {r: n for r, (f, n, _) in theirs.items() if f != fingerprint}
    if differ:
        listing = ", ".join(f"rank {r} ({n} nodes)" for r, n in sorted(differ.items()))
        raise distributed.DistributedError(
            f"rank {talk.w.rank} ({size} nodes to run) and {listing} run different graphs or "
            f"fetches: every rank must build the same graph (same names, ops, devices, "
            f"shapes, parameters, constants) and run it with the same fetches and feeds")
    for r, (_, _, their_feeds) in sorted(theirs.items()):
        names = sorted(name for name in feeds if their_feeds.get(name) != feeds[name])
        if names:
            raise distributed.DistributedError(
                f"rank {talk.w.rank} and rank {r} feed different values to placeholder(s) "
                f"{', '.join(repr(name) for name in names)}: a placeholder lives on one rank, "
                f"which alone reads its feed, so every rank must feed it the same value "
                f"(for a batch per rank, give each rank a placeholder on its own device)")


def _routes(parts: Partition, w: _World) -> tuple[dict[str, Route], dict[str, Route]]:
    """This rank's cross-rank keys, with their tags. Every rank sees every key (each
    computes the whole partition), sorts them, and gives each the tag its CRC-32 names;
    a tag already taken moves to the next free one, the same way on every rank."""
    comms = [n for n in parts.sends() if _rank(n.send_device) != _rank(n.recv_device)]
    taken: dict[int, str] = {}
    tags: dict[str, int] = {}
    for key in sorted({n.key for n in comms}):
        tag = zlib.crc32(key.encode()) % w.keyspace
        while tag in taken:
            tag = (tag + 1) % w.keyspace
        taken[tag], tags[key] = key, tag
    outgoing, incoming = {}, {}
    for send in comms:
        shape = (0,) if send.params["control"] else send.shape
        dtype = "float64" if send.params["control"] else send.dtype
        if shape is None or dtype is None:
            raise distributed.DistributedError(
                f"'{send.tensor_name}' crosses from {send.send_device} to {send.recv_device} "
                f"but its shape or dtype is unknown, so the receiving rank cannot allocate it")
        src, dst = _rank(send.send_device), _rank(send.recv_device)
        if src == w.rank:
            outgoing[send.key] = Route(send.key, dst, tags[send.key], tuple(shape), dtype,
                                       send.name)
        elif dst == w.rank:
            incoming[send.key] = Route(send.key, src, tags[send.key], tuple(shape), dtype,
                                       send.name)
    return outgoing, incoming


def _rank(device: str) -> int:
    # (never None here: _check_placement refused the devices without a rank prefix)
    return cast(int, get_device(device).rank)


def _done_payload(rank: int, fetches: list[Node], values: dict, stats: RunStats | None,
                  wall: float) -> dict:
    """What this rank tells the others at the end: its fetched values, its events (on
    the wall clock, so that ranks share one timeline) and its bytes."""
    mine = {i: np.asarray(f.device.to_numpy(values[id(f)])) for i, f in enumerate(fetches)
            if f.device.rank == rank}
    events = []
    if stats is not None:
        for e in stats.events:
            events.append({**e, "ts": e["ts"] + wall * 1e6, "rank": rank})
    return {"values": mine, "events": events, "wall": wall,
            "moved": stats.bytes_moved if stats else {},
            "peak": stats.peak_bytes if stats else {},
            "low": stats.lower_bound if stats else {},
            "total": stats.total_bytes_by_device if stats else {}}


def _merge_stats(everyone: dict[int, dict]) -> RunStats:
    """One RunStats for the whole world; time 0 is the earliest rank's start."""
    zero = min(p["wall"] for p in everyone.values()) * 1e6
    events = sorted(({**e, "ts": e["ts"] - zero} for p in everyone.values()
                     for e in p["events"]), key=lambda e: e["ts"])
    moved: dict[tuple[str, str], int]  # (from device, to device) -> bytes
    peak, low, total, moved = {}, {}, {}, {}
    for p in everyone.values():
        peak.update(p["peak"])
        low.update(p["low"])
        total.update(p["total"])
        for link, n in p["moved"].items():
            moved[link] = moved.get(link, 0) + n
    return RunStats([e["name"] for e in events], events, peak, low, total, [], moved)


def _describe(rank: int, exc: BaseException) -> dict:
    return {"rank": rank, "node": getattr(exc, "node", None), "op": getattr(exc, "op", None),
            "type": type(exc).__name__, "message": str(exc)}


def _remote_error(payload: dict) -> RemoteRankError:
    where = (f"in node '{payload['node']}' (op {payload['op']})" if payload["node"]
             else "outside any node")
    return RemoteRankError(f"rank {payload['rank']} failed {where}, so this run stopped on "
                           f"every rank: {payload['type']}: {payload['message']}")


def _name_rank(exc: BaseException, rank: int) -> None:
    """Put ``rank R:`` in front of this rank's own error (its type stays, so ``except
    ShapeError`` still works)."""
    if exc.args and isinstance(exc.args[0], str) and not exc.args[0].startswith(f"rank {rank}"):
        exc.args = (f"rank {rank}: {exc.args[0]}",) + exc.args[1:]
