"""``argnums``: which arguments a transformation differentiates, one rule for every mode.

``argnums=0`` and ``argnums=(0,)`` name the same argument; the first gives one gradient,
the second a tuple of one (JAX's convention). A negative number counts from the end, as
an index does. Out of range, repeated, or not an integer: an error that names the
transformation, the argnums and how many arguments there are.
"""

from __future__ import annotations

import operator
from typing import Sequence, Union

Argnums = Union[int, Sequence[int]]


def normalize_argnums(argnums: Argnums, nargs: int, who: str,
                      counted: str = "was called with") -> tuple[int, ...]:
    """``argnums`` as a tuple of indices in ``range(nargs)``; ``counted`` says where
    nargs comes from in the error ("takes": its parameters, before any call)."""
    given: tuple = tuple(argnums) if isinstance(argnums, (tuple, list)) else (argnums,)
    if not given:
        raise ValueError(f"{who}: argnums is empty; name at least one argument to "
                         f"differentiate with respect to")
    nums = []
    for n in given:
        try:
            k = operator.index(n)
        except TypeError:
            raise TypeError(f"{who}: argnums must be integers, got {n!r}") from None
        if not -nargs <= k < nargs:
            raise IndexError(f"{who}: argnums={argnums!r} names argument {k}, but the "
                             f"function {counted} {nargs} argument"
                             f"{'s' if nargs != 1 else ''}")
        nums.append(k % nargs)
    if len(set(nums)) != len(nums):
        raise ValueError(f"{who}: argnums={argnums!r} names an argument twice")
    return tuple(nums)


def single(argnums: Argnums) -> bool:
    """Whether the gradient is one value (``argnums`` an int) rather than a tuple."""
    return not isinstance(argnums, (tuple, list))
