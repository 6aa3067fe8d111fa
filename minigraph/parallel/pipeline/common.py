"""What the pipeline modules share: pass and event types, errors.
"""

from __future__ import annotations

from ...errors import MinigraphError


Op = tuple[str, int]                          # ("F", k) or ("B", k): a pass of microbatch k
Event = tuple[int, str, int, float, float]    # (stage, kind, microbatch, start, end)

class PipelineError(MinigraphError, ValueError):
    """A stage list, schedule or cost list that does not describe a valid pipeline."""
