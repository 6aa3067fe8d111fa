"""Importing a student's ``exercises.py`` for the graded tests: lazily, by path, once.

Why lazily: if ``test_exercises.py`` imported ``exercises`` at module level, one syntax
error, missing import or ``os._exit`` in the student's file would stop pytest from
*collecting* the tests at all, and the report could not say which tests there were.
Importing inside a fixture keeps collection independent of the student's code: every
test is always collected (with its points), and an import problem becomes a readable
failure of each test that needs the module.

Why by path: the grader runs the tests in a scratch folder holding exactly
``test_exercises.py`` and the student's ``exercises.py``; loading the file beside the
test file (instead of ``import exercises``, which searches ``sys.path``) can never pick
up some other module that happens to be called ``exercises``.

Why once: a module that failed to import would fail the same way again, so the failure is
remembered and re-raised at once for the next test (an import that loops forever costs
one timeout, not one per test).

The contract for chapter authors (``test_exercises.py``)::

    import pytest
    from minigraph.grading import exercises_fixture

    exercises = exercises_fixture()      # the fixture `exercises`: the student's module

    @pytest.mark.points(2)
    def test_mean(exercises):
        assert exercises.mean([1.0, 2.0, 3.0]) == 2.0
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from minigraph.grading.messages import STUDENT_FILE, describe_exception, is_timeout


class ExercisesImportError(Exception):
    """exercises.py could not be imported; the message says why, for a student."""


#: resolved path of an exercises.py -> its module, or the error importing it raised
_loaded: dict[Path, ModuleType | ExercisesImportError] = {}


def load_exercises(path: str | Path, *, module_name: str = "exercises") -> ModuleType:
    """Import the student's file ``path`` (``exercises.py``, or a folder holding it) into
    *this* process: for a reader's own experiments, never for grading (the grader runs
    the student's code in the sandbox, :mod:`minigraph.grading.sandbox`).

    The module is registered in ``sys.modules`` as ``exercises``. Any failure while
    importing (a syntax error, an ImportError, an exception or ``sys.exit`` at module
    level) becomes an :class:`ExercisesImportError` whose message names the cause and the
    line; it is remembered and raised again at once for the next caller.
    """
    path = Path(path)
    if path.is_dir():
        path = path / STUDENT_FILE
    key = path.resolve()
    cached = _loaded.get(key)
    if isinstance(cached, ExercisesImportError):
        raise ExercisesImportError(str(cached)) from None
    if cached is not None:
        return cached
    if not path.is_file():
        error = ExercisesImportError(f"{path.name} was not found in {path.parent}")
        _loaded[key] = error
        raise error

    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None  # a .py path always has a loader
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(module_name)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit included
        if previous is None:
            sys.modules.pop(module_name, None)
        else:
            sys.modules[module_name] = previous
        error = ExercisesImportError(import_message(exc, path.name, None))
        _loaded[key] = error
        raise error from exc
    _loaded[key] = module
    return module


def import_message(exc: BaseException, name: str, timeout: float | None) -> str:
    """What a student reads when their module could not be imported."""
    if is_timeout(exc) or type(exc).__name__ == "SandboxTimeout":
        limit = f"the {timeout:g} s timeout" if timeout else "the timeout"
        return (f"{name} could not be imported: importing it took longer than {limit} "
                "(a loop at module level?)")
    if isinstance(exc, SystemExit):
        return f"{name} could not be imported: it called sys.exit({exc.code!r}) at module level"
    return f"{name} could not be imported: {describe_exception(exc)}"


def exercises_fixture(name: str = "exercises", filename: str = STUDENT_FILE):
    """A pytest fixture (called ``name``) giving the student's ``exercises.py`` as an
    :class:`~minigraph.grading.proxy.ExercisesProxy`: the module runs in the sandbox
    process, and every call is a request to it. Under the grader the sandbox is the
    grader's (isolated, limited, the submission's file); under a plain ``pytest`` run it is
    a sandbox for the ``exercises.py`` beside the test file. Assign it at module level::

        exercises = exercises_fixture()

    During each test the sandbox refuses the library functions its
    ``@pytest.mark.forbid(...)`` markers name.
    """
    import pytest

    @pytest.fixture(name=name)
    def _exercises(request):
        """The student's exercises.py, run in the sandbox."""
        from minigraph.grading.plugin import forbidden_of
        from minigraph.grading.proxy import ExercisesProxy
        sandbox = _sandbox_for(request, filename)
        sandbox.forbidden, sandbox.forbid_why = forbidden_of(request.node)
        try:
            yield ExercisesProxy(sandbox)
        finally:
            sandbox.forbidden, sandbox.forbid_why = [], ""

    return _exercises


#: the grading harness registers itself under this name, with its sandbox
HARNESS = "minigraph-harness"


def _sandbox_for(request, filename: str):
    for plugin in request.config.pluginmanager.get_plugins():
        if getattr(plugin, "name", None) == HARNESS:
            return plugin.sandbox
    # a plain pytest run: one sandbox per exercises.py, for the whole session
    from minigraph.grading.plugin import forbidden_of
    from minigraph.grading.proxy import Sandbox, SandboxSettings
    path = (Path(request.path).parent / filename).resolve()
    cache = request.config.stash.setdefault(_PLAIN_KEY, {})
    if path not in cache:
        guard = sorted({n for item in request.session.items for n in forbidden_of(item)[0]})
        sandbox = Sandbox(SandboxSettings(exercises=path, isolate=False, timeout=60.0,
                                          total_timeout=3600.0), guard=guard)
        request.config.add_cleanup(sandbox.close)
        cache[path] = sandbox
    return cache[path]


def _plain_key():
    import pytest
    return pytest.StashKey[dict]()


_PLAIN_KEY = _plain_key()
