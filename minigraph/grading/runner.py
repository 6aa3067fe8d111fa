"""Running graded tests so that nothing a student writes can stop the grading.

One pytest process runs the tests one after the other, with the grading plugin
(:mod:`minigraph.grading.plugin`) writing a line to an events file as each test starts
and ends. This module watches that file and the process:

- a test that raises, fails an assert or is interrupted by pytest-timeout (``--timeout``,
  signal method) simply fails; the process goes on with the next test;
- a test still running ``timeout + grace`` seconds after it started (its code swallowed
  pytest-timeout's exception, or sat in C code that never returns to Python, or
  pytest-timeout is not installed) gets its process group killed;
- when the process dies (``os._exit``, a segfault, ``KeyboardInterrupt``, the kill above),
  the test that was running is marked failed with the reason, and a new pytest process is
  started for the tests that have not run yet (``--minigraph-skip`` lists those done);
- when the death happened while ``exercises.py`` was being imported, that is the
  student's module crashing at import: the new process is told so
  (``--minigraph-import-failed``), and every test needing the module fails at once with
  the same message instead of crashing the process once per test.

Why not pytest-xdist (``-n 2 --max-worker-restart``)? It also survives a crashing
worker, but: it starts two or more interpreters that each import NumPy and minigraph
before the first test (the slowest part of grading a chapter with a handful of short
tests), its crash report is a generic "worker 'gw0' crashed", it cannot tell a crash at
import from a crash in a test, and a test that swallows the timeout signal hangs the run
unless the timeout method kills the worker. Here the common case costs one interpreter,
a crash costs one restart, a hang costs the timeout plus ``grace`` and one restart, and
the messages say which of these happened.

The process runs in its own session (process group) with output going to a log file,
never a pipe, so grandchildren the student started can neither keep the grader waiting
on a pipe nor outlive the grading: the whole group is killed at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from minigraph.grading.collect import base_nodeid, declared_tests
from minigraph.grading.messages import describe_exit

#: seconds a test may run past --timeout before its process is killed
GRACE = 2.0
#: seconds pytest may take to start and collect before the grader gives up
STARTUP_LIMIT = 120.0
#: seconds a process may linger after its session finished (threads left running)
LINGER_LIMIT = 1.0
POLL = 0.02


@dataclass
class TestOutcome:
    nodeid: str
    points: float
    status: str          # "passed" or "failed"
    output: str          # short message for a failure, "" for a pass
    problem: str = ""    # something wrong with the test itself (e.g. no points marker)


@dataclass
class RunResult:
    outcomes: list[TestOutcome]
    notes: list[str] = field(default_factory=list)   # things that concern every test
    processes: int = 0                                # pytest processes started
    log: str = ""                                     # the last process's output


def have_pytest_timeout(python: str = sys.executable) -> bool:
    if python == sys.executable:
        try:
            import pytest_timeout  # noqa: F401
            return True
        except ImportError:
            return False
    probe = subprocess.run([python, "-c", "import pytest_timeout"], capture_output=True)
    return probe.returncode == 0


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        env.pop(name, None)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"   # only the plugins named on the command line
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("MPLBACKEND", "Agg")
    # make minigraph importable in the child even when it is run from a source checkout
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class _Events:
    """Reads the complete lines appended to the events file so far."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the test process and everything it started (its own process group)."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        elif proc.poll() is None:  # pragma: no cover - Windows: no process groups here
            proc.kill()
    except OSError:
        pass


@dataclass
class _Process:
    """What one pytest process did, as far as the grader could see."""
    returncode: int | None = None
    collected: list[dict] | None = None     # the "collected" event's tests
    collect_errors: list[dict] = field(default_factory=list)
    results: dict[str, tuple[str, str]] = field(default_factory=dict)
    current: str | None = None              # the test running when the process stopped
    importing: bool = False                 # ... while it was importing exercises.py
    finished: bool = False                  # pytest wrapped up its session
    killed: str | None = None               # "timeout", "startup", "linger": why we killed it


def _run_once(cmd: list[str], workdir: Path, env: dict, events_path: Path, log_path: Path, *,
              timeout: float, grace: float, startup_limit: float) -> _Process:
    """Start one pytest process and follow its events until it ends (or is killed)."""
    seen = _Process()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        reader = _Events(events_path)
        started = time.monotonic()
        current_since = finished_at = 0.0
        try:
            while True:
                returncode = proc.poll()  # before reading: no event can be missed
                now = time.monotonic()
                for event in reader.read():
                    kind = event.get("event")
                    if kind == "collected":
                        seen.collected = event.get("tests", [])
                        seen.collect_errors = event.get("errors", [])
                    elif kind == "start":
                        seen.current, current_since, seen.importing = event["nodeid"], now, False
                    elif kind in ("import-start", "import-end"):
                        seen.importing = kind == "import-start"
                    elif kind == "result":
                        seen.results[event["nodeid"]] = (event["status"], event.get("output", ""))
                        seen.current = None
                    elif kind == "finished":
                        seen.finished, finished_at = True, now
                if returncode is not None:
                    break
                if seen.current is not None and now - current_since > timeout + grace:
                    seen.killed = "timeout"
                elif seen.collected is None and now - started > startup_limit:
                    seen.killed = "startup"
                elif seen.finished and now - finished_at > LINGER_LIMIT:
                    seen.killed = "linger"  # threads the student left running; all is recorded
                if seen.killed:
                    _kill_group(proc)
                    proc.wait()
                    continue  # read the last events, then leave through poll()
                time.sleep(POLL)
        finally:
            _kill_group(proc)  # whatever the student's code left running
            if proc.poll() is None:
                proc.wait()
    seen.returncode = proc.returncode
    return seen


def _why_it_stopped(run: _Process, timeout: float) -> str:
    """Why the test that was running when the process stopped failed."""
    exit_status = describe_exit(run.returncode)
    if run.importing:
        if run.killed == "timeout":
            return (f"exercises.py could not be imported: importing it took longer than "
                    f"{timeout:g} s (a loop at module level?)")
        return f"exercises.py could not be imported: it crashed the process ({exit_status})"
    if run.finished:
        return "the test ended the whole test session (KeyboardInterrupt, pytest.exit, ...)"
    if run.killed == "timeout":
        return (f"timed out: still running after {timeout:g} s, and it did not stop when "
                "interrupted (does it catch every exception?), so the grader stopped the "
                "test process")
    return f"crashed: {exit_status} (os._exit, a segfault, ...)"


def run_tests(workdir: Path, test_file: str, *, timeout: float, python: str = sys.executable,
              grace: float = GRACE, startup_limit: float = STARTUP_LIMIT,
              use_pytest_timeout: bool | None = None) -> RunResult:
    """Run the graded tests of ``workdir/test_file`` (which imports the ``exercises.py``
    beside it) and return one outcome per test, in collection order.
    ``use_pytest_timeout``: None uses pytest-timeout if it is installed."""
    workdir = Path(workdir)
    use_timeout = have_pytest_timeout(python) if use_pytest_timeout is None else use_pytest_timeout
    ini = workdir / ".minigraph-pytest.ini"
    ini.write_text("[pytest]\n", encoding="utf-8")
    skip_file = workdir / ".minigraph-skip"
    env = _environment()

    tests: list[dict] | None = None        # from the first process's collection
    collect_errors: list[dict] = []
    results: dict[str, tuple[str, str]] = {}
    import_failed: str | None = None
    notes: list[str] = []
    if not use_timeout:
        notes.append("pytest-timeout is not installed: a test that runs past the timeout is "
                     "stopped by killing its process, which is slower")
    collection_failed: str | None = None
    processes = 0
    log_text = ""

    while True:
        processes += 1
        skip_file.write_text("".join(f"{n}\n" for n in results), encoding="utf-8")
        events_path = workdir / f".minigraph-events-{processes}.jsonl"
        log_path = workdir / f".minigraph-pytest-{processes}.log"
        cmd = [python, "-m", "pytest", test_file, "-q", "-c", str(ini), "--rootdir", str(workdir),
               "--confcutdir", str(workdir), "-p", "no:cacheprovider",
               "--continue-on-collection-errors",
               "-p", "minigraph.grading.plugin", "--minigraph-events", str(events_path),
               "--minigraph-skip", str(skip_file)]
        if use_timeout:
            cmd += ["-p", "pytest_timeout", f"--timeout={timeout:g}"]
            if hasattr(signal, "SIGALRM"):  # interrupt the test and go on (POSIX)
                cmd += ["--timeout-method=signal"]
        if import_failed:
            cmd += ["--minigraph-import-failed", import_failed]
        run = _run_once(cmd, workdir, env, events_path, log_path, timeout=timeout,
                        grace=grace, startup_limit=startup_limit)
        log_text = log_path.read_text(encoding="utf-8", errors="replace")

        if tests is None and run.collected is not None:
            tests, collect_errors = run.collected, run.collect_errors
        left_before = None if tests is None else sum(t["nodeid"] not in results for t in tests)
        results.update(run.results)
        if run.current is not None:
            reason = _why_it_stopped(run, timeout)
            results[run.current] = ("failed", reason)
            if run.importing:
                import_failed = reason  # the next process fails the import at once

        if tests is None:  # the process stopped before collection ended
            why = (f"collecting them took longer than {startup_limit:g} s" if run.killed == "startup"
                   else f"{describe_exit(run.returncode)} before they were collected")
            collection_failed = f"the graded tests could not be collected: {why}"
            notes.append(f"{collection_failed}\n{_tail(log_text)}")
            tests = []
            break
        remaining = [t for t in tests if t["nodeid"] not in results]
        if remaining and left_before is not None and len(remaining) >= left_before:
            # no progress: the same tests would not run next time either
            why = "; ".join(e["message"] for e in collect_errors) or describe_exit(run.returncode)
            for t in remaining:
                results[t["nodeid"]] = ("failed", f"not run: {why}")
            remaining = []
        if not remaining:
            break

    outcomes = [TestOutcome(t["nodeid"], t["points"], *results[t["nodeid"]], t.get("problem", ""))
                for t in tests]
    if collect_errors:
        collection_failed = ("the graded tests could not be collected: "
                             + "; ".join(e["message"] for e in collect_errors))
        notes.append(collection_failed)
    if collection_failed:
        # the report still lists every test the file declares, each failing with the reason
        seen = {base_nodeid(o.nodeid) for o in outcomes}
        try:
            declared = declared_tests(workdir / test_file)
        except SyntaxError:
            declared = []
        outcomes += [TestOutcome(d.nodeid, d.points, "failed", collection_failed,
                                 "" if d.marked else "no points marker")
                     for d in declared if d.nodeid not in seen]
    # scratch paths mean nothing to the reader
    prefix = str(workdir) + os.sep
    for o in outcomes:
        o.output = o.output.replace(prefix, "")
    return RunResult(outcomes, [n.replace(prefix, "") for n in notes], processes, log_text)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
