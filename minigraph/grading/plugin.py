"""The pytest plugin of the grader: the ``points`` marker, and a record of each test.

Loaded with ``-p minigraph.grading.plugin`` (the grader does this). It

- registers the marker ``@pytest.mark.points(n)``, so ``--strict-markers`` accepts it;
- when given ``--minigraph-events FILE``, appends one JSON object per line to FILE as the
  session goes: ``collected`` (every test id with its points), ``start`` and ``result``
  for each test, ``import-start``/``import-end`` around the import of exercises.py (from
  :mod:`minigraph.grading.loader`) and ``finished``. Each line is written with a single
  ``os.write``, so it has reached the operating system before the next line of student
  code runs: when the process dies (``os._exit``, a segfault, a kill after a timeout),
  the grader still knows which test was running and which had finished;
- with ``--minigraph-skip FILE``, leaves out the tests listed in FILE (those already
  graded before a crash) so that the grader can resume after a crash;
- with ``--minigraph-import-failed MESSAGE``, makes the ``exercises`` fixture fail at once
  with MESSAGE (the grader already saw the import crash the process).

The outcome of a test is "passed" only when its setup, call and teardown all passed; a
skipped test scores 0 like a failed one (graded tests should not skip).
"""

from __future__ import annotations

import json
import numbers
import os
import time

import pytest

from minigraph.grading.messages import describe_exception, shorten

POINTS_MARKER = "points(n): the number of points a graded test is worth (minigraph grade)"

_RECORDER = "minigraph-grading-recorder"


def pytest_addoption(parser):
    group = parser.getgroup("minigraph-grading", "minigraph grading")
    group.addoption("--minigraph-events", metavar="FILE", default=None,
                    help="append a JSON line per collection, test start and test result to FILE")
    group.addoption("--minigraph-skip", metavar="FILE", default=None,
                    help="do not run the test ids listed in FILE (one a line)")
    group.addoption("--minigraph-import-failed", metavar="MESSAGE", default=None,
                    help="the exercises fixture fails at once with MESSAGE")


def pytest_configure(config):
    config.addinivalue_line("markers", POINTS_MARKER)
    events = config.getoption("minigraph_events", None)
    if events:
        config.pluginmanager.register(Recorder(config, events), _RECORDER)


def points_of(item) -> tuple[float, str]:
    """(points, problem) for a collected test: its ``points`` marker's number, or 0 and
    a description of what is wrong with the marker."""
    marker = item.get_closest_marker("points")
    if marker is None:
        return 0, "no @pytest.mark.points(n) marker: this test is worth 0 points"
    args = list(marker.args) + list(marker.kwargs.values())
    if len(args) != 1 or isinstance(args[0], bool) or not isinstance(args[0], numbers.Real) \
            or args[0] < 0:
        return 0, f"invalid points marker {marker.args or marker.kwargs}: expected one number >= 0"
    value = args[0]
    return (int(value) if float(value).is_integer() else float(value)), ""


# -- used by the loader of exercises.py ---------------------------------------------------

def emit(config, event: str, **fields) -> None:
    """Record ``event`` if the grader is listening (no-op under a plain pytest run)."""
    recorder = config.pluginmanager.get_plugin(_RECORDER) if config is not None else None
    if recorder is not None:
        recorder.emit(event, **fields)


def known_import_failure(config) -> str | None:
    return config.getoption("minigraph_import_failed", None) if config is not None else None


def timeout_of(config) -> float | None:
    if config is None:
        return None
    try:
        value = config.getoption("timeout", None)
    except ValueError:  # pytest-timeout not loaded
        return None
    try:
        return float(value) if value else None
    except (TypeError, ValueError):
        return None


class Recorder:
    """Writes the events file (see the module docstring)."""

    def __init__(self, config, path):
        self.config = config
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        skip = config.getoption("minigraph_skip", None)
        self.skip: set[str] = set()
        if skip and os.path.exists(skip):
            with open(skip, encoding="utf-8") as f:
                self.skip = {line.rstrip("\n") for line in f if line.strip()}
        self.collect_errors: list[dict] = []
        self.outcomes: dict[str, tuple[str, str]] = {}

    def emit(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "time": time.time(), **fields}) + "\n"
        os.write(self.fd, line.encode("utf-8"))

    # collection -------------------------------------------------------------------------

    def pytest_collectreport(self, report):
        if report.failed:
            text = getattr(report.longrepr, "reprcrash", None)
            message = text.message if text is not None else str(report.longrepr)
            if not message.strip():
                message = str(report.longrepr)
            self.collect_errors.append({"nodeid": report.nodeid,
                                        "message": shorten(message, max_lines=8)})

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if not self.skip:
            return
        keep = [item for item in items if item.nodeid not in self.skip]
        dropped = [item for item in items if item.nodeid in self.skip]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep

    def pytest_collection_finish(self, session):
        tests = []
        for item in session.items:
            points, problem = points_of(item)
            tests.append({"nodeid": item.nodeid, "points": points, "problem": problem})
        self.emit("collected", tests=tests, errors=self.collect_errors)

    # running ----------------------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid, location):
        self.emit("start", nodeid=nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        previous = self.outcomes.get(item.nodeid)
        if previous is not None and previous[0] != "passed":
            return report  # the first problem is the one to show
        if report.failed:
            try:
                message = self._message(call, report)
            except Exception:  # noqa: BLE001 - a message must never crash the test process
                message = shorten(str(report.longrepr))
            self.outcomes[item.nodeid] = ("failed", message)
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.outcomes[item.nodeid] = ("failed", f"skipped ({reason}): a skipped test scores 0")
        elif report.when == "call":
            self.outcomes[item.nodeid] = ("passed", "")
        return report

    def _message(self, call, report) -> str:
        excinfo = call.excinfo
        phase = {"setup": "", "call": "", "teardown": " (in the test's teardown)"}[report.when]
        if excinfo is None:
            return shorten(str(report.longrepr)) + phase
        return describe_exception(excinfo.value, timeout=timeout_of(self.config),
                                  exconly=excinfo.exconly()) + phase

    def pytest_runtest_logfinish(self, nodeid, location):
        status, message = self.outcomes.pop(nodeid, ("failed", "the test did not report a result"))
        self.emit("result", nodeid=nodeid, status=status, output=message)

    def pytest_sessionfinish(self, session, exitstatus):
        self.emit("finished", exitstatus=int(exitstatus))

    def pytest_unconfigure(self, config):
        try:
            os.close(self.fd)
        except OSError:
            pass
