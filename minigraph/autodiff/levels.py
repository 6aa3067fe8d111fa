"""Transformation levels: how nested transformations keep their values apart.

Every transformation that wraps values (``jvp``'s dual numbers, ``vjp``'s recorded
boxes, ``vmap``'s batched values) takes a fresh *level* from one counter when it starts.
A wrapped value carries the level that made it, and ``bind`` (``ops/primitive.py``)
hands each operation to the interpreter of the highest level among its arguments; that
interpreter unwraps its own values and calls ``bind`` again, one level down. A value of
a lower level is a constant to a higher one. This is JAX's rule of trace levels: in
``grad(lambda y: grad(f)(x, y))`` the inner ``grad`` is started later, so its level is
higher, and its values carry the outer one's perturbation inside them.

Levels start at 100, above the two kinds that never nest by levels: graph nodes (10)
and source variables (20), which are always the innermost, concrete-most interpreters.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

_counter = itertools.count(100)


def new_level() -> int:
    """A level above every level handed out before."""
    return next(_counter)


def transformation(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """Mark ``fn`` as made by a transformation (``fn.transformation`` names it): source
    transformation lets such a function see the values of its program, since every
    transformation runs on any kind of value."""
    fn.transformation = name  # type: ignore[attr-defined]
    return fn
