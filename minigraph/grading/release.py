"""``minigraph release chapters -o DIR``: the student version of the chapters.

Every ``.py`` file is copied with each solution region::

    def mean(xs):
        # the mean of xs
        ### BEGIN SOLUTION
        return sum(xs) / len(xs)
        ### END SOLUTION

replaced by one line at the indentation of the ``### BEGIN SOLUTION`` marker::

    def mean(xs):
        # the mean of xs
        raise NotImplementedError("mean: replace this line with your solution")

The markers are comments (the same text inside a string is text). Everything outside the
regions is kept byte for byte (line endings included, and the encoding the file declares
with a BOM or a ``# -*- coding: latin-1 -*-`` line, as Python reads it); every other
file is copied as it is; caches (``__pycache__``, ``.pytest_cache``, ``*.pyc``) and hidden
files are left out. A region must lie inside a function, so that the released module
still imports and each unsolved exercise fails on its own; a region that does not, an
unclosed or nested region, or a released file that does not compile is an error that
names the file and the line, and nothing is written.

The release is self-contained:

- test files lose their ``@pytest.mark.hidden`` tests (graded, never shown), however the
  mark is spelled (see :func:`strip_hidden`); pytest itself then collects the released
  file beside the original, in the course, and one in which it sees a hidden test, or
  fewer or more visible cases of a test than in the original, is an error;
- a released ``.py`` file in which a comment still holds a marker (one after code on
  its line: not read as a marker, so the solution it marks would be shipped) is an error;
- every relative link of the chapters' Markdown must resolve. A link inside the chapters
  is kept; a link to a file of the project around them (``../../minigraph/ops/
  primitive.py``, a notebook, a benchmark) is pointed at a copy of that file under
  ``DIR/project/`` (Markdown files copied there have their own links followed the same
  way). A copy, not a web address: the course may be used without network and without a
  public repository, and a copy is the very source the text describes, which a student
  can open in any editor or browser, even with a minigraph installed from a wheel (which
  holds neither the notebooks nor the benchmarks). A link that resolves nowhere is an
  error naming the file and the line;
- the text's ``minigraph grade chapters/NN-topic`` (which, run in the project, grades the
  reference solution) becomes ``minigraph grade NN-topic --course .``, and ``DIR/README.md``
  says how a student checks their own copy against the course's public tests.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tokenize
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import minigraph

from minigraph.grading.collect import _marker, parse, read_source
from minigraph.grading.links import rewrite_links

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".ipynb_checkpoints", ".mypy_cache"}


class ReleaseError(Exception):
    """The chapters cannot be released as they are; the message names file and line."""


@dataclass
class Region:
    begin: int       # line numbers (1-based) of the markers in the solution file
    end: int
    owner: str = ""  # the function the region is in: "mean", "Counter.step"


def _markers(source: str, filename: str) -> list[Region]:
    """The regions between the markers; balanced and not nested, or ReleaseError. A marker
    is a comment alone on its line: the same text inside a string (this module's
    docstring, which a chapter may link to) is text, not a marker."""
    regions, open_at = [], None
    for token in _comments(source, filename):
        lineno, column = token.start
        if token.line[:column].strip():
            continue
        if token.string.startswith(BEGIN):
            if open_at is not None:
                raise ReleaseError(f"{filename}:{lineno}: {BEGIN} inside the region opened "
                                   f"on line {open_at} (regions cannot nest)")
            open_at = lineno
        elif token.string.startswith(END):
            if open_at is None:
                raise ReleaseError(f"{filename}:{lineno}: {END} without a {BEGIN} before it")
            regions.append(Region(open_at, lineno))
            open_at = None
    if open_at is not None:
        raise ReleaseError(f"{filename}:{open_at}: {BEGIN} is never closed by {END}")
    return regions


def _comments(source: str, filename: str) -> list[tokenize.TokenInfo]:
    """The comments of ``source`` that may hold a marker ([] when no marker text is in it);
    ReleaseError where it does not tokenize."""
    if BEGIN not in source and END not in source:
        return []
    try:
        # (readline with newline="": the lines of _lines, not split on "\n" only)
        tokens = tokenize.generate_tokens(io.StringIO(source, newline="").readline)
        return [token for token in tokens if token.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError) as exc:
        raise ReleaseError(f"{filename}: does not parse ({exc}), so its solution markers "
                           "cannot be found") from None


def _lines(source: str) -> list[str]:
    """The lines of ``source`` as Python reads them: ended by "\\n", "\\r\\n" or a lone "\\r"
    (a classic-Mac file), endings kept. Not ``str.splitlines``, which also splits on form
    feeds and other characters that Python leaves inside a line, nor ``readline`` of a
    plain ``io.StringIO``, which splits on "\\n" only: either would number the lines
    differently from ``tokenize`` and ``ast``, and put markers where they are not."""
    return io.StringIO(source, newline="").readlines()


def _line_ending(line: str) -> str:
    body = line.rstrip("\r\n")
    return line[len(body):] or "\n"


def stub_line(indent: str, owner: str, newline: str = "\n") -> str:
    """The line that replaces a solution region."""
    message = f"{owner}: replace this line with your solution"
    return f'{indent}raise NotImplementedError("{message}"){newline}'


def _functions_around(tree: ast.AST, lines: set[int]) -> dict[int, str]:
    """For each line in ``lines`` holding a statement, the qualified name of the innermost
    function around it ("" when it is at module or class level)."""
    found: dict[int, str] = {}

    def visit(node, qualname: str, in_function: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt) and child.lineno in lines:
                found.setdefault(child.lineno, in_function)
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = qualname + child.name
                visit(child, name + ".", name)
            elif isinstance(child, ast.ClassDef):
                visit(child, qualname + child.name + ".", "")
            else:
                visit(child, qualname, in_function)

    visit(tree, "", "")
    return found


def _release(source: str, filename: str) -> tuple[str, list[Region]]:
    regions = _markers(source, filename)
    if not regions:
        _no_marker_left(source, filename)
        return source, regions
    lines = _lines(source)
    out: list[str] = []
    stubs: list[tuple[int, str, str]] = []  # (line in the released file, indent, newline)
    position = 0  # index of the next line of `lines` not yet copied
    for region in regions:
        out.extend(lines[position:region.begin - 1])
        marker = lines[region.begin - 1]
        indent = marker[:len(marker) - len(marker.lstrip())]
        stubs.append((len(out) + 1, indent, _line_ending(marker)))
        out.append(stub_line(indent, "?", _line_ending(marker)))
        position = region.end  # skip through the END marker
    out.extend(lines[position:])
    try:
        tree = parse("".join(out), filename=filename)
    except SyntaxError as exc:
        raise ReleaseError(f"{filename}: the released file does not compile: {exc.msg} "
                           f"(line {exc.lineno} of the released file)") from None
    owners = _functions_around(tree, {line for line, _, _ in stubs})
    for region, (line, indent, newline) in zip(regions, stubs):
        owner = owners.get(line, "")
        if not owner:
            raise ReleaseError(
                f"{filename}:{region.begin}: the solution region is not inside a function; "
                "the released module would fail on import (move the solution into a function)")
        region.owner = owner
        out[line - 1] = stub_line(indent, owner, newline)
    released = "".join(out)
    _no_marker_left(released, filename)
    return released, regions


def _no_marker_left(released: str, filename: str) -> None:
    """Refuse a released file in which a comment still holds a solution marker: one that
    the scan of regions does not read as a marker (after code on its line, or after other
    text in its comment) marks a solution about to be given to students. The same text in
    a string is text, as it is to :func:`_markers`."""
    for token in _comments(released, filename):
        if BEGIN in token.string or END in token.string:
            raise ReleaseError(f"{filename}: line {token.start[0]} of the released file still "
                               "holds a solution marker in a comment, so a solution may be left "
                               "in it; a marker must be a comment alone on its line")


def solution_regions(source: str, filename: str = "<string>") -> list[Region]:
    """The solution regions of ``source``, checked (balanced, not nested, each inside a
    function, the released file compiles); :class:`ReleaseError` otherwise."""
    return _release(source, filename)[1]


def strip_solutions(source: str, filename: str = "<string>") -> str:
    """``source`` with every solution region replaced by ``raise NotImplementedError``."""
    return _release(source, filename)[0]


def _hides(node: ast.expr | None, aliases: set[str] | frozenset[str]) -> bool:
    """Whether ``node`` is the hidden mark: ``pytest.mark.hidden`` (called or not), a name
    bound to it (``aliases``), or a list or tuple holding one (``marks=[...]``)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_hides(element, aliases) for element in node.elts)
    if isinstance(node, ast.Name):
        return node.id in aliases
    return node is not None and _marker(node, "hidden") is not None


def _sets_pytestmark(node: ast.stmt, aliases: set[str] | frozenset[str]) -> bool:
    """Whether ``node`` is ``pytestmark = <the hidden mark>`` (which marks every test of
    its class or module)."""
    return isinstance(node, ast.Assign) and _hides(node.value, aliases) and \
        any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)


def _parametrize_args(node: ast.expr) -> tuple[ast.expr | None, ast.expr | None]:
    """(argvalues, ids) of ``node`` when it is a ``pytest.mark.parametrize(...)`` call,
    each given by position or by keyword; None for what is not given."""
    call = _marker(node, "parametrize")
    if not isinstance(call, ast.Call):
        return None, None
    keywords = {k.arg: k.value for k in call.keywords}
    values = call.args[1] if len(call.args) > 1 else keywords.get("argvalues")
    ids = call.args[3] if len(call.args) > 3 else keywords.get("ids")
    return values, ids


def _is_hidden(node: ast.stmt, aliases: set[str] | frozenset[str] = frozenset()) -> bool:
    """Whether the def or class ``node`` is hidden: by one of its decorators, by a
    ``parametrize`` whose every case is hidden, or (a class) by its own ``pytestmark``."""
    for decorator in getattr(node, "decorator_list", []):
        if _hides(decorator, aliases):
            return True
        cases = _parametrize_args(decorator)[0]
        if isinstance(cases, (ast.List, ast.Tuple)) and cases.elts and \
                all(_is_hidden_case(case, aliases) for case in cases.elts):
            return True   # (stripped case by case, it would be left with none: skipped)
    return isinstance(node, ast.ClassDef) and any(_sets_pytestmark(s, aliases) for s in node.body)


def _is_hidden_case(node: ast.expr, aliases: set[str] | frozenset[str]) -> bool:
    """Whether ``node`` is ``pytest.param(..., marks=<the hidden mark>)``: one hidden case."""
    if not isinstance(node, ast.Call):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else \
        node.func.id if isinstance(node.func, ast.Name) else None
    return name == "param" and any(k.arg == "marks" and _hides(k.value, aliases)
                                   for k in node.keywords)


def _cut_elements(elements: list[ast.expr], cut: set[int],
                  spans: list[tuple[int, int, int, int]]) -> None:
    """Add to ``spans`` the elements ``cut`` (indices) of a list, tuple or tuple target,
    each with one comma: up to the next element, else (the last) from the one before."""
    for i in sorted(cut):
        if i + 1 < len(elements):
            spans.append((*_start(elements[i]), *_start(elements[i + 1])))
        else:
            spans.append((*(_end(elements[i - 1]) if i else _start(elements[i])),
                           *_end(elements[i])))


def strip_hidden(source: str, filename: str = "<string>",
                 folder: str | Path | None = None, *, course: str | Path | None = None) -> str:
    """``source`` (a test file) without its hidden tests: graded by the grader, never shown
    in the student's copy. A test is hidden as pytest sees it: ``@pytest.mark.hidden`` or a
    module-level name bound to it (``secret = pytest.mark.hidden``, then ``@secret``) on
    the test, its class or a class it inherits from, ``pytestmark = pytest.mark.hidden``
    in its class or module, and one case ``pytest.param(..., marks=pytest.mark.hidden)``
    of a list of cases (its entry in a literal ``ids=[...]`` goes with it).

    Then pytest itself checks the result (:func:`_check_with_pytest`): a spelling of the
    mark that the stripper does not know (``m = pytest.mark``, then ``@m.hidden``) is a
    :class:`ReleaseError`, never a hidden test shown. ``folder`` goes on ``sys.path`` for
    that check (the chapter's, where the tests import from; default: the folder of
    ``filename`` when it is a file); ``course`` is pytest's rootdir, whose ``conftest.py``
    files apply (default: the folder of ``filename``)."""
    try:
        tree = parse(source, filename=filename)
    except SyntaxError as exc:
        raise ReleaseError(f"{filename}:{exc.lineno}: does not parse: {exc.msg}") from None
    aliases: set[str] = set()
    spans: list[tuple[int, int, int, int]] = []   # (line, column) to (line, column) to cut

    def cut(node: ast.stmt) -> None:  # whole lines, its decorators included
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        assert node.end_lineno is not None  # ast.parse sets positions
        spans.append((first, 0, node.end_lineno + 1, 0))

    hidden_module = False
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and _hides(node.value, aliases)):
            continue
        hidden_module |= _sets_pytestmark(node, aliases)
        target, value = node.targets[0], node.value
        if len(node.targets) == 1 and isinstance(target, ast.Tuple) and \
                isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts) and \
                not all(_hides(v, aliases) for v in value.elts):
            # `secret, two = pytest.mark.hidden, pytest.mark.points(2)`: only `secret` goes
            hides = {i for i, v in enumerate(value.elts) if _hides(v, aliases)}
            aliases.update(t.id for i, t in enumerate(target.elts)
                           if i in hides and isinstance(t, ast.Name))
            _cut_elements(target.elts, hides, spans)
            _cut_elements(value.elts, hides, spans)
        else:   # (nothing of the mark is left for a student to wonder about)
            aliases.update(name.id for t in node.targets for name in ast.walk(t)
                           if isinstance(name, ast.Name) and name.id != "pytestmark")
            cut(node)

    hidden_classes: set[str] = set()   # a class inheriting from one is hidden too

    def visit(body: list[ast.stmt], all_hidden: bool) -> int:
        """Cut the hidden tests of ``body``; return how many statements were cut."""
        count = 0
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inherits = isinstance(node, ast.ClassDef) and any(
                    isinstance(base, ast.Name) and base.id in hidden_classes for base in node.bases)
                if inherits or _is_hidden(node, aliases) or \
                        (all_hidden and node.name.lower().startswith("test")):
                    if isinstance(node, ast.ClassDef):
                        hidden_classes.add(node.name)
                    cut(node)
                    count += 1
                elif isinstance(node, ast.ClassDef) and visit(node.body, False) == len(node.body):
                    cut(node)   # (a class left without a statement would not compile)
                    count += 1
        return count

    visit(tree.body, hidden_module)
    for found in ast.walk(tree):   # hidden cases, wherever the list of cases is written
        if isinstance(found, (ast.List, ast.Tuple)):
            _cut_elements(found.elts, {i for i, case in enumerate(found.elts)
                                       if _is_hidden_case(case, aliases)}, spans)
        if not isinstance(found, ast.Call):
            continue
        values, ids = _parametrize_args(found)
        if isinstance(values, (ast.List, ast.Tuple)) and isinstance(ids, (ast.List, ast.Tuple)) \
                and len(ids.elts) == len(values.elts):   # each case's id goes with it
            _cut_elements(ids.elts, {i for i, case in enumerate(values.elts)
                                     if _is_hidden_case(case, aliases)}, spans)
    released = _cut(source, spans)
    # what is left must not name the mark (a quick check, with a precise message; the
    # sound one, of every spelling, is pytest's own below)
    marks = {"mark"} | {alias.asname or alias.name for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom) and node.module == "pytest"
                        for alias in node.names if alias.name == "mark"}
    for used in ast.walk(parse(released, filename=filename)):
        if isinstance(used, ast.Attribute) and used.attr == "hidden" and (
                (isinstance(used.value, ast.Attribute) and used.value.attr == "mark") or
                (isinstance(used.value, ast.Name) and used.value.id in marks)):
            raise ReleaseError(
                f"{filename}: the hidden mark is used in a way the release cannot strip "
                f"(line {used.lineno} of the released file), so the test it hides would be "
                f"shown to students; {_HOW_TO_HIDE}")
    if folder is None and Path(filename).is_file():
        folder = Path(filename).parent
    _check_with_pytest(source, released, filename, folder, course)
    return released


_HOW_TO_HIDE = ("mark the test with @pytest.mark.hidden on its def or class, pytestmark = "
                "pytest.mark.hidden, or pytest.param(..., marks=pytest.mark.hidden)")

#: run in a subprocess: collect with pytest (options and files in argv[2:]), write what it
#: saw and its collection errors as JSON into argv[1]. A test is known by its function
#: (class and name, without the [id] of a case: ids may be drawn at import, and automatic
#: ids are renumbered when a hidden case is cut), so the two files' tests can be compared.
_COLLECT = """\
import json, sys, pytest
class Record:
    def __init__(self):
        self.items, self.errors = [], []
    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append([report.nodeid, str(report.longrepr)[-600:]])
    def pytest_collection_finish(self, session):  # (file, function, test id, hidden)
        self.items = [[str(item.path), "::".join(item.parent.nodeid.split("::")[1:] +
                                                 [getattr(item, "originalname", item.name)]),
                       item.nodeid.split("::", 1)[-1],
                       item.get_closest_marker("hidden") is not None] for item in session.items]
record = Record()
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p",
                    "minigraph.grading.plugin", "--import-mode=importlib"] + sys.argv[2:],
                   plugins=[record])
with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump({"items": record.items, "errors": record.errors, "exit": int(code)}, f)
"""


def _python_bytes(text: str) -> bytes:
    """``text`` encoded as its coding line (``# -*- coding: latin-1 -*-``) says, UTF-8
    without one: the bytes from which Python reads ``text`` back."""
    encoding = tokenize.detect_encoding(io.BytesIO(text.encode("utf-8")).readline)[0]
    return text.encode(encoding)


def _check_with_pytest(original: str, released: str, filename: str,
                       folder: str | Path | None, course: str | Path | None) -> None:
    """Refuse (:class:`ReleaseError`) a released test file in which pytest, collecting it,
    sees a hidden test, or a number of visible cases of a test other than in the original,
    or which does not collect. The stripper reads the marks' spellings it knows; pytest is
    the judge of what is hidden, whatever the spelling, so this check is the one that makes
    the release safe. It runs in a subprocess (collecting imports the test file) with
    ``folder`` on ``sys.path``, where the tests import from.

    Both files are collected where the test file lives, as pytest collects it there: the
    file ``filename`` itself, and ``released`` written beside it under a temporary name
    (so that a test reading ``Path(__file__).parent / "cases.txt"`` finds it), with
    ``course`` as rootdir (so that its ``conftest.py`` files apply). A ``filename`` that is
    no file is ``original`` collected in a temporary folder."""
    package_root = str(Path(minigraph.__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory() as tmp:
        test = Path(filename).resolve()
        if not test.is_file():
            test = Path(tmp) / (test.name if test.name.endswith(".py") else "test_file.py")
            test.write_bytes(_python_bytes(original))
            course = tmp
        root = Path(course).resolve() if course is not None else test.parent
        (Path(tmp) / "pytest.ini").write_text("[pytest]\n")   # (not an ini file found around)
        path = [str(Path(folder).resolve())] if folder is not None else []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            path + [package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
        env.pop("PYTEST_ADDOPTS", None)
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"   # (only the grader's plugin: seconds less)
        env["PYTHONDONTWRITEBYTECODE"] = "1"          # (no __pycache__ left in the chapter)
        try:
            descriptor, name = tempfile.mkstemp(prefix="_release_check_", suffix="_" + test.name,
                                                dir=test.parent)
        except OSError as exc:
            raise ReleaseError(f"{filename}: the released text cannot be written beside it for "
                               f"pytest to check that it shows no hidden test ({exc})") from None
        beside, output = Path(name), ""
        try:
            with open(descriptor, "wb") as f:
                f.write(_python_bytes(released))
            run = subprocess.run(
                [sys.executable, "-c", _COLLECT, str(Path(tmp) / "seen.json"),
                 "-c", str(Path(tmp) / "pytest.ini"), "--rootdir", str(root), "--confcutdir",
                 str(root), str(test), str(beside)],
                cwd=root, env=env, capture_output=True, timeout=300)
            output = (run.stdout + run.stderr).decode("utf-8", "replace")[-600:]
            with open(Path(tmp) / "seen.json", encoding="utf-8") as f:
                seen = json.load(f)
        except (OSError, ValueError, SyntaxError, subprocess.TimeoutExpired) as exc:
            raise ReleaseError(f"{filename}: pytest could not collect the test file, so the "
                               f"release cannot check that it shows no hidden test ({exc})"
                               f"\n{output}") from None
        finally:
            beside.unlink(missing_ok=True)
    for nodeid, error in seen["errors"]:
        which = "released" if beside.name in nodeid else "original"
        raise ReleaseError(f"{filename}: the {which} test file does not collect with pytest, "
                           f"so the release cannot check that it shows no hidden test:\n{error}")
    if seen["exit"] not in (0, 5):   # (5: no test at all) pytest stopped before collecting
        raise ReleaseError(f"{filename}: pytest could not collect the test file (exit code "
                           f"{seen['exit']}), so the release cannot check that it shows no "
                           f"hidden test:\n{output}")
    visible: dict[Path, Counter[str]] = {test: Counter(), beside: Counter()}
    shown = []
    for file, function, test_id, hidden in seen["items"]:
        if hidden and Path(file) == beside:
            shown.append(test_id)
        elif not hidden:
            visible.setdefault(Path(file), Counter())[function] += 1
    changed = [f"{function} ({visible[test][function]} in the original, "
               f"{visible[beside][function]} in the release)"
               for function in sorted(visible[test].keys() | visible[beside].keys())
               if visible[test][function] != visible[beside][function]]
    if shown:
        raise ReleaseError(f"{filename}: the release cannot strip the hidden mark as it is "
                           f"written here: pytest still sees {', '.join(shown)} as hidden in "
                           f"the released file, which would show it to students; {_HOW_TO_HIDE}")
    if changed:
        raise ReleaseError(f"{filename}: the release would not show the visible tests as "
                           f"they are: pytest finds visible cases of {', '.join(changed)}; "
                           "write the hidden tests apart from the visible ones")


def _start(node: ast.expr) -> tuple[int, int]:
    return node.lineno, node.col_offset


def _end(node: ast.expr) -> tuple[int, int]:
    assert node.end_lineno is not None and node.end_col_offset is not None  # ast.parse sets them
    return node.end_lineno, node.end_col_offset


def _cut(source: str, spans: list[tuple[int, int, int, int]]) -> str:
    """``source`` without the text of ``spans`` ((line, column) to (line, column), as
    ``ast`` counts them: lines from 1, columns in UTF-8 bytes); spans may overlap."""
    lines = _lines(source)
    data = source.encode("utf-8")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line.encode("utf-8")))
    out, position = [], 0
    for first, col, last, end_col in sorted(spans):
        begin, stop = starts[first - 1] + col, starts[min(last, len(lines) + 1) - 1] + end_col
        out.append(data[position:max(begin, position)])
        position = max(position, stop)
    out.append(data[position:])
    return b"".join(out).decode("utf-8")


def _files(chapters: Path):
    for path in sorted(chapters.rglob("*")):
        parts = path.relative_to(chapters).parts
        if any(p in SKIPPED_DIRS or p.startswith(".") for p in parts) or path.suffix == ".pyc":
            continue
        if path.is_file():
            yield path


#: where files of the project that the chapters link to are copied, inside the release
PROJECT_DIR = "project"
#: ``minigraph grade chapters/NN-topic`` in the chapters' text
_GRADE_IN_PROJECT = re.compile(r"minigraph grade chapters/(?P<chapter>[\w.-]+)/?")

STUDENT_README = """\
# {title}

Your copy of the course: one folder per chapter, each with its text (`README.md`), the
exercises to write (`exercises.py`, where every `raise NotImplementedError(...)` line
waits for your solution) and the public tests (`test_exercises.py`).{project}

## Checking your own work

Write your solutions into the chapter's `exercises.py`, then, from this folder:

```
minigraph grade {example} --course .
```

This grades *your* `{example}/exercises.py` against this course's tests for that chapter
(`--course .` names this folder as the course): a table of the tests, the points of each,
and why the failed ones failed. Untouched, the exercises score 0. Kept elsewhere, a
chapter folder is graded the same way, as long as it keeps the chapter's name:

```
minigraph grade path/to/your/{example} --course path/to/this/folder
```

Only your `exercises.py` is read: the tests always come from the course. Your submission
is graded the same way, perhaps with a few more tests that you see once the grades are published.

Chapters:

{chapters}
"""


def _rel(target: Path, start: Path) -> str:
    """``target`` relative to the folder ``start``, with forward slashes."""
    return Path(os.path.relpath(target, start)).as_posix()


class _Plan:
    """Everything to write, computed (and checked) before anything is written."""

    def __init__(self, chapters: Path, out: Path, project: Path):
        self.chapters, self.out, self.project = chapters.resolve(), out, project.resolve()
        self.items: dict[Path, tuple[Path | None, str | None, int]] = {}  # target -> (source, text, regions)
        self.pending: list[tuple[Path, Path]] = []                       # (source, target)
        self.encodings: dict[Path, str] = {}   # target -> its source's (when not UTF-8)

    def source_file(self, path: Path, target: Path) -> None:
        """Plan ``path`` (a file of the chapters or of the project) to go to ``target``."""
        if target in self.items:
            return
        if path.suffix == ".py":
            try:   # (decoded as Python does: a BOM, a coding line; written back the same)
                source, self.encodings[target] = read_source(path)
            except SyntaxError as exc:
                raise ReleaseError(str(exc)) from None
            released, regions = _release(source, str(path))
            if path.name.startswith("test_"):   # (pytest checks it in its course's folder)
                course = self.chapters if path.resolve().is_relative_to(self.chapters) \
                    else self.project
                released = strip_hidden(released, str(path), course=course)
            self.items[target] = (path, released, len(regions))
        elif path.suffix == ".md":
            self.items[target] = (path, None, 0)
            self.pending.append((path, target))   # its links, once every chapter is planned
        else:
            self.items[target] = (path, None, 0)

    def resolve_links(self) -> None:
        while self.pending:
            path, target = self.pending.pop(0)
            try:
                with open(path, encoding="utf-8", newline="") as f:
                    text = f.read()
            except UnicodeDecodeError as exc:
                raise ReleaseError(f"{path}: not UTF-8 text ({exc})") from None
            text = rewrite_links(text, lambda link: self._relink(path, target, text, link))
            text = _GRADE_IN_PROJECT.sub(self._grade_command, text)
            self.items[target] = (path, text, 0)

    def _grade_command(self, match: re.Match) -> str:
        chapter = match.group("chapter")
        if not (self.chapters / chapter).is_dir():
            return match.group(0)
        return f"minigraph grade {chapter} --course ."

    def _relink(self, path: Path, target: Path, text: str, link) -> str | None:
        if not link.is_relative:
            return None
        linked = (path.parent / link.path).resolve()
        where = f"{path}:{text.count(chr(10), 0, link.start) + 1}"
        if not linked.exists():
            raise ReleaseError(f"{where}: the link {link.target!r} leads nowhere "
                               f"({linked} does not exist)")
        if linked == self.chapters or self.chapters in linked.parents:
            copy = self.out / linked.relative_to(self.chapters)
            if linked.is_file() and copy not in self.items:
                raise ReleaseError(f"{where}: the link {link.target!r} leads to a file the "
                                   "release leaves out (a cache or a hidden file)")
        elif self.project in linked.parents:
            copy = self.out / PROJECT_DIR / linked.relative_to(self.project)
            if linked.is_dir():
                for file in _files(linked):
                    self.source_file(file, copy / file.relative_to(linked))
            else:
                self.source_file(linked, copy)
        else:
            raise ReleaseError(f"{where}: the link {link.target!r} leads out of the project "
                               f"({self.project}): the release cannot include it")
        return _rel(copy, target.parent) + ("/" if link.path.endswith("/") else "") + link.suffix


def release(chapters: str | Path, out: str | Path, *, force: bool = False,
            project: str | Path | None = None) -> list[tuple[Path, int]]:
    """Write the student version of ``chapters`` into ``out``; return (file written,
    number of solution regions stripped) for every file.

    ``project``: the folder whose files the chapters' links may reach (default: the one
    holding ``chapters``); those files are copied into ``out/project/``."""
    chapters, out = Path(chapters), Path(out)
    if not chapters.is_dir():
        raise ReleaseError(f"{chapters} is not a folder")
    src, dst = chapters.resolve(), out.resolve()
    if dst == src or src in dst.parents:
        raise ReleaseError(f"the output folder {out} must not be inside {chapters}")
    if dst.exists() and not dst.is_dir():
        raise ReleaseError(f"{out} exists and is not a folder")
    if dst.exists() and any(dst.iterdir()) and not force:
        raise ReleaseError(f"{out} is not empty (pass --force to write into it anyway)")
    if (chapters / PROJECT_DIR).exists():
        raise ReleaseError(f"{chapters / PROJECT_DIR}: the release keeps that name for the "
                           "project's files the chapters link to; rename the folder")
    # everything is stripped and checked before anything is written
    plan = _Plan(chapters, out, Path(project) if project is not None else src.parent)
    for path in _files(chapters):
        if path.relative_to(chapters) != Path("README.md"):
            plan.source_file(path, out / path.relative_to(chapters))
    plan.resolve_links()
    plan.items[out / "README.md"] = (None, _student_readme(chapters, plan), 0)
    written = []
    for target, (path, text, count) in plan.items.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            assert path is not None  # only the README has no source, and it has a text
            shutil.copyfile(path, target)
        else:
            with open(target, "w", encoding=plan.encodings.get(target, "utf-8"), newline="") as f:
                f.write(text)
        written.append((target, count))
    return written


def _student_readme(chapters: Path, plan: _Plan) -> str:
    """The release's README.md: how to check one's own work (after the chapters' own
    README.md, when they have one)."""
    names = sorted(p.name for p in chapters.iterdir()
                   if p.is_dir() and (p / "exercises.py").is_file())
    listing = "\n".join(f"- [`{name}`]({name}/" + ("README.md" if (chapters / name / "README.md").is_file()
                        else "exercises.py") + ")" for name in names) or "(none)"
    copied = any(t.relative_to(plan.out).parts[0] == PROJECT_DIR for t in plan.items)
    project = "" if not copied else (
        "\nThe files of the minigraph project that the chapters link to are in "
        f"[`{PROJECT_DIR}/`]({PROJECT_DIR}/): copies to read (the library you run is the "
        "`minigraph` you installed).")
    text = STUDENT_README.format(title="The course", project=project,
                                 example=names[0] if names else "01-chapter", chapters=listing)
    own = chapters / "README.md"
    if own.is_file():
        plan.source_file(own, plan.out / "README.md")
        plan.resolve_links()
        intro = plan.items.pop(plan.out / "README.md")[1] or ""
        text = intro.rstrip("\n") + "\n\n" + text.split("\n", 2)[2]   # without the title
    return text


# -- command line ------------------------------------------------------------------------

RELEASE_HELP = "write the student version of the chapters: solution regions replaced by stubs"


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("chapters", metavar="CHAPTERS", help="the course's chapters folder")
    parser.add_argument("-o", "--output", metavar="DIR", required=True,
                        help="where the student version goes (same folder layout)")
    parser.add_argument("--force", action="store_true",
                        help="write into DIR even if it is not empty")


def add_release_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``release`` to an ``argparse`` subparsers object; ``args.run(args)`` releases."""
    parser = subparsers.add_parser("release", help=RELEASE_HELP, description=RELEASE_HELP + ".")
    _add_arguments(parser)
    parser.set_defaults(run=run_release)
    return parser


def run_release(args: argparse.Namespace) -> int:
    try:
        written = release(args.chapters, args.output, force=args.force)
    except ReleaseError as exc:
        print(f"minigraph release: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.output)
    for target, count in written:
        if count:
            print(f"  {target.relative_to(out)}: {count} solution region{'s' * (count != 1)} stripped")
    regions = sum(c for _, c in written)
    print(f"released {len(written)} files ({regions} solution regions stripped) into {out}")
    return 0


def release_main(argv=None) -> int:
    """``minigraph release`` as a function of its arguments (without ``release`` itself)."""
    parser = argparse.ArgumentParser(prog="minigraph release", description=RELEASE_HELP + ".")
    _add_arguments(parser)
    return run_release(parser.parse_args(argv))
