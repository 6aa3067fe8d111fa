"""Cheap or expensive: how the scheduler classifies a node [3.1.4].

The scheduler runs a *cheap* node inline, on the thread that made it ready, because
handing it to another thread would cost more than running it; an *expensive* node goes
to the thread pool, where it can run beside others. The classes:

* static, by op and size (``static_cost``): shape changes and indexing are cheap; ops the
  primitive table marks expensive (matmul, reductions, softmax, ...) are expensive; an
  elementwise op is cheap on a small tensor and expensive on a large one;
* measured (``CostModel``), like TensorFlow's kernel statistics: a moving average of each
  node's run time, which moves a node below ``CHEAP_SECONDS`` to cheap and above it to
  expensive. The first ``WARMUP`` runs of a node are not counted: they pay one-time
  costs (first calls, caches) that say nothing about the node's steady cost.

All thresholds live here, in one place.
"""

from __future__ import annotations

import math
import threading
from typing import Any

LARGE_ELEMENTS = 1 << 16          # elementwise ops on at least this many elements are expensive
CHEAP_SECONDS = 20e-6             # measured: a node faster than 20 µs is cheap
SMOOTHING = 0.2                   # weight of the newest measurement in the moving average
WARMUP = 1                        # first measurements of a node, left out of its average

def static_cost(node: Any) -> str:
    """"cheap" or "expensive" from the op's cost class and the size of the result.

    Nodes without a primitive (Placeholder, Const, Variable, Assign, Send, Recv) and
    primitives whose table entry says ``cost="free"`` (reshape, indexing ...: no
    arithmetic) are cheap whatever their size."""
    if node.prim is None or node.prim.cost == "free":
        return "cheap"
    if node.prim.cost == "expensive":
        return "expensive"
    if node.shape is not None and math.prod(node.shape) >= LARGE_ELEMENTS:
        return "expensive"
    return "cheap"


class CostModel:
    """Measured costs: an exponential moving average of each node's run time."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.count: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, name: str, seconds: float) -> None:
        with self._lock:
            self.count[name] = self.count.get(name, 0) + 1
            if self.count[name] <= WARMUP:
                return
            old = self.seconds.get(name)
            self.seconds[name] = seconds if old is None else \
                (1 - SMOOTHING) * old + SMOOTHING * seconds

    def cost(self, node: Any) -> str:
        """The measured class once measured after the warm-up, the static class before."""
        if node.name not in self.seconds:
            return static_cost(node)
        return "cheap" if self.seconds[node.name] < CHEAP_SECONDS else "expensive"
