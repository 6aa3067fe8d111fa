"""The instructor's workflow around the grader, second round: what a probe of the new
``release``, ``autograder --force``, ``run_autograder`` and sandbox still got wrong.

Each test names the bug it guards against. The oracles are independent of minigraph:
CPython's own compiling and decoding, pytest's own collection (which tests it sees as
marked hidden), the bytes on disk, a strict JSON reading.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_grading_workflow import EXAMPLE, TESTS, UNREADABLE, _collected, _run_autograder

from minigraph.grading.autograder import AutograderError, autograder
from minigraph.grading.collect import read_source
from minigraph.grading.plugin import points_of
from minigraph.grading.release import ReleaseError, release, strip_hidden, strip_solutions

# -- release: solutions ------------------------------------------------------------------

def test_solution_regions_are_found_whatever_ends_the_lines():
    """A file with classic-Mac "\\r" line endings was released with every solution in it
    (the markers were looked for in lines split on "\\n" only), and a form feed inside a
    line (which str.splitlines splits on, Python does not) shifted the region cut by one
    line. Oracle: CPython compiles and runs the released text."""
    for source in ("def f():\r    ### BEGIN SOLUTION\r    return 1\r    ### END SOLUTION\r",
                   "x = 1  # page\x0cbreak\ndef f():\n    ### BEGIN SOLUTION\n    return 1\n"
                   "    ### END SOLUTION\n"):
        released = strip_solutions(source)
        assert "return 1" not in released and "SOLUTION" not in released
        namespace: dict = {}
        exec(compile(released, "exercises.py", "exec"), namespace)
        with pytest.raises(NotImplementedError):
            namespace["f"]()


def test_the_release_refuses_an_exercises_file_still_holding_a_marker(tmp_path):
    """A marker the region scan does not take (here a comment after code, not alone on
    its line) was released as it is: whatever scan misses a marker, exercises.py may hold
    a solution. It is refused. (A marker's text inside a string is text: not refused.)"""
    chapter = tmp_path / "chapters" / "01-x"
    chapter.mkdir(parents=True)
    (chapter / "exercises.py").write_text('def f():\n    x = 1\n    return x  ### BEGIN SOLUTION\n')
    (chapter / "test_exercises.py").write_text(TESTS)
    with pytest.raises(ReleaseError, match="exercises.py: line 3 .* solution marker"):
        release(tmp_path / "chapters", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- release: hidden tests ---------------------------------------------------------------

SPELLINGS = """\
import pytest
secret, two = pytest.mark.hidden, pytest.mark.points(2)

@secret
class TestHidden:
    def test_a(self):
        pass

class TestMore(TestHidden):
    def test_b(self):
        assert "SECRET"

@two
@pytest.mark.parametrize("x", [1, pytest.param(2, marks=secret)], ids=["small", "big"])
def test_ids(x):
    pass

@pytest.mark.parametrize("x", argvalues=[pytest.param(7, marks=pytest.mark.hidden)])
def test_by_keyword(x):
    assert "SECRET"

class Cell:
    hidden = 0.0

@two
def test_visible():
    hidden = getattr(Cell(), "hidden", None)
    assert hidden == 0.0
"""


def test_more_spellings_of_the_hidden_mark_are_stripped(tmp_path):
    """A tuple alias (its test shown, and ``two`` lost with it), a subclass of a hidden
    class, a cut case whose ids= entry stayed (the file no longer collected), all cases
    hidden through ``argvalues=``: each shipped a hidden test or broke the file. And a
    visible test reading an attribute ``hidden``, or a local named ``hidden``, was
    refused. Oracle: pytest's collection of the file before and after."""
    released = strip_hidden(SPELLINGS, "test_exercises.py")
    assert "SECRET" not in released
    (tmp_path / "test_before.py").write_text(SPELLINGS)
    (tmp_path / "test_after.py").write_text(released)
    before, after = _collected(tmp_path / "test_before.py"), _collected(tmp_path / "test_after.py")
    assert after == {name: False for name, hidden in before.items() if not hidden}
    assert after == {"test_ids[small]": False, "test_visible": False}


def test_a_spelling_the_stripper_does_not_know_is_refused(tmp_path):
    """``m = pytest.mark`` then ``@m.hidden``, or the mark imported from a module of the
    chapter, was released with the hidden test in it. pytest's own collection of the
    released file now judges, and refuses it."""
    (tmp_path / "marks.py").write_text("import pytest\nsecret = pytest.mark.hidden\n")
    for head in ("m = pytest.mark\n@m.hidden\n", "from marks import secret\n@secret\n"):
        source = f"import pytest\n{head}def test_secret():\n    pass\n\ndef test_shown():\n    pass\n"
        (tmp_path / "test_exercises.py").write_text(source)
        with pytest.raises(ReleaseError, match="cannot strip.*test_secret"):
            strip_hidden(source, str(tmp_path / "test_exercises.py"))


# -- autograder --force ------------------------------------------------------------------

def test_autograder_force_never_writes_through_a_link(tmp_path):
    """--force overwrote (and made executable) the target of a link named setup.sh, outside
    DIR, when that file merely mentioned `minigraph autograder`, and wrote the tests
    through a linked tests/ folder. Oracle: the bytes and mode of the files outside DIR."""
    outside = tmp_path / "keep" / "notes.txt"
    outside.parent.mkdir()
    outside.write_text("made with `minigraph autograder`\n")
    for link in ("setup.sh", "tests"):
        out = tmp_path / f"out-{link}"
        out.mkdir()
        (out / link).symlink_to(outside if link == "setup.sh" else outside.parent)
        with pytest.raises(AutograderError, match="symbolic link"):
            autograder(EXAMPLE, out, force=True)
    assert outside.read_text() == "made with `minigraph autograder`\n"
    assert outside.stat().st_mode & 0o111 == 0 and os.listdir(outside.parent) == ["notes.txt"]
    out = tmp_path / "out-file"   # a file of the user's that mentions the command
    out.mkdir()
    (out / "setup.sh").write_text("made with `minigraph autograder`\n")
    with pytest.raises(AutograderError, match="remove the bundle.s files"):
        autograder(EXAMPLE, out, force=True)


# -- run_autograder ----------------------------------------------------------------------

def test_run_autograder_finds_the_file_in_a_folder_with_a_newline(tmp_path):
    """One exercises.py in a folder whose name holds a newline was counted as two (the
    script read find's output line by line): "several exercises.py", nothing graded."""
    graded, _ = _run_autograder(tmp_path, ["my\nwork/exercises.py"])
    assert graded == str(tmp_path / "autograder" / "submission" / "my\nwork" / "exercises.py")


def test_run_autograder_lists_the_upload_whole_characters_and_links(tmp_path):
    """The listing of an upload with no exercises.py was cut with ``head -c``, inside a
    character: results.json held a lone surrogate, which strict JSON readers reject. A
    symbolic link (never graded) was left out: "uploaded: nothing". Oracle: a strict
    UTF-8 decoding of results.json and its text."""
    names = ["\u00e9" * 125 + str(k) for k in range(5)]
    link = tmp_path / "autograder" / "submission" / "sub" / "exercises.py"
    link.parent.mkdir(parents=True)
    link.symlink_to("/etc/hostname")
    _, results = _run_autograder(tmp_path, names)
    raw = (tmp_path / "autograder" / "results" / "results.json").read_bytes()
    assert b"\\ud" not in raw and json.loads(raw.decode("utf-8", "strict")) == results
    assert "sub/exercises.py (a symbolic link" in results["output"]
    assert names[0] in results["output"]


# -- the sandbox, sources, points --------------------------------------------------------

PRELOADED_AND_DECLARED = """\
import importlib, sys
from minigraph.grading.sandbox import PRELOAD, _preload_codec
for name in PRELOAD:
    importlib.import_module(name)
for source in sys.argv[1:]:
    _preload_codec(source)   # what the sandbox reads before its switch of account
""" + UNREADABLE + """\
for source in sys.argv[1:]:
    with open(source, "rb") as f:
        exec(compile(f.read(), source, "exec"), {})    # an import of exercises.py
"""


def test_the_sandbox_loads_the_codec_the_submission_declares(tmp_path):
    """A submission declaring cp1251, koi8-r or gbk scored 0 when graded as root ("unknown
    encoding"): only seven codecs were loaded before the switch of account. Oracle:
    CPython compiles the bytes with the installation unreadable."""
    sources = []
    for encoding in ("cp1251", "koi8-r", "gbk"):
        sources.append(tmp_path / encoding / "exercises.py")
        sources[-1].parent.mkdir()
        sources[-1].write_bytes(f"# -*- coding: {encoding} -*-\n# \u0436\nx = 1\n".encode(encoding))
    # (the declaration on Python's second line of a classic-Mac file, after a first line
    # longer than 64 KiB: the grader read lines ended by "\n" only, of 64 KiB at most)
    for name, text in (("mac", "#!/usr/bin/env python\r# -*- coding: cp1251 -*-\r# \u0436\rx = 1\r"),
                       ("long", "#" + "x" * 70_000 + "\n# -*- coding: koi8-r -*-\n# \u0436\n")):
        sources.append(tmp_path / name / "exercises.py")
        sources[-1].parent.mkdir()
        sources[-1].write_bytes(text.encode("cp1251" if name == "mac" else "koi8-r"))
    package_root = str(Path(__import__("minigraph").__file__).resolve().parents[1])
    run = subprocess.run([sys.executable, "-c", PRELOADED_AND_DECLARED, *map(str, sources)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": package_root})
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_source_in_an_unusable_codec_is_a_syntax_error_naming_it(tmp_path):
    """``# coding: undefined`` gave a raw UnicodeError traceback instead of the
    SyntaxError naming the file. Oracle: CPython's compile refuses the same bytes."""
    path = tmp_path / "test_exercises.py"
    path.write_bytes(b"# coding: undefined\nx = 1\n")
    with pytest.raises(SyntaxError):
        compile(path.read_bytes(), str(path), "exec")
    with pytest.raises(SyntaxError, match="test_exercises.py: cannot be read"):
        read_source(path)


def test_points_are_bounded_so_that_the_total_is_finite():
    """Two tests worth 1e308 each passed the check: their sum overflowed and the grader
    died without results.json. Oracle: float arithmetic (1e308 + 1e308 is inf)."""
    assert 1e308 + 1e308 == float("inf")

    class Item:
        def get_closest_marker(self, name):
            return pytest.mark.points(1e308).mark

    points, problem = points_of(Item())
    assert points == 0 and "at most 1,000,000" in problem


# -- folders the grader must never close -------------------------------------------------------

def test_the_grader_never_closes_a_folder_others_share(tmp_path, monkeypatch):
    """With --tests, the grader took the test file's grandparent for the course when a
    sibling folder held a test_exercises.py too, and closed it to others: two chapters
    unpacked side by side in /tmp made it close /tmp (mode 1777 -> 1770), and every
    sandbox, made under /tmp, then failed on its own files (every student got 0). A
    folder with the sticky bit, or one holding the temporary folder or the Python the
    sandbox runs, is left open; a course folder of its own is still closed."""
    import stat
    import tempfile

    from minigraph.grading import isolation

    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    assert isolation.close_to_others(shared) is False
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    holder = tmp_path / "holder"
    (holder / "inner").mkdir(parents=True)
    os.chmod(holder, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(holder / "inner"))
    assert isolation.close_to_others(holder) is False  # (it holds the temporary folder)
    monkeypatch.setattr(tempfile, "tempdir", None)
    course = tmp_path / "course"
    course.mkdir()
    os.chmod(course, 0o755)
    assert isolation.close_to_others(course) is True
    assert stat.S_IMODE(course.stat().st_mode) == 0o750


def test_run_autograder_finds_a_file_deep_in_the_upload_and_imports_nothing_of_it(tmp_path):
    """An upload of 1,100 nested folders made the search for exercises.py (os.walk, which
    recurses) raise RecursionError: no results.json. And run_autograder, started from the
    submission's folder, let Python import the student's own minigraph/ as root (the
    current folder comes first on its path). Oracle: the file's path, and no file written
    by the planted package."""
    import importlib

    ag = importlib.import_module("minigraph.grading.autograder")  # (the module: the
    # package's name autograder is its function)

    deep = tmp_path / "up"
    deep.mkdir()
    folder = deep
    for _ in range(1100):  # (one by one: Path.mkdir(parents=True) recurses too)
        folder = folder / "a"
        folder.mkdir()
    (deep / "exercises.py").write_text("x = 1\n")
    try:
        search = ("import sys; from minigraph.grading.gradescope import find_submission; "
                  "sys.exit(find_submission(*sys.argv[1:]))")
        run = subprocess.run([sys.executable, "-c", search, str(deep), "ch",
                              str(tmp_path / "results.json")], capture_output=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(Path(ag.__file__).parents[2])})
    finally:  # (bottom up, one by one: pytest's clean-up, shutil.rmtree, recurses too)
        while folder != deep:
            folder.rmdir()
            folder = folder.parent
    assert run.returncode == 0 and run.stdout == os.fsencode(deep / "exercises.py"), run.stderr
    assert 'cd /' in ag.RUN_AUTOGRADER  # (the folder Python imports from first holds no package)
