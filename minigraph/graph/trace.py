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
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import GradientError
from ..tensor import Tensor, tensor, zeros
from .compile import CompiledFunction, compile_graph
from .gradients import gradients
from .graph import Graph, GraphError, Node, placeholder
from .passes import optimize


def _is_array_like(a: Any) -> bool:
    return isinstance(a, (Tensor, np.ndarray, float))


def signature(args: tuple) -> tuple:
    """What a recorded graph is specialised for: (shape, dtype, device) per array-like
    argument, the value itself for any other argument."""
    sig = []
    for a in args:
        if isinstance(a, Tensor):
            sig.append(("tensor", a.shape, a.dtype, a.device.name))
        elif isinstance(a, np.ndarray):
            sig.append(("tensor", a.shape, a.dtype.name, "cpu"))
        elif isinstance(a, float):
            sig.append(("tensor", (), "float64", "cpu"))
        else:
            sig.append(("static", a))
    return tuple(sig)


def _array_args(args: tuple, key: tuple) -> list:
    """The arguments that are graph inputs: the array-like ones, as ``key`` (their
    signature) already says."""
    return [a for a, (kind, *_) in zip(args, key) if kind == "tensor"]


def record(f: Callable[..., Any], args: tuple, name: str) -> tuple[Graph, list[Node], Any]:
    """Run ``f`` once on placeholders; return the graph, its inputs and f's outputs."""
    graph = Graph(name)
    inputs, call_args = [], []
    with graph:
        for k, a in enumerate(args):
            if _is_array_like(a):
                t = a if isinstance(a, Tensor) else tensor(a)
                with t.device:
                    node = placeholder(t.shape, t.dtype, name=f"arg{k}")
                inputs.append(node)
                call_args.append(node)
            else:
                call_args.append(a)
        out = f(*call_args)
    return graph, inputs, out


def _outputs(out: Any, fname: str) -> tuple[list[Node], bool]:
    single = not isinstance(out, (tuple, list))
    nodes = [out] if single else list(out)
    for n in nodes:
        if not isinstance(n, Node):
            raise GraphError(f"trace({fname}): the function must return graph values "
                             f"computed from its inputs, got {type(n).__name__}")
    return nodes, single


class Traced:
    """``mg.trace(f)``: records ``f`` per signature, then replays the compiled graph."""

    def __init__(self, f: Callable[..., Any]):
        self.f = f
        self.name = getattr(f, "__name__", "f").replace("<lambda>", "lambda_")
        self.cache: dict[tuple, tuple[CompiledFunction, bool, Graph]] = {}
        self.recordings = 0  # how many times the Python body ran

    def __call__(self, *args: Any) -> Any:
        key = signature(args)
        if key not in self.cache:
            graph, inputs, out = record(self.f, args, self.name)
            self.recordings += 1
            outputs, single = _outputs(out, self.name)
            self.cache[key] = (_compile(graph, inputs, outputs, self.name), single, graph)
        fn, single, _ = self.cache[key]
        results = fn(*_array_args(args, key))
        return results[0] if single else results

    def graph(self, *args: Any) -> Graph:
        """The graph recorded for these arguments' signature."""
        self(*args)
        return self.cache[signature(args)][2]

    def source(self, *args: Any) -> str:
        """The compiled Python source for these arguments' signature."""
        self(*args)
        return self.cache[signature(args)][0].source


def trace(f: Callable[..., Any]) -> Traced:
    """Record ``f`` as a graph on its first call per input signature; replay after."""
    return Traced(f)


def value_and_grad(f: Callable[..., Any], argnums: "int | tuple[int, ...]" = 0) -> Callable:
    """Graph mode behind ``mg.value_and_grad(f, mode="graph")``: trace f, add the
    reverse-graph pass, compile value and gradients into one function, cache it per
    signature."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    cache: dict[tuple, CompiledFunction] = {}
    name = getattr(f, "__name__", "f").replace("<lambda>", "lambda_")

    def build(args: tuple) -> CompiledFunction:
        graph, inputs, out = record(f, args, f"grad_{name}")
        positions = _input_positions(args)
        if not isinstance(out, Node):
            raise GraphError(f"grad: f must return a graph value, got {type(out).__name__}")
        if out.shape is not None and out.shape not in ((), (1,)):
            raise GradientError(f"grad: f must return a scalar, it returned shape {out.shape}; "
                                f"use mg.gradients in a graph for several outputs")
        xs = [inputs[positions[i]] for i in nums]
        with graph:
            grads = [g if g is not None else graph.constant(zeros(x.shape, x.dtype, x.device))
                     for g, x in zip(gradients(out, xs), xs)]
        return _compile(graph, inputs, [out] + grads, f"grad_{name}")

    def wrapped(*args: Any) -> tuple:
        key = signature(args)
        compiled = cache.get(key)
        if compiled is None:  # (a signature in the cache has passed these checks)
            for i in nums:
                if not _is_array_like(args[i]):
                    raise TypeError(f"grad: argument {i} must be a float, array or tensor "
                                    f"to be differentiated, got {type(args[i]).__name__}")
            compiled = cache[key] = build(args)
        value, *grads = compiled(*_array_args(args, key))
        return value, grads[0] if isinstance(argnums, int) else tuple(grads)

    wrapped.cache = cache  # type: ignore[attr-defined]
    return wrapped


def _compile(graph: Graph, inputs: list[Node], outputs: list[Node], name: str) -> CompiledFunction:
    """Optimise (prune, CSE, constant folding, x * 1 -> x), then compile to Python."""
    result = optimize(graph, outputs + inputs)  # inputs are kept even if unused
    return compile_graph(result.graph, [result[n] for n in inputs],
                         [result[n] for n in outputs], name)


def _input_positions(args: tuple) -> dict[int, int]:
    """argument index -> index among the placeholders (array-like arguments only)."""
    positions, k = {}, 0
    for i, a in enumerate(args):
        if _is_array_like(a):
            positions[i] = k
            k += 1
    return positions
