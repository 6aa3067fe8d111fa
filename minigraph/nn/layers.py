"""Layers: ``Linear``, ``ReLU``, ``Tanh``, with PyTorch's names, shapes and initialisation.

Each forward is one or two minigraph calls, so a layer works on whatever flows in: eager
tensors (computed now, recorded on the tape), graph nodes (a node is added to the
current graph; the parameters, being tensors, become constants of the graph, or
placeholders with ``nn.functional_call``), and the other interpreters of ``bind``.

Initial values are drawn from a NumPy generator: ``seed=`` gives a layer its own; without
it layers draw from the package generator, which ``nn.manual_seed`` resets. Like
PyTorch's default generator it starts from a fixed seed, so a script gives the same
weights every time it runs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np  # initial values are drawn on the host

from ..errors import ShapeError
from ..ops import elementwise as E
from ..ops import nn as NN
from ..ops import shape_rules as S
from ..ops.primitive import names_user_line
from ..ops.shape_rules import input_shape
from ..tensor import tensor
from .module import Module

_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Restart the generator that layers without a ``seed=`` draw their weights from."""
    global _generator
    _generator = np.random.default_rng(_seed("manual_seed", seed))


def _rng(seed: int | None) -> np.random.Generator:
    return _generator if seed is None else np.random.default_rng(_seed("Linear", seed))


def _seed(who: str, seed: Any) -> int:
    """``seed`` as NumPy's generator takes it, an int in 0 .. 2**64 - 1. Every seed
    PyTorch takes is taken, -2**63 .. 2**64 - 1, a negative one as PyTorch maps it, to
    its 64-bit two's complement (``manual_seed(-1)`` is ``manual_seed(2**64 - 1)``).
    What is not an integer is refused, naming ``who``: None would seed NumPy from the
    operating system's entropy, other weights on every run; 1.5 and True are no seeds."""
    n = S.integer(who, "seed", seed)
    if not -2 ** 63 <= n < 2 ** 64:
        raise ValueError(f"{who}: seed must lie in -2**63 .. 2**64 - 1 (PyTorch's range), "
                         f"got {n}")
    return n % 2 ** 64


class Linear(Module):
    """``y = x @ weight.T + bias``, with ``weight`` of shape (out_features, in_features).

    The layout and the initialisation are PyTorch's: every weight and bias entry is
    drawn uniformly from [-1/sqrt(in_features), 1/sqrt(in_features)].
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: str = "float64", device: Any = None, seed: int | None = None):
        super().__init__()
        for what, n in (("in_features", in_features), ("out_features", out_features)):
            # (NumPy's integers too, as PyTorch takes them; a bool is no size, though
            # Python counts it an int: Linear(True, 2) failed inside NumPy's generator)
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"Linear: {what} must be a positive int, got {n!r}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        rng, bound = _rng(seed), 1.0 / math.sqrt(self.in_features)
        w = rng.uniform(-bound, bound, size=(self.out_features, self.in_features))
        self.weight = tensor(w, dtype, device, requires_grad=True)
        b = rng.uniform(-bound, bound, size=(self.out_features,)) if bias else None
        self.bias = tensor(b, dtype, device, requires_grad=True) if bias else None

    @names_user_line  # (a wrong width in a graph names the user's line)
    def forward(self, x: Any) -> Any:
        # (a nested list's shape too; None: a graph input of any shape; a None or a str
        # is refused, by type)
        shape = input_shape("Linear", "input", x)
        if shape is not None and (len(shape) == 0 or shape[-1] != self.in_features):
            raise ShapeError(f"{self!r}: the input has shape {tuple(shape)}; its last "
                             f"dimension must be in_features={self.in_features}")
        # Module.__setattr__ takes ``layer.weight = None`` (as PyTorch does), but the layer
        # cannot run without a weight; None.T would fail naming neither Linear nor weight
        if self.weight is None:
            raise TypeError(f"{self!r}: its parameter 'weight' is None, so it cannot run; "
                            f"assign a tensor of shape ({self.out_features}, "
                            f"{self.in_features}) to it (only the bias may be None)")
        y = x @ self.weight.T
        if self.bias is None:
            return y
        # The bias is added into x @ weight.T and may not widen it (PyTorch's rule): an
        # assigned weight of shape (1, in_features) and a bias of shape (out_features,)
        # would broadcast to the expected shape, every column silently the same product
        ys, bs = getattr(y, "shape", None), getattr(self.bias, "shape", None)
        if ys is None or bs is None:  # (a graph's value of a shape known when it runs:
            # compared then, as a loss compares its arguments: ops/nn.py check_same_shape)
            return NN.check_same_shape("Linear", ("x @ weight.T + bias", "x @ weight.T"),
                                       y + self.bias, y)
        if not _fits_into(tuple(ys), tuple(bs)):
            ws = getattr(self.weight, "shape", None)
            raise ShapeError(f"{self!r}: a bias of shape {tuple(bs)} cannot be added into "
                             f"x @ weight.T, of shape {tuple(ys)} (weight of shape {ws}), "
                             f"without changing its shape; give the weight and the bias "
                             f"as many rows")
        return y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


def _fits_into(shape: tuple[int, ...], bias: tuple[int, ...]) -> bool:
    """Whether a value of shape ``bias`` broadcasts to ``shape`` itself, not a larger
    shape."""
    try:
        return np.broadcast_shapes(shape, bias) == shape
    except ValueError:  # (no common shape at all)
        return False


class ReLU(Module):
    """``max(x, 0)`` elementwise."""

    def forward(self, x: Any) -> Any:
        return E.relu(x)


class Tanh(Module):
    """``tanh(x)`` elementwise."""

    def forward(self, x: Any) -> Any:
        return E.tanh(x)
