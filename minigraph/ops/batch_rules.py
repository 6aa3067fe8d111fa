"""Batching rules shared by the primitives (what ``shape_rules.py`` is to shapes).

``mg.vmap`` (``autodiff/batching.py``) runs a function written for one example on a
whole batch at once. Each primitive says how in its ``batch`` rule, JAX's "batching
rule" (``jax/_src/interpreters/batching.py``), with one simplification: the batch axis
is always axis 0. The convention is

    batch(dims, *args, **params) -> result with the batch axis at 0

``dims[i]`` is ``0`` when argument ``i`` carries the batch axis in front, and ``None``
when it is the same for every example (a weight, a constant, a Python number). At least
one argument is batched. A rule only calls minigraph functions, so it runs on every
value kind: tensors, dual numbers, graph nodes, and the batched values of an outer vmap
(which is how ``vmap(vmap(f))`` works).

The families below cover most of the table; the other rules sit in their entries. The
rules here reach reshape, transpose and broadcast_to through the table (``PRIMITIVES``),
not through ``shape.py``, whose entries use these rules: no import goes both ways.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from . import shape_rules as S
from .primitive import PRIMITIVES, bind

Dims = Sequence["int | None"]


def size_of(dims: Dims, args: Sequence[Any]) -> int:
    """The batch size: the length of axis 0 of any batched argument."""
    return next(S.shape_of(a)[0] for a, d in zip(args, dims) if d is not None)


def rank(x: Any, d: "int | None") -> int:
    """The rank of one example of ``x``."""
    return len(S.shape_of(x)) - (d is not None)


class Example:
    """The shape and dtype of one example of a batched value: what a shape rule reads,
    so a batching rule can check its arguments with the op's own shape rule."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: tuple[int, ...], dtype: "str | None"):
        self.shape, self.dtype = shape, dtype


def example(x: Any, d: "int | None") -> Example:
    """One example of ``x`` (``x`` itself when it is not batched), as an abstract value."""
    shape = tuple(S.shape_of(x))
    return Example(shape[1:] if d is not None else shape, S.dtype_of(x))


def materialize(x: Any, d: "int | None", size: int) -> Any:
    """``x`` with a batch axis in front: an unbatched value is repeated ``size`` times
    (a broadcast, no copy on NumPy). For ops that need every argument batched."""
    return x if d is not None else bind(PRIMITIVES["broadcast_to"], x,
                                       shape=(size,) + tuple(S.shape_of(x)))


def align(dims: Dims, args: Sequence[Any]) -> list:
    """Give every batched argument the shape ``(B, 1, ..., 1) + its own shape``, with as
    many 1s as it takes to reach the largest rank of one example among ``args``.

    NumPy broadcasts from the right, so without the 1s the batch axis of a batched
    scalar (shape ``(B,)``) would meet the last axis of an unbatched ``(3,)`` argument.
    Unbatched arguments are left alone: they broadcast against the trailing axes.
    """
    top = max(rank(a, d) for a, d in zip(args, dims))
    out = []
    for a, d in zip(args, dims):
        if d is not None and rank(a, d) < top:
            shape = S.shape_of(a)
            a = bind(PRIMITIVES["reshape"], a,
                     shape=shape[:1] + (1,) * (top - rank(a, d)) + shape[1:])
        out.append(a)
    return out


def moveaxis(x: Any, source: int, destination: int) -> Any:
    """``numpy.moveaxis`` for one axis, written with ``transpose`` (any value kind)."""
    if source == destination:
        return x
    order = [i for i in range(len(S.shape_of(x))) if i != source]
    order.insert(destination, source)
    return bind(PRIMITIVES["transpose"], x, axes=tuple(order))


def elementwise(name: str) -> Callable[..., Any]:
    """The rule of a broadcasting op (JAX's ``broadcast_batcher``): align the ranks and
    apply the op itself, which broadcasts the rest. Also right for one-argument ops
    (``sin``, ``astype``, ``one_hot`` ...), where aligning changes nothing."""
    def rule(dims: Dims, *args: Any, **params: Any) -> Any:
        return bind(PRIMITIVES[name], *align(dims, args), **params)
    return rule


def all_batched(name: str) -> Callable[..., Any]:
    """The rule of an op whose arguments must have one shape (``AddN``)."""
    def rule(dims: Dims, *args: Any, **params: Any) -> Any:
        size = size_of(dims, args)
        return bind(PRIMITIVES[name], *[materialize(a, d, size) for a, d in zip(args, dims)],
                    **params)
    return rule


def reduction(name: str) -> Callable[..., Any]:
    """The rule of ``sum``/``mean``/``max``: reduce the same axes, one further right
    (``axis=None``, all axes of one example, becomes every axis but the batch axis)."""
    def rule(dims: Dims, x: Any, axis: "tuple[int, ...] | None", keepdims: bool) -> Any:
        axes = range(rank(x, 0)) if axis is None else axis
        return bind(PRIMITIVES[name], x, axis=tuple(a + 1 for a in axes), keepdims=keepdims)
    return rule


def along_axis(name: str) -> Callable[..., Any]:
    """The rule of an op acting along one ``axis`` of one argument (``softmax``)."""
    def rule(dims: Dims, x: Any, axis: int) -> Any:
        return bind(PRIMITIVES[name], x, axis=axis + 1)
    return rule
