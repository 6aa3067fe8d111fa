"""Checks of a chapter against the rules chapter authors follow (see the package docs).

:func:`check_chapter` reads a chapter folder without running it and returns the problems
it finds, as sentences naming file and line; an empty list means the chapter follows the
contract. The test suite runs it on every chapter.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from minigraph.grading.collect import declared_tests, parse, read_source
from minigraph.grading.release import ReleaseError, strip_hidden, strip_solutions

MIN_EXERCISES = 3
_CHAPTER = re.compile(r"\b(\d\d)-[a-z][a-z0-9-]*")


def chapter_number(folder: str | Path) -> int | None:
    match = re.match(r"(\d+)-", Path(folder).name)
    return int(match.group(1)) if match else None


def _imports_exercises(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "exercises" for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] == "exercises"
    return False


def _forbidden_names(tree: ast.Module) -> list[tuple[str, int]]:
    """(name, line) for every name a ``@pytest.mark.forbid(...)`` of the test file gives,
    directly or through a module-level tuple (``*NO_RUNTIME``)."""
    constants: dict[str, list[str]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.Tuple, ast.List)):
            values = [e.value for e in stmt.value.elts
                      if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = values
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "forbid":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((arg.value, node.lineno))
                elif isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name):
                    found += [(name, node.lineno) for name in constants.get(arg.value.id, [])]
    return found


def resolves(name: str) -> bool:
    """Whether ``name`` (``"numpy.broadcast_shapes"``) names an object the sandbox can
    guard: a module's attribute."""
    module, _, attr = name.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), attr)
    except (ImportError, ValueError):
        return False


def _code_run_in_the_grader(tree: ast.Module, tests: Path) -> list[str]:
    """``exec``, ``eval`` and ``compile`` calls of the test file outside the helpers it
    sends to the sandbox (``in_sandbox(exercises, helper, ...)``): the tests run in the
    grader's process, so source text a student's function returned, run there, would
    run with the grader's rights (an attack found the results' collector that way)."""
    sent = {node.args[1].id for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "in_sandbox" and len(node.args) > 1
            and isinstance(node.args[1], ast.Name)}
    problems = []
    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) and top.name in sent:
            continue  # (its text is defined and run in the sandbox)
        for node in ast.walk(top):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("exec", "eval", "compile"):
                problems.append(f"{tests}:{node.lineno}: {node.func.id}() runs code in the "
                                f"grader's process; run a student's text in the sandbox: a "
                                f"helper that calls {node.func.id}, sent with "
                                f"in_sandbox(exercises, helper, ...)")
    return problems


def check_chapter(folder: str | Path, *, min_tests: int = MIN_EXERCISES) -> list[str]:
    """The ways in which the chapter in ``folder`` breaks the authors' contract."""
    folder = Path(folder)
    problems: list[str] = []
    exercises, tests = folder / "exercises.py", folder / "test_exercises.py"
    for required in (exercises, tests):
        if not required.is_file():
            problems.append(f"{required}: missing")
    if problems:
        return problems

    try:
        source = read_source(exercises)[0]
    except SyntaxError as exc:
        return problems + [str(exc)]
    try:
        released = strip_solutions(source, str(exercises))
        if released == source:
            problems.append(f"{exercises}: no ### BEGIN SOLUTION / ### END SOLUTION region")
    except ReleaseError as exc:
        problems.append(str(exc))

    try:
        test_source = read_source(tests)[0]
        tree = parse(test_source, filename=str(tests))
        declared = declared_tests(tests)
    except SyntaxError as exc:
        if exc.lineno is None:   # (read_source's: the bytes do not decode)
            return problems + [str(exc)]
        return problems + [f"{tests}:{exc.lineno}: does not parse: {exc.msg}"]
    try:  # a hidden test the release cannot strip would be shown to students
        strip_hidden(test_source, str(tests), course=folder.parent)
    except ReleaseError as exc:
        problems.append(str(exc))
    for stmt in tree.body:  # module level only: inside a fixture or test is the rule
        if _imports_exercises(stmt):
            problems.append(f"{tests}:{stmt.lineno}: imports exercises at module level; take "
                            "the `exercises` fixture instead (exercises = exercises_fixture())")
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    if not names & {"exercises_fixture", "load_exercises"}:
        problems.append(f"{tests}: does not define the fixture: exercises = exercises_fixture()")
    for test in declared:
        if not test.marked:
            problems.append(f"{tests}:{test.lineno}: {test.nodeid} has no @pytest.mark.points(n) "
                            "with a number (finite, >= 0, written as a literal)")
    if len(declared) < min_tests:
        problems.append(f"{tests}: {len(declared)} graded tests; a chapter has at least {min_tests}")
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):  # (broadcasting
        # comparisons: see grading/compare.py)
        called = call.func.attr if isinstance(call.func, ast.Attribute) else \
            call.func.id if isinstance(call.func, ast.Name) else None
        if called in ("allclose", "assert_allclose", "approx"):
            # (pytest.approx compares an array item by item: an empty one, which a
            # student's function may return, equals any number)
            problems.append(f"{tests}:{call.lineno}: {called} broadcasts (an empty "
                            f"array or a scalar passes it); compare with "
                            f"assert_same_array(got, expected) from minigraph.grading, or "
                            f"math.isclose(float(got), expected) for one number")

    # a student's text run as code here would run as the grader, outside the sandbox
    problems += _code_run_in_the_grader(tree, tests)

    # a forbidden name that names nothing would guard nothing, silently
    for name, lineno in sorted(set(_forbidden_names(tree)), key=lambda item: item[1]):
        if not resolves(name):
            problems.append(f"{tests}:{lineno}: @pytest.mark.forbid names {name!r}, which is "
                            "not a module's attribute: nothing would be forbidden")

    # chapter N's tests may rely on chapters up to N only: no later chapter is named
    number = chapter_number(folder)
    if number is not None:
        prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in prose:
                for match in _CHAPTER.finditer(node.value):
                    if int(match.group(1)) > number:
                        problems.append(f"{tests}:{node.lineno}: refers to a later chapter "
                                        f"{match.group(0)!r}; chapter {number} may use chapters "
                                        f"up to {number} only")
    return problems
