"""Graph-mode benchmarks: define-by-run (tape) against define-and-run (graph, Session)
against compiled graphs, with hand-written NumPy and PyTorch CPU as anchors.

Run: ``python benchmarks/bench_graph.py``. Prints four tables, writes
``benchmarks/results/graph.json`` and ``benchmarks/results/graph.png``.

a. ``z = x*y + sin(x)`` value and gradient on scalars: every way minigraph can compute it
   (tape, graph mode, ``Session.run``, the compiled function with tensors or raw arrays)
   against PyTorch's forward+backward. Target: compiled graph <= 0.15x PyTorch.
b. a small MLP (64-32-10, tanh, batch 16, float64, cross-entropy): gradient of the loss
   with respect to the weights, against hand-written NumPy backprop.
c. a training step 128x784-256-10, float32 (ReLU, softmax cross-entropy, SGD update
   ``w -= lr * g``) against a hand-written NumPy step. Targets: graph mode <= 1.05x NumPy,
   tape <= 1.15x NumPy. Beside graph mode with minigraph's update, the whole step
   (loss, ``mg.gradients``, update) traced into one graph, for comparison.
d. the peak bytes allocated while (c)'s loss and gradients are computed, once: graph
   mode, source mode and the hand-written step (NumPy's buffers, seen by ``tracemalloc``)
   against PyTorch's ``autograd.grad`` (its CPU allocator's timeline, from
   ``torch.profiler``). Target: graph mode <= 1.1x PyTorch. Bytes held before the call
   (weights, inputs) are not counted; what the call returns is.

``minigraph bench --device cuda:0`` runs (c) on the GPU: minigraph's tensors, the anchor
in CuPy (the same code as the NumPy step) and PyTorch's tensors there, every timing
synchronised (``common.synchronizer``), and writes ``graph-cuda0.json`` and ``.png``.
(a) and (b) measure Python's overhead on tiny arrays, a CPU matter, and are skipped
there; the targets are set for the CPU and are not judged on a GPU.

Every method's result is checked *before* it is timed (values and gradients, and in (c)
the dtypes and the updated weights), so a wrong computation is never timed; times are
only reported, never asserted (DESIGN.md, "Performance").

BLAS threads are pinned before NumPy is imported: ``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS`` and ``MKL_NUM_THREADS`` all get the value of the first of them
that is set, or 1, and PyTorch gets ``torch.set_num_threads`` of the same number, so
NumPy (and minigraph, which runs NumPy kernels) and PyTorch use as many BLAS threads.
``OMP_NUM_THREADS=2 python benchmarks/bench_graph.py`` runs everything with 2.

Methods are timed in finely interleaved rounds (``common.measure``: each round times a
batch of about 20 ms, 50 ms in (c), of every method); a method's time is the median over
rounds, and its ratio to the anchor is the median over rounds of the ratio within the
round, so a slow phase of a shared machine hits the method and its anchor alike. Rounds
where another process took the CPU away (share below 90%) are left out of a ratio when at
least three clean rounds remain. The column "best rounds" is the method's fastest round
over the anchor's fastest. Targets are judged on the median ratio.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find common.py however we are run
from common import (RESULTS_DIR, THREAD_VARS, allocated_peak, array_library, bench_device,  # noqa: E402
                    blas_threads, check_close, cpu_only, describe, environment, fmt, have_torch,
                    measure, on_gpu, openblas_threads, pin_blas_threads, print_rounds, print_table,
                    result_name, save_results, synchronizer, to_host, torch_device)

THREADS = pin_blas_threads()  # before NumPy (or PyTorch) is imported

import datetime  # noqa: E402
import math  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

import minigraph as mg  # noqa: E402

US = 1e6  # seconds -> microseconds
MS = 1e3  # seconds -> milliseconds

Method = Callable[[], Any]


def threads_report() -> dict[str, Any]:
    """The thread settings the numbers depend on (threadpoolctl only where installed)."""
    blas = getattr(np.__config__, "CONFIG", {}).get("Build Dependencies", {}).get("blas", {})
    report: dict[str, Any] = {
        "pinned_to": int(THREADS),
        "env": {v: os.environ.get(v) for v in THREAD_VARS},
        "numpy_blas": f"{blas.get('name', '?')} {blas.get('version', '')}".strip(),
    }
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        report["threadpoolctl"] = "not installed (thread counts from the variables above)"
    else:
        report["threadpoolctl"] = [{k: p.get(k) for k in ("internal_api", "num_threads", "version")}
                                   for p in threadpool_info()]
    if have_torch():
        import torch
        torch.set_num_threads(int(THREADS))
        report["torch_threads"] = torch.get_num_threads()
    return report


def print_threads(report: dict[str, Any]) -> None:
    env = " ".join(f"{k}={v}" for k, v in report["env"].items())
    line = f"threads: {env}; NumPy BLAS {report['numpy_blas']}"
    if "torch_threads" in report:
        line += f"; torch.get_num_threads()={report['torch_threads']}"
    print(line)
    tpc = report["threadpoolctl"]
    if isinstance(tpc, str):
        print(f"threadpoolctl: {tpc}")
    else:
        print("threadpoolctl: " + ", ".join(f"{p['internal_api']} {p['num_threads']} threads"
                                            for p in tpc))
    print(f"BLAS threads: {'; '.join(report['effective']) or 'not verified'}; OpenBLAS "
          f"reports {openblas_threads()}")



# ===============================================================================================
# a. z = x*y + sin(x), value and gradient, scalars x=2, y=3
# ===============================================================================================

X0, Y0 = 2.0, 3.0
SCALAR_EXPECTED = (X0 * Y0 + math.sin(X0), Y0 + math.cos(X0), X0)  # z, dz/dx, dz/dy
SCALAR_ANCHOR = "pytorch forward+backward (anchor)"
COMPILED_ROW = "compiled graph, arrays in/out"


def f(x: Any, y: Any) -> Any:
    return x * y + mg.sin(x)


def scalar_methods() -> dict[str, Method]:
    """Each method computes z and returns (z, dz/dx, dz/dy) at (2, 3)."""

    def tape_backward() -> tuple:
        x, y = mg.tensor(X0, requires_grad=True), mg.tensor(Y0, requires_grad=True)
        z = f(x, y)
        z.backward()
        return z, x.grad, y.grad

    grad_tape = mg.grad(f, argnums=(0, 1))
    vg_tape = mg.value_and_grad(f, argnums=(0, 1))

    def tape_grad() -> tuple:
        gx, gy = grad_tape(X0, Y0)
        return vg_tape(X0, Y0)[0], gx, gy  # value checked separately; timed: grad only

    vg_graph = mg.value_and_grad(f, argnums=(0, 1), mode="graph")
    vg_graph(X0, Y0)  # trace, gradient pass and compile happen here, outside the timing

    def graph_mode() -> tuple:
        z, (gx, gy) = vg_graph(X0, Y0)
        return z, gx, gy

    with mg.Graph() as g:
        x = mg.placeholder(shape=(), dtype="float64", name="x")
        y = mg.placeholder(shape=(), dtype="float64", name="y")
        z = f(x, y)
        gx, gy = mg.gradients(z, [x, y])
    sess = mg.Session(g)
    feed = {x: X0, y: Y0}
    fetches = [z, gx, gy]
    fn = mg.compile_graph(g, [x, y], [z, gx, gy])
    xa, ya = np.array(X0), np.array(Y0)  # prepared 0-d float64 arrays
    xt, yt = mg.tensor(X0), mg.tensor(Y0)  # prepared tensors

    methods: dict[str, Method] = {
        "minigraph tape (z.backward())": tape_backward,
        "minigraph tape (mg.grad)": lambda: grad_tape(X0, Y0),
        'minigraph graph mode (value_and_grad, mode="graph")': graph_mode,
        "mg.Session(g).run([z, gx, gy], feed_dict)": lambda: sess.run(fetches, feed),
        "compiled graph, floats in, tensors out": lambda: fn(X0, Y0),
        "compiled graph, tensors in/out": lambda: fn(xt, yt),
        COMPILED_ROW: lambda: fn.raw(xa, ya),
    }
    checks: dict[str, Method] = dict(methods)
    checks["minigraph tape (mg.grad)"] = tape_grad
    if have_torch():
        import torch

        def torch_backward() -> tuple:
            x = torch.tensor(X0, dtype=torch.float64, requires_grad=True)
            y = torch.tensor(Y0, dtype=torch.float64, requires_grad=True)
            z = x * y + torch.sin(x)
            z.backward()
            return z, x.grad, y.grad
        methods[SCALAR_ANCHOR] = checks[SCALAR_ANCHOR] = torch_backward
    for name, check in checks.items():  # check every method before timing any
        got = tuple(float(to_host(v)) for v in check())
        assert np.allclose(got, SCALAR_EXPECTED), f"{name}: {got}, expected {SCALAR_EXPECTED}"
    return methods


def report_scalar(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = [[name, fmt(r["seconds"] * US), fmt(r["ratio"], 3), fmt(r["best_ratio"], 3)]
            for name, r in results.items()]
    print_table(rows, ["method", "µs", "x PyTorch", "best rounds"])
    targets = []
    targets.append(target_line("a", f"{COMPILED_ROW} <= 0.15x PyTorch",
                               results[COMPILED_ROW], 0.15))
    for name in ("compiled graph, tensors in/out",
                 'minigraph graph mode (value_and_grad, mode="graph")'):
        r = results[name]["ratio"]
        status = "-" if r is None else f"{r:.2f}x ({'within' if r <= 0.15 else 'above'} 0.15x)"
        print(f"  for comparison, {name}: {status}")
    return targets


# ===============================================================================================
# b. small MLP 64-32-10, tanh, batch 16, float64: gradient of the loss w.r.t. the weights
# ===============================================================================================

MLP_ANCHOR = "hand-written NumPy backprop (anchor)"


def mlp_loss(w1: Any, b1: Any, w2: Any, b2: Any, x: Any, labels: Any) -> Any:
    return mg.cross_entropy(mg.tanh(x @ w1 + b1) @ w2 + b2, labels)


def numpy_mlp(w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray,
              x: np.ndarray, labels: np.ndarray, xp: Any = np
              ) -> tuple[Any, tuple[np.ndarray, ...]]:
    """ANCHOR: forward, softmax cross-entropy and backprop by hand, float64 (``xp``:
    NumPy, or CuPy on a GPU)."""
    n = x.shape[0]
    rows = xp.arange(n)
    h = xp.tanh(x @ w1 + b1)
    z = h @ w2 + b2
    z -= z.max(axis=1, keepdims=True)
    e = xp.exp(z)
    s = e.sum(axis=1, keepdims=True)
    loss = (xp.log(s).sum() - z[rows, labels].sum()) / n
    d = e / s
    d[rows, labels] -= 1.0
    d /= n                             # d loss / d logits
    dh = d @ w2.T
    dh *= 1.0 - h * h                  # through tanh
    return loss, (x.T @ dh, dh.sum(axis=0), h.T @ d, d.sum(axis=0))


def graph_program(loss: Callable[..., Any]) -> Any:
    """The compiled function graph mode made for ``loss``'s value and its gradients with
    respect to the four weights (its one signature here), from the one cache of
    compiled programs (``minigraph/autodiff/signature.py``)."""
    from minigraph.autodiff.signature import programs

    return next(iter(programs(loss, "graph", ((0, 1, 2, 3),)).values()))


def mlp_methods() -> dict[str, Method]:
    """Each method returns (loss, gradients w.r.t. w1, b1, w2, b2)."""
    rng = np.random.default_rng(1)
    params = [rng.standard_normal((64, 32)) / 8, rng.standard_normal(32) * 0.1,
              rng.standard_normal((32, 10)) / 6, rng.standard_normal(10) * 0.1]
    x, labels = rng.standard_normal((16, 64)), rng.integers(0, 10, 16)
    args_np = params + [x, labels]
    args_mg = [mg.tensor(a) for a in args_np]
    vg_tape = mg.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3))
    vg_graph = mg.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3), mode="graph")
    vg_graph(*args_mg)  # trace + compile outside the timing
    compiled = graph_program(mlp_loss)
    arrays = [a.data for a in args_mg]

    def tape_backward() -> tuple:
        ws = [mg.tensor(p, requires_grad=True) for p in params]  # fresh leaves, grads None
        loss = mlp_loss(*ws, args_mg[4], args_mg[5])
        loss.backward()
        return loss, tuple(w.grad for w in ws)

    def raw() -> tuple:
        value, *grads = compiled.raw(*arrays)
        return value, grads

    timed: dict[str, Method] = {
        MLP_ANCHOR: lambda: numpy_mlp(*args_np),
        "minigraph tape (value_and_grad)": lambda: vg_tape(*args_mg),
        "minigraph tape (loss.backward())": tape_backward,
        'minigraph graph mode (mode="graph")': lambda: vg_graph(*args_mg),
        "  its compiled function, arrays in/out": raw,
    }
    if have_torch():
        import torch
        import torch.nn.functional as F

        tw = [torch.tensor(p, requires_grad=True) for p in params]
        tx, ty = torch.tensor(x), torch.tensor(labels)

        def torch_grad() -> tuple:
            loss = F.cross_entropy(torch.tanh(tx @ tw[0] + tw[1]) @ tw[2] + tw[3], ty)
            return loss, torch.autograd.grad(loss, tw)
        timed["pytorch forward+backward"] = torch_grad
    return timed


def check_mlp(checks: dict[str, Method]) -> None:
    want_loss, want = checks[MLP_ANCHOR]()
    for name, method in checks.items():
        loss, grads = method()
        assert len(grads) == len(want), f"{name}: {len(grads)} gradients, expected {len(want)}"
        check_close(f"{name} loss", loss, want_loss, 1e-10)
        for k, (g, w) in enumerate(zip(grads, want)):
            check_close(f"{name} grad {k}", g, w, 1e-10)


# ===============================================================================================
# c. training step 128x784-256-10, float32: forward, backward, SGD update
# ===============================================================================================

TRAIN_ANCHOR = f"hand-written {'CuPy' if on_gpu() else 'NumPy'} step (anchor)"
GRAPH_ROW = 'minigraph graph mode (mode="graph") + update'
TAPE_ROW = "minigraph tape (value_and_grad) + update"
TRACED_ROW = "  the whole step traced (mg.trace: loss, mg.gradients, update)"
SOURCE_ROW = 'minigraph source mode (mode="source") + update'
SESSION_ROW = "mg.Session(g).run(loss and mg.gradients) + update"
# DESIGN.md's targets for this step, x hand-written NumPy
TRAIN_TARGETS = {TAPE_ROW: ("tape", 1.10), GRAPH_ROW: ("graph mode", 1.03),
                 SOURCE_ROW: ("source mode", 1.03), SESSION_ROW: ("Session", 1.10)}
LR = 0.01
F32 = np.float32


def train_loss(w1: Any, b1: Any, w2: Any, b2: Any, x: Any, labels: Any) -> Any:
    return mg.cross_entropy(mg.relu(x @ w1 + b1) @ w2 + b2, labels)


def numpy_loss_and_grads(w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray,
                         x: np.ndarray, labels: np.ndarray, rows: np.ndarray, xp: Any = np
                         ) -> tuple[Any, tuple[np.ndarray, ...]]:
    """ANCHOR: ReLU MLP forward, softmax cross-entropy and backprop by hand, float32.

    Written for speed as a NumPy programmer would: no one-hot matrix (subtract 1 at the
    labels), in-place bias, ReLU, exp and scaling on freshly made arrays, the ReLU mask
    applied by multiplying in place, transposes as views (BLAS reads them transposed),
    and only Python floats as scalars, so nothing is promoted to float64. ``xp`` is
    NumPy, or CuPy on a GPU.
    """
    n = x.shape[0]
    h = x @ w1                         # (128, 256)
    h += b1
    xp.maximum(h, 0.0, out=h)          # ReLU
    z = h @ w2                         # (128, 10) logits
    z += b2
    z -= z.max(axis=1, keepdims=True)
    picked = z[rows, labels]
    xp.exp(z, out=z)
    s = z.sum(axis=1, keepdims=True)
    loss = (xp.log(s).sum() - picked.sum()) / n
    z /= s                             # softmax
    z[rows, labels] -= 1.0
    z *= 1.0 / n                       # d loss / d logits
    dh = z @ w2.T
    dh *= h > 0                        # through ReLU
    return loss, (x.T @ dh, dh.sum(axis=0), h.T @ z, z.sum(axis=0))


def train_setup() -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    params = [(rng.standard_normal((784, 256)) * math.sqrt(2 / 784)).astype(F32),
              np.zeros(256, F32),
              (rng.standard_normal((256, 10)) * math.sqrt(1 / 256)).astype(F32),
              np.zeros(10, F32)]
    x = rng.random((128, 784), dtype=F32)  # like pixel intensities in [0, 1)
    labels = rng.integers(0, 10, 128)
    return params, x, labels


class NumpyStep:
    """The anchor's training step; owns its copy of the weights (CuPy's on a GPU)."""

    def __init__(self, params: list[np.ndarray], x: np.ndarray, labels: np.ndarray):
        self.xp = xp = array_library()
        self.params = [xp.asarray(p).copy() for p in params]
        self.x, self.labels, self.rows = xp.asarray(x), xp.asarray(labels), xp.arange(x.shape[0])

    def grads(self) -> tuple[Any, tuple[np.ndarray, ...]]:
        return numpy_loss_and_grads(*self.params, self.x, self.labels, self.rows, self.xp)

    def __call__(self) -> Any:
        loss, grads = self.grads()
        for p, g in zip(self.params, grads):
            p -= LR * g                # in place; LR is a Python float: stays float32
        return loss

    def weights(self) -> list[np.ndarray]:
        return [to_host(p) for p in self.params]


class MinigraphStep:
    """minigraph's training step in tape or graph mode; owns its weights (tensors)."""

    def __init__(self, params: list[np.ndarray], x: np.ndarray, labels: np.ndarray,
                 mode: str):
        device = bench_device()
        self.params = [mg.tensor(p, device=device) for p in params]
        self.x, self.labels = mg.tensor(x, device=device), mg.tensor(labels, device=device)
        self.vg = mg.value_and_grad(train_loss, argnums=(0, 1, 2, 3), mode=mode)

    def grads(self) -> tuple[Any, tuple[Any, ...]]:
        return self.vg(*self.params, self.x, self.labels)

    def __call__(self) -> Any:
        loss, grads = self.vg(*self.params, self.x, self.labels)
        with mg.no_grad():             # the SGD update, in place, as the anchor's
            for p, g in zip(self.params, grads):
                p -= LR * g
        return loss

    def weights(self) -> list[np.ndarray]:
        return [p.numpy() for p in self.params]


class CompiledStep(MinigraphStep):
    """Graph mode's compiled function called on raw arrays, then a NumPy update: what
    graph mode would cost with no per-call dispatch (for analysis, no target)."""

    def __init__(self, params: list[np.ndarray], x: np.ndarray, labels: np.ndarray):
        super().__init__(params, x, labels, "graph")
        self.vg(*self.params, self.x, self.labels)  # trace and compile
        self.raw = graph_program(train_loss).raw
        self.arrays = [p.data.copy() for p in self.params]
        self.inputs = (self.x.data, self.labels.data)

    def grads(self) -> tuple[Any, tuple[Any, ...]]:
        value, *grads = self.raw(*self.arrays, *self.inputs)
        return value, tuple(grads)

    def __call__(self) -> Any:
        value, *grads = self.raw(*self.arrays, *self.inputs)
        for p, g in zip(self.arrays, grads):
            p -= LR * g
        return value

    def weights(self) -> list[np.ndarray]:
        return [to_host(p) for p in self.arrays]


class SessionStep:
    """Define-and-run as TensorFlow 1 wrote it: a graph of placeholders, the loss and
    ``mg.gradients``, run by a ``Session`` with a feed per step; the update in NumPy."""

    def __init__(self, params: list[np.ndarray], x: np.ndarray, labels: np.ndarray):
        device = bench_device()
        with mg.Graph() as g, mg.device(device):
            self.holders = [mg.placeholder(p.shape, "float32", name=f"p{k}")
                            for k, p in enumerate(params)]
            xs = mg.placeholder(x.shape, "float32", name="x")
            ys = mg.placeholder(labels.shape, str(labels.dtype), name="labels")
            loss = train_loss(*self.holders, xs, ys)
            self.fetches = [loss] + list(mg.gradients(loss, self.holders))
        self.session = mg.Session(g)
        xp = array_library()
        # The parameters live on the host, as a TF1 loop keeps them: fed every step (the
        # Session copies them to the graph's device) and updated with NumPy on the
        # gradients, which Session.run hands back as NumPy arrays. On a GPU this row
        # therefore pays feed_dict's copies both ways; the data stays on the device.
        self.arrays = [np.array(to_host(p), copy=True) for p in params]
        self.feed = {xs: xp.asarray(x), ys: xp.asarray(labels)}

    def grads(self) -> tuple[Any, tuple[Any, ...]]:
        feed = dict(self.feed)
        feed.update(zip(self.holders, self.arrays))
        loss, *grads = self.session.run(self.fetches, feed)
        return loss, tuple(grads)

    def __call__(self) -> Any:
        loss, grads = self.grads()
        for p, g in zip(self.arrays, grads):
            p -= LR * g                # (Session.run gives arrays)
        return loss

    def weights(self) -> list[np.ndarray]:
        return [to_host(p) for p in self.arrays]


def train_step(w1: Any, b1: Any, w2: Any, b2: Any, x: Any, labels: Any) -> list[Any]:
    """The whole training step as one graph: loss, gradients and the SGD update."""
    loss = train_loss(w1, b1, w2, b2, x, labels)
    grads = mg.gradients(loss, [w1, b1, w2, b2])
    return [loss] + [w - LR * g for w, g in zip((w1, b1, w2, b2), grads)]


class TracedStep(MinigraphStep):
    """The step traced once with ``mg.trace`` (define-and-run as TensorFlow 1 trains: the
    update is in the graph), so the compiled code also updates without new arrays. Its
    loss and gradients are checked through graph mode's (``grads``, inherited); its own
    update is checked by the weights after one step (``check_train``)."""

    def __init__(self, params: list[np.ndarray], x: np.ndarray, labels: np.ndarray):
        super().__init__(params, x, labels, "graph")
        self.step = mg.trace(train_step)

    def __call__(self) -> Any:
        loss, *self.params = self.step(*self.params, self.x, self.labels)
        return loss


class TorchStep:
    """PyTorch's training step, float32, autograd.grad and an in-place update."""

    def __init__(self, params: list[np.ndarray], x: np.ndarray, labels: np.ndarray):
        import torch
        import torch.nn.functional as F

        self.torch, self.F = torch, F
        device = torch_device()
        self.params = [torch.tensor(p, device=device, requires_grad=True) for p in params]
        self.x = torch.tensor(x, device=device)
        self.labels = torch.tensor(labels, device=device)

    def grads(self) -> tuple[Any, tuple[Any, ...]]:
        w1, b1, w2, b2 = self.params
        logits = self.F.relu(self.x @ w1 + b1) @ w2 + b2
        loss = self.F.cross_entropy(logits, self.labels)
        return loss, self.torch.autograd.grad(loss, self.params)

    def __call__(self) -> Any:
        loss, grads = self.grads()
        with self.torch.no_grad():
            for p, g in zip(self.params, grads):
                p -= LR * g
        return loss

    def weights(self) -> list[np.ndarray]:
        return [to_host(p) for p in self.params]


def train_methods() -> dict[str, Any]:
    params, x, labels = train_setup()
    steps: dict[str, Any] = {
        TRAIN_ANCHOR: NumpyStep(params, x, labels),
        TAPE_ROW: MinigraphStep(params, x, labels, "tape"),
        GRAPH_ROW: MinigraphStep(params, x, labels, "graph"),
        "  graph mode's compiled function, arrays in/out + update": CompiledStep(params, x, labels),
        TRACED_ROW: TracedStep(params, x, labels),
        SOURCE_ROW: MinigraphStep(params, x, labels, "source"),
        SESSION_ROW: SessionStep(params, x, labels),
    }
    if torch_device() is not None:
        steps["pytorch step"] = TorchStep(params, x, labels)
    return steps


def check_train(steps: dict[str, Any], rtol: float = 1e-4) -> None:
    """Same loss and gradients as the anchor at the same weights, float32 everywhere, and
    the same weights after one step; all before anything is timed."""
    anchor = steps[TRAIN_ANCHOR]
    want_loss, want = anchor.grads()
    want_loss, want = to_host(want_loss), [to_host(w) for w in want]
    assert all(g.dtype == F32 for g in want), "anchor: gradients are not float32"
    for name, step in steps.items():
        loss, grads = step.grads()
        assert len(grads) == len(want), f"{name}: {len(grads)} gradients, expected {len(want)}"
        check_close(f"{name} loss", to_host(loss), want_loss, rtol)
        for k, (g, w) in enumerate(zip(grads, want)):
            g = to_host(g)
            assert g.dtype == F32, f"{name} gradient {k} has dtype {g.dtype}, not float32"
            check_close(f"{name} gradient {k}", g, w, rtol)
    for step in steps.values():
        step()
    for name, step in steps.items():
        check_weights(name, step, anchor.weights(), rtol)


def check_weights(name: str, step: Any, want: list[np.ndarray] | None, rtol: float) -> None:
    for k, w in enumerate(step.weights()):
        assert w.dtype == F32, f"{name}: weight {k} has dtype {w.dtype}, not float32"
        if want is not None:
            check_close(f"{name} weight {k} after a step", w, want[k], rtol)


# ===============================================================================================
# d. peak memory of (c)'s loss and gradients: graph mode against PyTorch
# ===============================================================================================

MEMORY_TARGET = 1.1  # DESIGN.md: graph mode's peak <= 1.1x PyTorch's



def torch_peak(fn: Method) -> int | None:
    """The same for PyTorch's CPU tensors, from the profiler's memory timeline (which
    tracemalloc cannot see); None where this PyTorch cannot say."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    try:
        from torch.profiler._memory_profiler import MemoryProfileTimeline
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                     record_shapes=True, with_stack=True) as prof:
            fn()
        _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(
            torch.device("cpu"))
    except Exception as exc:  # noqa: BLE001  (a private API: reported, not hidden)
        print(f"  PyTorch's memory timeline is not available here: {exc}")
        return None
    held = [sum(s) for s in sizes]
    return max(held) - held[0]


def bench_memory() -> dict[str, Any]:
    """Peak bytes of one computation of (c)'s loss and gradients per method, and the
    ratio to PyTorch's."""
    params, x, labels = train_setup()
    peaks: dict[str, int | None] = {
        'graph mode (mode="graph")': allocated_peak(MinigraphStep(params, x, labels, "graph").grads),
        'source mode (mode="source")': allocated_peak(
            MinigraphStep(params, x, labels, "source").grads),
        TRAIN_ANCHOR: allocated_peak(NumpyStep(params, x, labels).grads),
    }
    if have_torch():
        peaks["pytorch autograd.grad"] = torch_peak(TorchStep(params, x, labels).grads)
    return peaks


def report_memory(peaks: dict[str, int | None]) -> dict[str, Any]:
    theirs = peaks.get("pytorch autograd.grad")
    print_table([[name, fmt(p / 1e3, 1) if p else "-", fmt(p / theirs, 3) if p and theirs else "-"]
                 for name, p in peaks.items()], ["method", "peak kB", "x PyTorch"])
    ours = peaks['graph mode (mode="graph")']
    what = f"graph mode peak <= {MEMORY_TARGET}x PyTorch"
    if not theirs or not ours:
        print(f"target: {what}  (PyTorch's peak not available)")
        return {"table": "d", "target": what, "limit": MEMORY_TARGET, "ratio": None,
                "met": None}
    ratio = ours / theirs
    print(f"target: {what}  -> {ratio:.3f}x  {'MET' if ratio <= MEMORY_TARGET else 'MISSED'}")
    return {"table": "d", "target": what, "limit": MEMORY_TARGET, "ratio": ratio,
            "met": ratio <= MEMORY_TARGET}


def report_ratio_table(results: dict[str, dict[str, Any]], anchor: str, unit: str,
                       torch_name: str | None) -> None:
    scale = US if unit == "µs" else MS
    t_torch = results[torch_name]["seconds"] if torch_name in results else None
    rows = [[name, fmt(r["seconds"] * scale, 1 if unit == "µs" else 3), fmt(r["ratio"], 3),
             fmt(r["best_ratio"], 3), fmt(r["seconds"] / t_torch, 2) if t_torch else "-"]
            for name, r in results.items()]
    print_table(rows, ["method", unit, "x anchor", "best rounds", "x PyTorch"])


def target_line(table: str, what: str, result: dict[str, Any], limit: float) -> dict[str, Any]:
    """Print whether a target is met: judged on the median ratio, the best-rounds ratio
    shown beside it."""
    ratio, best = result["ratio"], result["best_ratio"]
    if ratio is None:
        print(f"target: {what}  (anchor not available)")
        return {"table": table, "target": what, "limit": limit, "ratio": None, "met": None}
    met = ratio <= limit
    print(f"target: {what}  -> {ratio:.3f}x (best rounds {best:.3f}x)  "
          f"{'MET' if met else 'MISSED'}")
    return {"table": table, "target": what, "limit": limit, "ratio": ratio,
            "best_ratio": best, "met": met}


# ===============================================================================================
# results: JSON and a plot
# ===============================================================================================

def plot(tables: list[tuple[str, dict[str, dict[str, Any]], str, list[tuple[str, float]]]],
         path: Path) -> None:
    """One panel per benchmark: a horizontal bar per method; anchors in grey; targets as
    dashed lines; log scale when the spread is large."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(tables), 1, figsize=(10, 3.2 * len(tables)), squeeze=False)
    for ax, (title, results, anchor, lines) in zip(axes[:, 0], tables):
        names = list(results)[::-1]
        us = [results[n]["seconds"] * US for n in names]
        colors = ["0.6" if n == anchor or "pytorch" in n else
                  "tab:orange" if "tape" in n else "tab:blue" for n in names]
        ax.barh(range(len(names)), us, color=colors)
        ax.set_yticks(range(len(names)), [n.strip() for n in names], fontsize=8)
        for i, t in enumerate(us):
            ax.text(t, i, f" {t:,.1f}", va="center", fontsize=7)
        t_anchor = results[anchor]["seconds"] * US if anchor in results else None
        if t_anchor:
            for (label, factor), style in zip(lines, ("--", ":")):
                ax.axvline(t_anchor * factor, color="tab:red", ls=style, lw=1,
                           label=f"target: {label}")
            if lines:
                ax.legend(loc="upper right", fontsize=7)
        if max(us) / min(us) > 30:
            ax.set_xscale("log")
        ax.set_xlabel("µs per call (lower is better)" +
                      (", log scale" if ax.get_xscale() == "log" else ""))
        ax.set_title(title, fontsize=10)
        ax.set_xlim(right=max(us) * (3 if ax.get_xscale() == "log" else 1.25))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    with blas_threads(int(THREADS)) as how:  # also with NumPy loaded (minigraph bench)
        run(how)


def run(how: list[str]) -> None:
    threads = threads_report()
    threads["effective"] = how
    env = environment()
    print(describe(env))
    print_threads(threads)
    targets: list[dict[str, Any]] = []
    saved: dict[str, Any] = {}
    panels: list[tuple[str, dict[str, dict[str, Any]], str, list[tuple[str, float]]]] = []

    print("\n== a. z = x*y + sin(x): value and gradient, scalars x=2, y=3, float64 ==")
    if not cpu_only("Python's overhead on scalars is a CPU matter"):
        scalar, scalar_rounds = measure(scalar_methods(), SCALAR_ANCHOR)
        targets += report_scalar(scalar)
        print_rounds(scalar_rounds)
        saved["scalar_value_and_grad"] = {"anchor": SCALAR_ANCHOR, "results": scalar,
                                          "rounds": scalar_rounds}
        panels.append(("a. x*y + sin(x), value and gradient, scalars (float64)", scalar,
                       SCALAR_ANCHOR, [("0.15x PyTorch", 0.15)]))

    print("\n== b. MLP 64-32-10 (tanh), batch 16, float64: loss and gradients "
          "w.r.t. the 4 weights ==")
    if not cpu_only("on arrays this small, Python's overhead per op is a CPU matter"):
        timed = mlp_methods()
        check_mlp(timed)
        mlp, mlp_rounds = measure(timed, MLP_ANCHOR)
        report_ratio_table(mlp, MLP_ANCHOR, "µs", "pytorch forward+backward")
        print_rounds(mlp_rounds)
        saved["mlp_64_32_10_batch16"] = {"anchor": MLP_ANCHOR, "results": mlp,
                                         "rounds": mlp_rounds}
        panels.append(("b. MLP 64-32-10 tanh, batch 16, float64: loss and gradients", mlp,
                       MLP_ANCHOR, []))

    print("\n== c. training step 128x784-256-10 (ReLU), float32: forward, backward, "
          f"SGD update (lr={LR}), on {bench_device()} ==")
    steps = train_methods()
    check_train(steps)
    train, train_rounds = measure(steps, TRAIN_ANCHOR, rounds=41, batch=0.05,
                                  sync=synchronizer())
    for name, step in steps.items():  # still float32 after all the timed steps
        check_weights(name, step, None, 0.0)
    report_ratio_table(train, TRAIN_ANCHOR, "ms", "pytorch step")
    if on_gpu():
        print(f"(the targets are set for the CPU; on {bench_device()} the ratios are "
              f"shown only)")
    else:
        for row, (what, limit) in TRAIN_TARGETS.items():
            targets.append(target_line("c", f"{what} <= {limit:.2f}x hand-written NumPy",
                                       train[row], limit))
        traced = train[TRACED_ROW]["ratio"]
        print(f"  for comparison, the whole step traced into one graph: {traced:.3f}x "
              f"({'within' if traced <= 1.03 else 'above'} graph mode's 1.03x)")
    print_rounds(train_rounds)
    saved["train_step_128x784_256_10_float32"] = {"anchor": TRAIN_ANCHOR, "results": train,
                                                  "rounds": train_rounds}

    print("\n== d. peak bytes allocated by (c)'s loss and gradients, one call ==")
    if not cpu_only("tracemalloc sees host memory only"):
        peaks = bench_memory()
        targets.append(report_memory(peaks))
        saved["peak_bytes_loss_and_gradients"] = peaks
    panels.append((f"c. training step 128x784-256-10 ReLU, float32, {bench_device()}", train,
                   TRAIN_ANCHOR, [] if on_gpu() else [("graph, source 1.03x NumPy", 1.03),
                                                      ("tape, Session 1.10x NumPy", 1.10)]))

    name = result_name("graph")
    path = save_results(name, {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "environment": env,
        "device": bench_device(),
        "threads": threads,
        "unit": "seconds per call (median over the clean interleaved rounds); ratio: "
                "median over those rounds of method / anchor",
        **saved,
        "targets": targets,
    })
    plot(panels, RESULTS_DIR / f"{name}.png")
    print(f"\nwrote {path} and {RESULTS_DIR / f'{name}.png'}")


if __name__ == "__main__":
    main()
