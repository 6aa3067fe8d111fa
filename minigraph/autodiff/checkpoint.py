"""Recomputation: ``mg.checkpoint(f)``, whose intermediates are recomputed, not kept.

Reverse mode keeps every intermediate value of the forward pass until the backward pass
reads it: a chain of n layers holds n activations at the end of its forward pass. Chen
et al., *Training Deep Nets with Sublinear Memory Cost* (2016), trade compute for that
memory: cut the chain into k segments, keep only the segments' inputs during the forward
pass, and run a segment's forward again when the backward pass reaches it. Memory falls
to about n/k + k activations (the k boundaries, plus one segment's insides at a time),
least at k = √n; the price is one more forward pass (a third more work if a backward
costs two forwards; chapter 08 measures it). GPipe *re-materialises* each pipeline stage
this way; PyTorch calls it ``torch.utils.checkpoint``, JAX ``jax.checkpoint``.

``mg.checkpoint(f)(x, w)`` computes ``f(x, w)``; a gradient through it is the same as
through f, but f's intermediates are not kept for it::

    segment = mg.checkpoint(lambda h, w, b: mg.tanh(mg.tanh(h @ w + b) @ w + b))
    loss = segment(x, w, b).sum()        # the tape keeps x, w, b and the result only
    loss.backward()                      # recomputes the segment, then goes through it

**How: one primitive.** As in JAX, whose ``remat`` is a primitive holding its function,
``checkpoint`` is one entry of the primitive table (``ops/primitive.py``) whose
parameters hold f, so every interpreter handles it through the table, as it does ``sin``:

* ``impl`` (the kernel) runs f on the arrays without recording anything: its
  intermediates die when it returns. On the tape, the entry keeps f's arguments and
  result; in a graph it is one node, and a compiled graph runs it as one line.
* ``vjp`` re-runs f under ``mg.vjp`` (that is the recomputation) and pulls the adjoint
  back: one pass gives every argument's gradient, which the per-argument rules share. On
  plain tensors (a ``backward()``) it replays f's recorded graph instead, f's result
  given, so that only what the rules read is recomputed (:func:`_replayed_pull`). On
  graph nodes the pullback is itself one ``checkpoint`` node (the gradients packed in one
  vector, then cut apart), so in a graph too a segment's insides exist only while its
  node runs, and its backward node.
* ``jvp`` (per argument with a tangent) is a checkpoint of ``mg.jvp`` of f along it, and
  ``batch`` a checkpoint of ``mg.vmap`` of f: under an outer reverse mode they, too, keep
  nothing inside.
* ``shape`` traces f on placeholders (graph mode and source transformation need the
  result's shape before anything runs), once per signature: a checkpoint nested in f
  is traced within f's trace, and would be again for every program around it.

Because the rules are minigraph code, nesting needs nothing more: ``mg.grad`` of a
gradient recomputes again, ``mg.vmap``/``mg.jacfwd``/``mg.hessian`` go through it, source
transformation writes the recomputed lines into the reverse sweep.

**What f may do.** Arguments that are tensors (or values of a transformation, or NumPy
arrays) are f's inputs; any other argument (a number, a string, None) is passed to f as
it is, as ``torch.utils.checkpoint`` does, and gets no gradient; a list, tuple or dict
holding arrays or tensors is refused (one array per argument, as every transformation
takes them: ``argnums.refuse_pytrees``), and so is one that holds other values at the
backward pass (``cfg.scale = 3.0``: f recomputed would read them). f returns one tensor;
a number or an array it returns is a constant, and so is an integer or boolean result:
they take no gradient (``requires_grad`` is False), as in torch.
Gradients go to the arguments only, so f must not read a tensor that requires a gradient
(or a value of an enclosing ``mg.grad``, ``mg.jvp``, ``mg.vmap`` or graph) from outside
(a closure, a global): that raises, naming the fix. A module is the usual case, so
``mg.checkpoint(module)`` passes the module's parameters as arguments for you
(``nn.functional_call``, which swaps them into the module while it runs: another thread
calling the same module meanwhile, not through the checkpoint, would see the swapped
values, so give each thread its own module); its backward pass recomputes with the
values the module held when it was called (an enclosing ``nn.functional_call``'s too,
which has put the module's own back since), and refuses it where one of them holds other
values by then (``lin.weight.data = ...``), as for a tensor f reads from outside. Under
``mg.no_grad()`` it is a plain call of f. Recomputing
reads the arguments again, so an argument changed in place between the forward and the
backward (``x -= ...``) would give another gradient: the tape refuses that backward; and
so f itself may not write into its arguments (``y *= 0.5``), nor into a tensor or array
it reads from outside them: their arrays are read-only while f runs, and the write is
refused before it is made (``reads.read_only_arrays``). A name f reads (a global, a
closure variable, an attribute, an item of a list or dict) that is bound to another
value before the backward (``SCALE = 3.0``), or a tensor or array it reads from outside
that is written in place (``C += 1``), is refused there too, where
``torch.utils.checkpoint`` recomputes with the new value (:func:`_remember`). A function
passed to f as an argument (``checkpoint(outer)(x, fn)``, a bound method, ``mg.grad(g)``)
is f's code as much as f's own: what it reads is guarded the same way.

**Random numbers.** f may draw from a random number generator it reads: a NumPy
``Generator`` (``rng.random(x.shape)`` for a dropout mask), a ``RandomState``, Python's
``random.Random``, or the global ones of ``np.random`` and ``random``. The forward pass
takes their states before f runs, and every later run of f for that call (the
recomputation, forward mode's tangent pass, at any depth of nesting: :class:`_Drawing`)
sets them again, so that it draws the same numbers; then it puts back the states they
had (:func:`_drawing_again`), as ``torch.utils.checkpoint`` does with torch's own
generator (``preserve_rng_state=True``). A generator whose state cannot be set
(``random.SystemRandom``), or one read where the checkpoint is a graph's node or a line
of a source-mode program (which draws anew at every run, its gradient too), is refused:
draw outside f.

**In a graph** (``mg.Graph``, ``mg.trace``, graph mode) the checkpoint's node runs f at
every run: where a name f read when the graph was built, or a static argument, holds
another value then, the run is refused (:class:`_AsBuilt`), since the graph's other
nodes hold the old value.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import threading
import weakref
from contextlib import contextmanager
from types import BuiltinMethodType, CodeType, MethodType
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
from array_api_compat import array_namespace

from ..device import Device, get_device
from ..errors import MinigraphError
from ..graph.graph import Graph, GraphError, Node, placeholder
from ..ops import copy as C
from ..ops import shape as SH
from ..ops.primitive import KINDS, Each, bind, primitive
from ..ops.shape_rules import FLOATS, dtype_name, dtype_of, shape_of, supported_dtype
from ..ops.weak import Weak
from ..tensor import Tensor, owner, shared, tensor
from .batching import vmap
from .forward import rerun_jvp
from .argnums import refuse_non_functions, refuse_pytrees
from .levels import transformation
from .signature import ByIdentity, Captured, _held, constant_key, programs, signature
from .tape import is_grad_enabled, last_write, vjp, written_since
from .reads import (ParametersAsArguments, arrays_in, differs, is_container, names_in,
                    outside_arrays, outside_reads, read_only_arrays, rebound, values_in)
from ..ops.operators import innermost, passed_as_is


class CheckpointError(MinigraphError, TypeError):
    """``mg.checkpoint`` asked for something it cannot do (a tuple result, a closure over
    a value being differentiated, keyword arguments)."""


Static = tuple  # ((position, value), ...): f's arguments that are not tensors


def _call(fn: Callable[..., Any], static: Static, values: Any) -> Any:
    """``fn`` on the tensor arguments ``values``, the others put back in their places."""
    args = list(values)
    for i, v in static:
        args.insert(i, v)
    return fn(*args)


def _call_on(fn: Callable[..., Any], static: Static, *values: Any) -> Any:
    """:func:`_call` with the tensor arguments one by one (a graph records it)."""
    return _call(fn, static, values)


_CLOSURE = ("f reads {what} from outside its arguments (a closure or a global); "
            "checkpoint sends gradients to its arguments only, so that one would get none. "
            "Pass it as an argument: mg.checkpoint(lambda x, w: ...)(x, w), or "
            "mg.checkpoint(module) for a module's parameters")


def _closure_error(what: str) -> CheckpointError:
    return CheckpointError("checkpoint: " + _CLOSURE.format(what=what))


def _tuple_error(out: Any) -> CheckpointError:
    what = "None" if out is None else f"a {type(out).__name__}"
    return CheckpointError(f"checkpoint: f returned {what}; a checkpointed function returns "
                           f"one tensor (checkpoint each output's function, or "
                           f"mg.stack/mg.concatenate the outputs)")


def _not_a_value(out: Any) -> bool:
    """Whether f's result is none of what it may return: a tensor (a value of a
    transformation, a graph node), an array, a Python number."""
    return not (isinstance(out, (Tensor, Node, bool, int, float)) or type(out) in KINDS
                or hasattr(out, "__array__") and hasattr(out, "dtype"))


# -- the kernel: f on arrays, nothing recorded -----------------------------------------------

def _impl(xp: Any, *arrays: Any, fn: Callable[..., Any], static: Static,
          device: "Device | str") -> Any:
    """Run f on tensors over the arrays (counted nowhere: their owners count them) and
    return its result's array. The intermediates die here."""
    dev = get_device(device)
    with read_only_arrays(fn, "checkpoint", "; the backward pass runs f again, which would "
                         "start from the written value (and write it twice)", CheckpointError,
                         arrays, static):  # (its arguments too: refused before the write is
        # made; and what a function among them reads, as f's own reads)
        out = _call(fn, static, [shared(a, dev) if hasattr(a, "shape") else a for a in arrays])
    if _not_a_value(out):
        raise _tuple_error(out)
    if type(out) in KINDS:
        raise _closure_error(f"a value of a transformation or a graph ({type(out).__name__})")
    # (a number, an array, a tensor read from outside: a constant, the forward pass
    # notes, whose result then takes no gradient, as torch's: see checkpoint)
    outside = {id(owner(a.data if isinstance(a, Tensor) else a))
               for _, a in outside_arrays(fn, static)}
    constant = not isinstance(out, Tensor) or id(owner(out.data)) in outside
    if _forward.passes and _forward.passes[-1].fn is fn:
        _forward.passes[-1].constant = constant
    if not isinstance(out, Tensor):
        out = tensor(out, device=dev)
    if out.requires_grad:  # only a tensor read from outside can have made it so
        raise _closure_error("a tensor that requires a gradient")
    if out.device is not dev:
        raise CheckpointError(f"checkpoint: f's result lives on {out.device.name}, its "
                              f"arguments on {dev.name}; move it back inside f")
    # The primitive's result may be a view of its arguments (its entry says view), which
    # a Session's memory manager follows; a view of a tensor f reads from outside (a
    # global table's rows) is memory no run owns: a copy, or the run would recycle the
    # global's buffer once the result is dead, and hand it over as a fetched value.
    if id(owner(out.data)) in outside:
        return dev.copy_from(out.data, dev)
    return out.data


# -- the shape rule: f traced on placeholders ---------------------------------------------------

def _shape(*args: Any, fn: Callable[..., Any], static: Static, device: Any) -> tuple:
    """f's result's shape and dtype. Graph mode asks once per node, source transformation
    once per line; eager code never asks. A backward node's (:class:`_Pullback`) is its
    arguments' sizes; f's is traced once per signature (:func:`_traced_shape`)."""
    if isinstance(fn, _Pullback):
        return fn.shape(args)
    user = fn.fn if isinstance(fn, _AsBuilt) else fn  # (one per graph node: f's own)
    try:  # (arguments by shape and dtype; numbers, and static ones, by their values)
        options = tuple((i, constant_key(v, i)) for i, v in static)
        key = tuple(constant_key(a, k) if isinstance(a, (bool, int, float)) else
                    (tuple(shape_of(a)), str(dtype_of(a))) for k, a in enumerate(args))
    except TypeError:  # (an unhashable static argument: traced at every call)
        if _tracing.depth >= _DEEPEST_TRACE:
            raise CheckpointError(
                f"checkpoint: checkpoints nested more than {_DEEPEST_TRACE} deep, one with "
                f"an argument that is no key (a {type(dict(static)).__name__}), cannot be "
                f"traced; pass it as a tensor, or nest fewer") from None
        return _traced_shape(args, fn, static)
    # Cached, because a checkpoint nested in f is traced within f's trace (its node's
    # shape), and so on down: d nested checkpoints were traced d times each, the
    # backward pass's programs again, and that at every level of their recursion.
    cache = programs(user, "checkpoint shape", options)
    known = cache.get(key)
    if known is not None and rebound(known[1]) is None and all(
            _as_it_was(a, was) for (_, a), was in zip(arrays_in(known[1]), known[2])):
        return known[0]
    if _tracing.depth >= _DEEPEST_TRACE:  # (the outermost trace runs this one first)
        raise _Deeper(lambda: _shape(*args, fn=fn, static=static, device=device))
    while True:
        reads = outside_reads(user, arguments=static)  # (before f runs, as record's)
        try:
            found = _traced_shape(args, fn, static)
            break
        except _Deeper as deeper:
            if _tracing.depth:
                raise
            deeper.shape()  # (cached now: f's trace stops there when run again)
    # (valid while f reads the same names, and the arrays it reads keep their shapes and
    # values: a shape may follow a value, x[MASK] with a global mask written in place)
    cache[key] = (found, reads, [_as_it_is(a) for _, a in arrays_in(reads)])
    return found


def _as_it_is(a: Any) -> tuple:
    """An array's (or a tensor's) shape and what tells its values (:func:`_changed`)."""
    now = _array(a)
    return tuple(shape_of(a)), _digest(now) if isinstance(now, (np.ndarray, np.generic)) \
        else array_namespace(now).asarray(now, copy=True)


def _as_it_was(a: Any, was: tuple) -> bool:
    return tuple(shape_of(a)) == was[0] and not _changed(a, was[1])


_DEEPEST_TRACE = 16  # (checkpoints traced within one another's trace: _Deeper)


class _Tracing(threading.local):
    """How many traces of checkpoints' functions (:func:`_traced_shape`) run in this
    thread, one within another."""

    depth = 0


_tracing = _Tracing()


class _Deeper(BaseException):
    """A checkpoint nested ``_DEEPEST_TRACE`` deep in others whose shapes are being
    traced: its shape (``shape()``) is traced first, from the outermost trace, which then
    runs again and finds it cached. So d nested checkpoints take a stack d / 16 deep, not
    d deep: Python's recursion limit would stop a trace (about 12 frames a level) near a
    hundred of them. (Not an Exception: f's own ``except Exception`` must not catch it.)"""

    def __init__(self, shape: Callable[[], tuple]):
        self.shape = shape


def _traced_shape(args: tuple, fn: Callable[..., Any], static: Static) -> tuple:
    """f's result's shape and dtype, from f run on placeholders of a scratch graph (JAX
    evaluates its jaxpr abstractly)."""
    graph = Graph("checkpoint")
    with graph:
        inputs = [a if isinstance(a, (bool, int, float)) else
                  placeholder(tuple(shape_of(a)), str(dtype_of(a))) for a in args]
        _tracing.depth += 1
        try:  # (an update of an argument is refused, as the tape's _impl refuses it)
            with passed_as_is(inputs, (), "checkpoint", every=True):
                out = _call(fn, static, inputs)
        except GraphError as exc:  # a node of the enclosing graph met one of these
            raise _closure_error("a node of the graph being built") from exc
        finally:
            _tracing.depth -= 1
    if _not_a_value(out):
        raise _tuple_error(out)
    if isinstance(out, Node) and out.graph is graph or isinstance(out, Tensor):
        return tuple(shape_of(out)), out.dtype
    if type(out) not in KINDS:  # a constant: a number, an array (int64 for 3, as NumPy)
        constant = np.asarray(out)
        return constant.shape, dtype_name(constant.dtype)
    raise _closure_error(f"a value of a transformation ({type(out).__name__})")


# -- reverse mode: recompute, then pull back ------------------------------------------------------

def _float_positions(args: tuple, fn: Callable[..., Any]) -> list[int]:
    """The arguments that can have a gradient: floating tensors of any kind, but not a
    recorded function's float (:class:`_Weakly`), a constant of f in eager mode."""
    weak = getattr(fn, "weak_inputs", ())
    return [k for k, a in enumerate(args) if k not in weak and
            not isinstance(a, (bool, int, float)) and dtype_of(a) in FLOATS]


def _pull(g: Any, args: tuple, fn: Callable[..., Any], static: Static, device: Any,
          one_node: bool = True, out: Any = None) -> list:
    """Every argument's gradient (None for those that cannot have one), f recomputed.
    ``out``, f's result where the caller has it, lets plain tensors take the replayed
    pullback (:func:`_replayed_pull`)."""
    wrt = _float_positions(args, fn)
    if not wrt:
        return [None] * len(args)
    if out is not None:
        replayed = _replayed_pull(g, out, args, wrt, fn, static)
        if replayed is not None:
            return replayed
    if one_node and any(isinstance(v, Node) for v in (g, *args)):
        # In a graph: one node that recomputes and pulls back when it runs (a checkpoint
        # itself), its result the gradients packed in one vector, cut apart after it.
        # (It does not read f's result, which the replay would want: that would keep each
        # pipeline microbatch's stage output alive until its backward, and chapter 08's
        # GPipe stage 0 then peaked at 840 KiB, not 456. So here f is recomputed whole.)
        packed = bind(CHECKPOINT, g, *args, fn=_Pullback(fn, static), static=(),
                      device=device)
        return _unpack(packed, args, wrt)
    if not is_grad_enabled():  # (a plain backward(): nothing outside needs recording)
        g = g.detach() if type(g) is Tensor else g
        args = tuple(a.detach() if type(a) is Tensor else a for a in args)

    boxes: list = []

    def along(*xs: Any) -> Any:
        boxes.extend(xs)
        values = list(args)
        for k, x in zip(wrt, xs):
            values[k] = x
        out = _call(fn, static, values)  # (a number or an array: a constant, no gradient)
        return out if isinstance(out, Tensor) or type(out) in KINDS else tensor(out)

    _, pullback = vjp(along, *(args[k] for k in wrt))  # the recomputation
    grads: list = [None] * len(args)
    for k, gk in zip(wrt, pullback(g)):
        grads[k] = gk
    # The recording lists its boxes and each box points to the recording: a cycle, which
    # only Python's cycle collector would free, some time later. Empty it now, so that
    # the recomputed intermediates go as soon as they have been used.
    boxes[0].tape.entries.clear()
    return grads


def _replayed_pull(g: Any, out: Any, args: tuple, wrt: list[int], fn: Callable[..., Any],
                   static: Static) -> list | None:
    """The gradients by f's backward graph, replayed on the tensors, where every value is
    a plain tensor and nothing is being recorded (a plain ``backward()``); None
    elsewhere, or where f cannot be recorded in a graph (Python control flow on a
    value): then the tape recomputes all of f.

    The graph is f's, recorded once per signature (graph mode's ``record``), with the
    reverse-graph pass's nodes seeded by ``g``; its inputs are f's arguments, the seed and
    f's *result*, whose saved value is given rather than recomputed. So the replay runs
    only what the VJP rules read, as JAX does to a ``remat``'s recomputation (dead code
    elimination): the last layer of a segment, ``tanh(h @ w + b)``, whose rule reads its
    result, is not run again at all. On chapter 08's 16-layer MLP that is a quarter of
    the recomputation. (Replayed through ``bind``, not compiled: its values are tensors,
    so the device's memory counters see the recomputation.)
    """
    values = (g, out, *args)
    if not all(type(v) is Tensor for v in values) or (
            is_grad_enabled() and any(v.requires_grad for v in values)):
        return None  # (values of other transformations, or a recording backward)
    try:  # (static arguments by type and value, as every cache keys them: 0.0 is not -0.0)
        options = tuple((i, constant_key(v, i)) for i, v in static)
    except TypeError:  # an unhashable static argument: no key for the cache
        return None
    cache = programs(fn, "checkpoint backward", options)
    key = signature(args)
    program = cache.get(key)
    if program is None or program is not _UNTRACEABLE and program.captured.stale():
        program = cache[key] = _backward_program(fn, static, args, wrt, key)
    if program is _UNTRACEABLE:
        return None
    from ..graph.trace import replay  # (graph modules import this one)

    grads: list = [None] * len(args)
    results = replay(program.inputs, program.outputs, [v.detach() for v in (*args, out, g)])
    for k, gk in zip(wrt, results):
        grads[k] = gk
    return grads


_UNTRACEABLE: Any = object()  # (the cache's answer for an f that graph mode cannot record)


class _Backward(NamedTuple):
    """f's pullback as a graph: ``inputs`` (f's arguments, its result, the adjoint) to
    ``outputs`` (the gradients), and the tensors f read from outside when recorded."""
    inputs: list
    outputs: list
    captured: Captured


def _backward_program(fn: Callable[..., Any], static: Static, args: tuple, wrt: list[int],
                      key: tuple) -> Any:
    """f's pullback as a graph (:class:`_Backward`), or ``_UNTRACEABLE``."""
    from ..graph.gradients import gradients  # (graph modules import this one)
    from ..graph.trace import record

    # (a partial, not a lambda: what it is given, f and a function among its static
    # arguments, is what the recording guards; a lambda of minigraph's is not read)
    run = functools.partial(_call_on, fn, static)
    try:  # (reads: what run, so f, read before it ran, which the program's guard keeps)
        graph, inputs, result, reads = record(run, args, "checkpoint_backward", key)
    except Exception:  # noqa: BLE001  (an if on a value, NumPy on a node, ...: the tape
        return _UNTRACEABLE  # recomputes instead, running f as it is, its errors its own)
    if not isinstance(result, Node) or result.graph is not graph or \
            any(result is x for x in inputs):
        return _UNTRACEABLE  # (f returned an argument or a constant: nothing to save)
    captured = Captured((t for t, _ in graph._consts.values()), own=graph.written_by_f,
                        reads=reads)
    xs = [inputs[k] for k in wrt]
    with graph, result.device:
        seed = placeholder(tuple(result.shape), str(result.dtype), name="g")
        grads = [gx if gx is not None else C.zeros_like(x)
                 for gx, x in zip(gradients(result, xs, [seed]), xs)]
    return _Backward(inputs + [result, seed], grads, captured)


class _Pullback:
    """``(g, *args) -> every gradient, packed in one vector``: the function of the node
    that differentiates a checkpoint node in a graph."""

    def __init__(self, fn: Callable[..., Any], static: Static):
        self.fn, self.static = fn, static

    def shape(self, args: tuple) -> tuple:
        """Its result's shape and dtype, from its arguments ``(g, *args)``, without
        running f: a node's gradient has the node's shape and dtype."""
        parts = [args[1:][k] for k in _float_positions(args[1:], self.fn)]
        return (sum(math.prod(shape_of(p)) for p in parts),), _packed_dtype(parts)

    def __call__(self, g: Any, *args: Any) -> Any:
        grads = _pull(g, args, self.fn, self.static, None, one_node=False)
        parts = [grads[k] for k in _float_positions(args, self.fn)]
        dtype = _packed_dtype(parts)
        flat = [SH.reshape(C.astype(p, dtype, copy=False), (math.prod(shape_of(p)),))
                for p in parts]
        return flat[0] if len(flat) == 1 else SH.concatenate(flat)


def _packed_dtype(parts: list) -> str:
    """The dtype the gradients ``parts`` are packed in: float64 if one of them is."""
    return "float64" if any(str(dtype_of(p)) == "float64" for p in parts) else "float32"


def _unpack(packed: Any, args: tuple, wrt: list[int]) -> list:
    grads: list = [None] * len(args)
    start = 0
    for k in wrt:
        shape = tuple(shape_of(args[k]))
        n = math.prod(shape)
        piece = SH.reshape(SH.getitem(packed, (slice(start, start + n),)), shape)
        grads[k] = C.astype(piece, str(dtype_of(args[k])), copy=False)
        start += n
    return grads


class _Memo(threading.local):
    """The gradients of the checkpoint entry the sweep is at. The sweep asks one VJP rule
    per argument; the first computes them all, the others take theirs from here. A
    tensor adjoint is held weakly: when the sweep drops it, the memo empties."""

    key: tuple = ()      # (reference to the adjoint, reference to the output)
    grads: list = []


_memo = _Memo()
_TAKEN = object()


def _reference(v: Any, callback: Callable[[Any], None] | None = None) -> Callable[[], Any]:
    try:
        return weakref.ref(v, callback)
    except TypeError:  # graph nodes, source variables ... (no weak references): kept
        return lambda: v


# What f read (reads.outside_reads: globals, closure variables, attributes, items) when
# a checkpoint's result was computed, by the id of that result (a tensor's == compares
# its elements): the backward pass recomputes f, which must read the same values, or it
# would give the derivative of another function. An entry leaves with its tensor.
class _Read(NamedTuple):
    ref: Any       # a weak reference to the result
    reads: list    # reads.outside_reads(f)
    stamp: int     # tape.last_write() then: a tensor f reads must not be written since
    tensors: list  # the tensors among the reads
    arrays: list   # (array or tensor, digest of its bytes or a copy): writes that
                   # no stamp sees (W.data -= g, through W.numpy(), X[:] = batch)
    static: list   # (position, key) of f's other arguments (_static_keys)
    parameters: list  # (name, tensor, digest or copy): a module's (_parameters_given)


_READS: dict[int, _Read] = {}


def _remember(f: Callable[..., Any], value: Tensor, reads: list, static: Static,
              parameters: list) -> None:
    """What f read from outside (``reads``), the static arguments it was given, and the
    module's parameters it was given (``parameters``: :func:`_parameters_given`), for
    ``value``'s backward pass.
    A NumPy array, or a tensor's, is kept as a digest of its bytes (BLAKE2b, 16 bytes: no
    copy, where a checkpoint is there to save memory); another library's array as a copy.
    (A tensor's write stamp misses ``W.data -= g``, ``W.data = other`` and writes through
    ``W.numpy()``.)"""
    found = [a for _, a in arrays_in(reads)]
    arrays = [(a, _kept(a)) for a in found]
    ident = id(value)
    _READS[ident] = _Read(weakref.ref(value, lambda _: _READS.pop(ident, None)), reads,
                          last_write(), [a for a in found if type(a) is Tensor], arrays,
                          _static_keys(static), [(n, p, _kept(p)) for n, p in parameters])


def _parameters_given(f: Callable[..., Any], static: Static, inputs: list) -> list:
    """``(name, tensor)`` of the module's parameters that a module's checkpoint
    (:class:`_ModuleCall`, f) was given, its last arguments. They are arguments, which
    the tape's write stamps guard (``lin.weight *= 10``); but they stand for what the
    module held when it was called, so their arrays are guarded as those f reads from
    outside are (:func:`_refuse_written`): ``lin.weight.data = other`` before backward()
    would have the recomputation use the other array."""
    if not isinstance(f, _ModuleCall):
        return []
    names = static[0][1]  # (its first argument: _checkpoint_module)
    given = zip(names, inputs[len(inputs) - len(names):])
    return [(n, p) for n, p in given if type(p) is Tensor]


def _static_keys(static: Static) -> list:
    """``(position, key)`` of f's arguments that are not tensors, keyed as a compiled
    program keys them (``signature.constant_key``; an object or a dict by all it holds,
    ``signature._held``): ``cfg.scale = 3.0`` between the forward and the backward
    changes the key. None for one that cannot be keyed (nested too deep)."""
    keys = []
    for i, v in static:
        try:
            try:
                key = constant_key(v, i)
            except TypeError:  # (a dict, a list: unhashable, keyed by their items)
                key = _held(v, i, v, set(), top=True)
        except TypeError:
            key = None
        keys.append((i, key))
    return keys


def _kept(a: Any) -> Any:
    """What :func:`_changed` compares ``a`` (an array or a tensor) with later: a digest
    of a NumPy array's bytes, or a copy of another library's array."""
    d = _array(a)
    return _digest(d) if isinstance(d, (np.ndarray, np.generic)) else \
        array_namespace(d).asarray(d, copy=True)


def _digest(a: "np.ndarray | np.generic") -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(a).data, digest_size=16).digest()


def _array(a: Any) -> Any:
    """The array a tensor holds now (``W.data = other`` gives it another), or ``a``."""
    return a.data if type(a) is Tensor else a


def _changed(a: Any, was: Any) -> bool:
    """Whether ``a`` (an array or a tensor) holds other bytes than ``was`` (:func:`_remember`)."""
    now = _array(a)
    return _digest(now) != was if isinstance(now, (np.ndarray, np.generic)) else \
        differs(now, was)


def _read_for(out: Any) -> _Read | None:
    """What f read when it computed ``out`` (:func:`_remember`), if it is remembered."""
    read = _READS.get(id(out))
    return read if read is not None and read.ref() is out else None


# What _refuse_rebound says, where f runs again: (since when, why that is refused, the fix)
_BACKWARD = ("the forward pass", "the backward pass recomputes f, which would read the new "
             "value and give the derivative of another function (torch.utils.checkpoint "
             "gives it silently)", "Change it after backward()")
_BUILT = ("the graph was built", "the graph's other nodes hold the value it had then, but the "
          "checkpoint's node runs f at every Session.run, which would read the new one (as "
          "jax.jit(jax.checkpoint(f)) would not)", "Build the graph again after the change")


def _refuse_rebound(reads: list, keys: list, static: Static,
                    when: tuple[str, str, str] = _BACKWARD) -> None:
    """Refuse to run f again where a name f read (``reads``) holds another value now, or
    one of its ``static`` arguments (an object, a dict) holds other values than their
    ``keys`` (:func:`_static_keys`) say it did then."""
    since, why, fix = when
    changed = next((i for (i, was), (_, now) in zip(keys, _static_keys(static))
                    if was is not None and was != now), None)
    if changed is not None:
        raise CheckpointError(
            f"checkpoint: argument {changed} of f (a {type(dict(static)[changed]).__name__}, "
            f"not a tensor) holds other values since {since}; {why}. {fix}, or pass the "
            f"values to f as tensors")
    name = rebound(reads)
    if name is not None:
        raise CheckpointError(
            f"checkpoint: f reads {name}, which holds another value since {since} (a name "
            f"or an item bound anew); {why}. {fix}, or pass it to f as an argument")


def _refuse_written(read: _Read) -> None:
    """Refuse to recompute f for the backward pass where a tensor or array f read
    (``read``) was written in place since the forward pass, or a module's parameter it
    was given holds other values (:func:`_parameters_given`)."""
    name, p = next(((n, p) for n, p, was in read.parameters if _changed(p, was)),
                   (None, None))
    if p is not None:
        raise CheckpointError(
            f"checkpoint: the module's parameter {name} (shape {tuple(p.shape)} {p.dtype}) "
            f"holds other values since the forward pass ({name}.data = ..., or a write "
            f"through .data or .numpy(), which no write stamp sees); the backward pass "
            f"recomputes the module with it, which would give the derivative of another "
            f"function than the forward pass computed. Change the parameters after "
            f"backward()")
    k = written_since(read.tensors, read.stamp)
    changed = read.tensors[k] if k is not None else next(
        (a for a, was in read.arrays if _changed(a, was)), None)
    if changed is not None:
        what, plain = ("a tensor", "backward() without checkpoint refuses it too") \
            if k is not None else ("an array", "without checkpoint, the tape keeps a copy") \
            if type(changed) is not Tensor else \
            ("a tensor", "written by W.data -= g or through W.numpy(), which no write stamp sees")
        raise CheckpointError(
            f"checkpoint: f reads {what} from outside its arguments (shape "
            f"{tuple(changed.shape)}) that was changed in place since the forward pass; the "
            f"backward pass recomputes f, which would read the new values and give the "
            f"derivative of another function ({plain}). Change it after backward(), or "
            f"pass it to f as an argument")


# -- random numbers: the recomputation draws what the forward pass drew ------------------

_MOST_HELD = 10_000


def _held_by(static: "Static | list", levels: int = 3) -> list:
    """``(where, name, value)`` for f's arguments that are not tensors and what they hold,
    ``levels`` deep (``t[0]``, ``cfg.rng``, ``d["r"]``): where a generator may be that f
    draws from. (A bounded walk over the user's objects, each once, at most
    ``_MOST_HELD`` of them: a long list of numbers passed as an argument is not read
    whole on every call.)"""
    found: list = []
    seen: set[int] = set()
    todo = [(f"argument {i}", a) for i, a in static]
    for _ in range(levels):
        inside: list = []
        for name, v in todo:
            if id(v) in seen or len(seen) >= _MOST_HELD:
                continue
            seen.add(id(v))
            found.append((static, name, v))
            if is_container(v):
                pairs = v.items() if isinstance(v, dict) else enumerate(v)
                inside += [(f"{name}[{k!r}]", item) for k, item in pairs]
            elif isinstance(getattr(v, "__dict__", None), dict) and not isinstance(v, type):
                inside += [(f"{name}.{k}", item) for k, item in vars(v).items()]
        todo = inside
    return found


def _generator(v: Any, names: set[str]) -> Any:
    """The random number generator whose state ``v`` draws from, or None: NumPy's
    Generator (its BitGenerator), BitGenerator or RandomState, Python's ``random.Random``;
    the module ``np.random`` or ``random`` (their global generator, which their
    functions use) where f reads that module, or numpy where f's code ``names`` random
    (``np.random.rand``), or one of their functions (``rand``, a method of np.random's
    global RandomState), or a ``functools.partial`` of one."""
    if isinstance(v, np.random.Generator):
        return v.bit_generator
    if isinstance(v, (np.random.BitGenerator, np.random.RandomState, random.Random)):
        return v
    if v is np and "random" in names or v is np.random:
        return np.random
    if v is random:
        return random
    if isinstance(v, (MethodType, BuiltinMethodType)):  # (a bound method: its object's)
        return _generator(v.__self__, names)
    if isinstance(v, functools.partial):  # (partial(rng.random, 4): its function's)
        return _generator(v.func, names)
    return None


def _names(reads: list) -> set[str]:
    """The attributes the code of f and of the functions it calls loads (``outside_reads``
    lists their code objects; ``reads.names_in``), nested functions and comprehensions
    included: ``random`` of ``np.random.rand``, not a global named ``random``."""
    return {n for _, _, v in reads if type(v) is CodeType for n in names_in(v).attributes}


def _state(g: Any) -> Any:
    if isinstance(g, np.random.BitGenerator):
        return g.state
    if isinstance(g, np.random.RandomState) or g is np.random:
        return g.get_state(legacy=False)
    return g.getstate()  # (random.Random, or the module random)


def _set_state(g: Any, state: Any) -> None:
    if isinstance(g, np.random.BitGenerator):
        g.state = state
    elif isinstance(g, np.random.RandomState) or g is np.random:
        g.set_state(state)
    else:
        g.setstate(state)


def _generator_states(reads: list) -> list:
    """``(name, generator, state)`` of each random number generator f reads
    (:func:`_generator`), taken before f runs: the recomputation draws again from these
    states, as ``torch.utils.checkpoint`` does with torch's (``preserve_rng_state=True``).
    A generator with no state to set (``random.SystemRandom``) is refused."""
    states: dict[int, tuple[str, Any, Any]] = {}
    names = _names(reads)
    methods = (MethodType, BuiltinMethodType)  # (named by the generator, not its method)
    # (the items of the lists and dicts f reads too: RNGS[0], CFG["rng"], self.rngs[0])
    for name, v in sorted(values_in(reads), key=lambda r: isinstance(r[1], methods)):
        g = _generator(v, names)
        if g is None or id(g) in states:
            continue
        try:
            states[id(g)] = (name, g, _state(g))
        except NotImplementedError:
            raise CheckpointError(
                f"checkpoint: f reads {name}, a random number generator whose state cannot "
                f"be set ({type(g).__name__}); the backward pass recomputes f, which would "
                f"draw other numbers and give the derivative of another function. Draw "
                f"them outside f and pass them as an argument") from None
    return list(states.values())


@contextmanager
def _drawing_again(drawn: list) -> Iterator[None]:
    """The generators of ``drawn`` at the states they had before the forward pass while
    the recomputation runs, then back at the states they have now (so that code after
    the backward draws what it would without checkpoint)."""
    now = [(g, _state(g)) for _, g, _ in drawn]
    for _, g, state in drawn:
        _set_state(g, state)
    try:
        yield
    finally:
        for g, state in now:
            _set_state(g, state)


class _Drawing:
    """f, which draws random numbers from the generators of ``drawn`` (their states before
    the forward pass: :func:`_generator_states`), as one call of the checkpoint runs it:
    its first run (the forward pass's) draws them, and every later one draws them again
    (:func:`_drawing_again`): a tangent's pass at each level of ``mg.jvp``, the backward
    pass's recomputation at each level of ``mg.grad``, under ``mg.vmap`` too, since every
    rule runs f through it."""

    def __init__(self, fn: Callable[..., Any], drawn: list):
        self.fn, self.drawn, self.ran = fn, drawn, False
        self.weak_inputs = getattr(fn, "weak_inputs", ())  # (as _Weakly's)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args: Any) -> Any:
        if not self.ran:
            self.ran = True
            return self.fn(*args)
        with _drawing_again(self.drawn):
            return self.fn(*args)


def _vjp_rule(i: int) -> Callable[..., Any]:
    def rule(g: Any, out: Any, *args: Any, fn: Callable[..., Any], static: Static,
             device: Any) -> Any:
        if dtype_of(out) not in FLOATS:  # (an integer result: a constant, as in torch)
            return C.zeros_like(args[i])
        memo = _memo
        hit = memo.key and memo.key[0]() is g and memo.key[1]() is out \
            and memo.grads[i] is not _TAKEN  # (taken already: a new sweep, recompute)
        if not hit:
            memo.key, memo.grads = (), []
            read = _read_for(innermost(out))  # (under another transformation, out is
            # its value: a box, a dual number, a batch, around the tensor remembered)
            if read is not None:
                _refuse_rebound(read.reads, read.static, static)
                _refuse_written(read)
            # (f that draws random numbers draws them again as it runs: not the replay,
            # whose recorded graph holds those drawn when it was recorded)
            grads = _pull(g, args, fn, static, device,
                          out=None if isinstance(_user_f(fn), _Drawing) else out)
            state = memo.__dict__  # this thread's memo, for the callback

            def forget(ref: Any) -> None:
                if state.get("key") and state["key"][0] is ref:
                    state["key"], state["grads"] = (), []

            memo.key, memo.grads = (_reference(g, forget), _reference(out)), grads
        share, memo.grads[i] = memo.grads[i], _TAKEN
        if all(s is _TAKEN or s is None for s in memo.grads):
            memo.key, memo.grads = (), []
        return share if share is not None else C.zeros_like(args[i])
    return rule


# -- forward mode and batching: checkpoints of jvp and vmap ----------------------------------------

class _Tangent:
    """``(t, *args) ->`` the tangent of f's result along argument ``i`` (one jvp pass)."""

    def __init__(self, fn: Callable[..., Any], static: Static, i: int):
        self.fn, self.static, self.i = fn, static, i
        # (what explain's forward trace prints for it)
        self.__name__ = f"tangent_of_{getattr(fn, '__name__', 'f')}_along_{i}"

    def __call__(self, t: Any, *args: Any) -> Any:
        i = self.i

        def along(x: Any) -> Any:
            return _call(self.fn, self.static, args[:i] + (x,) + args[i + 1:])

        return rerun_jvp(along, (args[i],), (t,))[1]  # (no_grad as in the enclosing pass)


def _jvp_rule(i: int) -> Callable[..., Any]:
    def rule(t: Any, out: Any, *args: Any, fn: Callable[..., Any], static: Static,
             device: Any) -> Any:
        if dtype_of(out) not in FLOATS:  # (an integer result: a constant, zero tangent)
            return None
        tangent = bind(CHECKPOINT, t, *args, fn=_Tangent(fn, static, i), static=(),
                       device=device)
        forward = _forward.passes[-1] if _forward.passes else None
        if forward is not None and _user_f(fn) is forward.fn:  # (this forward pass's:
            forward.results.append(tangent)  # its backward pass is guarded as f's)
        return tangent
    return rule


class _Pass:
    """A checkpoint's forward pass: its f (``fn``), the results of the checkpoints of
    f's tangents it made (``results``: the jvp rule's, at each level of ``mg.jvp``),
    and whether f's result was a constant (``_impl``)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn, self.constant = fn, False
        self.results: list = []


class _Forward(threading.local):
    """The checkpoints whose forward pass is running in this thread, innermost last."""

    def __init__(self) -> None:
        self.passes: list[_Pass] = []


_forward = _Forward()


class _Batched:
    """f on a batch: ``mg.vmap`` over the arguments that carry the batch axis in front."""

    def __init__(self, fn: Callable[..., Any], static: Static, dims: tuple):
        self.fn, self.static, self.dims = fn, static, dims

    def __call__(self, *args: Any) -> Any:
        return vmap(lambda *xs: _call(self.fn, self.static, xs), in_axes=self.dims)(*args)


def _user_f(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The f that a forward-mode or batching rule's function (:class:`_Tangent`,
    :class:`_Batched`, at any depth of nesting) runs: the checkpoint call's own."""
    while isinstance(fn, (_Tangent, _Batched)):
        fn = fn.fn
    return fn


def _batch(dims: tuple, *args: Any, fn: Callable[..., Any], static: Static, device: Any) -> Any:
    return bind(CHECKPOINT, *args, fn=_Batched(fn, static, tuple(dims)), static=(),
                device=device)


def _write(prim: Any, args: list[str], params: dict, literal: Callable[[Any], str]) -> str:
    """Source transformation writes it as the user would: ``mg.checkpoint(f)(x, w)``."""
    words = list(args)
    for i, v in params["static"]:
        words.insert(i, literal(v))
    return f"mg.checkpoint({literal(params['fn'])})({', '.join(words)})"


CHECKPOINT = primitive(
    "checkpoint", _impl, _shape, jvp=Each(_jvp_rule), vjp=Each(_vjp_rule), batch=_batch,
    cost="expensive", view=True,  # (f may return an argument, or a view of one)
    write=_write, runs_user_code=True)


class _Weakly:
    """f with its arguments at ``positions`` handed to it as ``Weak`` values again: a
    recorded function's floats (ops/weak.py), which checkpoint carries as data (its inputs
    at ``weak_inputs``) and f must see as the Python numbers they are in eager mode,
    whatever values it is recomputed on. They are constants of f, as there: no gradient
    is taken for them, so no transformation's value takes their place (a Weak around
    one would hide it from its level; where one arrives anyway, f gets it as it is)."""

    def __init__(self, fn: Callable[..., Any], positions: tuple[int, ...],
                 weak_inputs: tuple[int, ...]):
        self.fn, self.positions, self.weak_inputs = fn, positions, weak_inputs
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args: Any) -> Any:
        # (a Python number, where a replay of the recording hands f the float itself,
        # is already what f sees in eager mode: a Weak is around a recorded value only)
        return self.fn(*(Weak(a) if i in self.positions and not _a_level(a)
                         and not isinstance(a, (bool, int, float)) else a
                         for i, a in enumerate(args)))


class _AsBuilt:
    """f as a graph's node runs it (``mg.Graph``, whose ``Session.run`` runs f again each
    time, and its gradient's node once more): refused where a name f read when the graph
    was built (``reads``), or a static argument, holds another value now. The graph's
    other nodes hold what f read then (a global's value is a constant of theirs), as the
    checkpoint's node's result would in JAX (``jit`` of ``checkpoint``)."""

    def __init__(self, fn: Callable[..., Any], reads: list, static: Static):
        # (not a module's parameters: nn.functional_call swaps values in for them while
        # other nodes run, a pipeline's threads, and a module's checkpoint takes them as
        # arguments)
        swapped = {id(v.__dict__["_parameters"]) for _, _, v in reads
                   if callable(getattr(v, "named_parameters", None))
                   and type(getattr(v, "__dict__", {}).get("_parameters")) is dict}
        reads = [r for r in reads if id(r[0]) not in swapped]
        self.fn = fn
        # (and the arrays f read as they were: the graph's other nodes hold them so)
        arrays = [(name, a, _as_it_is(a)) for name, a in arrays_in(reads)]
        _AS_BUILT[self] = (reads, _static_keys(static), static, arrays)
        self.weak_inputs = getattr(fn, "weak_inputs", ())  # (as _Weakly's)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args: Any) -> Any:
        reads, keys, static, arrays = _AS_BUILT[self]
        _refuse_rebound(reads, keys, static, when=_BUILT)
        written = next((name for name, a, was in arrays if not _as_it_was(a, was)), None)
        if written is not None:  # (f would compute with the new values, the graph's other
            since, why, fix = _BUILT  # nodes with the old ones)
            raise CheckpointError(
                f"checkpoint: f reads {written}, a tensor or array written in place since "
                f"{since}; {why}. {fix}, or pass it to f as an argument")
        return self.fn(*args)


# _AsBuilt -> what f read when the graph was built: not an attribute of it, which the
# guards of what f reads (reads.outside_reads: a checkpoint's node, its gradient's) would
# walk, and the reads hold the module's globals (under pytest, its whole session).
_AS_BUILT: "weakref.WeakKeyDictionary[_AsBuilt, tuple[list, list, Static, list]]" = \
    weakref.WeakKeyDictionary()


def _program_kinds() -> set[type]:
    """The values of a program being built, which runs f at each of its runs: a graph's
    nodes, a source-mode program's variables."""
    from .source.values import SrcVar  # (source modules import this one)

    return {Node, SrcVar}


def _a_level(a: Any) -> bool:
    """Whether ``a`` is a value of a transformation level (levels.py: 100 and above)."""
    return type(a) in KINDS and a._priority >= 100


# -- the public function ---------------------------------------------------------------------------

def checkpoint(f: Callable[..., Any]) -> Callable[..., Any]:
    """``mg.checkpoint(f)``: f, whose intermediates are recomputed in the backward pass
    instead of kept (see the module's docstring). ``f`` may be a module: its parameters
    then become arguments of the checkpoint, so they get their gradients."""
    refuse_non_functions(f, "checkpoint")
    if callable(getattr(f, "named_parameters", None)):
        return _checkpoint_module(f)
    from ..graph.trace import name_of  # (graph modules import this one)

    name = name_of(f)  # (a str: not a __getattr__'s None)

    weakly: dict[tuple, _Weakly] = {}  # (one per pattern: checkpoint's caches key on it)

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        _refuse_keywords(name, kwargs)
        refuse_pytrees(args, range(len(args)), f"checkpoint({name})")
        inputs: list = []
        static: list = []
        weak: list[int] = []  # (positions of f's weak floats, and among the inputs)
        weak_inputs: list[int] = []
        for i, a in enumerate(args):
            if type(a) is Weak:  # a recorded function's float: data, handed to f weak
                weak.append(i)
                weak_inputs.append(len(inputs))
                a = a.value
            if isinstance(a, Tensor) or type(a) in KINDS:
                inputs.append(a)
            elif hasattr(a, "__array__") and hasattr(a, "dtype"):  # a NumPy array
                supported_dtype(f"checkpoint({name}): argument {i} (an array)", a.dtype)
                inputs.append(tensor(a))
            else:
                static.append((i, a))
        if not inputs or not is_grad_enabled() and all(type(a) is Tensor for a in inputs):
            return f(*args)  # nothing to differentiate, batch or trace: a plain call
        device = next((a.device for a in inputs if isinstance(getattr(a, "device", None),
                                                               Device)), get_device(None))
        key = (tuple(weak), tuple(weak_inputs))
        fn = f if not weak else weakly.get(key) or weakly.setdefault(key, _Weakly(f, *key))
        reads = outside_reads(f, arguments=static)  # (a function passed to f: its reads)
        drawn = _generator_states(  # (before f draws from them; a generator argument too,
            reads + _held_by(static))  # or one an argument holds)
        built = {type(innermost(a)) for a in inputs}
        if drawn and built & _program_kinds():  # (no forward pass to take the states from:
            # each run of the program draws anew)
            raise CheckpointError(
                f"checkpoint: f draws random numbers from {drawn[0][0]}; in a graph (mg.Graph, "
                f"mg.trace, graph mode) or a source-mode program, f runs at every run of the "
                f"program, and again for its gradient, which would draw other numbers and "
                f"give the derivative of another function. Draw them outside f and pass "
                f"them as an argument")
        if Node in built:  # a node of a graph built
            fn = _AsBuilt(fn, reads, tuple(static))
        if drawn:
            fn = _Drawing(fn, drawn)
        _forward.passes.append(forward := _Pass(fn))
        try:
            out = bind(CHECKPOINT, *inputs, fn=fn, static=tuple(static), device=device)
        finally:
            _forward.passes.pop()
        if type(out) is Tensor and out.requires_grad and (
                forward.constant or out.dtype not in FLOATS):
            return out.detach()  # (a constant, or an integer: no gradient, as torch's)
        value = innermost(out)  # (a transformation's value: the tensor inside it)
        if type(value) is Tensor:  # (what its backward pass will recompute f against)
            if rebound(reads) is not None:  # (f itself bound one: read them again)
                reads = outside_reads(f, arguments=static)
            values = [value] + [innermost(t) for t in forward.results]
            for v in values:  # (f's backward pass, and its tangents': guarded alike)
                if type(v) is Tensor:
                    _remember(f, v, reads, tuple(static),
                              _parameters_given(f, tuple(static), inputs))
        return out

    checkpointed.__name__ = f"checkpoint({name})"
    checkpointed.__doc__ = f.__doc__
    return transformation(checkpointed, "checkpoint", f)


def _refuse_keywords(name: str, kwargs: dict[str, Any]) -> None:
    """Keyword arguments are refused: checkpoint's inputs are positional (the backward
    pass recomputes ``f`` from them, and gives one gradient per position)."""
    if kwargs:
        raise CheckpointError(f"checkpoint({name}): pass the arguments by position (got "
                              f"keywords {sorted(kwargs)}); close over constant options")


# module -> its _ModuleCall, by identity (two modules equal by the user's ==, a layer's
# name, are two modules, each with its own parameters: signature.ByIdentity)
_MODULE_CALLS: "ByIdentity[_ModuleCall]" = ByIdentity()


class _ModuleCall(ParametersAsArguments):
    """``(names, *inputs, *parameters) -> module(*inputs)`` with the parameters ``names``
    swapped in (``nn.functional_call``): those the module had when the checkpoint was
    called, which its backward pass recomputes with, not those the module holds then
    (an enclosing ``functional_call`` has put its own back). So what the checkpoint
    watches from outside is what the module reads but its parameters
    (``reads.ParametersAsArguments``). One per module, whose lock keeps two threads (a
    ``Session``'s workers) from swapping the same module's parameters at once."""

    def __init__(self, module: Any):
        self.module = module
        self.lock = threading.RLock()

    def __call__(self, names: tuple[str, ...], *values: Any) -> Any:
        from ..nn.stateless import functional_call

        now = tuple(n for n, _ in self.module.named_parameters())
        if now != names:  # (a parameter added or removed since the forward pass)
            raise CheckpointError(
                f"checkpoint({type(self.module).__name__}): the module's parameters are "
                f"{list(now)} now, not {list(names)} as when it was called; f runs again "
                f"with those it was called with. Change the module's parameters after "
                f"backward()")
        split = len(values) - len(names)
        with self.lock:
            return functional_call(self.module, dict(zip(names, values[split:])),
                                   *values[:split])


def _checkpoint_module(module: Any) -> Callable[..., Any]:
    call = _MODULE_CALLS.setdefault(module, lambda: _ModuleCall(module))
    inner = checkpoint(call)

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        _refuse_keywords(type(module).__name__, kwargs)  # (the parameters come last)
        named = module.named_parameters()  # (an enclosing functional_call's values, if
        # any: the arguments the backward pass recomputes with, by name)
        return inner(tuple(n for n, _ in named), *args, *(p for _, p in named))

    checkpointed.__name__ = f"checkpoint({type(module).__name__})"
    return transformation(checkpointed, "checkpoint")
