"""Batching: ``mg.vmap``, a function of one example run on a whole batch at once.

``mg.vmap(f)(xs)`` computes ``stack([f(x) for x in xs])`` without the loop: every
operation inside ``f`` runs once, on the whole batch. It is JAX's ``vmap``, built as in
JAX (``jax/_src/interpreters/batching.py``, and the ``vmap`` section of Autodidax):

* each batched argument is wrapped in a :class:`BatchTracer`, which carries the whole
  batch (``value``, batch axis in front) but *looks* like one example: its ``shape``
  leaves the batch axis out, so ``f`` sees the shapes it was written for;
* an operation on a tracer reaches :meth:`BatchTracer._bind` (``bind`` picks it by its
  level, as it picks a dual number's), which calls the primitive's batching rule on the
  unwrapped values (``ops/batch_rules.py`` explains the convention): the rule applies
  the op to the batch, one level down, and the result is wrapped again;
* at the end, the batch axis is moved to where ``out_axes`` asks.

Every vmap call takes a fresh level (``levels.new_level``), so nested transformations
keep their values apart: in ``vmap(vmap(f))`` the inner tracers hold the outer ones,
and under ``jvp`` a tracer may hold dual numbers, or a dual number tracers. A value of
another level is a constant here: the same for every example, ``dims[i] = None``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, cast

import numpy as np

from ..errors import MinigraphError, ShapeError
from ..ops import shape as SH
from ..ops.batch_rules import example, moveaxis, size_of
from ..ops.operators import ArrayOps, passed_as_is
from ..ops.primitive import KINDS, Primitive, bind, register_kind
from ..ops.weak import strong
from ..ops.shape_rules import shape_of
from ..tensor import Tensor, tensor
from .argnums import is_value, refuse_non_functions, refuse_pytrees
from .levels import escaped, level_running, new_level, running, transformation
from .tape import memory_of, own_results

Axes = int | None | Sequence[int | None]  # in_axes, out_axes


class BatchingError(MinigraphError, ValueError):
    """vmap cannot do what was asked: a malformed ``in_axes``/``out_axes``, an operation
    without a batching rule, a Python decision on a batched value."""


class BatchTracer(ArrayOps):
    """A batch of values that presents itself as one example (``shape`` omits axis 0)."""

    # (__weakref__: weakref.ref(x) and weakref.finalize in f, as on a tensor)
    __slots__ = ("value", "level", "_priority", "__weakref__")
    _noun = "vmap example"

    def __init__(self, value: Any, level: int):
        self.value = value  # the whole batch, batch axis first
        self.level = level
        self._priority = level  # primitive.bind hands an op to the highest level present

    shape = property(lambda self: tuple(shape_of(self.value))[1:])
    dtype = property(lambda self: self.value.dtype)
    device = property(lambda self: self.value.device)

    def _inside(self) -> Any:  # (the batch, whose memory ops/operators.refuse_aliased reads)
        return self.value

    def _bind(self, prim: Primitive, args: tuple, params: dict) -> "BatchTracer":
        """Apply ``prim`` to the whole batch with its batching rule."""
        if self.level not in running:
            raise escaped("mg.vmap", prim.name)
        if prim.batch is None:
            raise BatchingError(f"vmap: the primitive {prim.name!r} has no batching rule, so "
                                f"it cannot run under vmap (argument shapes "
                                f"{[shape_of(a) for a in args]})")
        dims, values = [], []
        for a in args:
            mine = type(a) is BatchTracer and a.level == self.level
            # (a graph value of unknown shape that f reads from outside: its arguments
            # were checked on entry)
            if not mine and getattr(a, "shape", ()) is None:
                raise _unknown_shape(f"{prim.name}'s operand", a)
            values.append(a.value if mine else a)
            dims.append(0 if mine else None)
        try:
            out = prim.batch(tuple(dims), *values, **params)
        except BatchingError:
            raise
        except Exception:  # (its message names the rule's call: shape (5, 3), axis 1)
            found = _example_error(prim, dims, values, params)
            if found is None:  # (no example's error to tell: the batched one stands)
                raise
            error, cause = found
            raise error from cause
        _check_rule(prim, dims, values, out)
        return BatchTracer(out, self.level)

    # Python asking for one value: a batch has one per example, so it refuses (as JAX's
    # tracers do), where a dual number or a vjp box lets the value inside answer.
    def __bool__(self) -> bool:
        raise BatchingError("vmap: a batched value has no single truth value (it may differ "
                            "from example to example); use mg.where instead of if/else")

    def _one_number(self, what: str) -> BatchingError:
        return BatchingError(f"vmap: {what} of a batched value: it has one value per example "
                             f"(the function sees one example of shape {self.shape}); "
                             f"compute with minigraph functions instead")

    def __float__(self) -> float:
        raise self._one_number("float()")

    def __int__(self) -> int:
        raise self._one_number("int()")

    def __index__(self) -> int:
        raise self._one_number("an index")

    def _no_array_of(self, what: str) -> str:  # (x.data, DLPack: ops/operators.py)
        return str(self._one_number(what))

    def item(self) -> Any:
        raise self._one_number("item()")

    def numpy(self) -> Any:
        raise self._one_number("numpy()")

    def tolist(self) -> Any:
        raise self._one_number("tolist()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        # (np.asarray(x) asks this first; without it, NumPy read x as a sequence and made
        # an object array, which failed later as "dtype object is not supported")
        raise self._one_number("np.asarray() (a NumPy array)")

    def __repr__(self) -> str:
        return f"BatchTracer(level={self.level}, value={self.value!r})"


register_kind(BatchTracer)


def _example_error(prim: Primitive, dims: list, values: list,
                   params: dict) -> tuple[Exception, BaseException | None] | None:
    """The error of ``prim`` on one example, with its cause; None if no example fails
    alone. A batching rule calls the op with the batch axis in front (shape (5, 3) for
    examples of shape (3,), ``axis=0`` moved to ``axis=1``), so its own error speaks of
    a call the user never wrote; JAX and torch.func speak of one example.

    The shape rule, on the shapes f sees, finds most errors without computing anything.
    The others depend on the values (a label out of range, an integer to a negative
    power, the max of no element) or on the devices: the op then runs on the examples
    one at a time, as f would without vmap, and the first that fails gives its own
    error (its type, its message, its cause), told where it comes from."""
    if prim.runs_user_code:  # (checkpoint's f: its rule ran f under vmap, whose own ops
        return None          # told their errors per example; f must not run again)
    size = size_of(dims, values)
    examples = [example(v, d) if d is not None else v for v, d in zip(values, dims)]
    shown = [f"shape {a.shape} {a.dtype}" if hasattr(a, "shape") else repr(a)
             for a in examples] + [f"{k}={v!r}" for k, v in params.items()]
    call = f"{prim.name}({', '.join(shown)})"
    try:
        prim.shape(*examples, **params)
    except BatchingError:  # (a batch among the parameters, which the rule read: the
        return None        # rule's own refusal says it better)
    except MinigraphError as exc:
        return _told(exc, f"{exc} (inside mg.vmap over a batch of {size}: one example is "
                          f"{call})"), None
    except Exception:  # (a rule that cannot read these, or f's own error, raised where
        return None    # checkpoint's rule runs f: the error stands as it came)
    for i in range(size):
        one = [v[i] if d is not None else v for v, d in zip(values, dims)]
        try:
            bind(prim, *one, **params)
        except Exception as exc:
            # (a kernel's error comes as "the call: the kernel's message", the kernel's
            # error its cause (tape._kernel_error): the call is said below, as f wrote it)
            cause = exc.__cause__
            said = cause if cause is not None and str(exc).endswith(f": {cause}") else exc
            return _told(exc, f"{said} (inside mg.vmap over a batch of {size}: example {i}, "
                              f"the first that fails alone, is {call})"), cause
    return None


def _told(exc: Exception, message: str) -> Exception:
    """``exc`` again, of its own type, with ``message``; as it is if its ``__init__``
    takes other arguments (an exception of the user's, raised in a checkpointed f)."""
    try:
        return type(exc)(message)
    except Exception:
        return exc


def _check_rule(prim: Primitive, dims: list, values: list, out: Any) -> None:
    """A rule must give the batch axis in front, of the batch's size: a wrong rule is
    stopped here rather than let through as a wrong value."""
    first = next(shape_of(v) for v, d in zip(values, dims) if d is not None)
    shape = shape_of(out)
    if first is None or shape is None:  # a graph node of unknown shape: nothing to check
        return
    size = first[0]
    if not shape or shape[0] != size:
        raise BatchingError(f"vmap: the batching rule of {prim.name!r} returned shape "
                            f"{shape}, which does not start with the batch size {size}")


def _check_level(a: Any, i: int, level: int) -> None:
    """An unbatched argument of an enclosing transformation must have a lower level than
    this vmap, or ``bind`` would hand it the operations that mix it with batched values.
    (It always does when every transformation takes its level from ``new_level``.)"""
    if type(a) in KINDS and a._priority >= level:
        raise BatchingError(f"vmap: argument {i} ({type(a).__name__}, level {a._priority}) "
                            f"comes from a transformation whose level is not below this "
                            f"vmap's ({level}); the two could not be told apart")


def _unknown_shape(what: str, a: Any) -> ShapeError:
    """The refusal of a graph value of unknown shape: a batching rule moves and broadcasts
    axes, so it needs every operand's rank, batched or not."""
    name = getattr(a, "name", None)
    return ShapeError(f"vmap: {what} has an unknown shape (the graph value"
                      + (f" {name!r}" if name else "") + ", from a placeholder made with "
                      "shape=None); vmap needs the shape of every value it meets, batched "
                      "or not: give the placeholder a shape")


def _as_value(x: Any) -> Any:
    """Tensors and the values of other transformations as they are; the rest (Python
    numbers, NumPy arrays, lists, a recorded function's float) becomes a tensor."""
    x = strong(x)
    return x if isinstance(x, Tensor) or type(x) in KINDS else tensor(x)


def _per_argument(in_axes: Axes, n: int) -> list:
    """``in_axes`` as one entry (an int or None) per positional argument."""
    if in_axes is None or (isinstance(in_axes, int) and not isinstance(in_axes, bool)):
        axes = [in_axes] * n
    elif isinstance(in_axes, (tuple, list)):
        if len(in_axes) != n:
            raise BatchingError(f"vmap: in_axes has {len(in_axes)} entries but the function "
                                f"was called with {n} positional arguments")
        axes = list(in_axes)
    else:
        raise BatchingError(f"vmap: in_axes must be an int, None, or a tuple of them, "
                            f"got {in_axes!r}")
    for i, a in enumerate(axes):
        if not (a is None or (isinstance(a, int) and not isinstance(a, bool))):
            raise BatchingError(f"vmap: in_axes[{i}] must be an int or None, got {a!r}")
    if all(a is None for a in axes):
        raise BatchingError("vmap: at least one argument must be batched (in_axes is all None"
                            + (")" if n else ", and there are no arguments)"))
    return axes


def vmap(f: Callable[..., Any], in_axes: Axes = 0, out_axes: Axes = 0) -> Callable[..., Any]:
    """Vectorize ``f`` over a batch axis of its arguments, with JAX's semantics.

    ``in_axes``: the batch axis of every positional argument (an int), or one entry per
    argument: an int (negative counts from the end) or ``None`` for an argument that is
    the same for every example. ``out_axes``: where the batch axis goes in the result,
    one entry per output if ``f`` returns a tuple; an output that does not depend on the
    batch is repeated along it (``None`` instead returns it unbatched).

    A batched argument is one array (or tensor, or nested list of numbers): a tuple,
    list or dict of arrays, which JAX would batch array by array (a pytree), is refused
    (``argnums.refuse_pytrees``); pass its arrays as arguments of their own.
    """
    refuse_non_functions(f, "vmap")

    def batched(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise BatchingError(f"vmap: pass the arguments of a vmapped function by position "
                                f"(got keywords {sorted(kwargs)}); use in_axes to say which "
                                f"are batched")
        axes = _per_argument(in_axes, len(args))
        refuse_pytrees(args, [i for i, axis in enumerate(axes) if axis is not None], "vmap")
        level = new_level()
        inputs, sizes = [], []
        for i, (a, axis) in enumerate(zip(args, axes)):
            if getattr(a, "shape", ()) is None:  # (a graph value, batched or not: the rules
                # and the output need its shape; a container left unbatched has none)
                raise _unknown_shape(f"argument {i}", a)
            if axis is None:  # the same for every example: f gets the caller's own value
                _check_level(a, i, level)  # (y += 1.0 writes the caller's array, as eagerly)
                inputs.append(a)
                continue
            a = _as_value(a)
            shape = shape_of(a)
            if not -len(shape) <= axis < len(shape):
                raise ShapeError(f"vmap: in_axes[{i}] = {axis} is out of range for argument "
                                 f"{i} of rank {len(shape)} (shape {tuple(shape)})")
            axis %= len(shape)
            sizes.append((i, axis, shape[axis]))
            inputs.append(BatchTracer(moveaxis(a, axis, 0), level))
        if len({n for _, _, n in sizes}) > 1:
            raise ShapeError("vmap: the batched arguments have different sizes: " + ", ".join(
                f"argument {i} has size {n} along axis {axis}" for i, axis, n in sizes))
        size = sizes[0][2]
        with passed_as_is(inputs, [i for i, axis in enumerate(axes) if axis is not None],
                          "vmap", args, level=level), level_running(level):
            out = f(*inputs)
        # The results are the caller's own arrays, apart from each other and from the
        # arguments: the gradients of x + y with respect to x and y are one batched value,
        # an unbatched output is a broadcast view, f may return x (see tape.own_results)
        if isinstance(out, (tuple, list)):
            outs = _per_output(out_axes, len(out))
            items = own_results([_unbatch(o, ax, level, size, k) for k, (o, ax) in
                                 enumerate(zip(out, outs))], memory_of(args))
            # (a namedtuple takes its fields one by one, as torch.func.vmap rebuilds it)
            return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
        if isinstance(out_axes, (tuple, list)):
            raise BatchingError(f"vmap: out_axes {out_axes!r} has one entry per output, but "
                                f"the function returned one value, not a tuple")
        return own_results([_unbatch(out, cast("int | None", out_axes), level, size, 0)],
                           memory_of(args))[0]

    batched.__name__ = f"vmap({getattr(f, '__name__', 'f')})"
    batched.__doc__ = f.__doc__
    # Marks a transformation (levels.py): source transformation may then call it on the
    # values of the program it writes, since vmap runs on any value kind.
    return transformation(batched, "vmap", f)


def _per_output(out_axes: Any, n: int) -> list:
    if isinstance(out_axes, (tuple, list)):
        if len(out_axes) != n:
            raise BatchingError(f"vmap: out_axes has {len(out_axes)} entries but the function "
                                f"returned {n} outputs")
        return list(out_axes)
    return [out_axes] * n


def _unbatch(out: Any, axis: "int | None", level: int, size: int, k: int) -> Any:
    """Output ``k`` with its batch axis moved from the front to ``axis``."""
    if not is_value(out):
        raise BatchingError(f"vmap: output {k} is a {type(out).__name__}; f must return a "
                            f"tensor or a number, or a flat tuple or list of them")
    batched = type(out) is BatchTracer and out.level == level
    if not batched and getattr(out, "shape", ()) is None:
        raise _unknown_shape(f"output {k}", out)
    if axis is None:
        if batched:
            raise BatchingError(f"vmap: out_axes[{k}] is None, but output {k} differs from "
                                f"example to example")
        # (a NumPy array f made or got, e.g. an unbatched argument: a tensor of its own,
        # as every output of vmap is)
        return tensor(out) if isinstance(out, (np.ndarray, np.generic)) else out
    if not (isinstance(axis, int) and not isinstance(axis, bool)):
        raise BatchingError(f"vmap: out_axes[{k}] must be an int or None, got {axis!r}")
    if batched:
        value = out.value
    else:  # the same for every example: repeated along the batch axis, as in JAX
        out = _as_value(out)
        value = SH.broadcast_to(out, (size,) + tuple(shape_of(out)))
    rank = len(shape_of(value))
    if not -rank <= axis < rank:
        raise ShapeError(f"vmap: out_axes[{k}] = {axis} is out of range for output {k} of "
                         f"rank {rank} with its batch axis (shape {tuple(shape_of(value))})")
    return moveaxis(value, 0, axis % rank)
