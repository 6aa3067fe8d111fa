"""``minigraph grade PATH``: a chapter's graded tests against the exercises.py in PATH.

Where the tests come from, first match wins:

1. ``--tests DIR_OR_FILE``: a chapter folder (its ``test_exercises.py``) or a test file.
   This is how an instructor grades a submission: the student's folder holds only
   ``exercises.py`` and the tests come from the course's own copy.
2. ``PATH/test_exercises.py``: a chapter folder as ``minigraph release`` writes it, or a
   chapter of the course itself.
3. ``chapters/<name of PATH>/test_exercises.py`` of the course, the ``chapters`` folder
   beside the ``minigraph`` package (a source checkout installed with ``pip install -e``),
   or ``$MINIGRAPH_CHAPTERS/<name of PATH>/``.

The grading happens in a fresh scratch folder holding exactly two files: the test file and
the student's ``exercises.py`` (nothing else from PATH: no ``conftest.py`` or stray module of
the student's can change how the tests run). See :mod:`minigraph.grading.runner` for how the
tests are run so that crashes and endless loops cost only the test they happen in.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from minigraph.grading.gradescope import write_error_json, write_results_json
from minigraph.grading.messages import STUDENT_FILE
from minigraph.grading.report import Report, TestResult
from minigraph.grading.runner import GRACE, run_tests

TEST_FILE = "test_exercises.py"
DEFAULT_TIMEOUT = 10.0


class GradingError(Exception):
    """PATH or the tests could not be found: nothing was graded."""


def course_chapters_dir() -> Path:
    """The course's ``chapters`` folder: ``$MINIGRAPH_CHAPTERS`` or the one beside the
    minigraph package."""
    env = os.environ.get("MINIGRAPH_CHAPTERS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "chapters"


def locate(path: str | Path, tests: str | Path | None = None) -> tuple[Path, Path]:
    """(the student's exercises.py, the graded test file) for ``minigraph grade PATH``."""
    path = Path(path)
    if path.is_file():
        exercises, folder = path, path.parent
    elif path.is_dir():
        exercises, folder = path / STUDENT_FILE, path
    else:
        raise GradingError(f"{path} does not exist")
    if not exercises.is_file():
        raise GradingError(f"there is no {STUDENT_FILE} in {folder}")
    if tests is not None:
        test_file = Path(tests)
        if test_file.is_dir():
            test_file = test_file / TEST_FILE
        if not test_file.is_file():
            raise GradingError(f"--tests {tests}: no such test file")
        return exercises, test_file
    for candidate in (folder / TEST_FILE, course_chapters_dir() / folder.resolve().name / TEST_FILE):
        if candidate.is_file():
            return exercises, candidate
    raise GradingError(
        f"no graded tests for {folder}: it has no {TEST_FILE}, and the course has no chapter "
        f"{folder.resolve().name!r} in {course_chapters_dir()}; name them with --tests")


def grade(path: str | Path, *, tests: str | Path | None = None,
          timeout: float = DEFAULT_TIMEOUT, python: str = sys.executable,
          grace: float = GRACE, use_pytest_timeout: bool | None = None) -> Report:
    """Grade the exercises.py in ``path`` (a chapter folder or the file itself).

    ``python`` runs the tests; ``grace``: seconds past the timeout before a test's process
    is killed; ``use_pytest_timeout``: None uses it when installed (False: only kills)."""
    if not timeout > 0:
        raise GradingError(f"the timeout must be positive, not {timeout}")
    exercises, test_file = locate(path, tests)
    if python == sys.executable and importlib.util.find_spec("pytest") is None:
        raise GradingError("minigraph grade runs the tests with pytest, which is not installed: "
                           "python -m pip install pytest pytest-timeout")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="minigraph-grade-") as scratch:
        workdir = Path(scratch)
        shutil.copyfile(test_file, workdir / TEST_FILE)
        shutil.copyfile(exercises, workdir / STUDENT_FILE)
        run = run_tests(workdir, TEST_FILE, timeout=timeout, python=python, grace=grace,
                        use_pytest_timeout=use_pytest_timeout)
    results = [TestResult(name=_display_name(o.nodeid), nodeid=o.nodeid, max_score=o.points,
                          status=o.status, output=o.output, problem=o.problem)
               for o in run.outcomes]
    notes = list(run.notes)
    if not results:
        notes.append(f"{test_file} declares no graded tests")
    folder = exercises.parent.resolve()
    return Report(chapter=folder.name, exercises=exercises, tests_file=test_file,
                  timeout=timeout, results=results, notes=notes,
                  seconds=time.monotonic() - started, processes=run.processes)


def _display_name(nodeid: str) -> str:
    """``test_exercises.py::test_mean`` -> ``test_mean`` (the file is always the same)."""
    prefix = TEST_FILE + "::"
    return nodeid[len(prefix):] if nodeid.startswith(prefix) else nodeid


# -- command line ------------------------------------------------------------------------

def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH",
                        help="a chapter folder holding exercises.py (or the exercises.py itself)")
    parser.add_argument("--json", metavar="RESULTS_JSON", dest="json_path", default=None,
                        help="also write Gradescope's results.json there")
    parser.add_argument("--timeout", metavar="S", type=_positive, default=DEFAULT_TIMEOUT,
                        help=f"seconds each test may run (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--tests", metavar="DIR_OR_FILE", default=None,
                        help="where the graded tests are: a chapter folder or its test_exercises.py "
                             "(default: PATH/test_exercises.py, else the course's chapter of the same name)")


GRADE_HELP = "grade a chapter's exercises.py with its graded tests"
GRADE_EPILOG = ("exit status: 0 full marks, 1 some tests failed, 2 nothing could be graded "
                "(PATH or the tests not found)")


def add_grade_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``grade`` to an ``argparse`` subparsers object; ``args.run(args)`` grades."""
    parser = subparsers.add_parser("grade", help=GRADE_HELP, description=GRADE_HELP + ".",
                                   epilog=GRADE_EPILOG)
    _add_arguments(parser)
    parser.set_defaults(run=run_grade)
    return parser


def run_grade(args: argparse.Namespace) -> int:
    try:
        report = grade(args.path, tests=args.tests, timeout=args.timeout)
    except GradingError as exc:
        print(f"minigraph grade: error: {exc}", file=sys.stderr)
        if args.json_path:  # Gradescope then shows the student why nothing was graded
            write_error_json(f"Nothing could be graded: {exc}", args.json_path)
        return 2
    print(report.table())
    if args.json_path:
        written = write_results_json(report, args.json_path)
        print(f"\nwrote {written}")
    return 0 if report.full_marks else 1


def grade_main(argv=None) -> int:
    """``minigraph grade`` as a function of its arguments (without ``grade`` itself)."""
    parser = argparse.ArgumentParser(prog="minigraph grade", description=GRADE_HELP + ".",
                                     epilog=GRADE_EPILOG)
    _add_arguments(parser)
    return run_grade(parser.parse_args(argv))


__all__ = ["GradingError", "add_grade_parser", "course_chapters_dir", "grade",
           "grade_main", "locate", "run_grade"]
