"""Submissions that try to fool the grader instead of solving the exercises.

Each attack is an ``exercises.py`` that solves nothing (the honest stub scores 0) and tries
to raise its score some other way: forging the results, reading the reference solution,
patching the grader or NumPy, crashing or outliving the grader, exhausting its resources.
Every one must score what the stub scores (0 of 11 on the example chapter), finish within
the limits, and leave no process behind. They run once, concurrently, on the example
chapter of tests/grading_fixtures (copied into a course folder of their own).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
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
