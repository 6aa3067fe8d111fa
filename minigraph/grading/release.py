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

Everything outside the regions is kept byte for byte (line endings included); every other
file is copied as it is; caches (``__pycache__``, ``.pytest_cache``, ``*.pyc``) and hidden
files are left out. A region must lie inside a function, so that the released module
still imports and each unsolved exercise fails on its own; a region that does not, an
unclosed or nested region, or a released file that does not compile is an error that
names the file and the line, and nothing is written.

The release is self-contained:

- test files lose their ``@pytest.mark.hidden`` tests (graded, never shown);
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
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from minigraph.grading.collect import parse
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
    """The regions between the markers; balanced and not nested, or ReleaseError."""
    regions, open_at = [], None
    for lineno, line in enumerate(source.splitlines(), 1):
        text = line.strip()
        if text.startswith(BEGIN):
            if open_at is not None:
                raise ReleaseError(f"{filename}:{lineno}: {BEGIN} inside the region opened "
                                   f"on line {open_at} (regions cannot nest)")
            open_at = lineno
        elif text.startswith(END):
            if open_at is None:
                raise ReleaseError(f"{filename}:{lineno}: {END} without a {BEGIN} before it")
            regions.append(Region(open_at, lineno))
            open_at = None
    if open_at is not None:
        raise ReleaseError(f"{filename}:{open_at}: {BEGIN} is never closed by {END}")
    return regions


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
        return source, regions
    lines = source.splitlines(keepends=True)
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
    return "".join(out), regions


def solution_regions(source: str, filename: str = "<string>") -> list[Region]:
    """The solution regions of ``source``, checked (balanced, not nested, each inside a
    function, the released file compiles); :class:`ReleaseError` otherwise."""
    return _release(source, filename)[1]


def strip_solutions(source: str, filename: str = "<string>") -> str:
    """``source`` with every solution region replaced by ``raise NotImplementedError``."""
    return _release(source, filename)[0]


def _is_hidden(node: ast.stmt) -> bool:
    for decorator in getattr(node, "decorator_list", []):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "hidden":
            return True
    return False


def strip_hidden(source: str, filename: str = "<string>") -> str:
    """``source`` (a test file) without its ``@pytest.mark.hidden`` tests: graded by the
    grader, never shown in the student's copy."""
    tree = parse(source, filename=filename)
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if _is_hidden(node):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                assert node.end_lineno is not None  # ast.parse sets positions
                drop.update(range(first, node.end_lineno + 1))
            elif isinstance(node, ast.ClassDef):
                for member in node.body:
                    # only a def or a class has decorators (_is_hidden is False for the rest)
                    if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                            and _is_hidden(member):
                        first = min([member.lineno] + [d.lineno for d in member.decorator_list])
                        assert member.end_lineno is not None  # ast.parse sets positions
                        drop.update(range(first, member.end_lineno + 1))
    return "".join(line for number, line in enumerate(lines, 1) if number not in drop)


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

    def source_file(self, path: Path, target: Path) -> None:
        """Plan ``path`` (a file of the chapters or of the project) to go to ``target``."""
        if target in self.items:
            return
        if path.suffix == ".py":
            with open(path, encoding="utf-8", newline="") as f:
                source = f.read()
            released, regions = _release(source, str(path))
            if path.name.startswith("test_"):
                released = strip_hidden(released, str(path))
            self.items[target] = (path, released, len(regions))
        elif path.suffix == ".md":
            self.items[target] = (path, None, 0)
            self.pending.append((path, target))   # its links, once every chapter is planned
        else:
            self.items[target] = (path, None, 0)

    def resolve_links(self) -> None:
        while self.pending:
            path, target = self.pending.pop(0)
            with open(path, encoding="utf-8", newline="") as f:
                text = f.read()
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
            with open(target, "w", encoding="utf-8", newline="") as f:
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
