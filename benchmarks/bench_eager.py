"""Eager (define-by-run) benchmarks: per-op cost with gradient recording, and a scalar
forward+backward, against the anchors NumPy, PyTorch CPU and a micrograd-style engine;
and where the time of one eager op goes, layer by layer.

Run: ``python benchmarks/bench_eager.py``. Prints tables (a) to (c), writes
``benchmarks/results/eager.json`` and ``benchmarks/results/eager.png``.
Every method's result is checked *before* it is timed, so a wrong computation is never
timed; the times themselves are only reported, never asserted (DESIGN.md, "Performance").

``minigraph bench --device cuda:0`` runs table (a) on the GPU (CuPy as the array anchor,
PyTorch on CUDA, every timing synchronised) and skips (b) and (c); it writes
``eager-cuda0.json`` and ``.png``.
"""

from __future__ import annotations

import datetime
import functools
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find common.py however we are run
from common import (RESULTS_DIR, array_library, bench_device, cpu_only, describe,  # noqa: E402
                    environment, fmt, have_torch, measure, on_gpu, print_rounds, print_table,
                    result_name, save_results, synchronizer, to_float, to_host, torch_device)

import minigraph as mg  # noqa: E402

US = 1e6  # seconds -> microseconds

# -- a. per-op time, shape (4,), float64, with gradient recording ---------------------------

A = np.array([-1.5, -0.5, 0.5, 1.5])  # negative entries so relu has work to do
B = np.array([0.75, 1.25, 2.0, 3.0])  # no zeros: we divide by it
M = np.arange(16.0).reshape(4, 4) / 8 - 1  # matmul's operands: 4x4 matrices
N = np.arange(16.0)[::-1].reshape(4, 4) / 8

BinaryOp = Callable[[Any, Any], Any]


def op_table(m: Any) -> dict[str, BinaryOp]:
    """The benchmarked ops, written once against module ``m`` (mg, np or torch)."""
    table: dict[str, BinaryOp] = {
        "add": lambda x, y: x + y,
        "mul": lambda x, y: x * y,
        "sub": lambda x, y: x - y,
        "div": lambda x, y: x / y,
        "sin": lambda x, y: m.sin(x),
        "cos": lambda x, y: m.cos(x),
        "exp": lambda x, y: m.exp(x),
        "tanh": lambda x, y: m.tanh(x),
        "relu": lambda x, y: m.relu(x),
        "sum": lambda x, y: m.sum(x),
        "mean": lambda x, y: m.mean(x),
        "matmul": lambda x, y: m.matmul(x, y),  # on the 4x4 operands (OPERANDS)
    }
    if m.__name__ in ("numpy", "cupy"):
        table["relu"] = lambda x, y: m.maximum(x, 0.0)  # NumPy has no relu
    return table


OPERANDS = {"matmul": (M, N)}  # every other op reads (A, B)


def bench_per_op() -> dict[str, dict[str, Any]]:
    """Per op: seconds per call for numpy / minigraph / torch (None when PyTorch is not
    installed) and ``ratio``, minigraph over torch (over numpy without PyTorch), the
    median of the within-round ratios of ``common.measure``. On a GPU, all three run
    there, and "numpy" is CuPy."""
    device, xp = bench_device(), array_library()
    tables: dict[str, dict[str, BinaryOp]] = {"numpy": op_table(xp), "minigraph": op_table(mg)}
    if torch_device() is not None:
        import torch
        tables["torch"] = op_table(torch)

    def operands(lib: str, a: np.ndarray, b: np.ndarray) -> tuple[Any, Any]:
        if lib == "numpy":
            return xp.asarray(a), xp.asarray(b)
        if lib == "minigraph":
            return (mg.tensor(a, device=device, requires_grad=True),
                    mg.tensor(b, device=device, requires_grad=True))
        return tuple(torch.tensor(c, dtype=torch.float64, device=torch_device(),
                                  requires_grad=True) for c in (a, b))
    anchor = "torch" if "torch" in tables else "numpy"

    results: dict[str, dict[str, Any]] = {}
    for name, np_op in op_table(np).items():
        a, b = OPERANDS.get(name, (A, B))
        expected = np_op(a, b)
        methods = {}
        for lib, ops in tables.items():
            u, v = operands(lib, a, b)
            out = ops[name](u, v)
            if lib != "numpy":  # check: the op was recorded for backward
                assert out.requires_grad, f"{lib} {name}: result is not recorded"
            np.testing.assert_allclose(to_host(out), expected, err_msg=f"{lib} {name}")
            methods[lib] = functools.partial(ops[name], u, v)
        timed, _ = measure(methods, anchor, rounds=15, batch=0.01, sync=synchronizer())
        results[name] = {lib: timed[lib]["seconds"] if lib in timed else None
                         for lib in ("numpy", "minigraph", "torch")}
        results[name]["ratio"] = timed["minigraph"]["ratio"]
    return results


def report_per_op(results: dict[str, dict[str, Any]]) -> None:
    rows, met = [], 0
    for name, t in results.items():
        vs_torch = t["ratio"] if t["torch"] else None
        met += vs_torch is not None and vs_torch <= PER_OP_TARGET
        rows.append([name, fmt(t["numpy"] * US), fmt(t["minigraph"] * US),
                     fmt(t["torch"] * US) if t["torch"] else "-",
                     fmt(vs_torch), fmt(t["minigraph"] / t["numpy"], 1)])
    lib = array_library().__name__
    print_table(rows, ["op", f"{lib} µs", "minigraph µs", "torch µs",
                       "minigraph/torch", f"minigraph/{lib}"])
    if on_gpu():
        print(f"(the target is set for the CPU; on {bench_device()} the ratios are shown only)")
        return
    missed = ", ".join(f"{name} {t['ratio']:.2f}x" for name, t in results.items()
                       if t["torch"] and t["ratio"] > PER_OP_TARGET)
    now = (f"met for {met} of {len(results)} ops" + (f"; over: {missed}" if missed else "")
           if have_torch() else "PyTorch not installed")
    print(f"target: minigraph <= {PER_OP_TARGET}x PyTorch  ({now})")


# -- b. z = x*y + sin(x), forward + backward, on scalars ------------------------------------

X, Y = 2.0, 3.0
TORCH_ROW = "pytorch (backward)"
TAPE_ROW = "minigraph tape (backward)"
GRAPH_ROW = 'minigraph mg.grad graph, cached'
SOURCE_ROW = 'minigraph mg.grad source, cached'
PER_OP_TARGET, TAPE_TARGET, CACHED_TARGET = 0.9, 0.35, 0.08  # DESIGN.md, x PyTorch
EXPECTED = (Y + math.cos(X), X)  # dz/dx = y + cos x = 3 + cos 2,  dz/dy = x = 2


def f(x: Any, y: Any) -> Any:
    return x * y + mg.sin(x)


class Value:
    """ANCHOR, not minigraph: a minimal micrograd-style scalar with reverse mode.

    A float, its gradient, the values it was made from, and a closure that pushes its
    gradient to them. ``backward`` visits the graph in reverse topological order.
    """

    __slots__ = ("data", "grad", "_parents", "_backward")

    def __init__(self, data: float, parents: tuple[Value, ...] = ()):
        self.data, self.grad, self._parents = data, 0.0, parents
        self._backward: Callable[[], None] = lambda: None

    def __add__(self, other: Value) -> Value:
        out = Value(self.data + other.data, (self, other))

        def _backward() -> None:
            self.grad += out.grad
            other.grad += out.grad
        out._backward = _backward
        return out

    def __mul__(self, other: Value) -> Value:
        out = Value(self.data * other.data, (self, other))

        def _backward() -> None:
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad
        out._backward = _backward
        return out

    def sin(self) -> Value:
        out = Value(math.sin(self.data), (self,))

        def _backward() -> None:
            self.grad += math.cos(self.data) * out.grad
        out._backward = _backward
        return out

    def backward(self) -> None:
        order: list[Value] = []
        seen: set[Value] = set()

        def visit(v: Value) -> None:
            if v not in seen:
                seen.add(v)
                for p in v._parents:
                    visit(p)
                order.append(v)
        visit(self)
        self.grad = 1.0
        for v in reversed(order):
            v._backward()


def scalar_methods() -> dict[str, Callable[[], tuple[Any, Any]]]:
    """Each method computes z and returns (dz/dx, dz/dy) at (X, Y)."""

    def mg_tape() -> tuple[Any, Any]:
        x, y = mg.tensor(X, requires_grad=True), mg.tensor(Y, requires_grad=True)
        z = x * y + mg.sin(x)
        z.backward()
        return x.grad, y.grad

    g_tape = mg.grad(f, argnums=(0, 1))
    g_forward = mg.grad(f, argnums=(0, 1), mode="forward")
    g_graph = mg.grad(f, argnums=(0, 1), mode="graph")  # built on the first call (the check)
    g_source = mg.grad(f, argnums=(0, 1), mode="source")

    def hand_numpy() -> tuple[Any, Any]:
        x, y = np.float64(X), np.float64(Y)
        z = x * y + np.sin(x)  # noqa: F841  (the value, computed as the others do)
        return y + np.cos(x), x

    def hand_math() -> tuple[float, float]:
        x, y = X, Y
        z = x * y + math.sin(x)  # noqa: F841
        return y + math.cos(x), x

    def micrograd() -> tuple[float, float]:
        x, y = Value(X), Value(Y)
        z = x * y + x.sin()
        z.backward()
        return x.grad, y.grad

    methods: dict[str, Callable[[], tuple[Any, Any]]] = {
        TAPE_ROW: mg_tape,
        "minigraph mg.grad tape": lambda: g_tape(X, Y),
        "minigraph mg.grad forward": lambda: g_forward(X, Y),
        GRAPH_ROW: lambda: g_graph(X, Y),
        SOURCE_ROW: lambda: g_source(X, Y),
    }
    if have_torch():
        import torch

        def torch_backward() -> tuple[Any, Any]:
            x = torch.tensor(X, dtype=torch.float64, requires_grad=True)
            y = torch.tensor(Y, dtype=torch.float64, requires_grad=True)
            z = x * y + torch.sin(x)
            z.backward()
            return x.grad, y.grad
        methods[TORCH_ROW] = torch_backward
    methods["hand-written NumPy (anchor)"] = hand_numpy
    methods["hand-written math (anchor)"] = hand_math
    methods["micrograd-style Value (anchor)"] = micrograd
    return methods


def bench_scalar() -> dict[str, dict[str, Any]]:
    """Seconds per forward+backward for every method (each checked first), and the
    ratio to PyTorch within interleaved rounds."""
    methods = scalar_methods()
    for name, method in methods.items():
        got = tuple(to_float(g) for g in method())
        assert np.allclose(got, EXPECTED), f"{name}: gradient {got}, expected {EXPECTED}"
    results, rounds = measure(methods, TORCH_ROW)
    print_rounds(rounds)
    return results


def report_scalar(results: dict[str, dict[str, Any]]) -> None:
    rows = [[name, fmt(r["seconds"] * US), fmt(r["ratio"], 3) if r["ratio"] else "-"]
            for name, r in results.items()]
    print_table(rows, ["method", "µs", "x PyTorch"])
    tape = results[TAPE_ROW]["ratio"]
    now = f"  (now {tape:.2f}x)" if tape else "  (PyTorch not installed)"
    print(f"target: tape <= {TAPE_TARGET}x PyTorch" + now)
    cached = [results[row]["ratio"] for row in (GRAPH_ROW, SOURCE_ROW)]
    now = (f"  (now graph {cached[0]:.3f}x, source {cached[1]:.3f}x)" if tape
           else "  (PyTorch not installed)")
    print(f"target: cached mg.grad, graph and source, <= {CACHED_TARGET}x PyTorch" + now)


# -- c. where the time of one eager op goes ------------------------------------------------------

LAYER_OPS = ("sin", "sum")  # an elementwise op, and the reduction that misses in (a)


def layers(op: str, x: Any) -> dict[str, Callable[[], Any]]:
    """``mg.<op>(x)`` peeled layer by layer, innermost first: each call runs one more
    layer of minigraph's eager path than the one before it (all through
    ``functools.partial``, so no row pays for a Python wrapper of the benchmark's own).

    1. NumPy's own call, the one the kernel ends in (``np.add.reduce`` for sum);
    2. the primitive's kernel as ``tape.apply_one`` calls it: ``impl(xp, array)``, or
       for an op with parameters ``impl_with(xp, array, params)`` where the table entry
       has one (a reduction's: the dict as it is, without unpacking it into keywords);
    3. the eager interpreter ``tape.apply_one``: it checks the argument, runs the kernel,
       wraps the result in a ``Tensor`` (with its memory accounting) and records the
       tape entry; the result is dropped at once, so ``Tensor.__del__`` counts here too;
    4. ``bind_one``, ``bind`` for one argument, which picks the interpreter from its
       kind;
    5. the public function, ``mg.sin(x)`` (for sum, the parameters' dict; ``axis`` is
       normalised unless it is None).
    """
    from minigraph.autodiff.tape import apply_one
    from minigraph.ops.primitive import PRIMITIVES, bind_one

    prim, a = PRIMITIVES[op], x.data
    params = {"axis": None, "keepdims": False} if op == "sum" else {}
    # the same call as the kernel's: np.add.reduce(x, axis, dtype, out, keepdims)
    numpy_call = functools.partial(np.add.reduce, a, None, None, None, False) \
        if op == "sum" else functools.partial(getattr(np, op), a)
    return {
        "1. NumPy's call": numpy_call,
        "2. + the primitive's kernel": (
            functools.partial(prim.impl_with, x.device.xp, a, params)
            if params and prim.impl_with is not None else
            functools.partial(prim.impl, x.device.xp, a, **params)),
        "3. + tape.apply_one: Tensor, tape entry": functools.partial(apply_one, prim, x, params),
        "4. + bind_one: choose the interpreter": functools.partial(bind_one, prim, x, params),
        f"5. + mg.{op}(x)": functools.partial(getattr(mg, op), x),
    }


def bench_layers() -> dict[str, dict[str, Any]]:
    """Per op of ``LAYER_OPS``: seconds per call of every layer and of PyTorch's op (all
    checked first), in interleaved rounds, and ``added``: a layer's time minus the time
    of the layer inside it within each round, the median over the rounds where both
    were clean (see ``common.measure``)."""
    x = mg.tensor(A, requires_grad=True)
    results = {}
    for op in LAYER_OPS:
        peeled = layers(op, x)
        methods = dict(peeled)
        if have_torch():
            import torch
            tx = torch.tensor(A, requires_grad=True)
            methods["PyTorch's op, recorded"] = functools.partial(getattr(torch, op), tx)
        expected = op_table(np)[op](A, B)
        for name, call in methods.items():
            np.testing.assert_allclose(to_host(call()), expected, err_msg=f"{op}: {name}")
        for name in list(methods)[2:]:  # from tape.apply on (and PyTorch), op recorded
            assert methods[name]().requires_grad, f"{op}: {name} did not record the op"
        timed, _ = measure(methods, rounds=15, batch=0.01)
        rows, inner = {}, None
        for name in methods:
            added = None
            if inner is not None and name in peeled:
                mine, theirs = timed[name], timed[inner]
                both = set(mine["rounds_used"]) & set(theirs["rounds_used"]) \
                    or range(len(mine["rounds"]))
                added = statistics.median(mine["rounds"][r] - theirs["rounds"][r] for r in both)
            rows[name] = {"seconds": timed[name]["seconds"], "added": added}
            inner = name
        results[op] = rows
    return results


def report_layers(results: dict[str, dict[str, Any]]) -> None:
    for op, rows in results.items():
        print_table([[name, fmt(r["seconds"] * US),
                      fmt(r["added"] * US) if r["added"] is not None else ""]
                     for name, r in rows.items()],
                    [f"mg.{op}(x), layer by layer", "µs", "+ µs"])
        print()


# -- d. results: JSON and a plot --------------------------------------------------------------

def plot_per_op(results: dict[str, dict[str, float | None]], path: Path) -> None:
    """Grouped bars per op: numpy / minigraph / torch, in µs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    libs = [lib for lib in ("numpy", "minigraph", "torch")
            if all(results[n][lib] is not None for n in names)]
    width = 0.8 / len(libs)
    fig, ax = plt.subplots(figsize=(9, 4))
    for k, lib in enumerate(libs):
        xs = [i + (k - (len(libs) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, [results[n][lib] * US for n in names], width,
               label=array_library().__name__ if lib == "numpy" else lib)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("µs per op (lower is better)")
    ax.set_title(f"Eager op with gradient recording, shape (4,), float64, {bench_device()}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    env = environment()
    print(describe(env))
    print(f"\n== a. per-op time with gradient recording, shape (4,), float64, on "
          f"{bench_device()} ==")
    per_op = bench_per_op()
    report_per_op(per_op)

    print("\n== b. z = x*y + sin(x), forward + backward, scalars x=2, y=3 ==")
    scalar = None
    if not cpu_only("Python's cost per operation on scalars is a CPU matter"):
        scalar = bench_scalar()
        report_scalar(scalar)

    print("\n== c. where the time of one eager op goes, shape (4,), float64 ==")
    anatomy = None
    if not cpu_only("it takes minigraph's eager path apart on NumPy arrays"):
        anatomy = bench_layers()
        report_layers(anatomy)

    name = result_name("eager")
    path = save_results(name, {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "environment": env,
        "device": bench_device(),
        "unit": "seconds per call (median over interleaved rounds); ratio: median over "
                "the rounds of the ratio within a round",
        "per_op": per_op,
        "scalar_forward_backward": scalar,
        "eager_layers": anatomy,
    })
    plot_per_op(per_op, RESULTS_DIR / f"{name}.png")
    print(f"\nwrote {path} and {RESULTS_DIR / f'{name}.png'}")


if __name__ == "__main__":
    main()
