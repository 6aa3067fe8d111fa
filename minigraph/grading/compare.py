"""Comparing a student's array with the expected one: shape first, then values.

``np.allclose(got, want)`` and ``np.testing.assert_allclose(got, want)`` broadcast: an
answer of shape (0, 2) is "close" to any pair (there is nothing to compare), and a
scalar to any array of its value. A submission that solves nothing passed such tests
with ``return np.empty((0, 2))``. Graded tests compare with :func:`assert_same_array`,
and :func:`~minigraph.grading.check.check_chapter` flags the other two. Lists and dicts
(an order, a placement) are compared whole, and :func:`first_difference` says where.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_same_array(got: Any, expected: Any, what: str = "", rtol: float = 1e-10,
                      atol: float = 1e-12, dtype: bool = True) -> None:
    """``got`` has ``expected``'s shape (and dtype, unless ``dtype=False``) and its values
    to ``rtol``/``atol``; ``what`` starts the message. Tensors and lists are read as
    arrays (``np.asarray``)."""
    got, expected = np.asarray(got), np.asarray(expected)
    prefix = f"{what.rstrip(': ')}: " if what else ""
    assert got.shape == expected.shape, f"{prefix}shape {got.shape}, expected {expected.shape}"
    if dtype:
        assert got.dtype == expected.dtype, \
            f"{prefix}dtype {got.dtype}, expected {expected.dtype}"
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=what)


def first_difference(got: Any, expected: Any, where: str) -> str:
    """Where ``got`` first differs from ``expected`` (lists, dicts, and lists in dicts),
    in a line that names the item, what came and what was expected: the start of a
    failure message, which the printed graph alone made a puzzle."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key, value in expected.items():
            if key not in got:
                return f"{where}[{key!r}] is missing, expected {value!r}"
            if got[key] != value:
                return first_difference(got[key], value, f"{where}[{key!r}]")
        return f"{where} has keys {sorted(map(str, set(got) - set(expected)))}, expected none"
    if isinstance(expected, list) and isinstance(got, (list, tuple)):
        for i, (a, b) in enumerate(zip(got, expected)):
            if a != b:
                return first_difference(a, b, f"{where}[{i}]")
        if len(got) == len(expected):  # (the same items: a tuple where a list is asked)
            return f"{where} is a {type(got).__name__}, expected a list"
        return f"{where} has {len(got)} items, expected {len(expected)}"
    return f"{where} is {got!r}, expected {expected!r}"
