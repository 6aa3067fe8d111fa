"""Submissions that try to fool the grader instead of solving the exercises.

Each attack is an ``exercises.py`` that solves nothing (the honest stub scores 0) and tries
to raise its score some other way: forging the results, reading the reference solution,
patching the grader or NumPy, crashing or outliving the grader, exhausting its resources.
Every one must score what the stub scores (0 of 11 on the example chapter), finish within
the limits, and leave no process behind. They run once, concurrently, on the example
chapter of tests/grading_fixtures (copied into a course folder of their own).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from minigraph.grading import GradingError, Report, grade, grade_main
from minigraph.grading import isolation
from minigraph.grading.gradescope import write_results_json

FIXTURES = Path(__file__).resolve().parent / "grading_fixtures"
EXAMPLE = FIXTURES / "chapters" / "99-example"
TOKEN = "minigraph-attack-token-7f3a"   # in the command line of every process an attack starts
ROOT_ONLY = Path(f"/tmp/{TOKEN}-{os.getpid()}-root-only/target.txt")  # (only its owner writes it)
# An instructor's checkout: the course in chapters/, its history (the reference solutions
# included) in .git beside it. In /tmp, so that others may pass through its parents.
REPOSITORY = Path(f"/tmp/{TOKEN}-{os.getpid()}-repository")  # (a process of its own each)
TIMEOUT, TOTAL = 1.5, 8.0

# what every attack needs to try to win: where things are
PRELUDE = f"""
import os, sys, signal, subprocess, time, glob, json
TOKEN = {TOKEN!r}
def solve_nothing(*args, **kwargs):
    raise NotImplementedError("stub")
add = mean = dual_mul = sign = solve_nothing
class Counter:
    def step(self, n=1):
        raise NotImplementedError("stub")
"""

ATTACKS = {
    # (1) forge the results: find the grader's files through its command line
    "forge-results-file": """
        for pid in os.listdir("/proc"):
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
            except OSError:
                continue
            for arg in cmd:
                folder = os.path.dirname(arg.decode(errors="replace"))
                for name in ("results.json", "results.tmp"):
                    try:
                        with open(os.path.join(folder, name), "w") as f:
                            json.dump({"tests": [], "outcomes": {}}, f)
                    except OSError:
                        pass
    """,
    # (2) patch the grader's recorder, in the process the student's code runs in
    "patch-the-plugin": """
        import minigraph.grading.plugin as plugin
        plugin.Collector.pytest_runtest_makereport = lambda *a, **k: None
        plugin.points_of = lambda item: (100, "")
        import minigraph.grading.proxy as proxy
        proxy.student_error = lambda info: None
    """,
    # (3) find the reference solution and run it instead
    "import-the-reference": f"""
        import minigraph, importlib.util
        candidates = glob.glob("/work/**/99-example/exercises.py", recursive=True)
        candidates += [{str(EXAMPLE / "exercises.py")!r}]
        for pid in os.listdir("/proc"):
            try:
                for arg in open(f"/proc/{{pid}}/cmdline", "rb").read().split(b"\\0"):
                    if arg.endswith(b".json") or arg.endswith(b".py"):
                        candidates.append(os.path.join(os.path.dirname(arg.decode()), "exercises.py"))
            except OSError:
                pass
        for path in candidates:
            try:
                source = open(path).read()
            except OSError:
                continue
            if "BEGIN SOLUTION" in source:
                exec(source, globals())
                break
    """,
    # (4) outlive the grader and rewrite results.json afterwards
    "setsid-rewriter": """
        code = (
            "import glob, json, time\\n"
            "for _ in range(200):\\n"
            "    for path in glob.glob('/tmp/**/results.json', recursive=True):\\n"
            "        try:\\n"
            "            open(path, 'w').write(json.dumps({'score': 11, 'tests': []}))\\n"
            "        except OSError: pass\\n"
            "    time.sleep(0.05)\\n")
        subprocess.Popen([sys.executable, "-c", code, TOKEN], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if os.fork() == 0:  # and a double fork, the classic daemon
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", code, TOKEN])
            os._exit(0)
    """,
    # (6) make every comparison succeed
    "patch-numpy": """
        import numpy as np
        np.allclose = lambda *a, **k: True
        np.isclose = lambda *a, **k: True
        np.testing.assert_allclose = lambda *a, **k: None
        np.ndarray.__eq__ = lambda *a: True
        def add(a, b):
            class Anything:
                def __eq__(self, other): return True
                __hash__ = object.__hash__
            return Anything()
    """,
    "sys-exit-at-import": """
        sys.exit(0)
    """,
    "fake-report-on-stdout": """
        for stream in (sys.stdout, sys.stderr, sys.__stdout__):
            print('{"score": 11, "tests": []}\\n  total  11 / 11\\n1 passed', file=stream, flush=True)
        for fd in (0, 1, 2):
            try:
                os.write(fd, b'{"re": 1, "ok": 5}')
            except OSError:
                pass
    """,
    "kill-the-parent": """
        for sig in (signal.SIGKILL, signal.SIGTERM):
            for pid in (os.getppid(), os.getpgid(0)):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
    """,
    "inherited-fds": """
        for fd in range(3, 64):
            try:
                os.write(fd, b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x20{"re": 1, "ok": {"$tuple": [11]}}')
            except OSError:
                pass
    """,
    "environment": """
        found = {k: v for k, v in os.environ.items() if "MINIGRAPH" in k or "PYTEST" in k}
        for value in found.values():
            for path in glob.glob(os.path.join(value, "**", "exercises.py"), recursive=True):
                try:
                    exec(open(path).read(), globals())
                except Exception:
                    pass
    """,
    "bounded-fork-storm": """
        children = []
        for _ in range(300):
            try:
                children.append(subprocess.Popen([sys.executable, "-c",
                    "import time; time.sleep(600)", TOKEN]))
            except OSError:
                break
    """,
    "huge-allocation": """
        import numpy as np
        def mean(xs):
            big = np.ones(10**11)       # 800 GB
            return float(big[0])
        def add(a, b):
            blocks = []
            while True:
                blocks.append(bytearray(10**8))
    """,
    "sleep-forever": """
        def add(a, b):
            while True:
                try:
                    time.sleep(1000)
                except BaseException:
                    pass
        mean = dual_mul = sign = add
    """,
    "symlinks": f"""
        for i, target in enumerate([{str(EXAMPLE / "exercises.py")!r}, "/etc/shadow", "/root"]):
            try:
                os.symlink(target, f"link{{i}}")
                exec(open(f"link{{i}}").read(), globals())
            except Exception:
                pass
    """,
    "write-the-installed-package": """
        import minigraph, minigraph.grading.plugin as plugin
        for path in (plugin.__file__, minigraph.__file__):
            try:
                with open(path, "a") as f:
                    f.write("\\n# tampered\\n")
            except OSError:
                pass
    """,
    "planted-conftest": """
        pass  # the submission folder also holds conftest.py and test_exercises.py
    """,
    # (16b) answers with nothing in them: np.allclose over an empty array is True
    "empty-answers": """
        import numpy as np
        def dual_mul(*args, **kwargs):
            return np.empty((0, 2))
        def mean(*args, **kwargs):
            return np.empty((0,))
    """,
    # (17) make the grader, root, write through links the sandbox left in its folder: the
    # log (opened as root when a sandbox starts) and exercises.py (copied in as root)
    "links-for-root": f"""
        def add(*args, **kwargs):
            for name in ("output.log", "exercises.py"):
                try:
                    os.unlink(name)
                except OSError:
                    pass
                os.symlink({str(ROOT_ONLY)!r}, name)
            os._exit(1)
        def mean(*args, **kwargs):
            print("written through the link")
            raise NotImplementedError("stub")
    """,
    # (18) leave a FIFO as the log: a sandbox that opens it waits for a reader, forever
    "fifo-log": """
        def add(*args, **kwargs):
            os.unlink("output.log")
            os.mkfifo("output.log")
            os._exit(1)
    """,
    # (19) send requests and never read the answers: the grader's write blocks when the
    # pipe is full, where no timeout of its reads reaches it
    "never-read-the-answers": """
        import struct
        def add(*args, **kwargs):
            out = int(sys.argv[2])
            for k in range(5000):
                body = json.dumps({"id": 10 ** 6 + k, "op": "unknown" + "x" * 40}).encode()
                os.write(out, struct.pack(">Q", len(body)) + body)
            time.sleep(1000)
    """,
    # (20) read the reference from the course's git history (git show HEAD:...)
    "read-the-course-history": f"""
        import shutil
        try:
            shutil.copytree({str(REPOSITORY / ".git")!r}, "history")
            source = subprocess.run(["git", "--git-dir", "history", "show",
                                     "HEAD:chapters/99-example/exercises.py"],
                                    capture_output=True, text=True).stdout
            if "BEGIN SOLUTION" in source:
                exec(source, globals())
        except Exception:
            pass
    """,
}


def _write(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


@pytest.fixture(scope="module")
def attacks(tmp_path_factory):
    if not isolation.is_root():
        ATTACKS.pop("write-the-installed-package")  # without root it would really write
        ATTACKS.pop("read-the-course-history")  # (the sandbox is the grader's own user)
    shutil.rmtree(REPOSITORY, ignore_errors=True)
    course = REPOSITORY / "chapters"
    shutil.copytree(EXAMPLE, course / EXAMPLE.name)
    REPOSITORY.chmod(0o755)
    if shutil.which("git"):  # (without git the history attack has no history to read)
        for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=instructor", "-c",
                        "user.email=i@example.org", "commit", "-qm", "the course"]):
            subprocess.run(["git"] + command, cwd=REPOSITORY, check=True)
    ROOT_ONLY.parent.mkdir(mode=0o700, exist_ok=True)
    ROOT_ONLY.unlink(missing_ok=True)
    ROOT_ONLY.write_text("the grader's\n")
    ROOT_ONLY.chmod(0o600)
    # The course this copy comes from (with its reference solution) lies on the machine
    # too, as an instructor's would; like any course the grader grades from, it is closed
    # to others. (Without this the attack's success would depend on whether an earlier
    # test, grading from that folder, had closed it: on a fresh clone it had not.)
    if isolation.is_root():
        for folder in (EXAMPLE.parent, EXAMPLE):
            isolation.close_to_others(folder)
    work = tmp_path_factory.mktemp("submissions")
    package_files = {p: p.read_bytes() for p in (Path(isolation.__file__).parent).glob("*.py")}
    jobs = {}
    for name, code in [("stub", "pass")] + list(ATTACKS.items()):
        folder = work / name / EXAMPLE.name
        _write(folder, "exercises.py", PRELUDE + textwrap.dedent(code))
        if name == "planted-conftest":
            _write(folder, "conftest.py", "import pytest\n@pytest.hookimpl(wrapper=True)\n"
                   "def pytest_runtest_makereport(item, call):\n    r = yield\n"
                   "    r.outcome = 'passed'\n    return r\n")
            _write(folder, "test_exercises.py", "import pytest\n@pytest.mark.points(100)\n"
                   "def test_free():\n    pass\n")
        jobs[name] = folder

    def run(name):
        started = time.monotonic()
        report = grade(jobs[name], course=course, timeout=TIMEOUT, total_timeout=TOTAL)
        seconds = time.monotonic() - started
        out = work / name / "results" / "results.json"
        write_results_json(report, out)
        return report, seconds, out

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(run, name) for name in jobs}
        results = {name: future.result() for name, future in futures.items()}
    time.sleep(1.0)  # a process left behind would rewrite results.json now
    changed = [str(p) for p, data in package_files.items() if p.read_bytes() != data]
    yield results, changed
    shutil.rmtree(REPOSITORY, ignore_errors=True)
    shutil.rmtree(ROOT_ONLY.parent, ignore_errors=True)


def _leftovers() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if TOKEN.encode() in cmd:
            found.append(pid)
    if isolation.is_root():
        for n in range(isolation.ACCOUNTS):
            name = f"{isolation.ACCOUNT_PREFIX}{n}"
            try:
                uid = pwd.getpwnam(name).pw_uid
            except KeyError:
                continue
            # An account another grading holds now (a test running beside this one, under
            # pytest -n) has processes of its own: only a released account must have none.
            # Holding its lock while counting keeps a grading from claiming it meanwhile.
            fd = isolation.lock_account(name)
            if fd is None:
                continue
            try:
                if isolation.processes_of_user(uid):
                    found.append(f"processes of {name}")
            finally:
                os.close(fd)
    return found


def test_the_stub_scores_zero(attacks):
    results, _ = attacks
    report = results["stub"][0]
    assert report.score == 0 and report.max_score == 11


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_scores_what_the_stub_scores(attacks, name):
    results, _ = attacks
    report, seconds, out = results[name]
    assert report.score == results["stub"][0].score, report.table(width=200)
    assert report.max_score == 11 and len(report.results) == 7   # the course's tests, all
    assert seconds < TOTAL + 30, f"{name} took {seconds:.1f} s"
    data = json.loads(out.read_text())
    assert data["score"] == 0 and len(data["tests"]) == 7, "results.json was rewritten"


def test_no_process_is_left_behind(attacks):
    assert _leftovers() == []


def test_the_grader_writes_through_no_link_the_sandbox_left(attacks):
    """The log was opened, and exercises.py copied in, by root, following a symlink the
    previous sandbox had put in their place: the student's code could append to, and
    overwrite and own, any file of the machine."""
    assert ROOT_ONLY.read_text() == "the grader's\n"
    assert ROOT_ONLY.stat().st_uid == os.getuid()


def test_the_installed_package_is_unchanged(attacks):
    _, changed = attacks
    assert changed == []


def test_a_fork_storm_and_a_crash_leave_the_other_tests_graded(attacks):
    results, _ = attacks
    report = results["huge-allocation"][0]
    messages = {r.name: r.output for r in report.results}
    assert "MemoryError" in messages["test_mean"] or "crashed" in messages["test_mean"]


def test_sleeping_forever_is_bounded_by_the_total_timeout(attacks):
    results, _ = attacks
    report, seconds, _ = results["sleep-forever"]
    assert seconds < TOTAL + 20
    assert any("timed out" in r.output for r in report.results)


# -- attacks on the grader's own files, handles and messages ---------------------------------
# Each is graded against a small course of its own: chapter 97-probe (its tests iterate an
# answer), beside a chapter 98-other whose reference solution the sandbox must not read.

PROBES = Path(f"/tmp/{TOKEN}-{os.getpid()}-probes")   # (others may pass through /tmp)
LEFT_BEHIND = [Path(f"/dev/shm/{TOKEN}-{os.getpid()}-left"),
               Path(f"/tmp/{TOKEN}-{os.getpid()}-left")]
OTHER_SECRET = "the reference solution of chapter 98"

PROBE_TESTS = """
import pytest
from minigraph.grading import exercises_fixture
exercises = exercises_fixture()

@pytest.mark.points(1)
def test_add(exercises):
    assert exercises.add(2, 3) == 5

@pytest.mark.points(1)
def test_items(exercises):
    got = exercises.items(3)
    assert len(got) == 3
    for mine, want in zip(got, [0, 1, 2]):
        assert mine == want

@pytest.mark.points(1)
def test_items_reversed(exercises):
    got = exercises.items(3)
    for mine, want in zip(reversed(got), [2, 1, 0]):
        assert mine == want
    assert 7 not in got
"""
PROBE_SOLUTION = "def add(a, b):\n    return a + b\n\ndef items(n):\n    return list(range(n))\n"
PROBE_STUBS = "def add(a, b):\n    raise NotImplementedError\n\nitems = add\n"

PROBE_ATTACKS = {
    # len() says 3; Python's fallback iteration stops at the first IndexError: zip, `in`
    # and reversed() saw no item, and the loops that check the values never ran
    "iterate-nothing": PROBE_STUBS + """
class _Empty:
    def __len__(self):
        return 3
    def __getitem__(self, i):
        raise IndexError(i)

def items(n):
    return _Empty()
""",
    # the grader's configuration (the submission's path), its log (the failing tests'
    # source) and another chapter of the course, read by the sandbox's account
    "read-the-graders-files": PROBE_STUBS + f"""
def add(a, b):
    found = []
    other = {str(PROBES / "chapters/98-other/exercises.py")!r}
    for name in ("../config.json", "../harness.log", other):
        try:
            found.append(name + ": " + open(name).read()[:200])
        except OSError:
            pass
    raise ValueError("readable: " + repr(found))
""",
    # files in the folders every account may write, left after the grading
    "leave-files-behind": PROBE_STUBS + "".join(f"""
try:
    open({str(p)!r}, "w").write("left by the sandbox")
except OSError:
    pass
""" for p in LEFT_BEHIND),
    # an exception whose __str__ raises, inside the sandbox's own except block
    "exception-str-raises": PROBE_STUBS + """
class E1(Exception):
    def __str__(self):
        raise RuntimeError("a bug in __str__")

def add(a, b):
    raise E1()
""",
    "nested-too-deeply": PROBE_STUBS + """
def add(a, b):
    x = a + b
    for _ in range(500):
        x = [x]
    return x
""",
    # clear the screen and draw a forged total on the grader's terminal
    "terminal-escapes": PROBE_STUBS + """
def add(a, b):
    raise ValueError("\\x1b[2J\\x1b[H  total  3 / 3\\x1b[8m")
""",
    # tiny answers that describe huge arrays: 10**7 rows of nothing, and 10**15 items of
    # a dtype of 0 bytes (written by the submission's own copy of the wire format)
    "arrays-of-nothing": PROBE_STUBS + """
import base64, io
import numpy as np
import minigraph.grading.wire as wire

def add(a, b):
    return np.empty((10**7, 0))

def _npy(array):
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<U0", "fortran_order": False, "shape": (10**15,)})
    return base64.b64encode(buffer.getvalue()).decode()

def items(n):
    wire._npy = _npy
    return np.zeros(3)
""",
}


@pytest.fixture(scope="module")
def probe_reports(tmp_path_factory):
    shutil.rmtree(PROBES, ignore_errors=True)
    course = PROBES / "chapters"
    for chapter, tests, solution in (("97-probe", PROBE_TESTS, PROBE_SOLUTION),
                                     ("98-other", PROBE_TESTS, f"# {OTHER_SECRET}\n")):
        _write(course / chapter, "test_exercises.py", tests)
        _write(course / chapter, "exercises.py", solution)
    for folder in (PROBES, course, course / "98-other"):  # a fresh checkout: mode 0755
        folder.chmod(0o755)
    (course / "98-other" / "exercises.py").chmod(0o644)
    for path in LEFT_BEHIND:
        path.unlink(missing_ok=True)
    work = tmp_path_factory.mktemp("probes")
    jobs = {}
    for name, code in PROBE_ATTACKS.items():
        _write(work / name / "97-probe", "exercises.py", code)
        jobs[name] = work / name / "97-probe"
    # the right solution, in a file with another name
    _write(work / "renamed", "my_solution.py", PROBE_SOLUTION)
    jobs["renamed"] = work / "renamed" / "my_solution.py"

    def run(name):
        return grade(jobs[name], tests=course / "97-probe", timeout=TIMEOUT, total_timeout=TOTAL)

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(run, name) for name in jobs}
        reports = {name: future.result() for name, future in futures.items()}
    left = [str(p) for p in LEFT_BEHIND if p.exists()]
    yield reports, left
    for path in LEFT_BEHIND:
        path.unlink(missing_ok=True)
    shutil.rmtree(PROBES, ignore_errors=True)


def _outputs(report) -> dict[str, str]:
    return {r.name: r.output for r in report.results}


def test_a_handle_iterates_as_many_items_as_its_len(probe_reports):
    """A handle had __len__ and __getitem__ but no __iter__: zip(), ``in`` and reversed()
    used Python's index iteration, which stopped at the student's first IndexError, so
    an object that said len 3 and held nothing passed every loop over it."""
    report = probe_reports[0]["iterate-nothing"]
    assert report.score == 0, report.table(width=200)
    assert "item 0 raised IndexError" in _outputs(report)["test_items"]


def test_the_right_solution_under_another_name_scores_full_marks(probe_reports):
    """PATH may be the student's file itself: one not named exercises.py was copied into
    the sandbox under its own name, and every test failed (the sandbox imports
    exercises.py). The handles' iteration must also keep the right answer right."""
    report = probe_reports[0]["renamed"]
    assert report.score == report.max_score == 3, report.table(width=200)


@pytest.mark.skipif(not isolation.is_root(), reason="without root the sandbox is the grader's user")
@pytest.mark.parametrize("name", ["../config.json", "../harness.log", "98-other"])
def test_the_sandbox_reads_no_file_of_the_grader_or_the_course(probe_reports, name):
    """config.json (it names the submission's path, the way to other students' folders)
    and harness.log (it quotes the failing tests' source) were 0644 in a folder the
    sandbox's account passes through; with --tests, only the tests' own chapter was
    closed, not the course's other chapters and their reference solutions."""
    output = _outputs(probe_reports[0]["read-the-graders-files"])["test_add"]
    assert "readable: [" in output and name not in output, output


@pytest.mark.skipif(not isolation.is_root(), reason="without root nothing is closed")
def test_the_submission_is_closed_to_the_sandbox(probe_reports):
    """Only the course was closed to the sandbox's account: graded one after another
    from one folder, a student's code found the other students' folders (its own path
    was in config.json) and ran their exercises.py as its own."""
    folder = probe_reports[0]["read-the-graders-files"].exercises.parent
    assert not isolation.readable_by_others(folder)


@pytest.mark.skipif(not isolation.is_root(), reason="the sandbox account exists only as root")
def test_the_sandbox_leaves_no_file_behind(probe_reports):
    """The grader ended the account's processes, never its files: what it wrote in /tmp
    and /dev/shm (memory, outside --memory) stayed after the grading."""
    assert probe_reports[1] == []


def test_an_exception_whose_str_raises_is_named_not_a_crash(probe_reports):
    """str(exc) raised inside the sandbox's except block: the sandbox exited, and the
    test was reported as a crash instead of the student's exception."""
    report = probe_reports[0]["exception-str-raises"]
    output = _outputs(report)["test_add"]
    assert output.startswith("E1") and "exercises.py, line" in output, output
    assert report.processes == 1   # the sandbox kept serving


def test_a_value_nested_too_deeply_says_so(probe_reports):
    """wire.encode recursed once per level: a bare RecursionError, with no location."""
    output = _outputs(probe_reports[0]["nested-too-deeply"])["test_add"]
    assert "nested too deeply" in output, output


def test_the_table_escapes_terminal_control_characters(probe_reports):
    """The student's message reached the terminal unescaped: ANSI sequences cleared the
    screen and drew a forged total over the table."""
    table = probe_reports[0]["terminal-escapes"].table(width=200)
    assert "\x1b" not in table and "\\x1b[2J" in table, table


def test_arrays_that_describe_more_than_they_hold_are_refused(probe_reports):
    """The wire bounded bytes, not items: 10**7 rows of nothing (shape (10**7, 0)) and
    10**15 items of a 0-byte dtype crossed in a few hundred bytes, and a test that
    iterated them made millions of objects, or looped for days, in the grader."""
    outputs = _outputs(probe_reports[0]["arrays-of-nothing"])
    assert "more items than its data holds" in outputs["test_add"], outputs["test_add"]
    assert "0 bytes" in outputs["test_items"], outputs["test_items"]


def test_a_symlinked_exercises_py_is_refused(tmp_path):
    """A submission's exercises.py linking to the course's reference solution was
    resolved and copied, as root, into the sandbox: full marks for a link."""
    course = tmp_path / "course" / "99-example"
    shutil.copytree(EXAMPLE, course)
    submission = tmp_path / "submission" / "99-example"
    submission.mkdir(parents=True)
    (submission / "exercises.py").symlink_to(course / "exercises.py")
    with pytest.raises(GradingError, match="symbolic link"):
        grade(submission, tests=course, timeout=TIMEOUT, total_timeout=TOTAL)
    with pytest.raises(OSError, match="link"):  # the copy itself follows no link either
        isolation.copy_for_sandbox(submission / "exercises.py", tmp_path, None)


def test_results_json_is_written_through_no_symlink(tmp_path):
    """--json beside the submission: a results.json the student planted as a symlink was
    followed, as root, and any file of the machine overwritten."""
    precious = tmp_path / "precious.conf"
    precious.write_text("root's precious configuration\n")
    planted = tmp_path / "submission" / "results.json"
    planted.parent.mkdir()
    planted.symlink_to(precious)
    report = Report(chapter="99-example", exercises=Path("exercises.py"),
                    tests_file=Path("test_exercises.py"), timeout=1.0, results=[])
    write_results_json(report, planted)
    assert precious.read_text() == "root's precious configuration\n"
    assert not planted.is_symlink() and json.loads(planted.read_text())["tests"] == []


@pytest.mark.parametrize("memory", ["-5", "0"])
def test_the_memory_limit_must_be_positive(memory, capsys):
    """--memory -5 set RLIMIT_AS to -5 MiB, which the kernel reads as no limit at all."""
    with pytest.raises(SystemExit) as exit_info:
        grade_main([str(EXAMPLE), "--tests", str(EXAMPLE), "--memory", memory])
    assert exit_info.value.code == 2 and "--memory" in capsys.readouterr().err
    with pytest.raises(GradingError, match="memory"):
        grade(EXAMPLE, tests=EXAMPLE, memory_mb=int(memory))


# -- leftovers, paths and limits ---------------------------------------------------------------
# Each grades the example chapter on its own (a few seconds: marked slow), or calls the
# grader's cleanup directly. The oracles are the kernel's: what os.lstat, /proc/sysvipc,
# getrusage and fork say, never the grader's own report of what it did.

ROOT = pytest.mark.skipif(not isolation.is_root(), reason="the sandbox account exists only as root")
NOBODY_UID = 54_321   # a uid no process has: owner of the files the cleanup must remove


def _deep_tree(top: Path, levels: int = 1500) -> None:
    """A folder ``levels`` deep under ``top``, made one level at a time through
    descriptors, as a student's code can (a path that long would not fit in one call)."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)


def _grade_example(tmp_path: Path, name: str, source: str, **kwargs) -> Report:
    folder = tmp_path / name / EXAMPLE.name
    _write(folder, "exercises.py", source)
    return grade(folder, tests=EXAMPLE, timeout=3, total_timeout=10, **kwargs)


@ROOT
def test_a_folder_1500_levels_deep_is_removed_without_a_crash(tmp_path):
    """shutil.rmtree(ignore_errors=True) recursed once per level and let RecursionError
    through: the sandbox's deep tree in /tmp crashed the harness before results.json was
    written, and, never removed, crashed every later grading under the same account."""
    tree = tmp_path / "deep"
    try:
        _deep_tree(tree)
        os.chown(tree, NOBODY_UID, NOBODY_UID)
        assert isolation.remove_files_of(NOBODY_UID, roots=(str(tmp_path),)) == 1
        assert not os.path.lexists(tree)
        _deep_tree(tree)   # where the grader writes a file of its own (new_file)
        os.close(isolation.new_file(tree, os.O_WRONLY))
        assert tree.is_file()
    finally:  # (pytest's own cleanup of tmp_path would recurse too)
        subprocess.run(["rm", "-rf", str(tree)])


@ROOT
@pytest.mark.slow
def test_a_deep_tree_left_by_the_sandbox_costs_no_verdict(tmp_path):
    """A 1,500-level tree in the sandbox's own folder and in /tmp: the grading crashed
    (no results, "minigraph grade --json" died with a traceback), and the reference
    solution graded next under the same account scored 0. Oracle: the reference's 11."""
    outside = Path(f"/tmp/{TOKEN}-{os.getpid()}-deep")
    attack = PRELUDE + f"""
for top in (".", {str(outside)!r}):
    os.makedirs(top, exist_ok=True)
    fd = os.open(top, os.O_RDONLY)
    for _ in range(1500):
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
"""
    try:
        attacked = _grade_example(tmp_path, "attack", attack)
        assert attacked.score == 0 and len(attacked.results) == 7 and not attacked.notes, \
            attacked.notes
        assert not os.path.lexists(outside)
        honest = _grade_example(tmp_path, "honest", (EXAMPLE / "exercises.py").read_text())
        assert honest.score == honest.max_score == 11, honest.table(width=200)
    finally:
        subprocess.run(["rm", "-rf", str(outside)])


def test_a_cleanup_that_fails_is_said_beside_the_verdict():
    """The harness ended the sandbox in a ``finally`` before writing results.json: an
    exception there (rm, ipcrm) lost every verdict. Now it is a note, with the results."""
    from minigraph.grading.harness import end_sandbox
    from minigraph.grading.runner import _outcomes

    class Failing:
        def close(self):
            raise OSError("rm -rf could not remove everything: Permission denied")

    left = end_sandbox(Failing())  # type: ignore[arg-type]
    assert "Permission denied" in left
    data = {"tests": [{"nodeid": "t.py::test_a", "points": 1.0}],
            "outcomes": {"t.py::test_a": ["passed", ""]}, "left": left}
    run = _outcomes(data, Path("t.py"), 0, "")
    assert [o.status for o in run.outcomes] == ["passed"] and run.notes == [left]


@ROOT
@pytest.mark.parametrize("planted", ["gitdir-file", "symlink"])
def test_a_dot_git_in_the_submission_makes_root_close_nothing_else(tmp_path, planted):
    """A file .git in the submission holding "gitdir: /any/folder" (or a .git symlink)
    made the grader, as root, chmod o-rwx that folder: /usr or the Python installation,
    and every later grading failed. Oracle: the folder's mode, by os.stat."""
    precious = tmp_path / "some-system-folder"
    precious.mkdir(mode=0o755)
    precious.chmod(0o755)
    submission = tmp_path / "submission" / EXAMPLE.name
    _write(submission, "exercises.py", "def add(a, b):\n    return a + b\n")
    if planted == "symlink":
        (submission / ".git").symlink_to(precious)
    else:
        (submission / ".git").write_text(f"gitdir: {precious}\n")
    from minigraph.grading.grade import _protect_course
    _protect_course(EXAMPLE / "test_exercises.py", None, submission)
    assert oct(precious.stat().st_mode & 0o777) == oct(0o755)


@ROOT
@pytest.mark.slow
def test_the_sandbox_cannot_find_or_read_a_classmates_submission(tmp_path):
    """An instructor grades a folder of submissions one by one: the command line
    (``minigraph grade class/alice/99-example``) was readable in /proc by every account,
    and the classmates' folders beside alice's were readable (mode 0755), so a stub found
    and ran bob's exercises.py. The sandbox now sees only its own processes, and not the
    folder that holds the submissions; their modes stay as they were.
    Oracles: a process whose command line names the class, bob's file, the stub's score."""
    classroom = tmp_path / "class"
    bob = classroom / "bob" / EXAMPLE.name / "exercises.py"
    _write(bob.parent, bob.name, (EXAMPLE / "exercises.py").read_text())
    for folder in (tmp_path, classroom, bob.parent.parent, bob.parent):
        folder.chmod(0o755)
    modes = {path: path.stat().st_mode for path in (classroom, bob.parent, bob)}
    # a stand-in for the instructor's `minigraph grade PATH`, as root, while the grading runs
    marker = f"{TOKEN}-class-{os.getpid()}"
    witness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    stub = f"""
import os
def add(a, b):
    for pid in os.listdir("/proc"):
        try:
            if {marker.encode()!r} in open(f"/proc/{{pid}}/cmdline", "rb").read():
                return a + b   # found the class folder: it would run a classmate's file
        except OSError:
            pass
    try:
        exec(open({str(bob)!r}).read(), globals())   # (its path guessed, or searched for)
    except OSError:
        raise NotImplementedError("found nothing") from None
    return add(a, b)
"""
    try:
        report = _grade_example(classroom, "alice", stub)
    finally:
        witness.kill()
        witness.wait()
    assert "found nothing" in _outputs(report)["test_add"], report.table(width=200)
    assert {path: path.stat().st_mode for path in modes} == modes


@ROOT
@pytest.mark.slow
def test_a_file_in_run_lock_does_not_outlive_the_grading(tmp_path):
    """Only /tmp, /var/tmp and /dev/shm were cleaned: a file the sandbox wrote in
    /run/lock (mode 1777, like /tmp) stayed, and the next grading under the same account
    read it (one student's solution, run as another's). Every folder any account may
    write into is now found at grading time. Oracle: os.path.lexists."""
    shared = [f for f in isolation.shared_folders() if f not in ("/tmp", "/var/tmp", "/dev/shm")]
    if not shared:
        pytest.skip("no world-writable folder here but /tmp, /var/tmp and /dev/shm")
    drops = [os.path.join(folder, f".{TOKEN}-{os.getpid()}-drop") for folder in shared]
    attack = PRELUDE + "".join(f"""
try:
    open({drop!r}, "w").write("left by the sandbox")
except OSError:
    pass
""" for drop in drops)
    try:
        report = _grade_example(tmp_path, "drop", attack)
        assert report.score == 0
        assert [d for d in drops if os.path.lexists(d)] == []
    finally:
        for drop in drops:
            if os.path.lexists(drop):
                os.unlink(drop)


def _sysv_objects(uid: int) -> list[str]:
    """The kernel's tables of SysV IPC objects: those ``uid`` owns or created."""
    found = []
    for kind in ("shm", "msg", "sem"):
        lines = Path("/proc/sysvipc", kind).read_text().splitlines()
        header = lines[0].split()
        for line in lines[1:]:
            fields = dict(zip(header, line.split()))
            if uid in (int(fields["uid"]), int(fields["cuid"])):
                found.append(f"{kind} {fields[header[1]]}")
    return found


@ROOT
@pytest.mark.slow
def test_sysv_ipc_objects_do_not_outlive_the_grading(tmp_path):
    """A shared memory segment (RAM outside --memory once detached), a message queue and
    a semaphore set the sandbox made outlived the grading: memory held after it, and a
    channel to the next grading under the same account. Oracle: /proc/sysvipc/*."""
    attack = PRELUDE + """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
libc.shmget(IPC_PRIVATE, 2**20, IPC_CREAT | 0o600)
libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)
libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600)
"""
    report = _grade_example(tmp_path, "ipc", attack)
    assert report.score == 0
    left = []
    for account in pwd.getpwall():
        if account.pw_name.startswith(isolation.ACCOUNT_PREFIX):
            # (an account another grading holds now, under pytest -n, may have its own)
            fd = isolation.lock_account(account.pw_name)
            if fd is not None:
                left += _sysv_objects(account.pw_uid)
                os.close(fd)
    assert left == []


@ROOT
@pytest.mark.slow
def test_a_posix_message_queue_does_not_outlive_the_grading(tmp_path):
    """A POSIX message queue the sandbox made (mq_open, mq_send) outlived the grading and
    carried a message to the next grading under the same account: the sandbox now has an
    IPC namespace of its own (unshare --ipc), gone with it. Oracle: mq_open of its name,
    as root, in the machine's namespace."""
    name = f"/minigraph-test-{os.getpid()}".encode()
    attack = PRELUDE + f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.restype = ctypes.c_int
q = libc.mq_open({name!r}, os.O_CREAT | os.O_WRONLY, 0o666, None)
if q >= 0:
    libc.mq_send(q, b"secret", 6, 0)
"""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mq_open.restype = ctypes.c_int
    try:
        report = _grade_example(tmp_path, "mqueue", attack)
        assert report.score == 0
        q = libc.mq_open(name, os.O_RDONLY)
        if q >= 0:
            libc.mq_close(q)
        assert q < 0 and ctypes.get_errno() == errno.ENOENT
    finally:
        libc.mq_unlink(name)


@ROOT
@pytest.mark.slow
def test_the_sandbox_may_not_start_a_second_process_or_thread(tmp_path):
    """--memory is RLIMIT_AS, a limit per process, and the account could run 32: a
    submission held 16 x 100 MB with --memory 256. The sandbox is now one process, so
    --memory bounds it. Oracle: the kernel's answer to fork() and to a new thread."""
    attack = PRELUDE + """
import threading
def add(a, b):
    try:
        pid = os.fork()
    except OSError:
        pid = None
    if pid == 0:
        os._exit(0)
    try:
        threading.Thread(target=time.sleep, args=(0.1,)).start()
        started = True
    except RuntimeError:
        started = False
    if pid is not None or started:
        return a + b
    raise NotImplementedError("neither a process nor a thread")
"""
    report = _grade_example(tmp_path, "fork", attack, memory_mb=256)
    outputs = {r.name: r.output for r in report.results}
    assert report.score == 0 and "neither a process nor a thread" in outputs["test_add"], \
        report.table(width=200)


@pytest.mark.slow
def test_a_huge_source_is_not_parsed_in_the_grader(tmp_path):
    """Chapter 04's test ran ast.parse, in the grader's process, on the string the
    student's graph_to_source returned: 2 MB of "a=x;" took the grader to 1.3 GB and
    19 s, outside --memory and --timeout. Oracle: the kernel's peak RSS of the grader's
    processes (wait4), well under what the parse took."""
    chapter = Path(__file__).resolve().parents[1] / "chapters" / "04-define-and-run-vs-define-by-run"
    folder = tmp_path / chapter.name
    _write(folder, "exercises.py", 'def graph_to_source(nodes, inputs, outputs, name="f"):\n'
                                   '    return "def f(x):\\n a=x" + ";a=x" * 500_000 + "\\n return a\\n"\n')
    table = tmp_path / "table.txt"
    with open(table, "w") as out:   # (a process of its own: the peak is this grading's)
        proc = subprocess.Popen([sys.executable, "-m", "minigraph", "grade", str(folder),
                                 "--tests", str(chapter), "--timeout", "2",
                                 "--total-timeout", "20", "--memory", "512"], stdout=out)
    _, status, usage = os.wait4(proc.pid, 0)   # (Popen.wait gives no rusage)
    proc.returncode = os.waitstatus_to_exitcode(status)
    row = [line for line in table.read_text().splitlines() if "straight_line" in line]
    assert row and "0 / 1" in row[0], table.read_text()
    assert usage.ru_maxrss < 800 * 1024, f"peak RSS {usage.ru_maxrss >> 10} MB"


@pytest.mark.parametrize("memory", ["-5", "0"])
def test_the_autograder_refuses_a_memory_limit_that_grades_nothing(tmp_path, memory, capsys):
    """``minigraph autograder --memory -5`` wrote a bundle whose every grading failed
    (``minigraph grade`` refuses it): no results.json, for every student."""
    from minigraph.grading.__main__ import main as grading_main
    from minigraph.grading.autograder import AutograderError, autograder
    out = tmp_path / "ag"
    with pytest.raises(SystemExit) as exit_info:
        grading_main(["autograder", str(EXAMPLE), "-o", str(out), "--memory", memory])
    assert exit_info.value.code == 2 and "--memory" in capsys.readouterr().err
    with pytest.raises(AutograderError, match="memory"):
        autograder(EXAMPLE, out, memory_mb=int(memory))
    assert not out.exists()
