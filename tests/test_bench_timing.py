"""The benchmarks' timing helper (benchmarks/common.py): what a GPU timing relies on.

A GPU call returns before its kernel has run, so every timed batch must start from an
idle device and end with a finished one: ``sync`` before the clock starts and before it
stops. The events below are the order in which ``measure`` calls things.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "common.py"
_SPEC = importlib.util.spec_from_file_location("benchmarks_common", _PATH)
common = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(common)  # (benchmarks/ is not a package)


def test_every_timed_batch_is_framed_by_two_synchronisations():
    events: list[str] = []

    def sync() -> None:  # waiting for a device: wall time that is not this process's CPU time
        events.append("sync")
        time.sleep(0.002)

    results, summary = common.measure({"f": lambda: events.append("call")}, anchor="f",
                                      rounds=3, batch=0.001, sync=sync)
    assert events[0] == "call"  # calibrate's warm-up call, not timed
    batches, rest = 0, events[1:]
    while rest:  # every timed batch: sync, one or more calls, sync
        assert rest[0] == "sync", rest[:3]
        calls = next(k for k, e in enumerate(rest[1:], 1) if e == "sync") - 1
        assert calls >= 1
        rest, batches = rest[calls + 2:], batches + 1
    assert batches >= 3 + 1  # the three rounds, after at least one calibration batch
    # waiting for the GPU is not a busy machine: no round is dropped for its low CPU share
    assert summary["clean_measurements"] == summary["measurements"] == 3
    assert results["f"]["rounds_used"] == [0, 1, 2] and not summary["cpu_filter"]


def test_without_a_device_nothing_synchronises(monkeypatch):
    monkeypatch.delenv(common.DEVICE_VAR, raising=False)
    assert common.bench_device() == "cpu" and common.synchronizer() is None
    assert common.result_name("graph") == "graph"
    monkeypatch.setenv(common.DEVICE_VAR, "cuda:0")
    assert common.on_gpu() and common.result_name("graph") == "graph-cuda0"


def test_minigraph_bench_and_the_scripts_agree_on_the_device_and_the_skip_line(monkeypatch,
                                                                               capsys):
    from minigraph import bench

    assert bench.DEVICE_VAR == common.DEVICE_VAR  # bench sets what the scripts read
    monkeypatch.setenv(common.DEVICE_VAR, "cuda:0")
    assert common.cpu_only("it measures CPU cores")
    # bench.py drops a skipped script's output by this first line (no section on the page)
    assert capsys.readouterr().out.startswith("cuda:0: skipped; it measures CPU cores")
    monkeypatch.setenv(common.DEVICE_VAR, "cpu")
    assert not common.cpu_only("it measures CPU cores")


# the scripts that measure arrays on the benchmark device; the others measure the CPU
_ON_THE_DEVICE = {"bench_eager", "bench_graph", "bench_modes"}


def test_every_cpu_only_script_says_why_it_skips_a_gpu_before_doing_anything():
    """bench_mpi started mpiexec on a GPU machine (and failed there as root) where the
    other CPU-only scripts said why they skip; run each one as `minigraph bench --device
    cuda:0` would, on a machine without CuPy: its first line is the skip and its reason."""
    import os
    import subprocess
    import sys

    scripts = sorted(_PATH.parent.glob("bench_*.py"))
    assert _ON_THE_DEVICE <= {p.stem for p in scripts}
    for script in scripts:
        if script.stem in _ON_THE_DEVICE:
            continue
        env = {**os.environ, common.DEVICE_VAR: "cuda:0"}
        out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, (script.stem, out.stderr[-2000:])
        first = out.stdout.split("\n", 1)[0]
        assert first.startswith("cuda:0: skipped; "), (script.stem, first)
        reason = first[len("cuda:0: skipped; "):]
        assert len(reason.split()) >= 5, (script.stem, reason)  # a reason, not a name
