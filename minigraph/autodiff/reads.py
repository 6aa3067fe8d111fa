"""What a function reads from outside its arguments, by name.

A compiled program (graph mode, ``mg.trace``, source mode) is built by running, or
reading, f once; what f read from outside its arguments then became a constant of the
program: a global (``SCALE``), a closure variable, a default value, an attribute
(``CONFIG.lr``, ``self.scale``, ``Settings.lr``, ``config.lr``), an item of a list or
dict (``PARAMS[0]``, ``CFG["w"]``), a module's parameter (``layer.weight``).
:func:`outside_reads` lists each with the dict, closure cell or container that holds
it, so that :func:`rebound` can tell, on every call, whether one of those places now
holds another object: the program is then stale (``signature.Captured``, which also
compares the arrays among them with copies), as ``torch.compile``'s guards say, where
``jax.jit`` would go on with the old value. ``mg.checkpoint`` and ``vjp_fn`` ask the
same before they run f again.

The same values must not be *written* by f where eager mode would write them a
different number of times: once while a program is recorded (:class:`recording`), twice
by forward mode's runs or a checkpoint's recomputation. :func:`read_only_arrays` makes
them read-only while f runs, so the write raises at the user's line before it is made.
"""

from __future__ import annotations

import array
import builtins
import collections
from collections import abc
import dis
import functools
import importlib.util
import operator
import os
import sys
import weakref
from contextlib import contextmanager
from types import (CodeType, FunctionType, MappingProxyType, MemberDescriptorType, MethodType,
                   ModuleType)
from typing import Any, Iterator, NamedTuple

import numpy as np
from array_api_compat import array_namespace, is_array_api_obj

from ..errors import GradientError, MinigraphError
from ..ops.operators import LIBRARIES, ArrayOps, raised_at
from ..tensor import Tensor, owner, write_target


_UNBOUND = object()  # a name absent from where it is looked up
_BUILTINS = vars(builtins)


def read_from_outside(f: Any) -> dict[str, Any]:
    """What f's own code reads from outside its arguments (:func:`outside_reads`, not
    looking into the functions it calls), by name; none for a callable that is not a
    Python function (a partial, an object)."""
    return {name: value for where, name, value in outside_reads(f, depth=0)
            if type(where) not in (_Items, _Code, _Keys, _Mro) and value is not _UNBOUND}


def outside_reads(f: Any, depth: int | None = None,
                  arguments: "abc.Sequence[tuple[int, Any]]" = ()) -> list[tuple[Any, str, Any]]:
    """``(where, name, value)`` for what f reads from outside its arguments, ``where``
    being the dict, closure cell or container that holds ``value`` under ``name``:

    * f's code itself (``f.__code__`` may be replaced);
    * the globals and closure variables f's code reads (its comprehensions' and nested
      functions' code too; every global where it may name one at run time:
      ``globals()["W"]``; a builtin's name as a global absent), the modules it imports
      in its body (``import cfg``, ``from cfg import SCALE``: :func:`_imported`), and
      its parameters' default values;
    * the attributes of those objects, and of a method's ``self``, that the code loads
      (``CONFIG.lr``, ``self.scale``, ``case Cfg(scale=s)``: :func:`names_in`), where
      Python finds them (:func:`_attributes`: an object's own dict, its class's, a
      class's or its metaclass's, a module's of the user's or ``os``'s (``os.environ``);
      a base class's too where the code calls ``super()``), or all of them, and one
      added later, where the code may name one at run time (``getattr(obj, name)``,
      ``hasattr``, an ``operator.attrgetter``);
    * the items of the lists, dicts, sets ... among them (``_CONTAINERS``), nested, as
      one entry per container (an ``_Items``, its items compared as a whole: one bound
      anew, added or removed), and the named attributes of those items (at most
      ``_MOST_INSIDE`` objects looked inside per function: more are refused);
    * every parameter and layer of a module (``nn.Module``: its ``_parameters`` and
      ``_modules``, the whole tree) that f is, or reads, and what each layer's forward
      reads; but not the parameters of a module that f runs with its parameters as
      arguments (:class:`ParametersAsArguments`: ``mg.checkpoint(module)``'s call);
    * what the user's functions, methods, properties, static and class methods,
      ``__getattr__`` and callable objects among them read (:func:`_followed`), and the
      special methods that Python calls on their objects without the code naming them
      (``CFG["k"]``: ``__getitem__``, ``float(NUM)``, a descriptor's ``__get__``, a
      metaclass's property: :func:`_special`), however deep (``depth`` calls further,
      if given); not what minigraph's or an installed library's code reads; and which
      class each object is (``obj.__class__ = Other``: :class:`_Mro`).

    A compiled program (``signature.Captured``) keeps them, to see a name bound anew
    (``W = ...``, ``layer.weight = ...``). A transformed function (``mg.grad(f)``,
    ``mg.trace(f)``, whose ``__wrapped__`` is f) reads what f reads; a decorator's
    wrapper (``functools.wraps``) that too, and what its own code reads; a
    ``functools.partial`` what its function reads, and the arguments it passes, and
    what they hold.

    ``arguments``: ``(position, value)`` of f's arguments that are constants of a
    compiled program (``signature.constant_arguments``: a function, a bound method, a
    transformed function, a config object, a tuple of them), read as a partial's
    arguments are: what a function passed to f reads (``outer(x, fn)``, whose fn reads
    ``SCALE``) is a constant of the program as much as what f reads itself.

    Minigraph's and an installed library's functions are not read (:func:`_users`): their
    globals, closure variables and defaults are the library's own state, which changes
    as it runs (``levels.running``, the levels of the transformations running), not the
    user's; only what they are given is (a partial's arguments, the attributes of their
    object that their code names: a layer's weight, the f of checkpoint's wrappers).

    An object that one function reads may reach another as an argument (f calls
    ``helper(CFG)``, whose code reads ``c.scale``), so the attributes that any of the
    functions names are looked up on every object that any of them reads: the reads are
    found again with the names the functions found name, until they name no more."""
    names = Named(frozenset(), False)
    while True:  # (names only grow, and code names finitely many: this ends)
        found, named, complete = _reads(f, depth, arguments, names)
        if complete:
            return found
        names = named


class Named(NamedTuple):
    """The attributes that the functions :func:`_reads` read name: by name, and whether
    one names them at run time (``getattr(obj, name)``: then every one)."""

    attributes: frozenset[str]
    any: bool


def _reads(f: Any, depth: int | None, arguments: "abc.Sequence[tuple[int, Any]]",
           names: Named) -> tuple[list[tuple[Any, str, Any]], Named, bool]:
    """One pass of :func:`outside_reads`, looking up ``names`` on every object read as
    well as what each function's own code names; also what all the functions name, and
    whether each object was looked up with all of it (one function: always)."""
    found: list[tuple[Any, str, Any]] = []
    named_all, named_any = names.attributes, names.any  # (what all the functions name)
    looked_up: list[frozenset[str] | None] = []  # (the names each function's objects
    # were looked up with; None: every attribute)
    todo, seen = [(f, 0)], set()
    as_arguments: set[int] = set()  # (the ids of the modules' tables of parameters that
    # hold f's arguments: ParametersAsArguments)
    listed: set[int] = set()  # (the ids of the modules whose tables are listed)
    held = {f"argument {k}": a for k, a in arguments}  # (where f's constant arguments are)
    start = [(held, name, a) for name, a in held.items()]  # (read with f, the first one)
    while todo:
        fn, level = todo.pop()
        passed, start = start, []  # (a partial's arguments: f reads them too,
        for _ in range(100):  # and inside them)  (a bound: a chain of wrappers, no cycle)
            if isinstance(fn, functools.partial):  # (its arguments are never bound anew)
                given = {f"argument {k} of the partial": a for k, a in enumerate(fn.args)}
                passed += [(given, k, a) for k, a in given.items()]
                passed += [(fn.keywords, k, a) for k, a in fn.keywords.items()]
                fn = fn.func
            elif isinstance(fn, (staticmethod, classmethod)):  # (one read from a class
                fn = fn.__func__                                # dict, as it is there)
            elif (inner := _wrapped(fn)) is not _UNBOUND:
                if type(fn) is FunctionType:  # (a decorator's wrapper: its own reads, if
                    todo.append((inner, level))  # the user's, and f's)
                    break
                fn = inner
            else:
                break
        found += passed
        key = (id(fn.__func__), id(fn.__self__)) if isinstance(fn, MethodType) else id(fn)
        if key in seen:  # (a bound method is made anew on each access: its parts say)
            continue
        seen.add(key)
        if isinstance(fn, ParametersAsArguments):  # (mg.checkpoint(module)'s call)
            as_arguments.update(id(m.__dict__["_parameters"]) for m in _tree(fn.module))
            fn = fn.module
        if _layers(fn) is not None:  # a module: its tree, and its forward's globals
            tree = _tree(fn, listed)  # (a layer's tree, listed with its module's: not again)
            found += _module_reads(tree, as_arguments)
            if depth is None or level < depth:  # (its layers' forwards too: the code's
                todo += [(m, level + 1) for m in tree[1:]]  # self.inner is in a table)
            fn = getattr(fn, "forward", None)
        elif not isinstance(fn, (FunctionType, MethodType)) and \
                type(getattr(type(fn), "__call__", None)) is FunctionType:
            fn = MethodType(type(fn).__call__, fn)  # an object called: its __call__ and self
        owner = fn.__self__ if isinstance(fn, MethodType) else None
        fn = fn.__func__ if isinstance(fn, MethodType) else fn
        if type(fn) is not FunctionType:
            continue
        code = fn.__code__
        named = names_in(code)
        attributes = named.attributes | names.attributes
        reads: list[tuple[Any, str, Any]] = []
        users = _users(fn)
        if users:  # (the one test: a library's function reads none of its own state)
            found.append((_Code(fn), f"the code of {fn.__qualname__}", code))  # (f.__code__
            module = fn.__globals__                            # = ...: a cell run again)
            read = named.globals
            if not named.globals.isdisjoint(_ANY_GLOBAL):  # (globals()["W"]: any)
                read = read | {n for n in module if not n.startswith("__")}
            # (a builtin's name, read while no global has it: a global of that name made
            # later, len = ..., is read instead)
            reads += [(module, n, module[n] if n in module else _UNBOUND)
                      for n in sorted(read) if n in module or n in _BUILTINS]
            reads += _imported(fn, named.modules) if named.modules else []
            for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
                try:
                    reads.append((cell, name, cell.cell_contents))
                except ValueError:  # (a cell not yet filled)
                    continue
            defaults = _Defaults(fn)  # (f(x, w=W): W is read when a call leaves w out)
            reads += [(defaults, n, v) for n, v in defaults.items()]
        # Inside the objects read: the attributes the code names (self.scale, CONFIG.lr),
        # and every item of a list or dict (PARAMS[0], CFG["w"]), nested, and theirs.
        labelled = [("self", owner)] + [(n, v) for _, n, v in passed + reads]
        every_attribute = names.any or not (
            named.globals.isdisjoint(_ANY_ATTRIBUTE_GLOBALS) and
            named.attributes.isdisjoint(_ANY_ATTRIBUTE_ATTRIBUTES)) or \
            not _BY_NAME.isdisjoint({type(v) for _, v in labelled})  # (attrgetter("lr"))
        if users:  # (the user's functions hand the user's objects to each other; a
            # library's code names its own objects' attributes, many: not collected)
            named_all |= attributes
            named_any = named_any or every_attribute
        looked_up.append(None if every_attribute else attributes)
        overridden = "super" in named.globals  # (super().forward: a base class's too)
        inside: set[int] = set()
        # (a partial's arguments go to code that may name any of their attributes)
        given_whole = {id(v) for _, _, v in passed}
        methods = []  # (the user's methods that the code may call on an object read)
        for label, obj in labelled:  # (the list grows as items and attributes are found)
            if id(obj) in inside or type(obj) in _ATOMS and not is_container(obj) or \
                    _constant_tuple(obj) or id(obj) in as_arguments:
                continue  # (a tuple of numbers cannot change: its container's items see it;
                # a table of parameters that are f's arguments is not read from outside)
            if len(inside) == _MOST_INSIDE:
                raise _too_large(fn, label, labelled)
            inside.add(id(obj))
            if is_container(obj):  # (a tuple's items cannot be bound anew, but an array
                # among them can be written: its items are watched too)
                keys, values = snapshot = _snapshot(obj)
                reads.append((_Items(obj), f"an item of {label}", snapshot))
                labelled += [(f"{label}[{k!r}]", v) for k, v in
                             zip(range(len(values)) if keys is None else keys, values)]
                continue
            if type(obj) is memoryview:  # (one that is_container cannot list)
                raise MinigraphError(
                    f"{fn.__qualname__} reads {label}, a memoryview that is released or "
                    f"not one-dimensional, whose items minigraph cannot watch (a compiled "
                    f"program is built again when what f reads changes). Read it as a "
                    f"NumPy array (np.frombuffer, watched whole), or pass it as an argument")
            wanted = None if every_attribute or id(obj) in given_whole else sorted(attributes)
            stored = next((_STORED[c] for c in type(obj).__mro__ if c in _STORED), None)
            if wanted is not None and stored is not None:  # (a UserDict subclass's items
                wanted.append(stored)  # are in its .data, which UserDict's methods read)
            found_in = _attributes(obj, wanted, overridden)
            # (and the special methods of its user classes, which Python calls without
            # their names in the code: CFG["k"] runs __getitem__, float(NUM) __float__,
            # CFG.scale __getattr__ or __getattribute__, a descriptor read its __get__)
            special = _special(obj)
            reads += found_in + special
            found_in = [r for r in found_in if type(r[0]) not in (_Keys, _Mro)]  # (by name)
            labelled += [(f"{label}.{n}", v) for _, n, v in found_in if v is not _UNBOUND]
            methods += [m for home, _, v in found_in + special
                        if (m := _method(obj, home, v)) is not None]
        found += reads
        if depth is None or level < depth:  # (the functions read, items included:
            items = [i for w, _, v in reads if type(w) is _Items for i in v[1]]  # OPS["act"])
            todo += [(v, level + 1) for v in [v for _, _, v in passed + reads] + items + methods
                     if _followed(v)]
    complete = all(a is None or not named_any and a >= named_all for a in looked_up)
    return found, Named(named_all, named_any), complete


def _followed(v: Any) -> bool:
    """Whether :func:`outside_reads` reads what ``v``, a value f reads, reads in turn, as
    f may call it: a module; the user's function or method, or a wrapper of any function
    (``functools.wraps``, ``mg.grad``'s, ``mg.trace``'s and source mode's objects); a
    partial; a static or class method; an object of the user's class with ``__call__``."""
    kind = type(v)
    if kind in (FunctionType, MethodType):
        return _wrapped(v) is not _UNBOUND or _users(v)
    if kind in (functools.partial, staticmethod, classmethod) or _layers(v) is not None:
        return True
    return not isinstance(v, type) and callable(v) and (
        _wrapped(v) is not _UNBOUND or
        type(getattr(kind, "__call__", None)) is FunctionType and _users_class(kind))


def _wrapped(fn: Any) -> Any:
    """The function that ``fn`` wraps (``fn.__wrapped__``: ``functools.wraps``'s, or
    minigraph's transformations'), or ``_UNBOUND``: looked up where they put it, ``fn``'s
    own dict (a method's is its function's) or a class's, not through a ``__getattr__``
    of ``fn``'s class, which may answer every name (``return self._d.get(name)``)."""
    own = getattr(fn, "__dict__", None)
    if isinstance(own, dict) and "__wrapped__" in own:
        return own["__wrapped__"]
    if hasattr(type(fn), "__wrapped__"):  # (a slot, a property)
        return getattr(fn, "__wrapped__", _UNBOUND)
    return _UNBOUND


def _method(obj: Any, home: Any, v: Any) -> Any:
    """What calling attribute ``v`` of ``obj`` (found in ``home``) may run, whose reads
    :func:`outside_reads` then reads: a static method's function, a class method with
    its class, an object's method or property (its class's) with the object as self, a
    class's (its metaclass's: ``Settings.scale``) with the class; None for anything
    else (an object's own attribute, a class's own function: read as values)."""
    if type(v) is staticmethod:
        return v.__func__
    if type(v) is classmethod:
        return MethodType(v.__func__, obj if isinstance(obj, type) else type(obj))
    kind: type = type(obj)
    if isinstance(obj, ModuleType) or home is getattr(obj, "__dict__", None) or \
            isinstance(obj, type) and not any(  # (found in a metaclass's dict: by value,
                v is w for c in kind.__mro__ if _users_class(c)  # as a class's dict is
                for w in c.__dict__.values()):  # a new view on each access)
        return None
    method = v.fget if type(v) is property else v
    return MethodType(method, obj) if type(method) is FunctionType else None


# The special methods that Python never calls on an object that exists (it makes one, or
# a class), and those it calls on a class that is called (Cfg() runs them).
_MAKING = frozenset({"__new__", "__init__"})
_NOT_ON_AN_OBJECT = _MAKING | {"__del__", "__init_subclass__", "__set_name__",
                               "__class_getitem__"}
_CODE = (FunctionType, staticmethod, classmethod, property)  # (what a class's may be)


def _special(obj: Any) -> list[tuple[Any, str, Any]]:
    """``(where, name, value)`` for the special methods (``__getitem__``, ``__float__``,
    ``__mul__``, ``__getattr__``, ``__get__`` ...) that Python may call on ``obj``
    without the code naming them (``CFG["k"]``, ``float(NUM)``, ``2 * SCALER``, a
    descriptor read), those of its user classes, each where Python finds it (not in the
    object's own dict): what they read is what f reads (:func:`_method`). Of a class, its
    metaclass's (``Settings["lr"]``), and its own ``__new__`` and ``__init__``, which
    calling it runs (``Cfg()``). A module's and a function's: none."""
    if isinstance(obj, (ModuleType, FunctionType)):
        return []
    kinds: list[Any] = [type(obj)] + ([obj] if isinstance(obj, type) else [])
    found: list[tuple[Any, str, Any]] = []
    for kind in kinds:
        names: set[str] = set()  # (found in a class before: it overrides the others)
        for c in kind.__mro__:
            if not _users_class(c):
                continue
            home = c.__dict__
            found += [(home, n, v) for n, v in home.items()
                      if n.startswith("__") and n.endswith("__") and n not in names and
                      type(v) in _CODE and
                      (n in _MAKING if kind is obj else n not in _NOT_ON_AN_OBJECT)]
            names.update(home)
    return found


def _attributes(obj: Any, names: "list[str] | None", overridden: bool = False
                ) -> list[tuple[Any, str, Any]]:
    """``(where, name, value)`` for the attributes of ``obj`` among ``names`` (None: all
    those of its own dict, and which ones each dict holds: :class:`_Keys`), where Python
    finds them: an object's own dict, then its class's and its bases' (the user's classes
    only); a class's and its bases'; a user's module's (not minigraph's or a library's).
    A class attribute read through an object is also recorded as absent from the
    object's own dict, and one of a base class from the dicts of the classes before it,
    so that one set there later (``obj.lr = 0.5`` over ``class C: lr = 2.0``,
    ``Sub.lr = 0.5`` over ``Base.lr``) is seen; so is one that none has, where the
    object's class has ``__getattr__``, which then made it.
    ``overridden``: also those that the first one found overrides, in the classes after
    it, which code that calls ``super()`` reaches (``super().forward(x)``).

    A class's attributes are looked for in its metaclass's dicts too, after its own (a
    property of the metaclass, ``Settings.scale``, which Python prefers to the class's
    own: both are recorded, as ``overridden``). Which classes Python looks in (an
    object's class and their bases: ``type(obj).__mro__``, a class's ``__mro__``) is
    recorded too (:class:`_Mro`): ``obj.__class__ = Other`` or ``Sub.__bases__ = ...``
    later makes another class's attribute the one read."""
    own = None
    homes: list[Any]  # (dicts, and a class's read-only view of its dict)
    what = obj.__name__ if isinstance(obj, (type, ModuleType)) else f"a {type(obj).__name__}"
    classes: list[tuple[Any, str, Any]] = []  # (where the classes are: none for a module)
    if isinstance(obj, ModuleType):
        # (and os's: os.environ, the process's environment, which the user's code sets)
        homes = [obj.__dict__] if _users_module(obj) or obj is os else []
    elif isinstance(obj, type):
        kind: type = type(obj)
        meta = [c.__dict__ for c in kind.__mro__ if _users_class(c)]
        homes = [c.__dict__ for c in obj.__mro__ if _users_class(c)] + meta
        overridden = overridden or bool(meta)
        classes = [(_Mro(obj), f"the bases of {what}", obj.__mro__)]
    elif isinstance(obj, FunctionType):
        return []
    else:
        own = getattr(obj, "__dict__", None)
        own = own if type(own) is dict else None
        homes = ([own] if own is not None else []) + \
            [c.__dict__ for c in type(obj).__mro__ if _users_class(c)]
        classes = [(_Mro(obj), f"the class of {what}", type(obj).__mro__)]
    if not homes:
        return []
    dynamic = own is not None and type(getattr(type(obj), "__getattr__", None)) is FunctionType
    found = classes
    if names is None:  # (every one: also one added or removed later, which
        # hasattr(CFG, "bias") and getattr(CFG, "bias", 0.0) read while absent)
        found += [(_Keys(home), f"the attributes {what} has", tuple(home)) for home in homes]
    if names is None:  # (every one: the object's own, and its classes' but their
        # special names: getattr(cfg, "lr") finds a class attribute as cfg.lr does)
        names = list(dict.fromkeys([*homes[0], *(n for home in homes[1:] for n in home
                                                 if not n.startswith("__"))]))
    for n in names:
        for k, home in enumerate(homes):
            if n in home:
                found += [(before, n, _UNBOUND) for before in homes[:k]]
                value = home[n]
                if type(value) is MemberDescriptorType and not isinstance(obj, type):
                    home, value = _Slots(obj), getattr(obj, n, _UNBOUND)  # (__slots__)
                found.append((home, n, value))
                if overridden:
                    found += [(later, n, later[n]) for later in homes[k + 1:] if n in later]
                break
        else:  # (in none: its class's __getattr__ may make it, until one is set)
            found += [(home, n, _UNBOUND) for home in homes] if dynamic else []
    return found


def _users_module(m: Any) -> bool:
    """Whether module ``m`` is the user's: neither minigraph's nor a library's."""
    if m is None or m.__name__.startswith("minigraph"):
        return False
    path = getattr(m, "__file__", None)  # (a notebook's __main__ has none)
    return m.__name__ == "__main__" or \
        isinstance(path, str) and not path.startswith(LIBRARIES)


def _users_class(c: type) -> bool:
    return c is not object and _users_module(sys.modules.get(c.__module__))


def _layers(v: Any) -> dict | None:
    """A module's table of layers (``nn.Module._modules``), None for anything else."""
    own = getattr(v, "__dict__", None) if not isinstance(v, type) else None
    if type(own) is not dict:  # (none; or a __getattr__'s answer for any name)
        return None
    table = own.get("_modules")
    return table if type(table) is dict and type(own.get("_parameters")) is dict else None


def _tree(module: Any, seen: "set[int] | None" = None) -> list[Any]:
    """``module`` and every module inside it, each once (a shared layer, a cycle), but
    those whose ids are in ``seen``, to which theirs are added."""
    found, todo, seen = [], [module], set() if seen is None else seen
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        found.append(m)
        todo += [v for v in m.__dict__["_modules"].values() if _layers(v) is not None]
    return found


def _module_reads(tree: list[Any], as_arguments: "set[int] | frozenset[int]" = frozenset()
                  ) -> list[tuple[Any, str, Any]]:
    """Every parameter and layer of the modules of ``tree`` (:func:`_tree`), where they
    keep them; not the parameters in the tables whose ids are in ``as_arguments``."""
    tables = [t for m in tree for t in (m.__dict__["_parameters"], m.__dict__["_modules"])]
    return [(t, name, value) for t in tables if id(t) not in as_arguments
            for name, value in t.items()]


class ParametersAsArguments:
    """The base of a callable that runs ``self.module`` with the module's parameters
    given as its arguments, swapped into it (``nn.functional_call``), as
    ``mg.checkpoint(module)`` runs it. What it reads from outside its arguments is what
    the module reads, but not the module's parameters: their slots hold the arguments
    only while it runs (an enclosing ``functional_call`` puts the module's own back
    after its forward pass), and what they hold then is what it computes with."""

    module: Any


def _users(fn: Any) -> bool:
    """Whether the function (or method) ``fn`` is the user's code: neither minigraph's
    nor a library's."""
    fn = getattr(fn, "__func__", fn)
    return not (fn.__module__ or "").startswith("minigraph") and \
        not fn.__code__.co_filename.startswith(LIBRARIES)


# Names with which code reads an attribute, or a global, that it names at run time, not
# in its text: builtins (and operator's functions) it loads as globals, attributes it
# loads (obj.__dict__, operator.attrgetter; object.__getattribute__(self, name), which a
# class's __getattribute__ calls; a class pattern's __match_args__, which names_in adds
# for ``case Cfg(s)``), and the objects among its reads that do so.
_ANY_ATTRIBUTE_GLOBALS = frozenset({"getattr", "hasattr", "vars", "attrgetter", "methodcaller"})
_ANY_ATTRIBUTE_ATTRIBUTES = frozenset({"__dict__", "attrgetter", "methodcaller",
                                       "__match_args__", "__getattribute__"})
_BY_NAME = frozenset({operator.attrgetter, operator.methodcaller})  # (their types: made
# outside f, called inside)
_ANY_GLOBAL = frozenset({"globals", "eval", "exec"})  # (loaded as globals)


class Names(NamedTuple):
    """The names a function's code uses (:func:`names_in`), by what it does with them."""
    globals: frozenset[str]     # loaded as globals (or builtins): W in W @ x
    attributes: frozenset[str]  # loaded as attributes: w in self.w, rand in np.random.rand;
    # imported from a module (SCALE in from cfg import SCALE); a class pattern's (scale in
    # case Cfg(scale=s))
    modules: frozenset[str]     # imported: cfg in import cfg, a dot per level before a
    # relative import's (.cfg in from .cfg import SCALE, "." in from . import cfg)


# Python's instructions that load a name as a global (LOAD_NAME: a class body's, which
# falls back to the globals), and those that load an attribute (IMPORT_FROM: a module's).
_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"})
_ATTRIBUTE_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR", "IMPORT_FROM"})
# code -> its Names, found once per code object (outside_reads runs on every call of a
# checkpoint; reading the bytecode costs some microseconds per instruction)
_NAMES: "weakref.WeakKeyDictionary[CodeType, Names]" = weakref.WeakKeyDictionary()


def names_in(code: CodeType) -> Names:
    """The names ``code`` and its comprehensions' and nested functions' code (constants
    of it) use. ``co_names`` alone mixes globals with attributes (``self.w`` and a
    global ``w`` are one entry), so the instructions that load each are read: a global
    ``w`` that f never loads is not one f reads, however its attributes are named. A
    module imported inside the code (``import cfg``, ``from cfg import SCALE``) is read
    as a global module is; a class pattern (``case Cfg(scale=s)``) reads the attributes
    it names, and those its class's ``__match_args__`` names for its positional ones."""
    named = _NAMES.get(code)
    if named is None:
        globals_: set[str] = set()
        attributes: set[str] = set()
        modules: set[str] = set()
        codes = [code]
        while codes:
            c = codes.pop()
            codes += [k for k in c.co_consts if type(k) is CodeType]
            before: list[Any] = [None, None]  # (the two constants loaded last)
            for instruction in dis.get_instructions(c):
                op, name = instruction.opname, instruction.argval
                if op in _GLOBAL_LOADS:
                    globals_.add(name)
                elif op in _ATTRIBUTE_LOADS:
                    attributes.add(name)
                elif op == "IMPORT_NAME":  # (after LOAD_CONST level, LOAD_CONST fromlist)
                    level = before[0] if type(before[0]) is int else 0
                    modules.add("." * level + name)
                elif op == "MATCH_CLASS":  # (after LOAD_CONST of its keywords' names)
                    attributes.update(before[1] if type(before[1]) is tuple else ())
                    if instruction.arg:  # (positional sub-patterns: __match_args__'s)
                        attributes.add("__match_args__")
                if op == "LOAD_CONST":
                    before = [before[1], name]
        named = _NAMES[code] = Names(frozenset(globals_), frozenset(attributes),
                                     frozenset(modules))
    return named


def _imported(fn: FunctionType, modules: frozenset[str]) -> list[tuple[Any, str, Any]]:
    """``(sys.modules, name, module)`` for the modules that ``fn``'s code imports
    (:func:`names_in`: ``import cfg`` or ``from cfg import SCALE`` inside f, whose names
    are f's locals, not globals) and the packages above them, as Python finds them when
    f runs; absent (``_UNBOUND``) for one not imported yet. Their attributes that the
    code names are then read as a global module's are."""
    package = fn.__globals__.get("__package__")
    found: dict[str, Any] = {}
    for name in modules:
        try:
            name = importlib.util.resolve_name(name, package)
        except (ImportError, ValueError):  # (a relative import outside a package: f
            continue                       # raises there)
        parts = name.split(".")
        for k in range(1, len(parts) + 1):
            found.setdefault(".".join(parts[:k]), None)
    return [(sys.modules, n, sys.modules.get(n, _UNBOUND)) for n in sorted(found)]


# How many objects outside_reads looks inside (their attributes, a container's items)
# per function: a bound on the work, for a function that reads a very large structure,
# which it refuses (_too_large) rather than leave a part of it unwatched. The walk is
# linear, but a checkpoint walks again on every call, and a compiled program checks
# every read on every call: a Sequential of 5,000 layers without parameters (10,000
# objects) takes 0.2 s to walk, one of 20,000 layers 0.6 s (1.3 s on a busy machine),
# more than the tape takes for its forward and backward pass (0.45 s).
_MOST_INSIDE = 10_000
# The containers whose items outside_reads watches (an item bound anew, added, removed),
# and the values with nothing inside to watch (a tensor or an array is compared whole).
_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque, array.array, bytearray,
               MappingProxyType)
# The standard library's containers that keep their items in an attribute of theirs,
# by which outside_reads watches a subclass's (whose own methods it follows).
_STORED = {collections.UserDict: "data", collections.UserList: "data",
           collections.ChainMap: "maps"}


def is_container(obj: Any) -> bool:
    """Whether ``obj``'s items are watched as a container's (and a constant argument keyed
    by them, signature._held): the types above and their subclasses, whose items are
    stored, a dict's read-only view (``MappingProxyType``: its dict's), the standard
    library's UserDict, UserList and ChainMap themselves, the process's environment
    (``os.environ``, a mapping of strings that the code reads and sets), and a
    one-dimensional ``memoryview`` (its bytes: :func:`_snapshot`). Not any other mapping
    or sequence: a user's may compute its items on demand (a lazy table, a dataset that
    loads or raises for an item, ``range(10**9)``), and copying them all on every call
    would run that code (it ran 14,000 loads, or raised); a subclass of UserDict's is
    watched through its ``.data`` (``_STORED``). A NumPy array of objects is one too (a
    table of tensors: its items are objects, which a comparison of its values would
    compare elementwise)."""
    return isinstance(obj, _CONTAINERS) or type(obj) in _STORED or \
        type(obj) is type(os.environ) or \
        (type(obj) is np.ndarray and obj.dtype.kind == "O") or \
        type(obj) is memoryview and _dimensions(obj) == 1
_CONSTANTS = frozenset({int, float, bool, complex, str, bytes, type(None)})
_ATOMS = _CONSTANTS | {Tensor, np.ndarray}


def _dimensions(view: memoryview) -> int | None:
    """How many dimensions memoryview ``view`` has; None once it is released."""
    try:
        return view.ndim
    except ValueError:  # ("operation forbidden on released memoryview object")
        return None


def _constant_tuple(v: Any) -> bool:
    """Whether ``v`` is a tuple of numbers and strings (a module's checkpoint's names of
    its parameters), which cannot change: the container holding it sees it replaced."""
    return type(v) is tuple and all(type(item) in _CONSTANTS for item in v)


def _too_large(fn: FunctionType, label: str, labelled: list[tuple[str, Any]]
               ) -> MinigraphError:
    """The refusal of a function that reads more than ``_MOST_INSIDE`` objects, found
    at ``label`` (``labelled``: the objects read so far, by label); what to do instead
    for a module (its layers) or another structure."""
    root = label.replace("[", ".").split(".")[0]  # (BIG, of BIG[9999][0])
    held = next((v for name, v in labelled if name == root), None)
    found = f"{fn.__qualname__} reads {root} from outside its arguments, "
    built = ("a compiled program (graph or source mode, mg.trace, mg.checkpoint) is built "
             "again when what f reads changes")
    if _layers(held) is not None:
        return MinigraphError(
            f"{found}a module of {len(_tree(held)):,} layers, with more than "
            f"{_MOST_INSIDE:,} lists, dicts and objects ({label} ...): {built}, and "
            f"walking them takes longer than the tape's forward and backward pass (a "
            f"checkpoint walks them on every call). Run it on the tape (mg.grad(..., "
            f"mode=\"tape\"), or backward() without mg.checkpoint), which watches nothing; "
            f"or checkpoint it in segments of fewer layers (mg.checkpoint(nn.Sequential("
            f"*layers[i:i + 1000])) for each i), each of which watches its own")
    return MinigraphError(
        f"{found}a structure of more than {_MOST_INSIDE:,} lists, dicts and objects "
        f"({label} ...): {built}, and watching that many on every call would cost more "
        f"than the program. Pass what f uses as an argument, or keep the numbers in an "
        f"array or a tensor (watched whole)")


class _Defaults:
    """Where a function's default values are, by parameter name, as a dict's ``get``
    finds them (``f.__defaults__`` bound anew gives others)."""

    __slots__ = ("fn",)

    def __init__(self, fn: FunctionType):
        self.fn = fn

    def _positional(self) -> tuple[tuple[str, ...], tuple]:
        """The names of the positional parameters that have defaults, and the values."""
        code, values = self.fn.__code__, self.fn.__defaults__ or ()
        return code.co_varnames[code.co_argcount - len(values):code.co_argcount], values

    def items(self) -> list[tuple[str, Any]]:
        names, values = self._positional()
        return list(zip(names, values)) + list((self.fn.__kwdefaults__ or {}).items())

    def get(self, name: str, default: Any) -> Any:
        keywords = self.fn.__kwdefaults__
        if keywords and name in keywords:
            return keywords[name]
        names, values = self._positional()
        return values[names.index(name)] if name in names else default


class _Code:
    """Where a function's code is (``f.__code__ = g.__code__``: a notebook's cell run
    again, a reload): ``rebound`` compares ``fn.__code__``."""

    __slots__ = ("fn",)

    def __init__(self, fn: FunctionType):
        self.fn = fn


class _Keys:
    """Which attributes are in an object's (or a class's, a module's) dict, ``home``:
    ``rebound`` compares its keys, so that one added or removed is seen."""

    __slots__ = ("home",)

    def __init__(self, home: Any):
        self.home = home


class _Mro:
    """Where the classes in which Python looks up an attribute of ``obj`` are, as a
    dict's ``get`` finds them: ``type(obj).__mro__``, or a class's own ``__mro__``. A
    class whose object is another (``obj.__class__ = Other``), or whose bases are
    (``Sub.__bases__ = (Other,)``: Python makes the tuple anew), is another tuple."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def get(self, name: str, default: Any) -> Any:
        return self.obj.__mro__ if isinstance(self.obj, type) else type(self.obj).__mro__


class _Slots:
    """Where an object's ``__slots__`` values are, as a dict's ``get`` finds them."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def get(self, name: str, default: Any) -> Any:
        return getattr(self.obj, name, default)


class _Items:
    """Where a container's items are (``_CONTAINERS``: a list's, a dict's, a set's ...):
    ``rebound`` compares them with the snapshot taken when f was read (an item bound
    anew, added or removed): all of them, but those under ``skip``, the keys (a dict's)
    or positions (another's) that f itself wrote (:class:`Written`)."""

    __slots__ = ("container", "skip")

    def __init__(self, container: Any, skip: frozenset = frozenset()):
        self.container, self.skip = container, skip


def _snapshot(container: Any) -> tuple:
    """A dict's keys and values, or another container's items (with None for its keys)."""
    if isinstance(container, abc.Mapping):
        return tuple(container), tuple(container.values())
    if type(container) is np.ndarray:  # (an array of objects: its items, not its rows)
        return None, tuple(container.flat)
    if type(container) is memoryview:  # (its bytes, small ints that are the same objects
        return None, tuple(container.tobytes())  # for the same value: its items, floats
        # of a format "d", would be new objects on each read, bytes of a format "c" too)
    return None, tuple(container)


def _same(container: Any, snapshot: tuple, skip: frozenset = frozenset()) -> bool:
    """Whether ``container`` holds the keys and the very objects of ``snapshot``: those
    not under the keys ``skip`` of a dict; those before the first position in ``skip``
    of another container (f's log: ``runs.append(1)`` writes on, on each eager run)."""
    keys, items = _snapshot(container)
    if skip and keys is not None:
        now, then = _by_key((keys, items)), _by_key(snapshot)
        return now.keys() - skip == then.keys() - skip and all(
            now[k] is v or _same_constant(now[k], v) for k, v in then.items() if k not in skip)
    if skip:  # (another container's: the items before f's first)
        end = min(skip)
        return len(items) >= end and \
            all(a is b or _same_constant(a, b) for a, b in zip(items[:end], snapshot[1]))
    return keys == snapshot[0] and len(items) == len(snapshot[1]) and \
        all(a is b or _same_constant(a, b) for a, b in zip(items, snapshot[1]))


def _by_key(snapshot: tuple) -> dict:
    """A snapshot's items by their keys (a dict's) or positions (another container's)."""
    keys, items = snapshot
    return dict(zip(range(len(items)) if keys is None else keys, items))


def _written(container: Any, snapshot: tuple) -> frozenset:
    """The keys or positions whose objects in ``container`` are not ``snapshot``'s."""
    now, then = _by_key(_snapshot(container)), _by_key(snapshot)
    return frozenset(k for k in now.keys() | then.keys()
                     if k not in now or k not in then or now[k] is not then[k])


class Written(frozenset):
    """``recording.written_by_f``: the ids of the containers that f wrote while it was
    recorded (its own record of its runs: ``runs.append(1)``, ``STATE["calls"] += 1``),
    with ``keys``: per id, the keys or positions it wrote, which the program does not
    guard (``without``); the others it does (``STATE["scale"] = 5.0`` later is seen)."""

    keys: dict[int, frozenset]

    def __new__(cls, keys: dict[int, frozenset]) -> "Written":
        written = super().__new__(cls, keys)
        written.keys = keys
        return written


def _containers(f: Any, constants: "abc.Sequence[tuple[int, Any]]" = ()
                ) -> dict[int, tuple[Any, tuple]]:
    """The lists and dicts among what f reads (:func:`outside_reads`, ``constants`` its
    ``arguments``), by id, each with a snapshot of its items."""
    return {id(w.container): (w.container, snap) for w, _, snap
            in outside_reads(f, arguments=constants) if type(w) is _Items}


def without(reads: list[tuple[Any, str, Any]], own: frozenset[int]) -> list:
    """``reads`` less what f wrote in the containers whose ids are in ``own``: the keys
    or positions a :class:`Written` names (another set of ids: the whole container)."""
    kept = []
    for where, name, value in reads:
        if type(where) is _Items and id(where.container) in own:
            if not isinstance(own, Written):
                continue
            where = _Items(where.container, own.keys[id(where.container)])
        kept.append((where, name, value))
    return kept


def rebound(reads: list[tuple[Any, str, Any]]) -> str | None:
    """The first name of ``reads`` (:func:`outside_reads`) that holds another object now
    (``LR = 0.001``, ``W = W - lr * g``, ``PARAMS[0] = w2``), or None. Another object
    that is the same constant (``SCALE = float(cfg["scale"])`` on every step:
    :func:`_same_constant`) is not another value."""
    for where, name, value in reads:
        if type(where) is _Items:
            if not _same(where.container, value, where.skip):
                return name
        elif type(where) is _Code:  # (no call: this runs on every cached call)
            if where.fn.__code__ is not value:
                return name
        elif type(where) is _Keys:
            if tuple(where.home) != value:
                return name
        elif type(where) in (dict, MappingProxyType, _Defaults, _Slots, _Mro):
            now = where.get(name, _UNBOUND)  # (a global deleted: not value)
            if now is not value and not _same_constant(now, value):
                return name
        else:
            try:
                now = where.cell_contents
            except ValueError:
                return name
            if now is not value and not _same_constant(now, value):
                return name
    return None


def _same_constant(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b``, two objects, are one constant of a program, as its
    signature keys a constant argument (``signature.constant_key``: by type and value, a
    float by its bits: 1 is not True nor 1.0, -0.0 is not 0.0, NaN is NaN). Python's
    plain numbers and strings only: another object may change while it is held."""
    if type(a) is not type(b) or type(a) not in (int, float, bool, str):
        return False
    from .signature import constant_key  # (signature.py imports this module)
    return bool(constant_key(a, 0) == constant_key(b, 0))


def refused_read_only(exc: BaseException) -> bool:
    """Whether ``exc`` is NumPy's refusal of a write into a read-only array ("assignment
    destination is read-only", a ValueError), the refusal the guards below rely on."""
    return isinstance(exc, ValueError) and "read-only" in str(exc)


# The tensors that a guard below made read-only where NumPy's flag cannot: by the id of
# their memory where it has no flag (a CuPy array's), by their own where they hold a
# NumPy scalar (the 0-d result of a kernel), which a write replaces instead of writing
# into. Every write into a tensor goes through the tape (``x -= ...``, ``x[i] = ...``),
# which asks ``read_only`` before it writes, as NumPy asks its flag.
_READ_ONLY: set[int] = set()  # ids; the guard holds each object meanwhile


def _read_only_key(x: Tensor) -> int:
    return id(write_target(x))


def read_only(x: Tensor) -> bool:
    """Whether a guard made tensor ``x``, whose array is not a NumPy array, read-only."""
    return _read_only_key(x) in _READ_ONLY


def refusal_of_a_write() -> ValueError:
    """The error NumPy raises for a write into a read-only array, for the arrays above."""
    return ValueError("assignment destination is read-only")


class ReadOnlyWrite(ValueError):
    """NumPy's refusal of a write into a read-only ``array`` that minigraph made for f
    (a tensor's update in place); ``where``: the user's line, where minigraph cannot
    find it in the traceback (source mode's normaliser runs f's statements itself)."""

    def __init__(self, exc: Exception, where: Any = None, array: Any = None):
        super().__init__(str(exc))
        self.where, self.array = where, array


BUILT = (", while its program was built; the program runs no Python, so the write would "
         "not happen again on later calls, as it does in eager mode")


@contextmanager
def read_only_arrays(f: Any, who: str, why: str = BUILT, error: type[Exception] = GradientError,
                     arguments: Any = (), constants: Any = ()) -> Iterator[None]:
    """While a compiled program is built from f (or forward mode runs it once per input
    element, or a checkpoint runs it to run it again in the backward pass: ``why`` says
    what the write would do), the tensors and arrays f reads from outside its arguments
    (:func:`outside_arrays`: a global, a closure variable, an attribute the code names,
    an item of a list or dict) are read-only. f's ``Y += 1.0`` would write once, while
    recording, where eager mode writes on every call; a NumPy array (a tensor's too)
    refuses the write before it is made, and so does a tensor whose array has no
    read-only flag (CuPy's, or a NumPy scalar): the tape asks :func:`read_only` before
    each write. Another array without the flag (a CuPy array), and a NumPy array whose
    flag NumPy would not set back (:func:`_thaws`: over a DLPack capsule's or torch's
    memory), is kept as a copy, compared after f returned, and put back before the
    error: every array is left as writable as it was. (Another thread writing
    into such an array meanwhile is refused too.) ``arguments``: f's arguments whose
    arrays are guarded the same way (a checkpoint's, forward mode's that it does not
    differentiate; None for one that is not), so that a NumPy array's write is refused
    before it is made. ``constants``: f's arguments whose reads are f's too (a function
    passed to f: :func:`outside_reads`'s ``arguments``), whose arrays are guarded so."""
    frozen: dict[int, tuple[str, Any, Any]] = {}  # id(array) -> (place, value, array)
    kept: list[tuple[str, Any, Any, Any]] = []  # (place, value, array, copy)
    places = [(f"its argument {k}", v) for k, v in enumerate(arguments) if _guarded(v)]
    places += [(f"{place}, which it reads from outside its arguments", v)
               for place, v in outside_arrays(f, constants)]
    for place, v in places:
        array = v.data if type(v) is Tensor else v
        if id(array) in frozen or any(array is k[2] for k in kept):
            continue
        if type(array) is np.ndarray:
            if array.flags.writeable and _thaws(array):
                frozen[id(array)] = (place, v, array)
            elif array.flags.writeable:  # (the tape asks read_only for no NumPy array)
                kept.append((place, v, array, array.copy()))
        elif type(v) is not Tensor:
            kept.append((place, v, array, array_namespace(v).asarray(v, copy=True)))
        elif not read_only(v):  # (a tensor's array without the flag, or a NumPy scalar:
            frozen[id(array)] = (place, v, array)  # its writes go through the tape, which
            # asks read_only; else an enclosing guard's, which names it)
    for _, v, array in frozen.values():
        if type(array) is np.ndarray:
            array.flags.writeable = False
        else:
            _READ_ONLY.add(_read_only_key(v))
    try:
        yield
        written = [k for k in kept if differs(k[2], k[3])]
        for _, _, array, was in written:
            array[...] = was
        if written:
            raise error(f"{who}: f wrote into {_described([w[:2] for w in written])}, in "
                        f"place (found after f returned; it holds its old values again)"
                        f"{why}. Inside f, write a new value (y = y + 1.0) instead")
    except ValueError as exc:
        if not (frozen and refused_read_only(exc)):
            raise
        which = getattr(exc, "array", None)  # (a tensor's update says which it was,
        named = list(frozen.values())        # or a view of it)
        if which is not None:
            named = [frozen[k] for k in (id(which), id(owner(which))) if k in frozen][:1]
            if not named:
                raise  # (an array that an enclosing guard made read-only: it names it)
        # (NumPy's error does not say which array: with several, one of them)
        into = ("one of " if len(named) > 1 else "") + _described([n[:2] for n in named])
        raise error(f"{who}: f wrote into {into}, in place, "
                    f"{_line(exc)}{why}. Inside f, write a new value (y = y + 1.0) "
                    f"instead") from exc
    finally:  # (a view's flag once its base's is set back: NumPy looks at the base's)
        for _, v, array in sorted(frozen.values(), key=lambda e: _depth(e[2])):
            if type(array) is np.ndarray:
                array.flags.writeable = True
            else:
                _READ_ONLY.discard(_read_only_key(v))


def _thaws(a: np.ndarray) -> bool:
    """Whether NumPy would set writable NumPy array ``a``'s flag back once cleared, as
    NumPy's ``_IsWriteable`` tells: ``a`` owns its memory, or the first writable array
    or the object at the end of its chain of bases does (a bytearray, an mmap); not
    memory NumPy cannot tell writable (a DLPack capsule's, a torch tensor's)."""
    while a.base is not None and not a.flags.owndata:
        if not isinstance(a.base, np.ndarray):
            try:
                with memoryview(a.base) as memory:
                    return not memory.readonly
            except (TypeError, BufferError):  # (no buffer to ask)
                return False
        a = a.base
        if a.flags.writeable:
            return True
    return bool(a.flags.writeable)


def _depth(a: Any) -> int:
    """How many arrays NumPy array ``a`` is a view of (0 for another array)."""
    n = 0
    while isinstance(getattr(a, "base", None), np.ndarray):
        a, n = a.base, n + 1
    return n


def _described(values: list) -> str:
    """``W (a tensor of shape (2,) float64)``, ``its argument 1 (numpy array of ...)``."""
    kinds = ["a tensor" if type(v) is Tensor else f"{type(v).__module__.split('.')[0]} array"
             for _, v in values]
    return " or ".join(f"{place} ({kind} of shape {tuple(v.shape)} {v.dtype})"
                       for (place, v), kind in zip(values, kinds))


def differs(a: Any, was: Any) -> bool:
    """Whether array ``a`` holds other values than its copy ``was``: NaN equals NaN,
    and -0.0 is not 0.0 (1 / x tells them apart), so NumPy's floats compare by bits."""
    if type(a) is np.ndarray:  # (one pass, without the temporaries below)
        if a.dtype.kind == "O":  # (objects, tensors say: the very same ones, as a list's
            return a.shape != was.shape or \
                any(x is not y for x, y in zip(a.flat, was.flat))  # items: is_container)
        unit = _WORDS.get(a.dtype.itemsize)  # (by bits, as integers of the same size)
        if unit is not None and a.dtype == was.dtype and a.shape == was.shape and \
                a.dtype.kind in "fciub":
            return not (a.view(unit) == was.view(unit)).all()
        if a.dtype.kind in "fc":
            return not (np.array_equal(a, was, equal_nan=True) and (
                a.dtype.kind == "c" or np.array_equal(np.signbit(a), np.signbit(was))))
        return not np.array_equal(a, was)
    return not bool(array_namespace(a).all((a == was) | ((a != a) & (was != was))))


_WORDS = {size: np.dtype(f"u{size}") for size in (1, 2, 4, 8)}


class recording:
    """``with recording(f, who) as r:`` around the one run (or reading) of f that builds
    a compiled program (graph mode, ``mg.trace``, source mode). Meanwhile the tensors and
    arrays f reads from outside are read-only (:func:`read_only_arrays`); afterwards
    ``r.written_by_f`` holds the ids of the lists and dicts f wrote, and what it wrote
    in each (:class:`Written`): its own record of its runs (``runs.append(1)``, a
    counter), which the recording writes and the replays leave alone (chapter 04), and
    which the program does not guard (``signature.Captured``)."""

    def __init__(self, f: Any, who: str, constants: "abc.Sequence[tuple[int, Any]]" = ()):
        """``constants``: f's arguments that are constants of the program, whose reads
        are f's too (:func:`outside_reads`'s ``arguments``)."""
        self.f, self.who, self.constants = f, who, constants
        self.written_by_f: frozenset[int] = Written({})

    def __enter__(self) -> "recording":
        self._before = _containers(self.f, self.constants)
        self._arrays = read_only_arrays(self.f, self.who, constants=self.constants)
        self._arrays.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        self.written_by_f = Written({k: _written(c, snap) for k, (c, snap)
                                     in self._before.items() if not _same(c, snap)})
        return self._arrays.__exit__(*exc)  # (raises the refusal of a write, if any)


# f -> (what it reads, the arrays among it): found again once a name is bound anew
_ARRAYS: "weakref.WeakKeyDictionary[Any, tuple[list, list]]" = weakref.WeakKeyDictionary()


def outside_arrays(f: Any, constants: "abc.Sequence[tuple[int, Any]]" = ()
                   ) -> list[tuple[str, Any]]:
    """The tensors and arrays (NumPy's, CuPy's) f reads from outside its arguments
    (:func:`outside_reads`: by name, attribute, or as an item of a list or dict; and
    those its ``constants`` read, its ``arguments`` there), each with where it is."""
    # (found each time where a constant argument may read something: the cache is per f;
    # a number, a string or None reads nothing, nor does a tuple of them)
    if any(type(a) not in _ATOMS and not _constant_tuple(a) for _, a in constants):
        return arrays_in(outside_reads(f, arguments=constants))
    try:
        reads, arrays = _ARRAYS[f]
        if rebound(reads) is None:  # (a name's or an item's object is the same one)
            return arrays
    except (KeyError, TypeError):  # (not seen yet; or f cannot be weakly referenced)
        pass
    reads = outside_reads(f)
    arrays = arrays_in(reads)
    try:
        _ARRAYS[f] = (reads, arrays)
    except TypeError:
        pass
    return arrays


def arrays_in(reads: list[tuple[Any, str, Any]]) -> list[tuple[str, Any]]:
    """The tensors and arrays among ``reads`` (:func:`outside_reads`) and among the items
    of its lists and dicts, each with where it is."""
    return [(name, v) for name, v in values_in(reads) if _guarded(v)]


def values_in(reads: list[tuple[Any, str, Any]]) -> list[tuple[str, Any]]:
    """The values among ``reads`` (:func:`outside_reads`), then the items of its lists
    and dicts, each with where it is."""
    return [(name, v) for where, name, v in reads] + \
        [(name, item) for where, name, v in reads if type(where) is _Items for item in v[1]]


def _guarded(v: Any) -> bool:
    """A plain tensor, or a NumPy or other library's array; not a transformation's value
    nor a NumPy scalar (which no one writes into; NumPy 2.5 gives it an array namespace),
    nor an object whose ``__array_namespace__`` only its ``__getattr__`` gives (a config
    answering every name: ``is_array_api_obj`` asks ``hasattr``; an array's class has
    the method, or array_api_compat knows the class: torch's tensor)."""
    return type(v) is Tensor or isinstance(v, np.ndarray) or \
        not isinstance(v, (ArrayOps, np.generic)) and is_array_api_obj(v) and \
        (hasattr(type(v), "__array_namespace__") or not hasattr(v, "__array_namespace__"))


def _line(exc: BaseException) -> str:
    """Where the user's code made the write that raised ``exc``."""
    if isinstance(exc, ReadOnlyWrite) and exc.where is not None:
        return str(exc.where)
    return f"at {raised_at(exc) or 'an unknown line'}"
