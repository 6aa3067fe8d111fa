"""Phase 1, profile: per layer, forward and backward time, activation and parameter bytes.

See the package docstring (``minigraph/parallel/pipeline/__init__.py``) for the whole picture.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from ...autodiff.tape import enable_grad
from ...device import nbytes
from ...nn.module import Module, Sequential
from ...tensor import Tensor, ones, tensor
from .common import PipelineError


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
        of activation sizes, as PipeDream writes for multi-output layers, is summed). A
        layer line without one of the four fields, or with a value that is not a number
        >= 0, is refused, naming the line and the field; so is a text without a layer
        line (it read as a profile of no layers)."""
        layers = []
        for number, line in enumerate(text.splitlines(), 1):
            parts = line.strip().split(" -- ")
            if len(parts) < 3 or "=" not in parts[-1]:
                continue  # an edge "node1 -- node2", or a blank line
            found = dict(re.findall(r"(\w+)=(\[[^\]]*\]|[^,\s]+)", parts[-1]))
            where = f"Profile.from_text: line {number} ({line.strip()!r})"
            missing = [name for name in _TEXT_FIELDS if name not in found]
            if missing:  # (a bare KeyError named neither the line nor what was expected)
                raise PipelineError(f"{where} has no {', '.join(missing)}; a layer line "
                                    f"gives {'=..., '.join(_TEXT_FIELDS)}=...")
            forward, backward, activation, parameters = (
                _text_number(found[name], name, where) for name in _TEXT_FIELDS)
            layers.append(LayerCost(parts[0], " -- ".join(parts[1:-1]), forward / 1e3,
                                    backward / 1e3, round(activation), round(parameters)))
        if not layers:  # (an empty profile, which failed later, far from the text)
            raise PipelineError("Profile.from_text: the text has no layer line (PipeDream's "
                                "'node1 -- <layer> -- forward_compute_time=..., ...')")
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
        """Read ``to_json``'s form. A layer without one of LayerCost's fields (or with
        another) is refused naming the layer and the fields, as ``from_text`` does; so
        is a text without a layer (a bare KeyError or TypeError named neither)."""
        data = json.loads(text)
        layers = data.get("layers") if isinstance(data, dict) else None
        if not layers or not isinstance(layers, list):
            raise PipelineError("Profile.from_json: the text has no \"layers\" list of "
                                "layers (to_json's form)")
        expected = [f.name for f in fields(LayerCost)]
        for i, entry in enumerate(layers):
            if not isinstance(entry, dict) or sorted(entry) != sorted(expected):
                raise PipelineError(f"Profile.from_json: layer {i} is {entry!r}; a layer "
                                    f"gives exactly {', '.join(expected)}")
            for name in expected[2:]:  # (times and sizes: "abc" or null failed later, in
                value = entry[name]    # the partitioner, naming neither layer nor field)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                        not 0 <= value < float("inf") or value > _LARGEST:
                    raise PipelineError(f"Profile.from_json: layer {i}'s {name} is "
                                        f"{value!r}, not a number >= 0")
        return cls([LayerCost(**entry) for entry in layers])

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


# The largest time or size a profile takes: a float's (10**400, an int, failed in
# the partitioner's float arithmetic with Python's own OverflowError)
_LARGEST = sys.float_info.max

# The fields of a layer line of PipeDream's text form, in the order LayerCost takes them.
_TEXT_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size",
                "parameter_size")


def _text_number(value: str, name: str, where: str) -> float:
    """A field's value: a number >= 0 (milliseconds or bytes); a list ``[a; b]`` of
    activation sizes is summed."""
    try:
        numbers = [float(v) for v in value.strip("[]").split(";")]
    except ValueError:  # (float()'s message named neither the line nor the field)
        numbers = [float("nan")]
    number = sum(numbers)
    if not all(0 <= n < float("inf") for n in numbers + [number]):  # ([100; -60] is no 40)
        raise PipelineError(f"{where}: {name}={value} is not a number >= 0")
    return number


def _check_sequential(model: Any, who: str) -> Sequential:
    if not isinstance(model, Sequential):
        raise TypeError(f"{who}: expected an mg.nn.Sequential (its layers are the units "
                        f"of a pipeline), got {type(model).__name__}")
    if len(model) == 0:
        raise PipelineError(f"{who}: the Sequential has no layers")
    return model


# The profile's clock. A test swaps in a noisy one (a deterministic noise model) to check
# that the statistic below keeps the layers in the order of their work.
_clock = time.perf_counter


def profile(model: Sequential, x: Any, repeat: int = 25, warmup: int = 2,
            quantile: float = 0.0) -> Profile:
    """Profile each layer of ``model`` on input ``x`` (a batch), eagerly, on one device.

    For layer i: the input is layer i-1's output (detached, so that only layer i is
    timed); the forward is timed with gradient recording on (as in training), the
    backward from a gradient of ones. The parameters' ``.grad`` are left as they were.

    Made to survive a loaded machine (a laptop running other work), where one timing can
    take many times the layer's own cost:

    * ``warmup`` untimed forward and backward passes of every layer first (first calls
      pay for allocations, caches and lazy set-up);
    * ``repeat`` *interleaved rounds*: each round times one forward and one backward of
      every layer, starting from a layer that moves on by one from round to round. A
      slow phase of the machine (another process on the core for a few milliseconds, a
      burst of interrupts) lasts longer than a round, so it slows every layer of the
      rounds it hits instead of all the timings of one layer, as timing one layer after
      the other would;
    * per layer and pass, the ``quantile`` of its rounds, by default 0: the fastest.
      Load only ever *adds* time to a timing, so the fastest of many rounds is the
      closest to what the layer itself costs, and one clean round per layer is enough to
      keep the layers in the order of their work. (A median is inverted as soon as more
      than half of one layer's timings were slowed; ``quantile=0.5`` gives it, for
      comparison.)

    A BLAS that runs a product on several threads makes every timing wait for a core
    per thread; on a busy machine then no round is clean. Run the profile with BLAS on
    one thread (``OPENBLAS_NUM_THREADS=1`` before NumPy loads, as the notebooks do).
    """
    _check_sequential(model, "profile")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"profile: repeat must be an int >= 1, got {repeat!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"profile: warmup must be an int >= 0, got {warmup!r}")
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"profile: quantile must be between 0 and 1, got {quantile!r}")
    layers = list(model)
    params = [p for layer in layers for p in layer.parameters()]
    saved = [p.grad for p in params]
    for p in params:  # (the timed backward passes add into a .grad in place, as PyTorch's
        p.grad = None  # AccumulateGrad does: the saved ones are set aside, not added to)
    h = x if isinstance(x, Tensor) else tensor(x)
    inputs, outputs = [], []
    try:
        with enable_grad():
            for layer in layers:  # each layer's input, once: the previous one's output
                h = h.detach()
                inputs.append(h)
                h = layer(h)
                outputs.append(h.detach())
            for _ in range(warmup):
                for layer, inp in zip(layers, inputs):
                    _time_layer(layer, inp)
            times: list[list[tuple[float, float]]] = [[] for _ in layers]
            for r in range(repeat):
                for k in range(len(layers)):
                    i = (r + k) % len(layers)
                    times[i].append(_time_layer(layers[i], inputs[i]))
    finally:
        for p, g in zip(params, saved):
            p.grad = g
    costs = []
    for i, layer in enumerate(layers):
        forward = _quantile([f for f, _ in times[i]], quantile)
        backward = _quantile([b for _, b in times[i]], quantile)
        costs.append(LayerCost(f"node{i}", repr(layer).replace("\n", ""), forward, backward,
                               nbytes(outputs[i].data),
                               sum(nbytes(p.data) for p in layer.parameters())))
    return Profile(costs)


def _time_layer(layer: Module, x: Tensor) -> tuple[float, float]:
    """Seconds of one forward and one backward of ``layer`` on ``x``, by ``_clock``."""
    inp = x.detach().requires_grad_() if x.dtype in ("float32", "float64") else x
    t0 = _clock()
    out = layer(inp)
    t1 = _clock()
    seed = ones(out.shape, out.dtype, out.device)
    t2 = _clock()
    if out.requires_grad:
        out.backward(seed)
    t3 = _clock()
    return t1 - t0, t3 - t2


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``, nearest rank from below (0: the minimum)."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


T = TypeVar("T")


def fastest_runs(runs: dict[str, Callable[[], T]], rounds: int = 7,
                 duration: Callable[[T], float] | None = None) -> dict[str, T]:
    """Call every function of ``runs`` ``rounds`` times, interleaved (the order rotates
    from round to round), and keep, per name, the result of its fastest call: the one
    the machine's load disturbed least, as :func:`profile` keeps the fastest round.

    ``duration(result)`` is a call's time (a pipeline run's makespan, from its
    timeline); without it, the call's wall time on the profile's clock. Comparing two
    schedules by one measured run each compares two moments of the machine as much as
    the schedules; the fastest of interleaved runs compares the schedules.
    """
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"fastest_runs: rounds must be an int >= 1, got {rounds!r}")
    names = list(runs)
    best: dict[str, tuple[float, T]] = {}
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            t0 = _clock()
            result = runs[name]()
            took = _clock() - t0 if duration is None else duration(result)
            if name not in best or took < best[name][0]:
                best[name] = (took, result)
    return {name: best[name][1] for name in names}
