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


def load_exercises(path: str | Path, *, config=None, module_name: str = "exercises") -> ModuleType:
    """Import the student's file ``path`` (``exercises.py``, or a folder holding it).

    The module is registered in ``sys.modules`` as ``exercises``, so helper code may
    still write ``import exercises``. Any failure while importing (a syntax error, an
    ImportError, an exception or ``sys.exit`` at module level, a timeout) becomes an
    :class:`ExercisesImportError` whose message names the cause and the line.

    ``config`` is the pytest config when the grading plugin runs the tests: the loader
    then tells the grader when an import starts and ends (so a crash during the import
    is recognised as such) and honours an import failure the grader already knows about.
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

    from minigraph.grading import plugin  # pytest is only needed once tests run

    known = plugin.known_import_failure(config)
    if known:
        _loaded[key] = ExercisesImportError(known)
        raise ExercisesImportError(known)
    if not path.is_file():
        error = ExercisesImportError(f"{path.name} was not found in {path.parent}")
        _loaded[key] = error
        raise error

    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(module_name)
    sys.modules[module_name] = module
    plugin.emit(config, "import-start", path=str(path))
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit and timeouts included
        if previous is None:
            sys.modules.pop(module_name, None)
        else:
            sys.modules[module_name] = previous
        error = ExercisesImportError(_import_message(exc, path, plugin.timeout_of(config)))
        _loaded[key] = error
        plugin.emit(config, "import-end", ok=False, message=str(error))
        raise error from exc
    _loaded[key] = module
    plugin.emit(config, "import-end", ok=True)
    return module


def _import_message(exc: BaseException, path: Path, timeout: float | None) -> str:
    if is_timeout(exc):
        limit = f"the {timeout:g} s timeout" if timeout else "the timeout"
        return (f"{path.name} could not be imported: importing it took longer than {limit} "
                "(a loop at module level?)")
    if isinstance(exc, SystemExit):
        return f"{path.name} could not be imported: it called sys.exit({exc.code!r}) at module level"
    return f"{path.name} could not be imported: {describe_exception(exc)}"


def exercises_fixture(name: str = "exercises", filename: str = STUDENT_FILE):
    """A pytest fixture (called ``name``) returning the ``exercises.py`` that sits beside
    the test file, imported on first use. Assign it at module level of the test file::

        exercises = exercises_fixture()
    """
    import pytest

    @pytest.fixture(name=name)
    def _exercises(request):
        """The student's exercises.py (beside this test file), imported on first use."""
        return load_exercises(Path(request.path).parent / filename, config=request.config)

    return _exercises
