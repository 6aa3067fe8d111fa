"""Is this checkout slower than an earlier commit? Both, timed in one process.

Run: ``python benchmarks/compare.py REV`` (about two minutes), e.g. ``a117e58``, the
commit this round's issues were measured on. The other benchmarks compare minigraph with
anchors; this one compares minigraph with itself across commits, which is what "the
existing benchmarks get no slower" asks. Two runs of a script at two commits cannot
answer it on a shared machine, whose speed drifts by tens of percent within minutes (see
README.md, "How times and ratios are measured"); so the package as it was at REV is
extracted with ``git archive`` and imported under another name (``minigraph_REV``), beside
this checkout's, and every workload is timed in both in finely interleaved rounds
(``common.measure``, REV as the anchor). The column ``HEAD / REV`` is the median ratio
within rounds: above 1 is slower now.

The workloads use the public API only (DESIGN.md's contract: names are added, never
renamed), so any commit of this round runs them. Each is checked first: both versions
must give the same numbers. The old package is imported under another name, which works
because the library's modules import each other relatively (the grader and the CLI,
which import ``minigraph`` by name, are not loaded).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # find common.py however we are run
from common import check_close, describe, environment, measure, pin_blas_threads, print_rounds, print_table  # noqa: E402,E501

pin_blas_threads()

import numpy as np  # noqa: E402

import minigraph  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def load_revision(rev: str) -> Any:
    """minigraph as it was at ``rev``, imported as ``minigraph_<rev>``."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "minigraph"],
                         check=True, capture_output=True).stdout
    where = Path(tempfile.mkdtemp(prefix="minigraph-compare-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(where, filter="data")
    name = "minigraph_" + "".join(c if c.isalnum() else "_" for c in rev)
    (where / "minigraph").rename(where / name)
    sys.path.insert(0, str(where))
    return importlib.import_module(name)


def workloads(mg: Any) -> dict[str, Callable[[], Any]]:
    """Calls to time, in library ``mg``: the per-call rows of bench_eager, bench_graph,
    bench_modes and bench_runtime, small enough for a minute's rounds."""
    rng = np.random.default_rng(0)
    w: dict[str, Callable[[], Any]] = {}
    x4 = mg.tensor(rng.standard_normal(4), requires_grad=True)
    w["eager sin, (4,), recorded"] = lambda: mg.sin(x4)
    w["eager sum, (4,), recorded"] = lambda: mg.sum(x4)

    def scalar_tape() -> Any:
        x, y = mg.tensor(2.0, requires_grad=True), mg.tensor(3.0, requires_grad=True)
        (x * y + mg.sin(x)).backward()
        return x.grad, y.grad
    w["x*y+sin(x): tape, z.backward()"] = scalar_tape

    def f(x: Any, y: Any) -> Any:
        return x * y + mg.sin(x)
    for mode in ("tape", "forward", "graph"):
        w[f"x*y+sin(x): mg.grad, {mode}"] = \
            (lambda g=mg.grad(f, argnums=(0, 1), mode=mode): g(2.0, 3.0))

    def loss(w1: Any, b1: Any, w2: Any, b2: Any, x: Any, labels: Any) -> Any:
        return mg.cross_entropy(mg.tanh(x @ w1 + b1) @ w2 + b2, labels)
    for width in (4, 64):  # bench_modes: batch 32, 10 classes, float64
        params = [rng.standard_normal((width, width)), np.zeros(width),
                  rng.standard_normal((width, 10)), np.zeros(10)]
        arrays = [*params, rng.standard_normal((32, width)), rng.integers(0, 10, 32)]
        with mg.Graph() as graph:
            holders = [mg.placeholder(a.shape, dtype=str(a.dtype)) for a in arrays]
            out = loss(*holders)
            fetches = [out, *mg.gradients(out, holders[:4])]
        raw = mg.compile_graph(graph, holders, fetches).raw
        w[f"MLP w={width}: compiled graph, arrays"] = lambda raw=raw, a=arrays: raw(*a)
        session, feed = mg.Session(graph), dict(zip(holders, arrays))
        w[f"MLP w={width}: Session.run"] = \
            lambda s=session, f=fetches, d=feed: s.run(f, d)
        tensors = [mg.tensor(a) for a in arrays]
        vg = mg.value_and_grad(loss, argnums=(0, 1, 2, 3), mode="graph")
        w[f"MLP w={width}: mg.grad, graph"] = lambda vg=vg, t=tensors: vg(*t)

        def tape(t: list = tensors) -> Any:
            ps = [mg.tensor(p.data, requires_grad=True) for p in t[:4]]
            loss(*ps, *t[4:]).backward()
            return [p.grad for p in ps]
        w[f"MLP w={width}: tape, loss.backward()"] = tape

    def chain() -> Any:  # bench_runtime (b)'s kind of graph: scalar adds and muls
        with mg.Graph() as graph:
            x = mg.placeholder((), name="x")
            y = x
            for _ in range(500):
                y = y * 1.0001 + 0.5
        return graph, x, y
    graph, x, y = chain()
    session = mg.Session(graph)
    w["Session.run, 1000-node scalar chain"] = lambda: session.run(y, {x: 1.0})
    w["building that chain"] = chain
    return w


def values(result: Any) -> list[np.ndarray]:
    """Every number in a workload's result, for the check."""
    if isinstance(result, (tuple, list)):
        return [v for r in result for v in values(r)]
    return [np.asarray(result.numpy() if hasattr(result, "numpy") else result, dtype=float)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the commit to compare with (a hash, tag or branch)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    old = load_revision(args.rev)
    print(describe(environment()))
    print(f"HEAD against {args.rev}, {args.rounds} interleaved rounds of ~20 ms batches per "
          f"workload; both versions in this process\n")
    theirs, ours = workloads(old), workloads(minigraph)
    rows, worst = [], None
    for name in ours:
        if name.startswith("building"):
            got, want = [], []
        else:
            got, want = values(ours[name]()), values(theirs[name]())
        assert len(got) == len(want), f"{name}: {len(got)} values now, {len(want)} at {args.rev}"
        for g, v in zip(got, want):
            check_close(name, g, v, 1e-9)
        results, summary = measure({args.rev: theirs[name], "HEAD": ours[name]}, anchor=args.rev,
                                   rounds=args.rounds)
        if worst is None or summary["min_cpu_share"] < worst["min_cpu_share"]:
            worst = summary  # (the rounds of the least clean workload are the ones to show)
        rows.append([name, f"{results[args.rev]['seconds'] * 1e6:.1f}",
                     f"{results['HEAD']['seconds'] * 1e6:.1f}", f"{results['HEAD']['ratio']:.3f}"])
    if worst is not None:
        print_rounds(worst)
    print_table(rows, ["workload", f"{args.rev} µs", "HEAD µs", f"HEAD / {args.rev}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
