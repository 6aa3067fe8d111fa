"""``Module`` and ``Sequential``: layers that own their parameters (PyTorch's names).

A :class:`Module` is a function with state. Its *parameters* are the tensors it owns
that training changes; its *submodules* are the layers it is built from. Both are found
by assignment, as in PyTorch: ``self.weight = mg.tensor(..., requires_grad=True)``
registers a parameter (a leaf tensor that requires a gradient; an operation's result,
an activation kept on ``self``, is a plain attribute), and
``self.fc = Linear(...)`` registers a submodule. ``parameters()`` then lists every
parameter of the tree, own ones first, then each submodule's in the order they were
assigned, which is the order an optimizer and ``pp.profile`` see them in.

The rule looks at the tensor, not at where it came from (PyTorch registers only
``nn.Parameter`` values, a type minigraph has not), so an *input* stored on ``self`` in
``forward`` (``self.last_input = x``, for a saliency map) becomes a parameter when ``x``
is a leaf that requires a gradient: it appears in ``parameters()`` and the state dict
(whose earlier copies then no longer load: a key is missing), and an optimizer built
afterwards trains it, writing into the caller's tensor. Keep such an input detached,
``self.last_input = x.detach()`` (the same data, no gradient: a plain attribute), or
outside the module.

Calling a module calls its ``forward``. A forward is written with minigraph functions
only, so the same layer computes on eager tensors (and records on the tape), and builds
nodes when it is given graph nodes (see ``stateless.py`` for graphs whose parameters
are placeholders instead of constants).

``state_dict()`` and ``load_state_dict(sd)`` move the parameters' values out and back in,
with PyTorch's keys (``"0.weight"``, ``"encoder.fc.bias"``); ``mg.save`` and ``mg.load``
put such a dict in a file. ``copy.deepcopy(model)`` and ``pickle`` copy a whole model
(its parameters through ``Tensor``'s own copy rules); ``copy.copy(model)`` is a new
module object over the same parameters and submodules.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import nullcontext
from typing import Any, Iterator, Mapping, NamedTuple

import numpy as np  # load_state_dict reads values through the host format

from ..device import nbytes as array_nbytes
from ..errors import MinigraphError
from ..tensor import Tensor, as_flag, host_values


class StateDictError(MinigraphError, RuntimeError):
    """A state dict that does not fit the model (keys, shapes or dtypes); PyTorch raises a
    RuntimeError for the same mistakes, so ``except RuntimeError`` catches it too."""


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` returns: the keys that did not match (PyTorch's tuple)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """The base class of layers: parameters and submodules by assignment, ``forward``."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})

    # -- registration by assignment ------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        params = self.__dict__.get("_parameters")
        if params is None:
            raise AttributeError(f"{type(self).__name__}: cannot assign {name!r} before "
                                 f"Module.__init__() has run; call super().__init__() first")
        # A name lives in one table. Re-assigning a parameter (or a submodule) keeps its
        # place in its table, as in PyTorch, so the order of parameters() and of the
        # state dict's keys stays the order the layers were built in.
        if value is not None and params.get(name) is value:
            # The parameter itself again: ``lin.weight *= 2`` is ``lin.weight =
            # lin.weight.__imul__(2)``, the same tensor after the in-place write, frozen
            # (requires_grad_(False)) or not. Nothing changes; refusing it here would
            # fail the statement after the weight was written (PyTorch allows it).
            return
        if value is None and (name in params or name in self._modules):
            # PyTorch keeps the name registered, as None: the next tensor (or layer)
            # assigned to it takes the same place in the order, not the last one.
            (params if name in params else self._modules)[name] = None
            return
        # A parameter is a leaf that requires a gradient: a tensor training changes. A
        # result of the model's operations (self.hidden = self.fc(x) in forward) requires
        # a gradient too, but it is an activation, kept as a plain attribute.
        is_param = isinstance(value, Tensor) and value.requires_grad and value.is_leaf
        is_module = isinstance(value, Module)
        if name in params and not is_param:
            # PyTorch's TypeError: a silent unregistering would drop the parameter from
            # parameters() and the state dict (forgetting requires_grad=True, say)
            if not isinstance(value, Tensor):
                what = f"a {type(value).__name__}"
            elif not value.requires_grad:
                what = "a tensor that does not require a gradient"
            else:
                what = "the result of a recorded operation (not a leaf)"
            raise TypeError(f"{type(self).__name__}: cannot assign {what} to parameter "
                            f"{name!r}; assign a leaf tensor that requires a gradient "
                            f"(mg.tensor(..., requires_grad=True)), or None, or del it "
                            f"first")
        if not is_param:
            params.pop(name, None)
        if not is_module:
            self._modules.pop(name, None)
        self.__dict__.pop(name, None)
        if is_param:
            params[name] = value
        elif is_module:
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        # ``del m.bias``: a parameter or a submodule lives in its table, not in __dict__
        for table in (self._parameters, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def __getattr__(self, name: str) -> Any:
        # Called only when ordinary lookup fails: parameters and submodules live in dicts.
        for table in ("_parameters", "_modules"):
            entries = self.__dict__.get(table, {})
            if name in entries:
                return entries[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    # -- the tree -------------------------------------------------------------------------
    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """(dotted name, tensor) for every parameter of the tree, e.g. ``"0.weight"``.

        A walk with an explicit stack (own parameters, then submodules in assignment
        order); a tensor (or a layer) shared by two places is listed once, under its
        first name. A module met again is skipped, as in PyTorch: a module that contains
        itself would otherwise be walked forever.
        """
        out, seen, visited = [], set(), set()
        stack: list[tuple[str, Module]] = [("", self)]
        while stack:
            prefix, module = stack.pop()
            if id(module) in visited:
                continue
            visited.add(id(module))
            for name, p in module._parameters.items():
                if p is not None and id(p) not in seen:  # (None: a slot kept, m.bias = None)
                    seen.add(id(p))
                    out.append((prefix + name, p))
            children = module.named_children()
            stack.extend((f"{prefix}{name}.", m) for name, m in reversed(children))
        return out

    def parameters(self) -> list[Tensor]:
        """Every parameter of the tree, in ``named_parameters()`` order (a list)."""
        return [p for _, p in self.named_parameters()]

    def named_children(self) -> list[tuple[str, "Module"]]:
        """(name, submodule) for the direct submodules, in assignment order; a name kept
        with None (``m.fc = None``) is left out, as in PyTorch."""
        return [(name, m) for name, m in self._modules.items() if m is not None]

    def children(self) -> list["Module"]:
        """The direct submodules, in assignment order."""
        return [m for _, m in self.named_children()]

    # -- state dicts: the parameters' values by name ------------------------------------------
    def _named_tensors(self) -> list[tuple[str, Tensor]]:
        """(key, parameter) for ``state_dict``, PyTorch's way: every path to a parameter.

        Unlike ``named_parameters`` this does not drop repeats: a tensor (or a layer)
        shared by two places gets a key for each, as PyTorch's state_dict does, so the
        keys are the same as the PyTorch model's and loading fills both places.
        """
        return [(prefix + name, p) for prefix, module in self._paths()
                for name, p in module._parameters.items() if p is not None]

    def _paths(self) -> list[tuple[str, "Module"]]:
        """(``"0.block."``-style prefix, module) for every path to every module of the
        tree, this one first (``""``), then each submodule's in assignment order. A
        module inside itself would give endless paths: refused (each entry of the walk
        carries the ids of the modules above it, to see that)."""
        out: list[tuple[str, Module]] = []
        stack: list[tuple[str, Module, frozenset[int]]] = [("", self, frozenset())]
        while stack:
            prefix, module, above = stack.pop()
            if id(module) in above:
                raise StateDictError(f"{type(self).__name__}: the module at "
                                     f"{prefix[:-1]!r} contains itself, so its parameters "
                                     f"have no finite list of names")
            out.append((prefix, module))
            children = module.named_children()
            inside = above | {id(module)}
            stack.extend((f"{prefix}{name}.", m, inside) for name, m in reversed(children))
        return out

    def state_dict(self) -> "OrderedDict[str, Tensor]":
        """The parameters' values by name: ``OrderedDict([("0.weight", ...), ...])``.

        Keys are PyTorch's (own parameters first, then each submodule's under its name and
        a dot, in assignment order). The values are *copies* (tensors that do not require
        a gradient), never the parameters' own arrays: training the model afterwards does
        not change a state dict you took, and changing it does not change the model.
        """
        sd: OrderedDict[str, Tensor] = OrderedDict()
        for key, p in self._named_tensors():
            sd[key] = Tensor(p.device.copy_from(p.data, p.device), p.device)
        return sd

    def load_state_dict(self, state_dict: Mapping[str, Any],
                        strict: bool = True) -> IncompatibleKeys:
        """Copy the values of ``state_dict`` into the parameters, in place.

        The parameters stay the same tensor objects (an optimizer holding them keeps
        working); each gets the value of its key, converted to its dtype and moved to
        its device. Values may be tensors, NumPy arrays, or anything ``np.asarray`` reads
        (a PyTorch CPU tensor included). Everything is checked before anything is
        written, so an error leaves the model exactly as it was:

        * a missing key (a parameter the dict has no value for) or an unexpected key (a
          value no parameter has): with ``strict=True`` one :class:`StateDictError`
          lists both; with ``strict=False`` they are returned instead;
        * a value whose shape differs from the parameter's (named, with both shapes), or
          whose dtype cannot become the parameter's without changing kind (a float into
          an int parameter): always an error. Float64 values load into float32
          parameters (and back), as PyTorch's ``copy_`` converts them.

        Returns ``IncompatibleKeys(missing_keys, unexpected_keys)``, as PyTorch does. A
        tape that recorded a parameter before the load refuses a later ``backward()``
        (the values it saw have changed, chapter 02).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict: expected a dict of name -> value, got a "
                            f"{type(state_dict).__name__}")
        own = self._named_tensors()
        own_keys = {key for key, _ in own}
        missing = [key for key, _ in own if key not in state_dict]
        unexpected = [key for key in state_dict if key not in own_keys]
        problems = []
        if strict and missing:
            problems.append("missing key(s) in state_dict: " + ", ".join(map(repr, missing)))
        if strict and unexpected:
            problems.append("unexpected key(s) in state_dict: "
                            + ", ".join(map(repr, unexpected)))
        # Check and convert every value first; write only when all of them are good.
        ready: list[tuple[Tensor, Any]] = []
        for key, p in own:
            if key not in state_dict:
                continue
            value, problem = _value_for(key, state_dict[key], p)
            if problem:
                problems.append(problem)
            else:
                ready.append((p, value))
        if problems:
            raise StateDictError(f"error(s) in loading state_dict for {type(self).__name__}:"
                                 + "".join("\n  " + line for line in problems)
                                 + "\nNothing was loaded: the model is as it was.")
        for p, value in ready:
            _write_in_place(p, value)
        return IncompatibleKeys(missing, unexpected)

    # -- copies -----------------------------------------------------------------------------
    def __copy__(self) -> "Module":
        """A shallow copy: a new module object over the *same* parameters and submodules.

        The tables are new dicts, so assigning ``copy.weight = ...`` does not change the
        original (PyTorch's shallow copy shares the tables too, which surprises). For
        independent parameters, use ``copy.deepcopy(model)``.
        """
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        object.__setattr__(new, "_parameters", dict(self._parameters))
        object.__setattr__(new, "_modules", dict(self._modules))
        return new

    def zero_grad(self) -> None:
        """Forget the gradients of all parameters (``p.grad = None``, PyTorch's default)."""
        for p in self.parameters():
            p.grad = None

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Freeze (``False``) or unfreeze every parameter of the tree, as PyTorch's: a
        frozen parameter keeps its place in ``parameters()`` and the state dict, gets no
        ``.grad`` from ``backward()``, and an optimizer's ``step()`` leaves it as it is.
        Returns the module, so that ``model.requires_grad_(False)`` can be chained."""
        requires_grad = as_flag(f"{type(self).__name__}.requires_grad_", requires_grad)
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    # -- calling ----------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    # -- printing -----------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """What goes between the parentheses of a leaf module's repr."""
        return ""

    def __repr__(self) -> str:
        if not self._modules:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"{type(self).__name__}("]
        for name, child in self._modules.items():
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        return "\n".join(lines) + "\n)"


def _value_for(key: str, value: Any, p: Tensor) -> tuple[Any, str]:
    """``value`` as an array of ``p``'s device, dtype and shape, or ("", why not)."""
    if isinstance(value, Tensor):
        host = host_values(value)
    else:
        try:
            host = np.asarray(value)
        except Exception as exc:
            return None, f"the value for {key!r} is not an array ({type(value).__name__}: {exc})"
        if not hasattr(value, "dtype") and host.dtype.kind in "OUSV":  # (None, a dict, a
            # str: NumPy made a 0-d object or string array of it, and the error said shape ())
            return None, (f"the value for {key!r} is a {type(value).__name__}, not an array "
                          f"of numbers")
    if tuple(host.shape) != p.shape:
        return None, (f"size mismatch for {key!r}: the value has shape {tuple(host.shape)}, "
                      f"the parameter in the model has shape {p.shape}")
    if host.dtype.kind not in "biuf" or not np.can_cast(host.dtype, np.dtype(p.dtype),
                                                        casting="same_kind"):
        return None, (f"dtype mismatch for {key!r}: a {host.dtype} value cannot become the "
                      f"{p.dtype} parameter without changing its kind")
    try:  # onto the parameter's device now, so that writing later cannot fail halfway
        return p.device.asarray(host, dtype=p.dtype, copy=True), ""
    except Exception as exc:
        return None, f"cannot put the value for {key!r} on {p.device.name}: {exc}"


def _write_in_place(p: Tensor, value: Any) -> None:
    """Write ``value`` into ``p``'s own array and stamp it (the tape's in-place guard)."""
    from ..autodiff.tape import _stamp

    data = p.data
    writable = (not isinstance(data, np.generic)
                and getattr(getattr(data, "flags", None), "writeable", True))
    with p.device.context or nullcontext():
        if writable:
            data[...] = value
        else:  # a NumPy scalar or a read-only view cannot be written: the tensor gets a
            p.data = value  # new array of its own (still the same Tensor object), counted
            nbytes = array_nbytes(value)
            p.device.live_bytes += nbytes - p._nbytes
            p.device.peak_bytes = max(p.device.peak_bytes, p.device.live_bytes)
            p._nbytes = nbytes
    _stamp(p)


class Sequential(Module):
    """Layers applied one after the other: ``Sequential(Linear(8, 16), ReLU(), ...)``.

    ``model[i]`` is layer i, ``model[a:b]`` a Sequential of the same layer objects (the
    parameters are shared, not copied): that is how a pipeline cuts a model into stages.
    A slice keeps the layers' names, as PyTorch's does, so ``model[1:]``'s state dict
    has the keys ``"2.weight"`` that the whole model's has, not renumbered ones.
    """

    def __init__(self, *layers: Module):
        super().__init__()
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential: argument {i} is a {type(layer).__name__}, "
                                f"not a Module")
            self._modules[str(i)] = layer

    def forward(self, x: Any) -> Any:
        for layer in self._modules.values():
            x = layer(x)
        return x

    def append(self, layer: Module) -> "Sequential":
        if not isinstance(layer, Module):
            raise TypeError(f"Sequential.append: a {type(layer).__name__} is not a Module")
        # PyTorch's name, str(len(self)): ["0", "head"] gets "2". After a slice (names
        # "1", "2") that would replace layer "2", so never a number below one in use
        # (a named layer, s.head = ..., has a name that is not a number).
        after = [int(key) + 1 for key in self._modules if key.isdecimal()]
        self._modules[str(max([len(self._modules), *after]))] = layer
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def __getitem__(self, index: "int | slice") -> Any:
        layers = list(self._modules.values())
        if isinstance(index, slice):
            part = Sequential()
            part._modules.update(list(self._modules.items())[index])  # names kept
            return part
        try:
            return layers[index]
        except IndexError:
            raise IndexError(f"Sequential: index {index} is out of range for "
                             f"{len(layers)} layers") from None
