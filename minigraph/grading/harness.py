"""The grader's own process: runs the course's tests and writes the verdicts.

``python -m minigraph.grading.harness CONFIG_JSON`` is started by :func:`.runner.run_tests`.
It runs pytest *in this process* on the course's test file (copied into the grader's
private folder), so the tests, their oracles and their assertions run here, where the
student's code never does; the ``exercises`` fixture reaches the student's code through
the sandbox (:mod:`.proxy`). When pytest is done, the sandbox and every process it
started are ended, and only then are the outcomes written to the results file, in the
private folder that the sandbox's account cannot write.

The process makes itself undumpable (``PR_SET_DUMPABLE`` 0: no ptrace or /proc/PID/mem
by a process of the same user) and a child subreaper (orphans of the sandbox come back
to it, to be ended).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from minigraph.grading import isolation
from minigraph.grading.loader import HARNESS
from minigraph.grading.plugin import Collector
from minigraph.grading.proxy import Sandbox, SandboxSettings


class Harness:
    """Registered as a pytest plugin named ``HARNESS``: the fixture finds the sandbox here."""

    name = HARNESS

    def __init__(self, sandbox: Sandbox, collector: Collector):
        self.sandbox, self.collector = sandbox, collector

    def pytest_collection_finish(self, session):
        from minigraph.grading.plugin import forbidden_of
        # wrapped before exercises.py is imported: `from minigraph import softmax` then
        # binds the guarded function
        self.sandbox.guard = sorted({n for item in session.items for n in forbidden_of(item)[0]})


def end_sandbox(sandbox: Sandbox) -> str:
    """End the sandbox and every process it started, and remove what it left; return
    what could not be removed ("" when nothing): the results are written all the same,
    with this beside them, never lost to it."""
    try:
        sandbox.close()
    except Exception as exc:  # (OSError from rm or ipcrm, or a bug of the grader's)
        return f"the grader could not remove all that the sandbox left: {exc}"
    finally:
        isolation.kill_descendants()
    return ""


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    isolation.prctl(isolation.PR_SET_DUMPABLE, 0)
    isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)
    limits = isolation.Limits(memory_mb=int(config["memory_mb"]),
                              cpu_seconds=int(config["total_timeout"]) + 5)
    settings = SandboxSettings(exercises=Path(config["exercises"]), timeout=config["timeout"],
                               total_timeout=config["total_timeout"], limits=limits,
                               isolate=config.get("isolate", True),
                               workdir=Path(config["workdir"]),
                               shared=tuple(config.get("shared") or ()) or None)
    sandbox = Sandbox(settings)
    sandbox.spawn()  # its interpreter starts while pytest collects the tests
    collector = Collector()
    import pytest
    folder = Path(config["test_file"]).parent
    ini = folder / "pytest.ini"
    ini.write_text("[pytest]\n", encoding="utf-8")
    args = [config["test_file"], "-q", "-c", str(ini), "--rootdir", str(folder),
            "--confcutdir", str(folder), "-p", "no:cacheprovider", "-p", "no:randomly",
            "--continue-on-collection-errors", "-p", "minigraph.grading.plugin",
            "--import-mode=importlib", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    try:
        exit_code = pytest.main(args, plugins=[collector, Harness(sandbox, collector)])
    finally:
        left = end_sandbox(sandbox)
    results = {"tests": collector.tests, "errors": collector.collect_errors,
               "outcomes": collector.outcomes, "processes": sandbox.processes,
               "exit_code": int(exit_code), "used": sandbox.used, "left": left}
    target = Path(config["results"])
    temporary = target.with_suffix(".tmp")
    # (mode 0600, made new: the sandbox's account passes through this folder)
    with os.fdopen(isolation.new_file(temporary, os.O_WRONLY), "w", encoding="utf-8") as f:
        f.write(json.dumps(results))
    os.replace(temporary, target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
