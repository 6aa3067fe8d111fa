"""Phase 4b, a real pipelined run on minigraph's multi-device runtime.

See the package docstring (``minigraph/parallel/pipeline/__init__.py``) for the whole picture.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np  # host arrays: microbatch slices, fetched gradients
from array_api_compat import array_namespace

from ...autodiff.checkpoint import CheckpointError, _generator_states, _state, checkpoint
from ...autodiff.reads import arrays_in, differs, outside_reads, rebound
from ...autodiff.tape import no_grad
from ...device import get_device
from ...graph.gradients import gradients
from ...graph.graph import Graph, Node, describe_location, placeholder
from ...nn.module import Module, Sequential
from ...nn.stateless import functional_call
from ...runtime.profile import RunStats
from ...runtime.scheduler import NodeError
from ...runtime.session import Session
from ...tensor import Tensor, host_values, tensor
from ..data_parallel import _check_devices, _rows_in_batch
from .common import Event, Op, PipelineError
from .profiling import _check_sequential
from .scheduling import Schedule, _as_schedule, peak_in_flight, schedule
from .simulation import draw_timeline, simulate


_OP_NAME = re.compile(r"^stage(\d+)/([FB])(\d+)/")


@dataclass
class PipelineRun:
    """What one pipelined step computed and how the runtime executed it."""

    loss: float                    # the loss of the whole minibatch
    grads: list[np.ndarray]        # aligned with model.parameters()
    loss_grads: list[np.ndarray]   # aligned with the loss's parameters() (a loss module's)
    order: list[list[Op]]          # per stage: the ops in the order its device ran them
    timeline: list[Event]          # measured: (stage, kind, k, start, end) in seconds
    peak_bytes: list[int]          # per stage: the most bytes of live values on its device
    sends: int                     # values that crossed devices (Send nodes run)
    stats: RunStats                # the runtime's trace (sess.last_run)

    @property
    def peak_activations(self) -> list[int]:
        """Per stage, the most microbatches whose activations it held, from ``order``."""
        return [peak_in_flight(ops) for ops in self.order]

    def draw(self, ax: Any = None, title: str | None = None) -> Any:
        """The measured timeline, drawn like the simulated one."""
        return draw_timeline(self.timeline, len(self.order), ax, title)


def _loss_name(loss: Any) -> str:
    return getattr(loss, "__name__", type(loss).__name__)


def _reduction(loss: Any, microbatches: int) -> str:
    """How ``loss`` reduces a batch: "mean" or "sum", from its ``reduction`` attribute
    (``nn.MSELoss(reduction="sum")``). The microbatch losses add up to the minibatch's
    by weights n_k / N for a mean, by ones for a sum; a function without the attribute
    could be either, and a guess would scale the loss and gradients by the number of
    microbatches without a word: refused, where there are several."""
    reduction = getattr(loss, "reduction", None)
    if reduction is None and microbatches == 1:
        return "sum"  # (one microbatch: its loss is the minibatch's, whatever it is)
    if reduction not in ("mean", "sum"):
        name = _loss_name(loss)
        raise PipelineError(
            f"Pipeline: the loss {name} has "
            f"{'no reduction' if reduction is None else f'reduction {reduction!r}'}, so "
            f"the pipeline cannot "
            f"tell how the losses of {microbatches} microbatches add up to the minibatch's "
            f"loss (weighted by their sizes for a mean, added for a sum); use "
            f"nn.MSELoss / nn.CrossEntropyLoss with reduction='mean' or 'sum', or say "
            f"which your function computes: {name}.reduction = 'mean' (or 'sum')")
    return reduction


class Pipeline:
    """A ``Sequential`` cut into stages on devices, trained with a GPipe or 1F1B schedule.

    ``Pipeline(model, loss, stages=[[0, 1], [2, 3]], devices=["cpu", "cpu:1"],
    schedule="1f1b", microbatches=4).run(x, labels)`` computes the loss and the gradients
    of one minibatch; ``backward(x, labels)`` also adds them to the parameters' ``.grad``,
    like ``loss.backward()``, ready for ``optimizer.step()``. ``loss(output, labels)`` is
    called on graph nodes (``nn.CrossEntropyLoss()``, ``nn.MSELoss()``, ...; a function
    of your own says whether it is a mean or a sum: ``loss.reduction = "mean"``); ``devices``
    defaults to cpu, cpu:1, ...; ``schedule`` is "gpipe", "1f1b" (with ``microbatches``)
    or a :class:`Schedule`; ``workers`` is the number of threads of each device;
    ``recompute=True`` re-materialises each stage's activations (GPipe's recomputation,
    below).

    **What is built.** One graph per minibatch shape (built once, then re-run). Each run
    feeds it the microbatches and the parameters' current values (a loss module's own
    parameters too, a learnable temperature: they get gradients, ``loss_grads``); what
    else the layers and the loss read (a tensor kept as a plain attribute,
    ``self.scale``, a number, the loss's ``reduction``, a global or a dict item they
    read) the graph holds as constants, so a run first compares them, and the modules
    and parameters themselves (``_structure``: a layer swapped, appended, a parameter
    removed or registered in another order, another loss), with what the graph was built
    from (``_built_from``, ``_Reads``) and rebuilds it if one changed. (A constant gets
    no gradient: one that requires a gradient is refused, ``_check_constants``.) For
    each stage s and microbatch k, a forward part F(s, k) and a backward part B(s, k), all
    placed on stage s's device with ``mg.device`` scopes and named ``stage<s>/F<k>/...``:

    * F(s, k) reads F(s-1, k)'s output through ``.to(device)`` and applies the stage's
      layers, whose parameters are placeholders (``nn.functional_call``); the last stage
      adds the loss, weighted by n_k / N so that the microbatch losses add up to the
      minibatch's mean loss.
    * B(s, k) is ``mg.gradients`` of F(s, k)'s output, seeded with the gradient that B(s+1, k)
      computed for it, with respect to the stage's input and parameters (the reverse-graph
      pass, once per part). The parameter gradients are *accumulated*: each B(s, k) adds
      its share to the sum of the stage's earlier backwards.

    **How the schedule's order is realised.** With control dependencies: every node of the
    stage's i-th op in the schedule runs only after its (i-1)-th op's *barrier*, a node
    that runs after that op's last nodes (``with g.control_dependencies(...)``; one
    control input per node, so the edges grow with the graph, not with nodes times
    parameters). Data edges say what may run; control edges say in which order each
    stage runs its passes: GPipe's or 1F1B's. (Only the Recv that brings an op its input
    may finish earlier: it just waits for its tensor.)

    **What the runtime executes.** One ``Session.run`` per minibatch. The partitioner cuts
    the graph into one graph per device and turns every edge between stages into a
    Send/Recv pair: the activation of F(s, k) is sent to stage s+1, the gradient of
    B(s+1, k) back to stage s. Each device's executor runs in its own thread, in the
    schedule's order; a Recv does not block its thread, it completes when the tensor
    arrives. So the stages really work at the same time on different microbatches, as
    far as Python allows: NumPy kernels release the GIL, the interpreter's own work does
    not. Values are freed after their last reader, so the activations a stage keeps
    alive are those of the microbatches whose backward has not run yet: ``peak_bytes``
    measures it on each device. The end of the run is the flush. The host only feeds
    the microbatches and the current parameter values at the start (so the next run
    sees the optimizer's step) and fetches the summed gradients and losses at the end.

    **Recomputation** (``recompute=True``, GPipe's re-materialisation). F(s, k) is then one
    ``mg.checkpoint`` node applying the stage's layers, and B(s, k) one node that runs
    them again before going backwards through them (``autodiff/checkpoint.py``): between
    F(s, k) and B(s, k) the stage keeps only its input for microbatch k, not every
    layer's activation, at the price of a second forward pass per stage. The gradients
    are the same.
    """

    def __init__(self, model: Sequential, loss: Callable[[Any, Any], Any],
                 stages: Sequence[Sequence[int]], devices: Sequence[str] | None = None,
                 schedule: "str | Schedule" = "1f1b", microbatches: int = 4,
                 workers: int = 1, recompute: bool = False):
        self.model = _check_sequential(model, "Pipeline")
        self.loss = loss  # (called on graph nodes: checked with the model, _check_model)
        self.stages = _check_stages(stages, len(model))
        self.devices = _stage_devices(devices, len(self.stages))
        if isinstance(schedule, str):
            schedule = _make_schedule(schedule, len(self.stages), microbatches)
        self.schedule = _as_schedule(schedule)
        if self.schedule.stages != len(self.stages):
            raise PipelineError(f"Pipeline: the schedule has {self.schedule.stages} stages, "
                                f"the model is cut into {len(self.stages)}")
        # A unit-cost simulation checks that the schedule cannot deadlock and gives an
        # order of the ops in which every op comes after the ops it reads from.
        self._build_order = [e[:3] for e in simulate(self.schedule).timeline]
        self.workers = workers
        self.recompute = recompute
        # key -> (_structure and _built_from, what the forwards read then: _Reads, the plan)
        self._plans: dict[tuple, tuple[tuple, _Reads, _Plan]] = {}
        _check_model(self)

    def run(self, x: Any, labels: Any) -> PipelineRun:
        """Run one minibatch through the pipeline; the gradients are not stored anywhere."""
        return self._run(x, labels)[1]

    def _run(self, x: Any, labels: Any) -> tuple[_Plan, PipelineRun]:
        xs, ys = _host(x), _host(labels)
        sizes = self._sizes(xs, ys)
        key = (sizes, xs.shape[1:], str(xs.dtype), ys.shape[1:], str(ys.dtype))
        state = (_structure(self), _built_from(self))
        built = self._plans.get(key)
        if built is None or built[0] != state or built[1].changed():
            # (a module, a parameter or the loss was replaced, added or removed, or a
            # buffer, a number, the loss's reduction, or a name, attribute, item, tensor
            # or array the forwards read changed since the graph was built, which holds
            # them as constants: it is rebuilt, not run stale)
            _check_model(self)  # (a layer appended, a loss swapped: checked as at first)
            reads = _Reads.of(self)
            made = _GraphBuilder(self, sizes, xs, ys).build()
            reads.refuse_draws()  # (the build ran the forwards once: did they draw?)
            self._plans[key] = (state, reads, made)
        plan = self._plans[key][2]
        _check_constants(self, plan)
        fetches = {"grads": [g for g in plan.grads if g is not None], "losses": plan.losses}
        try:
            values = plan.session.run(fetches, plan.feed(_parameters(self), xs, ys, sizes))
        except NodeError as error:
            raise _in_batch(error, sizes) from error
        return plan, _run_result(self, plan, values)

    def backward(self, x: Any, labels: Any) -> PipelineRun:
        """``run``, then add the gradients to the parameters' ``.grad`` (the model's and
        a loss module's), as backward() does: a parameter that does not require a
        gradient (frozen), or that no path from the loss reaches, keeps its ``.grad`` as
        it was (None stays None), so that an optimizer leaves it alone (its weight decay
        included)."""
        plan, result = self._run(x, labels)
        grads = result.grads + result.loss_grads
        with no_grad():
            for p, g, node in zip(_parameters(self), grads, plan.grads):
                if not p.requires_grad or node is None:
                    continue
                t = tensor(g, dtype=p.dtype, device=p.device)
                p.grad = t if p.grad is None else p.grad + t
        return result

    def _sizes(self, xs: np.ndarray, ys: np.ndarray) -> tuple[int, ...]:
        n, m = xs.shape[0] if xs.ndim else 0, self.schedule.microbatches
        if ys.ndim == 0 or ys.shape[0] != n:
            raise PipelineError(f"Pipeline: {n} inputs but labels of shape {ys.shape}")
        if n < m:
            raise PipelineError(f"Pipeline: a batch of {n} cannot be cut into {m} microbatches")
        bounds = [n * k // m for k in range(m + 1)]
        return tuple(b - a for a, b in zip(bounds, bounds[1:]))


_make_schedule = schedule  # Pipeline's argument of the same name hides the function


def _check_stages(stages: Sequence[Sequence[int]], n: int) -> list[list[int]]:
    runs = [list(s) for s in stages]
    if not runs or any(not s for s in runs) or sum(runs, []) != list(range(n)):
        raise PipelineError(f"Pipeline: the stages must be non-empty runs of consecutive "
                            f"layers covering layers 0..{n - 1} in order, got {runs}")
    return runs


def _stage_devices(devices: Sequence[str] | None, p: int) -> list[str]:
    names = _check_devices(devices, "Pipeline") if devices is not None else \
        ["cpu" if s == 0 else f"cpu:{s}" for s in range(p)]
    if len(names) != p:
        raise PipelineError(f"Pipeline: {p} stages need {p} devices, got {names}")
    for name in names:
        get_device(name)  # an unknown device fails here (mg.set_virtual_cpus adds cpu:N)
    return names


def _check_model(pipe: Pipeline) -> None:
    """What ``Pipeline`` checks of its model and loss when it is made, and again before
    it builds a graph: a layer appended, or a submodule or the loss swapped, since."""
    model, loss = _check_sequential(pipe.model, "Pipeline"), pipe.loss
    covered = sum(len(layers) for layers in pipe.stages)
    if len(model) != covered:  # (the stages were checked against the model when made)
        raise PipelineError(f"Pipeline: the model has {len(model)} layers now, its stages "
                            f"{pipe.stages} cover {covered}: a layer was added or removed "
                            f"after the Pipeline was made; make a new Pipeline with stages "
                            f"that cover layers 0..{len(model) - 1}")
    if not callable(loss):
        raise TypeError(f"Pipeline: the loss must be a function or module called as "
                        f"loss(output, labels) (nn.CrossEntropyLoss()), got an object of type "
                        f"{type(loss).__name__}, which cannot be called")
    _check_parameters(model, loss)
    if pipe.recompute:
        _check_recomputable(model, pipe.stages, pipe.devices)


def _check_parameters(model: Sequential, loss: Any) -> None:
    owner: dict[int, str] = {}
    parts = [(f"layer {i}", layer) for i, layer in enumerate(model)]
    if isinstance(loss, Module):
        parts.append((f"the loss {_loss_name(loss)}", loss))
    for part, module in parts:
        for p in module.parameters():
            if id(p) in owner:
                raise PipelineError(f"Pipeline: {owner[id(p)]} and {part} share a "
                                    f"parameter; shared weights are not supported")
            owner[id(p)] = part


def _parameters(pipe: Pipeline) -> list[Tensor]:
    """What each run feeds the graph's placeholders, in order: the model's parameters,
    then a loss module's own (a learnable temperature)."""
    loss = pipe.loss.parameters() if isinstance(pipe.loss, Module) else []
    return pipe.model.parameters() + loss


def _check_recomputable(model: Sequential, stages: Sequence[Sequence[int]],
                        devices: Sequence[Any]) -> None:
    """Recomputation runs a stage's layers eagerly on the stage's device, inside its
    checkpoint node; a tensor a layer keeps that is not a parameter (``self.scale =
    mg.tensor(1.5)``) is not fed there, and one on another device cannot be read (without
    recomputation the graph holds it as a constant of the stage's device)."""
    for s, layers in enumerate(stages):
        device = get_device(devices[s])
        for i in layers:
            for prefix, module in model[i]._paths():
                for name, value in vars(module).items():
                    if isinstance(value, Tensor) and value.device is not device:
                        raise PipelineError(
                            f"Pipeline(recompute=True): layer {i} keeps {prefix}{name}, a "
                            f"tensor on {value.device.name} that is not a parameter; stage "
                            f"{s} recomputes its layers on {device.name}, where it cannot be "
                            f"read. Put it on {device.name}, make it a parameter, or use "
                            f"recompute=False")


def _check_constants(pipe: Pipeline, plan: _Plan) -> None:
    """Refuse to run a graph that holds a tensor that requires a gradient as a constant.

    The graph's placeholders stand for the parameters, which get their gradients; a
    tensor that the loss or a layer's forward reads from outside its arguments (a global,
    a closure variable, a dict's item: a learnable temperature, another layer's weight),
    or computes eagerly from one (``W.T``), became a constant when the graph was built,
    where no gradient reaches it: its ``.grad`` stayed None without a word, where
    backward() (and torch) give it one. Checked on every run, as ``requires_grad_()``
    may come after the graph was built. (With recomputation a layer's own reads are no
    constants: ``mg.checkpoint`` refuses them when it runs.)"""
    for t, const in plan.constants:
        if not t.requires_grad:
            continue
        what = f"a tensor of shape {tuple(t.shape)} and dtype {t.dtype}"
        where = describe_location(const.location)
        found = _reader(pipe, t)
        if found is not None:
            head = f"Pipeline: {found[0]} reads {found[1]}, {what} that requires a " \
                  f"gradient, from outside its arguments (at {where})"
        else:  # (not read by a name: made from one eagerly, outside the graph)
            head = f"Pipeline: the loss or a layer's forward uses {what} that requires a " \
                  f"gradient (at {where}), computed eagerly from a tensor read from " \
                  f"outside its arguments, as (W ** 2).sum() or W.T is"
        owner = {id(p): n for n, p in pipe.model.named_parameters()}.get(id(t))
        shared = "" if owner is None else (
            f" It is layer {owner.split('.')[0]}'s parameter {owner}: a parameter is fed "
            f"to its own layer alone, so sharing it (a tied weight) is not supported.")
        raise PipelineError(
            f"{head}; the pipeline's graph holds it as a constant, so it would get no "
            f"gradient (its .grad would stay None).{shared} Make it a parameter of a layer "
            f"or of a loss module (an nn.Module passed as the loss), which get their "
            f"gradients, or, if it is meant to stay fixed, a tensor that does not require "
            f"one (.requires_grad_(False), .detach())")


def _readers(pipe: Pipeline, layers: bool = True) -> list[tuple[str, Any, Any]]:
    """``(who, function, module)`` for each function the pipeline's graph runs: the
    loss and, with ``layers``, each layer's forward (a layer's own layers' too)."""
    loss = pipe.loss
    readers: list[tuple[str, Any, Any]] = [(f"the loss {_loss_name(loss)}", loss, loss)]
    readers += [(f"the forward of layer {i}" + (f" ({prefix[:-1]})" if prefix else "") +
                 f", a {type(m).__name__},", m.forward, layer)
                for i, layer in enumerate(pipe.model) for prefix, m in layer._paths()
                if layers]
    return readers


def _reader(pipe: Pipeline, t: Tensor) -> tuple[str, str] | None:
    """Which function of the pipeline (the loss, a layer's forward) reads tensor ``t``
    from outside its arguments, and by what name (``reads.outside_reads``); None if
    none does. (The parameters of a layer, or of a loss module, which its own code
    reads too, are no constants: ``functional_call`` feeds them.)"""
    for who, f, module in _readers(pipe):
        if isinstance(module, Module) and any(p is t for p in module.parameters()):
            continue
        for name, a in arrays_in(outside_reads(f)):
            if a is t:
                return who, name
    return None


class _Reads(NamedTuple):
    """What the loss and, without recomputation, the layers' forwards read from outside
    their arguments (``reads.outside_reads``: globals, closure variables, the attributes
    their code names, the items of the dicts and lists among them), as compiled programs
    guard it: ``SCALE = 3.0``, ``cfg["scale"] = 3.0``, ``holder.scale = 3.0`` bind a
    constant of the graph anew (``reads.rebound`` tells), and ``G *= 2.0``, ``GA[0] =
    3.0`` write one in place (a copy of each tensor and array among them, but the
    parameters, which every run feeds, tells)."""

    reads: list
    copies: list  # (tensor or array, a copy of its values then)
    # (who, name, generator, its state as pickled) for each random number generator a
    # function reads (checkpoint's _generator_states), before the graph is built
    generators: list

    @classmethod
    def of(cls, pipe: Pipeline) -> "_Reads":
        reads, generators = [], []
        for who, f, _ in _readers(pipe, layers=not pipe.recompute):
            read = outside_reads(f)
            try:
                drawn = _generator_states(read)
            except CheckpointError:  # (random.SystemRandom: no state to compare)
                raise PipelineError(
                    f"Pipeline: {who} reads a random number generator whose state cannot "
                    f"be read (random.SystemRandom), so whether it draws from it cannot be "
                    f"told; the pipeline runs a graph built once, which would repeat its "
                    f"first draws at every run. Train such a model without Pipeline") from None
            generators += [(who, name, g, pickle.dumps(state)) for name, g, state in drawn]
            reads += read
        fed = {id(p) for p in _parameters(pipe)}
        copies = [(a, _copy(a)) for _, a in arrays_in(reads) if id(a) not in fed]
        return cls(reads, copies, generators)

    def refuse_draws(self) -> None:
        """Refuse a graph whose building drew from a generator the functions read: the
        graph holds the numbers of that one draw and would repeat them at every run (a
        dropout mask that never changes, where eager training draws a new one at each
        step). A generator merely held (one that made the initial weights, an item of a
        dict of options) draws nothing, and is no reason to refuse. (recompute=True runs
        the layers in checkpoints, which refuse a draw in a graph themselves.)"""
        for who, name, g, state in self.generators:
            if pickle.dumps(_state(g)) != state:
                raise PipelineError(
                    f"Pipeline: {who} draws random numbers from {name}; the pipeline runs "
                    f"a graph built once, which would repeat the first draw at every run (a "
                    f"dropout mask that never changes, where eager training draws a new "
                    f"one at each step). Train a model that draws random numbers without "
                    f"Pipeline")

    def changed(self) -> bool:
        return rebound(self.reads) is not None or any(
            differs(np.asarray(host_values(a)) if isinstance(a, Tensor) else a, was)
            for a, was in self.copies)


def _copy(a: Any) -> Any:
    """A copy of the values of a tensor (on the host) or of an array, to compare with
    them later (``reads.differs``). Another library's array is copied by its own library,
    as ``signature.Captured`` does: NumPy refuses to read a torch tensor that requires a
    gradient."""
    if isinstance(a, Tensor):
        return np.array(host_values(a), copy=True)
    return array_namespace(a).asarray(a, copy=True)


def _structure(pipe: Pipeline) -> tuple:
    """The modules and parameters the graph was built from, compared without reading a
    value: the model and the loss themselves, and for every module of their trees its
    path, identity and class, and its parameters' names in order (the placeholders are
    fed by position, ``_Plan.feed``), identities, shapes and dtypes. A submodule
    swapped (``block.act = nn.ReLU()``), a layer appended, a parameter removed
    (``lin.bias = None``) or registered anew after the others, another loss: it differs,
    and ``Pipeline`` builds a new graph (or says why it cannot)."""
    trees: list[tuple[str, Any]] = [("loss", pipe.loss)] + \
        [(str(i), layer) for i, layer in enumerate(pipe.model)]
    state: list[Any] = [_Same(pipe.model), _Same(pipe.loss)]
    for where, root in trees:
        if isinstance(root, Module):
            state += [(f"{where}.{prefix}", _Same(m), type(m),
                       [(name, p if p is None else (_Same(p), p.shape, p.dtype))
                        for name, p in m._parameters.items()])
                      for prefix, m in root._paths()]
    return tuple(state)


class _Same:
    """An object in a fingerprint, equal to another's when it is the very same object;
    held, so that no later object takes its id (``id`` alone could name a new one)."""

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value


def _built_from(pipe: Pipeline) -> tuple:
    """What the graph holds as constants, as it is now: every attribute of the loss (its
    ``reduction`` too, which sets the microbatches' weights) and, without recomputation,
    of the layers' modules, other than their parameters (fed on every run) and graph
    nodes (an activation a layer kept while the graph was built). A tensor counts by its
    identity and a digest of its values, a number or string by its value, another object
    by its identity: ``Pipeline`` rebuilds its graph when this changes. (Recomputation
    runs the layers themselves on every run: they read their attributes then.)"""
    loss = pipe.loss
    owners: list[tuple[str, Any]] = [("loss", loss)]
    if isinstance(loss, Module):  # (its parameters are fed, like the layers')
        owners = [(f"loss.{prefix}", m) for prefix, m in loss._paths()]
    if not pipe.recompute:
        owners += [(f"{i}.{prefix}", m) for i, layer in enumerate(pipe.model)
                   for prefix, m in layer._paths()]
    state: list[tuple[str, Any]] = [("loss.reduction", repr(getattr(loss, "reduction", None)))]
    for where, owner in owners:
        if isinstance(owner, Tensor):
            state.append((where, _fingerprint(owner)))
            continue
        for name, value in getattr(owner, "__dict__", {}).items():
            if name not in ("_parameters", "_modules") and not isinstance(value, Node):
                state.append((where + name, _fingerprint(value)))
    return tuple(state)


def _fingerprint(value: Any) -> Any:
    """A value that equals another's when the graph would hold the same constant."""
    if isinstance(value, (Tensor, np.ndarray)):
        array = np.ascontiguousarray(host_values(value) if isinstance(value, Tensor) else value)
        device = value.device.name if isinstance(value, Tensor) else "host"
        return (_Same(value), array.shape, str(array.dtype), device,
                hashlib.blake2b(array.tobytes(), digest_size=16).digest())
    if isinstance(value, (list, tuple)):
        return tuple(_fingerprint(v) for v in value)
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, np.generic)):
        return repr(value)  # (repr: a nan equals itself)
    return ("object", _Same(value))  # (a change inside it is not seen)


_FAILED_NODE = re.compile(r"node 'stage(\d+)/([FB])(\d+)/")


def _in_batch(error: NodeError, sizes: tuple[int, ...]) -> NodeError:
    """The error of a node of microbatch k, naming the microbatch and with the rows it
    names counted in the user's batch: row r of microbatch k is row start_k + r (a bad
    label at row 3 of the batch was said to be at row 0, of its microbatch)."""
    match = _FAILED_NODE.match(str(error))
    if match is None:
        return error
    s, kind, k = int(match[1]), match[2], int(match[3])
    start = sum(sizes[:k])
    text = _rows_in_batch(str(error), start)
    return NodeError(f"Pipeline: the {'forward' if kind == 'F' else 'backward'} pass of "
                     f"microbatch {k} (rows {start}..{start + sizes[k] - 1} of the batch) "
                     f"failed on stage {s}, rows counted in the batch: {text}")


def _host(value: Any) -> np.ndarray:
    return host_values(value) if isinstance(value, Tensor) else np.asarray(value)


@dataclass
class _Plan:
    """The graph of one minibatch shape, its session, and the nodes to feed and fetch."""

    session: Session
    xs: list[Node]
    ys: list[Node]
    params: list[Node]           # aligned with _parameters(pipe)
    grads: list[Node | None]     # accumulated gradients, aligned with _parameters(pipe)
    losses: list[Node]
    constants: list[tuple[Tensor, Node]]  # the tensors held as constants, their Consts

    def feed(self, params: list[Tensor], xs: np.ndarray, ys: np.ndarray,
             sizes: tuple[int, ...]) -> dict:
        feed: dict[Node, Any] = dict(zip(self.params, params))
        start = 0
        for k, n in enumerate(sizes):
            feed[self.xs[k]], feed[self.ys[k]] = xs[start:start + n], ys[start:start + n]
            start += n
        return feed


class _GraphBuilder:
    """Builds a pipeline's graph, one op (F or B of a stage and microbatch) at a time."""

    def __init__(self, pipe: Pipeline, sizes: tuple[int, ...], xs: np.ndarray, ys: np.ndarray):
        self.pipe, self.sizes = pipe, sizes
        self.graph = Graph("pipeline")
        self.devs = [get_device(d) for d in pipe.devices]
        p, m = len(pipe.stages), len(sizes)
        # (Nodes, None until the op that makes them is built: the build order puts
        # F(s - 1, k) before F(s, k), and B(s + 1, k) before B(s, k))
        self.outputs: list[list[Any]] = [[None] * m for _ in range(p)]   # F(s, k)'s result
        self.inputs: list[list[Any]] = [[None] * m for _ in range(p)]  # F(s, k)'s input, on stage s
        self.input_grads: list[list[Any]] = [[None] * m for _ in range(p)]
        self.barriers: list[list[Node]] = [[] for _ in range(p)]  # the last op's (_close)
        self.accumulated: dict[int, Node] = {}
        self.losses: list[Any] = [None] * m  # (Nodes, set by the last stage's F ops)
        self.stage_functions: dict[int, Callable[..., Any]] = {}  # (recompute=True)
        self.scales = [n / sum(sizes) for n in sizes] if _reduction(pipe.loss, m) == "mean" \
            else [1.0] * m
        with self.graph:
            self._inputs(xs, ys)

    def _inputs(self, xs: np.ndarray, ys: np.ndarray) -> None:
        """Placeholders: each layer's parameters on its stage's device, x on the first
        stage's, labels and a loss module's parameters on the last stage's."""
        self.layer_params: dict[int, dict[str, Node]] = {}
        for s, layers in enumerate(self.pipe.stages):
            with self.devs[s]:
                for i in layers:
                    self.layer_params[i] = {
                        name: placeholder(t.shape, t.dtype, name=f"stage{s}/layer{i}.{name}")
                        for name, t in self.pipe.model[i].named_parameters()}
        with self.devs[0]:
            self.xs = [placeholder((n,) + xs.shape[1:], str(xs.dtype), name=f"x{k}")
                       for k, n in enumerate(self.sizes)]
        with self.devs[-1]:
            self.ys = [placeholder((n,) + ys.shape[1:], str(ys.dtype), name=f"labels{k}")
                       for k, n in enumerate(self.sizes)]
            loss, last = self.pipe.loss, len(self.pipe.stages) - 1
            self.loss_params = {} if not isinstance(loss, Module) else {
                name: placeholder(t.shape, t.dtype, name=f"stage{last}/loss.{name}")
                for name, t in loss.named_parameters()}

    def stage_params(self, s: int) -> list[Node]:
        return [node for i in self.pipe.stages[s] for node in self.layer_params[i].values()]

    def build(self) -> _Plan:
        with self.graph:
            for s, kind, k in self.pipe._build_order:
                start = len(self.graph.nodes)
                with self.devs[s], self.graph.name_scope(f"stage{s}/{kind}{k}"), \
                        self.graph.control_dependencies(self.barriers[s]):
                    (self._forward if kind == "F" else self._backward)(s, k)
                self._close(s, f"{kind}{k}", start)
        params = [node for i in range(len(self.pipe.model))
                  for node in self.layer_params[i].values()] + list(self.loss_params.values())
        session = Session(self.graph, workers=self.pipe.workers, trace=True)
        # (the graph keeps the Const it made of each tensor an op met: _check_constants)
        constants = [(t, node) for t, node in self.graph._consts.values()
                     if isinstance(t, Tensor)]
        return _Plan(session, self.xs, self.ys, params,
                     [self.accumulated.get(id(node)) for node in params], self.losses,
                     constants)

    def _forward(self, s: int, k: int) -> None:
        h = self.xs[k] if s == 0 else self.outputs[s - 1][k].to(self.devs[s])
        self.inputs[s][k] = h
        if self.pipe.recompute:  # one node, whose layers' activations are not kept
            h = checkpoint(self._stage_function(s))(h, *self.stage_params(s))
        else:
            for i in self.pipe.stages[s]:
                h = functional_call(self.pipe.model[i], self.layer_params[i], h)
        if s == len(self.pipe.stages) - 1:
            loss, name = self.pipe.loss, _loss_name(self.pipe.loss)
            h = functional_call(loss, self.loss_params, h, self.ys[k]) \
                if isinstance(loss, Module) else loss(h, self.ys[k])
            if not isinstance(h, Node):  # (None: a forgotten return; a number or a tensor
                # is not computed from the output: no gradient would reach the model)
                raise PipelineError(f"Pipeline: the loss {name} returned "
                                    f"{type(h).__name__}, not the microbatch's loss "
                                    f"computed from the output and the labels (a graph "
                                    f"node here){'; is a return missing?' if h is None else ''}")
            if h.shape is None or tuple(h.shape) != ():  # (it was seeded with ones, and
                # the sum of the losses then failed in NumPy after the whole run)
                raise PipelineError(f"Pipeline: the loss {name} must return a scalar, the "
                                    f"microbatch's loss; it returned shape "
                                    f"{None if h.shape is None else tuple(h.shape)}; reduce "
                                    f"it (a mean or a sum) and set {name}.reduction")
            h = h if self.scales[k] == 1.0 else h * self.scales[k]
            self.losses[k] = h
        self.outputs[s][k] = h

    def _stage_function(self, s: int) -> Callable[..., Any]:
        """``(h, *stage parameters) -> the stage's layers applied to h``, one per stage.
        Its lock keeps two threads of the stage's device from swapping the parameters of
        the same layers at once (``functional_call`` is not thread-safe)."""
        if s not in self.stage_functions:
            model, layers = self.pipe.model, self.pipe.stages[s]
            names = {i: list(self.layer_params[i]) for i in layers}
            lock = threading.RLock()

            def stage(h: Any, *params: Any) -> Any:
                values = iter(params)
                with lock:
                    for i in layers:
                        h = functional_call(model[i], {n: next(values) for n in names[i]}, h)
                return h

            self.stage_functions[s] = stage
        return self.stage_functions[s]

    def _backward(self, s: int, k: int) -> None:
        last = s == len(self.pipe.stages) - 1
        params = self.stage_params(s) + (list(self.loss_params.values()) if last else [])
        wrt = ([] if s == 0 else [self.inputs[s][k]]) + params
        if not wrt:  # a first stage without parameters has nothing to differentiate: its B
            return  # runs no node, but holds its place in the order (_with_empty_ops)
        seed = None if last else [self.input_grads[s + 1][k]]
        grads = gradients(self.outputs[s][k], wrt, seed)
        if s > 0:
            if grads[0] is None:
                raise PipelineError(f"Pipeline: the output of stage {s} does not depend on "
                                    f"its input; no gradient can flow to stage {s - 1}")
            self.input_grads[s][k], grads = grads[0], grads[1:]
        for node, g in zip(params, grads):
            if g is not None:
                total = self.accumulated.get(id(node))
                self.accumulated[id(node)] = g if total is None else total + g

    def _close(self, s: int, op: str, start: int) -> None:
        """Make the op's barrier, which the next op of the stage waits for: a constant
        (a node with nothing to compute) whose control inputs are the op's last nodes,
        those read by no other node of the op. A B op's last nodes include an
        accumulated gradient per parameter; made control inputs of every node of the
        next op, they made the edges, and each run's walk over them, grow as nodes
        times parameters: quadratic in depth. An op that made no node (an empty B)
        leaves the barrier before it in place. (Its name is outside the op's scope,
        ``stage<s>/after_<op>``: the measured timeline is made of the ops' own nodes.)"""
        nodes = self.graph.nodes[start:]
        if nodes:
            read = {id(i) for n in nodes for i in n.predecessors}
            last = [n for n in nodes if id(n) not in read]
            with self.devs[s], self.graph.control_dependencies(last):
                self.barriers[s] = [self.graph.constant(np.zeros(()),
                                                        name=f"stage{s}/after_{op}")]


def _run_result(pipe: Pipeline, plan: _Plan, values: dict) -> PipelineRun:
    stats = plan.session.last_run
    assert stats is not None  # (the plan's session has just run)
    params = _parameters(pipe)
    fetched = iter(values["grads"])
    grads = [np.zeros(p.shape, dtype=host_values(p).dtype) if g is None else np.asarray(next(fetched))
             for p, g in zip(params, plan.grads)]
    n = len(pipe.model.parameters())  # (the loss's parameters come after the model's)
    spans: dict[tuple[int, str, int], list[float]] = {}
    for e in stats.events:
        match = _OP_NAME.match(e["name"])
        if match is None or e["op"] in ("Send", "Recv"):
            continue
        key = (int(match[1]), match[2], int(match[3]))
        start, end = e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6
        span = spans.setdefault(key, [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    timeline = sorted(((s, kind, k, a, b) for (s, kind, k), (a, b) in spans.items()),
                      key=lambda e: (e[3], e[0]))
    order = [_with_empty_ops([(kind, k) for s2, kind, k, _, _ in timeline if s2 == s],
                             pipe.schedule.ops[s])
             for s in range(len(pipe.stages))]
    # (a control edge's key starts with "^", rendezvous.make_key's mark: a node's own name
    # may end in "/control")
    sends = sum(1 for e in stats.events
                if e["op"] == "Send" and not e.get("key", "").startswith("^"))
    peak = [stats.lower_bound.get(get_device(d).name, 0) for d in pipe.devices]
    return PipelineRun(float(sum(values["losses"])), grads[:n], grads[n:], order, timeline,
                       peak, sends, stats)


def _with_empty_ops(measured: list[Op], ops: Sequence[Op]) -> list[Op]:
    """A stage's measured order with its empty ops put back where its schedule ``ops``
    has them: right after the op before them, whose end is theirs (the control edges
    make the next op wait for that one). An op is empty when it runs no node of its own
    and so leaves no event: the B of a first stage without parameters, the F and B of
    a stage that only passes its input on (an identity layer: its F is the Recv of its
    input, its B passes the gradient back as it came). Left out, such a stage seemed to
    hold no microbatch's activations, or every one to the end (``peak_activations``),
    where the schedule (and ``recompute=True``, whose checkpoint nodes run) has it run
    its ops in order."""
    ran = set(measured)
    lead: list[Op] = []
    after: dict[Op, list[Op]] = {}
    previous: Op | None = None
    for op in ops:
        if op not in ran:
            (lead if previous is None else after.setdefault(previous, [])).append(op)
        else:
            previous = op
    return lead + [o for op in measured for o in [op] + after.get(op, [])]
