"""Gradescope's ``results.json`` for a graded chapter.

The autograder specification (https://gradescope-autograders.readthedocs.io, "Autograder
Specifications") reads a JSON object with the total ``score`` and a list ``tests``, each
with ``name``, ``score``, ``max_score``, ``status`` ("passed" or "failed") and ``output``
(shown to the student), and per test and for the whole a ``visibility``
("visible", "hidden", "after_due_date", "after_published"); ``stdout_visibility`` says
whether the autograder's own output is shown. A typical ``run_autograder`` script::

    minigraph grade /autograder/submission \\
        --tests /autograder/source/chapters/02-automatic-differentiation \\
        --json /autograder/results/results.json
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from minigraph.grading.report import Report, _number


def results_json(report: Report) -> dict:
    """The Gradescope results object for ``report``."""
    output = "\n".join(report.notes)
    return {
        "score": report.score,
        "execution_time": int(round(report.seconds)),
        "output": output,
        # what the student's code printed is never shown: it is not part of any verdict
        "stdout_visibility": "hidden",
        "tests": [
            {
                "name": r.name,
                "score": _number(r.score),
                "max_score": _number(r.max_score),
                "status": r.status,
                "output": r.output,
                # a hidden test's name, score and message appear once grades are published
                "visibility": "after_published" if r.hidden else "visible",
            }
            for r in report.results
        ],
    }


def write_results_json(report: Report, path: str | Path) -> Path:
    return _write(results_json(report), path)


def write_error_json(message: str, path: str | Path) -> Path:
    """results.json for a submission that could not be graded at all (no exercises.py,
    say): score 0 and the reason, which Gradescope shows to the student."""
    return _write({"score": 0, "output": message, "tests": []}, path)


def _write(data: dict, path: str | Path) -> Path:
    """Write ``data`` to ``path`` through a new temporary file moved over it: the grader
    runs as root and ``path`` may lie in the student's folder, where a symlink planted as
    results.json would have had any file of the machine overwritten. A new file
    (``O_EXCL``, which never follows a link) replaced by ``os.replace`` replaces a link
    itself, never its target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o644)  # (Gradescope's reader is another user)
            # (allow_nan=False: Python would write "score": Infinity, which is not JSON)
            f.write(json.dumps(data, indent=2, allow_nan=False) + "\n")
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return path
