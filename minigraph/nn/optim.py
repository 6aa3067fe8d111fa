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

``state_dict()`` and ``load_state_dict(sd)`` take the momentum buffers and the
hyperparameters out and back in (PyTorch's layout), so that a run resumed from a
checkpoint continues exactly as the uninterrupted one would.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Mapping, cast

import numpy as np

from ..autodiff.tape import no_grad
from ..errors import DeviceError, DTypeError, ShapeError
from ..tensor import Tensor
from .module import StateDictError


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
        # checked here, not at the first step()
        self.lr = _hyperparameter("SGD", "lr", lr)
        self.momentum = _hyperparameter("SGD", "momentum", momentum)
        self.weight_decay = _hyperparameter("SGD", "weight_decay", weight_decay)
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

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state, in ``torch.optim.SGD``'s layout::

            {"state": {0: {"momentum_buffer": <tensor>}, 1: {...}},  # by parameter index
             "param_groups": [{"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0,
                               "params": [0, 1]}]}

        A parameter has a momentum buffer once a step with momentum has updated it. The
        buffers are copies: later steps do not change a state dict you took, and changing
        it does not change the optimizer. There is one parameter group (this SGD has one
        set of hyperparameters) and no dampening, nesterov or maximize (not implemented).

        ``mg.save`` stores a flat dict of name -> array, and refuses this nested one (its
        values include dicts and floats). To keep the buffers in a file, save them by
        index, and rebuild the optimizer with the same hyperparameters, as you rebuild
        the model::

            state = opt.state_dict()["state"]
            mg.save({str(i): s["momentum_buffer"] for i, s in state.items()}, "sgd.npz")
            ...
            opt = nn.SGD(model.parameters(), lr=0.1, momentum=0.9)
            sd = opt.state_dict()
            sd["state"] = {int(i): {"momentum_buffer": b}
                           for i, b in mg.load("sgd.npz").items()}
            opt.load_state_dict(sd)
        """
        return {"state": {i: {"momentum_buffer": _copy(self.state[i])}
                          for i in sorted(self.state)},
                "param_groups": [{"lr": self.lr, "momentum": self.momentum,
                                  "weight_decay": self.weight_decay,
                                  "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take the hyperparameters and momentum buffers of ``state_dict``, a dict in the
        layout ``state_dict()`` gives, as PyTorch's ``load_state_dict`` does.

        Everything is checked before anything changes, so a refusal leaves the optimizer
        as it was: the keys (those of ``state_dict()``, no others), the hyperparameters
        (as the constructor checks them), the parameter list (``[0, 1, ...]``, one index
        per parameter of this optimizer), and every buffer (a tensor with its parameter's
        shape and dtype; PyTorch would convert another dtype, here it is refused). The
        buffers are copied in, onto their parameters' devices: the dict stays
        independent of the optimizer. Parameters without a buffer in ``state_dict``
        start their momentum afresh, as on a first step.
        """
        who = "SGD.load_state_dict"
        _check_keys(who, "the state dict", state_dict, ("state", "param_groups"))
        groups, n = state_dict["param_groups"], len(self.params)
        if not isinstance(groups, (list, tuple)) or len(groups) != 1:
            raise StateDictError(f"{who}: 'param_groups' must be a list of one group (SGD "
                                 f"has one set of hyperparameters), got {groups!r}")
        group = groups[0]
        if isinstance(group, Mapping):  # (torch.optim.SGD's options at their defaults,
            # which this SGD computes as they say: a state dict of torch's layout loads)
            others = {k: v for k, v in group.items() if not _at_default(k, v)}
            group = others if len(others) < len(group) else group
        _check_keys(who, "the parameter group", group,
                    ("lr", "momentum", "weight_decay", "params"))
        lr, momentum, weight_decay = (_hyperparameter(who, what, group[what])
                                      for what in ("lr", "momentum", "weight_decay"))
        indices = group["params"]
        if not isinstance(indices, (list, tuple)) or list(indices) != list(range(n)):
            raise StateDictError(f"{who}: the group's 'params' must be "
                                 f"[0, 1, ..., {n - 1}], one index for each of this "
                                 f"optimizer's {n} parameters, got {indices!r}")
        state = state_dict["state"]
        if not isinstance(state, Mapping):
            raise TypeError(f"{who}: 'state' must be a dict of parameter index -> "
                            f"{{'momentum_buffer': tensor}}, got a {type(state).__name__}")
        buffers: dict[int, Tensor] = {}
        for i, entry in state.items():
            if isinstance(i, np.integer):  # (NumPy's index is an index: not a bool)
                i = int(i)
            if type(i) is not int or not 0 <= i < n:  # (a bool is no index)
                raise StateDictError(f"{who}: the key {i!r} ({type(i).__name__}) of "
                                     f"'state' is not a parameter index, an int in "
                                     f"0 .. {n - 1} (mg.load gives str keys: int(key))")
            _check_keys(who, f"state[{i}]", entry, ("momentum_buffer",))
            buffers[i] = _checked_buffer(who, i, entry["momentum_buffer"], self.params[i])
        # nothing above failed: now change the optimizer
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.state = buffers

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
            buf = _copy(g) if old is None else momentum * old + g
            g = buf
        change = lr * g
        # the write (p -= change) keeps p's dtype; refuse another one here, before any
        # write, not half-way through them (say, a momentum buffer of another dtype)
        if change.dtype != p.dtype:
            raise DTypeError(f"SGD.step: parameter {i} has dtype {p.dtype} but its update "
                             f"{change.dtype}; no parameter was changed")
        return change, buf


# torch.optim.SGD's options that this SGD does not have, at the values that make it
# compute what this one does (any other value is refused, as an unexpected key)
_TORCH_DEFAULTS: dict[str, Any] = {"dampening": 0, "nesterov": False, "maximize": False,
                                   "foreach": None, "differentiable": False, "fused": None}


def _at_default(key: str, value: Any) -> bool:
    """Whether ``key`` is one of torch's options above, at its default (0 or 0.0; a
    bool for a bool, None for None)."""
    if key not in _TORCH_DEFAULTS:
        return False
    default = _TORCH_DEFAULTS[key]
    if default is None or isinstance(default, bool):
        return value is default
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and value == default


def _hyperparameter(who: str, what: str, v: Any) -> Any:
    """``v``, checked to be a hyperparameter: a real number >= 0. A str, None or an array
    is refused (np.float64 is a numbers.Real; a bool is refused as a likely slip)."""
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        raise TypeError(f"{who}: {what} must be a real number, got {type(v).__name__} "
                        f"{v!r}")
    if not float(v) >= 0.0:  # (NaN too)
        raise ValueError(f"{who}: {what} must be >= 0, got {v}")
    return v


def _check_keys(who: str, what: str, d: Any, keys: tuple[str, ...]) -> None:
    """Refuse ``d`` unless it is a dict with exactly ``keys``, naming what is amiss."""
    if not isinstance(d, Mapping):
        raise TypeError(f"{who}: {what} must be a dict with the keys {list(keys)}, "
                        f"got a {type(d).__name__}")
    missing = [k for k in keys if k not in d]
    unexpected = [k for k in d if k not in keys]
    if missing or unexpected:
        raise StateDictError(f"{who}: {what} must have the keys {list(keys)}; missing: "
                             f"{missing}, unexpected: {unexpected} (SGD has no other "
                             f"state or hyperparameters)")


def _checked_buffer(who: str, i: int, buf: Any, p: Tensor) -> Tensor:
    """A copy of ``buf`` on ``p``'s device, checked to be a momentum buffer for ``p``."""
    _same_kind(who, i, "momentum buffer", buf, p, StateDictError, StateDictError)
    return Tensor(p.device.copy_from(buf.data, buf.device), p.device)


def _same_kind(who: str, i: int, what: str, t: Any, p: Tensor, shape_error: type,
               dtype_error: type) -> None:
    """Refuse ``t`` (parameter i's gradient or momentum buffer) unless it is a tensor of
    ``p``'s shape and dtype: a step would otherwise change p's shape or dtype, or fail
    half-way through the parameters."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{who}: the {what} of parameter {i} is a {type(t).__name__}, "
                        f"not a minigraph Tensor")
    if t.shape != p.shape:
        raise shape_error(f"{who}: parameter {i} has shape {p.shape} but its {what} has "
                          f"shape {t.shape}; no parameter was changed")
    if t.dtype != p.dtype:
        raise dtype_error(f"{who}: parameter {i} has dtype {p.dtype} but its {what} "
                          f"{t.dtype}; no parameter was changed")


def _copy(t: Tensor) -> Tensor:
    """A tensor with its own copy of ``t``'s values, on ``t``'s device, with no gradient."""
    return Tensor(t.device.copy_from(t.data, t.device), t.device)


def _check_writable(i: int, p: Tensor) -> None:
    """Refuse, before anything is written, a parameter whose array is read-only."""
    if isinstance(p.data, np.generic):  # a 0-d result held as a NumPy scalar: its flags
        return  # say read-only, but the in-place write replaces it with a 0-d array
    flags = getattr(p.data, "flags", None)
    if flags is not None and not getattr(flags, "writeable", True):
        raise ValueError(f"SGD.step: parameter {i} (shape {p.shape}) lives in a read-only "
                         f"array, so it cannot be updated in place; no parameter was changed")


def _checked_grad(i: int, p: Tensor) -> Tensor:
    g = cast(Tensor, p.grad)  # (a tensor, or refused just below)
    _same_kind("SGD.step", i, "gradient", g, p, ShapeError, DTypeError)
    if g.device is not p.device:
        raise DeviceError(f"SGD.step: parameter {i} lives on {p.device.name} but its "
                          f"gradient on {g.device.name}; no parameter was changed")
    return g.detach()
