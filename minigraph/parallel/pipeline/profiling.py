"""Phase 1, profile: per layer, forward and backward time, activation and parameter bytes.

See the package docstring (``minigraph/parallel/pipeline/__init__.py``) for the whole picture.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from ...autodiff.tape import enable_grad
from ...nn.module import Module, Sequential
from ...tensor import Tensor, ones, tensor
from .common import PipelineError, _ITEMSIZE


@dataclass
class LayerCost:
    """One line of a profile: PipeDream's T_i (split in two), a_i and w_i."""

    name: str                 # "node3": PipeDream's node name (here: node<layer index>)
    desc: str                 # the layer, as it prints
    forward_time: float       # seconds
    backward_time: float      # seconds (gradients of the input and of the parameters)
    activation_bytes: int     # the output: what crosses to the next stage, and comes back
    parameter_bytes: int      # what a replicated stage has to synchronise

    @property
    def compute_time(self) -> float:
        """Forward plus backward: the cost the partitioner balances."""
        return self.forward_time + self.backward_time

    def to_text(self) -> str:
        """PipeDream's line: times in milliseconds, sizes in bytes."""
        return (f"{self.name} -- {self.desc} -- "
                f"forward_compute_time={self.forward_time * 1e3:.3f}, "
                f"backward_compute_time={self.backward_time * 1e3:.3f}, "
                f"activation_size={float(self.activation_bytes):.1f}, "
                f"parameter_size={float(self.parameter_bytes):.3f}")


class Profile:
    """The costs of the layers of a ``Sequential``, in order (index it like a list)."""

    def __init__(self, layers: Sequence[LayerCost]):
        self.layers = list(layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> LayerCost:
        return self.layers[i]

    def __iter__(self) -> Iterator[LayerCost]:
        return iter(self.layers)

    def compute_times(self) -> list[float]:
        return [c.compute_time for c in self.layers]

    # -- PipeDream's text form ----------------------------------------------------------
    def to_text(self) -> str:
        """One line per layer, then the edges of the chain (PipeDream's graph.txt)."""
        lines = [c.to_text() for c in self.layers]
        lines += [f"\t{a.name} -- {b.name}" for a, b in zip(self.layers, self.layers[1:])]
        return "\n".join(lines) + "\n"

    __str__ = to_text

    @classmethod
    def from_text(cls, text: str) -> "Profile":
        """Read the node lines of PipeDream's text form (edge lines are skipped; a list
        of activation sizes, as PipeDream writes for multi-output layers, is summed)."""
        layers = []
        for line in text.splitlines():
            parts = line.strip().split(" -- ")
            if len(parts) < 3 or "=" not in parts[-1]:
                continue  # an edge "node1 -- node2", or a blank line
            fields = dict(re.findall(r"(\w+)=(\[[^\]]*\]|[^,\s]+)", parts[-1]))
            layers.append(LayerCost(
                parts[0], " -- ".join(parts[1:-1]),
                float(fields["forward_compute_time"]) / 1e3,
                float(fields["backward_compute_time"]) / 1e3,
                round(sum(float(v) for v in fields["activation_size"].strip("[]").split(";"))),
                round(float(fields["parameter_size"]))))
        return cls(layers)

    # -- JSON -------------------------------------------------------------------------------
    def to_json(self, path: "str | Path | None" = None) -> str:
        """The profile as JSON text (seconds and bytes); also written to ``path`` if given."""
        text = json.dumps({"time_unit": "s", "size_unit": "bytes",
                           "layers": [asdict(c) for c in self.layers]}, indent=2) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text: str) -> "Profile":
        return cls([LayerCost(**entry) for entry in json.loads(text)["layers"]])

    def save(self, path: "str | Path") -> Path:
        """Write the profile; the suffix picks the form: ``.json`` or ``.txt`` (PipeDream)."""
        path = Path(path)
        if path.suffix not in (".json", ".txt"):
            raise ValueError(f"Profile.save: {path.name!r} should end in .json or .txt")
        path.write_text(self.to_json() if path.suffix == ".json" else self.to_text())
        return path

    @classmethod
    def load(cls, path: "str | Path") -> "Profile":
        path = Path(path)
        text = path.read_text()
        return cls.from_json(text) if path.suffix == ".json" else cls.from_text(text)

    def __repr__(self) -> str:
        return f"<Profile of {len(self)} layers, {sum(self.compute_times()) * 1e3:.3f} ms>"


def _check_sequential(model: Any, who: str) -> Sequential:
    if not isinstance(model, Sequential):
        raise TypeError(f"{who}: expected an mg.nn.Sequential (its layers are the units "
                        f"of a pipeline), got {type(model).__name__}")
    if len(model) == 0:
        raise PipelineError(f"{who}: the Sequential has no layers")
    return model


def _nbytes(t: Tensor) -> int:
    return t.size * _ITEMSIZE.get(t.dtype, 8)


def profile(model: Sequential, x: Any, repeat: int = 5) -> Profile:
    """Profile each layer of ``model`` on input ``x`` (a batch), eagerly, on one device.

    For layer i: the input is layer i-1's output (detached, so that only layer i is
    timed); the forward is timed with gradient recording on (as in training), the
    backward from a gradient of ones. One warm-up run, then the median of ``repeat``
    runs. The parameters' ``.grad`` are left as they were.
    """
    _check_sequential(model, "profile")
    if repeat < 1:
        raise ValueError(f"profile: repeat must be >= 1, got {repeat}")
    h = x if isinstance(x, Tensor) else tensor(x)
    costs = []
    with enable_grad():
        for i, layer in enumerate(model):
            cost, h = _profile_layer(i, layer, h.detach(), repeat)
            costs.append(cost)
    return Profile(costs)


def _profile_layer(i: int, layer: Module, x: Tensor, repeat: int) -> tuple[LayerCost, Tensor]:
    params = layer.parameters()
    saved = [p.grad for p in params]
    forward, backward = [], []
    try:
        for run in range(repeat + 1):  # run 0 warms up and is not counted
            inp = x.detach().requires_grad_() if x.dtype in ("float32", "float64") else x
            t0 = time.perf_counter()
            out = layer(inp)
            t1 = time.perf_counter()
            seed = ones(out.shape, out.dtype, out.device)
            t2 = time.perf_counter()
            if out.requires_grad:
                out.backward(seed)
            t3 = time.perf_counter()
            if run:
                forward.append(t1 - t0)
                backward.append(t3 - t2)
    finally:
        for p, g in zip(params, saved):
            p.grad = g
    desc = repr(layer).replace("\n", "")
    cost = LayerCost(f"node{i}", desc, statistics.median(forward), statistics.median(backward),
                     _nbytes(out), sum(_nbytes(p) for p in params))
    return cost, out.detach()
