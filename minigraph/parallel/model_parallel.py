"""Model parallelism: a classifier layer sharded by classes across devices.

With very many classes, the last layer's weight (features x classes) and its logits
(batch x classes) may not fit one device. ``ShardedLinear`` splits the *classes*: device
k holds the columns of classes ``[offset_k, offset_k + C_k)`` and computes only their
logits.

``parallel_cross_entropy`` then computes the softmax cross-entropy without ever
gathering the logits on one device. The stable form subtracts the row maximum M:

    loss_row = log(sum_k sum_j exp(z_kj - M)) + M - z_label

so each device computes its rows' maximum, the maxima meet (N numbers per device),
each device computes its sum of exp(z - M), the sums meet (N numbers per device), and
the label's logit comes from the device that holds it. Only vectors of length N cross
devices, never N x C. The gradient on each shard is (p - y) / N, computed where the
shard lives. M is a constant for the gradient (the loss does not depend on it), so it
is taken through ``stop_gradient``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np  # the initial weights are drawn on the host

from ..ops import copy as C
from ..ops import elementwise as E
from ..ops import nn as NN
from ..ops import reduce as R
from ..tensor import Tensor, tensor


class ShardedLinear:
    """``y = x @ W + b`` with the output classes split across ``devices``."""

    def __init__(self, in_features: int, out_features: int, devices: Sequence[str],
                 dtype: str = "float64", seed: int = 0):
        rng = np.random.default_rng(seed)
        w = rng.normal(0, 1 / np.sqrt(in_features), size=(in_features, out_features))
        bounds = [out_features * k // len(devices) for k in range(len(devices) + 1)]
        self.devices = list(devices)
        self.offsets = bounds[:-1]
        self.weights = [tensor(w[:, bounds[k]:bounds[k + 1]], dtype, d, requires_grad=True)
                        for k, d in enumerate(devices)]
        self.biases = [tensor(np.zeros(bounds[k + 1] - bounds[k]), dtype, d, requires_grad=True)
                       for k, d in enumerate(devices)]

    def __call__(self, x: Tensor) -> list[Tensor]:
        """The logits, one shard per device (x is copied to every device)."""
        return [x.to(d) @ w + b for d, w, b in zip(self.devices, self.weights, self.biases)]

    def parameters(self) -> list[Tensor]:
        return self.weights + self.biases

    def full_weight(self) -> np.ndarray:
        """The whole weight matrix on the host (for checking against one device)."""
        return np.concatenate([w.numpy() for w in self.weights], axis=1)

    def full_bias(self) -> np.ndarray:
        return np.concatenate([b.numpy() for b in self.biases])


def parallel_cross_entropy(shards: Sequence[Tensor], labels: Any) -> Tensor:
    """Mean softmax cross-entropy over class-sharded logits, without concatenating them.

    ``shards[k]`` has shape (N, C_k) on its own device; ``labels`` are global class
    indices. The loss lives on the first shard's device.
    """
    home = shards[0].device
    labels = labels if isinstance(labels, Tensor) else tensor(labels)
    offsets = np.cumsum([0] + [s.shape[1] for s in shards[:-1]])
    # 1. the row maxima meet on the home device; the global maximum goes back
    m = None
    for s in shards:
        local = C.stop_gradient(R.max(s, axis=1)).to(home)
        m = local if m is None else E.maximum(m, local)
    # 2. each device: sum of exp(z - M) over its classes, and its part of z[label]
    total, picked = None, None
    for s, offset in zip(shards, offsets):
        m_here = m.to(s.device)
        sumexp = R.sum(E.exp(s - m_here.reshape(-1, 1)), axis=1)
        local_labels = labels.to(s.device) - int(offset)  # outside this shard: no match
        onehot = NN.one_hot(local_labels, s.shape[1], s.dtype)
        mine = R.sum(s * onehot, axis=1)
        total = sumexp.to(home) if total is None else total + sumexp.to(home)
        picked = mine.to(home) if picked is None else picked + mine.to(home)
    return R.mean(E.log(total) + m - picked)
