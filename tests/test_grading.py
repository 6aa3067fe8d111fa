"""The grader (`minigraph grade`) and the release (`minigraph release`).

The gradings run against a small example chapter, tests/grading_fixtures/chapters/99-example
(five exercises, 11 points over 7 tests), and against student copies of it that do what
students do: crash with os._exit (in a test, or while being imported), loop forever (in a
way pytest-timeout can stop, and in a way only a kill can), import a module that does not
exist, delete a function, write a syntax error. Each of those must cost exactly the tests
it touches, and the report must list every test all the same.

The gradings are slow-ish (each starts a pytest process that imports minigraph), so they
run once, concurrently, and the tests look at their reports. The last tests are the proofs
for the real chapters (chapters/*): they appear as soon as a chapter exists.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigraph.grading as grading_package
from minigraph.grading import (ExercisesImportError, GradingError, ReleaseError,
                               add_autograder_parser, add_grade_parser, add_release_parser, check_chapter, grade,
                               load_exercises, locate, release, results_json, strip_solutions)
from minigraph.grading import loader
from minigraph.grading.collect import declared_tests
from minigraph.grading.release import BEGIN, END, _is_hidden, solution_regions

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "grading_fixtures"
CHAPTERS = FIXTURES / "chapters"
EXAMPLE = CHAPTERS / "99-example"
STUDENTS = FIXTURES / "students"
TIMEOUT = 2.0

POINTS = {"test_add": 1, "test_mean": 2, "test_dual_mul": 3, "test_sign[-2.5--1]": 1,
          "test_sign[0-0]": 1, "test_sign[4-1]": 1, "TestCounter::test_steps": 2}
ALL_TESTS = list(POINTS)
TOTAL = sum(POINTS.values())


# -- the gradings, run once and concurrently ----------------------------------------------

def _variants(work: Path) -> dict[str, dict]:
    released = work / "released"
    release(CHAPTERS, released)

    syntax = work / "syntax-error"
    syntax.mkdir()
    text = (EXAMPLE / "exercises.py").read_text().replace("return a + b", "return a +* b")
    (syntax / "exercises.py").write_text(text)

    wrong = work / "wrong-answer"
    wrong.mkdir()
    text = (EXAMPLE / "exercises.py").read_text().replace("return a + b", "return a - b")
    (wrong / "exercises.py").write_text(text)

    # a test file breaking the contract (imports exercises at module level), graded with
    # an exercises.py that raises on import: pytest cannot even collect the tests
    eager = work / "eager-import"
    eager.mkdir()
    tests = (EXAMPLE / "test_exercises.py").read_text()
    (eager / "test_exercises.py").write_text("import exercises\n" + tests)
    (eager / "exercises.py").write_text("raise RuntimeError('half-written module')\n")

    jobs = {"solution": {"path": EXAMPLE, "course": CHAPTERS},
            "released": {"path": released / EXAMPLE.name, "course": CHAPTERS},
            "syntax-error": {"path": syntax, "tests": EXAMPLE},
            "wrong-answer": {"path": wrong, "tests": EXAMPLE},
            "eager-import": {"path": eager, "tests": eager}}
    for student in ("crash", "crash-on-import", "infinite-loop", "stubborn-loop",
                    "import-error", "missing-function"):
        jobs[student] = {"path": STUDENTS / student, "tests": EXAMPLE}
    return jobs


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    jobs = _variants(tmp_path_factory.mktemp("grading"))
    # the ones that wait for timeouts or restart after crashes go first
    slow = ["stubborn-loop", "infinite-loop", "crash", "crash-on-import"]
    order = slow + [name for name in jobs if name not in slow]
    with ThreadPoolExecutor(max_workers=5) as pool:
        futures = {name: pool.submit(grade, timeout=TIMEOUT, **jobs[name]) for name in order}
        return {name: future.result() for name, future in futures.items()}


def outcome(report) -> dict[str, str]:
    return {r.name: r.status for r in report.results}


def failed(report) -> list[str]:
    return [r.name for r in report.results if r.status != "passed"]


def output_of(report, name: str) -> str:
    return next(r.output for r in report.results if r.name == name)


def assert_lists_every_test(report):
    assert [r.name for r in report.results] == ALL_TESTS
    assert {r.name: r.max_score for r in report.results} == POINTS
    assert report.max_score == TOTAL


# -- grading ------------------------------------------------------------------------------

def test_solutions_score_full_marks(reports):
    report = reports["solution"]
    assert_lists_every_test(report)
    assert report.full_marks and report.score == TOTAL
    assert all(r.output == "" and r.problem == "" for r in report.results)
    assert report.processes == 1 and not report.notes


def test_released_version_scores_zero_and_lists_every_test(reports):
    report = reports["released"]
    assert_lists_every_test(report)
    assert report.score == 0 and failed(report) == ALL_TESTS
    for r in report.results:
        assert r.output.startswith("NotImplementedError: ")
        assert "replace this line with your solution" in r.output
        assert "exercises.py, line" in r.output
    assert report.processes == 1


def test_a_wrong_answer_shows_the_assert_explained(reports):
    report = reports["wrong-answer"]
    assert_lists_every_test(report)
    assert failed(report) == ["test_add"]
    message = output_of(report, "test_add")
    assert message.startswith("AssertionError: assert -1 == 5")
    assert "exercises.add" in message and "0x" not in message


def test_a_crash_costs_only_the_test_it_happens_in(reports):
    report = reports["crash"]
    assert_lists_every_test(report)
    assert failed(report) == ["test_mean"]
    assert report.score == TOTAL - POINTS["test_mean"]
    assert "crashed" in output_of(report, "test_mean")
    assert "exited with code 3" in output_of(report, "test_mean")
    assert report.processes == 2  # one restart, for the tests after the crash


def test_a_crash_while_importing_fails_every_test_after_one_restart(reports):
    report = reports["crash-on-import"]
    assert_lists_every_test(report)
    assert report.score == 0
    for r in report.results:
        assert "exercises.py could not be imported" in r.output
        assert "exited with code 7" in r.output
    assert report.processes == 1  # remembered: not one crash per test


def test_an_infinite_loop_costs_only_its_test(reports):
    report = reports["infinite-loop"]
    assert_lists_every_test(report)
    assert failed(report) == ["test_dual_mul"]
    message = output_of(report, "test_dual_mul")
    assert message.startswith("timed out") and "2 s" in message
    assert "exercises.py, line" in message and "in dual_mul" in message
    assert report.processes == 1  # the timeout signal interrupted it; the sandbox went on


def test_a_loop_that_swallows_the_timeout_is_killed_and_costs_only_its_test(reports):
    report = reports["stubborn-loop"]
    assert_lists_every_test(report)
    assert failed(report) == ["test_dual_mul"]
    assert output_of(report, "test_dual_mul").startswith("timed out")
    assert report.processes == 2


def test_an_import_error_scores_zero_with_a_readable_message(reports):
    report = reports["import-error"]
    assert_lists_every_test(report)
    assert report.score == 0
    for r in report.results:
        assert r.output.startswith("exercises.py could not be imported: ModuleNotFoundError: "
                                   "No module named 'numpyy'")
        assert "exercises.py, line 4" in r.output
        assert "Traceback" not in r.output and "minigraph.grading" not in r.output
    # the table gives the reason once, for all the tests it concerns
    assert report.table(width=300).count("No module named 'numpyy'") == len(ALL_TESTS) + 1


def test_a_syntax_error_scores_zero_and_names_the_line(reports):
    report = reports["syntax-error"]
    assert_lists_every_test(report)
    assert report.score == 0
    line = next(i for i, text in enumerate((EXAMPLE / "exercises.py").read_text().splitlines(), 1)
                if "return a + b" in text)
    for r in report.results:
        assert r.output.startswith("exercises.py could not be imported: SyntaxError: ")
        assert f"(exercises.py, line {line})" in r.output


def test_a_missing_function_costs_only_the_tests_that_use_it(reports):
    report = reports["missing-function"]
    assert_lists_every_test(report)
    assert failed(report) == ["test_mean"]
    assert output_of(report, "test_mean") == \
        "exercises.py has no function or name 'mean' (was it renamed or deleted?)"


def test_a_test_file_that_cannot_be_collected_still_lists_every_declared_test(reports):
    report = reports["eager-import"]
    # read from the source: a parametrized test is listed once, worth its cases together
    assert [r.name for r in report.results] == ["test_add", "test_mean", "test_dual_mul",
                                                "test_sign", "TestCounter::test_steps"]
    assert report.max_score == TOTAL and report.score == 0
    for r in report.results:  # the tests run in the grader: `import exercises` finds nothing
        assert "could not be collected" in r.output and "No module named 'exercises'" in r.output
    assert any("could not be collected" in note for note in report.notes)


def test_the_table_shows_points_per_test_and_the_total(reports):
    table = reports["crash"].table(width=100)
    assert re.search(r"test_add\s+1 / 1\s+passed", table)
    assert re.search(r"test_mean\s+0 / 2\s+failed: crashed", table)
    assert re.search(rf"total\s+{TOTAL - 2} / {TOTAL}", table)
    assert "Why the failed tests failed:" in table


# -- Gradescope's results.json and the command line ---------------------------------------

def check_gradescope_schema(data: dict) -> None:
    assert isinstance(data["score"], (int, float))
    assert isinstance(data["tests"], list) and data["tests"]
    for test in data["tests"]:
        assert {"name", "score", "max_score", "status", "output"} <= set(test)
        assert isinstance(test["name"], str) and isinstance(test["output"], str)
        assert isinstance(test["score"], (int, float)) and isinstance(test["max_score"], (int, float))
        assert test["status"] in ("passed", "failed")
        assert test["score"] == (test["max_score"] if test["status"] == "passed" else 0)
    assert data["score"] == sum(t["score"] for t in data["tests"])
    json.dumps(data)  # plain JSON


def test_results_json_has_gradescope_schema(reports):
    data = results_json(reports["missing-function"])
    check_gradescope_schema(data)
    assert data["score"] == TOTAL - 2
    assert [t["name"] for t in data["tests"]] == ALL_TESTS
    mean = data["tests"][1]
    assert mean == {"name": "test_mean", "score": 0, "max_score": 2, "status": "failed",
                    "output": "exercises.py has no function or name 'mean' (was it renamed or deleted?)",
                    "visibility": "visible"}
    assert data["stdout_visibility"] == "hidden"


def test_hidden_tests_are_graded_after_published_and_left_out_of_the_release(tmp_path):
    course = tmp_path / "course"
    shutil.copytree(EXAMPLE, course / EXAMPLE.name)
    tests = course / EXAMPLE.name / "test_exercises.py"
    tests.write_text(tests.read_text() + "\n\n@pytest.mark.hidden\n@pytest.mark.points(4)\n"
                     "def test_add_secretly(exercises):\n    assert exercises.add(-1, 1) == 0\n")
    report = grade(course / EXAMPLE.name, course=course, timeout=TIMEOUT)
    data = results_json(report)
    secret = next(t for t in data["tests"] if t["name"] == "test_add_secretly")
    assert secret["status"] == "passed" and secret["visibility"] == "after_published"
    release(course, tmp_path / "student")
    released = (tmp_path / "student" / EXAMPLE.name / "test_exercises.py").read_text()
    assert "test_add_secretly" not in released and "test_add(" in released


# -- an object that says yes to everything -----------------------------------------------------

_TRUTH_TESTS = '''


@pytest.mark.points(1)
def test_sign_is_not_zero(exercises):
    assert exercises.sign(2) != 0


@pytest.mark.points(1)
def test_sign_is_truthy(exercises):
    assert exercises.sign(5)


@pytest.mark.points(1)
def test_sign_equals(exercises):
    assert exercises.sign(-3) == -1
'''

_YES_MAN = '''
class Yes:
    """Equal to everything, unequal to everything, true, and a number when asked."""
    def __eq__(self, other): return True
    def __ne__(self, other): return True
    def __bool__(self): return True
    def __hash__(self): return 0
    def __float__(self): return -1.0
    def __int__(self): return -1
def sign(x):
    return Yes()
'''


def test_an_object_that_says_yes_to_everything_passes_nothing(tmp_path):
    """A handle to the student's object was truthy and unequal to everything (Python's
    defaults, answered in the grader without the object): returning any object passed
    `assert exercises.sign(5)` and `assert exercises.sign(2) != 0`. Asking the object's
    own __bool__/__eq__ instead would let it say yes. Those tests must fail for it, and
    pass for the honest solution."""
    course = tmp_path / "course"
    shutil.copytree(EXAMPLE, course / EXAMPLE.name)
    tests = course / EXAMPLE.name / "test_exercises.py"
    tests.write_text(tests.read_text() + _TRUTH_TESTS)
    names = ["test_sign_is_not_zero", "test_sign_is_truthy", "test_sign_equals"]
    honest = grade(course / EXAMPLE.name, course=course, timeout=TIMEOUT)
    assert {r.name: r.status for r in honest.results if r.name in names} == \
        dict.fromkeys(names, "passed")
    student = tmp_path / "student" / EXAMPLE.name  # (the chapter is named by its folder)
    student.mkdir(parents=True)
    (student / "exercises.py").write_text(textwrap.dedent(_YES_MAN))
    report = grade(student, course=course, timeout=TIMEOUT)
    got = {r.name: r for r in report.results if r.name in names}
    assert {name: r.status for name, r in got.items()} == dict.fromkeys(names, "failed"), \
        report.table(width=200)
    assert "returned a Yes object where a value was expected" in got["test_sign_is_truthy"].output


def test_an_answer_too_large_to_send_fails_its_test_with_the_reason(tmp_path):
    """An answer over the channel's message limit crashed the sandbox ("the test process
    exited with code 1"): the size check raised after the answer was made. The sandbox
    now answers with the error, and the next test runs in the same sandbox."""
    student = tmp_path / "student" / EXAMPLE.name
    student.mkdir(parents=True)
    (student / "exercises.py").write_text(
        (EXAMPLE / "exercises.py").read_text()
        + "\nimport numpy as np\ndef add(a, b):\n    return np.zeros(5_000_000)\n")
    report = grade(student, course=EXAMPLE.parent, timeout=TIMEOUT)
    got = {r.name: r for r in report.results}
    assert got["test_add"].status == "failed"
    assert "MiB that cross between the grader and the sandbox" in got["test_add"].output
    assert got["test_mean"].status == "passed", report.table(width=200)


# Returned as "source code" by graph_to_source: run in the grader, it would find the
# grader's record of outcomes and mark every test passed.
_COLLECTOR_ATTACK = """
import gc as _gc
from minigraph.grading.plugin import Collector as _C
class _AllPass(dict):
    def __setitem__(self, k, v):
        dict.__setitem__(self, k, ("passed", ""))
for _o in _gc.get_objects():
    if isinstance(_o, _C):
        _d = _AllPass()
        for _t in _o.tests:
            _d[_t["nodeid"]] = None
        _o.outcomes = _d
def f(*args):
    return ()
"""


def test_source_text_a_student_returns_runs_in_the_sandbox(tmp_path):
    """Chapter 04's test exec'd the text graph_to_source returned in the grader's own
    process: an attack that solved nothing scored 12 / 12 by rewriting the collector's
    outcomes. The text runs in the sandbox now, and check_chapter flags exec, eval and
    compile outside the helpers a test file sends there."""
    chapter = REPO / "chapters" / "04-define-and-run-vs-define-by-run"
    student = tmp_path / "student" / chapter.name
    student.mkdir(parents=True)
    (student / "exercises.py").write_text(
        f"PAYLOAD = {_COLLECTOR_ATTACK!r}\n"
        "def graph_to_source(nodes, inputs, outputs, name='f'):\n    return PAYLOAD\n")
    report = grade(student, course=chapter.parent, timeout=10.0, total_timeout=120.0)
    assert report.score == 0, report.table(width=200)
    course = tmp_path / "course" / chapter.name
    shutil.copytree(chapter, course)
    tests = course / "test_exercises.py"
    tests.write_text(tests.read_text() + "\n\ndef test_unsafe(exercises):\n"
                     "    exec(exercises.graph_to_source([], [], [], name='f'), {})\n")
    assert any("exec() runs code in the grader's process" in p for p in check_chapter(course))


def cli(argv):
    """The command line as minigraph/cli.py builds it."""
    parser = argparse.ArgumentParser(prog="minigraph")
    sub = parser.add_subparsers(dest="command", required=True)
    add_grade_parser(sub)
    add_release_parser(sub)
    add_autograder_parser(sub)
    args = parser.parse_args(argv)
    return args.run(args)


def test_grade_command_prints_the_table_and_writes_results_json(tmp_path, capsys):
    out = tmp_path / "results" / "results.json"
    assert cli(["grade", str(EXAMPLE), "--json", str(out), "--timeout", "5",
                "--course", str(CHAPTERS)]) == 0
    printed = capsys.readouterr().out
    assert "Grading 99-example" in printed and re.search(rf"total\s+{TOTAL} / {TOTAL}", printed)
    data = json.loads(out.read_text())
    check_gradescope_schema(data)
    assert data["score"] == TOTAL and all(t["status"] == "passed" for t in data["tests"])


def test_grade_command_reports_what_it_cannot_grade(tmp_path, capsys):
    assert cli(["grade", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    lonely = tmp_path / "my-homework"
    lonely.mkdir()
    (lonely / "exercises.py").write_text("")
    assert cli(["grade", str(lonely), "--json", str(tmp_path / "results.json")]) == 2
    assert "--tests" in capsys.readouterr().err
    data = json.loads((tmp_path / "results.json").read_text())  # for Gradescope to show
    assert data["score"] == 0 and data["tests"] == [] and "--tests" in data["output"]
    with pytest.raises(SystemExit):
        cli(["grade", str(EXAMPLE), "--timeout", "0"])


def test_where_the_tests_come_from(tmp_path, monkeypatch):
    # a student's copy holding only exercises.py, in a folder named like the chapter
    copy = tmp_path / "99-example"
    copy.mkdir()
    shutil.copy(STUDENTS / "crash" / "exercises.py", copy)
    monkeypatch.setenv("MINIGRAPH_CHAPTERS", str(CHAPTERS))
    assert locate(copy) == (copy / "exercises.py", EXAMPLE / "test_exercises.py")
    assert locate(copy / "exercises.py")[1] == EXAMPLE / "test_exercises.py"
    # --tests wins, as a folder or a file; then PATH's own test file
    assert locate(STUDENTS / "crash", tests=EXAMPLE)[1] == EXAMPLE / "test_exercises.py"
    assert locate(STUDENTS / "crash", tests=EXAMPLE / "test_exercises.py")[1] == \
        EXAMPLE / "test_exercises.py"
    assert locate(EXAMPLE)[1] == EXAMPLE / "test_exercises.py"
    assert locate(STUDENTS / "crash", course=CHAPTERS.parent / "nowhere", tests=EXAMPLE)[1] == \
        EXAMPLE / "test_exercises.py"
    with pytest.raises(GradingError, match="--tests"):
        locate(STUDENTS / "crash")
    # a test file planted in the submission is never the one graded
    planted = tmp_path / "elsewhere" / "99-example"
    planted.mkdir(parents=True)
    (planted / "exercises.py").write_text("")
    (planted / "test_exercises.py").write_text("def test_free(): pass\n")
    assert locate(planted)[1] == EXAMPLE / "test_exercises.py"
    lonely = tmp_path / "98-not-a-chapter"
    lonely.mkdir()
    (lonely / "exercises.py").write_text("")
    (lonely / "test_exercises.py").write_text("def test_free(): pass\n")
    with pytest.raises(GradingError, match="never from the submission"):
        locate(lonely)


def test_chapter_tests_also_run_under_plain_pytest_with_strict_markers(tmp_path):
    """A student may run `pytest` in a released chapter: the fixture finds exercises.py
    beside the test file and the plugin registers the points marker."""
    for name in ("exercises.py", "test_exercises.py"):
        shutil.copy(EXAMPLE / name, tmp_path)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    temp = tmp_path / "temp"   # the run's temporary folder: the sandbox's folder goes there
    temp.mkdir()
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(REPO),
           "TMPDIR": str(temp)}
    env.pop("PYTEST_ADDOPTS", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--strict-markers", "-p", "minigraph.grading.plugin"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{len(ALL_TESTS)} passed" in run.stdout
    # the sandbox's folder is removed when the session ends (every run once left one)
    assert [p.name for p in temp.iterdir() if not p.name.startswith("pytest-of-")] == []


# -- loading exercises.py -----------------------------------------------------------------

@pytest.fixture
def clean_loader(monkeypatch):
    monkeypatch.delitem(sys.modules, "exercises", raising=False)
    monkeypatch.setattr(loader, "_loaded", {})


def test_a_failed_import_is_remembered_not_repeated(tmp_path, clean_loader):
    counter = tmp_path / "imports.txt"
    (tmp_path / "exercises.py").write_text(textwrap.dedent(f"""
        with open({str(counter)!r}, "a") as f:
            f.write("x")
        1 / 0
    """))
    messages = []
    for _ in range(3):
        with pytest.raises(ExercisesImportError) as info:
            load_exercises(tmp_path)
        messages.append(str(info.value))
    assert counter.read_text() == "x"  # imported once
    assert messages[0] == messages[2]
    assert messages[0].startswith("exercises.py could not be imported: ZeroDivisionError")
    assert "exercises.py, line 4, in <module>" in messages[0]
    assert "exercises" not in sys.modules


def test_the_module_is_loaded_by_path_once(tmp_path, clean_loader):
    (tmp_path / "exercises.py").write_text("def f():\n    return 42\n")
    module = load_exercises(tmp_path / "exercises.py")
    assert module.f() == 42 and load_exercises(tmp_path) is module
    assert sys.modules["exercises"] is module
    with pytest.raises(ExercisesImportError, match="not found"):
        load_exercises(tmp_path / "elsewhere")


# -- release ------------------------------------------------------------------------------

def regions_of(text: str) -> list[tuple[int, int]]:
    """(begin, end) line indices (0-based, inclusive) of the marker pairs."""
    spans, begin = [], None
    for i, line in enumerate(text.splitlines(keepends=True)):
        if line.strip() == BEGIN:
            begin = i
        elif line.strip() == END:
            spans.append((begin, i))
    return spans


def assert_stripped_exactly(original: str, released: str) -> None:
    """released = original with each region (markers included) replaced by one stub line
    at the marker's indentation; everything else byte for byte."""
    lines = original.splitlines(keepends=True)
    out = released.splitlines(keepends=True)
    expected, position, stubs = [], 0, []
    for begin, end in regions_of(original):
        expected.extend(lines[position:begin])
        stubs.append(len(expected))
        expected.append(None)
        position = end + 1
    expected.extend(lines[position:])
    assert len(out) == len(expected)
    for i, (got, want) in enumerate(zip(out, expected)):
        if want is not None:
            assert got == want, f"line {i + 1} changed"
    for i, (begin, _) in zip(stubs, regions_of(original)):
        marker = lines[begin]
        indent = marker[:len(marker) - len(marker.lstrip())]
        assert re.fullmatch(re.escape(indent) + r'raise NotImplementedError\("[^"\n]+"\)\r?\n',
                            out[i]), out[i]
        assert out[i].endswith(marker[len(marker.rstrip("\r\n")):])
    compile(released, "released.py", "exec")
    assert not [line for line in released.splitlines() if line.strip() in (BEGIN, END)]


def test_release_strips_exactly_the_solution_regions(tmp_path):
    written = release(CHAPTERS, tmp_path / "out")
    out = tmp_path / "out" / EXAMPLE.name
    assert sorted(p.name for p in out.iterdir()) == ["exercises.py", "test_exercises.py"]
    assert {str(p.relative_to(tmp_path / "out")): n for p, n in written} == {
        "99-example/exercises.py": 5, "99-example/test_exercises.py": 0, "README.md": 0}
    original = (EXAMPLE / "exercises.py").read_bytes().decode()
    released = (out / "exercises.py").read_bytes().decode()
    assert_stripped_exactly(original, released)
    assert (out / "test_exercises.py").read_bytes() == (EXAMPLE / "test_exercises.py").read_bytes()
    assert 'raise NotImplementedError("Counter.step: replace this line with your solution")' \
        in released
    # the released module imports, and every function is a stub
    names = {node.name for node in ast.walk(ast.parse(released))
             if isinstance(node, ast.FunctionDef) and node.name != "__init__"}
    assert names == {"add", "mean", "dual_mul", "sign", "step"}


def test_release_keeps_line_endings_and_text_around_the_regions():
    source = ("import math\r\n\r\ndef f(x):\r\n    '''Doc.'''  \r\n    y = 1\r\n"
              "    ### BEGIN SOLUTION\r\n    return x + y\r\n    ### END SOLUTION\r\n"
              "\r\n# trailing comment ### not a marker\r\n")
    released = strip_solutions(source)
    assert_stripped_exactly(source, released)
    assert released.endswith("\r\n\r\n# trailing comment ### not a marker\r\n")
    assert strip_solutions("x = 1\n") == "x = 1\n"


@pytest.mark.parametrize("source, message", [
    ("def f():\n    ### BEGIN SOLUTION\n    return 1\n", r":2: ### BEGIN SOLUTION is never closed"),
    ("def f():\n    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n",
     r":3: .*cannot nest"),
    ("def f():\n    return 1\n    ### END SOLUTION\n", r":3: ### END SOLUTION without"),
    ("### BEGIN SOLUTION\nX = 1\n### END SOLUTION\n", r":1: .*not inside a function"),
    ("class C:\n    ### BEGIN SOLUTION\n    x = 1\n    ### END SOLUTION\n", r":2: .*not inside a function"),
    ("def f():\n    ### BEGIN SOLUTION\n  return 1\n    ### END SOLUTION\n  x = 2\n", r"does not compile"),
])
def test_release_rejects_broken_regions(source, message):
    with pytest.raises(ReleaseError, match=message):
        strip_solutions(source, "ex.py")


def test_release_writes_nothing_when_a_file_is_broken_and_protects_the_output(tmp_path):
    chapters = tmp_path / "chapters"
    shutil.copytree(CHAPTERS, chapters)
    (chapters / "98-broken").mkdir()
    (chapters / "98-broken" / "exercises.py").write_text("def f():\n    ### BEGIN SOLUTION\n")
    with pytest.raises(ReleaseError, match="98-broken"):
        release(chapters, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    shutil.rmtree(chapters / "98-broken")
    (chapters / "99-example" / "__pycache__").mkdir()
    (chapters / "99-example" / "__pycache__" / "x.pyc").write_bytes(b"")
    release(chapters, tmp_path / "out")
    assert not (tmp_path / "out" / "99-example" / "__pycache__").exists()
    with pytest.raises(ReleaseError, match="not empty"):
        release(chapters, tmp_path / "out")
    release(chapters, tmp_path / "out", force=True)
    with pytest.raises(ReleaseError, match="must not be inside"):
        release(chapters, chapters / "student")


def test_release_command(tmp_path, capsys):
    assert cli(["release", str(CHAPTERS), "-o", str(tmp_path / "out")]) == 0
    assert "99-example/exercises.py: 5 solution regions stripped" in capsys.readouterr().out
    assert cli(["release", str(CHAPTERS), "-o", str(tmp_path / "out")]) == 2
    assert "--force" in capsys.readouterr().err


statement = st.sampled_from(["x = 1", "y = x + 2", "pass", "# a comment", "", "z = [1,\n 2]",
                             "if x:\n    x -= 1", 's = "### BEGIN SOLUTION in a string"'])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(statement, max_size=3), st.lists(statement, max_size=3),
                          st.lists(statement, max_size=2), st.integers(0, 2)),
                min_size=1, max_size=4),
       st.sampled_from(["\n", "\r\n"]))
def test_release_strips_exactly_the_regions_of_any_file(functions, newline):
    """Random functions (at three depths) with a region each: the released file compiles,
    and outside the regions it is byte-identical to the solution file."""
    chunks = ["import math\n\n"]
    for i, (before, solution, after, depth) in enumerate(functions):
        pad = "    " * depth
        head = ["class C%d:\n" % i, "    def m(self):\n"] if depth == 2 else \
            ["def outer%d():\n" % i, "    def f():\n"] if depth == 1 else ["def f%d(x=0):\n" % i]
        body_pad = pad + "    " if depth else "    "
        body = before + [BEGIN] + solution + [END] + after
        chunks += head + [textwrap.indent(line, body_pad, lambda _: True) + "\n" for line in body]
        if depth == 1:
            chunks.append("    return f\n")
        chunks.append("\n")
    source = "".join(chunks).replace("\n", newline)
    released = strip_solutions(source, "random.py")
    assert_stripped_exactly(source, released)
    assert len(solution_regions(source)) == len(functions)


# -- the contract for chapter authors -----------------------------------------------------

def test_example_chapter_follows_the_contract():
    assert check_chapter(EXAMPLE) == []
    declared = declared_tests(EXAMPLE / "test_exercises.py")
    assert [(d.nodeid.split("::", 1)[1], d.points) for d in declared] == [
        ("test_add", 1), ("test_mean", 2), ("test_dual_mul", 3), ("test_sign", 3),
        ("TestCounter::test_steps", 2)]


def test_check_chapter_names_what_breaks_the_contract(tmp_path):
    chapter = tmp_path / "03-ad-on-dataflow-graphs"
    chapter.mkdir()
    (chapter / "exercises.py").write_text("X = 1\n")
    (chapter / "test_exercises.py").write_text(textwrap.dedent("""
        import pytest
        from exercises import f

        def test_f():
            assert open("../05-scheduling-and-memory/exercises.py")
            assert np.allclose(f(), [1.0, 2.0])
            assert f() == pytest.approx(2.0)
    """))
    problems = "\n".join(check_chapter(chapter))
    assert "no ### BEGIN SOLUTION" in problems
    assert "imports exercises at module level" in problems
    assert "does not define the fixture" in problems
    assert "has no @pytest.mark.points" in problems
    assert "1 graded tests; a chapter has at least 3" in problems
    assert "refers to a later chapter '05-scheduling-and-memory'" in problems
    assert "allclose broadcasts (an empty array or a scalar passes it)" in problems
    assert "approx broadcasts (an empty array or a scalar passes it)" in problems


# -- the proofs for the course's chapters (one set per chapter, once chapters exist) ------

REAL_CHAPTERS = sorted(p.parent for p in (REPO / "chapters").glob("*/exercises.py"))
PROOF_TIMEOUT = 30.0  # generous: these prove correctness, on a CI machine that may be busy


@pytest.fixture(scope="module")
def chapter_reports():
    """Every real chapter's solutions graded, concurrently. (The released stubs are
    graded in tests/test_grader_mutants.py, with a wrong answer for every exercise, and
    through the release's README in test_the_release_is_self_contained.)"""
    def attempt(chapter):
        try:
            return grade(chapter, timeout=PROOF_TIMEOUT)
        except GradingError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=3) as pool:
        jobs = {("solution", chapter.name): pool.submit(attempt, chapter)
                for chapter in REAL_CHAPTERS}
        return {key: job.result() for key, job in jobs.items()}


def chapter_report(chapter_reports, kind, chapter):
    report = chapter_reports[kind, chapter.name]
    if isinstance(report, Exception):
        pytest.fail(f"{chapter.name} ({kind}): {report}")
    return report


@pytest.mark.parametrize("chapter", REAL_CHAPTERS, ids=lambda p: p.name)
def test_chapter_follows_the_contract(chapter):
    assert check_chapter(chapter) == []


@pytest.mark.parametrize("chapter", REAL_CHAPTERS, ids=lambda p: p.name)
def test_chapter_solutions_score_full_marks_on_their_own(chapter, chapter_reports):
    """Graded alone (only this chapter's exercises.py beside its tests): full marks also
    proves that chapter N's tests need no exercises but those of chapters up to N."""
    report = chapter_report(chapter_reports, "solution", chapter)
    assert report.full_marks, report.table(width=200)


# -- the student edition of the real course, and Gradescope's bundle ----------------------

def solution_lines(source: str) -> list[str]:
    """The lines inside the solution regions that say something (not blank, not a bare
    ``return x`` that a docstring might also hold)."""
    lines, inside = [], False
    for line in source.splitlines():
        if line.strip() == BEGIN:
            inside = True
        elif line.strip() == END:
            inside = False
        elif inside and len(line.strip()) > 24:
            lines.append(line.strip())
    return lines


@pytest.fixture(scope="module")
def student_edition(tmp_path_factory):
    out = tmp_path_factory.mktemp("edition") / "course"
    release(REPO / "chapters", out)
    return out


def test_every_link_of_the_release_resolves_inside_it(student_edition):
    from minigraph.grading.links import find_links
    checked = 0
    for page in student_edition.rglob("*.md"):
        text = page.read_text(encoding="utf-8")
        for link in find_links(text):
            if link.is_relative:
                target = (page.parent / link.path).resolve()
                assert target.exists(), f"{page.relative_to(student_edition)}: {link.target}"
                assert student_edition.resolve() in [target, *target.parents], \
                    f"{page.relative_to(student_edition)}: {link.target} leads out of the release"
                checked += 1
    assert checked > 100   # the chapters link to the library's modules and notebooks
    assert (student_edition / "project" / "minigraph" / "ops" / "primitive.py").is_file()
    assert "minigraph grade chapters/" not in "".join(
        p.read_text() for p in student_edition.glob("*/README.md"))


def test_the_release_holds_no_solution_and_no_hidden_test(student_edition):
    for chapter in REAL_CHAPTERS:
        released = (student_edition / chapter.name / "exercises.py").read_text()
        assert BEGIN not in released and END not in released
        source = (chapter / "exercises.py").read_text()
        outside = {line.strip() for line in strip_solutions(source).splitlines()}
        for line in set(solution_lines(source)) - outside:   # lines only a solution has
            assert line not in released, f"{chapter.name}: solution text {line!r} released"
        tree = ast.parse((chapter / "test_exercises.py").read_text())
        hidden = [node.name for node in ast.walk(tree)
                  if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and _is_hidden(node)]
        tests = (student_edition / chapter.name / "test_exercises.py").read_text()
        for name in hidden:
            assert f" {name}(" not in tests and f" {name}:" not in tests, f"{chapter.name}: {name}"
    for path in student_edition.rglob("*.py"):
        assert "@pytest.mark.hidden" not in path.read_text(), path


def test_the_readme_command_grades_the_students_copy(student_edition, monkeypatch, capsys):
    """The command the release's README gives, run where it says (the release's folder),
    grades the released stubs: 0 points, not the reference's full marks."""
    readme = (student_edition / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith("minigraph grade "))
    argv = shlex.split(command)[1:]
    monkeypatch.chdir(student_edition)
    assert cli(argv + ["--timeout", str(PROOF_TIMEOUT)]) == 1   # 1: some tests failed
    printed = capsys.readouterr().out
    total = re.search(r"total\s+(\d+) / (\d+)", printed)
    assert total and total.group(1) == "0" and int(total.group(2)) > 0, printed
    assert str(student_edition.resolve() / argv[1]) in printed or argv[1] in printed


def test_release_links_to_project_files_and_rejects_broken_links(tmp_path):
    project = tmp_path / "project-root"
    chapters = project / "chapters"
    shutil.copytree(EXAMPLE, chapters / EXAMPLE.name)
    (project / "lib").mkdir()
    (project / "lib" / "module.py").write_text("def f():\n    return 1\n")
    (project / "lib" / "NOTES.md").write_text("See [the module](module.py#L1).\n")
    (chapters / EXAMPLE.name / "README.md").write_text(
        "Read [`lib/module.py`](../../lib/module.py), [notes](../../lib/NOTES.md), "
        "[the tests](test_exercises.py) and [the web](https://example.org/x.py).\n\n"
        "```python\nf[0](not_a_link.py)\n```\n"
        "Grade with `minigraph grade chapters/99-example`.\n")
    release(chapters, tmp_path / "out")
    text = (tmp_path / "out" / EXAMPLE.name / "README.md").read_text()
    assert "(../project/lib/module.py)" in text and "(../project/lib/NOTES.md)" in text
    assert "(test_exercises.py)" in text and "(https://example.org/x.py)" in text
    assert "f[0](not_a_link.py)" in text            # code is not a link
    assert "`minigraph grade 99-example --course .`" in text
    notes = (tmp_path / "out" / "project" / "lib" / "NOTES.md").read_text()
    assert "(module.py#L1)" in notes                 # linked Markdown: its links followed too
    assert (tmp_path / "out" / "project" / "lib" / "module.py").is_file()
    (chapters / EXAMPLE.name / "README.md").write_text("A [broken](../../lib/gone.py) link.\n")
    with pytest.raises(ReleaseError, match=r"README.md:1: the link '../../lib/gone.py' leads nowhere"):
        release(chapters, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_autograder_bundle_grades_a_submission_like_gradescope(tmp_path):
    """The bundle, unzipped where Gradescope puts it, graded by its run_autograder against
    a fake /autograder (AUTOGRADER_ROOT): full marks for the reference, 0 for the stub."""
    bundle = tmp_path / "bundle"
    assert cli(["autograder", str(EXAMPLE), "-o", str(bundle), "--timeout", "10"]) == 0
    archive = bundle / "autograder.zip"
    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
    assert {"setup.sh", "run_autograder", f"tests/{EXAMPLE.name}/test_exercises.py",
            "minigraph-src/pyproject.toml", "minigraph-src/minigraph/grading/harness.py"} <= names
    assert not any(n.endswith("/exercises.py") and "tests/" in n for n in names)  # no solution
    package = Path(grading_package.__file__).resolve().parents[1]
    assert {f"minigraph-src/minigraph/{p.relative_to(package).as_posix()}"
            for p in package.rglob("*.py") if "__pycache__" not in p.parts} <= names
    assert subprocess.run(["bash", "-n", str(bundle / "setup.sh")]).returncode == 0
    # the bundled copy imports on its own (what setup.sh installs)
    check = subprocess.run([sys.executable, "-c", "import minigraph.grading, sys; "
                            "print(minigraph.grading.__file__)"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(bundle / "minigraph-src")},
                           cwd=tmp_path)
    assert check.returncode == 0 and str(bundle / "minigraph-src") in check.stdout, check.stderr

    def run_autograder(name: str, exercises: str) -> dict:
        root = tmp_path / name / "autograder"
        with zipfile.ZipFile(archive) as z:
            z.extractall(root / "source")
        shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
        (root / "submission").mkdir()
        (root / "submission" / "exercises.py").write_text(exercises)
        env = {**os.environ, "AUTOGRADER_ROOT": str(root), "MINIGRAPH_PYTHON": sys.executable}
        run = subprocess.run(["bash", str(root / "run_autograder")], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        return json.loads((root / "results" / "results.json").read_text())

    reference = (EXAMPLE / "exercises.py").read_text()
    with ThreadPoolExecutor(max_workers=2) as pool:
        full = pool.submit(run_autograder, "reference", reference)
        stub = pool.submit(run_autograder, "stub", strip_solutions(reference))
        full, stub = full.result(), stub.result()
    check_gradescope_schema(full)
    check_gradescope_schema(stub)
    assert full["score"] == TOTAL and all(t["status"] == "passed" for t in full["tests"])
    assert stub["score"] == 0 and len(stub["tests"]) == len(ALL_TESTS)
