"""Model parallelism: a classifier layer sharded by classes across devices.

With very many classes, the last layer's weight (features x classes) and its logits
(batch x classes) may not fit one device. ``ShardedLinear`` splits the *classes*: device
k holds the columns of classes ``[offset_k, offset_k + C_k)`` and computes only their
logits.

``parallel_cross_entropy`` then computes the softmax cross-entropy without ever
gathering the logits on one device. The stable form subtracts the row maximum M:

    loss_row = log(sum_k sum_j exp(z_kj - M)) - (z_label - M)

so each device computes its rows' maximum, the maxima meet (N numbers per device),
each device computes its sum of exp(z - M), the sums meet (N numbers per device), and
the label's logit comes from the device that holds it. Only vectors of length N cross
devices, never N x C. The gradient on each shard is (p - y) / N, computed where the
shard lives. M is a constant for the gradient (the loss does not depend on it), so it
is taken through ``stop_gradient``. The label's logit is shifted by M like the others:
``log(...) + M - z_label`` subtracts two nearly equal numbers where the loss is small
(float32 logits [50, 35, 32, 30] of class 0 gave a loss of 0, not 3.6e-7).
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np  # the initial weights are drawn on the host

from ..errors import DTypeError, ShapeError
from ..graph.graph import Node
from ..ops import copy as C
from ..ops import elementwise as E
from ..ops import nn as NN
from ..ops import reduce as R
from ..tensor import Tensor, host_values, tensor
from .data_parallel import _check_devices


class ShardedLinear:
    """``y = x @ W + b`` with the output classes split across ``devices``."""

    def __init__(self, in_features: int, out_features: int, devices: Sequence[str],
                 dtype: str = "float64", seed: int = 0):
        devices = _check_devices(devices, "ShardedLinear")
        if not 1 <= len(devices) <= out_features:  # (a shard of no class has no maximum)
            raise ValueError(f"ShardedLinear: {out_features} output classes cannot be split "
                             f"over {len(devices)} devices; each shard needs at least one")
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
        return np.concatenate([host_values(w) for w in self.weights], axis=1)

    def full_bias(self) -> np.ndarray:
        return np.concatenate([host_values(b) for b in self.biases])


def parallel_cross_entropy(shards: Sequence[Tensor], labels: Any) -> Tensor:
    """Mean softmax cross-entropy over class-sharded logits, without concatenating them.

    ``shards[k]`` has shape (N, C_k) on its own device; ``labels`` are global class
    indices. The loss lives on the first shard's device. The shards may be tensors or
    graph nodes (then the loss is a node, and a ``Session`` run of it counts in
    ``last_run.bytes_moved`` what crossed devices).
    """
    for k, s in enumerate(shards):  # (tuple(None) raised Python's TypeError)
        if s.shape is None:
            raise ShapeError(f"parallel_cross_entropy: shards[{k}] has a shape unknown until "
                             f"the graph runs; the offsets of the shards' classes need "
                             f"every shard's shape: give the placeholder a shape "
                             f"(mg.placeholder((N, classes), ...))")
    shapes = [tuple(s.shape) for s in shards]
    if any(len(shape) != 2 for shape in shapes):
        raise ShapeError(f"parallel_cross_entropy: every shard is 2-d, (N examples, its "
                         f"classes), got shapes {shapes}")
    if not shards or any(s.shape[1] == 0 for s in shards):
        raise ValueError(f"parallel_cross_entropy: every shard needs at least one class, "
                         f"got shapes {[tuple(s.shape) for s in shards]}")
    if len({shape[0] for shape in shapes}) != 1:  # (the row maxima of shards of other
        # lengths met in maximum(), whose error named no shard)
        raise ShapeError(f"parallel_cross_entropy: every shard holds the same N examples "
                         f"(its own classes), got shapes {shapes}")
    home = shards[0].device
    labels = labels if isinstance(labels, (Tensor, Node)) else tensor(labels)
    # Labels of another shape would broadcast against the rows (one label for all of
    # them), and bool labels would pass for classes 0 and 1: refused, as cross_entropy does.
    NN._check_labels("parallel_cross_entropy", labels)
    if labels.shape is None or tuple(labels.shape) != (shapes[0][0],):
        # (a shape unknown until the run failed below, in an op that named no labels)
        got = f"shape {tuple(labels.shape)}" if labels.shape is not None else \
            "a shape unknown until the graph runs"
        fix = "" if labels.shape is not None else "; give the placeholder that shape"
        raise ShapeError(f"parallel_cross_entropy: labels must have shape (N,) = "
                         f"({shapes[0][0]},), one class per example, got {got} (shards "
                         f"of shapes {shapes}){fix}")
    offsets = np.cumsum([0] + [s.shape[1] for s in shards[:-1]])
    classes = int(offsets[-1]) + shards[-1].shape[1]
    if isinstance(labels, Tensor):  # (a graph's are checked when it runs: _shard_one_hot)
        NN.check_label_range(np, labels.numpy(), classes, "parallel_cross_entropy")
    # 1. the row maxima meet on the home device; the global maximum goes back
    m = None
    for s in shards:
        local = C.stop_gradient(R.max(s, axis=1)).to(home)
        m = local if m is None else E.maximum(m, local)
    # 2. each device: sum of exp(z - M) over its classes, and its part of z[label]
    total, picked = None, None
    assert m is not None  # shards is not empty (shards[0] above)
    for s, offset in zip(shards, offsets):
        m_here = m.to(s.device)
        sumexp = R.sum(E.exp(s - m_here.reshape(-1, 1)), axis=1)
        holds = _shard_one_hot(labels.to(s.device), int(offset), s.shape[1], classes)
        # The label's shifted logit z - M is picked, not multiplied by a one-hot row:
        # -inf (a masked class) times 0 is nan, which made the whole loss nan.
        mine = R.sum(E.where(holds, s - m_here.reshape(-1, 1), 0.0), axis=1)
        total = sumexp.to(home) if total is None else total + sumexp.to(home)
        picked = mine.to(home) if picked is None else picked + mine.to(home)
    return R.mean(E.log(total) - picked)


def _shard_one_hot(labels: Any, offset: int, width: int, classes: int) -> Any:
    """The one-hot rows, as booleans, of the classes ``offset .. offset + width - 1`` that
    one shard holds; a row whose label is another shard's is all False. A label of no
    shard (negative, or ``classes`` or more) reaches this shard's ``one_hot`` as it is, out
    of its range too, so that every shard's ``one_hot`` refuses it: an error, not a row
    that silently matches no class. (Only the first or the last shard's refused it once:
    a gradient of another shard's logits does not read that node, so a graph pruned the
    check away and the bad row's gradient was the softmax alone.)"""
    mine = _in_range(labels, offset, offset + width)
    # this shard's label: its column; another shard's: 0 (masked below); none's: itself
    index = E.where(mine, labels - offset, E.where(_in_range(labels, 0, classes), 0, labels))
    return E.where(mine.reshape(-1, 1), NN.one_hot(index, width, "bool"), False)


def _in_range(x: Any, low: int, high: int) -> Any:
    """``low <= x < high``, elementwise, as booleans."""
    return E.where(E.greater_equal(x, low), E.less(x, high), False)


class LayerSplitMLP:
    """An MLP split *by layer* across devices, trained in graph mode.

    ``devices`` lists where the layers go: with ``["rank:0/cpu", "rank:1/cpu"]`` and four
    layers, layers 0-1 run on rank 0 and layers 2-3 on rank 1 (``"cpu"``, ``"cpu:1"`` split
    them across the devices of one process instead). The class builds one graph: the
    forward pass, the mean cross-entropy, and ``mg.gradients`` of it; partitioning turns
    the activation that crosses the split into a Send/Recv pair, and its gradient into
    another one going back. Parameters are fed as placeholders, so every rank feeds the
    same values and every rank gets every gradient back from ``Session.run``: each rank
    then takes the same SGD step on its host copy, and the copies stay equal.

    Every rank builds it with the same arguments (the seed makes the same weights).
    """

    def __init__(self, sizes: Sequence[int], devices: Sequence[str], batch: int,
                 dtype: str = "float64", seed: int = 0):
        from ..device import device as device_scope
        from ..graph.gradients import gradients
        from ..graph.graph import Graph, placeholder
        from ..ops import linalg as L
        from ..runtime.session import Session

        devices = _check_devices(devices, "LayerSplitMLP")
        if len(sizes) < 2 or not devices:
            raise ValueError(f"LayerSplitMLP: sizes lists the input width and each layer's "
                             f"output (at least two numbers, got {list(sizes)}), on at least "
                             f"one device (got {list(devices)})")
        if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1
               for n in sizes):  # (NumPy's "negative dimensions are not allowed" named none)
            raise ValueError(f"LayerSplitMLP: sizes must be ints >= 1 (the input width and "
                             f"each layer's output), got {list(sizes)}")
        if dtype not in ("float32", "float64"):  # (an integer placeholder has no gradient:
            # step() fetched None)
            raise DTypeError(f"LayerSplitMLP: dtype must be float32 or float64, the dtypes "
                             f"that have gradients, got {dtype!r}")
        layers = len(sizes) - 1
        if len(devices) > layers:  # (the extra devices were left out without a word)
            raise ValueError(f"LayerSplitMLP: {layers} layer(s) cannot be split over "
                             f"{len(devices)} devices {list(devices)}; each device needs at "
                             f"least one layer: give at most {layers} devices")
        rng = np.random.default_rng(seed)
        self.params = []  # host arrays: W0, b0, W1, b1, ...
        for i in range(layers):
            self.params.append(rng.normal(0, 1 / np.sqrt(sizes[i]), (sizes[i], sizes[i + 1]))
                               .astype(dtype))
            self.params.append(np.zeros(sizes[i + 1], dtype=dtype))
        self.placement = [devices[i * len(devices) // layers] for i in range(layers)]
        with Graph("layer-split-mlp") as g:
            with device_scope(self.placement[0]):
                self.x = placeholder((batch, sizes[0]), dtype, name="x")
            self.slots = []
            h = self.x
            for i, dev in enumerate(self.placement):
                with device_scope(dev):
                    w = placeholder((sizes[i], sizes[i + 1]), dtype, name=f"w{i}")
                    b = placeholder((sizes[i + 1],), dtype, name=f"b{i}")
                    self.slots += [w, b]
                    h = L.matmul(h, w) + b
                    if i < layers - 1:
                        h = E.tanh(h)
            with device_scope(self.placement[-1]):
                self.labels = placeholder((batch,), "int64", name="labels")
                self.loss = NN.cross_entropy(h, self.labels)
            self.grads = gradients(self.loss, self.slots)
        self.graph = g
        self.session = Session(g)

    def step(self, x: Any, labels: Any, lr: float) -> float:
        """One SGD step on the batch; returns the loss before the step. All or nothing,
        as ``nn.SGD.step``: ``lr`` is checked and every change computed before the first
        parameter is written (an lr that broadcast against some parameters and not others
        left the model half-stepped)."""
        # (nn.SGD's check, and finite: an inf or nan lr would write inf or nan everywhere)
        if not isinstance(lr, numbers.Real) or isinstance(lr, bool):
            raise TypeError(f"LayerSplitMLP.step: lr must be a real number, got "
                            f"{type(lr).__name__} {lr!r}")
        if not 0.0 <= lr < np.inf:
            raise ValueError(f"LayerSplitMLP.step: lr must be a finite number >= 0, got {lr}")
        feeds = {self.x: x, self.labels: labels, **dict(zip(self.slots, self.params))}
        loss, grads = self.session.run([self.loss, self.grads], feeds)
        changes = [lr * g for g in grads]
        for p, change in zip(self.params, changes):
            p -= change
        return float(loss)
