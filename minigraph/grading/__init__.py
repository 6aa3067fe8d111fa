"""Grading the chapters' exercises: ``minigraph grade``, ``release`` and ``autograder``.

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
- :mod:`~minigraph.grading.release` (with :mod:`~minigraph.grading.links`): the student
  version of the chapters, self-contained;
- :mod:`~minigraph.grading.autograder`: Gradescope's autograder bundle for a chapter;
- :mod:`~minigraph.grading.check`: the authors' contract below, checked;
- :mod:`~minigraph.grading.compare`: ``assert_same_array``, shape before values.

The security model
------------------
A student's ``exercises.py`` is untrusted code; the verdicts must not depend on anything it
can touch.

- *Tests come from the course* (:mod:`.grade`): ``--tests``, ``--course`` or the installed
  project's chapters; nothing in the submission but ``exercises.py`` is read.
- *A trust boundary* (:mod:`.harness`, :mod:`.proxy`, :mod:`.sandbox`, :mod:`.wire`):
  pytest, the tests, their oracles and assertions run in the grader's process; the
  student's module runs in a sandbox process reached through the ``exercises`` proxy.
  Values cross as JSON with .npy arrays (``allow_pickle=False``), never pickle; objects
  that are not data stay where they live, as handles: a test can call them, read their
  attributes and apply operators, but a handle has no truth value or equality (``assert
  exercises.f(x)`` or ``!= wrong`` on an object of the student's fails), since neither
  Python's defaults nor the object's own answer can be trusted.
- *Isolation and limits* (:mod:`.isolation`): as root, the sandbox drops to an account of
  its own (created with ``useradd --system``) before the student's file is read; the
  course is closed to others, the results live in a 0700 folder; rlimits bound CPU,
  memory, file size and open files, and allow one process (so that the memory limit,
  per process, is the sandbox's); ``PR_SET_NO_NEW_PRIVS``, a death signal; a view of
  its own (a mount namespace) where ``/proc`` shows only its own processes and the
  folder holding the submission, and those beside it, is empty; a per-call timeout
  (SIGUSR1, then a kill) and a whole-submission budget. Every process of the account is
  killed (``kill(-1)`` as that account) before results are written, then its SysV IPC
  objects and its files where any account may write are removed; without root, the
  grader is a child subreaper and kills its descendants, and one line says which
  protections are missing (the account, hence reading the course).
- *Results are the grader's*: the harness writes them after the sandbox is gone; what
  the student's code prints goes to a log nobody grades.
- *Hidden tests* (``@pytest.mark.hidden``): Gradescope's ``after_published``, left out of
  the release. *No delegation* (``@pytest.mark.forbid(...)``): the named functions are
  wrapped in every module that binds them, before the import of exercises.py, and refuse
  calls during the tests that forbid them. Limits of this: the wrapper lives in the
  student's process, so a determined student can unwrap it, and call counts of
  :func:`in_sandbox` helpers are counted there, as are the facts such helpers report
  (whether two arrays share memory, whether the inputs changed); both catch honest
  shortcuts and wrong algorithms, the values are always checked in the grader. A helper
  gets NumPy's, minigraph's and math's names as they were before exercises.py ran
  (``sandbox.Pristine``), so that ``numpy.shares_memory = ...`` in the student's file
  does not answer for it.

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
- the test file is self-contained: the grader copies it alone into a private folder (no
  conftest.py, data files or helper modules beside it); a function the student's code
  must trace with minigraph (``mg.jvp(f, ...)``) is shipped with ``in_sandbox``;
  random inputs come from fixed seeds;
- tests check the student's functions against minigraph's own implementation, never
  against another chapter's exercises: chapter N's tests then need only the exercises of
  chapters up to N (its own). The grader enforces this by running each chapter in
  isolation, and :func:`check_chapter` flags a test file that names a later chapter;
- graded tests do not skip (a skipped test scores 0) and stay well below the timeout;
- arrays are compared with ``assert_same_array(got, expected)``, which checks the shape
  (and dtype) first: ``np.allclose`` and ``assert_allclose`` broadcast, so an empty array
  or a scalar passes them; :func:`check_chapter` flags them;
- every exercise's tests name, with ``@pytest.mark.forbid(...)``, the library (or NumPy)
  functions that would solve it in one line; :func:`check_chapter` flags a name that
  names nothing (it would guard nothing), and tests/test_grader_mutants.py keeps, for
  every exercise, a wrong answer its tests must fail;
- the chapters' Markdown links to files of the project with relative links; the release
  copies those files into ``DIR/project/`` and a link that leads nowhere stops it.

Gradescope: ``minigraph autograder CHAPTER -o DIR`` writes ``DIR/autograder.zip``
(``setup.sh`` installs the minigraph bundled in it, ``run_autograder`` grades
``/autograder/submission`` with the chapter's tests, hidden ones included).
"""

from minigraph.grading.autograder import AutograderError, add_autograder_parser, autograder
from minigraph.grading.check import check_chapter
from minigraph.grading.compare import assert_same_array, first_difference
from minigraph.grading.gradescope import results_json, write_results_json
from minigraph.grading.grade import (GradingError, add_grade_parser, grade, grade_main,
                                     locate)
from minigraph.grading.loader import ExercisesImportError, exercises_fixture, load_exercises
from minigraph.grading.proxy import in_sandbox
from minigraph.grading.release import (ReleaseError, add_release_parser, release,
                                       release_main, strip_solutions)
from minigraph.grading.report import Report, TestResult

__all__ = [
    "AutograderError", "ExercisesImportError", "GradingError", "ReleaseError", "Report",
    "TestResult", "add_autograder_parser", "add_grade_parser", "add_release_parser",
    "assert_same_array", "autograder", "check_chapter", "exercises_fixture",
    "first_difference", "grade",
    "grade_main", "in_sandbox", "load_exercises", "locate", "release", "release_main",
    "results_json", "strip_solutions", "write_results_json",
]
