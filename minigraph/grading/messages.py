"""Short, readable failure messages: what a student sees in the table and in Gradescope.

A full pytest traceback is the right thing for a library developer and the wrong thing
for a student reading a results page. These helpers turn an exception into one or a few
lines that say *what* went wrong and *where in exercises.py*, for example::

    ZeroDivisionError: division by zero (exercises.py, line 14, in mean: return s / 0)
    exercises.py has no function 'mean' (was it renamed or deleted?)
    timed out: still running after 2 s (exercises.py, line 21, in slow_sum)

They are used in two processes: by the pytest plugin (inside the test process) and by
the loader of exercises.py; neither needs pytest to be importable here.
"""

from __future__ import annotations

import re
import signal
import traceback
import unicodedata

#: the name of the file students edit; frames in it are the ones worth pointing at
STUDENT_FILE = "exercises.py"

MAX_LINES = 12
MAX_CHARS = 1200


def escape_controls(text: str) -> str:
    """``text`` with its control and format characters but newline and tab written as
    escapes (``\\x1b``): a student's message printed as it is could move the cursor, clear
    the screen and draw a forged table over the grader's (ANSI escape sequences, a carriage
    return, a right-to-left override)."""
    return "".join(c if c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cf")
                   else ascii(c)[1:-1] for c in text)


def shorten(text: str, max_lines: int = MAX_LINES, max_chars: int = MAX_CHARS) -> str:
    """Keep the first lines of ``text``; say so when something was cut. Control
    characters are escaped (:func:`escape_controls`)."""
    text = escape_controls(text).strip()
    lines = text.splitlines()
    cut = len(lines) > max_lines
    text = "\n".join(lines[:max_lines])
    if len(text) > max_chars:
        text, cut = text[:max_chars].rstrip(), True
    return text + (" [...]" if cut else "")


def student_location(exc: BaseException, student_file: str = STUDENT_FILE,
                     code: bool = True) -> str:
    """'exercises.py, line 14, in mean: return s / 0' for the innermost frame in
    the student's file (without ': code' if not ``code``), or '' when the exception
    never passed through it."""
    # (the lines are read below, one at a time: reading one may fail)
    frames = traceback.StackSummary.extract(traceback.walk_tb(exc.__traceback__),
                                            lookup_lines=False)
    for frame in reversed(frames):
        if frame.filename.replace("\\", "/").rsplit("/", 1)[-1] == student_file:
            where = f"{student_file}, line {frame.lineno}, in {frame.name}"
            try:
                line = (frame.line or "").strip() if code else ""
            except Exception:  # noqa: BLE001 - e.g. the codec of the file's declared
                # encoding cannot be loaded in the sandbox: this runs inside the sandbox's
                # own error handling, where an exception would end the sandbox
                line = ""
            return f"{where}: {line}" if line else where
    return ""


def is_timeout(exc: BaseException) -> bool:
    """pytest-timeout's signal method raises pytest's Failed with this text."""
    return type(exc).__name__ == "Failed" and message_of(exc).startswith("Timeout (>")


def missing_name(exc: BaseException) -> str | None:
    """The attribute a test asked ``exercises`` for and did not find, if that is what
    ``exc`` is (``AttributeError: module 'exercises' has no attribute 'mean'``)."""
    if not isinstance(exc, AttributeError):
        return None
    obj = getattr(exc, "obj", None)
    if getattr(obj, "__name__", None) == "exercises" and getattr(exc, "name", None):
        return exc.name
    text = message_of(exc)
    prefix = "module 'exercises' has no attribute '"
    if text.startswith(prefix) and text.endswith("'"):
        return text[len(prefix):-1]
    return None


def describe_exception(exc: BaseException, *, timeout: float | None = None,
                       exconly: str | None = None) -> str:
    """One readable message for an exception raised while a graded test ran.

    ``exconly`` is pytest's rendering of the exception when there is one (it carries the
    explanation of a failed ``assert``); otherwise ``"Type: message"`` is used.
    """
    if type(exc).__name__ == "ExercisesImportError":  # already written for students
        return str(exc)
    text = getattr(exc, "_minigraph_text", None)  # described in the sandbox, or the proxy's
    if isinstance(text, str) and text:
        return shorten(tidy(text))
    name = missing_name(exc)
    if name is not None:
        return f"{STUDENT_FILE} has no function or name {name!r} (was it renamed or deleted?)"
    # the stub left by `minigraph release` says it all; no need to quote it
    where = student_location(exc, code=not isinstance(exc, NotImplementedError))
    if is_timeout(exc):
        limit = f" after {timeout:g} s" if timeout else ""
        text = f"timed out: still running{limit} (an infinite loop, or far too slow?)"
        return text + (f"\n  at {where}" if where else "")
    if isinstance(exc, SyntaxError) and exc.filename:
        file = exc.filename.replace("\\", "/").rsplit("/", 1)[-1]
        text = f"{type(exc).__name__}: {exc.msg} ({file}, line {exc.lineno})"
        if exc.text:
            text += f"\n    {exc.text.strip()}"
        return text
    text = exconly if exconly is not None else _exconly(exc)
    text = shorten(tidy(text))
    return text + (f"\n  at {where}" if where else "")


def tidy(text: str) -> str:
    """Drop what only adds noise to pytest's assert explanations: object addresses
    (``<function add at 0x7f...>``) and the module's path (``<module 'exercises' ...>.add``);
    escape control characters (:func:`escape_controls`)."""
    text = escape_controls(text)
    text = re.sub(r"<(function|bound method|built-in function) ([^<>]+?) at 0x[0-9a-fA-F]+>",
                  r"<\1 \2>", text)
    text = re.sub(r"<module '([\w.]+)' from '[^']*'>", r"\1", text)
    return text


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or a note naming its type where that raises: a student's exception
    class with a broken ``__str__`` raised a second error inside the grader's own
    ``except`` block, which ended the sandbox as if it had crashed."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - whatever the student's __str__ raises
        return (f"(the {type(exc).__name__} exception's message could not be read: "
                f"its __str__ raised)")


def _exconly(exc: BaseException) -> str:
    message = message_of(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def describe_exit(returncode: int | None) -> str:
    """Why a test process stopped, from its exit status."""
    if returncode is None:
        return "the test process stopped"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the test process was killed by {name}"
    return f"the test process exited with code {returncode}"
