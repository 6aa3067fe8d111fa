"""Losses: ``CrossEntropyLoss`` and ``MSELoss`` (PyTorch's names and reductions).

``reduction="mean"`` (the default) averages over the batch, ``"sum"`` adds up. The mean
matters for gradient accumulation: the mean loss of a batch cut into microbatches of
sizes n_1, ..., n_m is the sum over microbatches of (n_k / N) times their mean loss, so a
pipeline weights each microbatch's loss by n_k / N (``parallel/pipeline.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ops import elementwise as E
from ..ops import nn as NN
from ..ops import reduce as R
from ..ops.shape_rules import input_shape
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
        if self.reduction == "mean":
            return NN.cross_entropy(logits, labels)
        # The sum is N times the mean. input_shape reads a nested list's shape too (and
        # refuses a None or a str); a shape that is unknown (None) or not (N, C) is
        # refused by cross_entropy, by name.
        shape = input_shape("CrossEntropyLoss", "logits", logits)
        if shape is not None and len(shape) == 2 and shape[0] == 0:
            # an empty batch: its sum is 0 (PyTorch's), but N * mean would be 0 * (0/0),
            # nan. cross_entropy still checks the shapes and labels (its unused 0/0
            # silenced); the sum of the empty logits is a 0 of their dtype and device.
            with np.errstate(invalid="ignore"):
                NN.cross_entropy(logits, labels)
            return R.sum(logits)
        mean = NN.cross_entropy(logits, labels)  # (checks first: below, shape is (N, C))
        return mean * shape[0]


class MSELoss(_Loss):
    """The mean (or sum) of squared differences; both arguments have the same shape."""

    def forward(self, prediction: Any, target: Any) -> Any:
        # The shapes must be equal: now, or when a graph runs if one is unknown until then
        prediction = NN.check_same_shape("MSELoss", ("prediction", "target"),
                                         prediction, target)
        d = E.sub(prediction, target)  # (not '-': a list minus a list is not defined)
        return R.mean(d * d) if self.reduction == "mean" else R.sum(d * d)
