"""What a graph costs before it runs: building it, and a long chain's first gradient.

Run: ``python benchmarks/bench_build.py`` (about two minutes, most of it the 10^5-node
graph's three first calls). Prints two tables, writes ``benchmarks/results/build.json`` and
``build_time.png`` (build time against links, log-log, with a line of slope 1: a
linear build runs parallel to it). Every gradient is checked against the closed form
before its time is reported; times are reported, never asserted (DESIGN.md,
"Performance"). Each point is the best of a few builds in fresh graphs, so that a
busy moment of the machine does not make a size look slower than it is.

a. Building a chain of ``y = mg.sin(y) * 1.0001`` links in ``mg.Graph()``, plus
   ``mg.gradients``: microseconds per link at 10^3 ... 3x10^4 links. Targets: at most
   30 µs per link at 10^4, and linear: 3x10^4 links in at most 3.6x the 10^4 time.
b. The gradient of a chain of ``y = mg.sin(y)``, *first call included* (recording,
   transforming, compiling, running), in every mode, at 10^4 and 10^5 nodes: the best
   of three fresh first calls at each length.
   Target: time(10^5) / time(10^4) <= 12 in every mode (linear, with room for noise).
"""

from __future__ import annotations

import datetime
import gc
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find common.py however we are run
from common import (RESULTS_DIR, cpu_only, describe, environment, fmt, print_table,  # noqa: E402
                    save_results)

import minigraph as mg  # noqa: E402

US = 1e6
LINKS = [1_000, 3_000, 10_000, 30_000]
PER_LINK_TARGET = 30.0  # µs per link at 10^4
LINEAR_TARGET = 3.6     # time(3x10^4) / time(10^4)
CHAINS = [10_000, 100_000]
GROWTH_TARGET = 12.0    # time(10^5) / time(10^4), first call included
X0 = 0.5


# == a. building ===============================================================================

def build(links: int) -> float:
    """Seconds to build the chain and its gradient in a fresh graph."""
    gc.collect()  # (the previous graph's garbage is not this one's cost)
    start = time.perf_counter()
    with mg.Graph() as g:
        x = mg.placeholder((), name="x")
        y = x
        for _ in range(links):
            y = mg.sin(y) * 1.0001
        mg.gradients(y, [x])
    seconds = time.perf_counter() - start
    assert len(g.nodes) >= 5 * links  # sin, mul, and three gradient nodes per link
    return seconds


def bench_build() -> dict[int, float]:
    build(1_000)  # warm-up: imports, first calls
    return {n: min(build(n) for _ in range(3 if n <= 10_000 else 2)) for n in LINKS}


def report_build(times: dict[int, float]) -> str:
    print_table([[f"{n:,}", fmt(t, 3), fmt(t / n * US, 1)] for n, t in times.items()],
                ["links", "seconds (best of builds)", "µs per link"])
    per_link = times[10_000] / 10_000 * US
    growth = times[30_000] / times[10_000]
    ok = per_link <= PER_LINK_TARGET and growth <= LINEAR_TARGET
    line = (f"target: building a 10^4-link chain with mg.gradients at most {PER_LINK_TARGET:.0f} "
            f"µs per link, 3x10^4 links at most {LINEAR_TARGET}x that time  "
            f"({'met' if ok else 'MISSED'}: {per_link:.1f} µs per link, {growth:.2f}x)")
    print(line)
    return line


def plot_build(times: dict[int, float], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ns = list(times)
    ax.loglog(ns, [times[n] for n in ns], "o-", label="chain + mg.gradients")
    ref = times[ns[0]] / ns[0]
    ax.loglog(ns, [ref * n for n in ns], "--", color="grey", label="linear (slope 1)")
    ax.loglog(ns, [PER_LINK_TARGET / US * n for n in ns], ":", color="tab:green",
              label=f"target: {PER_LINK_TARGET:.0f} µs per link")
    ax.set_xlabel("links (y = sin(y) * 1.0001)")
    ax.set_ylabel("seconds to build")
    ax.set_title("Graph construction time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# == b. first calls on long chains =============================================================

def chain(x: Any, n: int) -> Any:
    """y <- sin(y), n times (source mode reads this loop)."""
    y = x
    for _ in range(n):
        y = mg.sin(y)
    return y


def closed_form(n: int) -> float:
    """dy/dx = prod of cos(y_k) over the inputs y_k of the n sines."""
    y, d = X0, 1.0
    for _ in range(n):
        d *= math.cos(y)
        y = math.sin(y)
    return d


def first_calls(n: int) -> dict[str, Callable[[], float]]:
    """A fresh first call of each mode (nothing cached from an earlier call)."""
    def tape() -> float:
        x = mg.tensor(X0, requires_grad=True)
        chain(x, n).backward()
        return float(x.grad.item())

    def forward() -> float:
        _, dy = mg.jvp(lambda x: chain(x, n), (X0,), (1.0,))
        return float(dy.item())

    def graph() -> float:
        return float(mg.grad(lambda x: chain(x, n), mode="graph")(X0).item())

    def source() -> float:
        def f(x: Any, k: int) -> Any:  # a new function: a new program, transformed now
            return chain(x, k)
        return float(mg.grad(f, mode="source")(X0, n).item())

    return {"tape": tape, "forward": forward, "source": source, "graph": graph}


def bench_chains() -> dict[str, dict[int, float]]:
    seconds: dict[str, dict[int, float]] = {}
    for n in CHAINS:
        expected = closed_form(n)
        for mode, call in first_calls(n).items():
            best = math.inf
            # The best of three first calls (each one fresh), at both lengths: the ratio
            # compares one statistic with itself. (A single call at 10^5 against the best
            # of three at 10^4 made it carry one call's noise: graph mode's three 10^5
            # calls in one process took 12.3, 11.5 and 10.7 s.)
            for _ in range(3):
                gc.collect()
                start = time.perf_counter()
                got = call()
                best = min(best, time.perf_counter() - start)
                assert math.isclose(got, expected, rel_tol=1e-9), (mode, n, got, expected)
            seconds.setdefault(mode, {})[n] = best
    return seconds


def report_chains(seconds: dict[str, dict[int, float]]) -> str:
    small, large = CHAINS
    rows = [[mode, fmt(t[small], 3), fmt(t[large], 3), fmt(t[large] / t[small], 1)]
            for mode, t in seconds.items()]
    print_table(rows, ["mode", f"{small:,} nodes (s)", f"{large:,} nodes (s)", "ratio"])
    worst = max(t[large] / t[small] for t in seconds.values())
    line = (f"target: the first gradient of a chain grows linearly, time(10^5) / time(10^4) "
            f"<= {GROWTH_TARGET:.0f} in every mode  "
            f"({'met' if worst <= GROWTH_TARGET else 'MISSED'}: worst {worst:.1f})")
    print(line)
    return line


def main() -> None:
    if cpu_only("building graphs and tracing chains is Python's work, on the CPU"):
        return
    env = environment()
    print(describe(env))
    print("\n== a. building y = sin(y) * 1.0001 chains and their gradients in mg.Graph() ==")
    built = bench_build()
    build_line = report_build(built)
    print("\n== b. a chain's gradient, first call included ==")
    chains = bench_chains()
    chain_line = report_chains(chains)
    png = RESULTS_DIR / "build_time.png"
    path = save_results("build", {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "environment": env,
        "unit": "seconds (best of builds; best of three first calls per mode and length)",
        "build_seconds": built, "first_call_seconds": chains,
        "targets": [build_line, chain_line],
    })
    plot_build(built, png)
    print(f"\nwrote {path} and {png}")


if __name__ == "__main__":
    main()
