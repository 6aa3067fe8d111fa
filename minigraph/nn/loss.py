"""Losses: ``CrossEntropyLoss`` and ``MSELoss`` (PyTorch's names and reductions).

``reduction="mean"`` (the default) averages over the batch, ``"sum"`` adds up. The mean
matters for gradient accumulation: the mean loss of a batch cut into microbatches of
sizes n_1, ..., n_m is the sum over microbatches of (n_k / N) times their mean loss, so a
pipeline weights each microbatch's loss by n_k / N (``parallel/pipeline.py``).
"""

from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from ..ops import nn as NN
from ..ops import reduce as R
from .module import Module

REDUCTIONS = ("mean", "sum")


class _Loss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"{type(self).__name__}: reduction must be 'mean' or 'sum', "
                             f"got {reduction!r}")
        self.reduction = reduction

    def extra_repr(self) -> str:
        return "" if self.reduction == "mean" else f"reduction={self.reduction!r}"


class CrossEntropyLoss(_Loss):
    """Softmax cross-entropy of logits (N, C) against integer labels (N,):
    ``mg.cross_entropy``, which is stable and has the short gradient (p - onehot) / N."""

    def forward(self, logits: Any, labels: Any) -> Any:
        loss = NN.cross_entropy(logits, labels)
        return loss if self.reduction == "mean" else loss * logits.shape[0]


class MSELoss(_Loss):
    """The mean (or sum) of squared differences; both arguments have the same shape."""

    def forward(self, prediction: Any, target: Any) -> Any:
        a, b = getattr(prediction, "shape", None), getattr(target, "shape", None)
        if a is not None and b is not None and tuple(a) != tuple(b):
            raise ShapeError(f"MSELoss: the prediction has shape {tuple(a)} and the target "
                             f"{tuple(b)}; they must be equal (no broadcasting here)")
        d = prediction - target
        return R.mean(d * d) if self.reduction == "mean" else R.sum(d * d)
