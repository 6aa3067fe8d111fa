"""The sandbox's standard library: what a submission may import once the sandbox has
switched to its own account (minigraph/grading/sandbox.py, PRELOAD and UnreadableStdlib).

Where the grader runs as root and Python lives in a folder that account cannot read (a
root-only home such as /root/.pyenv), only the standard modules imported before the switch
can be imported after it. A right solution that imported timeit or graphlib (modules the
chapters name) used to score 0, with an untrue "No module named 'timeit'".
"""

from __future__ import annotations

import ast
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from minigraph.grading import grade
from minigraph.grading import sandbox

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = Path(__file__).resolve().parent / "grading_fixtures" / "chapters" / "99-example"
EXAMPLE_POINTS = 11  # every test of the example chapter (tests/test_grading.py: TOTAL)


def forbidden_names() -> set[str]:
    """Every name in a ``pytest.mark.forbid(...)`` of the chapters' tests."""
    names = set()
    for path in REPO.glob("chapters/*/test_exercises.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "forbid"):
                names.update(a.value for a in node.args
                             if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return names


def test_preload_holds_the_standard_modules_the_chapters_name():
    """The chapters forbid timeit.timeit and graphlib.TopologicalSorter (so students know
    of them), but PRELOAD lacked timeit and graphlib: importing them failed in the sandbox."""
    named = {name.partition(".")[0] for name in forbidden_names()} & sys.stdlib_module_names
    assert {"timeit", "graphlib"} <= named  # the oracle: the chapters' own forbid lists
    missing = sorted(named - set(sandbox.PRELOAD))
    assert not missing, f"standard modules the chapters name but PRELOAD lacks: {missing}"


def test_an_unreadable_standard_module_fails_with_the_reason(tmp_path):
    """A standard module that was not preloaded failed with Python's "No module named",
    which is untrue (it is installed); the last finder now says why it cannot be read,
    and leaves modules that are really missing to Python's own message."""
    finder = sandbox.UnreadableStdlib(frozenset({"asyncio", "xml"}))
    with pytest.raises(ModuleNotFoundError, match="cannot be imported in the grader's "
                                                  "sandbox.*cannot read the Python installation"):
        finder.find_spec("asyncio")
    with pytest.raises(ModuleNotFoundError, match="'xml.dom'"):  # its package unreadable
        finder.find_spec("xml.dom", ["/nonexistent/xml"])
    assert finder.find_spec("no_such_module_anywhere") is None  # not a standard module
    (tmp_path / "xml").mkdir()  # a readable package folder: the submodule is truly missing
    assert finder.find_spec("xml.no_such_part", [str(tmp_path / "xml")]) is None


def test_installed_standard_modules_are_read_from_the_installation():
    """The finder's list: the standard modules present here (NumPy is not one)."""
    installed = sandbox._installed_stdlib()
    assert {"timeit", "graphlib", "asyncio", "json", "sys"} <= installed
    assert "numpy" not in installed and "minigraph" not in installed


def _stdlib_unreadable_by_others() -> bool:
    """Whether some folder above the standard library denies other accounts entry."""
    folder = Path(os.__file__).resolve().parent
    return any(not os.stat(p).st_mode & stat.S_IXOTH for p in [folder, *folder.parents])


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0
                    or not _stdlib_unreadable_by_others(),
                    reason="only where the sandbox switches account and cannot read Python")
def test_a_solution_importing_timeit_and_graphlib_scores_full_marks(tmp_path):
    """End to end, as root: the example chapter's solutions with ``import timeit`` and
    ``import graphlib`` scored 0 (ModuleNotFoundError in the sandbox)."""
    shutil.copy(EXAMPLE / "test_exercises.py", tmp_path / "test_exercises.py")
    source = (EXAMPLE / "exercises.py").read_text()
    (tmp_path / "exercises.py").write_text("import graphlib\nimport timeit\n" + source)
    report = grade(tmp_path / "exercises.py", tests=tmp_path / "test_exercises.py")
    assert report.score == EXAMPLE_POINTS, [r.output for r in report.results if r.output][:1]
