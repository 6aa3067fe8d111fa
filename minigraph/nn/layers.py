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
from ..ops.shape_rules import shape_of
from ..tensor import tensor
from .module import Module

_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Restart the generator that layers without a ``seed=`` draw their weights from."""
    global _generator
    _generator = np.random.default_rng(seed)


def _rng(seed: int | None) -> np.random.Generator:
    return _generator if seed is None else np.random.default_rng(seed)


class Linear(Module):
    """``y = x @ weight.T + bias``, with ``weight`` of shape (out_features, in_features).

    The layout and the initialisation are PyTorch's: every weight and bias entry is
    drawn uniformly from [-1/sqrt(in_features), 1/sqrt(in_features)].
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: str = "float64", device: Any = None, seed: int | None = None):
        super().__init__()
        for what, n in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"Linear: {what} must be a positive int, got {n!r}")
        self.in_features, self.out_features = in_features, out_features
        rng, bound = _rng(seed), 1.0 / math.sqrt(in_features)
        w = rng.uniform(-bound, bound, size=(out_features, in_features))
        self.weight = tensor(w, dtype, device, requires_grad=True)
        b = rng.uniform(-bound, bound, size=(out_features,)) if bias else None
        self.bias = tensor(b, dtype, device, requires_grad=True) if bias else None

    def forward(self, x: Any) -> Any:
        shape = shape_of(x)  # (a nested list's too; None: a graph input of any shape)
        if shape is not None and (len(shape) == 0 or shape[-1] != self.in_features):
            raise ShapeError(f"{self!r}: the input has shape {tuple(shape)}; its last "
                             f"dimension must be in_features={self.in_features}")
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class ReLU(Module):
    """``max(x, 0)`` elementwise."""

    def forward(self, x: Any) -> Any:
        return E.relu(x)


class Tanh(Module):
    """``tanh(x)`` elementwise."""

    def forward(self, x: Any) -> Any:
        return E.tanh(x)
