"""Jacobians and per-example gradients in one batched pass, against torch.func.

Run: ``python benchmarks/bench_jacobians.py`` (about half a minute). Prints a table and
writes ``benchmarks/results/jacobians.json``. Every result is checked against
torch.func *before* it is timed; times are reported, never asserted (DESIGN.md,
"Performance"). Methods are timed in interleaved rounds (``common.measure``); a ratio is
the median of the ratios within a round, anchor torch.func.

a. ``mg.jacrev`` and ``mg.jacfwd`` of f(x) = tanh(W @ x), R^256 -> R^256, float64:
   the m sweeps (n tangents) run as one batched pass, ``vmap`` over the identity's rows,
   against ``torch.func.jacrev`` / ``jacfwd``; the unbatched loops
   (``vectorize=False``, one pass per row) are shown beside them, and jacrev with the
   vjp of graph and source mode (a compiled program, vmapped). Target: <= 2x.
b. Per-example gradients of a squared loss over a batch of 128 examples of R^64:
   ``mg.vmap(mg.grad(loss), in_axes=(None, 0, 0))`` against
   ``torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))``. Target: <= 2x.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find common.py however we are run
from common import (cpu_only, describe, environment, fmt, have_torch, measure,  # noqa: E402
                    pin_blas_threads, print_rounds, print_table, save_results)

THREADS = pin_blas_threads()  # before NumPy loads its BLAS: one thread, as PyTorch gets

import numpy as np  # noqa: E402

import minigraph as mg  # noqa: E402

US = 1e6
N = 256
TARGET = 2.0


def jacobian_rows(torch: Any, tf: Any) -> tuple[list, dict]:
    rng = np.random.default_rng(0)
    w, x = rng.normal(size=(N, N)) / np.sqrt(N), rng.normal(size=N)
    w_t, x_t = mg.tensor(w), mg.tensor(x)
    w_torch, x_torch = torch.tensor(w), torch.tensor(x)

    def f(v: Any) -> Any:
        return mg.tanh(w_t @ v)

    def f_torch(v: Any) -> Any:
        return torch.tanh(w_torch @ v)

    expected = (1.0 - np.tanh(w @ x) ** 2)[:, None] * w
    methods = {
        "torch.func.jacrev": lambda: tf.jacrev(f_torch)(x_torch),
        "mg.jacrev": lambda: mg.jacrev(f)(x_t),
        "mg.jacrev(mode='graph')": lambda: mg.jacrev(f, mode="graph")(x_t),
        "mg.jacrev(mode='source')": lambda: mg.jacrev(f, mode="source")(x_t),
        "torch.func.jacfwd": lambda: tf.jacfwd(f_torch)(x_torch),
        "mg.jacfwd": lambda: mg.jacfwd(f)(x_t),
        "mg.jacrev(vectorize=False)": lambda: mg.jacrev(f, vectorize=False)(x_t),
        "mg.jacfwd(vectorize=False)": lambda: mg.jacfwd(f, vectorize=False)(x_t),
    }
    for name, method in methods.items():
        got = method()
        got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-13, err_msg=name)
    rows, data = [], {}
    for kind in ("jacrev", "jacfwd"):
        group = {k: v for k, v in methods.items() if kind in k}
        timed, summary = measure(group, anchor=f"torch.func.{kind}", rounds=11, batch=0.05)
        print_rounds(summary)
        for name, t in timed.items():
            target = f"<= {TARGET}x" if name == f"mg.{kind}" else ""
            rows.append([name, fmt(t["seconds"] * US, 0), fmt(t["ratio"]), target])
        data[kind] = timed
    return rows, data


def per_example_rows(torch: Any, tf: Any) -> tuple[list, dict]:
    rng = np.random.default_rng(1)
    batch, d = 128, 64
    w, X, Y = rng.normal(size=d), rng.normal(size=(batch, d)), rng.normal(size=batch)

    def loss(w: Any, x: Any, y: Any) -> Any:
        return (mg.sum(mg.tanh(x * w)) - y) ** 2

    def loss_torch(w: Any, x: Any, y: Any) -> Any:
        return (torch.sum(torch.tanh(x * w)) - y) ** 2

    args = (mg.tensor(w), mg.tensor(X), mg.tensor(Y))
    targs = (torch.tensor(w), torch.tensor(X), torch.tensor(Y))
    mine = mg.vmap(mg.grad(loss), in_axes=(None, 0, 0))
    theirs = tf.vmap(tf.grad(loss_torch), in_dims=(None, 0, 0))
    np.testing.assert_allclose(mine(*args).numpy(), theirs(*targs).numpy(), rtol=1e-10)
    methods = {"torch.func.vmap(grad)": lambda: theirs(*targs),
               "mg.vmap(mg.grad)": lambda: mine(*args)}
    timed, summary = measure(methods, anchor="torch.func.vmap(grad)", rounds=11, batch=0.05)
    print_rounds(summary)
    rows = [[name, fmt(t["seconds"] * US, 0), fmt(t["ratio"]),
             f"<= {TARGET}x" if name.startswith("mg") else ""] for name, t in timed.items()]
    return rows, timed


def main() -> int:
    if cpu_only("Jacobians of R^256 are small arrays: their time is Python's, on the CPU"):
        return 0
    if not have_torch():
        return 0
    import torch
    import torch.func as tf

    torch.set_num_threads(int(THREADS))
    print(describe(environment()))
    print(f"\nJacobians of tanh(W @ x), R^{N} -> R^{N}, float64, {THREADS} BLAS thread(s):")
    rows, data = jacobian_rows(torch, tf)
    print_table(rows, ["method", "µs per call", "/ torch.func", "target"])
    print("\nPer-example gradients, 128 examples of R^64, float64:")
    rows2, data2 = per_example_rows(torch, tf)
    print_table(rows2, ["method", "µs per call", "/ torch.func", "target"])
    save_results("jacobians", {"when": datetime.datetime.now().isoformat(),
                               "environment": environment(), "jacobians": data,
                               "per_example": data2})
    return 0


if __name__ == "__main__":
    sys.exit(main())
