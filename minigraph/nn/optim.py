"""``SGD``: stochastic gradient descent, PyTorch's update rule, all-or-nothing steps.

For each parameter p with gradient g (PyTorch's ``torch.optim.SGD``):

    g = g + weight_decay * p
    buf = g                      on the first step, with momentum
    buf = momentum * buf + g     on later steps
    p = p - lr * (buf if momentum else g)

``step()`` first computes every parameter's change (and every new momentum buffer),
checking each gradient's shape, dtype and device, and that each parameter's memory can
be written (a read-only array would fail half-way through the writes), and only then
writes them all. So a step that fails, on the fifth parameter say, leaves all
parameters and buffers as they were (DESIGN.md: "a failed step leaves parameters as they were"). The writes are
``p -= change`` under ``no_grad``: in place, into the parameters' own arrays, as in
PyTorch (chapter 01), so no new arrays are made per step, and a tape that recorded a
parameter before the step refuses a later ``backward()`` (chapter 02). A graph that
captured a parameter as a constant holds a copy, and keeps the value it was built with.
"""

from __future__ import annotations

import numbers
from typing import Iterable

import numpy as np

from ..autodiff.tape import no_grad
from ..errors import DeviceError, DTypeError, ShapeError
from ..tensor import Tensor


class SGD:
    """``SGD(model.parameters(), lr=0.1, momentum=0.0, weight_decay=0.0)``."""

    def __init__(self, params: Iterable[Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0):
        # list() of one tensor would iterate over its elements (new getitem results, not
        # the parameter), and step() would then change nothing: refuse it, as PyTorch does
        if isinstance(params, Tensor):
            raise TypeError(f"SGD: params should be an iterable of Tensors (such as "
                            f"model.parameters() or [p]), but got a Tensor of shape "
                            f"{params.shape}; wrap a single parameter in a list: SGD([p], ...)")
        self.params = list(params)
        if not self.params:
            raise ValueError("SGD: got an empty parameter list")
        for i, p in enumerate(self.params):
            if not isinstance(p, Tensor):
                raise TypeError(f"SGD: parameter {i} is a {type(p).__name__}, not a Tensor")
            if not p.is_leaf:
                # backward() gives gradients to leaves only: step() would skip this tensor
                # every time, and the model would silently never train. PyTorch's refusal.
                raise ValueError(f"SGD: can't optimize a non-leaf tensor: parameter {i} "
                                 f"(shape {p.shape}) is the result of a recorded operation "
                                 f"(w = mg.tensor(..., requires_grad=True) * 0.01, say), "
                                 f"which never gets a .grad; make the parameter itself a "
                                 f"leaf: mg.tensor(<initial values>, requires_grad=True)")
        first: dict[int, int] = {}
        for i, p in enumerate(self.params):  # a repeated parameter would be stepped twice
            j = first.setdefault(id(p), i)
            if j != i:
                raise ValueError(f"SGD: parameter {i} is parameter {j} again; give each "
                                 f"parameter once")
        for what, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            # checked here, not at the first step(): a str, None or an array is not a
            # hyperparameter (np.float64 is a numbers.Real; bool is refused as a likely slip)
            if not isinstance(v, numbers.Real) or isinstance(v, bool):
                raise TypeError(f"SGD: {what} must be a real number, got {type(v).__name__} "
                                f"{v!r}")
            if not v >= 0.0:
                raise ValueError(f"SGD: {what} must be >= 0, got {v}")
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.state: dict[int, Tensor] = {}  # parameter index -> momentum buffer

    def zero_grad(self) -> None:
        """Forget every parameter's gradient (``p.grad = None``, PyTorch's default)."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Update every parameter that has a gradient; all or nothing."""
        with no_grad():
            updates = [(i, *self._update(i, p)) for i, p in enumerate(self.params)
                       if p.grad is not None]
            for i, change, buf in updates:  # nothing above failed: now write, in place
                p = self.params[i]
                p -= change
                if buf is not None:
                    self.state[i] = buf

    def _update(self, i: int, p: Tensor) -> tuple[Tensor, Tensor | None]:
        """The change of parameter i (lr times its step direction) and its new momentum
        buffer (None without)."""
        # float(): a NumPy scalar (lr = base * np.cos(...) is an np.float64) is a typed
        # number to mg, and np.float64 * (a float32 tensor) would be float64, which the
        # in-place write refuses; a Python float is weak and keeps p's dtype (PyTorch's)
        lr, momentum, weight_decay = (float(self.lr), float(self.momentum),
                                      float(self.weight_decay))
        g = _checked_grad(i, p)
        if weight_decay:
            g = g + weight_decay * p.detach()
        _check_writable(i, p)
        buf = None
        if momentum:
            old = self.state.get(i)
            # the first buffer is a copy (PyTorch's clone): g may be the gradient's own
            # memory, which a later backward accumulates into in place
            buf = (Tensor(g.device.copy_from(g.data, g.device), g.device) if old is None
                   else momentum * old + g)
            g = buf
        change = lr * g
        # the write (p -= change) keeps p's dtype; refuse another one here, before any
        # write, not half-way through them (say, a momentum buffer of another dtype)
        if change.dtype != p.dtype:
            raise DTypeError(f"SGD.step: parameter {i} has dtype {p.dtype} but its update "
                             f"{change.dtype}; no parameter was changed")
        return change, buf


def _check_writable(i: int, p: Tensor) -> None:
    """Refuse, before anything is written, a parameter whose array is read-only."""
    if isinstance(p.data, np.generic):  # a 0-d result held as a NumPy scalar: its flags
        return  # say read-only, but the in-place write replaces it with a 0-d array
    flags = getattr(p.data, "flags", None)
    if flags is not None and not getattr(flags, "writeable", True):
        raise ValueError(f"SGD.step: parameter {i} (shape {p.shape}) lives in a read-only "
                         f"array, so it cannot be updated in place; no parameter was changed")


def _checked_grad(i: int, p: Tensor) -> Tensor:
    g = p.grad
    if not isinstance(g, Tensor):
        raise TypeError(f"SGD.step: the gradient of parameter {i} is a {type(g).__name__}, "
                        f"not a Tensor")
    if g.shape != p.shape:
        raise ShapeError(f"SGD.step: parameter {i} has shape {p.shape} but its gradient "
                         f"has shape {g.shape}; no parameter was changed")
    if g.dtype != p.dtype:
        raise DTypeError(f"SGD.step: parameter {i} has dtype {p.dtype} but its gradient "
                         f"{g.dtype}; no parameter was changed")
    if g.device is not p.device:
        raise DeviceError(f"SGD.step: parameter {i} lives on {p.device.name} but its "
                          f"gradient on {g.device.name}; no parameter was changed")
    return g.detach()
