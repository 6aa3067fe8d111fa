"""Errors that point at the user's line: ``Where``, :class:`SourceTransformError`.

``Where`` is a place in the user's code (function, file, line and its text).
:func:`_refusal` makes the error for a construct source transformation does not handle;
:func:`_located` appends the user's line to a minigraph error (a shape error, say) raised
while the program is written.
"""

from __future__ import annotations

from typing import NamedTuple

from ...errors import MinigraphError


class Where(NamedTuple):
    """A place in the user's code: function, file, line, and the line's text."""
    function: str
    filename: str
    lineno: int
    text: str = ""

    def __str__(self) -> str:
        return f"in {self.function}, {self.filename}, line {self.lineno}"


class SourceTransformError(MinigraphError, NotImplementedError):
    """Python that source transformation does not handle, found before anything runs.

    ``.construct`` names it (``"a while loop"``); ``.function``, ``.filename`` and
    ``.lineno`` say where it is.
    """

    def __init__(self, problem: str, where: Where, why: str = "", construct: str = ""):
        self.construct = construct or problem
        self.function, self.filename, self.lineno = where.function, where.filename, where.lineno
        text = f"source_grad: {problem} ({where})"
        if where.text:
            text += f"\n    {where.text.strip()}"
        if why:
            text += f"\n{why}"
        super().__init__(text)


def _refusal(construct: str, where: Where, why: str = "") -> SourceTransformError:
    return SourceTransformError(f"{construct} is not supported", where, why, construct)


def _located(exc: MinigraphError, where: Where | None) -> MinigraphError:
    """The same kind of error, with the user's line appended to its message."""
    if where is None or isinstance(exc, SourceTransformError):
        return exc
    located = type(exc)(f"{exc} [source_grad: {where}: {where.text.strip()}]")
    return located
