"""``Module`` and ``Sequential``: layers that own their parameters (PyTorch's names).

A :class:`Module` is a function with state. Its *parameters* are the tensors it owns
that training changes; its *submodules* are the layers it is built from. Both are found
by assignment, as in PyTorch: ``self.weight = mg.tensor(..., requires_grad=True)``
registers a parameter (a tensor attribute that requires a gradient), and
``self.fc = Linear(...)`` registers a submodule. ``parameters()`` then lists every
parameter of the tree, own ones first, then each submodule's in the order they were
assigned, which is the order an optimizer and ``pp.profile`` see them in.

Calling a module calls its ``forward``. A forward is written with minigraph functions
only, so the same layer computes on eager tensors (and records on the tape), and builds
nodes when it is given graph nodes (see ``stateless.py`` for graphs whose parameters
are placeholders instead of constants).
"""

from __future__ import annotations

from typing import Any, Iterator

from ..tensor import Tensor


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
        params.pop(name, None)
        self._modules.pop(name, None)
        self.__dict__.pop(name, None)
        if isinstance(value, Tensor) and value.requires_grad:
            params[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

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
        order); a tensor shared by two layers is listed once, under its first name.
        """
        out, seen = [], set()
        stack: list[tuple[str, Module]] = [("", self)]
        while stack:
            prefix, module = stack.pop()
            for name, p in module._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((prefix + name, p))
            children = list(module._modules.items())
            stack.extend((f"{prefix}{name}.", m) for name, m in reversed(children))
        return out

    def parameters(self) -> list[Tensor]:
        """Every parameter of the tree, in ``named_parameters()`` order (a list)."""
        return [p for _, p in self.named_parameters()]

    def children(self) -> list["Module"]:
        """The direct submodules, in assignment order."""
        return list(self._modules.values())

    def zero_grad(self) -> None:
        """Forget the gradients of all parameters (``p.grad = None``, PyTorch's default)."""
        for p in self.parameters():
            p.grad = None

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


class Sequential(Module):
    """Layers applied one after the other: ``Sequential(Linear(8, 16), ReLU(), ...)``.

    ``model[i]`` is layer i, ``model[a:b]`` a Sequential of the same layer objects (the
    parameters are shared, not copied): that is how a pipeline cuts a model into stages.
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
        self._modules[str(len(self._modules))] = layer
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def __getitem__(self, index: "int | slice") -> Any:
        layers = list(self._modules.values())
        if isinstance(index, slice):
            return Sequential(*layers[index])
        try:
            return layers[index]
        except IndexError:
            raise IndexError(f"Sequential: index {index} is out of range for "
                             f"{len(layers)} layers") from None
