"""Running a graph that spans MPI ranks [3.1.4, beyond one process].

Every rank builds the same graph (SPMD: single program, multiple data) and calls
``sess.run(fetches, feeds)`` with the same fetches and feeds. Each rank then:

1. checks the feeds and plans the run, exactly as in one process;
2. on every run, sends every other rank a *fingerprint* of its plan (node names,
   ops, devices, shapes) and compares theirs: two ranks that built different graphs
   would wait for tensors that never come, so they are told at once instead;
3. partitions the graph (``partition.py``): every rank computes the same partition, so
   every rank knows every Send/Recv key, and the MPI *tag* of a key, a number derived
   from the key's CRC-32, is the same everywhere;
4. runs only its own partitions (devices ``rank:R/...`` with R its rank), one executor
   thread each. A Send to another rank posts a non-blocking MPI send (``Isend``); every
   Recv from another rank posted its non-blocking receive (``Irecv``) when the run began,
   so a message lands in its buffer as soon as it arrives. The calling thread meanwhile
   *progresses* the requests (``Testsome``) and hands arrived tensors to the rendezvous,
   which wakes the Recv nodes, as in one process;
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
rank is not mistaken for a dead one. Control messages (hello, alive, done, abort) carry
the run's number, so a late one from a failed run is recognised and dropped; data
messages of a failed run may be left undelivered, so after a failure every rank moves to
a new *epoch*, which shifts all data tags.

Control messages are pickled Python objects (mpi4py's lowercase API), which is fine
between the ranks of one job; tensors travel as raw buffers (the uppercase API), with
their shape and dtype known to both sides from the graph.
"""

from __future__ import annotations

import hashlib
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, cast

import numpy as np

from .. import distributed
from ..device import get_device
from ..errors import MinigraphError
from ..graph.graph import Node, describe_location
from .partition import Partition
from .profile import RunStats
from .rendezvous import Rendezvous

CONTROL = 0  # the tag of control messages; data tags start at 1


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
        # A communicator of our own, so that the user's messages on mg.distributed.comm()
        # and ours never meet (mpi4py's send has tag 0, our control tag, and its recv
        # takes any tag). Making it is collective: every rank makes its first cross-rank
        # run at the same point of the program, and creates the world there; a rank
        # that does not come is waited for as long as a run waits for news.
        self.comm, request = distributed.comm().Idup()
        deadline = time.monotonic() + distributed.timeout()
        while not request.Test():
            if time.monotonic() > deadline:
                raise RankTimeout(
                    f"rank {distributed.rank()}: the first cross-rank run waits for every "
                    f"rank to start its own, and some rank did not for "
                    f"{distributed.timeout():g} s. Did every rank call Session.run with the "
                    f"same fetches?")
            time.sleep(0.001)
        # Ranks pair their runs in the order they make them; runs from two threads of a
        # rank would pair in whatever order the threads happened to come (values of
        # another run's feeds, silently): every run comes from this thread.
        self.thread = threading.get_ident()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.run_id = 0
        self.epoch = 0
        self.early: list[tuple[int, int, str, Any]] = []  # (source, run, kind, payload)
        self.outbox: list[Any] = []  # requests of control messages still in flight
        tag_ub = self.comm.Get_attr(MPI.TAG_UB) or 32767
        self.keyspace = min(1 << 20, (tag_ub + 1) // 16)  # tags per epoch
        self.epochs = (tag_ub - 1) // self.keyspace

    def tag(self, route: Route) -> int:
        return 1 + (self.epoch % self.epochs) * self.keyspace + route.tag

    def send_control(self, dest: int, run: int, kind: str, payload: Any) -> None:
        self.outbox.append(self.comm.isend((run, kind, payload), dest=dest, tag=CONTROL))

    def flush(self, wait: float = 0.0) -> None:
        """Forget control sends that completed; with ``wait``, give them that long."""
        deadline = time.monotonic() + wait
        while True:
            self.outbox = [r for r in self.outbox if not r.Test()]
            if not self.outbox or time.monotonic() >= deadline:
                return
            time.sleep(0.001)


_world: _World | None = None


def world() -> _World:
    global _world
    if _world is None:
        import atexit

        _world = _World()
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
    over MPI."""

    def __init__(self, w: _World, outgoing: dict[str, Route], incoming: dict[str, Route]):
        super().__init__()
        self.w = w
        self.outgoing = outgoing
        self.sends: list[tuple[Any, np.ndarray]] = []  # (request, buffer kept alive)
        self.recvs: list[tuple[Any, np.ndarray, Route]] = []
        self.owing: dict[int, int] = {}  # rank -> how many of the Recvs it owes us
        for route in incoming.values():  # every receive is posted before anything runs
            buffer = np.empty(route.shape, dtype=route.dtype)
            request = w.comm.Irecv(buffer, source=route.peer, tag=w.tag(route))
            self.recvs.append((request, buffer, route))
            self.owing[route.peer] = self.owing.get(route.peer, 0) + 1

    def send(self, key: str, value: Any) -> None:
        route = self.outgoing.get(key)
        if route is None:
            return super().send(key, value)
        buffer = np.asarray(value, order="C")  # (ascontiguousarray would make 0-d 1-d)
        if buffer.shape != route.shape or buffer.dtype != np.dtype(route.dtype):
            raise RuntimeError(  # a wrong buffer would be read as garbage on the other side
                f"Send {key!r}: the value has shape {buffer.shape} and dtype {buffer.dtype}, "
                f"but the graph says {route.shape} {route.dtype}")
        with self._lock:
            if self.error is not None:  # The run failed: its receiver has withdrawn the
                # Recv (cancel), so this send would never be matched, and its tag comes
                # back once the epochs wrap round: a later run would read this tensor.
                return
            request = self.w.comm.Isend(buffer, dest=route.peer, tag=self.w.tag(route))
            self.sends.append((request, buffer))
            self.sent_bytes += buffer.nbytes

    def progress(self) -> list[int]:
        """Deliver the tensors that arrived; return the ranks they came from."""
        if not self.recvs:
            return []
        MPI = distributed._mpi()
        done = MPI.Request.Testsome([r for r, _, _ in self.recvs]) or []
        arrived = [self.recvs[i] for i in done]
        gone = set(done)  # (once: a set per element made a long chain's run quadratic)
        self.recvs = [x for i, x in enumerate(self.recvs) if i not in gone]
        for _, buffer, route in arrived:
            self._put(route.key, buffer)
            self.owing[route.peer] -= 1
            if not self.owing[route.peer]:
                del self.owing[route.peer]
        return [route.peer for _, _, route in arrived]

    def sends_done(self) -> bool:
        with self._lock:
            self.sends = [(r, b) for r, b in self.sends if not r.Test()]
            return not self.sends

    def waiting_on(self) -> dict[int, list[str]]:
        """The ranks that owe us tensors, and the keys of those Recvs."""
        owed: dict[int, list[str]] = {}
        for _, _, route in self.recvs:
            owed.setdefault(route.peer, []).append(route.key)
        return owed

    def cancel(self) -> None:
        """Withdraw the receives still posted (a failed run's tensors may never come)."""
        for request, _, _ in self.recvs:
            request.Cancel()
            request.Wait()
        self.recvs, self.owing = [], {}


def run_across_ranks(session: Any, resolve: Callable[[], list[Node]], feed_dict: dict
                     ) -> tuple[list[Node], dict, list]:
    """``Session.run`` for a graph that spans ranks: see the module's docstring. The
    fetches are ``resolve()``'s, found inside the run (an error there is every rank's);
    returns them, the values and the assignments."""
    if distributed.world_for_names() == 1:  # say so before starting MPI for nothing
        _check_placement(session._plan(resolve(), session._feeds(feed_dict)), 1)
    w = world()
    if threading.get_ident() != w.thread:
        raise distributed.DistributedError(
            f"rank {w.rank}: cross-rank runs come from one thread of each process (the "
            f"first one's): ranks pair their runs in the order they make them, and runs "
            f"from two threads would pair in whatever order the threads come. Make them "
            f"from one thread (or all with one Session's run_async, which has one thread)")
    w.run_id += 1
    talk = _Conversation(w, w.run_id)
    rendezvous: MPIRendezvous | None = None
    try:
        fetches = resolve()
        feeds = session._feeds(feed_dict)
        plan = session._plan(fetches, feeds)
        _check_placement(plan, w.size)
        fingerprint = session._fingerprints.get(id(plan))
        if fingerprint is None:
            fingerprint = session._fingerprints[id(plan)] = _fingerprint(plan, fetches)
        # (every run, not only a plan's first: ranks that agreed on two plans may run
        # them crosswise later, and would pair each other's messages without a word)
        _compare_plans(talk, fingerprint, len(plan))
        parts = session._partition(fetches, feeds)
        outgoing, incoming = _routes(parts, w)
        rendezvous = MPIRendezvous(w, outgoing, incoming)
        wall, start = time.time(), time.perf_counter()
        mine = [name for name in parts if not get_device(name).remote]
        runs = session._partition_runs(parts, mine, fetches, feeds, rendezvous, start)
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
        w.epoch += 1  # every rank's run fails, so every rank moves on to the same epoch
        if not isinstance(exc, RemoteRankError):
            talk.tell_all("abort", _describe(w.rank, exc))
            w.flush(wait=1.0)
            _name_rank(exc, w.rank)
        raise


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
    text = repr([(n.name, n.op, n.device.name, n.shape, n.dtype) for n in plan]
                + [f.name for f in fetches])
    return hashlib.sha1(text.encode()).hexdigest()


def _compare_plans(talk: _Conversation, fingerprint: str, size: int) -> None:
    talk.tell_all("hello", (fingerprint, size))
    theirs = talk.wait_all("hello", "plan")
    differ = {r: n for r, (f, n) in theirs.items() if f != fingerprint}
    if differ:
        listing = ", ".join(f"rank {r} ({n} nodes)" for r, n in sorted(differ.items()))
        raise distributed.DistributedError(
            f"rank {talk.w.rank} ({size} nodes to run) and {listing} run different graphs or "
            f"fetches: every rank must build the same graph (same names, ops, devices, "
            f"shapes) and run it with the same fetches and feeds")


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
