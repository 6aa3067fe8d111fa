"""One entry point, several ways: ``mg.grad(f, mode=...)``, ``mg.value_and_grad``,
``mg.vjp`` and ``mg.jacrev``.

Every mode computes the same derivatives from the same primitive table; they differ in
*how* the chain rule is organised (the textbook's comparison of forward and reverse
mode, and of define-by-run and define-and-run). ``MODES`` maps a mode's name to the
function that builds ``value_and_grad`` in that mode; later parts of the library add
theirs to it. ``PULLBACKS`` maps the compiled reverse modes to what builds their vjp: a
program per signature that takes the output's adjoint (the tape records f instead).
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import DTypeError, GradientError
from ..graph import trace
from . import forward, source, tape
from ..ops.operators import passed_as_is
from ..ops.primitive import KINDS
from ..tensor import Tensor
from .argnums import (normalize_argnums, refuse_keywords, refuse_non_functions,
                      refuse_pytrees, single)
from .levels import transformation
from .reads import differs, rebound

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


# mode -> (f, argnums) -> an object whose ``value(*args)`` is f's value, whose
# ``pullback(args, g)`` gives the gradients for argnums from the output's adjoint g, each
# by a program compiled once per signature, and whose ``program(args, g)`` is the
# pullback's program (built if needed; see ``trace.vjp`` and ``source.vjp``).
PULLBACKS: dict[str, Callable[..., Any]] = {
    "graph": trace.vjp,
    "source": source.vjp,
}
REVERSE_MODES = ("tape", *PULLBACKS)


def value_and_grad(f: Callable[..., Any], argnums: "int | tuple[int, ...]" = 0,
                   mode: str = "tape") -> Callable[..., tuple]:
    """``v, g = mg.value_and_grad(f, argnums, mode)(*args)``: f's value and gradient."""
    refuse_non_functions(f, "value_and_grad")
    made = _value_and_grad(f, argnums, mode, "value_and_grad")
    made.__name__ = f"value_and_grad_{getattr(f, '__name__', 'f')}"  # (as grad names its own)
    return transformation(made, f"value_and_grad(mode={mode!r})", f)


def _value_and_grad(f: Callable[..., Any], argnums: "int | tuple[int, ...]", mode: str,
                    who: str) -> Callable[..., tuple]:
    """``mode``'s value_and_grad of f, whose errors name ``who``, the function called."""
    try:
        make = MODES[mode]
    except KeyError:
        raise ValueError(f"{who}: unknown mode {mode!r}; available here: "
                         f"{', '.join(MODES)}") from None
    return make(f, argnums, who=who)


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
        gradient = GRADIENT_ONLY[mode](f, argnums, who="grad")
    else:
        vg = _value_and_grad(f, argnums, mode, "grad")

        def gradient(*args: Any, **kwargs: Any) -> Any:
            return vg(*args, **kwargs)[1]

    gradient.__name__ = f"grad_{getattr(f, '__name__', 'f')}"
    return transformation(gradient, f"grad(mode={mode!r})", f)


def hessian(f: Callable[..., Any], argnums: "int | tuple[int, ...]" = 0,
            mode: str = "tape") -> Callable[..., Any]:
    """The Hessian of a scalar function: ``jacfwd(jacrev(f))``, forward over reverse, as
    in JAX (the reverse sweep makes the gradient, n tangents differentiate it). With a
    tuple of argnums, the blocks ``H[i][j]`` = d2f / dx_i dx_j (shape ``x_i.shape +
    x_j.shape``) as a tuple of tuples, as ``torch.func.hessian`` and ``jax.hessian`` give
    them: one forward-over-reverse per block. ``mode`` is the reverse sweep's
    (``"tape"``, ``"graph"`` or ``"source"``, as in :func:`jacrev`): a compiled mode's
    program runs on the dual numbers of the forward pass around it."""
    from .forward import jacfwd

    refuse_non_functions(f, "hessian")
    if mode != "tape":
        _pullbacks(mode, "hessian")  # (an unknown mode is refused here, naming hessian)
    gradients: dict[int, Callable] = {}  # argument -> its gradient (one compiled program each)

    def gradient(i: int) -> Callable:
        if i not in gradients:
            gradients[i] = _jacrev(f, i, True, mode, "hessian")
        return gradients[i]

    def hess(*args: Any, **kwargs: Any) -> Any:
        # (checked here, so that an error names hessian, not the jacfwd inside it)
        refuse_keywords(kwargs, "hessian")
        nums = normalize_argnums(argnums, len(args), "hessian")
        refuse_pytrees(args, nums, "hessian")
        for i in nums:
            tape._differentiable(args[i], i, "hessian")  # (floats only: the tape's one check)
        if single(argnums):  # (an int, a NumPy integer: one block, as jacrev's rule)
            return jacfwd(gradient(nums[0]), nums[0])(*args)
        return tuple(tuple(jacfwd(gradient(i), j)(*args) for j in nums) for i in nums)
    return transformation(hess, "hessian", f)


def vjp(f: Callable[..., Any], *primals: Any, mode: str = "tape"
        ) -> tuple[Any, Callable[..., tuple]]:
    """``out, vjp_fn = mg.vjp(f, x, y)``; ``vjp_fn(g)`` gives (g·∂out/∂x, g·∂out/∂y).

    ``mode="tape"`` (the default) records f once and sweeps that record at each call of
    ``vjp_fn``. ``"graph"`` and ``"source"`` compile, once per signature, a program that
    takes the primals and g and returns the gradients (a reverse graph seeded with g; an
    adjoint program ``def vjp_f(x, y, gz)``); it runs f's forward sweep again at each
    call, because a program keeps no values between calls. There g must have the
    output's dtype, as ``jax.vjp`` requires (the program is written for one).
    """
    if mode == "tape":
        return tape.vjp(f, *primals)
    pullbacks = _pullbacks(mode, "vjp")
    refuse_non_functions(f, "vjp")
    if not primals:
        raise TypeError("vjp: give at least one primal to differentiate with respect to")
    refuse_pytrees(primals, range(len(primals)), "vjp", "primal")
    args = tuple(tape._differentiable(p, i, "vjp") for i, p in enumerate(primals))
    return _pulled(pullbacks(f, tuple(range(len(args)))), args, mode, "vjp")


# (mg.vjp itself takes the values: a function source mode reads may call it on its own)
transformation(vjp, "vjp")


def _pullbacks(mode: str, who: str) -> Callable[..., Any]:
    """The vjp builder of a compiled mode; an unknown mode, or forward mode, refused."""
    if mode in PULLBACKS:
        return PULLBACKS[mode]
    hint = (" (forward mode computes Jacobian-vector products: mg.jvp, mg.jacfwd)"
            if mode == "forward" else "")
    raise ValueError(f"{who}: unknown mode {mode!r}; reverse mode runs in "
                     f"{', '.join(REVERSE_MODES)}{hint}")


def _pulled(made: Any, args: tuple, mode: str, who: str) -> tuple[Any, Callable[..., tuple]]:
    """``(out, vjp_fn)`` from a compiled mode's ``value`` and ``pullback`` on ``args``;
    in source mode ``vjp_fn.source`` is the program's text."""
    out = made.value(*args)
    if not (isinstance(out, Tensor) or type(out) in KINDS):
        raise TypeError(f"{who}: f must return a tensor, got {type(out).__name__}")
    # The pullback's program, built now: it reads the tensors f reads (a global) as they
    # are now, as f's value did; a write into one, or into an argument, before vjp_fn is
    # then refused, as the tape refuses it (the program runs f again from them).
    captured = made.program(args, out).captured
    done = tape.last_write()
    arrays = captured.now()  # (their values at this forward pass, not at the build)

    def vjp_fn(g: Any = None) -> tuple:
        seed = tape.cotangent(out, g, "vjp_fn(g)")
        if str(seed.dtype) != str(out.dtype):
            raise DTypeError(f"vjp_fn(g): g is {seed.dtype} and f's output {out.dtype}; in "
                             f"mode {mode!r} the program is written for the output's dtype "
                             f"(as jax.vjp requires): pass g as {out.dtype}")
        if tape.last_write() != done:
            tape.refuse_changed(list(args) + captured.tensors, done, f"mode {mode!r}")
        name = rebound(captured.reads)
        if name is not None:  # (the program would be built again, from the new value)
            raise GradientError(
                f"vjp_fn(g): f reads {name}, which holds another value since mg.vjp ran f "
                f"(a name or an item bound anew); the pullback (mode {mode!r}) runs f's "
                f"program, which would read the new value and give the derivative of "
                f"another function. Call mg.vjp again after binding it")
        changed = next((a for a, was in arrays if differs(a, was)), None)
        if changed is not None:  # (NumPy writes its arrays unseen: their values tell)
            raise GradientError(
                f"vjp_fn(g): an array that f reads from outside its arguments (shape "
                f"{tuple(changed.shape)}) was written in place since mg.vjp ran f; the "
                f"pullback (mode {mode!r}) would read the new values and give the "
                f"derivative of another function. Call mg.vjp again after the write")
        return tape.hand_over(list(made.pullback(args, seed)), seed, g)

    if hasattr(made, "source"):  # (the program value() used: this signature's)
        vjp_fn.source = made.source  # type: ignore[attr-defined]
    return out, transformation(vjp_fn, "vjp")


def jacrev(f: Callable[..., Any], argnums: "int | tuple[int, ...]" = 0,
           vectorize: bool = True, mode: str = "tape") -> Callable:
    """The Jacobian by reverse mode: one sweep per *output* element. With ``vectorize``
    (the default) the m sweeps run as one batched sweep, ``vmap`` of the VJP over the
    rows of the identity, as JAX does; ``vectorize=False`` runs them one by one, as
    ``torch.autograd.functional.jacobian`` does by default (chapter 02 counts them).
    ``mode`` is the vjp's (``"tape"``, ``"graph"`` or ``"source"``: see :func:`vjp`)."""
    return _jacrev(f, argnums, vectorize, mode, "jacrev")


def _jacrev(f: Callable[..., Any], argnums: "int | tuple[int, ...]", vectorize: bool,
            mode: str, who: str) -> Callable:
    """:func:`jacrev`, its errors naming ``who``: ``hessian`` for the one inside it."""
    from ..ops.shape import stack
    from .batching import vmap
    from .forward import basis_vectors, identity_rows, jacobian_from_rows

    refuse_non_functions(f, who)
    if mode != "tape":
        pullbacks = _pullbacks(mode, who)
        made: dict[tuple[int, ...], Any] = {}  # argnums -> the mode's vjp

    def jac(*args: Any, **kwargs: Any) -> Any:
        refuse_keywords(kwargs, who)
        nums = normalize_argnums(argnums, len(args), who)
        refuse_pytrees(args, nums, who)
        # (as tensors here: the Jacobian's shape is read from them, a list has none)
        args = tuple(tape._differentiable(a, i, who) if i in nums else a
                     for i, a in enumerate(args))
        if mode == "tape":
            with passed_as_is(args, nums, who):
                out, vjp_fn = tape.recorded_vjp(lambda *xs: f(*tape.put(args, nums, xs)),
                                                tuple(args[i] for i in nums), who)
        else:
            if nums not in made:
                made[nums] = pullbacks(f, nums, who)
            out, vjp_fn = _pulled(made[nums], args, mode, who)
        rows = identity_rows(out)  # e_k: the cotangent that picks out output element k
        if rows is None:
            per_input = None
        elif vectorize:
            per_input = vmap(vjp_fn)(rows)
        else:
            sweeps = [vjp_fn(e) for e in basis_vectors(out)]
            per_input = tuple(stack([s[j] for s in sweeps]) for j in range(len(nums)))
        jacs = tuple(jacobian_from_rows(None if per_input is None else per_input[j], out,
                                        args[i], outputs_first=True)
                     for j, i in enumerate(nums))
        return jacs[0] if single(argnums) else jacs

    return transformation(jac, "jacrev", f)
