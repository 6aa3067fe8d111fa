"""The grade of one chapter: points per test, the total, and how to print them."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from minigraph.grading.messages import escape_controls


def format_points(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _number(value: float) -> float:
    """2.0 -> 2, so that JSON and tables show whole points as whole numbers."""
    return int(value) if float(value).is_integer() else float(value)


@dataclass
class TestResult:
    name: str            # the test id within the file: "test_mean", "test_square[2]"
    nodeid: str          # pytest's id: "test_exercises.py::test_mean"
    max_score: float
    status: str          # "passed" or "failed"
    output: str = ""     # why it failed (short); "" when it passed
    problem: str = ""    # a problem with the test itself, for the chapter author
    hidden: bool = False # shown to the student only after the grades are published

    @property
    def score(self) -> float:
        return self.max_score if self.status == "passed" else 0


@dataclass
class Report:
    chapter: str
    exercises: Path
    tests_file: Path
    timeout: float
    results: list[TestResult]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    processes: int = 1
    protection: str | None = None   # the protection the sandbox lacked, if any

    @property
    def score(self) -> float:
        return _number(sum(r.score for r in self.results))

    @property
    def max_score(self) -> float:
        return _number(sum(r.max_score for r in self.results))

    @property
    def full_marks(self) -> bool:
        return bool(self.results) and all(r.status == "passed" for r in self.results)

    def table(self, width: int | None = None) -> str:
        """The report as text: a header, one row per test, the total, then the reasons
        for each failure in full (they are cut to one line in the table). What came from
        the student's code is printed with its control characters escaped, here too
        (:func:`.messages.escape_controls`): it must not draw on the grader's terminal."""
        width = width or shutil.get_terminal_size((100, 24)).columns
        lines = [f"Grading {self.chapter}",
                 f"  exercises: {self.exercises}",
                 f"  tests:     {self.tests_file}  (timeout {self.timeout:g} s per test)", ""]
        name_w = max([len("test"), len("total")] + [len(r.name) for r in self.results])
        pts = [f"{format_points(r.score)} / {format_points(r.max_score)}" for r in self.results]
        total = f"{format_points(self.score)} / {format_points(self.max_score)}"
        pts_w = max([len("points"), len(total)] + [len(p) for p in pts])
        lines.append(f"  {'test':<{name_w}}  {'points':>{pts_w}}  result")
        lines.append(f"  {'-' * name_w}  {'-' * pts_w}  {'-' * 6}")
        room = max(width - name_w - pts_w - 8, 20)
        for r, p in zip(self.results, pts):
            result = r.status if r.status == "passed" else \
                f"failed: {r.output.splitlines()[0] if r.output else ''}"
            if len(result) > room:
                result = result[:room - 3] + "..."
            lines.append(f"  {r.name:<{name_w}}  {p:>{pts_w}}  {result}")
        lines.append(f"  {'-' * name_w}  {'-' * pts_w}")
        lines.append(f"  {'total':<{name_w}}  {total:>{pts_w}}")
        reasons: dict[str, list[str]] = {}  # a message -> the tests failing with it
        for r in self.results:
            if r.status != "passed" and r.output:
                reasons.setdefault(r.output, []).append(r.name)
        if reasons:
            lines += ["", "Why the failed tests failed:"]
            for output, names in reasons.items():
                lines.append(f"  {', '.join(names)}:")
                lines += [f"    {line}" for line in output.splitlines()]
        problems = [r for r in self.results if r.problem]
        if problems:
            lines += ["", "Problems with the tests themselves (for the chapter's author):"]
            lines += [f"  {r.name}: {r.problem}" for r in problems]
        if self.notes:
            lines += [""] + [f"Note: {n}" for n in self.notes]
        return escape_controls("\n".join(lines))
