"""The release's pytest safety net, third pass: the released test file is collected where
the original lives (its data files and the course's conftest.py apply), tests are compared
per test function (not by ids drawn at import), and every released ``.py`` file is refused
while a comment in it still holds a solution marker (a marker in a string is text).

Oracles: pytest's own collection of the chapter, and the bytes of the released files."""

from __future__ import annotations

import pytest

from minigraph.grading.release import ReleaseError, release, strip_hidden

EXERCISE = "def f():\n    ### BEGIN SOLUTION\n    return 42\n    ### END SOLUTION\n"


def _course(tmp_path, tests: str, **files: str):
    """A course with one chapter 01-c holding ``EXERCISE``, ``tests`` and ``files``."""
    chapter = tmp_path / "course" / "01-c"
    chapter.mkdir(parents=True)
    (chapter / "exercises.py").write_text(EXERCISE)
    (chapter / "test_exercises.py").write_text(tests)
    for name, text in files.items():
        (chapter / name.replace("__", "/")).parent.mkdir(parents=True, exist_ok=True)
        (chapter / name.replace("__", "/")).write_text(text)
    return chapter


def test_a_test_file_is_checked_where_it_lives(tmp_path):
    """The check collected a lone copy of the test file in a temporary folder: a test
    reading ``Path(__file__).parent / "cases.txt"`` at import, or importing a helper that
    the course's conftest.py puts on sys.path, was refused as "does not collect", though
    pytest collects it in the course. Oracle: pytest collects it there (the file is released
    without its hidden test, and the check leaves no file beside it)."""
    tests = ("from pathlib import Path\nimport pytest\nfrom course_helpers import ANSWER\n"
             "CASES = (Path(__file__).parent / 'cases.txt').read_text().split()\n\n"
             "@pytest.mark.parametrize('n', CASES)\ndef test_f(n):\n    assert ANSWER == 42\n\n"
             "@pytest.mark.hidden\ndef test_secret():\n    pass\n")
    chapter = _course(tmp_path, tests, **{"cases.txt": "1 2 3\n"})
    course = chapter.parent
    (course / "conftest.py").write_text(
        "import pathlib, sys\nsys.path.insert(0, str(pathlib.Path(__file__).parent / 'shared'))\n")
    (course / "shared").mkdir()
    (course / "shared" / "course_helpers.py").write_text("ANSWER = 42\n")
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                        "--rootdir", str(course), "--import-mode=importlib",
                        str(chapter / "test_exercises.py")])
    assert code == 0   # the oracle: pytest collects it in the course
    release(course, tmp_path / "out")
    released = (tmp_path / "out" / "01-c" / "test_exercises.py").read_text()
    assert released == tests.split("@pytest.mark.hidden")[0]
    assert sorted(p.name for p in chapter.iterdir()) == ["cases.txt", "exercises.py",
                                                         "test_exercises.py"]


def test_cases_are_compared_per_test_function(tmp_path):
    """Ids drawn at random at import differ between two collections, and automatic ids
    are renumbered when a hidden case is cut: "the release would lose the visible tests"
    was claimed for a file without any hidden test, and for one whose hidden case was cut.
    Oracle: the released text (unchanged, or without the hidden case only)."""
    random_ids = ("import random\nimport pytest\n\n@pytest.mark.parametrize('seed', "
                  "[random.randrange(10**9) for _ in range(3)])\ndef test_f(seed):\n    pass\n")
    renumbered = ("import pytest\n\n@pytest.mark.parametrize('x', [[1], pytest.param([2], "
                  "marks=pytest.mark.hidden), [3]])\ndef test_g(x):\n    pass\n")
    for tests in (random_ids, renumbered):
        chapter = _course(tmp_path / str(len(tests)), tests)
        released = strip_hidden(tests, str(chapter / "test_exercises.py"))
        assert released == tests.replace("pytest.param([2], marks=pytest.mark.hidden), ", "")


def test_a_marker_left_in_a_comment_is_refused_in_every_file_and_text_is_not(tmp_path):
    """Only exercises.py was checked for a marker left in its released text: another
    ``.py`` of the chapter with a marker after code on its line was released with its
    solution in it. And a marker inside a docstring of exercises.py (text, not a marker)
    was refused. Oracle: nothing is written for the first; the second is released with
    only its region replaced."""
    solution = ("def area(r):\n    import math  ### BEGIN SOLUTION\n"
                "    return math.pi * r * r  ### END SOLUTION\n")
    chapter = _course(tmp_path, "def test_f():\n    pass\n",
                      **{"helpers__geometry.py": solution})
    with pytest.raises(ReleaseError, match=r"geometry.py: line 2 .* solution marker in a comment"):
        release(chapter.parent, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (chapter / "helpers" / "geometry.py").unlink()
    text = 'def g():\n    """Between\n    ### BEGIN SOLUTION\n    and ### END SOLUTION."""\n'
    (chapter / "exercises.py").write_text(EXERCISE + text)
    release(chapter.parent, tmp_path / "out")
    stub = 'def f():\n    raise NotImplementedError("f: replace this line with your solution")\n'
    assert (tmp_path / "out" / "01-c" / "exercises.py").read_text() == stub + text
