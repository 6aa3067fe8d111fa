"""What a transformation takes: which arguments (``argnums``), of what kind, one rule for
every mode.

``argnums=0`` and ``argnums=(0,)`` name the same argument; the first gives one gradient,
the second a tuple of one (JAX's convention). A negative number counts from the end, as
an index does. Out of range, repeated, or not an integer: an error that names the
transformation, the argnums and how many arguments there are.

An argument is one array (a tensor, a NumPy array, a number, a nested list of numbers, a
value of another transformation), passed by position: a container of arrays (a JAX
pytree) and keyword arguments are refused by every transformation (:func:`refuse_pytrees`,
:func:`refuse_keywords`); what f returns must be a value too (:func:`is_value`).
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, Sequence, Union

import numpy as np

from ..errors import DTypeError, PytreeError
from ..ops.shape_rules import FLOATS

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


def _holds_arrays(x: Any) -> bool:
    """Whether the list, tuple or dict ``x`` holds, at any depth, something with a shape
    that is not a NumPy scalar: an array, a tensor, a value of a transformation. Each
    container is looked into once (``cfg["self"] = cfg`` holds itself: it hung)."""
    stack, seen = [x], set()
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple, dict)):
            if id(v) in seen:
                continue
            seen.add(id(v))
            stack.extend(v.values() if isinstance(v, dict) else v)
        elif hasattr(v, "shape") and not isinstance(v, np.generic):
            return True
    return False


def refuse_pytrees(values: Sequence[Any], positions: Iterable[int], who: str,
                   noun: str = "argument") -> None:
    """Refuse ``values[i]`` (for i in ``positions``) if it is a list, tuple or dict holding
    arrays or tensors.

    JAX and torch.func read such an argument as a *pytree*: each array in it is an input
    of its own (``grad`` returns a tuple of gradients, ``vmap`` batches every array along
    its own axis). minigraph's transformations take one array per argument (or a number,
    or a nested list of numbers, which becomes an array as ``mg.tensor`` makes it), and
    converting the container that way would stack its arrays into one: a gradient of
    another shape, or a batch axis across the arrays instead of inside each, without a
    word. So they refuse it, and say what to write instead."""
    for i in positions:
        v = values[i]
        if isinstance(v, (list, tuple, dict)) and _holds_arrays(v):
            raise PytreeError(
                f"{who}: {noun} {i} is a {type(v).__name__} of arrays or tensors. minigraph's "
                f"transformations take one array per argument, not pytrees: JAX and "
                f"torch.func would treat each array in it as an input of its own, while "
                f"stacking them into one array would give another derivative and another "
                f"batch axis. Pass the arrays as separate arguments (f(a, b) with "
                f"argnums=(0, 1), or in_axes per argument), or mg.stack them first if one "
                f"array is meant")


def refuse_non_functions(f: Any, who: str) -> None:
    """A transformation takes the function itself. ``mg.grad(f(x))``, the value where f
    was meant, is the classic slip; it failed later, at the call, with Python's "'Tensor'
    object is not callable". JAX refuses at once ("Expected a callable value"); so does
    this, at the transformation, naming it."""
    if not callable(f):
        hint = (f"; pass the function itself, mg.{who}(f), not its value at some point, "
                f"mg.{who}(f(x))" if is_value(f) else "")
        what = "None" if f is None else f"a {type(f).__name__}"
        raise TypeError(f"{who}: f must be a function, got {what}{hint}")


def refuse_integers(dtype: Any, position: int, who: str) -> None:
    """Only floating-point arguments are differentiated, in every mode (JAX's rule; in
    PyTorch only they can require gradients): the derivative by an integer is not defined,
    and a gradient of an integer's dtype would round every step away."""
    if str(dtype) not in FLOATS:
        integer = "int" in str(dtype) or str(dtype) == "bool"
        advice = "pass floats (e.g. 2.0 rather than 2)" if integer else \
            f"minigraph computes in {' and '.join(FLOATS)}"  # (float16, complex ...)
        raise DTypeError(f"{who}: cannot differentiate with respect to argument {position} "
                         f"of dtype {dtype}; {advice}")


def not_data(value: Any, position: int, who: str) -> TypeError:
    """The error for an argument to differentiate that is no array at all (a string,
    None): graph and source mode read it as a constant of the program."""
    return TypeError(f"{who}: argument {position} must be a float, array or tensor to be "
                     f"differentiated, got {type(value).__name__}")


def refuse_keywords(kwargs: dict, who: str) -> None:
    """Refuse keyword arguments to a transformed function, naming them. (JAX and
    torch.func pass keywords to f undifferentiated; minigraph's transformations, whose
    compiled programs are cached per positional signature, take positions only.)"""
    if kwargs:
        first = sorted(kwargs)[0]
        raise TypeError(f"{who}: pass f's arguments by position (got keywords "
                        f"{sorted(kwargs)}); to fix a keyword, transform a function that "
                        f"sets it: def g(x): return f(x, {first}=...)")


def is_value(x: Any) -> bool:
    """Whether ``x`` is something a transformation can take or give back as a value: a
    tensor, a number, a NumPy array or scalar, or a value of a transformation or graph."""
    from ..ops.primitive import KINDS
    from ..tensor import Tensor

    return isinstance(x, (Tensor, int, float, np.ndarray, np.generic)) or type(x) in KINDS
