"""The instructor's workflow around the grader: ``release``, ``autograder`` and the
sandbox's handling of source files saved in other encodings.

Each test names the bug it guards against. The oracles are independent of minigraph:
CPython's own decoding and compiling of source bytes, pytest's own collection (which
tests it sees as marked hidden), ``zipfile``'s listing of the bundle, closed forms.
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import traceback
import zipfile
from pathlib import Path

import pytest

from minigraph.grading import check_chapter
from minigraph.grading.autograder import AutograderError, autograder
from minigraph.grading.collect import declared_tests
from minigraph.grading.messages import describe_exception
from minigraph.grading.plugin import points_of
from minigraph.grading.release import ReleaseError, release, strip_hidden, strip_solutions

EXAMPLE = Path(__file__).resolve().parent / "grading_fixtures" / "chapters" / "99-example"

EXERCISE = b"def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION\n"
TESTS = """\
import pytest
from minigraph.grading import exercises_fixture
exercises = exercises_fixture()

@pytest.mark.points(1)
def test_add(exercises):
    assert exercises.add(1, 2) == 3
"""


def _chapter(root: Path, exercises: bytes, tests: str = TESTS) -> Path:
    folder = root / "chapters" / "01-x"
    folder.mkdir(parents=True)
    (folder / "exercises.py").write_bytes(exercises)
    (folder / "test_exercises.py").write_text(tests)
    return folder


# -- 1. encodings in the sandbox ----------------------------------------------------------

def test_a_line_that_cannot_be_read_still_gives_the_place(monkeypatch, tmp_path):
    """Reading a line of exercises.py for the message (linecache -> tokenize.open) raised
    LookupError where the codec of the file's BOM could not be imported (the sandbox,
    after its switch of account): the sandbox died inside its own error handling."""
    path = tmp_path / "exercises.py"
    path.write_text("def f():\n    return 1 / 0\n")
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    try:
        namespace["f"]()
    except ZeroDivisionError as exc:
        error = exc

    def unknown_codec(*args, **kwargs):
        raise LookupError("unknown encoding: utf-8-sig")

    with monkeypatch.context() as patched:   # (undone before pytest reports a failure)
        patched.setattr(traceback.linecache, "getline", unknown_codec)
        message = describe_exception(error)
    assert message.endswith("at exercises.py, line 2, in f")


# What the sandbox's account meets: no module it has not loaded before its switch of
# account can be imported (the Python installation is unreadable to it).
UNREADABLE = """\
class Unreadable:
    def find_spec(self, name, path=None, target=None):
        raise ModuleNotFoundError(name)

sys.meta_path.insert(0, Unreadable())
"""

PRELOADED_ONLY = """\
import importlib, sys
from minigraph.grading.sandbox import PRELOAD
for name in PRELOAD:
    importlib.import_module(name)
""" + UNREADABLE + """\
for source in sys.argv[1:]:
    with open(source, "rb") as f:
        data = f.read()
    exec(compile(data, source, "exec"), {})    # an import of exercises.py decodes it
    import linecache
    assert linecache.getline(source, 3).strip() == "x = 1", source   # so does a traceback
"""


def test_the_sandbox_preloads_the_codecs_a_source_file_may_declare(tmp_path):
    """A correct exercises.py saved with a BOM or a coding line (cp1252, latin-1) failed
    in the sandbox ("unknown encoding"): once the account cannot read the Python
    installation, the codec's module can no longer be imported. Oracle: CPython decodes
    the bytes with only PRELOAD imported beforehand."""
    sources = []
    for head, encoding in ((b"\xef\xbb\xbf#\n", "utf-8"), (b"# -*- coding: cp1252 -*-\n", "cp1252"),
                           (b"# coding: latin-1\n", "latin-1"), (b"# coding: ascii\n", "ascii")):
        comment = "# cafe" if encoding == "ascii" else "# caf\u00e9"
        sources.append(tmp_path / f"{encoding}" / "exercises.py")
        sources[-1].parent.mkdir()
        sources[-1].write_bytes(head + comment.encode(encoding) + b"\nx = 1\n")
    package_root = str(Path(__import__("minigraph").__file__).resolve().parents[1])
    run = subprocess.run([sys.executable, "-c", PRELOADED_ONLY, *map(str, sources)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": package_root})
    assert run.returncode == 0, run.stderr[-2000:]


# -- 2. hidden tests in the release -------------------------------------------------------

HIDDEN_SPELLINGS = """\
import pytest
from minigraph.grading import exercises_fixture
exercises = exercises_fixture()
secret = pytest.mark.hidden

@pytest.mark.points(1)
def test_visible(exercises):
    assert exercises.add(1, 2) == 3

@pytest.mark.points(1)
@secret
def test_alias(exercises):
    assert exercises.add(40, 2) == 42

@pytest.mark.points(1)
@pytest.mark.parametrize("a, b", [(1, 2),
                                  pytest.param(1000, 1, marks=pytest.mark.hidden),
                                  (3, 4)])
@pytest.mark.parametrize("c", [pytest.param(7, marks=[secret]), 0])
def test_cases(exercises, a, b, c):
    assert exercises.add(a, b) == a + b

@pytest.mark.points(1)
@pytest.mark.parametrize("a", [pytest.param(9, marks=pytest.mark.hidden)])
def test_all_cases_hidden(exercises, a):
    assert exercises.add(a, 0) == a

class TestPytestmark:
    pytestmark = pytest.mark.hidden

    @pytest.mark.points(1)
    def test_in_class(self, exercises):
        assert exercises.add(5, 5) == 10

class TestMembers:
    @pytest.mark.points(1)
    @pytest.mark.hidden
    def test_member(self, exercises):
        assert exercises.add(0, 0) == 0
"""


def _collected(test_file: Path) -> dict[str, bool]:
    """pytest's own collection of ``test_file``: node id -> whether it is marked hidden."""
    seen: dict[str, bool] = {}

    class Record:
        def pytest_collection_finish(self, session):
            seen.update({item.nodeid.split("::", 1)[1]: item.get_closest_marker("hidden") is not None
                         for item in session.items})

    code = pytest.main([str(test_file), "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-p", "minigraph.grading.plugin", "--rootdir", str(test_file.parent),
                        "-o", "addopts="], plugins=[Record()])
    sys.modules.pop(test_file.stem, None)   # (pytest imported it into this process)
    assert code == 0
    return seen


def test_every_spelling_of_the_hidden_mark_is_stripped(tmp_path):
    """Only ``@pytest.mark.hidden`` on a def or class was stripped: an alias, a hidden
    ``pytest.param`` case and a ``pytestmark`` were graded as hidden and shipped. Oracle:
    pytest's collection of the file before and after."""
    original, released = tmp_path / "test_hidden_before.py", tmp_path / "test_hidden_after.py"
    original.write_text(HIDDEN_SPELLINGS)
    released.write_text(strip_hidden(HIDDEN_SPELLINGS))
    before, after = _collected(original), _collected(released)
    assert after == {name: False for name, hidden in before.items() if not hidden}
    assert after == {"test_visible": False, "test_cases[0-1-2]": False, "test_cases[0-3-4]": False}


def test_a_hidden_mark_the_release_cannot_strip_is_refused(tmp_path):
    """A spelling the stripper did not understand shipped the test; it is now refused,
    by the release and by check_chapter."""
    tests = TESTS + ("\nMARKS = [pytest.mark.points(1), getattr(pytest.mark, 'hidden')]\n\n"
                     "@pytest.mark.parametrize('a', [pytest.param(1, marks=m) for m in MARKS])\n"
                     "def test_made(exercises, a):\n    pass\n")
    with pytest.raises(ReleaseError, match="cannot strip"):
        strip_hidden(tests, "test_exercises.py")
    folder = _chapter(tmp_path, EXERCISE, tests)
    assert any("cannot strip" in problem for problem in check_chapter(folder, min_tests=1))


# -- 3. autograder --force ---------------------------------------------------------------

def test_autograder_force_touches_and_zips_only_its_own_files(tmp_path):
    """``autograder CH -o DIR --force`` deleted DIR/tests wholesale and zipped all of DIR:
    with DIR the project's root, the project's own tests were lost and the reference
    solution went to Gradescope. Oracle: the folder and zipfile's listing."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mine.py").write_text("def test_mine():\n    pass\n")
    _chapter(tmp_path, EXERCISE)
    bundle = autograder(tmp_path / "chapters" / "01-x", tmp_path, force=True)
    assert (tmp_path / "tests" / "test_mine.py").is_file()
    names = zipfile.ZipFile(bundle).namelist()
    assert {n.split("/")[0] for n in names} == {"setup.sh", "run_autograder", "tests",
                                                "minigraph-src"}
    assert [n for n in names if n.startswith("tests/")] == ["tests/01-x/test_exercises.py"]
    autograder(tmp_path / "chapters" / "01-x", tmp_path, force=True)   # replaces its own
    (tmp_path / "minigraph-src" / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    with pytest.raises(AutograderError, match="not written by"):
        autograder(tmp_path / "chapters" / "01-x", tmp_path, force=True)
    assert (tmp_path / "minigraph-src" / "pyproject.toml").read_text().startswith("[project]")


# -- 4. run_autograder: which file is graded ----------------------------------------------

FAKE_PYTHON = """\
#!/usr/bin/env bash
# the grader, faked: records the file it is asked to grade
if [ "$1" = "-m" ]; then echo "$4" > "$GRADED"; echo '{"score": 1, "tests": []}' > "$8"; exit 0; fi
exec "$REAL_PYTHON" "$@"
"""


def _run_autograder(tmp_path: Path, files: list[str]) -> tuple[str, dict]:
    """(the file run_autograder grades, results.json) for a submission of ``files``."""
    bundle = tmp_path / "bundle"
    autograder(EXAMPLE, bundle)
    root = tmp_path / "autograder"
    for name in files:
        (root / "submission" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "submission" / name).write_text("def add(a, b):\n    return a + b\n")
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    graded = tmp_path / "graded.txt"
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "MINIGRAPH_PYTHON": str(fake),
           "REAL_PYTHON": sys.executable, "GRADED": str(graded)}
    run = subprocess.run(["bash", str(bundle / "run_autograder")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    return (graded.read_text().strip() if graded.exists() else ""), results


def test_run_autograder_grades_the_chapters_file_of_a_whole_course(tmp_path):
    """The whole student edition uploaded: several exercises.py were found and nothing was
    graded ("submission/exercises.py does not exist"); the chapter's own is graded now."""
    graded, _ = _run_autograder(tmp_path, ["01-a/exercises.py", f"{EXAMPLE.name}/exercises.py"])
    assert graded == str(tmp_path / "autograder" / "submission" / EXAMPLE.name / "exercises.py")


def test_run_autograder_says_what_was_uploaded(tmp_path):
    """``exercises (1).py`` uploaded: the student was told ".../exercises.py does not
    exist", not what they had uploaded."""
    graded, results = _run_autograder(tmp_path, ["exercises (1).py", "Exercises.py"])
    assert graded == "" and results["score"] == 0
    assert "exercises (1).py" in results["output"] and "Exercises.py" in results["output"]


# -- 5, 6. release: encodings and markers ------------------------------------------------

@pytest.mark.parametrize("head", [b"\xef\xbb\xbf", b"# -*- coding: latin-1 -*-\n# caf\xe9\n"])
def test_release_keeps_the_encoding_of_a_source_file(tmp_path, head):
    """A BOM was refused ("invalid non-printable character U+FEFF") and a latin-1 coding
    line crashed with a raw UnicodeDecodeError. Oracle: CPython compiles the released
    bytes, which are the original's around the stub."""
    _chapter(tmp_path, head + EXERCISE)
    release(tmp_path / "chapters", tmp_path / "out")
    released = (tmp_path / "out" / "01-x" / "exercises.py").read_bytes()
    assert released == head + b'def add(a, b):\n    raise NotImplementedError(' \
        b'"add: replace this line with your solution")\n'
    compile(released, "exercises.py", "exec")


def test_marker_text_inside_a_string_is_not_a_region():
    """A ``### BEGIN SOLUTION`` line inside a string (release.py's own docstring, which a
    chapter may link to) was read as a solution marker. Oracle: tokenize puts those lines
    in a STRING token; the file is left as it is."""
    source = '"""Example:\n\n    ### BEGIN SOLUTION\n    x\n    ### END SOLUTION\n"""\n' + \
        EXERCISE.decode()
    released = strip_solutions(source)
    assert released == source.replace("    ### BEGIN SOLUTION\n    return a + b\n    ### END "
                                      "SOLUTION\n", '    raise NotImplementedError("add: '
                                      'replace this line with your solution")\n')
    assert ast.get_docstring(ast.parse(released)) == ast.get_docstring(ast.parse(source))


# -- 7. points ----------------------------------------------------------------------------

@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_points_must_be_a_finite_number_at_least_zero(tmp_path, value):
    """``@pytest.mark.points(float("inf"))`` was accepted and results.json held
    ``"score": Infinity``, which is not JSON."""

    class Item:
        def get_closest_marker(self, name):
            return pytest.mark.points(value).mark

    points, problem = points_of(Item())
    assert points == 0 and "finite number >= 0" in problem
    folder = _chapter(tmp_path, EXERCISE, TESTS.replace("points(1)", "points(1e999)"))
    assert declared_tests(folder / "test_exercises.py")[0].marked is False
    assert any("has no @pytest.mark.points(n)" in p for p in check_chapter(folder, min_tests=1))
