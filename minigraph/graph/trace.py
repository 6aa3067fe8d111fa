"""From define-by-run to define-and-run: ``mg.trace`` (hybridize) and graph-mode ``grad``.

``f_graph = mg.trace(f)`` runs the Python body of ``f`` once per *input signature*
(the shapes, dtypes and devices of its tensor arguments, and the values of its other
arguments), with graph nodes in place of tensors, so every operation is recorded as a
node: SINGA buffers the operations of the first iteration this way, and MXNet's
``hybridize`` caches its graph. The graph is compiled to Python (``compile.py``), and
later calls with the same signature replay the compiled function without running the
body at all. A new signature records again.

What tracing sees and what it cannot see:

* detected: Python control flow on a traced value (``if x > 0:``, ``float(x)``,
  ``x.item()``) raises ``TracedValueError`` at the line that does it; use ``mg.where``;
* not detected: anything Python does *besides* minigraph operations, which happens once,
  while recording: reading a global that later changes, printing, appending to a list,
  drawing random numbers with ``random``/NumPy. Replays repeat the recorded graph only.

Arguments that are tensors, NumPy arrays or Python floats become placeholders; other
arguments (ints, strings, None, tuples) are baked into the graph and are part of the
signature, so ``f(x, n=3)`` and ``f(x, n=4)`` record two graphs.

Called on values of another transformation (a tensor the tape records, a box of
``mg.grad``, a dual number of ``mg.jvp``, a node of an outer graph, a source variable,
a batched value of ``mg.vmap``), a traced function does not run its compiled code, which
only knows arrays: it *replays* its graph node by node through ``bind``
(:func:`replay`), so the outer transformation sees every primitive, exactly as JAX
differentiates through ``jit`` by interpreting its jaxpr.
"""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

from typing import Any, Callable, Sequence, cast


from ..autodiff.argnums import (Argnums, normalize_argnums, not_data, refuse_integers,
                                 refuse_keywords, refuse_non_functions, single)
from ..autodiff.signature import (DATA, Captured, arrays, constant_arguments, is_weak, programs,
                                  signature)
from ..autodiff.reads import outside_reads, recording
from ..autodiff import tape
from ..autodiff.tape import enable_grad, is_grad_enabled, no_grad
from ..errors import GradientError
from ..ops import copy as C
from ..ops.operators import passed_as_is
from ..ops.primitive import KINDS, bind
from ..ops.weak import Weak, strong
from ..tensor import FLOAT_DTYPES, Tensor, tensor, zeros
from .compile import CompiledFunction, compile_graph, last_uses
from .topo import fifo_order, needed
from .gradients import gradients
from .graph import Graph, GraphError, Node, placeholder, reads_across
from .passes import optimize


def _array_args(args: tuple, key: tuple) -> list:
    """The arguments that are graph inputs: the data ones, as ``key`` (their signature,
    ``autodiff/signature.py``) already says; a weak number differentiated as a tensor."""
    return [a if is_weak(entry) else strong(a) for a, entry in zip(args, key)
            if entry[0] == DATA]  # (is_data, inline)


def replay(inputs: Sequence[Node], outputs: Sequence[Node], args: list) -> tuple:
    """Run a graph's ``outputs`` from ``args`` given to its ``inputs`` node by node
    through ``bind``, on values of any kind: only the nodes the outputs need from the
    inputs, each value dropped after its last use (as compiled code deletes it), so
    memory falls as it goes."""
    env: dict[int, Any] = {id(n): a for n, a in zip(inputs, args)}
    graph = (list(outputs) or list(inputs))[0].graph
    fed = set(env)
    order = fifo_order(graph.nodes, needed(outputs, fed), fed)
    dead = last_uses(order, fed, list(outputs))
    for node in order:
        if id(node) in env:
            continue
        if node.op in ("Const", "Variable"):  # a constant of the outer computation
            env[id(node)] = Tensor(node.value, node.device)
        elif node.prim is not None:
            values = [_moved(env[id(a)], a, node) if isinstance(a, Node) else a
                      for a in node.args]
            with node.device:
                env[id(node)] = bind(node.prim, *values, **node.params)
        else:
            raise GraphError(f"{node.op} node '{node.name}' cannot run on the values of "
                             f"another transformation (only primitives and constants can)")
        for value in dead.get(id(node), ()):
            del env[id(value)]
    return tuple(env[id(n)] for n in outputs)


def _moved(value: Any, a: Node, node: Node) -> Any:
    """``a``'s value as ``node`` reads it: moved to node's device along an edge across
    devices (a NumPy array f read, which goes with the tensors it meets), as the compiled
    code copies it (``compile._moved``); a Python number or an array as it is."""
    if not reads_across(node, a) or not (type(value) is Tensor or type(value) in KINDS):
        return value
    return C.to_device(value, node.device)


def _call(fn: CompiledFunction, args: tuple, key: tuple) -> tuple:
    """The compiled code on arrays, or the replay where a value needs its interpreter:
    on ``args``, whose signature is ``key``."""
    data = arrays(args, key, static=False)
    if data is None:
        return replay(fn.inputs, fn.outputs, _array_args(args, key))
    return fn.wrap(fn.raw(*data))


def record(f: Callable[..., Any], args: tuple, name: str, key: tuple,
           nums: tuple[int, ...] = (), who: str = "mg.trace",
           grad: bool = True) -> tuple[Graph, list[Node], Any, list]:
    """Run ``f`` once on placeholders; return the graph, its inputs, f's outputs, and
    what f read from outside (``reads.outside_reads``) as it was *before* f ran: the
    guard of its program (``signature.Captured``'s ``reads``), so that a name f reads and
    then binds anew itself (``WARM = False``) makes the program stale at the next call,
    which then reads it as eager mode does.

    The arguments that are data by their signature ``key`` become placeholders; the
    others are constants of the graph. A weak Python float (its entry says so) is handed
    to f as a :class:`~minigraph.ops.weak.Weak` of its placeholder: it takes the dtype of
    the tensors it meets there, as the float itself does in eager mode.

    A value f computes inside ``with mg.no_grad():`` gets a ``no_grad`` node (its table
    entry: ops/copy.py), so the graph differentiates as the tape does (PyTorch's
    torch.func.grad respects such a block too) and mg.jvp's tangents pass it, as on the
    tape; an outer no_grad around the call does not count, as for every transformation
    that differentiates. ``grad``: the grad mode f runs in, and can observe
    (``mg.is_grad_enabled()``): on, but ``mg.trace``'s (a transformation that does not
    differentiate) is its caller's, as in eager mode.

    An argument that is the caller's tensor (or NumPy array) and not one of ``nums``,
    those differentiated, is the caller's too while f runs (``operators.passed_as_is``):
    f's ``y += 1.0`` on its placeholder, which eager mode makes as a write into the
    caller's tensor, is refused, since the program would make a new value instead."""
    graph = Graph(name)
    graph.eager_placement = True
    inputs, call_args = [], []
    names = _parameter_names(f, len(args))
    with graph, enable_grad() if grad else no_grad():
        for k, (a, entry) in enumerate(zip(args, key)):
            if entry[0] == DATA:
                t = a if isinstance(a, Tensor) or type(a) in KINDS else tensor(a)
                with t.device:
                    node = placeholder(tuple(t.shape), str(t.dtype), name=names[k])
                if t is not a and k not in nums:  # a float or an array: as in eager mode,
                    graph.loose.add(id(node))     # it goes to the tensors' device
                inputs.append(node)
                call_args.append(Weak(node) if is_weak(entry) else node)
            else:
                call_args.append(a)
        graph.recording = True
        graph.constants = constant_arguments(args, key)
        reads = outside_reads(f, arguments=graph.constants)  # (before f: see above)
        try:
            with passed_as_is(call_args, nums, who, args), \
                    recording(f, who, graph.constants) as run:
                out = f(*call_args)
        finally:
            graph.recording = False
        graph.written_by_f = run.written_by_f
    return graph, inputs, out, reads


def name_of(f: Callable[..., Any]) -> str:
    """f's name for its graph, its program and errors: its ``__name__``, or its type's
    where it has none or one that is no string (a callable object whose ``__getattr__``
    answers every name with None, which a graph would refuse as its name)."""
    name = getattr(f, "__name__", None)
    return name if isinstance(name, str) else type(f).__name__


def _parameter_names(f: Callable[..., Any], count: int) -> list[str]:
    """The names of f's first ``count`` positional parameters, for its graph's inputs (and
    so for the compiled function's parameters); ``arg{k}`` where f has none (``*args``,
    a callable without a Python signature)."""
    try:
        params = [p.name for p in inspect.signature(f).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[k] if k < len(params) else f"arg{k}" for k in range(count)]


def _constant_output(graph: Graph, out: Any, own_dtype: bool = False) -> Any:
    """An output that does not depend on the inputs (a number, a tensor) as a constant
    node of the graph: its derivative is zero, not an error. A weak number is its node,
    as eager mode makes a float64 tensor of a returned float. A Python int or bool is a
    float64 number to differentiate, but ``mg.trace`` (``own_dtype``) gives it back in
    its own dtype, int64 or bool, as ``mg.tensor`` makes it."""
    out = strong(out)
    if isinstance(out, (int, float)):
        out = tensor(out if own_dtype else float(out))
    if isinstance(out, Tensor):
        with graph:
            return graph.constant(out)
    return out


def _outputs(out: Any, who: str, graph: Graph) -> tuple[list[Node], bool]:
    """f's outputs as nodes of ``graph``; ``who``: the function called (mg.trace, vjp)."""
    one = not isinstance(out, (tuple, list))
    nodes = [_constant_output(graph, o, own_dtype=True) for o in ([out] if one else out)]
    for n in nodes:
        _refuse_output(n, who)
    return nodes, one


def _refuse_output(out: Any, who: str) -> None:
    """f's result must be a node of the graph f was recorded into. A value of another
    transformation (a vmap's batched value, a grad's box, a jvp's dual number) comes from
    outside f: a closure over a variable of the function around it, which the recorded
    program, run on its own arguments, cannot read."""
    if isinstance(out, Node):
        return
    if type(out) in KINDS:
        raise GraphError(
            f"{who}: f returned a {type(out).__name__}, a value of a transformation around "
            f"this one: f reads it from outside its arguments (a variable of the enclosing "
            f"function), and the program recorded from f cannot. Pass it to f as an "
            f"argument, or use mode='tape', which runs f itself")
    raise GraphError(f"{who}: f must return graph values computed from its inputs, got "
                     f"{type(out).__name__}")


class Traced:
    """``mg.trace(f)``: records ``f`` per signature, then replays the compiled graph."""

    transformation = "trace"  # (runs on any kind of value: see levels.transformation)

    def __init__(self, f: Callable[..., Any], nums: tuple[int, ...] = (),
                 who: str = "mg.trace"):
        refuse_non_functions(f, "trace")
        self.f = f
        self.nums, self.who = nums, who  # (the arguments a vjp differentiates: see record)
        self.__wrapped__ = f  # (its parameters are f's: see levels.transformation)
        self.name = name_of(f)
        # signature -> (compiled function, single output?, graph): the one cache; for
        # mg.trace's calls under no_grad, programs of their own (_programs)
        self.cache: dict[tuple, tuple[CompiledFunction, bool, Graph]] = programs(f, "trace")
        self.no_grad_cache: dict[tuple, tuple[CompiledFunction, bool, Graph]] = \
            programs(f, "trace", ("no_grad",)) if who == "mg.trace" else self.cache
        self.recordings = 0  # how many times the Python body ran

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:  # (the cached call's path: no call for none)
            refuse_keywords(kwargs, "trace")
        key = signature(args)
        # (the programs for the caller's grad mode: _programs, inline where grad is on)
        cache = self.cache if is_grad_enabled() else self._programs(args)
        entry = cache.get(key)
        # (a global tensor written: again; to run f on the tape, which needs no program,
        # only a name bound anew: Captured.stale)
        taped = entry is not None and on_the_tape(entry[0])
        if entry is None or entry[0].captured.stale(taped):
            graph, inputs, out, reads = record(self.f, args, self.name, key, self.nums,
                                               self.who, grad=cache is self.cache)
            self.recordings += 1
            outputs, one = _outputs(out, self.who if self.who != "mg.trace" else
                                    f"trace({self.name})", graph)
            cache[key] = (_compile(graph, inputs, outputs, self.name, reads), one, graph)
            taped = on_the_tape(cache[key][0])
        fn, one, _ = cache[key]
        if taped:  # (f itself, recorded by the tape: see on_the_tape)
            return self.f(*args)
        results = _call(fn, args, key)
        return results[0] if one else results

    def _programs(self, args: tuple) -> dict:
        """The programs for a call on ``args``: f runs in its caller's grad mode, as in
        eager mode, where it may observe it (``mg.is_grad_enabled()``), so a call under
        no_grad has programs of its own, recorded under no_grad. But not on values of a
        transformation, which replay the program through ``bind``: an outer no_grad
        does not stop their level, so f's values must not get ``no_grad`` nodes."""
        if is_grad_enabled() or any(type(a) in KINDS for a in args):
            return self.cache
        return self.no_grad_cache

    def graph(self, *args: Any) -> Graph:
        """The graph recorded for these arguments' signature."""
        self(*args)
        return self._programs(args)[signature(args)][2]

    def source(self, *args: Any) -> str:
        """The compiled Python source for these arguments' signature."""
        self(*args)
        return self._programs(args)[signature(args)][0].source


def trace(f: Callable[..., Any]) -> Traced:
    """Record ``f`` as a graph on its first call per input signature; replay after."""
    return Traced(f)


def value_and_grad(f: Callable[..., Any], argnums: Argnums = 0,
                   with_value: bool = True, who: str = "value_and_grad") -> Callable:
    """Graph mode behind ``mg.value_and_grad(f, mode="graph")``: trace f, add the
    reverse-graph pass, compile value and gradients into one function, cache it per
    signature. With ``with_value=False`` (``mg.grad``) the function returns the gradients
    only, and its program leaves out what only f's value needs. ``who``: the function
    the user called, which errors name."""
    name = name_of(f)

    def build(args: tuple, nums: tuple[int, ...], key: tuple) -> CompiledFunction:
        graph, inputs, out, reads = record(f, args, f"grad_{name}", key, nums, who)
        positions = _input_positions(key)
        out = _constant_output(graph, out)
        _refuse_output(out, who)
        if out.shape is not None and math.prod(out.shape) != 1:  # (one number, as the tape)
            raise GradientError(f"{who}: f must return a scalar, it returned shape {out.shape}; "
                                f"use mg.gradients in a graph for several outputs")
        xs = [inputs[positions[i]] for i in nums]
        grads = _gradients_or_zeros(graph, out, xs)
        return _compile(graph, inputs, [out] + grads if with_value else grads, f"grad_{name}",
                        reads)

    # Per number of arguments: the normalised argnums and the programs cached for them.
    # (argnums is checked once per count, not on every call; the errors are the same.)
    options: dict[int, tuple[tuple[int, ...], dict]] = {}

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if kwargs:  # (the cached call's path: no call for none)
            refuse_keywords(kwargs, who)
        known = options.get(len(args))
        if known is None:
            nums = normalize_argnums(argnums, len(args), who)
            known = options[len(args)] = (nums, programs(f, "graph", (nums,) if with_value
                                                         else (nums, "gradients only")))
        nums, cache = known
        key = signature(args, nums)
        compiled = cache.get(key)
        # (a program run on the tape is not asked whether it is stale: it is not run)
        taped = compiled is not None and on_the_tape(compiled)
        if compiled is None or compiled.captured.stale(taped):
            for i in nums:  # (the signature read an int, a list ... being differentiated)
                if key[i][0] != DATA:
                    raise not_data(args[i], i, who)
                refuse_integers(getattr(args[i], "dtype", None) or key[i][3], i, who)
            compiled = cache[key] = build(args, nums, key)
            taped = on_the_tape(compiled)
        if taped:  # (the tape's gradient, which it records: on_the_tape)
            value, grads = tape.value_and_grad(f, argnums, who)(*args)
            return (value, grads) if with_value else grads
        results = _call(compiled, args, key)
        if not with_value:
            return results[0] if single(argnums) else results
        value, *grads = results
        return value, grads[0] if single(argnums) else tuple(grads)

    return wrapped


def vjp(f: Callable[..., Any], argnums: tuple[int, ...],
        who: str = "vjp") -> SimpleNamespace:
    """Graph mode behind ``mg.vjp(f, *primals, mode="graph")`` and ``mg.jacrev``: an
    object whose ``value(*args)`` is f's value by ``mg.trace(f)``'s program, and whose
    ``pullback(args, g)`` gives the gradients for ``argnums`` by one compiled program per
    signature of ``(args, g)`` (``program(args, g)`` builds it, or finds it in the one
    cache): f's graph, and the reverse-graph pass seeded with a
    placeholder for the output's adjoint (``gradients``' ``grad_ys``, as in TensorFlow).
    Each call runs f's forward graph again: a program keeps nothing between calls, where
    the tape keeps f's values from the call that recorded them."""
    name = name_of(f)
    cache = programs(f, "graph", (argnums, "vjp"))

    def build(args: tuple, key: tuple) -> CompiledFunction:  # key: the signature of args + g
        graph, inputs, out, reads = record(f, args, f"vjp_{name}", key[:-1], argnums, who)
        out = _constant_output(graph, out)
        _refuse_output(out, who)
        xs = [inputs[_input_positions(key)[i]] for i in argnums]
        _, device, shape, dtype = key[-1]  # (the caller checked g against f's output)
        with graph, device:  # (the dtype as the device's arrays have it: its name)
            seed = placeholder(shape, device.dtype_name(dtype), name=f"g{out.name}")
        grads = _gradients_or_zeros(graph, out, xs, seed)
        return _compile(graph, inputs + [seed], grads, f"vjp_{name}", reads)

    def program(args: tuple, g: Any) -> CompiledFunction:
        """The program for ``args`` and a cotangent like ``g`` (built if needed)."""
        key = signature(args + (g,), argnums)
        compiled = cache.get(key)
        if compiled is None or compiled.captured.stale(on_the_tape(compiled)):
            compiled = cache[key] = build(args, key)  # (a global tensor written: again)
        return compiled

    def pullback(args: tuple, g: Any) -> tuple:
        compiled = program(args, g)
        if on_the_tape(compiled):  # (the tape's pullback, which it records: on_the_tape)
            _, pull = tape.recorded_vjp(lambda *xs: f(*tape.put(args, argnums, xs)),
                                        tuple(args[i] for i in argnums), who)
            return pull(g)
        return _call(compiled, args + (g,), signature(args + (g,), argnums))

    return SimpleNamespace(value=Traced(f, argnums, who), program=program, pullback=pullback)


def _gradients_or_zeros(graph: Graph, out: Node, xs: list[Node],
                        seed: Node | None = None) -> list[Node]:
    """The reverse-graph pass from ``out`` (seeded with ones, or ``seed``) to ``xs``: a
    node per x, a constant of zeros where no path leads (xs are record's placeholders,
    made with their arguments' dtypes, so the zeros have them too). An integer or bool
    ``out`` is piecewise constant: zeros, as the tape gives (``mg.gradients``, the graph
    API, refuses one, as TensorFlow does)."""
    with graph:
        integer = out.dtype is not None and out.dtype not in FLOAT_DTYPES
        found = [None] * len(xs) if integer else gradients(out, xs, grad_ys=seed)
        return [g if g is not None else
                graph.constant(zeros(x.shape, cast(str, x.dtype), x.device))
                for g, x in zip(found, xs)]


def grad(f: Callable[..., Any], argnums: Argnums = 0, who: str = "grad") -> Callable:
    """Graph mode behind ``mg.grad(f, mode="graph")``: the gradients alone."""
    return value_and_grad(f, argnums, with_value=False, who=who)


def _compile(graph: Graph, inputs: list[Node], outputs: list[Node], name: str,
             reads: list) -> CompiledFunction:
    """Optimise (prune, CSE, constant folding, x * 1 -> x), then compile to Python; the
    program is stale once what f read from outside (``reads``, taken before it ran:
    :func:`record`) has changed (``Captured``)."""
    captured = Captured((t for t, _ in graph._consts.values()),  # (before folding)
                        own=graph.written_by_f, reads=reads)
    # (inputs are kept even if unused; nothing but the outputs is read: no identities)
    result = optimize(graph, outputs + inputs, identities=False)
    fn = compile_graph(result.graph, [result[n] for n in inputs],
                       [result[n] for n in outputs], name)
    fn.captured = captured  # type: ignore[attr-defined]
    return fn


def on_the_tape(fn: CompiledFunction) -> bool:
    """Whether a call of ``fn`` must be f's own, run by the tape
    (``Captured.on_the_tape``: f reads a tensor that requires a gradient from outside)."""
    return fn.captured.on_the_tape()


def _input_positions(key: tuple) -> dict[int, int]:
    """argument index -> index among the placeholders (the data arguments of ``key``)."""
    data = [i for i, entry in enumerate(key) if entry[0] == DATA]
    return {i: k for k, i in enumerate(data)}
