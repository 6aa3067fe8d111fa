"""The pytest plugin of the grader: its markers, and the record of each test's outcome.

Loaded with ``-p minigraph.grading.plugin`` (a student running ``pytest`` in a released
chapter) or by :mod:`minigraph.grading.harness` (the grader), it registers the markers

- ``@pytest.mark.points(n)``: what a graded test is worth;
- ``@pytest.mark.hidden``: graded, reported with Gradescope's ``"visibility":
  "after_published"``, left out of the release;
- ``@pytest.mark.forbid("minigraph.softmax", ..., why="...")``: library functions the
  exercise's solution may not call; the sandbox refuses them during the test.

:class:`Collector` keeps, in the grader's memory, every collected test with its points
and the outcome of each: "passed" only when setup, call and teardown all passed; a
skipped test scores 0 like a failed one.
"""

from __future__ import annotations

import pytest

from minigraph.grading.collect import MAX_POINTS, valid_points
from minigraph.grading.messages import describe_exception, shorten

POINTS_MARKER = "points(n): the number of points a graded test is worth (minigraph grade)"
HIDDEN_MARKER = "hidden: a graded test the student sees only after the grades are published"
FORBID_MARKER = ("forbid(*names, why=''): library functions (minigraph.softmax, "
                 "numpy.broadcast_shapes) the exercise's solution may not call")


def pytest_configure(config):
    for line in (POINTS_MARKER, HIDDEN_MARKER, FORBID_MARKER):
        config.addinivalue_line("markers", line)


def points_of(item) -> tuple[float, str]:
    """(points, problem) for a collected test: its ``points`` marker's number, or 0 and
    a description of what is wrong with the marker."""
    marker = item.get_closest_marker("points")
    if marker is None:
        return 0, "no @pytest.mark.points(n) marker: this test is worth 0 points"
    args = list(marker.args) + list(marker.kwargs.values())
    if len(args) != 1 or not valid_points(args[0]):
        return 0, (f"invalid points marker {marker.args or marker.kwargs}: expected one "
                   f"finite number >= 0 and at most {MAX_POINTS:,.0f}")
    value = args[0]
    # int() takes any numbers.Real (through __trunc__); typeshed's Real.__trunc__ returns
    # an integral-like protocol rather than int, so mypy finds no overload of int() for it
    return (int(value) if float(value).is_integer() else float(value)), ""  # type: ignore[call-overload]


def forbidden_of(item) -> tuple[list[str], str]:
    """The library functions ``item``'s ``forbid`` markers name, and why."""
    names, why = [], ""
    for marker in item.iter_markers("forbid"):
        names += [str(n) for n in marker.args]
        why = why or str(marker.kwargs.get("why", ""))
    return names, why


def is_hidden(item) -> bool:
    return item.get_closest_marker("hidden") is not None


class Collector:
    """Records, in memory, the tests and their outcomes (the grader's own process)."""

    def __init__(self) -> None:
        self.tests: list[dict] = []
        self.collect_errors: list[dict] = []
        self.outcomes: dict[str, tuple[str, str]] = {}
        self.guard: list[str] = []     # every name any test forbids

    def pytest_collectreport(self, report):
        if report.failed:
            text = getattr(report.longrepr, "reprcrash", None)
            message = text.message if text is not None else str(report.longrepr)
            if not message.strip():
                message = str(report.longrepr)
            self.collect_errors.append({"nodeid": report.nodeid,
                                        "message": shorten(message, max_lines=8)})

    def pytest_collection_finish(self, session):
        for item in session.items:
            points, problem = points_of(item)
            self.tests.append({"nodeid": item.nodeid, "points": points, "problem": problem,
                               "hidden": is_hidden(item)})
            for name in forbidden_of(item)[0]:
                if name not in self.guard:
                    self.guard.append(name)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        previous = self.outcomes.get(item.nodeid)
        if previous is not None and previous[0] != "passed":
            return report  # the first problem is the one to show
        if report.failed:
            try:
                message = self._message(call, report)
            except Exception:  # noqa: BLE001 - a message must never stop the grading
                message = shorten(str(report.longrepr))
            self.outcomes[item.nodeid] = ("failed", message)
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.outcomes[item.nodeid] = ("failed", f"skipped ({reason}): a skipped test scores 0")
        elif report.when == "call":
            self.outcomes[item.nodeid] = ("passed", "")
        return report

    @staticmethod
    def _message(call, report) -> str:
        excinfo = call.excinfo
        phase = {"setup": "", "call": "", "teardown": " (in the test's teardown)"}[report.when]
        if excinfo is None:
            return shorten(str(report.longrepr)) + phase
        return describe_exception(excinfo.value, exconly=excinfo.exconly()) + phase
