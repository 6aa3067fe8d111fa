"""The scheduler: Kahn's algorithm with a FIFO ready queue, on a pool of threads [3.1.4].

Every node waits for its inputs: ``missing[node]`` counts the inputs that have not run
yet. A node with none missing is *ready*. When a node finishes, each consumer's count
drops by one, and the consumers that reach zero are ready in turn. Which thread runs a
ready node follows TensorFlow's executor (``executor.cc``), because handing a node to
another thread costs time too:

* a **cheap** node runs *inline*, on the thread that made it ready, right after it, in
  FIFO order: its cost is below what a thread hand-off would cost;
* an **expensive** node goes to the **thread pool**, where it runs beside the others:
  that is where parallelism pays;
* of several expensive nodes made ready at once, the last one may stay inline, but only
  if no cheap node is waiting there: the thread would otherwise go idle;
* the calling thread runs the cheap roots itself and hands out the expensive nodes they
  make ready, so that the workers start on them together.

``workers=1`` is the deterministic serial run: one FIFO queue, the roots in creation
order and each node's consumers in creation order as they become ready. That order is
the plan itself (``topo.fifo_order`` computed it when the session planned), so a serial
run on one device walks the plan's :class:`Step` list instead of counting inputs down.
A session with more workers uses the pool only for a plan where two expensive nodes can
run at the same time (:func:`can_overlap`); any other plan takes the serial walk. Where
the session could also decide the walk's memory when it planned (``memory.MemoryPlan``),
the walk is :meth:`Run.run_planned`: each step writes into its planned buffer (or lets
a kernel without an ``out`` form return what the plan assumed: a new array, a NumPy
scalar, a view of its input) and drops the values the plan says are dead, with no
reference counting at run time; a kernel that returns anything else hands the rest of
the run back to :meth:`Run.run_node`.

In a partitioned graph (``partition.py``) a ``Send`` hands a copy of its input to the
rendezvous (in a serial run it goes ahead of the nodes already queued: another device is
waiting for it), and a ``Recv`` is *asynchronous*: it asks the rendezvous for its tensor
and gives the thread back; when the tensor arrives, the Recv finishes and its consumers
become ready. A Recv that blocked its thread could deadlock two devices waiting on
each other.

The first failure stops the run: nothing that depends on the failed node runs, the
other threads finish the node they are running and stop, and ``run()`` raises the
error, which names the node, its op and the line of user code that created it.
Ctrl-C stops a run the same way, and the run returns only once no thread of the
pool still works on it.

NumPy's floating-point error settings (``np.errstate``, ``np.seterr``) belong to a
thread; a ``Run`` carries the caller's (``errors``), and every thread that executes
its nodes applies them, so ``with np.errstate(over="raise"):`` around ``sess.run``
raises wherever the overflowing kernel runs.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from operator import itemgetter
from typing import AbstractSet, Any, Callable

import numpy as np

from ..errors import DeviceError, MinigraphError
from ..graph.graph import FeedError, Node, check_assigned, describe_location
from ..graph.topo import dependencies, needed
from ..device import get_device, nbytes
from ..ops.primitive import UfuncOut
from .memory import Memory, MemoryPlan, PlanCounts, root
from .partition import CommNode
from .rendezvous import Rendezvous


class NodeError(MinigraphError, RuntimeError):
    """A node's kernel failed while the graph ran."""


class Step:
    """What running one node takes, worked out once per plan instead of on every run:
    where each argument is (a node's id in the run's values, or a literal such as the
    1.0001 of ``y * 1.0001``) and which kernel to call, on which array namespace."""

    __slots__ = ("node", "key", "special", "comm", "reads", "fetch", "impl", "out", "xp",
                 "context", "params", "foreign", "write")

    def __init__(self, node: Node, literals: dict[int, Any] | None = None):
        self.node = node
        self.key = id(node)
        self.special = node.prim is None  # Placeholder, Const, Variable, Assign, Send, Recv
        self.comm = node.op in ("Send", "Recv")  # (a partition's: they meet a rendezvous)
        self.reads = tuple((True, id(a)) if isinstance(a, Node) else (False, a)
                           for a in node.args)
        # The same arguments fetched by one C call (``fetch(values)``, a tuple), for the
        # planned walk (``Run._walk``), where building the list above costs a third of a
        # scalar kernel: a literal gets a key of its own (negative: no node's id), and
        # the walk's values hold ``literals`` under those keys.
        keys = []
        literals = literals if literals is not None else {}
        for is_node, at in self.reads:
            if not is_node:
                literals[-1 - len(literals)] = at
            keys.append(at if is_node else -len(literals))
        self.fetch = itemgetter(*keys) if len(keys) > 1 else _Fetch(keys)
        self.impl = node.prim.impl if node.prim is not None else None
        self.out = node.prim.out if node.prim is not None else None
        self.xp = node.device.xp
        self.context = node.device.context  # a GPU's: kernels run inside it
        self.params = node.params
        # The out kernel as the planned walk calls it, ``write(*arrays, out=buffer)``:
        # where it is only a ufunc (``ops.primitive.UfuncOut``), the ufunc itself, found
        # once here instead of through a lambda and a getattr on every run.
        self.write = (self.out.on(self.xp) if isinstance(self.out, UfuncOut) and
                      not self.params else
                      functools.partial(self.out, self.xp, **self.params)
                      if self.out is not None else None)
        # an input on another device (a plan across devices runs partitioned instead,
        # with Send/Recv pairs, so only a plan run as it is gets here with one)
        self.foreign = next((a for a in node.inputs if a.device is not node.device), None)


class _Fetch:
    """``Step.fetch`` for one argument or none: ``itemgetter(key)`` would return the
    value itself, not a tuple of one."""

    __slots__ = ("keys",)

    def __init__(self, keys: list[int]):
        self.keys = keys

    def __call__(self, values: dict[int, Any]) -> tuple:
        return tuple(values[k] for k in self.keys)


def compute(step: Step, values: dict[int, Any], assigns: list, fetches: list[Node],
            out: Any = None) -> Any:
    """The value of one node, given the values of its inputs (into ``out`` if given)."""
    node = step.node
    if step.special:
        return _special(node, values, assigns, fetches)
    if step.foreign is not None:
        raise DeviceError(
            f"node '{node.name}' on {node.device.name} reads '{step.foreign.name}' from "
            f"{step.foreign.device.name} (created at {describe_location(node.location)}); "
            f"a value crosses devices only through an explicit x.to(device)")
    arrays = [values[at] if is_node else at for is_node, at in step.reads]
    try:
        if step.context is not None:  # a GPU: run on it (see Device.context)
            with step.context:
                return _kernel(step, arrays, out)
        if out is not None:  # (the common case, without a call to _kernel: per node)
            return step.out(step.xp, *arrays, out=out, **step.params)  # type: ignore[misc]
        return step.impl(step.xp, *arrays, **step.params)  # type: ignore[misc]
    except Exception as exc:
        raise node_failure(step.node, arrays, exc) from exc


def node_failure(node: Node, arrays: list, exc: Exception) -> NodeError:
    """The error that says which node failed, on what, and where it was created (a
    Session's run; a compiled function's too: graph/compile.py)."""
    shapes = ", ".join(str(getattr(v, "shape", v)) for v in arrays)
    return NodeError(f"node '{node.name}' ({node.op}) failed on inputs of shapes "
                     f"[{shapes}]: {exc}\n  the node was created at "
                     f"{describe_location(node.location)}")


def _kernel(step: Step, arrays: list, out: Any) -> Any:
    if out is not None:
        assert step.out is not None  # a buffer is given only to an op with an out kernel
        return step.out(step.xp, *arrays, out=out, **step.params)
    assert step.impl is not None  # (an operation node: _special runs the others)
    return step.impl(step.xp, *arrays, **step.params)


def _special(node: Node, values: dict[int, Any], assigns: list, fetches: list[Node]) -> Any:
    """The value of a Const, a Variable, an Assign; a Placeholder without a feed fails."""
    if node.op in ("Const", "Variable"):
        return node.value
    if node.op == "Assign":
        # The variable keeps a copy of its own, taken now: the value read here may be a
        # fed array (the caller may change it later), another variable's buffer, or an
        # intermediate whose buffer the run recycles as soon as this node has read it.
        # (The Assign node's own value stays the input: the run's memory counts that.)
        value = check_assigned(node, values[id(node.args[1])])
        assigns.append((node.args[0], node.device.copy_from(value, node.device)))
        return value
    assert node.op == "Placeholder", node.op  # (a Send or Recv never gets here: run_node)
    raise unfed(node, fetches)  # (Session.run refuses the run before: see _plan)


def unfed(node: Node, fetches: list[Node], fed: AbstractSet[int] = frozenset()) -> FeedError:
    """The error for placeholder ``node``, which a run needs but was not fed, naming (up
    to three of) the fetches that depend on it (the search for them stops at ``fed``)."""
    users: list[str] = []
    for f in fetches:
        if len(users) < 3 and id(node) in needed([f], fed):
            users.append(f"'{f.name}'")
    because = f": the fetches {', '.join(users)} depend on it" if users else ""
    return FeedError(f"placeholder '{node.name}' (created at "
                     f"{describe_location(node.location)}) needs a value{because}; pass it "
                     f"in feed_dict={{{node.name}: ...}}")


def can_overlap(plan: list[Node], cost_of: Callable[[Node], str]) -> bool:
    """Whether two expensive nodes of ``plan`` (a topological order) could run at the
    same time, which is when a pool of threads pays: some expensive node is not an
    ancestor of the next one. One pass: each node learns the highest index of an
    expensive node among its ancestors; the k-th expensive node depends on the one
    before it exactly when that index is k - 1."""
    index: dict[int, int] = {}   # id of the k-th expensive node -> k
    latest: dict[int, int] = {}  # node id -> highest index of an expensive ancestor, or -1
    count = 0
    for n in plan:
        best = -1
        for i in n.predecessors:
            best = max(best, latest.get(id(i), -1), index.get(id(i), -1))
        latest[id(n)] = best
        if cost_of(n) == "expensive":
            if count and best != count - 1:
                return True
            index[id(n)] = count
            count += 1
    return False


class Layout:
    """What a plan's runs share, worked out once (a ``Session`` keeps it with its cached
    plan): Kahn's counts (each node's number of inputs, each node's consumers, the
    roots; every threaded run copies ``missing`` and counts it down), the memory counts
    (``memory.PlanCounts``), a :class:`Step` per node, in the plan's order, with the
    literals their arguments name (``Step.fetch``), and the Consts and Variables."""

    def __init__(self, plan: list[Node], fed: set[int]):
        self.missing, self.consumers = dependencies(plan, fed)  # Kahn's counts (topo.py)
        self.roots = [n for n in plan if self.missing[id(n)] == 0]
        self.counts = PlanCounts(plan, fed)  # what the run's Memory starts from
        self.literals: dict[int, Any] = {}  # the arguments that are no node (Step.fetch)
        self.steps = [Step(n, self.literals) for n in plan]
        self.step_of = {s.key: s for s in self.steps}
        self.overlaps = can_overlap(plan, lambda n: n.cost)  # (by the static classes)
        # the Consts and Variables: their values live on the graph, not in a run
        self.stored = [n for n in plan if n.op in ("Const", "Variable")]


class Run:
    """One execution of a plan: the values, the counts, the events and the memory.

    ``trace``: record a trace event per node (``sess.last_run.events``, the timelines
    of chapter 5) and the memory curve; off, a node's run is its kernel call and the
    bookkeeping of its memory, nothing more (``Session(trace=True)`` turns it on)."""

    def __init__(self, plan: list[Node], feeds: dict[int, Any], fetches: list[Node],
                 memory: Memory, cost_of: Callable[[Node], str],
                 record: Callable[[str, float], None] | None = None,
                 rendezvous: Rendezvous | None = None, layout: "Layout | None" = None,
                 errors: Any = None, trace: bool = False):
        self.plan = plan
        # the caller's np.geterr(), applied on every thread that runs this plan's kernels
        self.errors = errors if errors is not None else np.geterr()
        self.values: dict[int, Any] = dict(feeds)
        self.feeds = feeds
        self.fetches = fetches
        self.memory = memory
        self.cost_of = cost_of
        self.record = record
        self.trace = trace
        self.timed = trace or record is not None  # only then does a node read the clock
        self.assigns: list[tuple[Node, Any]] = []
        self.order: list[str] = []
        self.events: list[dict] = []
        self.error: BaseException | None = None
        self.lock = memory.lock
        layout = layout if layout is not None else Layout(plan, set(feeds))
        self.missing = dict(layout.missing)  # node id -> inputs that have not run yet
        self.consumers = layout.consumers
        self.roots = layout.roots
        self.steps, self.step_of = layout.steps, layout.step_of
        self.literals = layout.literals
        self.workers: dict[int, int] = {}
        self.rendezvous = rendezvous
        self.received: dict[int, Any] = {}   # Recv node id -> the tensor that arrived
        self.arrivals: queue.SimpleQueue = queue.SimpleQueue()  # Recvs to finish (serial)
        self.moved: dict[tuple[str, str], int] = {}  # (from, to) device -> bytes sent
        self.pool: ThreadPoolExecutor | None = None
        # how the run counted its memory: "dynamic" (Memory, node by node), "planned"
        # (a memory.MemoryPlan) or "fallback" (planned until a kernel broke the plan)
        self.accounting = "dynamic"

    def execute(self, node: Node) -> list[Node] | None:
        """Run one node; return the consumers it made ready (in creation order), or None
        for a Recv whose tensor has not arrived yet (it is run again when it does)."""
        if node.op == "Recv" and id(node) not in self.received:
            # (a partitioned graph's Recv, run with the partition's rendezvous)
            assert isinstance(node, CommNode) and self.rendezvous is not None
            # (mypy cannot infer a lambda with a default argument)
            self.rendezvous.recv(node.key, lambda v, e, n=node: self._arrived(n, v, e))  # type: ignore[misc]
            return None
        self.run_node(self.step_of[id(node)])
        ready = []
        with self.lock:
            for c in self.consumers.get(id(node), ()):
                self.missing[id(c)] -= 1
                if self.missing[id(c)] == 0:
                    ready.append(c)
        return ready

    def run_node(self, step: Step) -> None:
        """Compute one node whose inputs have run, and count its memory: what every
        run does per node, serial or threaded (``execute`` adds the ready counts)."""
        node, key = step.node, step.key
        with self.lock:
            self.order.append(node.name)
            buffer, pooled = None, False
            if key in self.memory.writable:  # (never a fed node: memory.PlanCounts)
                buffer, pooled = self.memory.buffer_for(node)
        start = handed = time.perf_counter() if self.timed else 0.0
        if key in self.feeds:
            pass  # (a fed node's value is there already)
        elif step.comm:
            if node.op == "Recv":
                self.values[key] = self.received.pop(key)
            else:
                handed = self._send(node)
        else:
            try:
                self.values[key] = compute(step, self.values, self.assigns, self.fetches,
                                           buffer)
            except Exception as exc:  # which node failed travels to other ranks (mpi_run)
                # (an exception object takes new attributes; mypy knows only the declared)
                exc.node, exc.op = node.name, node.op  # type: ignore[attr-defined]
                raise
        end = time.perf_counter() if self.timed else 0.0
        if self.record is not None:
            self.record(node.name, end - start)
        with self.lock:
            self._account(node, key, pooled)
            if self.trace:
                event = self._event(node, start, end)
                if node.op == "Send":  # (where the trace's arrow to the Recv starts)
                    event["handed"] = (handed - start) * 1e6
                self.events.append(event)

    def _account(self, node: Node, key: int, pooled: bool) -> None:
        """Count a node's new value (written into a pooled buffer if ``pooled``) and its
        reads in the run's memory, and drop the values nobody will read again, so that the
        run holds no freed value (the caller holds the lock)."""
        if key not in self.feeds:
            self.memory.produced(node, self.values[key], pooled)
        for dead in self.memory.consumed(node):
            if id(dead) not in self.feeds:
                self.values.pop(id(dead), None)

    def _send(self, node: Node) -> float:
        """A Send: hand a copy of its input to the rendezvous, and count its bytes.
        Returns when it handed the copy over (``time.perf_counter()``): the Recv can
        start any time after that, even before this Send's event ends."""
        assert isinstance(node, CommNode) and self.rendezvous is not None  # (as a Recv)
        value = self.values[id(node.args[0])]
        dst = get_device(node.recv_device)
        if node.params["control"]:  # a control edge: an empty tensor says "it ran"
            sent = np.zeros((0,)) if dst.remote else dst.xp.zeros((0,))
        else:
            sent = dst.copy_sent(value, node.device)  # a real copy
            link = (node.send_device, node.recv_device)
            with self.lock:
                self.moved[link] = self.moved.get(link, 0) + nbytes(sent)
        self.values[id(node)] = value
        handed = time.perf_counter()
        self.rendezvous.send(node.key, sent)
        return handed

    def _event(self, node: Node, start: float, end: float) -> dict:
        tid = self.workers.setdefault(threading.get_ident(), len(self.workers))
        event = {"name": node.name, "op": node.op, "cost": self.cost_of(node),
                 "ts": (start - self.memory.start) * 1e6, "dur": (end - start) * 1e6,
                 "pid": node.device.name, "tid": tid}
        if node.op in ("Send", "Recv"):
            assert isinstance(node, CommNode)  # (Send and Recv nodes are made by partition)
            event["key"] = node.key
        return event

    def _arrived(self, node: Node, value: Any, error: BaseException | None) -> None:
        """The rendezvous calls this when a Recv's tensor is there (or the run aborted)."""
        if error is not None:
            self._stop(error)
            self.arrivals.put(None)
            return
        with self.lock:
            self.received[id(node)] = value
        if self.pool is not None:
            self._submit([node])
        else:
            self.arrivals.put(node)

    def _stop(self, exc: BaseException) -> None:
        with self.lock:
            first = self.error is None
            if first:
                self.error = exc  # the first failure is the one reported
            changed = getattr(self, "changed", None)
            if changed is not None:
                changed.notify_all()
        if first and self.rendezvous is not None:
            self.rendezvous.abort(exc)  # other devices stop waiting for our tensors

    # -- workers = 1: one FIFO queue on the calling thread ------------------------------------
    def run_serial(self) -> None:
        with np.errstate(**self.errors):  # (a device executor runs on a thread of its own)
            self._run_serial()

    def _run_serial(self) -> None:
        if self.rendezvous is None:
            # One device, one thread: the plan is the FIFO order itself (the session ran
            # Kahn's algorithm once, when it planned: topo.fifo_order), so the run walks
            # the list; no counts to keep, no queue. (A partition's Recvs, which wait
            # for other devices, need the queue below.)
            try:
                for step in self.steps:
                    self.run_node(step)
            except BaseException as exc:
                self._stop(exc)
                raise
            return
        ready = deque(self.roots)
        remaining = len(self.plan)
        try:
            while remaining:
                if self.error is not None:
                    raise self.error
                if not ready:  # only Recvs are outstanding: wait for a tensor
                    try:
                        node = self.arrivals.get(timeout=0.05)
                    except queue.Empty:
                        continue
                    if node is not None:
                        ready.append(node)
                    continue
                made = self.execute(ready.popleft())
                if made is not None:
                    remaining -= 1
                    for node in made:
                        # A Send goes first: it only hands a copy to the rendezvous, and
                        # another device is waiting for it. Queued behind a long kernel,
                        # it would hold that device idle for the kernel's time.
                        if node.op == "Send":
                            ready.appendleft(node)
                        else:
                            ready.append(node)
        except BaseException as exc:
            self._stop(exc)
            raise

    # -- workers = 1, memory planned: the serial walk of a memory.MemoryPlan -----------------
    def run_planned(self, plan: MemoryPlan) -> None:
        """The serial walk of a plan whose memory the session decided when it planned
        (``memory.MemoryPlan``): each step takes its planned buffer, runs its kernel into
        it (or runs a kernel without an ``out`` form) and drops the values the plan says
        are dead; the statistics are the plan's. Why not ``run_node``: its reference
        counts and pool lookups cost more than a scalar kernel, and they would decide the
        same as the plan did, run after run.

        If a kernel returns anything but the buffer it was given, or, without one,
        anything but what the plan assumed (``PlannedStep.expect``: a reshape that had to
        copy, a Fortran-ordered array), the plan no longer describes the run: its memory
        is put in the state the dynamic accounting would have (``MemoryPlan.resume``),
        and the run goes on with ``run_node``, which counts whatever the kernels return."""
        with np.errstate(**self.errors):
            buffers: list[Any] = [None] * plan.slots  # slot -> a buffer waiting in the pool
            self.values.update(self.literals)  # (what Step.fetch reads besides the nodes)
            self.accounting = "planned"
            stop = self._walk(plan, buffers)
            if stop == len(self.steps):
                self.order = list(plan.names)
                plan.report(self.memory)
                return
            self.accounting = "fallback"
            plan.resume(stop, self.memory, self.values, buffers)
            self.order = plan.names[:stop + 1]
            node, key = self.steps[stop].node, self.steps[stop].key
            planned = plan.steps[stop]
            with self.lock:  # (the buffer that step got came from the pool unless fresh)
                self._account(node, key, pooled=planned.take >= 0 and not planned.fresh)
            try:
                for step in self.steps[stop + 1:]:
                    self.run_node(step)
            except BaseException as exc:
                self._stop(exc)
                raise

    def _walk(self, plan: MemoryPlan, buffers: list[Any]) -> int:
        """Run the plan's steps in order; return the index of the first one whose kernel
        did not write into its planned buffer or return what the plan assumed (its value
        is among the values already),
        or the number of steps when all did. A failure leaves the statistics of the
        steps before it (``plan.report``) and the order up to the failed node."""
        values, feeds, assigns, fetches = self.values, self.feeds, self.assigns, self.fetches
        k = 0
        try:
            for k, (step, planned) in enumerate(zip(self.steps, plan.steps)):
                buffer = None
                if planned.take >= 0:
                    if planned.fresh:  # lazy allocation: the buffer is made when needed
                        node = step.node
                        buffer = node.device.empty(node.shape, node.dtype)  # type: ignore[arg-type]
                    else:  # out of the pool
                        buffer, buffers[planned.take] = buffers[planned.take], None
                if step.key not in feeds:
                    expect = planned.expect
                    if buffer is not None and step.context is None:
                        # compute()'s call of an out kernel, written out here: on a scalar
                        # it is most of the step, and the call of compute() is a tenth
                        arrays = step.fetch(values)
                        try:
                            value = step.write(*arrays, out=buffer)  # type: ignore[misc]
                        except Exception as exc:
                            raise node_failure(step.node, list(arrays), exc) from exc
                    elif expect is not None:  # a kernel without an out form (on NumPy)
                        arrays = step.fetch(values)
                        try:
                            value = step.impl(step.xp, *arrays, **step.params)  # type: ignore[misc]
                        except Exception as exc:
                            raise node_failure(step.node, list(arrays), exc) from exc
                    else:  # a Const, a Variable, an Assign; a kernel on a GPU
                        value = compute(step, values, assigns, fetches, buffer)
                    values[step.key] = value
                    if buffer is not None:
                        if value is not buffer:
                            return k  # (the cheap check that the plan holds)
                    elif expect is not None and not expect.holds(value, arrays):
                        return k  # not the kind of value the plan assumed (a copy ...)
                for key, slot in planned.stash:  # into the pool: the run keeps the buffer
                    buffers[slot] = values[key]
                for key, slot in planned.stash_views:  # (held through a view: its base)
                    buffers[slot] = root(values[key])
                for key in planned.dead:  # the run holds no freed value
                    del values[key]
        except BaseException as exc:
            if isinstance(exc, Exception):  # which node failed (as run_node says it)
                # (an exception object takes new attributes; mypy knows only the declared)
                exc.node, exc.op = plan.names[k], self.steps[k].node.op  # type: ignore[attr-defined]
            self.order = plan.names[:k + 1]
            plan.report(self.memory, k)
            self._stop(exc)
            raise
        return len(self.steps)

    # -- workers > 1: inline cheap nodes, expensive nodes to the pool ---------------------
    def run_threaded(self, pool: ThreadPoolExecutor) -> None:
        with np.errstate(**self.errors):  # the cheap roots run on this thread
            self._run_threaded(pool)

    def _run_threaded(self, pool: ThreadPoolExecutor) -> None:
        # Trace thread 0 is this one, which started the run, even if every root is
        # expensive and it runs no node itself; the workers are numbered from 1 (_event).
        self.workers[threading.get_ident()] = 0
        self.remaining = len(self.plan)
        self.active = 0
        self.changed = threading.Condition(self.lock)
        self.pool = pool
        self._start(self.roots)
        try:
            with self.changed:
                while not self._finished():
                    self.changed.wait(0.05)  # a timeout, so that Ctrl-C gets through
        except KeyboardInterrupt:
            self._stop(KeyboardInterrupt())
            with self.changed:
                while self.active:
                    self.changed.wait(0.05)
            raise
        if self.error is not None:
            raise self.error

    def _start(self, roots: list[Node]) -> None:
        """Run the cheap roots (feeds, constants ...) and the cheap nodes they make ready
        here, on the calling thread, and hand each expensive node to the pool as soon as
        it is ready. Handing the roots to the pool instead would make the first worker
        wake up (0.1-2 ms, more on a loaded machine) before any expensive node is known,
        and the second wait for the first: here the pool's threads start together."""
        todo: deque = deque()
        try:
            self._dispatch(roots, todo, worker=False)
            while todo and self.error is None:
                ready = self.execute(todo.popleft())
                if ready is None:
                    continue  # a Recv waiting for its tensor: submitted when it comes
                with self.changed:
                    self.remaining -= 1
                self._dispatch(ready, todo, worker=False)
        except BaseException as exc:  # noqa: BLE001 - run_threaded raises it
            self._stop(exc)

    def _finished(self) -> bool:
        return self.remaining == 0 or (self.error is not None and self.active == 0)

    def _submit(self, batch: list[Node]) -> None:
        with self.lock:
            self.active += 1
        assert self.pool is not None  # only threaded runs submit (run_threaded sets it)
        try:
            self.pool.submit(self._process, batch)
        except BaseException as exc:  # (a pool shut down: the task never runs, and the
            with self.lock:           # run would wait for it forever)
                self.active -= 1
            self._stop(exc)

    def _dispatch(self, ready: list[Node], inline: deque, worker: bool = True) -> None:
        """TensorFlow's rule for who runs the nodes that just became ready: the cheap ones
        join this thread's queue ``inline``, the expensive ones go to the pool, one task
        each. A worker keeps the last expensive one if its queue is empty, rather than go
        idle; the starting thread (``worker=False``) computes nothing expensive."""
        cheap = [n for n in ready if self.cost_of(n) == "cheap"]
        expensive = [n for n in ready if self.cost_of(n) != "cheap"]
        inline.extend(cheap)
        keep_last = worker and expensive and not inline
        for n in expensive[:-1] if keep_last else expensive:
            self._submit([n])
        if keep_last:
            inline.append(expensive[-1])

    def _process(self, batch: list[Node]) -> None:
        """A worker's task: run ``batch`` and the cheap nodes they make ready."""
        todo = deque(batch)
        try:
            with np.errstate(**self.errors):  # a pool thread keeps its own settings
                while todo and self.error is None:
                    node = todo.popleft()
                    ready = self.execute(node)
                    if ready is None:
                        continue  # a Recv waiting for its tensor: resubmitted when it comes
                    with self.changed:
                        self.remaining -= 1
                        self.changed.notify_all()
                    self._dispatch(ready, todo)
        except BaseException as exc:  # noqa: BLE001 - handed to run(), which raises it
            self._stop(exc)
        finally:
            with self.changed:
                self.active -= 1
                self.changed.notify_all()

