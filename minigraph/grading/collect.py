"""The graded tests a test file declares, read from its source without running it.

pytest's own collection is the authority (the grader uses it whenever the test file
imports); this static reading is the fallback that lets the report list every test, with
its points, even when the test file cannot be imported at all (for instance because it
imports ``exercises`` at module level and the student's module is broken). It understands
what chapter test files contain: module-level ``def test_*`` functions and ``Test*``
classes, ``@pytest.mark.points(n)`` on either, and ``@pytest.mark.parametrize`` with a
literal list of cases (the test is then listed once, worth n points per case, since
pytest's case ids cannot be reproduced without running the file).
"""

from __future__ import annotations

import ast
import io
import math
import numbers
import threading
import tokenize
from dataclasses import dataclass
from pathlib import Path

_PARSING = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, one thread at a time: CPython 3.11's AST constructor keeps a
    recursion counter that parses in two threads at once corrupt ("SystemError: AST
    constructor recursion depth mismatch"), and the grader grades chapters in threads."""
    with _PARSING:
        return ast.parse(source, filename=filename)


def read_source(path: str | Path) -> tuple[str, str]:
    """(text, encoding) of the Python file ``path``, decoded as Python decodes it: a UTF-8
    BOM or a PEP 263 line (``# -*- coding: latin-1 -*-``) names the encoding, UTF-8
    otherwise; line endings are kept as they are. ``encoding`` is "utf-8-sig" for a file
    with a BOM, so that writing the text back in it restores the BOM. Raises SyntaxError
    (naming the file) where the bytes do not decode, as Python's own import would."""
    data = Path(path).read_bytes()
    try:
        encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
        return data.decode(encoding), encoding
    except (SyntaxError, UnicodeError, LookupError) as exc:   # ("undefined": UnicodeError)
        raise SyntaxError(f"{path}: cannot be read as Python source ({exc})") from None


#: the most a test may be worth: far above any course's, and low enough that the total of
#: any number of tests is a finite float (two tests worth 1e308 overflowed it)
MAX_POINTS = 1e6


def valid_points(value: object) -> bool:
    """Whether ``value`` may be what a test is worth: a real number (not a bool), finite,
    >= 0 and at most :data:`MAX_POINTS`. (An infinite or NaN score is no grade, and
    results.json would hold "Infinity" or "NaN", which is not JSON: Gradescope rejects
    the whole file.)"""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value) and 0 <= float(value) <= MAX_POINTS
    except OverflowError:   # an int too large for a float
        return False


@dataclass
class DeclaredTest:
    nodeid: str          # "test_exercises.py::test_mean" or "...::TestX::test_y"
    points: float        # 0 when unmarked
    marked: bool         # has a points marker with a literal number
    lineno: int


def _marker(decorator: ast.expr, name: str) -> ast.expr | None:
    """``decorator`` if it is ``[pytest.]mark.<name>`` or ``[pytest.]mark.<name>(...)``."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Attribute) and target.attr == name:
        owner = target.value
        if (isinstance(owner, ast.Attribute) and owner.attr == "mark") or \
                (isinstance(owner, ast.Name) and owner.id == "mark"):
            return decorator
    return None


def _points(decorators: list[ast.expr]) -> float | None:
    for decorator in decorators:
        marker = _marker(decorator, "points")
        if isinstance(marker, ast.Call):
            args = list(marker.args) + [k.value for k in marker.keywords]
            value = args[0].value if len(args) == 1 and isinstance(args[0], ast.Constant) else None
            if isinstance(value, (int, float)) and valid_points(value):  # (1e999 is infinite)
                return value
    return None


def _cases(decorators: list[ast.expr]) -> int:
    """How many cases the literal ``parametrize`` decorators give (1 if none/unknown)."""
    cases = 1
    for decorator in decorators:
        marker = _marker(decorator, "parametrize")
        if isinstance(marker, ast.Call) and len(marker.args) >= 2 \
                and isinstance(marker.args[1], (ast.List, ast.Tuple)):
            cases *= max(len(marker.args[1].elts), 1)
    return cases


def declared_tests(test_file: str | Path, nodeid_prefix: str | None = None) -> list[DeclaredTest]:
    """The tests ``test_file`` declares, in source order. Raises SyntaxError if the file
    does not parse."""
    path = Path(test_file)
    prefix = nodeid_prefix if nodeid_prefix is not None else path.name
    tree = parse(read_source(path)[0], filename=str(path))
    found: list[DeclaredTest] = []

    def add(node, owner: str, inherited: float | None):
        own = _points(node.decorator_list)
        points = own if own is not None else inherited
        cases = _cases(node.decorator_list)
        total = (points or 0) * cases
        found.append(DeclaredTest(f"{prefix}::{owner}{node.name}", total, points is not None,
                                  node.lineno))

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            add(node, "", None)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            inherited = _points(node.decorator_list)
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                        and member.name.startswith("test"):
                    add(member, f"{node.name}::", inherited)
    return found


def base_nodeid(nodeid: str) -> str:
    """The node id without its parametrize case: ``f.py::test_x[1-2]`` -> ``f.py::test_x``."""
    return nodeid.split("[", 1)[0]
