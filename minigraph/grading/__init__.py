"""Grading the chapters' exercises: ``minigraph grade`` and ``minigraph release``.

Modules, one concept each:

- :mod:`~minigraph.grading.loader`: imports the student's ``exercises.py`` lazily, by path,
  once (the ``exercises`` fixture that graded tests take);
- :mod:`~minigraph.grading.plugin`: the pytest plugin: the ``points`` marker and a record
  of every test as it starts and ends;
- :mod:`~minigraph.grading.runner`: runs the tests in a pytest process, and another after
  a crash or a hang, so that each costs only the test it happens in;
- :mod:`~minigraph.grading.collect`: the tests a file declares, read without running it
  (so the report lists every test even when the test file cannot be imported);
- :mod:`~minigraph.grading.messages`: short failure messages that point into exercises.py;
- :mod:`~minigraph.grading.grade`: finds the tests for PATH, grades, the ``grade`` command;
- :mod:`~minigraph.grading.report` and :mod:`~minigraph.grading.gradescope`: the table,
  and Gradescope's ``results.json``;
- :mod:`~minigraph.grading.release`: the student version of the chapters;
- :mod:`~minigraph.grading.check`: the authors' contract below, checked.

The contract for chapter authors
--------------------------------
A chapter folder ``chapters/NN-topic/`` holds ``exercises.py`` and ``test_exercises.py``.

``exercises.py``: the functions students write. Each reference solution sits between a
line ``### BEGIN SOLUTION`` and a line ``### END SOLUTION`` *inside a function* (the
release replaces it by ``raise NotImplementedError(...)`` at the marker's indentation, so
the released module still imports). Imports it needs go outside the regions.

``test_exercises.py``::

    import numpy as np
    import pytest
    import minigraph as mg
    from minigraph.grading import exercises_fixture

    exercises = exercises_fixture()        # never `import exercises` at module level

    @pytest.mark.points(2)
    def test_mean(exercises):
        # mean agrees with minigraph on random inputs
        rng = np.random.default_rng(0)
        x = rng.normal(size=5)
        assert np.isclose(exercises.mean(x), mg.tensor(x).mean().item())

- every graded test takes the ``exercises`` fixture and has ``@pytest.mark.points(n)``
  (a parametrized test is worth n for each case); test names are what students see;
- the test file is self-contained: the grader copies it and the student's exercises.py
  alone into a scratch folder (no conftest.py, data files or helper modules beside them);
  random inputs come from fixed seeds;
- tests check the student's functions against minigraph's own implementation, never
  against another chapter's exercises: chapter N's tests then need only the exercises of
  chapters up to N (its own). The grader enforces this by running each chapter in
  isolation, and :func:`check_chapter` flags a test file that names a later chapter;
- graded tests do not skip (a skipped test scores 0) and stay well below the timeout.
"""

from minigraph.grading.check import check_chapter
from minigraph.grading.gradescope import results_json, write_results_json
from minigraph.grading.grade import (GradingError, add_grade_parser, grade, grade_main,
                                     locate)
from minigraph.grading.loader import ExercisesImportError, exercises_fixture, load_exercises
from minigraph.grading.proxy import in_sandbox
from minigraph.grading.release import (ReleaseError, add_release_parser, release,
                                       release_main, strip_solutions)
from minigraph.grading.report import Report, TestResult

__all__ = [
    "ExercisesImportError", "GradingError", "ReleaseError", "Report", "TestResult",
    "add_grade_parser", "add_release_parser", "check_chapter", "exercises_fixture", "grade",
    "grade_main", "in_sandbox", "load_exercises", "locate", "release", "release_main", "results_json",
    "strip_solutions", "write_results_json",
]
