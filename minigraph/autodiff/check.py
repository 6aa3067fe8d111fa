"""``mg.gradcheck``: compare a mode's derivatives with central finite differences.

For every input element ``x[k]`` the numerical derivative is

    (f(x + eps e_k) - f(x - eps e_k)) / (2 eps)

whose error is O(eps^2); with float64 and eps = 1e-6 it agrees with the exact derivative
to about 1e-8 relative. The analytic side is the full Jacobian of the chosen mode
(reverse mode by default: one sweep per output element). A disagreement raises
:class:`~minigraph.errors.GradcheckError` naming the input, the elements and both values.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np  # the finite differences are computed on the host, in float64

from ..errors import GradcheckError
from ..tensor import FLOAT_DTYPES, Tensor, tensor
from .api import REVERSE_MODES, jacrev
from .forward import jacfwd
from .argnums import refuse_non_functions, refuse_pytrees

# mode -> the Jacobian checked: reverse mode's rows in each of its modes, forward's columns
_JACOBIANS: dict[str, Callable[..., Callable]] = {
    **{mode: functools.partial(jacrev, mode=mode) for mode in REVERSE_MODES},
    "forward": jacfwd}


def _fresh(args: Sequence[Tensor]) -> list[Tensor]:
    """Copies of the inputs for one call of f: a function that writes into its arguments
    (``x += 1``) then starts every evaluation from the same values, and the caller's
    tensors are as they were after the check (else each evaluation would see the last
    one's writes, and the differences would measure those)."""
    return [Tensor(x.device.xp.asarray(x.data, copy=True), x.device) for x in args]


def _numeric_jacobian(f: Callable, args: list[Tensor], i: int, eps: float) -> np.ndarray:
    x = args[i]
    base = x.numpy().astype(np.float64)
    out0 = np.asarray(f(*_fresh(args)).numpy())
    jac = np.zeros(out0.shape + base.shape)
    for k in np.ndindex(base.shape):
        cols = []
        for step in (eps, -eps):
            moved = base.copy()
            moved[k] += step
            xk = tensor(moved, dtype=x.dtype, device=x.device)
            fresh = _fresh(args)
            fresh[i] = xk
            cols.append(np.asarray(f(*fresh).numpy(), dtype=np.float64))
        jac[(...,) + k] = (cols[0] - cols[1]) / (2 * eps)
    return jac


def _input(k: int, x: Any) -> Tensor:
    """Input ``k`` as a tensor; its error names gradcheck's input, not ``tensor()``."""
    try:
        return tensor(x)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"gradcheck: input {k} ({type(x).__name__}) is not a tensor, an "
                        f"array or a number: {exc}") from None


def gradcheck(f: Callable[..., Any], inputs: Sequence[Any], eps: float = 1e-6,
              atol: float = 1e-5, rtol: float = 1e-4, mode: str = "tape") -> bool:
    """Check ``mode``'s Jacobian of ``f`` against finite differences: ``"tape"``,
    ``"graph"`` or ``"source"`` (``mg.jacrev`` in that mode), or ``"forward"``.

    Returns True, or raises ``GradcheckError`` with a report of the worst element.
    """
    refuse_non_functions(f, "gradcheck")
    if mode not in _JACOBIANS:
        raise ValueError(f"gradcheck: mode is one of {', '.join(map(repr, _JACOBIANS))}, "
                         f"got {mode!r}")
    if not isinstance(inputs, (tuple, list)):  # (len(1.0) failed inside, naming nothing)
        raise TypeError(f"gradcheck: inputs must be a tuple or list of f's arguments, got "
                        f"{type(inputs).__name__}: write mg.gradcheck(f, (x,))")
    refuse_pytrees(inputs, range(len(inputs)), "gradcheck", "input")
    args = [x if isinstance(x, Tensor) else _input(k, x) for k, x in enumerate(inputs)]
    jacobian = _JACOBIANS[mode]
    if not any(x.dtype in FLOAT_DTYPES for x in args):
        # (True here would say that derivatives were checked when none was)
        raise ValueError(f"gradcheck: no input is floating (dtypes "
                         f"{[str(x.dtype) for x in args]}), so there is no derivative to "
                         f"check; pass the inputs to differentiate as floats")
    # integer inputs (labels, indices) have no derivative; the floating ones are all
    # differentiated in one call, so that f's updates in place of them are the
    # transformation's own values in every mode (a compiled mode refuses an update of a
    # tensor it is handed as it is: it could not write into it, as eager mode does)
    floats = tuple(i for i, x in enumerate(args) if x.dtype in FLOAT_DTYPES)
    jacobians = jacobian(f, argnums=floats)(*_fresh(args))
    for i, jac in zip(floats, jacobians):
        x = args[i]
        analytic = np.asarray(jac.numpy(), dtype=np.float64)
        numeric = _numeric_jacobian(f, args, i, eps)
        err = np.abs(analytic - numeric)
        # NumPy's isclose (|a - n| <= atol + rtol |n|, equal infinities close): unlike
        # ``err > tol`` it counts a nan on either side as a disagreement, as PyTorch's
        # gradcheck does; a rule that gives nan is the bug most worth catching
        bad = ~np.isclose(analytic, numeric, rtol=rtol, atol=atol)
        if bad.any():
            worst = np.unravel_index(np.argmax(np.where(bad, err, -1)), err.shape)
            n_out = analytic.ndim - x.ndim
            out_idx = [int(i) for i in worst[:n_out]]
            in_idx = [int(i) for i in worst[n_out:]]
            raise GradcheckError(
                f"gradcheck ({mode} mode) failed for input {i} (shape {x.shape}, {x.dtype}): "
                f"{int(bad.sum())} of {bad.size} Jacobian entries disagree.\n"
                f"  worst: d out{out_idx} / d input{i}{in_idx}: "
                f"analytic {analytic[worst]:.10g}, numerical {numeric[worst]:.10g} "
                f"(|difference| {err[worst]:.3g}, allowed {atol + rtol * abs(numeric[worst]):.3g})"
                + ("\n  (nan on a side: f or the derivative is undefined at this point, "
                   "or a rule gives nan; a nan is close to nothing, as in PyTorch's "
                   "gradcheck)" if np.isnan(analytic[worst]) or np.isnan(numeric[worst])
                   else "")
                + (f"\n  (input {i} is float32, which resolves about 1e-7: its finite "
                   f"differences with eps={eps:g} are mostly rounding. Check in float64, as "
                   f"PyTorch's gradcheck asks, or raise eps and the tolerances)"
                   if x.dtype == "float32" else ""))
    return True
