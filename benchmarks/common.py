"""Small helpers shared by the benchmarks: timing, tables, results, environment.

Benchmarks print and save numbers; they never assert on time (DESIGN.md, "Performance").
PyTorch is an optional anchor: it is imported lazily and its columns are skipped when it
is not installed.

The suite runs on the CPU by default. ``minigraph bench --device cuda:0`` sets
``MINIGRAPH_BENCH_DEVICE``; the scripts that compare libraries on arrays (``bench_eager``
(a), ``bench_graph`` (c), ``bench_modes``) then put minigraph's tensors, the hand-written
anchor (CuPy instead of NumPy) and PyTorch's tensors on that device, and every timing waits for the
device before starting the clock and before stopping it (:func:`synchronizer`). The
others measure what only a CPU shows (Python overhead per node, worker threads on
cores, simulated devices) and say so.
"""

from __future__ import annotations

import contextlib
import gc
import ctypes
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tracemalloc
import time
from pathlib import Path
from typing import Any, Callable, Sequence

RESULTS_DIR = Path(__file__).resolve().parent / "results"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def pin_blas_threads() -> str:
    """Give every BLAS thread variable the value of the first one set (or 1), so NumPy
    (hence minigraph) and PyTorch get as many BLAS threads. Call it before NumPy is
    imported: BLAS reads the variables when it loads. Returns the number, as text."""
    threads = next((os.environ[v] for v in THREAD_VARS if os.environ.get(v)), "1")
    for var in THREAD_VARS:
        os.environ.setdefault(var, threads)
    return threads


def _openblas(name: str) -> Any:
    """A function of NumPy's bundled OpenBLAS (``get_num_threads``, ``set_num_threads``)
    found with ctypes, or None (another BLAS, or a NumPy without a bundled one)."""
    import numpy as np

    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*")):
        try:
            lib = ctypes.CDLL(path)  # already loaded by NumPy: the same handle
        except OSError:
            continue
        for symbol in (f"scipy_openblas_{name}64_", f"scipy_openblas_{name}",
                       f"openblas_{name}64_", f"openblas_{name}"):
            fn = getattr(lib, symbol, None)
            if fn is not None:
                return fn
    return None


def openblas_threads() -> int | None:
    """The thread count NumPy's bundled OpenBLAS reports, or None if not found."""
    fn = _openblas("get_num_threads")
    if fn is None:
        return None
    fn.restype = ctypes.c_int
    return int(fn())


@contextlib.contextmanager
def blas_threads(n: int) -> Any:
    """BLAS at ``n`` threads for the block, then as it was; yields how it was done.

    The thread variables only count before NumPy is loaded; under ``minigraph bench``
    minigraph has loaded it, so the pool is resized at run time: with threadpoolctl
    where installed, and through NumPy's bundled OpenBLAS (ctypes) otherwise.
    """
    how = []
    with contextlib.ExitStack() as stack:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            threadpool_limits = None
        before, setter = openblas_threads(), _openblas("set_num_threads")
        if threadpool_limits is not None:
            stack.enter_context(threadpool_limits(n))
            how.append(f"threadpoolctl.threadpool_limits({n})")
        elif before not in (None, n) and setter is not None:
            setter.argtypes = [ctypes.c_int]
            setter(n)
            stack.callback(setter, before)
            how.append(f"ctypes openblas_set_num_threads({n}), from {before}")
        elif before == n:
            how.append(f"OpenBLAS already at {n} thread(s)")
        yield how


DEVICE_VAR = "MINIGRAPH_BENCH_DEVICE"  # set by minigraph/bench.py (not imported here: it
                                       # would load NumPy before pin_blas_threads runs)


def bench_device() -> str:
    """The device the suite runs on: ``cpu`` unless ``minigraph bench --device`` says."""
    return os.environ.get(DEVICE_VAR, "cpu")


def on_gpu() -> bool:
    return bench_device().startswith("cuda")


def cpu_only(what: str) -> bool:
    """For a script that measures the CPU only: on another device, say so and skip."""
    if not on_gpu():
        return False
    print(f"{bench_device()}: skipped; {what}")
    return True


def synchronizer() -> Callable[[], None] | None:
    """A function that waits for the benchmark device's queued work, or None on a CPU.

    A GPU call returns once its kernel is queued (chapter 01, section 7), so a clock
    read after it measures the launch only. CuPy's ``Device.synchronize`` (behind
    ``mg.Device.synchronize``) waits for every stream of the GPU, PyTorch's too.
    """
    if not on_gpu():
        return None
    import minigraph as mg

    return mg.device(bench_device()).synchronize


def array_library() -> Any:
    """The hand-written anchor's array library on the benchmark device: NumPy, or CuPy
    on a GPU (whose functions are NumPy's, so the anchor's code is the same). CuPy makes
    arrays on its *current* GPU: for ``cuda:N`` that is made GPU N here, where
    minigraph's and PyTorch's tensors live and where the timings synchronise."""
    if on_gpu():
        import cupy
        index = bench_device().partition(":")[2] or "0"
        cupy.cuda.Device(int(index)).use()
        return cupy
    import numpy
    return numpy


def torch_device() -> str | None:
    """PyTorch's name for the benchmark device, or None where PyTorch is not installed
    or has no CUDA."""
    if not have_torch():
        return None
    if not on_gpu():
        return "cpu"
    import torch
    return bench_device() if torch.cuda.is_available() else None


def to_host(value: Any) -> Any:
    """A minigraph tensor, a PyTorch tensor, a CuPy or NumPy value as a NumPy array (a
    copy from a GPU; on the CPU it may share the value's memory)."""
    import numpy

    import minigraph

    if isinstance(value, minigraph.Tensor):
        return value.numpy()
    if hasattr(value, "detach"):  # PyTorch
        return value.detach().cpu().numpy()
    if hasattr(value, "get"):  # CuPy
        return value.get()
    return numpy.asarray(value)


def to_float(value: Any) -> float:
    """A scalar result (a tensor, an array, a NumPy or Python number) as a Python float."""
    return value.item() if hasattr(value, "item") else float(value)


def relative_error(got: Any, want: Any) -> float:
    """max |got - want| / max |want|: one number per array, robust to zeros in ``want``
    (both may be minigraph, PyTorch, CuPy or NumPy values)."""
    import numpy

    got = numpy.asarray(to_host(got), dtype=numpy.float64)
    want = numpy.asarray(to_host(want), dtype=numpy.float64)
    scale = max(float(numpy.max(numpy.abs(want))), 1e-30)
    return float(numpy.max(numpy.abs(got - want))) / scale


def check_close(name: str, got: Any, want: Any, rtol: float) -> float:
    """Fail, before anything is timed, when ``got`` has not ``want``'s shape or is not
    ``want`` to ``rtol``; return the relative error."""
    import numpy

    shapes = numpy.shape(to_host(got)), numpy.shape(to_host(want))
    assert shapes[0] == shapes[1], f"{name}: shape {shapes[0]}, expected {shapes[1]}"
    err = relative_error(got, want)
    assert err <= rtol, f"{name}: relative error {err:.2e} > {rtol:.0e}"
    return err


def result_name(base: str) -> str:
    """``base`` on the CPU, ``base-cuda0`` on cuda:0: a device run's JSON and PNG do not
    overwrite the CPU run's (``minigraph bench`` names its text output alike)."""
    device = bench_device()
    return base if device == "cpu" else f"{base}-{device.replace(':', '')}"


def run_batch(fn: Callable[[], Any], number: int, sync: Callable[[], None] | None = None) -> float:
    """Seconds taken by ``number`` calls of ``fn`` (with ``sync``: from an idle device
    until the device has finished them)."""
    if sync is not None:
        sync()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    if sync is not None:
        sync()
    return time.perf_counter() - start


def timeit(fn: Callable[[], Any], repeat: int = 7, number: int | None = None,
           min_time: float = 0.1) -> float:
    """Median seconds per call of ``fn`` over ``repeat`` measurements.

    With ``number=None`` the number of calls per measurement doubles until one
    measurement lasts at least ``min_time`` seconds (so 0.1-0.2 s by default), which
    makes the timer's own resolution and the loop's overhead negligible.
    """
    if number is None:
        number = calibrate(fn, min_time)  # (with its warm-up call)
    else:
        fn()  # warm-up: first-call costs (imports, caches) are not what we measure
    return statistics.median(run_batch(fn, number) / number for _ in range(repeat))


CLEAN = 0.9  # a measurement is clean if the process was on a CPU >= 90% of its wall time


def calibrate(fn: Callable[[], Any], seconds: float,
              sync: Callable[[], None] | None = None) -> int:
    """How many calls of ``fn`` last at least ``seconds`` (a power of two; after a
    warm-up call, since first-call costs are not what we measure)."""
    fn()
    number = 1
    while run_batch(fn, number, sync) < seconds:
        number *= 2
    return number


def measure(methods: dict[str, Callable[[], Any]], anchor: str | None = None,
            rounds: int = 31, batch: float = 0.02, sync: Callable[[], None] | None = None
            ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Time every method in ``rounds`` finely interleaved rounds.

    A *round* times one batch of calls of every method (each batch lasts about ``batch``
    seconds), in an order that rotates from round to round. A method and its anchor are
    thus measured a few milliseconds apart, so a slow phase of a shared machine (which
    lasts seconds) hits both alike, and their ratio *within a round* is steady even when
    the absolute times drift by tens of percent.

    Each measurement also records its *CPU share*: process CPU time over wall time. With
    one thread it is about 1 on an idle machine and drops when another process takes the
    CPU away; such a measurement is not *clean*. A method's numbers use the rounds where
    both it and the anchor were clean (all rounds if fewer than 3). With ``sync`` (a
    GPU, see :func:`synchronizer`) every batch is timed from an idle device to a
    finished one, and every round counts: time spent waiting for the GPU is not CPU time.

    Returns per method ``seconds`` (median over the rounds used), ``rounds`` (every
    round's time), ``cpu_share``, ``rounds_used``, ``ratio`` (median over the rounds used
    of method / anchor within the round; None without an anchor) and ``best_ratio`` (the
    method's fastest round over the anchor's fastest), and a summary of the rounds.
    """
    names = list(methods)
    numbers = {name: calibrate(methods[name], batch, sync) for name in names}
    clean = CLEAN if sync is None else 0.0
    times: dict[str, list[float]] = {name: [] for name in names}
    shares: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        progress(r, rounds)
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu = time.perf_counter(), time.process_time()
            times[name].append(run_batch(methods[name], numbers[name], sync) / numbers[name])
            shares[name].append((time.process_time() - cpu) / (time.perf_counter() - wall))
    progress(rounds, rounds)
    results, used_counts, fell_back = {}, [], 0
    for name in names:
        ref = anchor if anchor in methods else name
        used = [r for r in range(rounds) if min(shares[name][r], shares[ref][r]) >= clean]
        if len(used) < 3:
            used, fell_back = list(range(rounds)), fell_back + 1
        used_counts.append(len(used))
        mine = [times[name][r] for r in used]
        ratio = best = None
        if anchor in methods:
            ratio = statistics.median(times[name][r] / times[anchor][r] for r in used)
            best = min(mine) / min(times[anchor][r] for r in used)
        results[name] = {"seconds": statistics.median(mine), "rounds": times[name],
                         "cpu_share": shares[name], "rounds_used": used,
                         "ratio": ratio, "best_ratio": best}
    all_shares = [x for v in shares.values() for x in v]
    summary = {"rounds": rounds, "batch_seconds": batch, "min_cpu_share": min(all_shares),
               "clean_measurements": sum(x >= clean for x in all_shares),
               "measurements": len(all_shares), "min_rounds_used": min(used_counts),
               "methods_on_all_rounds": fell_back, "cpu_filter": sync is None}
    return results, summary


def progress(done: int, total: int, width: int = 30) -> None:
    """A progress bar on the terminal (stderr, redrawn in place; erased when done).
    Nothing is written when stderr is not a terminal (CI logs, files)."""
    if not sys.stderr.isatty():
        return
    if done >= total:
        sys.stderr.write("\r" + " " * (width + 24) + "\r")
    else:
        bar = "#" * (width * done // total)
        sys.stderr.write(f"\r  measuring [{bar:<{width}}] {done}/{total} rounds")
    sys.stderr.flush()


def print_rounds(summary: dict[str, Any]) -> None:
    """One line on how clean the interleaved rounds of :func:`measure` were."""
    if not summary.get("cpu_filter", True):
        print(f"rounds: {summary['rounds']} of ~{summary['batch_seconds'] * 1e3:.0f} ms "
              f"batches, every one used (synchronised with the GPU: time spent waiting "
              f"for it is not CPU time)")
        return
    print(f"rounds: {summary['rounds']} of ~{summary['batch_seconds'] * 1e3:.0f} ms batches; "
          f"clean measurements (on a CPU >= {CLEAN:.0%} of the time): "
          f"{summary['clean_measurements']} of {summary['measurements']}, lowest CPU share "
          f"{summary['min_cpu_share']:.0%}")
    if summary["clean_measurements"] < summary["measurements"]:
        print("  note: other processes took the CPU during some measurements; ratios use "
              "the rounds where method and anchor were both clean"
              + (f" (all rounds for {summary['methods_on_all_rounds']} methods with fewer "
                 "than 3 clean rounds)" if summary["methods_on_all_rounds"] else ""))


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


def cpu_model() -> str:
    """The processor's name (Linux: /proc/cpuinfo; macOS: sysctl), or what platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or platform.processor()
    except (OSError, subprocess.SubprocessError):
        return platform.processor()


def minigraph_commit() -> str | None:
    """The git commit of the minigraph checkout the benchmarks run from, if there is one."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment() -> dict[str, Any]:
    """What the numbers depend on: versions, machine, cores, thread settings."""
    import numpy as np

    import minigraph

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "torch": "not installed",
        "minigraph": minigraph.__version__,
        "commit": minigraph_commit(),
        "cpu": cpu_model(),
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


def describe(env: dict[str, Any]) -> str:
    """The first line of every script's output: what ran, on what."""
    commit = f" ({env['commit']})" if env.get("commit") else ""
    return (f"minigraph {env['minigraph']}{commit}, python {env['python']}, numpy "
            f"{env['numpy']}, torch {env['torch']}; {env['cpu'] or env['machine']}, "
            f"{env['cpu_count']} cores")


def fmt(x: float | None, digits: int = 2) -> str:
    """A number for a table, or "-" when missing."""
    return "-" if x is None else f"{x:.{digits}f}"


def allocated_peak(fn: Callable[[], Any], warm_up: bool = True) -> int:
    """The most bytes allocated at once during one call of ``fn``, above what was
    allocated before it, by ``tracemalloc`` (NumPy reports its buffers to it; Python
    objects count too, a few kB). A first call, not measured, warms caches and plans
    up; the measured call's result is dropped only after the measurement."""
    if warm_up:
        fn()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    del result
    return peak
