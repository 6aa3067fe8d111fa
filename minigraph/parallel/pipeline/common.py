"""What the pipeline modules share: pass and event types, errors.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

from ...errors import MinigraphError


Op = tuple[str, int]                          # ("F", k) or ("B", k): a pass of microbatch k
Event = tuple[int, str, int, float, float]    # (stage, kind, microbatch, start, end)

class PipelineError(MinigraphError, ValueError):
    """A stage list, schedule or cost list that does not describe a valid pipeline."""


def is_count(v: Any, low: int = 1) -> bool:
    """Whether ``v`` is an int >= ``low``: NumPy's ints too (``np.int64(4)``, a count
    read from an array), bool not (``True`` made a schedule of "True microbatches")."""
    return isinstance(v, Integral) and not isinstance(v, bool) and int(v) >= low
