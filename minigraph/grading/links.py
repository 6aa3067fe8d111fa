"""Links in the course's Markdown: found, resolved and rewritten for the release.

The chapters' text links to files of the project around them (``../../minigraph/ops/
primitive.py``, ``../../notebooks/02-automatic-differentiation.ipynb``). A student's copy
of the course holds only the chapters, so :mod:`.release` copies every such file into the
release and points the link at the copy (see :func:`minigraph.grading.release.release`
for why a copy rather than a web address).

Only real links count: ``[text](target)``, ``![alt](target)`` and reference definitions
``[label]: target``, outside fenced code blocks and inline code spans (``f[0](x)`` in a
code sample is not a link). A target with a scheme (``https:``, ``mailto:``), an absolute
path or a bare ``#anchor`` is left alone; a relative target may carry an ``#anchor`` or
``?query``, which is kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# [text](target) or [text](target "title"): the target has no spaces or parentheses
_INLINE = re.compile(r"\]\((?P<target>[^()\s]+)(?P<title>\s+\"[^\"]*\")?\)")
# [label]: target   at the start of a line
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(?P<target><[^>]+>|\S+)", re.MULTILINE)
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


@dataclass(frozen=True)
class Link:
    start: int      # offsets of the target in the text
    end: int
    target: str     # as written: "../../minigraph/tensor.py#L10"

    @property
    def path(self) -> str:
        """The file part of the target, without ``#anchor`` or ``?query``."""
        return re.split(r"[#?]", self.target, maxsplit=1)[0]

    @property
    def suffix(self) -> str:
        """The ``#anchor`` or ``?query`` part, kept when the link is rewritten."""
        return self.target[len(self.path):]

    @property
    def is_relative(self) -> bool:
        """A link to a file beside or around this one (what the release must resolve)."""
        return bool(self.path) and not _SCHEME.match(self.target) \
            and not self.target.startswith(("/", "#"))


def _code_ranges(text: str) -> list[tuple[int, int]]:
    """Offsets of fenced code blocks and inline code spans: no links inside them."""
    ranges, offset, fence = [], 0, None
    prose_start = 0
    for line in text.splitlines(keepends=True):
        match = _FENCE.match(line)
        if fence is None and match:
            fence, fence_start = match.group(1), offset
            ranges += [(prose_start + m.start(), prose_start + m.end())
                       for m in _CODE_SPAN.finditer(text[prose_start:offset])]
        elif fence is not None and match and match.group(1)[0] == fence[0] \
                and len(match.group(1)) >= len(fence):
            ranges.append((fence_start, offset + len(line)))
            fence, prose_start = None, offset + len(line)
        offset += len(line)
    if fence is not None:       # an unclosed fence runs to the end of the text
        ranges.append((fence_start, len(text)))
    else:
        ranges += [(prose_start + m.start(), prose_start + m.end())
                   for m in _CODE_SPAN.finditer(text[prose_start:])]
    return ranges


def find_links(text: str) -> list[Link]:
    """Every link target of the Markdown ``text``, in order."""
    code = _code_ranges(text)

    def in_code(position: int) -> bool:
        return any(start <= position < end for start, end in code)

    links = []
    for pattern in (_INLINE, _REFERENCE):
        for match in pattern.finditer(text):
            start, end = match.span("target")
            target = match.group("target")
            if target.startswith("<") and target.endswith(">"):
                start, end, target = start + 1, end - 1, target[1:-1]
            if not in_code(match.start()):
                links.append(Link(start, end, target))
    return sorted(links, key=lambda link: link.start)


def rewrite_links(text: str, new_target) -> str:
    """``text`` with each link's target replaced by ``new_target(link)`` (or kept where it
    returns None); everything else byte for byte."""
    out, position = [], 0
    for link in find_links(text):
        replacement = new_target(link)
        if replacement is None:
            continue
        out += [text[position:link.start], replacement]
        position = link.end
    out.append(text[position:])
    return "".join(out)
