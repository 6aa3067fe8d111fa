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
import sys
import tempfile
from pathlib import Path

from minigraph.grading.messages import STUDENT_FILE
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


#: find_submission's exit status when it wrote results.json instead of finding the file
NOTHING_TO_GRADE = 3


def find_submission(submission: str, chapter: str, results: str) -> int:
    """``run_autograder``'s search for the student's file in the folder ``submission``
    (Gradescope's upload): ``exercises.py`` at the top, else the only one in it, else (the
    whole course uploaded) the one in a folder named ``chapter``. Found, its path goes to
    stdout (its bytes as the file system has them: a folder's name may hold a newline,
    which a shell reading lines would count as two paths) and the result is 0. Otherwise
    ``results`` says what was uploaded and the result is :data:`NOTHING_TO_GRADE`."""
    top = Path(submission)
    uploaded = _files(top)
    regular = [p for p in uploaded if p.name == STUDENT_FILE and p.is_file() and not p.is_symlink()]
    own = [p for p in regular if p.parent.name == chapter]
    if (top / STUDENT_FILE).is_file():
        found = [top / STUDENT_FILE]
    else:
        found = regular if len(regular) == 1 else own
    if len(found) == 1:
        sys.stdout.buffer.write(os.fsencode(found[0]))
        return 0
    why = (f"several {STUDENT_FILE} and none (or several) in a folder named {chapter}"
           if len(regular) > 1 else f"no file named {STUDENT_FILE}")
    names = []
    for path in uploaded:
        # (a name that is not UTF-8 is shown with U+FFFD: JSON holds no lone surrogate)
        name = os.fsencode(path.relative_to(top)).decode("utf-8", "replace")
        link = " (a symbolic link, which is not graded)" if path.is_symlink() else ""
        names.append(name + link)
    listing = ", ".join(names)
    if len(listing) > 1000:   # (cut in characters, never inside one)
        listing = listing[:1000] + "..."
    write_error_json(f"Nothing could be graded: your submission holds {why} (uploaded: "
                     f"{listing or 'nothing'}); upload the chapter's {STUDENT_FILE}, under that "
                     "name", results)
    return NOTHING_TO_GRADE


def _files(top: Path) -> list[Path]:
    """Every file under ``top``, sorted; links listed, not followed. Walked with a stack:
    ``os.walk`` recurses (Python 3.11), and an upload of 1,100 nested folders raised
    RecursionError, so that no results.json was written."""
    found, todo = [], [top]
    while todo:
        folder = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:  # (a folder the grader cannot read: as os.walk, passed over)
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                todo.append(Path(entry.path))
            else:
                found.append(Path(entry.path))
    return sorted(found)


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
