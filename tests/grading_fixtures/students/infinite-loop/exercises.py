"""A student copy whose dual_mul() never returns."""

import math


def add(a, b):
    """a + b."""
    return a + b


def mean(xs):
    """The mean of a non-empty sequence of numbers."""
    total = 0.0
    for x in xs:
        total += x
    return total / len(xs)


def dual_mul(a, b):
    """The product of dual numbers a = (value, tangent) and b = (value, tangent)."""
    while True:
        pass


def sign(x):
    """-1, 0 or 1."""
    if x == 0:
        return 0
    return int(math.copysign(1, x))


class Counter:
    """Counts steps."""

    def __init__(self):
        self.n = 0

    def step(self, k=1):
        """Advance by k; return the new count."""
        self.n += k
        return self.n
