"""Running the graded tests: the grader's process, the sandbox, and nothing in between.

:func:`run_tests` starts :mod:`minigraph.grading.harness` (a trusted Python process that
runs pytest on the course's test file) with a private folder (mode 0700) holding the test
file, a configuration and, at the end, the results the harness writes. The harness runs
the student's exercises.py in the sandbox (:mod:`.proxy`, :mod:`.isolation`), where

- an exception in the student's code fails the test it happens in, with a message
  pointing into exercises.py;
- a call running past ``timeout`` is interrupted (SIGUSR1 raises in the student's code,
  pointing at the line it was running); if it does not give control back within
  ``GRACE`` seconds, the sandbox and all its processes are killed;
- a crash (``os._exit``, a segfault, the memory limit) fails the test it happens in;
  the next test starts a fresh sandbox (the import is done again there);
- an import that fails (an error, ``sys.exit``, a crash, a loop) is remembered: every
  test fails at once with the same message, at the cost of one sandbox start;
- the whole submission may spend ``total_timeout`` seconds in the student's code; after
  that, the remaining tests fail at once.

The harness itself runs only course code, so it needs no such care; :func:`run_tests`
still stops it after a generous wall-clock limit, and a harness that produced no results
is reported as such (never a silent verdict).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from minigraph.grading import isolation
from minigraph.grading.collect import base_nodeid, declared_tests
from minigraph.grading.messages import describe_exit
from minigraph.grading.proxy import GRACE, STARTUP_LIMIT

@dataclass
class TestOutcome:
    nodeid: str
    points: float
    status: str          # "passed" or "failed"
    output: str          # short message for a failure, "" for a pass
    problem: str = ""    # something wrong with the test itself (e.g. no points marker)
    hidden: bool = False # graded, shown to the student after the grades are published


@dataclass
class RunResult:
    outcomes: list[TestOutcome]
    notes: list[str] = field(default_factory=list)   # things that concern every test
    processes: int = 0                                # pytest processes started
    log: str = ""                                     # the last process's output


def run_tests(test_file: Path, exercises: Path, *, timeout: float, total_timeout: float,
              memory_mb: int = 2048, isolate: bool = True) -> RunResult:
    """Run the graded tests of ``test_file`` against the student's ``exercises``; one
    outcome per test, in collection order."""
    private = isolation.private_dir("minigraph-grade-")
    try:
        tests_dir = private / "tests"
        tests_dir.mkdir(mode=0o700)
        local_tests = tests_dir / test_file.name
        local_tests.write_bytes(Path(test_file).read_bytes())
        results_path = private / "results.json"
        # (the student's path as given, not resolved: the copy for the sandbox follows no link)
        config = {"test_file": str(local_tests), "exercises": os.path.abspath(exercises),
                  "timeout": timeout, "total_timeout": total_timeout, "memory_mb": memory_mb,
                  "isolate": isolate, "workdir": str(private), "results": str(results_path),
                  # where the account's files are looked for (found once per process,
                  # here: a walk of the machine's folders)
                  "shared": list(isolation.shared_folders())
                  if isolate and isolation.is_root() else []}
        # The sandbox's account may pass through this folder (mode 0711) to its own, and
        # knows these names: the configuration names the submission's path, the log quotes
        # the failing tests' source (hidden tests' expected values included). Mode 0600.
        with os.fdopen(isolation.new_file(private / "config.json", os.O_WRONLY), "w",
                       encoding="utf-8") as f:
            f.write(json.dumps(config))
        log_path = private / "harness.log"
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        limit = total_timeout + STARTUP_LIMIT + 60.0 + GRACE
        with os.fdopen(isolation.new_file(log_path, os.O_WRONLY), "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "minigraph.grading.harness",
                                     str(private / "config.json")], cwd=private, env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            try:
                proc.wait(limit)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                isolation.kill_unclaimed_accounts()  # (its sandboxes' daemons, if any)
        log_text = log_path.read_text(encoding="utf-8", errors="replace")
        try:
            data = json.loads(results_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        result = _outcomes(data, test_file, proc.returncode, log_text)
    finally:
        try:
            isolation.remove_trees([private])
            left = ""
        except OSError as exc:  # (said beside the verdict, never instead of it)
            left = f"the grader could not remove its folder {private}: {exc}"
    if left:
        result.notes.append(left)
    return result


def _outcomes(data: dict | None, test_file: Path, returncode: int | None,
              log_text: str) -> RunResult:
    notes: list[str] = []
    if data is None:
        why = f"the grader's test process stopped ({describe_exit(returncode)}) without results"
        notes.append(f"{why}\n{_tail(log_text)}")
        declared = _declared(test_file)
        return RunResult([TestOutcome(d.nodeid, d.points, "failed", f"not graded: {why}",
                                      "" if d.marked else "no points marker") for d in declared],
                         notes, 0, log_text)
    outcomes = []
    for t in data["tests"]:
        status, output = data["outcomes"].get(t["nodeid"], ("failed", "the test did not report a result"))
        outcomes.append(TestOutcome(t["nodeid"], t["points"], status, output, t.get("problem", ""),
                                    bool(t.get("hidden"))))
    errors = data.get("errors", [])
    if errors or not data["tests"] and data.get("exit_code") not in (0, 5):
        why = "; ".join(e["message"] for e in errors) or f"pytest exited with {data.get('exit_code')}"
        collection_failed = f"the graded tests could not be collected: {why}"
        notes.append(collection_failed)
        seen = {base_nodeid(o.nodeid) for o in outcomes}
        outcomes += [TestOutcome(d.nodeid, d.points, "failed", collection_failed,
                                 "" if d.marked else "no points marker")
                     for d in _declared(test_file) if d.nodeid not in seen]
    if data.get("left"):  # what the sandbox left and the grader could not remove
        notes.append(str(data["left"]))
    return RunResult(outcomes, notes, int(data.get("processes", 0)), log_text)


def _declared(test_file: Path):
    try:
        return declared_tests(test_file, nodeid_prefix=Path(test_file).name)
    except (SyntaxError, OSError):
        return []


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
