"""Memory during a run: lazy allocation, reference counts, a pool of freed buffers.

The optimisations of SINGA's computational graph, made observable:

* **lazy allocation**: a node's result is allocated when the node runs, not before;
* **reference-count recycling**: every value counts the consumers that still have to
  read it; after the last one it is freed, unless it is fetched (the caller wants it);
* **a per-device pool**: a freed buffer goes to a pool, keyed by device, shape and dtype,
  *if a node still to run will want one of that key* (and if it is laid out in C
  order, as a fresh result is: a kernel gives bit-identical results whether it writes
  into a recycled buffer or a new one, so recycling never changes a value); that node then writes into it (its
  primitive's ``out`` kernel) instead of allocating new memory. A buffer nobody will
  want is given back at once, so the pool never holds memory for nothing: the plan is
  known before the run starts, which is the advantage a static graph gives (SINGA plans
  its memory from the buffered operations the same way).

Values that are views of other values (a reshape, a transpose, ``identity``) share their
base's buffer, and so does a value handed on as it is (``stop_gradient``, an ``Assign``,
a ``Send``, of a NumPy scalar too): a buffer is freed when the last value that uses it
dies. Feeds, constants and variables are not the run's to free and are not counted.

Per run, per device, it records: the peak of bytes held (live values plus pooled free
buffers, the memory the runtime really holds), the *liveness lower bound* (the peak of
live values alone, which no allocator can beat for this execution order), the total
bytes produced (what keep-everything would hold), and, in a traced run
(``Session(trace=True)``), the curve of both over time.
A debug mode *poisons* every freed buffer (NaN or -1), so a read after free shows up.

**Decided at plan time** (:class:`MemoryPlan`): a serial run's bookkeeping depends on the
plan alone, not on the numbers, so where every value is known in advance the session
runs this same :class:`Memory` once, when it plans, on stand-ins for the arrays, and
keeps per step which buffer the kernel writes into and which values die, and the
statistics. A value is known in advance when its node writes into a buffer through its
``out`` kernel, is a feed, a constant, a variable or an ``Assign``, or, on a NumPy
device, is what a kernel without an ``out`` form returns: a new array (a sum over an
axis, ``log_softmax``), a NumPy scalar (a full sum), or a view of its input (a
reshape, a transpose). Its runs then only walk that plan (``scheduler.Run.run_planned``),
check cheaply that each kernel returned what the plan assumed, and fall back to counting
node by node where one did not (a reshape that had to copy, a Fortran-ordered result
that a later node would have taken from the pool).
"""

from __future__ import annotations

import math
import threading
import time
from typing import AbstractSet, Any

import numpy as np
from array_api_compat import is_numpy_namespace

from ..device import nbytes
from ..graph.graph import Node


def root(array: Any) -> Any:
    """The array that owns the memory of ``array`` (``array`` itself if not a view)."""
    while getattr(array, "base", None) is not None and hasattr(array.base, "shape"):
        array = array.base
    return array


class PlanCounts:
    """The counts a run starts from, which depend only on the plan (a ``Session`` keeps
    them with its cached plan, and each run copies them): how many nodes read each value,
    which nodes can write into a pooled buffer, and how many want one of each key.

    A fed node (its id in ``fed``) computes nothing: it reads none of its inputs and
    wants no buffer. Counted as a reader, it would run first (a root: the scheduler skips
    a fed node's inputs too, ``topo.dependencies``) and count down the readers of an
    input that has not run yet (one in the plan through a control dependency), which
    would then be freed before it exists; counted as a buffer's taker, it would take a
    pooled buffer and drop it."""

    def __init__(self, order: list[Node], fed: AbstractSet[int] = frozenset()):
        keep = {id(n) for n in order}
        self.readers: dict[int, int] = {}
        # each node's inputs whose readers are counted: those of the plan, once each
        self.reads: dict[int, tuple[Node, ...]] = {}
        for n in order:
            self.reads[id(n)] = () if id(n) in fed else tuple(
                i for i in _distinct(n.inputs) if id(i) in keep)
            for i in self.reads[id(n)]:
                self.readers[id(i)] = self.readers.get(id(i), 0) + 1
        self.demand: dict[tuple, int] = {}
        self.writable: set[int] = set()
        for n in order:
            if id(n) not in fed and can_write_into(n):
                self.writable.add(id(n))
                key = (n.device.name, n.shape, n.dtype)
                self.demand[key] = self.demand.get(key, 0) + 1


class Memory:
    """The bookkeeping of one run (callers hold ``lock`` around every method)."""

    def __init__(self, order: list[Node], fetches: list[Node], external: list[Any],
                 recycle: bool = True, poison: bool = False, start: float | None = None,
                 counts: "PlanCounts | None" = None, curve: bool = True):
        self.recycle = recycle
        self.keep_curve = curve  # the curve costs a clock read per change: traced runs only
        self.poison = poison
        self.lock = threading.Lock()
        self.start = time.perf_counter() if start is None else start
        counts = counts if counts is not None else PlanCounts(order)  # (none of it fed)
        self.readers = dict(counts.readers)  # node id -> consumers still to run
        self.demand = dict(counts.demand)    # buffer key -> nodes still to run wanting one
        self.writable = counts.writable      # ids of the nodes that can use a pooled buffer
        self.reads = counts.reads            # node id -> its counted inputs
        self.fetched = {id(f) for f in fetches}
        self.external = {id(root(a)): root(a) for a in external}  # buffer id -> the array
        self.value_storage: dict[int, int] = {}   # node id -> id of its buffer
        self.storage: dict[int, list] = {}        # buffer id -> [array, users, device]
        self.pool: dict[tuple, list[Any]] = {}
        self.live: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self.peak_held: dict[str, int] = {}
        self.peak_live: dict[str, int] = {}
        self.total: dict[str, int] = {}
        self.curve: list[tuple[float, str, int, int]] = []  # (seconds, device, live, held)
        for dev in {n.device.name for n in order}:  # every device appears, even at 0
            self.live[dev] = self.held[dev] = self.peak_held[dev] = 0
            self.peak_live[dev] = self.total[dev] = 0

    # -- allocation -----------------------------------------------------------------------
    def buffer_for(self, node: Node) -> tuple[Any, bool]:
        """The buffer a node that ``can_write_into`` computes into, and whether it came
        from the pool: a pooled one of its shape and dtype, else a new one.

        Always a C-ordered buffer, never the kernel's own allocation: a kernel's own
        result can be Fortran-ordered (a ufunc on a transposed view), and a reduction
        over it then adds in another order. Which of the two a node got would depend on
        the pool and on the other threads' timing, and results would differ in the last
        bit between runs with and without recycling, or with 1 and 2 workers."""
        key = (node.device.name, node.shape, node.dtype)
        self.demand[key] -= 1  # this node's request is served now, one way or the other
        free = self.pool.get(key) if self.recycle else None
        if free:
            return free.pop(), True
        return self._new_buffer(node), False

    def _new_buffer(self, node: Node) -> Any:
        """A new C-ordered buffer of the node's shape and dtype (lazy allocation: now)."""
        assert node.shape is not None and node.dtype is not None  # (can_write_into)
        return node.device.empty(node.shape, node.dtype)

    def produced(self, node: Node, value: Any, reused: bool) -> None:
        """``node`` has computed ``value`` (into a pooled buffer if ``reused``)."""
        base = root(value)
        key = id(base) if not isinstance(base, np.generic) else self._scalar_key(node, base)
        self.value_storage[id(node)] = key
        if key in self.external:
            return
        if key in self.storage:  # a view of a buffer the run already holds
            self.storage[key][1] += 1
            return
        dev, size = node.device.name, nbytes(base)
        self.storage[key] = [base, 1, dev, size]
        now_live = self.live[dev] = self.live[dev] + size
        now_held = self.held[dev] if reused else self.held[dev] + size
        self.held[dev] = now_held
        if now_live > self.peak_live[dev]:  # (only a new value can raise the peaks)
            self.peak_live[dev] = now_live
        if now_held > self.peak_held[dev]:
            self.peak_held[dev] = now_held
        self.total[dev] += size
        if self.keep_curve:
            self._curve(dev)

    def _scalar_key(self, node: Node, scalar: np.generic) -> int:
        """The key of the buffer that holds a NumPy scalar, the value of ``node``.

        A scalar is the same buffer as another value only when it is that value handed
        on: the same object as the value of one of the node's inputs (``stop_gradient``,
        an ``Assign`` or a ``Send`` of a 0-d result), keyed as that input's, so that its
        bytes are counted once, as the plan counts them. Its id alone would not do:
        NumPy hands out one np.True_ and one np.False_, so two comparisons' results are
        one object, which would be counted once. Any other scalar is new, keyed by its
        node (~id: negative, never an array's id)."""
        if node.op in ("Const", "Variable"):
            return id(scalar)  # (the graph's own value: external)
        for i in node.inputs:
            key = self.value_storage.get(id(i))
            if key is not None and self._held(key) is scalar:
                return key
        return ~id(node)

    def _held(self, key: int) -> Any:
        """The array (or scalar) the run holds under ``key``, or an external one."""
        entry = self.storage.get(key)
        return entry[0] if entry is not None else self.external.get(key)

    def consumed(self, node: Node) -> list[Node]:
        """``node`` has run: its inputs have one reader fewer. Returns the nodes whose
        values nobody will read again: the caller drops its references to them, so
        their memory really goes (to the pool, or back to the allocator)."""
        dead = []
        for i in self.reads[id(node)]:
            left = self.readers[id(i)] = self.readers[id(i)] - 1
            if left == 0 and id(i) not in self.fetched:
                self._release(i)
                dead.append(i)
        if id(node) not in self.readers and id(node) not in self.fetched:
            self._release(node)  # nobody reads it (e.g. an Assign's result)
            dead.append(node)
        return dead

    def _release(self, node: Node) -> None:
        key = self.value_storage.pop(id(node), None)
        entry = self.storage.get(key) if key is not None else None
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        assert key is not None  # (the entry was found under it)
        base, _, dev, size = self.storage.pop(key)
        if self.poison:
            _poison(base)
        self.live[dev] -= size
        if self.recycle and _recyclable(base):
            pool_key = (dev, tuple(base.shape), _dtype_name(node, base))
            if self.demand.get(pool_key, 0) > len(self.pool.setdefault(pool_key, [])):
                self.pool[pool_key].append(base)  # a node still to run will write into it
                if self.keep_curve:
                    self._curve(dev)
                return
        self.held[dev] -= size  # nobody will want it: given back
        if self.keep_curve:
            self._curve(dev)

    def _curve(self, dev: str) -> None:
        """A point of the memory curve (traced runs only: it reads the clock)."""
        self.curve.append((time.perf_counter() - self.start, dev, self.live[dev],
                           self.held[dev]))


# -- the same model, run once when the session plans ------------------------------------------

class PlannedStep:
    """What the memory plan decided for one step of a serial run (see :class:`MemoryPlan`).

    ``take``: the slot of the buffer the node's ``out`` kernel writes into, -1 for none;
    ``fresh``: whether that buffer is allocated now (else it is the pooled buffer the run
    keeps in the slot); ``expect``: for a node computed by a kernel without an ``out``
    form, what the plan assumed that kernel returns (``_NewArray``, ``_SameMemory``: the
    run checks it), else None; ``stash``: ``(node id, slot)`` for each value whose buffer
    goes to the pool after the step (the run moves it into that slot); ``stash_views``:
    the same for a value that is a view of the buffer (the run moves the view's base);
    ``dead``: the ids of the values the run drops after the step (their last reader has
    run)."""

    __slots__ = ("take", "fresh", "expect", "stash", "stash_views", "dead")

    def __init__(self, take: int, fresh: bool, expect: Any,
                 stash: tuple[tuple[int, int], ...], stash_views: tuple[tuple[int, int], ...],
                 dead: tuple[int, ...]):
        self.take, self.fresh, self.expect, self.dead = take, fresh, expect, dead
        self.stash, self.stash_views = stash, stash_views


class MemoryPlan:
    """The memory of a serial run, decided once per plan: buffer reuse at plan time.

    A serial run walks its plan in one fixed order, and :class:`Memory` decides from that
    order alone, never from the numbers in the arrays: the same counts reach zero after
    the same steps, the same buffers go to the pool and come out of it, so every run of
    the plan has the same peaks and totals. When every value of the plan is known in
    advance (see :func:`plan_memory`), the session runs :class:`Memory` itself *once*,
    on stand-ins for the arrays, and keeps what it decided at each step (``steps``, a
    :class:`PlannedStep` each) and the statistics it ended with. A run then only
    executes the plan (``scheduler.Run.run_planned``): no reference counts, no pool
    lookups, a few list operations per node.

    The stand-ins (``_Planned``, ``_View``) carry what :class:`Memory` reads of an array:
    shape, dtype, bytes, layout flags and ``base``. Each value gets the one the dynamic
    accounting would see:

    * an ``out`` kernel's value is the buffer it was given (new, or out of the pool);
    * a kernel without an ``out`` form allocates a new array of its node's shape and
      dtype, C-ordered, which may go to the pool when it dies, as any buffer; or, for a
      node of shape ``()``, a NumPy scalar (NumPy's reductions to one number return
      ``np.generic``), which Memory counts but never pools: it is immutable. Where the
      kernel returns the other kind (a 0-d array), or another layout (a ufunc on a
      transposed array returns Fortran order), the statistics differ only if a node
      still to run would take the array from the pool when it dies: the run checks the
      layout only of those arrays (``_Planned.wanted``);
    * a view (a reshape, a transpose, ``identity`` ...) is a stand-in whose ``base`` is
      its input's buffer: Memory counts it as one more user of that buffer;
    * a feed, a constant, a variable, and a view of one, belong to nobody in the run.

    Why a second way: for a chain of scalar operations the dynamic bookkeeping costs
    about three times the kernel, and ``Session.run`` of 10^4 scalar nodes should take at
    most 4x the same NumPy calls in a Python loop. Since the statistics come from the
    same :class:`Memory` code, they are those a dynamic run would report, exactly, as
    long as each kernel returns what its stand-in assumed. The run checks that after each
    kernel: an ``out`` kernel returned the buffer it was given; any other, what its
    step's ``expect`` says. Where one did not (a reshape of a transposed array copies, a
    ufunc on one returns Fortran order, which the pool refuses), :meth:`resume` puts the run's own
    :class:`Memory` in the state the dynamic accounting would be in at that step, and the
    run goes on with the dynamic path.
    """

    def __init__(self, order: list[Node], fetches: list[Node], fed: set[int], recycle: bool,
                 counts: PlanCounts):
        self.order = order
        self.names = [n.name for n in order]
        self.fetches, self.fed, self.recycle, self.counts = fetches, fed, recycle, counts
        model, self.steps = self._model(len(order))
        self.slots = model.slots  # how many arrays the plan's model made (a slot each)
        self.peak_held, self.peak_live, self.total = model.peak_held, model.peak_live, model.total

    def _model(self, stop: int) -> "tuple[_PlanningMemory, list[PlannedStep]]":
        """:class:`Memory` driven through the first ``stop`` steps as ``Run.run_node``
        drives it, on stand-in values, and what it decided at each step."""
        model = _PlanningMemory(self.order, self.fetches, [_EXTERNAL], self.recycle,
                                counts=self.counts, curve=False)
        values: dict[int, Any] = {key: _EXTERNAL for key in self.fed}  # node id -> stand-in
        return model, [self._step(model, node, values) for node in self.order[:stop]]

    def _step(self, model: "_PlanningMemory", node: Node, values: dict[int, Any]) -> PlannedStep:
        """One step of the model, in ``Run.run_node``'s order: take a buffer, produce the
        value, count the reads."""
        key = id(node)
        take, fresh, buffer, pooled, expect = -1, False, None, False, None
        if key in model.writable:  # (never a fed node: PlanCounts)
            buffer, pooled = model.buffer_for(node)
            take, fresh = buffer.slot, not pooled
        if key not in self.fed:  # (a fed node's value is there already: nothing to make)
            values[key], expect = self._value(model, node, values, buffer)
            model.produced(node, values[key], pooled)
        model.pooled = []
        dead = tuple(id(d) for d in model.consumed(node) if id(d) not in self.fed)
        # The buffers that went to the pool, with the value through which the run holds
        # each (read before the dead values go): the buffer itself, or a view of it.
        stash = tuple((id(n), b.slot) for n, b in model.pooled if values[id(n)] is b)
        stash_views = tuple((id(n), b.slot) for n, b in model.pooled if values[id(n)] is not b)
        for d in dead:
            del values[d]
        return PlannedStep(take, fresh, expect, stash, stash_views, dead)

    @staticmethod
    def _value(model: "_PlanningMemory", node: Node, values: dict[int, Any],
               buffer: "_Planned | None") -> tuple[Any, Any]:
        """The stand-in for a computed node's value, and what the run checks about the
        real one (None: nothing beyond what the walk checks anyway)."""
        if node.op in ("Const", "Variable"):
            return _EXTERNAL, None
        if node.op == "Assign":
            return values[id(node.args[1])], None  # (its value is its input's)
        if buffer is not None:
            return buffer, None  # the out kernel writes into it (the walk checks: ``is``)
        assert node.prim is not None  # (plan_memory admits no other kind of node)
        if node.prim.view:  # the memory of its input: no allocation
            of = values[id(node.args[0])]
            return (of if of is _EXTERNAL else _View(root(of))), _SAME_MEMORY
        # a new array; of shape (), a NumPy scalar, as NumPy's reductions to one number
        new = model.allocated(node, _Immutable if node.shape == () else _Fresh)
        return new, _NewArray(new)

    def report(self, memory: Memory, stop: int | None = None) -> None:
        """Give a run's ``memory`` the statistics of the plan's first ``stop`` steps
        (all of them by default; a failed run's stop where it failed)."""
        model: Any = self if stop is None else self._model(stop)[0]
        memory.peak_held, memory.peak_live = dict(model.peak_held), dict(model.peak_live)
        memory.total = dict(model.total)

    def resume(self, stop: int, memory: Memory, values: dict[int, Any],
               buffers: list[Any]) -> None:
        """Put a run's ``memory`` in the state the dynamic accounting is in when step
        ``stop``'s kernel has run: the model's after the steps before and the buffer
        request of this one, with the real arrays in place of the stand-ins (the run
        holds them: the live ones among its ``values``, where ``root`` finds a view's
        buffer, a kernel's own array or a NumPy scalar as it does a planned buffer; the
        pooled ones in ``buffers``)."""
        model, _ = self._model(stop)
        node = self.order[stop]
        if id(node) in model.writable:
            model.buffer_for(node)
        real = {slot: b for slot, b in enumerate(buffers) if b is not None}
        keys: dict[int, int] = {}  # the model's key of a buffer -> the run's (_scalar_key)
        for key, at in model.value_storage.items():
            entry = model.storage.get(at)
            if entry is not None:
                array = real[entry[0].slot] = root(values[key])
                # (a NumPy scalar by a node that holds it: two np.True_ are two buffers)
                keys.setdefault(at, ~key if isinstance(array, np.generic) else id(array))
        memory.storage = {keys[at]: [real[b.slot], users, dev, size]
                          for at, (b, users, dev, size) in model.storage.items()}
        # (an external value by its own id, as produced() keys it, not by the model's one
        # stand-in for them all: a scalar handed on is looked up by it, _scalar_key)
        memory.value_storage = {key: keys[at] if at in keys else id(root(values[key]))
                                for key, at in model.value_storage.items()}
        memory.pool = {k: [real[b.slot] for b in free] for k, free in model.pool.items()}
        memory.readers, memory.demand = model.readers, model.demand
        memory.live, memory.held = model.live, model.held
        memory.peak_held, memory.peak_live, memory.total = (model.peak_held, model.peak_live,
                                                            model.total)


def plan_memory(order: list[Node], fetches: list[Node], fed: set[int], recycle: bool,
                counts: PlanCounts) -> MemoryPlan | None:
    """The :class:`MemoryPlan` of a serial run of ``order``, or None where some value is
    not known before the run (see :func:`_known`): those runs keep the dynamic
    accounting."""
    for node in order:
        if not (id(node) in fed or node.op in ("Const", "Variable", "Assign") or _known(node)):
            return None
    return MemoryPlan(order, fetches, fed, recycle, counts)


def _known(node: Node) -> bool:
    """Whether the model knows before the run what a computed node's value will be: the
    buffer its ``out`` kernel is given (on any namespace with ``out=``), or what
    :func:`_foreseen` says a kernel without one returns. Not so for a placeholder
    without a feed (the run fails), a Send or a Recv, a node of unknown shape, an input
    on another device."""
    if node.prim is None or node.shape is None or node.dtype is None:
        return False
    if any(a.device is not node.device for a in node.inputs):
        return False
    return can_write_into(node) or _foreseen(node)


def _foreseen(node: Node) -> bool:
    """Whether the model knows what the kernel of a node without an ``out`` form returns
    (:meth:`MemoryPlan._value`): on a NumPy device, a new array or a NumPy scalar for an
    op that is no view, and its input's memory for a view whose table entry says it
    returns one for these parameters (``Primitive.returns_view``: a transpose always, an
    index when it is basic; ``checkpoint`` and ``to_device`` say nothing).

    A wrong guess costs time, not correctness: the run checks each such value and falls
    back to the dynamic accounting where it is something else (a reshape that copies).
    Other namespaces keep the dynamic accounting: the checks (``_NewArray``, ``root``)
    are written for NumPy's arrays and scalars (a CuPy array is no ``np.ndarray``, its
    full sum a 0-d array), and what an Array API namespace returns is its own."""
    prim = node.prim
    assert prim is not None  # (_known checked)
    if not is_numpy_namespace(node.device.xp):
        return False
    if not prim.view:
        return True
    if prim.returns_view is None or not node.args or not isinstance(node.args[0], Node):
        return False
    assert node.shape is not None  # (_known checked)
    return prim.returns_view(node.shape, node.params)


_EXTERNAL = object()  # the model's stand-in for a value the run does not own (a feed ...)


class _Fresh:
    """The layout flags of a buffer from ``Device.empty`` or of a kernel's new array (the
    run checks the latter): C-ordered, writeable."""

    c_contiguous = True
    writeable = True


class _Immutable:
    """The layout flags of a NumPy scalar: read-only, so that ``_recyclable`` refuses it."""

    c_contiguous = True
    writeable = False


class _Planned:
    """A stand-in for an array in the model run at plan time: what :class:`Memory` reads
    of an array (shape, dtype, bytes, layout, base), the slot in which a run keeps the
    real array while it waits in the pool, and ``wanted``: whether, when the array left
    the run, a node still to run wanted one of its key from the pool (then whether it
    is recyclable decided whether it went there)."""

    __slots__ = ("shape", "dtype", "nbytes", "flags", "base", "slot", "wanted")

    def __init__(self, node: Node, slot: int, flags: type = _Fresh):
        assert node.shape is not None and node.dtype is not None  # (plan_memory checked)
        self.shape = node.shape
        self.dtype = node.device.dtype(node.dtype)  # (the pool's key names it back)
        self.nbytes = math.prod(node.shape) * np.dtype(node.dtype).itemsize
        self.flags = flags
        self.base = None
        self.slot = slot
        self.wanted = False


class _View:
    """A stand-in for a view: its ``base`` is the stand-in of the array that holds the
    memory, as a NumPy view's ``base`` is, so that ``root`` finds that array."""

    __slots__ = ("base",)

    def __init__(self, base: _Planned):
        self.base = base


# -- what the run checks about a value the plan assumed (PlannedStep.expect) ------------------

class _NewArray:
    """A kernel without an ``out`` form returned a new array of its node's shape and
    dtype, or a NumPy scalar: what its stand-in (``planned``) told :class:`Memory`. No
    view (``base is None``: ``root`` is the value itself) and none of its inputs: its
    bytes are new. Whether it is recyclable (an array, C-ordered, writeable) must be as
    the stand-in's only if the pool would have taken it when it died (``wanted``): a
    Fortran-ordered array, or a 0-d array where the plan assumed a NumPy scalar, that
    nobody would take from the pool is counted exactly as the stand-in was."""

    __slots__ = ("planned", "shape", "dtype")

    def __init__(self, planned: _Planned):
        self.planned, self.shape, self.dtype = planned, planned.shape, np.dtype(planned.dtype)

    def holds(self, value: Any, arrays: tuple) -> bool:
        if not (type(value) is np.ndarray or isinstance(value, np.generic)):
            return False
        if value.base is not None or value.shape != self.shape or value.dtype != self.dtype:
            return False
        if self.planned.wanted and _recyclable(value) != _recyclable(self.planned):
            return False
        return _new(value, arrays)


class _SameMemory:
    """A view primitive returned its first argument or a view of it: ``root`` finds the
    argument's memory, which Memory then counts once more (or not at all: a feed's)."""

    __slots__ = ()

    def holds(self, value: Any, arrays: tuple) -> bool:
        return root(value) is root(arrays[0])


_SAME_MEMORY = _SameMemory()


def _new(value: Any, arrays: tuple) -> bool:
    """Whether ``value`` is none of a kernel's arguments, nor the array under one of them
    (a kernel that returned its input: Memory would count it as that input's memory)."""
    for a in arrays:
        if value is a or value is getattr(a, "base", None):
            return False
    return True


class _PlanningMemory(Memory):
    """:class:`Memory` on stand-ins: a new buffer is a :class:`_Planned` with the next
    slot, and ``pooled`` lists the (node, buffer) pairs whose release sent the buffer
    to the pool, since the caller last emptied it."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.slots = 0
        self.pooled: list[tuple[Node, _Planned]] = []

    def _new_buffer(self, node: Node) -> _Planned:
        return self.allocated(node, _Fresh)

    def allocated(self, node: Node, flags: type) -> _Planned:
        """A stand-in for a new array: a buffer for an ``out`` kernel, or what a kernel
        without one allocates itself (it may go to the pool too)."""
        self.slots += 1
        return _Planned(node, self.slots - 1, flags)

    def _release(self, node: Node) -> None:
        at = self.value_storage.get(id(node))
        entry = self.storage.get(at) if at is not None else None
        if entry is not None and entry[1] == 1 and self.recycle:  # it is leaving the run
            base = entry[0]
            key = (entry[2], tuple(base.shape), _dtype_name(node, base))
            # (or: once wanted, a stand-in goes to the pool and a later node computes into
            # it; that node's release, when nobody wants one any more, must not unset it,
            # or the run would no longer check the layout of the array that was pooled)
            base.wanted = base.wanted or self.demand.get(key, 0) > len(self.pool.get(key, ()))
        super()._release(node)
        if entry is not None and entry[1] == 0:  # its last user: the buffer left the run
            base = entry[0]
            free = self.pool.get((entry[2], tuple(base.shape), _dtype_name(node, base)))
            if free and free[-1] is base:
                self.pooled.append((node, base))


def _distinct(nodes: tuple[Node, ...]) -> "tuple[Node, ...] | list[Node]":
    """``nodes`` without repeats (``x * x`` reads x once), in order."""
    if len(nodes) < 2 or (len(nodes) == 2 and nodes[0] is not nodes[1]):
        return nodes
    return list({id(n): n for n in nodes}.values())


def can_write_into(node: Node) -> bool:
    """Whether the node may compute into a recycled buffer: it has an ``out`` kernel,
    its device's namespace takes ``out=`` (NumPy, CuPy), and no input is promoted (so
    the buffer's dtype is exactly the result's)."""
    return (node.prim is not None and node.prim.out is not None and node.shape is not None
            and node.device.supports_out
            and all(a.dtype == node.dtype for a in node.inputs))


def _recyclable(array: Any) -> bool:
    """Whether a kernel may write into ``array``: an array, not a NumPy scalar (which is
    immutable: a 0-d result without ``out`` is one), laid out in C order, as every
    kernel's fresh result of a pooled key is. Only such buffers are pooled: a kernel
    writing into a buffer of another layout (a ufunc on a transposed input returns
    Fortran order) may compute differently, ``matmul`` into a Fortran-ordered ``out``
    differs in the last bit, and whether a node gets a recycled buffer depends on the
    timing of the other threads: results would differ between ``workers=1`` and
    ``workers=2``."""
    flags = getattr(array, "flags", None)
    return (bool(getattr(flags, "c_contiguous", False)) and getattr(flags, "writeable", True)
            and not isinstance(array, np.generic))


def _dtype_name(node: Node, array: Any) -> str:
    return node.device.dtype_name(array.dtype)


def _poison(array: Any) -> None:
    """Overwrite a freed buffer so that reading it later gives visibly wrong values."""
    try:
        array[...] = float("nan") if "float" in str(array.dtype) else -1
    except (TypeError, ValueError):  # read-only or immutable arrays cannot be poisoned
        pass
