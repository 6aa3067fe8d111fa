"""Example chapter for the grader's own tests (tests/test_grading.py): not a real chapter.

Each function's reference solution sits between the solution markers; `minigraph release`
replaces it by `raise NotImplementedError(...)`.
"""

import math


def add(a, b):
    """a + b."""
    ### BEGIN SOLUTION
    return a + b
    ### END SOLUTION


def mean(xs):
    """The mean of a non-empty sequence of numbers."""
    total = 0.0
    ### BEGIN SOLUTION
    for x in xs:
        total += x
    return total / len(xs)
    ### END SOLUTION


def dual_mul(a, b):
    """The product of dual numbers a = (value, tangent) and b = (value, tangent)."""
    ### BEGIN SOLUTION
    return (a[0] * b[0], a[0] * b[1] + a[1] * b[0])
    ### END SOLUTION


def sign(x):
    """-1, 0 or 1."""
    ### BEGIN SOLUTION
    if x == 0:
        return 0
    return int(math.copysign(1, x))
    ### END SOLUTION


class Counter:
    """Counts steps."""

    def __init__(self):
        self.n = 0

    def step(self, k=1):
        """Advance by k; return the new count."""
        ### BEGIN SOLUTION
        self.n += k
        return self.n
        ### END SOLUTION
