"""Running a module with other parameter values: ``functional_call`` (PyTorch's name).

Given graph nodes, a layer builds nodes; its parameters, being tensors, enter the graph
as *constants*, their values frozen when the graph is built. That suits inference, but a
training step needs the gradient with respect to the parameters, and a graph to re-run
with new values after each step. So the parameters should be graph *inputs*:

    with mg.Graph() as g:
        x = mg.placeholder((32, 8), name="x")
        params = nn.parameter_placeholders(model)       # {"0.weight": Placeholder, ...}
        loss = loss_fn(nn.functional_call(model, params, x), labels)
        grads = mg.gradients(loss, list(params.values()))
    feed = {params[name]: p for name, p in model.named_parameters()}
    mg.Session(g).run(grads, {x: X, **feed})            # the current values, each run

``functional_call(module, values, *args)`` runs ``module(*args)`` (``args`` may also be
one tuple, PyTorch's form) with the parameters named in ``values`` replaced by those
values (nodes, tensors, anything the forward can compute with; nested lists and arrays
become tensors, as ``mg.tensor`` makes them) and puts the module's own
tensors back afterwards, even if the forward raised. Nothing about the layers changes:
they still just read ``self.weight``. (Not thread-safe: two threads must not call it on
one module at once.) A tensor that several
layers share (tied weights, ``m[2].weight = m[0].weight``) is replaced wherever it is
used, under any of its names, as ``torch.func.functional_call`` ties it: replacing it in
one layer only would leave the other use out of the gradient.
"""

from __future__ import annotations

from typing import Any

from ..graph.graph import Node, placeholder
from ..ops.primitive import KINDS
from ..tensor import Tensor, tensor
from .module import Module


def _uses(module: Module) -> tuple[dict[str, Any], dict[int, list[tuple[Module, str]]]]:
    """Every dotted name of every parameter (a tied one has several), and, per tensor,
    the (submodule, name) slots that hold it: the state dict's walk (``Module._paths``)."""
    tensors: dict[str, Any] = {}
    slots: dict[int, list[tuple[Module, str]]] = {}
    for prefix, m in module._paths():
        for name, p in m._parameters.items():
            if p is None:  # (a name kept with None, m.bias = None: no parameter there)
                continue
            tensors[prefix + name] = p
            slots.setdefault(id(p), []).append((m, name))
    return tensors, slots


def functional_call(module: Module, values: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` with the parameters in ``values`` swapped in.

    The arguments come one by one (``functional_call(m, values, x)``), or, as
    ``torch.func.functional_call(m, values, (x, y))`` takes them, as one tuple of
    positional arguments: a single tuple is unpacked (a module whose one argument is a
    tuple gets it wrapped, ``((a, b),)``, as in PyTorch).
    """
    if len(args) == 1 and type(args[0]) is tuple:  # PyTorch's form: one tuple of arguments
        args = args[0]
    tensors, slots = _uses(module)
    unknown = [name for name in values if name not in tensors]
    if unknown:
        raise KeyError(f"functional_call: {type(module).__name__} has no parameter "
                       f"{unknown[0]!r}; its parameters are "
                       f"{[name for name, _ in module.named_parameters()]}")
    given: dict[int, tuple[str, Any]] = {}  # id(the module's tensor) -> (name, new value)
    for name, value in values.items():
        value = _as_value(name, value, tensors[name])
        first = given.setdefault(id(tensors[name]), (name, value))
        if first[1] is not value:
            raise ValueError(f"functional_call: {first[0]!r} and {name!r} are one tensor "
                             f"(tied weights), given two different values")
    saved = []
    try:
        for key, (_, value) in given.items():
            for owner, leaf in slots[key]:
                saved.append((owner, leaf, owner._parameters[leaf]))
                owner._parameters[leaf] = value
        return module(*args, **kwargs)
    finally:
        for owner, leaf, tensor in reversed(saved):
            owner._parameters[leaf] = tensor


def _as_value(name: str, value: Any, own: Tensor) -> Any:
    """A value to stand for the parameter ``name``: a tensor, or a value of a kind that
    ``bind`` interprets (a graph node, a dual number ...), as it is; plain data (a nested
    list, a NumPy array, a number) as ``mg.tensor`` makes it, on the device of the
    parameter ``own`` (a layer given the list itself did ``[[1.0]].T``: an
    AttributeError); anything else, tensor()'s error, naming functional_call and the
    parameter."""
    if isinstance(value, Tensor) or type(value) in KINDS:
        return value
    try:
        return tensor(value, device=own.device)
    except (TypeError, ValueError) as exc:  # (None, a str, a ragged list)
        raise type(exc)(f"functional_call: the value for {name!r} ({type(value).__name__}) "
                        f"is not a tensor, an array or a number: {exc}") from None


def parameter_placeholders(module: Module, prefix: str = "") -> dict[str, Node]:
    """A placeholder per parameter, of its shape and dtype, in the current graph.

    They are placed like any node (on the device of the innermost ``mg.device`` scope)
    and named ``prefix + name``; feed them the tensors of ``module.named_parameters()``.
    """
    return {name: placeholder(p.shape, p.dtype, name=prefix + name)
            for name, p in module.named_parameters()}
