"""One entry point, several ways: ``mg.grad(f, mode=...)`` and ``mg.value_and_grad``.

Every mode computes the same derivatives from the same primitive table; they differ in
*how* the chain rule is organised (the textbook's comparison of forward and reverse
mode, and of define-by-run and define-and-run). ``MODES`` maps a mode's name to the
function that builds ``value_and_grad`` in that mode; later parts of the library add
theirs to it.
"""

from __future__ import annotations

from typing import Any, Callable

from ..graph import trace
from . import forward, source, tape
from .argnums import normalize_argnums, refuse_keywords, refuse_non_functions, refuse_pytrees
from .levels import transformation

MODES: dict[str, Callable[..., Callable]] = {
    "tape": tape.value_and_grad,        # reverse mode, define-by-run: one sweep
    "forward": forward.value_and_grad,  # dual numbers: one pass per input element
    "graph": trace.value_and_grad,      # define-and-run: trace, gradients pass, compile
    "source": source.value_and_grad,    # source transformation: a generated adjoint program
}

# Modes that also build the gradient alone, for ``grad``: a compiled program then leaves
# out what only f's value needs, and no tensor is made for a value that grad would drop
# (on scalars, a third of a cached call). The other modes compute the value anyway.
GRADIENT_ONLY: dict[str, Callable[..., Callable]] = {
    "graph": trace.grad,
    "source": source.source_grad,
}


def value_and_grad(f: Callable[..., Any], argnums: "int | tuple[int, ...]" = 0,
                   mode: str = "tape") -> Callable[..., tuple]:
    """``v, g = mg.value_and_grad(f, argnums, mode)(*args)``: f's value and gradient."""
    refuse_non_functions(f, "value_and_grad")
    try:
        make = MODES[mode]
    except KeyError:
        raise ValueError(f"grad: unknown mode {mode!r}; available here: "
                         f"{', '.join(MODES)}") from None
    made = make(f, argnums)
    made.__name__ = f"value_and_grad_{getattr(f, '__name__', 'f')}"  # (as grad names its own)
    return transformation(made, f"value_and_grad(mode={mode!r})", f)


def grad(f: Callable[..., Any], argnums: "int | tuple[int, ...]" = 0,
         mode: str = "tape") -> Callable[..., Any]:
    """The gradient of a scalar function: ``mg.grad(f, argnums=(0, 1))(2.0, 3.0)``.

    ``argnums`` an int gives one gradient, a tuple gives a tuple. ``mode`` is one of
    ``MODES`` (``"tape"`` by default). Gradients of gradients work:
    ``mg.grad(mg.grad(mg.sin))(1.0) == -sin(1)``. A gradient has its argument's shape,
    dtype and device in every mode (a float32 argument used in float64 arithmetic gets a
    float32 gradient), as in PyTorch and JAX.
    """
    refuse_non_functions(f, "grad")
    if mode in GRADIENT_ONLY:
        gradient = GRADIENT_ONLY[mode](f, argnums)
    else:
        vg = value_and_grad(f, argnums, mode)

        def gradient(*args: Any, **kwargs: Any) -> Any:
            return vg(*args, **kwargs)[1]

    gradient.__name__ = f"grad_{getattr(f, '__name__', 'f')}"
    return transformation(gradient, f"grad(mode={mode!r})", f)


def hessian(f: Callable[..., Any], argnums: "int | tuple[int, ...]" = 0) -> Callable[..., Any]:
    """The Hessian of a scalar function: ``jacfwd(jacrev(f))``, forward over reverse, as
    in JAX (the reverse sweep makes the gradient, n tangents differentiate it). With a
    tuple of argnums, the blocks ``H[i][j]`` = d2f / dx_i dx_j (shape ``x_i.shape +
    x_j.shape``) as a tuple of tuples, as ``torch.func.hessian`` and ``jax.hessian`` give
    them: one forward-over-reverse per block."""
    from .forward import jacfwd
    from .tape import jacrev

    refuse_non_functions(f, "hessian")

    def hess(*args: Any, **kwargs: Any) -> Any:
        # (checked here, so that an error names hessian, not the jacfwd inside it)
        refuse_keywords(kwargs, "hessian")
        nums = normalize_argnums(argnums, len(args), "hessian")
        refuse_pytrees(args, nums, "hessian")
        for i in nums:
            tape._differentiable(args[i], i, "hessian")  # (floats only: the tape's one check)
        if isinstance(argnums, int):
            return jacfwd(jacrev(f, argnums), argnums)(*args)
        return tuple(tuple(jacfwd(jacrev(f, i), j)(*args) for j in nums) for i in nums)
    return transformation(hess, "hessian", f)
