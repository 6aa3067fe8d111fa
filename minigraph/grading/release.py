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
"""

from __future__ import annotations

import argparse
import ast
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

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
        tree = ast.parse("".join(out), filename=filename)
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
    tree = ast.parse(source, filename=filename)
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if _is_hidden(node):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                drop.update(range(first, node.end_lineno + 1))
            elif isinstance(node, ast.ClassDef):
                for member in node.body:
                    if _is_hidden(member):
                        first = min([member.lineno] + [d.lineno for d in member.decorator_list])
                        drop.update(range(first, member.end_lineno + 1))
    return "".join(line for number, line in enumerate(lines, 1) if number not in drop)


def _files(chapters: Path):
    for path in sorted(chapters.rglob("*")):
        parts = path.relative_to(chapters).parts
        if any(p in SKIPPED_DIRS or p.startswith(".") for p in parts) or path.suffix == ".pyc":
            continue
        if path.is_file():
            yield path


def release(chapters: str | Path, out: str | Path, *, force: bool = False) -> list[tuple[Path, int]]:
    """Write the student version of ``chapters`` into ``out``; return (file written,
    number of solution regions stripped) for every file."""
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
    # everything is stripped and checked before anything is written
    plan: list[tuple[Path, Path, str | None, int]] = []
    for path in _files(chapters):
        rel = path.relative_to(chapters)
        if path.suffix == ".py":
            with open(path, encoding="utf-8", newline="") as f:
                source = f.read()
            released, regions = _release(source, str(path))
            if path.name.startswith("test_"):
                released = strip_hidden(released, str(path))
            plan.append((path, out / rel, released, len(regions)))
        else:
            plan.append((path, out / rel, None, 0))
    written = []
    for path, target, text, count in plan:
        target.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            shutil.copyfile(path, target)
        else:
            with open(target, "w", encoding="utf-8", newline="") as f:
                f.write(text)
        written.append((target, count))
    return written


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
