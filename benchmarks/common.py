"""Small helpers shared by the benchmarks: timing, tables, results, environment.

Benchmarks print and save numbers; they never assert on time (DESIGN.md, "Performance").
PyTorch is an optional anchor: it is imported lazily and its columns are skipped when it
is not installed.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

RESULTS_DIR = Path(__file__).resolve().parent / "results"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _run(fn: Callable[[], Any], number: int) -> float:
    """Seconds taken by ``number`` calls of ``fn``."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return time.perf_counter() - start


def timeit(fn: Callable[[], Any], repeat: int = 7, number: int | None = None,
           min_time: float = 0.1) -> float:
    """Median seconds per call of ``fn`` over ``repeat`` measurements.

    With ``number=None`` the number of calls per measurement doubles until one
    measurement lasts at least ``min_time`` seconds (so 0.1-0.2 s by default), which
    makes the timer's own resolution and the loop's overhead negligible.
    """
    fn()  # warm-up: first-call costs (imports, caches) are not what we measure
    if number is None:
        number = 1
        while _run(fn, number) < min_time:
            number *= 2
    return statistics.median(_run(fn, number) / number for _ in range(repeat))


def have_torch() -> bool:
    """Whether PyTorch can be imported (it is an optional anchor)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    """Print a plain aligned text table: first column left-aligned, the others right."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[j]) for row in cells) for j in range(len(headers))]

    def line(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                         for j, (c, w) in enumerate(zip(row, widths)))

    print(line(cells[0]))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print(line(row))


def save_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``data`` as JSON to ``benchmarks/results/NAME.json``; return the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def environment() -> dict[str, Any]:
    """What the numbers depend on: versions, machine, cores, thread settings."""
    import numpy as np

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "torch": "not installed",
        "processor": platform.processor(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    if have_torch():
        import torch
        env["torch"] = torch.__version__
        env["torch_threads"] = torch.get_num_threads()
    for var in THREAD_VARS:
        env[var] = os.environ.get(var)
    return env


def fmt(x: float | None, digits: int = 2) -> str:
    """A number for a table, or "-" when missing."""
    return "-" if x is None else f"{x:.{digits}f}"
