"""Comparing a student's array with the expected one: shape first, then values.

``np.allclose(got, want)`` and ``np.testing.assert_allclose(got, want)`` broadcast: an
answer of shape (0, 2) is "close" to any pair (there is nothing to compare), and a
scalar to any array of its value. A submission that solves nothing passed such tests
with ``return np.empty((0, 2))``. Graded tests compare with :func:`assert_same_array`,
and :func:`~minigraph.grading.check.check_chapter` flags the other two.
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
