"""``mg.Session``: run a graph [3.1.2, 3.1.4].

``sess.run(fetches, feed_dict)`` does what TensorFlow 1's session did:

1. check the feeds against their placeholders (shape, dtype) and put them on the
   placeholders' devices;
2. keep only the nodes the fetches need (a fed node's own inputs are not needed);
3. run those nodes with the scheduler (``scheduler.py``): in FIFO topological order with
   ``workers=1``, on a pool of threads otherwise; each node's kernel runs on its
   device's array namespace, and memory is recycled as ``memory.py`` describes. The
   plan (order, dependency counts) is made once per fetches and feeds, at the first
   run, and reused by the runs after it; so is, for serial runs on one device, untraced
   and not in debug mode, the memory (``memory.MemoryPlan``), once per setting of
   ``recycle``;
4. return the fetched values as NumPy values, in the structure of ``fetches`` (a node,
   a name, or lists, tuples (namedtuples too, as TF1) and dicts of them).

A failing node raises an error that names the node, its op and the line of user code
that created it. Nothing is left half-done: variables are assigned only after the whole
run has succeeded, so a failed run leaves them as they were and the session usable.
``sess.last_run`` tells what the run did (``profile.py``); ``run_async`` returns a future
at once and runs in the background, as a GPU runs the work a program has queued.

What a run hands back is the caller's own (a value that shares no memory with anything
the library keeps or reuses), and what a run keeps is its own:

* a fetched value that is a variable's or a constant's buffer, a fed array (or a view
  of one of these), or the same buffer as an earlier fetch of the same run, is copied;
  every other fetched value was made by this run and is handed over as it is (the
  recycling pool of a run dies with the run, so nothing writes into it later);
* an ``Assign`` stores a copy (``scheduler.compute``): never the caller's fed array,
  another variable's buffer, or an intermediate the pool is about to reuse.

Runs may come from several threads at once. A run that reads or writes variables holds
its graph's state lock from start to commit (variables live on the graph, shared by its
sessions), so concurrent runs give the results of some serial order: no lost update, no
run that sees half of another's assignments. Runs of pure functions run side by side.
NumPy's floating-point error settings of the calling thread (``np.errstate``) apply to
the run's kernels on whatever thread they execute (``scheduler.Run``).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import defaultdict
from contextlib import nullcontext
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from array_api_compat import array_namespace

from ..device import copy_keeping_layout, get_device
from ..errors import DeviceError, MinigraphError
from ..graph.graph import (Graph, GraphError, Node, check_feedable, check_graph,
                           default_graph, describe_location, fed_value)
from ..graph.topo import fifo_order, needed, refuse_reads_after_assigns
from ..tensor import Tensor, as_flag
from .cost import CostModel
from .memory import Memory, MemoryPlan, plan_memory, root
from .partition import Partition, partition
from .profile import RunStats
from .rendezvous import Rendezvous
from .scheduler import FeedError, Layout, NodeError, Run, can_overlap, unfed  # noqa: F401 - FeedError, NodeError are re-exported


class _Flag:
    """A setting of the Session that is on or off (``recycle``, ``debug``, ``trace``),
    checked whenever it is set: refused unless a bool, as Python's truthiness would take
    trace="no" for yes, and debug="off" would poison."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, f"_{name}"

    def __get__(self, session: Any, owner: type | None = None) -> Any:
        return self if session is None else getattr(session, self.slot)

    def __set__(self, session: Any, value: Any) -> None:
        setattr(session, self.slot, as_flag("Session", value, self.name))


class SessionClosedError(MinigraphError, RuntimeError):
    """A closed session was asked to run (TensorFlow's "Attempted to use a closed
    Session")."""


# At most this many plans per session (Planned, or a Partition), the least recently
# used dropped first: a loop over many fetches (``for y in ys: sess.run(y)``), or a graph that grows
# between runs (its size is part of every key), would otherwise keep every plan it made,
# some kilobytes per node each (as signature._MOST_PROGRAMS bounds compiled programs).
_MOST_PLANS = 64


class Planned:
    """What a session keeps for one run's fetches and feeds, made once: the nodes to
    run in FIFO order (``plan``), their dependency counts (``layout``), whether one of
    them reads or writes a variable (``stateful``: runs take the graph's state lock),
    whether all are on one device (``one_device``: no partition), the memory decided
    before the first serial run with each ``recycle`` setting (``memory``:
    memory.MemoryPlan, or None), and what ranks compare (``fingerprint``: mpi_run)."""

    __slots__ = ("plan", "layout", "stateful", "one_device", "memory", "fingerprint")

    def __init__(self, plan: list[Node], feeds: Mapping[int, Any]):
        self.plan = plan
        self.layout = Layout(plan, set(feeds))
        self.stateful = any(n.op in ("Variable", "Assign") for n in plan)
        self.one_device = len({n.device.name for n in plan}) == 1
        self.memory: dict[bool, MemoryPlan | None] = {}
        self.fingerprint: str | None = None


class Session:
    """Runs (parts of) a graph.

    ``workers``: threads of the scheduler (1: the deterministic serial FIFO order);
    ``cost_model``: ``"static"`` (by op and size) or ``"measured"`` (moving averages of
    run times); ``recycle``: reuse freed buffers (SINGA's memory optimisation);
    ``debug``: poison freed buffers, so a read after free shows up as NaN;
    ``trace``: record a trace event per node and the memory curve in ``last_run``
    (timelines, Chrome traces), at a cost per node, so off unless asked for, as
    TensorFlow's ``RunOptions(trace_level=FULL_TRACE)``; the order, the peaks of
    memory and the bytes moved are always there (a run across devices is always
    traced: the order of its executors' nodes comes from the events' clock).

    ``devices``: the devices the session may run nodes on (TensorFlow's
    ``ConfigProto(device_filters=...)``), fixed when it is made: a run that needs a node
    placed on another device is refused, naming the node and the line that made it.
    None (the default): every device.

    ``workers``, ``recycle``, ``debug`` and ``trace`` may be changed between runs
    (``sess.trace = True``): the next run takes the new setting, as TensorFlow takes
    its ``RunOptions`` per run, and they are checked when set as when the session is
    made.
    """

    def __init__(self, graph: Graph | None = None, workers: int = 1,
                 cost_model: str = "static", recycle: bool = True, debug: bool = False,
                 trace: bool = False, devices: "Sequence[str] | None" = None):
        if cost_model not in ("static", "measured"):
            raise ValueError(f"Session: cost_model is 'static' or 'measured', got {cost_model!r}")
        names = None if devices is None or isinstance(devices, str) else \
            list(devices) if hasattr(devices, "__iter__") else None
        if devices is not None and not names:  # (a NumPy array, a tuple, a set: lists)
            raise TypeError(f"Session: devices is a list of device names, such as "
                            f"['cpu', 'cpu:1'], or None for every device; got {devices!r}")
        self._devices = None if names is None else \
            frozenset(get_device(d).name for d in names)  # (an unknown one: refused here)
        self.graph = check_graph(graph, "Session") if graph is not None else default_graph()
        self.workers = workers
        self.recycle = recycle
        self.debug = debug
        self.trace = trace
        self.costs = CostModel() if cost_model == "measured" else None
        self.last_run: RunStats | None = None
        # what each run's fetches and feeds need (Planned), and Partitions under keys that
        # start with "partition": at most _MOST_PLANS, the oldest dropped first (_keep)
        self._plans: dict[tuple, Planned | Partition] = {}
        # id(part's graph) -> its plan, dropped with its Partition (_keep): the plan holds
        # the graph (its nodes' .graph), so the id is no other graph's while it is here
        self._part_plans: dict[int, Planned] = {}
        self._pools: dict[tuple[str, int], ThreadPoolExecutor] = {}  # (device, workers) ->
        self._background: ThreadPoolExecutor | None = None
        self._closed = False
        self._running = 0  # runs in flight, which close() lets finish
        self._idle = threading.Condition()
        self._ranks: tuple[int, set[int]] = (-1, set())  # (graph size, ranks its nodes use)
        self._accounting = ""  # how the last run on one device counted its memory (Run)
        # guards the caches above when several threads run at once (a plan made twice
        # would be made for nothing; one dropped while another thread adds one, lost)
        self._cache_lock = threading.RLock()
        self._background_thread = -1  # its thread's ident, once it ran something (close)

    # -- the settings, checked whenever they are set -------------------------------------
    @property
    def workers(self) -> int:
        return self._workers

    @workers.setter
    def workers(self, workers: int) -> None:
        # (workers="2" reached the comparison below: Python's "'<' not supported")
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)):
            raise TypeError(f"Session: workers must be an int, got {type(workers).__name__} "
                            f"{workers!r}")
        if workers < 1:
            raise ValueError(f"Session: workers must be >= 1, got {workers}")
        self._workers = int(workers)

    recycle = _Flag()
    debug = _Flag()
    trace = _Flag()

    def run(self, fetches: Any, feed_dict: dict | None = None) -> Any:
        """Compute ``fetches`` (a node or a structure of nodes) and return NumPy values."""
        with self._idle:
            if not self._spans_ranks():  # (a run across ranks refuses inside: see _run)
                self._check_open("run")
            self._running += 1
        try:
            return self._run(fetches, feed_dict)
        finally:
            with self._idle:
                self._running -= 1
                if self._closed:  # (a close() waits for this run)
                    self._idle.notify_all()

    def _run(self, fetches: Any, feed_dict: dict | None) -> Any:
        if self._spans_ranks():  # every rank runs its part; MPI carries the rest
            from .mpi_run import run_across_ranks

            def resolve() -> list[Node]:
                # (checked inside the run: a rank that refuses its call takes part in the
                # run still and tells the others, so that every rank's runs stay in step;
                # one that refused alone made the others pair with its next call)
                self._check_open("run")
                _check_feed_dict("run", feed_dict)
                return [self._node(f) for f in _flatten(fetches)]

            with _state_lock(self.graph):
                flat, values, assigns = run_across_ranks(self, resolve, feed_dict or {})
                kept = [n.value for n in self.graph.nodes if n.op in ("Const", "Variable")]
                kept += [np.asarray(v) for v in (feed_dict or {}).values()]
                # (the structure before the commit: a run that fails leaves the state as it was)
                fetched = _rebuild(fetches, iter(_handed_over(flat, values, kept)))
                _commit(assigns)
            return fetched
        _check_feed_dict("run", feed_dict)
        flat = [self._node(f) for f in _flatten(fetches)]
        if not flat:  # (TF1's run([]): the feeds are checked, nothing runs)
            self._feeds(feed_dict or {})
            return _rebuild(fetches, iter(()))
        feeds = self._feeds(feed_dict or {})
        planned = self._plan(flat, feeds)
        with _state_lock(self.graph) if planned.stateful else nullcontext():
            if planned.one_device:
                values, assigns = self._run_on_one_device(planned, flat, feeds)
            else:
                values, assigns = self._run_partitioned(flat, feeds)
            kept = list(feeds.values()) + [n.value for n in planned.layout.stored]
            fetched = _rebuild(fetches, iter(_handed_over(flat, values, kept)))
            _commit(assigns)  # (last: nothing after it may fail)
        return fetched

    def _new_run(self, plan: list[Node], feeds: dict, fetches: list[Node], start: float,
                 rendezvous: Rendezvous | None = None, layout: Layout | None = None) -> Run:
        layout = layout if layout is not None else Layout(plan, set(feeds))
        external = list(feeds.values()) + [n.value for n in layout.stored]
        memory = Memory(plan, fetches, external, self.recycle, self.debug, start,
                        layout.counts, curve=self.trace or rendezvous is not None)
        cost_of = self.costs.cost if self.costs is not None else _static
        return Run(plan, feeds, fetches, memory, cost_of,
                   self.costs.record if self.costs is not None else None, rendezvous, layout,
                   trace=self.trace or rendezvous is not None)

    def _execute(self, run: Run, pool: ThreadPoolExecutor | None) -> None:
        if pool is None:
            run.run_serial()
        else:
            run.run_threaded(pool)

    def _run_on_one_device(self, planned: Planned, fetches: list[Node],
                           feeds: dict) -> tuple[dict, list]:
        plan, layout = planned.plan, planned.layout
        run = self._new_run(plan, feeds, fetches, time.perf_counter(), layout=layout)
        # Threads pay only where two expensive nodes can run at the same time. In any
        # other plan (cheap nodes alone, or expensive ones that wait for each other)
        # the threads would hand work along one at a time, so the run takes the serial
        # walk, which skips the ready counts and the locks: a second worker costs nothing.
        pool = None
        if self.workers > 1 and (layout.overlaps if self.costs is None else
                                 can_overlap(plan, self.costs.cost)):
            pool = self._pool_for(plan[0].device.name)
        memory_plan = self._memory_plan(planned, fetches, feeds, run) if pool is None else None
        try:
            if memory_plan is not None:
                run.run_planned(memory_plan)  # the serial walk, its memory decided already
            else:
                self._execute(run, pool)
        finally:  # a failed run's statistics show how far it got
            self.last_run = RunStats.merge([run])
            self._accounting = run.accounting  # (tests read it: "planned", "fallback" ...)
        return run.values, run.assigns

    def _run_partitioned(self, fetches: list[Node], feeds: dict) -> tuple[dict, list]:
        """One executor per device, in its own thread, meeting at a rendezvous."""
        parts = self._partition(fetches, feeds)
        runs = self._partition_runs(parts, list(parts), fetches, feeds, Rendezvous(),
                                    time.perf_counter())
        self._run_executors(runs)
        self.last_run = RunStats.merge([run for _, run in runs])
        return self._collect(parts, [run for _, run in runs])

    def _partition_runs(self, parts: Partition, names: list[str], fetches: list[Node],
                        feeds: dict, rendezvous: Rendezvous, start: float) -> list[tuple[str, Run]]:
        """A run for each partition in ``names``, all meeting at ``rendezvous``.

        A partition's FIFO order and its layout (``Layout``: the dependency counts) are
        made at its first run and kept, as ``_plan`` keeps a plan's: which of its nodes
        are fed is fixed by the partition's key (``_partition``), and walking a large
        graph's edges anew on every run cost more than the run itself."""
        runs = []
        for name in names:
            graph = parts[name]
            origin = {id(n): parts.origins.get(id(n), []) for n in graph.nodes}
            for n in graph.nodes:  # (a cached partition's variables hold the values of the
                if n.op == "Variable" and origin[id(n)]:  # run that made it: a commit
                    n.value = origin[id(n)][0].value  # since changed the graph's)
            own_feeds = {id(n): feeds[id(o)] for n in graph.nodes
                         for o in origin[id(n)] if id(o) in feeds}
            own_fetches = [parts.copies[id(f)] for f in fetches
                           if parts.copies[id(f)].graph is graph]
            with self._cache_lock:
                planned = self._part_plans.get(id(graph))
                if planned is None:
                    planned = self._part_plans[id(graph)] = Planned(fifo_order(
                        graph.nodes, {id(n) for n in graph.nodes}, set(own_feeds)), own_feeds)
            runs.append((name, self._new_run(planned.plan, own_feeds, own_fetches, start,
                                             rendezvous, planned.layout)))
        return runs

    def _start_executors(self, runs: list[tuple[str, Run]],
                         started: list[threading.Thread] | None = None) -> list[threading.Thread]:
        """One thread per device executor (each with its own pool when workers > 1),
        each added to ``started`` before it starts (so that an interrupted start still
        knows which threads to stop)."""
        threads = [threading.Thread(target=_capture, args=(self._execute, run,
                                                           self._pool_for(name)),
                                    name=f"minigraph-{name}", daemon=True)
                   for name, run in runs]
        started = started if started is not None else []
        for t in threads:
            started.append(t)
            t.start()
        return threads

    def _run_executors(self, runs: list[tuple[str, Run]]) -> None:
        """Start the device executors and wait for them. Interrupted (Ctrl-C, or any
        exception raised in this thread, while starting or waiting), stop every executor
        and wait for them still, so that no thread of the run outlives it and goes on
        computing, or writing into the session's state."""
        threads: list[threading.Thread] = []
        try:
            self._start_executors(runs, threads)
            for t in threads:
                t.join()
        except BaseException as exc:
            for _, run in runs:
                run._stop(exc)
            for t in threads:
                if t.ident is not None:  # (a start that was interrupted may not have begun)
                    t.join()
            raise

    def _collect(self, parts: Partition, runs: list[Run]) -> tuple[dict, list]:
        """Raise the first executor's error, or gather the values and the assignments."""
        errors = [r.error for r in runs if r.error is not None]
        if errors:
            raise errors[0]
        values = {}
        for run in runs:
            for n in run.plan:
                if id(n) in run.values:  # (a Recv stands for every transfer it replaced)
                    for original in parts.origins.get(id(n), ()):
                        values[id(original)] = run.values[id(n)]
        # (an Assign stands for itself alone: only a shared Recv stands for several)
        assigns = [(parts.origins[id(var)][0], v) for run in runs for var, v in run.assigns]
        return values, assigns

    @property
    def devices(self) -> "list[str] | None":
        """The devices this session may run nodes on (None: every device)."""
        return None if self._devices is None else sorted(self._devices)

    def _spans_ranks(self) -> bool:
        """Whether the graph places nodes on ``rank:R/...`` devices that make a run a
        collective of several processes (cached until the graph grows)."""
        count = len(self.graph.nodes)
        if self._ranks[0] != count:
            self._ranks = (count, {n.device.rank for n in self.graph.nodes
                                   if n.device.rank is not None})
        ranks = self._ranks[1]
        if not ranks:
            return False
        from .. import distributed

        return distributed.world_for_names() > 1 or ranks != {0}

    def _partition(self, fetches: list[Node], feeds: dict) -> Partition:
        key = ("partition", len(self.graph.nodes), tuple(map(id, fetches)), tuple(sorted(feeds)))
        with self._cache_lock:
            parts = self._plans.pop(key, None)  # (put back last, as _plan does)
            if parts is not None:
                self._plans[key] = parts
            else:
                parts = self._keep(key, partition(self.graph, fetches, set(feeds)))
            assert isinstance(parts, Partition)
            return parts

    def _keep(self, key: tuple, value: "Planned | Partition") -> "Planned | Partition":
        """``value`` kept under ``key``, the least recently used of the plans dropped
        beyond :data:`_MOST_PLANS` (a dict keeps the order of insertion, and a plan used
        is put back last; a run that holds one dropped goes on with it). The caller holds
        ``_cache_lock``."""
        self._plans[key] = value
        while len(self._plans) > _MOST_PLANS:
            dropped = self._plans.pop(next(iter(self._plans)))
            if isinstance(dropped, Partition):  # (its parts' plans with it)
                for name in dropped:
                    self._part_plans.pop(id(dropped[name]), None)
        return value

    def _pool_for(self, device: str) -> ThreadPoolExecutor | None:
        """Each device has its own workers, like a stream of its own (a pool per number
        of workers: ``sess.workers`` may change between runs)."""
        workers = self.workers  # (read once: another thread may set it meanwhile)
        if workers == 1:
            return None
        with self._cache_lock:  # (two threads must not both make the device's pool)
            if (device, workers) not in self._pools:
                self._pools[device, workers] = ThreadPoolExecutor(
                    workers, thread_name_prefix=f"minigraph-{device}")
            return self._pools[device, workers]

    def run_async(self, fetches: Any, feed_dict: dict | None = None) -> Future:
        """Start ``run`` in the background; the returned future's ``result()`` waits.
        The caller's NumPy error settings, and the feeds' values, taken now, hold for
        that run: as a GPU copies what queued work reads from the host when the work is
        queued, a later write into a fed array (or another array put in the dict) does
        not change a run already started."""
        try:
            self._check_open("run_async")
            _check_feed_dict("run_async", feed_dict)
        except (SessionClosedError, TypeError):
            if not self._spans_ranks():
                raise
            # Refused on this rank alone, the other ranks' matching runs would pair with
            # this rank's next one: across ranks the refusal is a run, made here, that
            # fails on every rank (``run`` raises the same error inside it).
            refused: Future = Future()
            try:
                refused.set_result(self.run(fetches, feed_dict))
            except BaseException as exc:  # noqa: BLE001 - the future holds it
                refused.set_exception(exc)
            return refused
        feeds = {key: _snapshot(value) for key, value in (feed_dict or {}).items()}
        with self._cache_lock:
            if self._background is None:
                self._background = ThreadPoolExecutor(1, thread_name_prefix="minigraph-async")
        return self._background.submit(self._run_with_errors, np.geterr(), fetches, feeds)

    def _run_with_errors(self, errors: Any, fetches: Any, feed_dict: dict | None) -> Any:
        """``run`` on the background thread, under ``errors`` (``np.geterr()``'s dict)."""
        self._background_thread = threading.get_ident()  # (close() must know it: see there)
        with np.errstate(**errors):
            return self.run(fetches, feed_dict)

    def close(self) -> None:
        """Stop the session's threads (also done when the session is garbage-collected).
        A closed session runs nothing more, as in TensorFlow: a run would start new
        threads that nothing would stop. Runs already started (in other threads, or by
        ``run_async``) finish first: their threads are the ones being stopped.

        Called on the background thread itself (from a ``run_async`` future's done
        callback, which runs there), it does not wait for that thread, which would wait
        for itself: the thread ends once the callback returns (and the runs queued
        behind it are refused)."""
        with self._idle:
            self._closed = True
        if self._background is not None:  # (a run queued there, not started, is refused)
            on_it = threading.get_ident() == self._background_thread
            self._background.shutdown(wait=not on_it)
        with self._idle:
            self._idle.wait_for(lambda: self._running == 0)
        for pool in self._pools.values():
            pool.shutdown(wait=True)
        self._pools, self._background = {}, None

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise SessionClosedError(f"Session.{what}: this session was closed (close(), or "
                                     f"the end of its with block); make a new mg.Session")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- preparing a run ---------------------------------------------------------------
    def _node(self, f: Any, role: str = "fetch") -> Node:
        """The node ``f`` (a node or its name) stands for, as a fetch or a feed key."""
        node = self.graph[f] if isinstance(f, str) else f
        if not isinstance(node, Node):
            if role == "feed":
                raise GraphError(f"run: feed_dict key {f!r} ({type(f).__name__}) is no graph "
                                 f"node; a key is a placeholder node or its name")
            raise GraphError(f"run: cannot fetch a {type(f).__name__}; fetch graph nodes")
        if node.graph is not self.graph:
            same = " (another graph of the same name)" if node.graph.name == self.graph.name \
                else ""
            raise GraphError(f"run: {role} '{node.name}' belongs to graph {node.graph.name!r}"
                             f"{same}, not to this session's graph {self.graph.name!r}; it "
                             f"was created at {describe_location(node.location)}")
        return node

    def _feeds(self, feed_dict: dict) -> dict[int, Any]:
        feeds = {}
        for key, value in feed_dict.items():
            node = self._node(key, "feed")
            check_feedable(node, "run")
            if id(node) in feeds:  # ({x: 1.0, "x": 5.0}: which value would it take?)
                raise FeedError(f"feed for '{node.name}' (created at "
                                f"{describe_location(node.location)}): fed twice in one "
                                f"feed_dict, as the node and by its name; give it one value")
            try:
                feeds[id(node)] = _fed(node, value)
            except Exception as exc:  # the node and op travel to the other ranks
                # (an exception object takes new attributes; mypy knows only the declared)
                exc.node, exc.op = node.name, node.op  # type: ignore[attr-defined]
                raise
        return feeds

    def _plan(self, fetches: list[Node], feeds: dict[int, Any]) -> Planned:
        """What a run of ``fetches`` with ``feeds`` needs (:class:`Planned`: the nodes to
        run in FIFO order, their dependency counts ...), made once and kept (``_keep``).

        A plan is kept only once its checks have passed (every placeholder it needs is
        fed, its devices are the session's, no node reads a variable after an assign in
        it): one that failed them is not kept, and every later run is refused again."""
        key = (len(self.graph.nodes), tuple(map(id, fetches)), tuple(sorted(feeds)))
        with self._cache_lock:
            planned = self._plans.pop(key, None)  # (put back last: the least recently
            if planned is not None:              # used is the one _keep drops first)
                self._plans[key] = planned
            else:
                keep = needed(fetches, set(feeds))
                plan = fifo_order(self.graph.nodes, keep, set(feeds))
                for n in plan:  # (before any node runs, on every device: a partitioned
                    # run found it inside the placeholder's part, which fetches nothing)
                    if n.op == "Placeholder" and id(n) not in feeds:
                        raise unfed(n, fetches, set(feeds))
                    if self._devices is not None and n.device.name not in self._devices \
                            and id(n) not in feeds:  # (a fed node does not run)
                        raise DeviceError(
                            f"run: node '{n.name}' is placed on {n.device.name}, which this "
                            f"session may not use (devices={self.devices}); place it on one "
                            f"of them, or make the session with that device (created at "
                            f"{describe_location(n.location)})")
                planned = Planned(plan, feeds)
                if planned.stateful:  # (before the plan is kept: every run of it is refused)
                    refuse_reads_after_assigns(plan)
                planned = self._keep(key, planned)
            assert isinstance(planned, Planned)
            return planned

    def _memory_plan(self, planned: Planned, fetches: list[Node], feeds: dict[int, Any],
                     run: Run) -> MemoryPlan | None:
        """The memory of a serial ``run`` of ``plan`` on one device, decided before the
        first such run and kept (``memory.MemoryPlan``), or None where the run keeps the
        dynamic accounting: a traced run (its memory curve needs the clock of each
        change), a debug run (it poisons what it frees), a measured cost model (it times
        every node), or a plan the model cannot know in advance (``plan_memory``).

        Decided by the settings ``run`` was made with (``_new_run`` read them once), not
        by the session's now: they may change between runs, and a plan made for
        ``trace=False`` would leave a traced run without events."""
        if run.trace or run.memory.poison or self.costs is not None:
            return None
        recycle = run.memory.recycle  # (what the model depends on, with the plan)
        with self._cache_lock:
            if recycle not in planned.memory:
                planned.memory[recycle] = plan_memory(planned.plan, fetches, set(feeds),
                                                      recycle, planned.layout.counts)
            return planned.memory[recycle]




def _check_feed_dict(who: str, feed_dict: Any) -> None:
    """Refuse a feed_dict that is not a mapping (a list of pairs, say) by name, before
    anything reads it: its ``.items()`` failed with Python's own AttributeError."""
    if type(feed_dict) not in (dict, type(None)) and not isinstance(feed_dict, Mapping):
        raise TypeError(f"{who}: feed_dict must be a dict of placeholder (or its name) -> "
                        f"value, got a {type(feed_dict).__name__}; write {{x: value, ...}}, "
                        f"or dict(pairs) for a list of (placeholder, value) pairs")


def _fed(node: Node, value: Any) -> Any:
    """``fed_value``, whose every failure names the placeholder: its own errors do, and
    NumPy's, raised while it makes an array of the value (a ragged list, [[1.0], [2.0,
    3.0]], is no array), are said again as a FeedError that does."""
    try:
        return fed_value(node, value)
    except MinigraphError:
        raise
    except (ValueError, TypeError) as exc:
        raise FeedError(f"feed for '{node.name}': {exc} (created at "
                        f"{describe_location(node.location)})") from exc


def _static(node: Node) -> str:
    return node.cost


# One lock per graph for the runs that read or write its variables (a variable's value
# lives on its node, so every session of the graph shares it). Reentrant, so that a
# kernel that runs the graph again (a callback, a test) does not deadlock itself.
_STATE_LOCKS: "weakref.WeakKeyDictionary[Graph, threading.RLock]" = weakref.WeakKeyDictionary()
_STATE_LOCKS_LOCK = threading.Lock()


def _state_lock(graph: Graph) -> threading.RLock:
    with _STATE_LOCKS_LOCK:
        lock = _STATE_LOCKS.get(graph)
        if lock is None:
            lock = _STATE_LOCKS[graph] = threading.RLock()
        return lock


def share_state_lock(new: Graph, graph: Graph) -> None:
    """Give ``new`` the state lock of ``graph``, whose variables it shares (a pass's
    copy: ``passes.SharedVariable``), so that a run of either graph is atomic for both."""
    lock = _state_lock(graph)
    with _STATE_LOCKS_LOCK:
        _STATE_LOCKS[new] = lock


def _snapshot(value: Any) -> Any:
    """A copy of a fed value, for ``run_async``: a tensor stays a tensor of its device, an
    array an array of its library, and anything else the run would make a NumPy array of
    (``fed_value``: a list, which its owner may write into after the call, a list of
    arrays, a PyTorch tensor, which NumPy reads in place) becomes that array now.
    Python and NumPy numbers, which nobody can write, stay as they are."""
    if isinstance(value, Tensor):
        return Tensor(_copy(value.data, value.device.asarray), value.device)
    if isinstance(value, (bool, int, float, complex, np.generic)):
        return value
    if hasattr(value, "__array_namespace__") or isinstance(value, np.ndarray):
        return _copy(value, array_namespace(value).asarray)
    try:
        array = np.asarray(value)  # (as fed_value makes it)
    except Exception:  # noqa: BLE001 - no array (a ragged list): the run refuses it, by name
        return value
    # (NumPy reads a list's elements into a new array; anything else may lend it its own
    # memory, as a PyTorch tensor does: that is copied, keeping its layout)
    return array if isinstance(value, (list, tuple)) else copy_keeping_layout(array)


def _copy(array: Any, asarray: Callable[..., Any]) -> Any:
    """A copy of ``array`` made by its library's ``asarray``; of a NumPy array, one that
    kernels walk as they walk the original (``device.copy_keeping_layout``), so that the
    queued run gives the bits a run of the original would (a sum adds in memory order:
    a plain copy turned a reversed or broadcast feed's last bits)."""
    if type(array) is np.ndarray:
        return copy_keeping_layout(array)
    return asarray(array, copy=True)


def _commit(assigns: list[tuple[Node, Any]]) -> None:
    """Store the run's assignments (private copies: ``scheduler.compute``); called only
    after the whole run succeeded, so a failed run changes no variable."""
    for var, value in assigns:
        var.value = value


def _handed_over(fetches: list[Node], values: dict[int, Any], kept: list[Any]) -> list[Any]:
    """The fetched values as NumPy values the caller owns.

    ``kept`` are the arrays the library keeps or the caller still holds (feeds, constants,
    variables): a fetched value whose memory is one of them is copied, and so is a value
    whose memory an earlier fetch of this run already handed over (``run([y, y])``, or a
    view and its base), and a read-only one (a broadcast, whose elements share memory: the
    caller can write into what a run hands over). Anything else the run made and nobody
    else holds: no copy.
    """
    owned = {id(root(a)) for a in kept}
    results = []
    for n in fetches:
        value = _to_numpy(n, values[id(n)])
        if isinstance(value, np.ndarray):  # (a 0-d result is a NumPy scalar, a copy)
            if id(root(value)) in owned or not value.flags.writeable:
                value = value.copy()
            owned.add(id(root(value)))
        results.append(value)
    return results



def _capture(execute: Any, run: Run, pool: ThreadPoolExecutor | None) -> None:
    """A device executor's thread: run, and leave any error on the run (and abort the
    rendezvous, which ``Run`` does) instead of losing it in the thread."""
    try:
        execute(run, pool)
    except BaseException:  # noqa: BLE001 - run.error holds it; run() raises it
        pass


def _to_numpy(node: Node, value: Any) -> Any:
    out = np.asarray(node.device.to_numpy(value))
    return out[()] if out.ndim == 0 else out


# -- fetch structures: a node, or lists / tuples / dicts of them ---------------------------

def _flatten(fetches: Any) -> list:
    if isinstance(fetches, dict):
        return [leaf for v in fetches.values() for leaf in _flatten(v)]
    if isinstance(fetches, (list, tuple)):
        return [leaf for v in fetches for leaf in _flatten(v)]
    return [fetches]


def _rebuild(fetches: Any, results: Any) -> Any:
    """The fetched values ``results`` (an iterator, in the order of ``_flatten``) in the
    structure of ``fetches``. A subclass of dict, list or tuple comes back as its own
    type, as in TF1 (an OrderedDict; a defaultdict with its default_factory, which its
    users' code relies on; a namedtuple), where it can be made as the plain type is:
    see :func:`_own_type`."""
    if isinstance(fetches, dict):
        items = {k: _rebuild(v, results) for k, v in fetches.items()}
        if type(fetches) is dict:
            return items

        def mapping() -> Any:
            made = type(fetches)(fetches.default_factory) \
                if isinstance(fetches, defaultdict) else type(fetches)()
            made.update(items)
            return made

        return _own_type(mapping, items)
    if isinstance(fetches, (list, tuple)):
        values = [_rebuild(v, results) for v in fetches]
        if type(fetches) in (list, tuple):
            return type(fetches)(values)
        plain = values if isinstance(fetches, list) else tuple(values)
        if hasattr(fetches, "_fields"):  # a namedtuple takes its fields one by one
            return _own_type(lambda: type(fetches)(*values), plain)
        return _own_type(lambda: type(fetches)(values), plain)
    return next(results)


def _own_type(make: Callable[[], Any], plain: Any) -> Any:
    """``make()``, the fetches' own container type made of the values in ``plain`` (a
    dict, list or tuple of them), if it can be made and holds those very values; else
    ``plain``. A class whose constructor takes arguments of its own (``Named(tag, ...)``)
    raised a raw TypeError, failing a run that had computed everything, and one whose
    first argument is another (``Tagged(tag, values=())``) came back empty."""
    try:
        made = make()
        if isinstance(plain, dict):
            same = len(made) == len(plain) and all(made[k] is v for k, v in plain.items())
        else:
            same = len(made) == len(plain) and all(a is b for a, b in zip(made, plain))
    except Exception:  # noqa: BLE001 - the user's class, which may raise anything
        return plain
    return made if same else plain
