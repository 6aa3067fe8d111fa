"""Source transformation: the gradient of z = x*y + sin(x) from a generated program,
against PyTorch's forward+backward and minigraph's tape.

Run: ``python benchmarks/bench_source.py`` (about 10 seconds). Prints a table (µs per
call and ratios) and writes ``benchmarks/results/source.json``. Every method's gradient is
checked *before* it is timed; times are reported, never asserted (DESIGN.md,
"Performance"). The methods are timed in finely interleaved rounds (``common.measure``)
and the ratios are medians of the ratios within a round: on a shared machine a burst of
load then slows every method alike instead of one.

What the source rows time (see ``minigraph/autodiff/source/``):

* ``source_grad(f)(x, y)``: the whole call on tensors: look up the cached program for
  the arguments' signature, run it, wrap the results in tensors. The transformation
  itself ran once, before timing. This is the row with the target (<= 0.15x PyTorch).
* ``... (2.0, 3.0)``: the same with Python floats, which first become arrays.
* ``program.fn``: the readable program (``.source``, ``mg.`` calls) run on tensors: each
  line is an eager minigraph operation (bind, device check, a new Tensor).
* ``program.raw``: the same program as a graph, compiled by graph compilation to the
  primitives' kernels on arrays (``.raw_source``; it returns the value and the
  gradients): what the first row runs, without the call's bookkeeping.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find common.py however we are run
from common import (cpu_only, describe, environment, fmt, measure, print_rounds,  # noqa: E402
                    print_table, save_results, to_float)

import minigraph as mg  # noqa: E402
from bench_eager import EXPECTED, TORCH_ROW, X, Y, f, scalar_methods  # noqa: E402
from minigraph.autodiff.source import source_grad  # noqa: E402

US = 1e6  # seconds -> microseconds
TARGET = 0.15  # DESIGN.md: compiled graph or source-transformed <= 0.15x PyTorch
HEADLINE = "source_grad(f)(x, y), tensors"
TORCH, TAPE = TORCH_ROW, "minigraph tape (backward)"
SHARED = (TORCH, TAPE, "minigraph mg.grad tape", "hand-written NumPy (anchor)")


def methods() -> dict[str, Callable[[], tuple[Any, Any]]]:
    """Each method returns (dz/dx, dz/dy) at (X, Y): the rows of bench_eager's table (b)
    to compare with (PyTorch, the tape, the hand-written anchor), then the source rows."""
    gf = source_grad(f, argnums=(0, 1))
    x, y = mg.tensor(X), mg.tensor(Y)
    program = gf.program_for(x, y)  # the transformation runs here, once
    xa, ya = x.data, y.data
    eager = scalar_methods()
    table = {name: eager[name] for name in SHARED if name in eager}  # no PyTorch: no row
    table[HEADLINE] = lambda: gf(x, y)
    table["source_grad(f)(2.0, 3.0), floats"] = lambda: gf(X, Y)
    table["program.fn(x, y): mg. calls on tensors"] = lambda: program.fn(x, y)[1]
    table["program.raw(x, y): kernels on arrays"] = lambda: program.raw(xa, ya)[1:]
    return table



def bench() -> dict[str, dict[str, Any]]:
    """Seconds per call of every method (each checked first) and its ratio to PyTorch
    (to the tape without PyTorch), from ``common.measure``."""
    table = methods()
    for name, method in table.items():
        got = tuple(to_float(g) for g in method())
        assert np.allclose(got, EXPECTED, rtol=1e-15), f"{name}: {got}, expected {EXPECTED}"
    anchor = TORCH if TORCH in table else TAPE
    results, rounds = measure(table, anchor)
    print_rounds(rounds)
    return results


def report(results: dict[str, dict[str, Any]]) -> None:
    """The table; "x PyTorch" is the median ratio within rounds (None without PyTorch)."""
    tape = results[TAPE]["seconds"]
    has_torch = TORCH in results
    rows = [[name, fmt(r["seconds"] * US), fmt(r["ratio"], 3) if has_torch else "-",
             fmt(r["seconds"] / tape, 3)] for name, r in results.items()]
    print_table(rows, ["method", "µs", "x PyTorch", "x tape"])
    if has_torch:
        ratio = results[HEADLINE]["ratio"]
        verdict = "met" if ratio <= TARGET else "missed"
        print(f"target: source-transformed <= {TARGET}x PyTorch  ({verdict}: {ratio:.3f}x)")
    else:
        print("target: source-transformed <= 0.15x PyTorch  (PyTorch not installed)")


def main() -> None:
    if cpu_only("Python's overhead on scalars is a CPU matter"):
        return
    env = environment()
    print(describe(env))
    print("\n== z = x*y + sin(x), value and gradient, scalars x=2, y=3 ==")
    print("the generated program:\n")
    print(source_grad(f, argnums=(0, 1)).program_for(mg.tensor(X), mg.tensor(Y)).source)
    results = bench()
    report(results)
    path = save_results("source", {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "environment": env,
        "unit": "seconds per call (median over interleaved rounds); ratio: median over "
                "the rounds of method / anchor within a round (PyTorch's forward and "
                "backward, or the tape where PyTorch is not installed)",
        "scalar_value_and_gradient": results,
    })
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
