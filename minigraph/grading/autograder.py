"""``minigraph autograder CHAPTER -o DIR``: Gradescope's autograder for one chapter.

Gradescope unpacks the uploaded zip into ``/autograder/source``, runs ``setup.sh`` once
when it builds the image, then ``/autograder/run_autograder`` for every submission, which
must leave ``/autograder/results/results.json``. The bundle written here::

    DIR/
      setup.sh            installs Python and minigraph (from the copy below) into a venv
      run_autograder      grades /autograder/submission/exercises.py, writes results.json
      minigraph-src/      the minigraph package this grader runs, with a pyproject.toml
      tests/NN-topic/test_exercises.py   the course's tests, hidden ones included
      autograder.zip      all of the above, to upload

With ``--force`` DIR may hold other files (the project's root, say): they are left alone
and stay out of the zip, and only an earlier bundle's files (marked by a line of theirs)
are replaced, never through a symbolic link.

The package travels in the bundle (rather than ``pip install`` from a repository) because
Gradescope's image may not reach the course's repository, and so that the grader and the
tests the instructor checked are exactly the ones that run. Its dependencies (NumPy,
pytest ...) come from PyPI when the image is built. The reference solution never goes into
the bundle: only the chapter's ``test_exercises.py``.

``run_autograder`` reads its paths from the environment, so that it can be tried outside
Gradescope: ``AUTOGRADER_ROOT`` (default ``/autograder``; the submission, results and
source folders are under it) and ``MINIGRAPH_PYTHON`` (default the venv ``setup.sh``
makes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from minigraph.grading.grade import (DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, DEFAULT_TOTAL_TIMEOUT,
                                     MEMORY_HELP, TEST_FILE, _positive, _positive_int,
                                     limits_problem)
from minigraph.grading.gradescope import NOTHING_TO_GRADE
from minigraph.grading.release import SKIPPED_DIRS

ZIP_NAME = "autograder.zip"
WRITTEN_BY = "`minigraph autograder`"
#: a line of its own in every file of the bundle that --force may replace (the scripts,
#: minigraph-src's pyproject.toml): the whole line, so that a file which merely mentions
#: `minigraph autograder` is not taken for one
MARKER = f"# (written by {WRITTEN_BY}, which replaces it when run again)"
#: minigraph-src/pyproject.toml's line that marks it, as distinctive (every bundle's
#: pyproject.toml has had it, earlier versions' included)
DESCRIPTION = f'description = "minigraph, as bundled by {WRITTEN_BY} for Gradescope"'
VENV = "/opt/minigraph-venv"   # outside /autograder: the sandbox's account must read it

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
{marker}
set -euo pipefail
cd "$(dirname "$0")"
if ! python3 -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null; then
    apt-get update
    apt-get install -y python3 python3-venv python3-pip
fi
python3 -m venv --without-pip {venv} 2>/dev/null || python3 -m venv {venv}
{venv}/bin/python -m ensurepip --upgrade 2>/dev/null || true
{venv}/bin/python -m pip install --upgrade pip
# minigraph from the copy in this bundle, with what the grader needs (pytest ...)
{venv}/bin/python -m pip install "./minigraph-src[grading]"
# the sandbox's unprivileged account must be able to read the interpreter and the package
chmod -R a+rX {venv}
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission: grade the student's exercises.py with the
# course's tests for {chapter}, write results.json (the grader writes it, never the
# student's code). Paths come from the environment so the bundle can be tried locally.
{marker}
set -uo pipefail
ROOT="$(cd "${{AUTOGRADER_ROOT:-/autograder}}" && pwd)"
PYTHON="${{MINIGRAPH_PYTHON:-{venv}/bin/python}}"
# Python puts the current folder first on its path (-c, -m): from the submission's, the
# student's own minigraph/ would be imported, as root; "/" holds no package
cd /
SUBMISSION="$ROOT/submission"
RESULTS="$ROOT/results/results.json"
TESTS="$ROOT/source/tests/{chapter}/{test_file}"
mkdir -p "$ROOT/results"

# the student's file: at the top of the submission, else the only exercises.py in it,
# else (the whole course uploaded) the one in the chapter's own folder; none, results.json
# says what was uploaded (minigraph.grading.gradescope.find_submission)
EXERCISES=$("$PYTHON" -c "import sys; from minigraph.grading.gradescope import find_submission; \\
sys.exit(find_submission(*sys.argv[1:]))" "$SUBMISSION" "{chapter}" "$RESULTS")
status=$?
if [ "$status" -eq {nothing_to_grade} ] && [ -f "$RESULTS" ]; then
    exit 0
elif [ "$status" -ne 0 ]; then
    echo "run_autograder: the grader failed and wrote no results" >&2
    exit 1
fi

"$PYTHON" -m minigraph.grading grade "$EXERCISES" --tests "$TESTS" --json "$RESULTS" \\
    --timeout {timeout:g} --total-timeout {total_timeout:g} --memory {memory_mb}
status=$?
# 0: full marks, 1: some tests failed, 2: nothing graded (results.json then says why)
if [ "$status" -le 2 ] && [ -f "$RESULTS" ]; then
    exit 0
fi
echo "run_autograder: the grader failed (exit status $status) and wrote no results" >&2
exit 1
"""

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "minigraph"
version = "{version}"
{description}
requires-python = ">=3.10"
dependencies = {dependencies}

[project.optional-dependencies]
grading = {grading}

[tool.setuptools.packages.find]
include = ["minigraph*"]
"""


class AutograderError(Exception):
    """The bundle cannot be written as asked; nothing was written."""


def _requirements() -> tuple[str, list[str], list[str]]:
    """(version, dependencies, the ``grading`` extra's) of the installed minigraph."""
    try:
        meta = metadata.metadata("minigraph")
        requires = metadata.requires("minigraph") or []
        version = meta["Version"]
    except metadata.PackageNotFoundError:   # run from a source tree without installing
        return "0", ["numpy>=2.0", "array-api-compat>=1.9"], ["pytest>=8", "pytest-timeout>=2.3"]
    plain = [r for r in requires if "extra ==" not in r]
    grading = [r.split(";")[0].strip() for r in requires
               if "extra ==" in r and r.split("extra ==")[1].strip().strip("'\"") == "grading"]
    return version, plain, grading or ["pytest>=8", "pytest-timeout>=2.3"]


def _copy_package(target: Path) -> None:
    """The installed minigraph package (the one running this) into ``target/minigraph``."""
    package = Path(__file__).resolve().parents[1]
    ignore = shutil.ignore_patterns(*SKIPPED_DIRS, "*.pyc", ".*")
    shutil.copytree(package, target / "minigraph", ignore=ignore)
    version, dependencies, grading = _requirements()
    as_toml = lambda items: "[" + ", ".join(f'"{i}"' for i in items) + "]"  # noqa: E731
    (target / "pyproject.toml").write_text(
        PYPROJECT.format(description=DESCRIPTION, version=version,
                         dependencies=as_toml(dependencies), grading=as_toml(grading)),
        encoding="utf-8")


def _written_by_a_bundle(path: Path) -> bool:
    """Whether ``path`` (setup.sh, run_autograder, minigraph-src/pyproject.toml) is one
    that :func:`autograder` wrote: each has the line :data:`MARKER` (the pyproject.toml:
    :data:`DESCRIPTION`). (Links are refused before: this reads no file outside DIR.)"""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")   # (lines as the shell sees them)
        return (DESCRIPTION if path.name == "pyproject.toml" else MARKER) in lines
    except (OSError, UnicodeDecodeError):
        return False


def _check_replaceable(out: Path, name: str) -> None:
    """Refuse (:class:`AutograderError`) to write the bundle into ``out`` where it would
    replace what is not an earlier bundle's: --force writes among the other files of DIR
    (the project's root, say), so it never follows a symbolic link there (a link leads
    anywhere: a file outside DIR would be overwritten, or made executable), and it
    replaces only files that carry :data:`MARKER`."""
    folders = {out / "minigraph-src", out / "tests", out / "tests" / name}
    for path in (out / "setup.sh", out / "run_autograder", out / "minigraph-src",
                 out / "minigraph-src" / "pyproject.toml", out / "tests", out / "tests" / name,
                 out / "tests" / name / TEST_FILE, out / ZIP_NAME, out / (ZIP_NAME + ".tmp")):
        if path.is_symlink():   # (lstat: the link itself)
            raise AutograderError(f"{path} is a symbolic link: --force never writes through "
                                  "one (it may lead out of the folder); remove it, or choose "
                                  "another folder")
        # (checked before anything is written: a FIFO would block the marker's read for
        # ever, a folder named autograder.zip fail half-way, the bundle left half-written)
        if not os.path.lexists(path):
            continue
        folder = path in folders
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode) != folder or not folder and not stat.S_ISREG(mode):
            raise AutograderError(f"{path} is in the way: the bundle writes a "
                                  f"{'folder' if folder else 'file'} there; remove it, or "
                                  "choose another folder")
    for own in (out / "setup.sh", out / "run_autograder", out / "minigraph-src"):
        marked = own / "pyproject.toml" if own.name == "minigraph-src" else own
        if os.path.lexists(own) and not _written_by_a_bundle(marked):
            raise AutograderError(
                f"{marked} lacks the line that {WRITTEN_BY} writes there: it was either "
                f"not written by {WRITTEN_BY}, or written by an earlier version of it, which "
                "did not mark its files; --force replaces only marked files. If it is an "
                "earlier bundle's, remove the bundle's files (setup.sh, run_autograder, "
                f"minigraph-src, tests/{name}, {ZIP_NAME}) and run again; or choose an empty "
                "folder")


def _write_script(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)   # (a new file, whatever was there)
    path.write_text(text, encoding="utf-8", newline="\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def autograder(chapter: str | Path, out: str | Path, *, force: bool = False,
               timeout: float = DEFAULT_TIMEOUT, total_timeout: float = DEFAULT_TOTAL_TIMEOUT,
               memory_mb: int = DEFAULT_MEMORY_MB) -> Path:
    """Write the Gradescope bundle for ``chapter`` (a chapter folder of the course, or its
    test file) into ``out``; return the zip to upload."""
    chapter, out = Path(chapter), Path(out)
    problem = limits_problem(timeout, total_timeout, memory_mb)
    if problem:  # (the bundle would grade nothing: every submission "the grader failed")
        raise AutograderError(problem)
    tests = chapter / TEST_FILE if chapter.is_dir() else chapter
    if not tests.is_file():
        raise AutograderError(f"{chapter}: no {TEST_FILE} (CHAPTER is a chapter folder of the course)")
    name = tests.resolve().parent.name
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not force)):
        raise AutograderError(f"{out} is not an empty folder (pass --force to write into it anyway)")
    if out.resolve() == tests.resolve().parent or tests.resolve().parent in out.resolve().parents:
        raise AutograderError(f"the output folder {out} must not be inside {tests.parent}")
    # --force writes the bundle's files among the others of DIR (the project's root, say)
    # and replaces only what an earlier bundle wrote: never a folder or script of the user's
    _check_replaceable(out, name)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "minigraph-src", ignore_errors=True)   # (an earlier bundle's)
    _copy_package(out / "minigraph-src")
    (out / "tests" / name).mkdir(parents=True, exist_ok=True)
    (out / "tests" / name / TEST_FILE).unlink(missing_ok=True)
    shutil.copyfile(tests, out / "tests" / name / TEST_FILE)
    _write_script(out / "setup.sh", SETUP_SH.format(marker=MARKER, venv=VENV))
    _write_script(out / "run_autograder", RUN_AUTOGRADER.format(
        marker=MARKER, nothing_to_grade=NOTHING_TO_GRADE,
        chapter=name, test_file=TEST_FILE, venv=VENV, timeout=timeout,
        total_timeout=total_timeout, memory_mb=memory_mb))
    # the zip holds exactly the files written above: nothing else of DIR (a reference
    # solution beside them) goes to Gradescope
    written = [out / "setup.sh", out / "run_autograder", out / "tests" / name / TEST_FILE]
    written += [p for p in (out / "minigraph-src").rglob("*") if p.is_file()]
    bundle = out / ZIP_NAME
    temporary = out / (ZIP_NAME + ".tmp")
    with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(written):
            info = zipfile.ZipInfo.from_file(path, path.relative_to(out).as_posix())
            with open(path, "rb") as f:
                archive.writestr(info, f.read(), zipfile.ZIP_DEFLATED)
    os.replace(temporary, bundle)
    return bundle


# -- command line ------------------------------------------------------------------------

AUTOGRADER_HELP = "write Gradescope's autograder (setup.sh, run_autograder, the tests) for a chapter"


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("chapter", metavar="CHAPTER",
                        help="the course's chapter folder (its test_exercises.py is graded)")
    parser.add_argument("-o", "--output", metavar="DIR", required=True,
                        help=f"where the bundle goes; DIR/{ZIP_NAME} is what to upload")
    parser.add_argument("--force", action="store_true",
                        help="write into DIR even if it is not empty (an earlier bundle's "
                             "files are replaced, nothing else is touched)")
    parser.add_argument("--timeout", metavar="S", type=_positive, default=DEFAULT_TIMEOUT,
                        help=f"seconds each test may run (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--total-timeout", metavar="S", type=_positive, default=DEFAULT_TOTAL_TIMEOUT,
                        dest="total_timeout",
                        help=f"seconds a whole submission may run (default {DEFAULT_TOTAL_TIMEOUT:g})")
    parser.add_argument("--memory", metavar="MB", type=_positive_int, default=DEFAULT_MEMORY_MB,
                        dest="memory_mb", help=MEMORY_HELP)


def add_autograder_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``autograder`` to an ``argparse`` subparsers object; ``args.run(args)`` writes it."""
    parser = subparsers.add_parser("autograder", help=AUTOGRADER_HELP,
                                   description=AUTOGRADER_HELP + ".")
    _add_arguments(parser)
    parser.set_defaults(run=run_autograder)
    return parser


def run_autograder(args: argparse.Namespace) -> int:
    try:
        bundle = autograder(args.chapter, args.output, force=args.force, timeout=args.timeout,
                            total_timeout=args.total_timeout, memory_mb=args.memory_mb)
    except AutograderError as exc:
        print(f"minigraph autograder: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote the autograder for {Path(args.chapter).resolve().name} into {args.output}; "
          f"upload {bundle} to Gradescope (Autograder: zip file upload)")
    return 0


__all__ = ["AutograderError", "add_autograder_parser", "autograder", "run_autograder"]
