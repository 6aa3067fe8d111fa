"""``minigraph grade PATH``: a chapter's graded tests against the exercises.py in PATH.

The tests come from the course, never from the submission, first match wins:

1. ``--tests DIR_OR_FILE``: a chapter folder (its ``test_exercises.py``) or a test file
   (for instructors: a test file being written, or a course kept elsewhere);
2. ``--course DIR``: the chapter of that course named like PATH's folder,
   ``DIR/<name of PATH>/test_exercises.py``;
3. the installed project's course: ``$MINIGRAPH_CHAPTERS`` or the ``chapters`` folder
   beside the ``minigraph`` package, the chapter named like PATH's folder.

Nothing in PATH but ``exercises.py`` is ever read, imported or run: a ``test_exercises.py``
or ``conftest.py`` beside it is ignored. The student's file runs in the sandbox
(:mod:`minigraph.grading.proxy`), the tests in the grader's process
(:mod:`minigraph.grading.harness`); see :mod:`minigraph.grading` for the security model.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

from minigraph.grading import isolation
from minigraph.grading.gradescope import write_error_json, write_results_json
from minigraph.grading.messages import STUDENT_FILE
from minigraph.grading.report import Report, TestResult
from minigraph.grading.runner import run_tests

TEST_FILE = "test_exercises.py"
DEFAULT_TIMEOUT = 10.0
DEFAULT_TOTAL_TIMEOUT = 180.0
DEFAULT_MEMORY_MB = 2048
#: what --memory limits, said the same by ``grade`` and ``autograder``
MEMORY_HELP = ("address space of the sandbox's process in MB (RLIMIT_AS; the sandbox may start "
               "no other process or thread, so this bounds its memory, but for files in "
               "memory-backed folders such as /dev/shm and SysV shared memory, which it may "
               f"hold until the grading ends; default {DEFAULT_MEMORY_MB})")


class GradingError(Exception):
    """PATH or the tests could not be found: nothing was graded."""


def course_chapters_dir() -> Path:
    """The course's ``chapters`` folder: ``$MINIGRAPH_CHAPTERS`` or the one beside the
    minigraph package."""
    env = os.environ.get("MINIGRAPH_CHAPTERS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "chapters"


def locate(path: str | Path, tests: str | Path | None = None,
           course: str | Path | None = None) -> tuple[Path, Path]:
    """(the student's exercises.py, the course's graded test file) for ``grade PATH``."""
    path = Path(path)
    if path.is_file():
        exercises, folder = path, path.parent
    elif path.is_dir():
        exercises, folder = path / STUDENT_FILE, path
    else:
        raise GradingError(f"{path} does not exist")
    if exercises.is_symlink():  # (lstat: a link to the reference solution is no submission)
        raise GradingError(f"{exercises} is a symbolic link: the grader reads only a "
                           f"regular file written by the student")
    if not exercises.is_file():
        raise GradingError(f"there is no {STUDENT_FILE} in {folder}")
    if tests is not None:
        test_file = Path(tests)
        if test_file.is_dir():
            test_file = test_file / TEST_FILE
        if not test_file.is_file():
            raise GradingError(f"--tests {tests}: no such test file")
        return exercises, test_file
    chapters = Path(course) if course is not None else course_chapters_dir()
    candidate = chapters / folder.resolve().name / TEST_FILE
    if candidate.is_file():
        return exercises, candidate
    raise GradingError(
        f"no graded tests for {folder}: the course in {chapters} has no chapter "
        f"{folder.resolve().name!r}; name the chapter's tests with --tests (the tests always "
        "come from the course, never from the submission)")


def _protect_course(test_file: Path, course: Path | None, submission: Path) -> list[str]:
    """As root: make the course unreadable to the sandbox's account (and say so): its
    folders, and the git repository they are checked out of, whose history holds every
    reference solution and hidden test too (a student's code read them with git show).
    The submission's folder too: the sandbox runs a copy, and a folder of submissions
    graded one after another must not let one student's code run another's. Nothing the
    student wrote is followed: a .git file in or above the submission (which the student
    may have uploaded) named any folder of the machine for root to close."""
    if not isolation.is_root():
        return []
    changed = []
    folders = {test_file.resolve().parent}
    if course is not None:
        folders.add(course.resolve())
    else:  # --tests: the chapter's course is the folder of chapters it lies in
        course_dir = test_file.resolve().parent.parent
        if any((d / TEST_FILE).is_file() for d in course_dir.iterdir()
               if d.is_dir() and d != test_file.resolve().parent):
            folders.add(course_dir)
    git_dirs = {g for f in folders for g in _git_dirs(f)}
    folders.add(submission.resolve())
    git_dirs.update(_git_dirs(submission.resolve(), follow=False))
    for folder in folders | git_dirs:
        if folder.exists() and isolation.close_to_others(folder):
            changed.append(str(folder))
    return changed


def _git_dirs(folder: Path, follow: bool = True) -> list[Path]:
    """The .git of the work tree that holds ``folder``, and, where .git is a file (a
    linked work tree, a submodule: "gitdir: ..."), the folder it points to. With
    ``follow=False`` (the submission's, which the student may have uploaded) nothing is
    followed: only a .git that is a folder itself is returned."""
    for parent in [folder, *folder.parents]:
        dot_git = parent / ".git"
        if not os.path.lexists(dot_git):
            continue
        if not follow:
            return [dot_git] if dot_git.is_dir() and not dot_git.is_symlink() else []
        if dot_git.is_dir():
            return [dot_git.resolve()]  # (a link: where it points; links are not closed)
        if dot_git.is_file():
            text = dot_git.read_text(encoding="utf-8", errors="replace").strip()
            target = (parent / text[len("gitdir:"):].strip()).resolve() \
                if text.startswith("gitdir:") else None
            return [dot_git] + ([target] if target is not None and target.is_dir() else [])
        return []
    return []


def limits_problem(timeout: float, total_timeout: float, memory_mb: int) -> str | None:
    """What is wrong with these limits (None if nothing): what ``grade`` and
    ``autograder`` check before grading, or before writing a bundle that would grade."""
    if not timeout > 0 or not total_timeout > 0:
        return f"the timeouts must be positive, not {timeout}, {total_timeout}"
    if not memory_mb > 0:  # (a negative RLIMIT_AS reads as 2**64 - x to the kernel: no limit)
        return f"the memory limit must be positive, not {memory_mb} MB"
    return None


def grade(path: str | Path, *, tests: str | Path | None = None, course: str | Path | None = None,
          timeout: float = DEFAULT_TIMEOUT, total_timeout: float = DEFAULT_TOTAL_TIMEOUT,
          memory_mb: int = DEFAULT_MEMORY_MB, isolate: bool = True) -> Report:
    """Grade the exercises.py in ``path`` (a chapter folder or the file itself).

    ``timeout``: seconds per call into the student's code; ``total_timeout``: seconds for
    the whole submission; ``memory_mb``: the address space of the sandbox, one process
    (see :class:`.isolation.Limits`); ``isolate=False`` runs the sandbox without an
    account or limits (only for debugging the grader)."""
    problem = limits_problem(timeout, total_timeout, memory_mb)
    if problem:
        raise GradingError(problem)
    exercises, test_file = locate(path, tests, course)
    if importlib.util.find_spec("pytest") is None:
        raise GradingError("minigraph grade runs the tests with pytest, which is not installed: "
                           "python -m pip install pytest")
    started = time.monotonic()
    default_course = course_chapters_dir() if tests is None and course is None else None
    closed = _protect_course(test_file, Path(course) if course else default_course,
                             exercises.parent) if isolate else []
    run = run_tests(test_file, exercises, timeout=timeout, total_timeout=total_timeout,
                    memory_mb=memory_mb, isolate=isolate)
    results = [TestResult(name=_display_name(o.nodeid), nodeid=o.nodeid, max_score=o.points,
                          status=o.status, output=o.output, problem=o.problem, hidden=o.hidden)
               for o in run.outcomes]
    notes = list(run.notes)
    if not results:
        notes.append(f"{test_file} declares no graded tests")
    folder = exercises.parent.resolve()
    report = Report(chapter=folder.name, exercises=exercises, tests_file=test_file,
                    timeout=timeout, results=results, notes=notes,
                    seconds=time.monotonic() - started, processes=run.processes)
    report.protection = isolation.missing_protection() if isolate else \
        "sandbox: isolation turned off (isolate=False): no account switch and no limits"
    if closed:
        report.protection = (report.protection + "; " if report.protection else "") + \
            "removed others' access to " + ", ".join(closed) + " (the sandbox must not read it)"
    return report


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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not value > 0:  # (a negative RLIMIT_AS reads as 2**64 - x to the kernel: no limit)
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH",
                        help="a chapter folder holding exercises.py (or the exercises.py itself)")
    parser.add_argument("--json", metavar="RESULTS_JSON", dest="json_path", default=None,
                        help="also write Gradescope's results.json there")
    parser.add_argument("--timeout", metavar="S", type=_positive, default=DEFAULT_TIMEOUT,
                        help=f"seconds each test may run (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--total-timeout", metavar="S", type=_positive,
                        default=DEFAULT_TOTAL_TIMEOUT, dest="total_timeout",
                        help=f"seconds the whole submission may run (default {DEFAULT_TOTAL_TIMEOUT:g})")
    parser.add_argument("--memory", metavar="MB", type=_positive_int, default=DEFAULT_MEMORY_MB,
                        dest="memory_mb",
                        help=MEMORY_HELP)
    parser.add_argument("--course", metavar="DIR", default=None,
                        help="the course's chapters folder (default: the installed project's)")
    parser.add_argument("--tests", metavar="DIR_OR_FILE", default=None,
                        help="for instructors: the graded tests, a chapter folder or its "
                             "test_exercises.py (default: the course's chapter named like PATH)")


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
        report = grade(args.path, tests=args.tests, course=args.course, timeout=args.timeout,
                       total_timeout=args.total_timeout, memory_mb=args.memory_mb)
    except GradingError as exc:
        print(f"minigraph grade: error: {exc}", file=sys.stderr)
        if args.json_path:  # Gradescope then shows the student why nothing was graded
            write_error_json(f"Nothing could be graded: {exc}", args.json_path)
        return 2
    if report.protection:
        print(f"minigraph grade: {report.protection}", file=sys.stderr)
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
