"""One signature and one cache for every compiled program: graph mode, source mode, trace.

A compiled program (a traced graph, a graph-mode gradient, a source-transformed adjoint)
is specialised to its arguments: it is built on the first call and replayed by every
later call whose arguments have the same *signature*:

* an argument that is data (a tensor, a NumPy array, a Python or NumPy float, a value of
  another transformation, or a number or list of numbers being differentiated) by its
  device, shape and dtype: its value does not matter, the program reads it when it runs.
  A float or an array that is differentiated becomes a tensor on the default device
  (``mg.device``), as in eager mode; one that is not goes to the device of the tensors
  it meets there. A Python float that is not differentiated is *weak* (``WEAK`` ends its
  entry): recorded as a :class:`~minigraph.ops.weak.Weak`, it takes the dtype of the
  tensors it meets, as in eager mode, so ``x * s`` is float32 for a float32 ``x`` in
  every mode;
* any other argument (an int, a string, None, a tuple ...) is a constant of the program,
  by its type and value: ``range(n)`` is unrolled or looped over for that n. The type
  keeps 1, 1.0 and True apart, and a float inside a constant is keyed by its bits, so
  0.0 and -0.0 (whose ``1 / x`` differ) never share a program. What a function among
  them reads (``fn`` of ``outer(x, fn)``: its globals, ``self.scale``) is guarded as what
  f reads is (:class:`Captured`, given :func:`constant_arguments`).

No transformation level is part of it, because a program never depends on one. It is
written from its arguments' shapes, dtypes and devices alone, and its code runs on arrays
only (:func:`arrays`); called on values of a transformation (a box of ``mg.grad``, a dual
number of ``mg.jvp``, a batched value of ``mg.vmap``, at any depth of nesting), it runs
through ``bind`` instead (a graph replayed node by node, a source program's ``mg.``
text), and every primitive goes to the interpreter of its arguments' level. So the
program built for plain floats is the one an outer ``mg.grad`` replays, and the other
way round (``tests/test_codegen.py`` checks both orders).

:func:`programs` is the one cache: per function, per transformation (``"graph"``,
``"source"``, ``"trace"``) and its options (the normalised argnums), a dict from
signature to program, per default device (:class:`Programs`). It holds functions
weakly, by identity (:class:`ByIdentity`): a program dies with its function, and is no
other function's, however the user's ``==`` compares them.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
import dataclasses
import threading
import weakref
from typing import Any, Callable, Generic, TypeVar

import numpy as np
from array_api_compat import array_namespace

from ..device import get_device
from ..ops.primitive import KINDS
from ..ops.shape_rules import DTYPES, supported_dtype
from ..ops.weak import Weak
from ..tensor import Tensor
from . import tape
from .argnums import refuse_pytrees
from .reads import (_users_class, arrays_in, differs, is_container, outside_reads, rebound,
                    without)

DATA = "data"  # the first item of an argument's signature when the program reads it
WEAK = "weak"  # the last item of a weak Python number's (ops/weak.py)
# Dtypes are NumPy's dtype objects throughout, so that a 0-d float64 array and a 0-d
# float64 tensor on the default device share one program (a Python float is weak: its own).
_PYTHON_DTYPES = {float: np.dtype(np.float64), int: np.dtype(np.int64), bool: np.dtype(bool)}
_FLOAT64 = _PYTHON_DTYPES[float]
# NumPy's scalars (np.float32(2.0), np.int64(3)) are what Python's numbers are: a float one
# is data, of its own dtype; an integer or bool one is a constant unless differentiated.
NUMPY_SCALARS = (np.floating, np.integer, np.bool_)


def signature(args: tuple, nums: tuple[int, ...] = ()) -> tuple:
    """The signature of ``args``; ``nums`` are the arguments being differentiated (a
    number there is data even if it is an int, so that the dtype error can name it)."""
    key: list[tuple] = []
    default = None  # the default device, looked up once
    for k, a in enumerate(args):
        t = type(a)
        if t is Tensor:  # (the hot paths: the array's own objects, no name lookups ...
            key.append((DATA, a.device, a.data.shape, a.data.dtype))
        elif t is float:  # ... and a Python float's, without the tests below)
            if default is None:
                default = get_device(None)
            key.append((DATA, default, (), _FLOAT64) if k in nums else
                       (DATA, default, (), _FLOAT64, WEAK))
        elif isinstance(a, NUMPY_SCALARS) and (isinstance(a, np.floating) or k in nums):
            if a.dtype.name not in DTYPES and k not in nums:  # (np.float16(1.0): as arrays)
                supported_dtype(f"mg.trace, graph and source mode: argument {k} (a NumPy "
                                f"scalar)", a.dtype)
            key.append((DATA, get_device(None), (), a.dtype))  # (np.float32(2.0): a 0-d array)
        elif isinstance(a, float) or (t in (int, bool) and k in nums):
            key.append((DATA, get_device(None), (), _PYTHON_DTYPES[t if t in
                                                                   _PYTHON_DTYPES else float])
                       + (() if k in nums else (WEAK,)))
        elif t is Weak and k not in nums:  # (a recorded function's float, passed on)
            key.append((DATA, a.device, (), np.dtype(a.dtype), WEAK))
        elif t in KINDS:
            key.append((DATA, a.device, tuple(a.shape), np.dtype(str(a.dtype))))
        elif isinstance(a, np.ndarray):
            if a.dtype.name not in DTYPES and k not in nums:  # (an object, str or float16
                # array, which a placeholder cannot hold: named here, not as mg.tensor's,
                # never called; one differentiated has its own error, which says more)
                supported_dtype(f"mg.trace, graph and source mode: argument {k} (a NumPy "
                                f"array)", a.dtype)
            key.append((DATA, get_device(None), a.shape, a.dtype))
        elif isinstance(a, (tuple, list)) and k in nums:
            # numbers to differentiate: an array, as mg.tensor makes it (and the tape)
            refuse_pytrees(args, (k,), "mg.trace, graph and source mode")
            array = np.asarray(a)
            key.append((DATA, get_device(None), array.shape, array.dtype))
        else:
            if isinstance(a, (tuple, list, dict)):  # (as every transformation: argnums.py)
                refuse_pytrees(args, (k,), "mg.trace, graph and source mode")
            key.append(("static", constant_key(a, k)))
    return tuple(key)


def is_data(entry: tuple) -> bool:
    """Whether an argument with this signature entry is read when the program runs."""
    return entry[0] == DATA


def is_weak(entry: tuple) -> bool:
    """Whether it is a weak Python number, recorded as a ``Weak`` of its input."""
    return entry[-1] == WEAK


def arrays(args: tuple, key: tuple, static: bool) -> list | None:
    """The arguments as a compiled program's code takes them, for ``key``, their
    signature: a tensor as its array, a float or an array as an array on the device its
    signature names; a static argument as it is if ``static`` (a source program takes
    all of f's parameters), else not at all (a traced graph has it built in). None if a
    value needs its own interpreter, which the code on arrays is not: a value of another
    transformation, or a tensor the tape records (a gradient of the result is wanted)."""
    out = []
    for a, entry in zip(args, key):
        kind = type(a)
        if kind is Tensor:
            if a.requires_grad and tape.is_grad_enabled():
                return None
            out.append(a.data)
        elif entry[0] != DATA:
            if static:
                out.append(a)
        elif kind in KINDS:
            return None
        else:  # a float or an array: (DATA, device, shape, dtype)
            out.append(entry[1].asarray(a))
    return out


def constant_arguments(args: tuple, key: tuple) -> tuple[tuple[int, Any], ...]:
    """``(position, value)`` of the arguments that ``key``, their signature, makes
    constants of the program: their identity and contents are in the key, and what a
    function among them reads (its globals, ``self.scale``) the program's ``Captured``
    guards, as it guards what f reads."""
    return tuple((k, a) for k, (a, entry) in enumerate(zip(args, key)) if entry[0] != DATA)


def constant_key(a: Any, k: int) -> Any:
    """A constant argument's key: its type and value, floats by their bits."""
    return _key_of(a, k, a)


def _key_of(a: Any, k: int, whole: Any, depth: int = 0) -> Any:
    if isinstance(a, (float, np.floating)):  # (by bits: -0.0 is not 0.0, NaN is NaN)
        return type(a), float(a).hex()
    if depth > _DEEPEST:  # (one call per level of nesting: bounded, as _held's)
        raise _too_deep(k, whole)
    if isinstance(a, (tuple, list)):
        items = type(a), tuple(_key_of(x, k, whole, depth + 1) for x in a)
        own = getattr(a, "__dict__", None)  # (a list of yours with attributes: cfg.scale)
        return items if not own else (items, tuple(
            (n, _key_of(v, k, whole, depth + 1)) for n, v in sorted(own.items())))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):  # (its fields, by the
        fields = tuple(getattr(a, f.name) for f in dataclasses.fields(a))  # rules above)
        return type(a), _key_of(fields, k, whole, depth + 1)
    try:
        hash(a)
    except TypeError:
        what = type(whole).__name__ + ("" if a is whole else f" holding a {type(a).__name__}")
        raise TypeError(f"argument {k} ({what}) is neither data (a tensor, an array, a "
                        f"float) nor a hashable Python value; a compiled program is built "
                        f"per value of such arguments") from None
    if type(a).__hash__ is object.__hash__ or _users_class(type(a)):
        # An object equal only to itself (cfg, with cfg.scale = 5.0 set between calls; a
        # model, with m.w = new_w): what it holds is part of its key (:func:`_held`), so
        # that a program built for the old contents is not reused. And one of the user's
        # classes with an == of the user's (two configs equal by their name, whatever
        # their scale): by that == and all it holds, so that an equal object that holds
        # other numbers has a program of its own, and a new equal one per call, holding
        # the same, shares one.
        itself = _Same(a) if type(a).__hash__ is object.__hash__ else a
        if _fields(a) is None:
            return type(a), itself
        return _held(a, k, whole, set(), top=True, depth=depth, itself=itself)
    return type(a), a


_PLAIN = (int, float, bool, str, type(None), complex)  # (attributes keyed by their value)
_DEEPEST = 100  # (levels of a constant argument's nesting that _key_of and _held read)


def _too_deep(k: int, whole: Any) -> TypeError:
    return TypeError(f"argument {k} ({type(whole).__name__}) holds values nested more than "
                     f"{_DEEPEST} levels deep; a compiled program is built per value of "
                     f"such an argument, keyed by all it holds: pass the values f uses as "
                     f"arguments of their own")


def _held(a: Any, k: int, whole: Any, seen: set[int], top: bool = False,
          depth: int = 0, itself: Any = None) -> Any:
    """The key of ``a``, a constant object or what it holds, as deep as f may read it
    (``cfg.scales[0]``, ``cfg.inner.scale``, ``cfg.w[0]``), each object once (``seen``):
    a plain value by its value; a container's items (a list's, tuple's, set's, dict's,
    UserList's ...: ``reads.is_container``), and the user's object's attributes (its
    ``__dict__`` or ``__slots__``; ``top``: any class's), by theirs; a NumPy array by its
    bytes. Anything else by identity, and held
    (:class:`_Same`: a freed object's id may be another's); a tensor among them is a
    constant of the program, whose writes ``Captured`` sees. The cost: a pass over what
    the object holds, on every call that passes it. (A recursion over the user's
    objects, bounded: a constant nested deeper than ``_DEEPEST`` is refused.)
    ``itself``: what stands for the top object in its key (its identity by default)."""
    if type(a) in _PLAIN:
        return _key_of(a, k, whole)
    if depth > _DEEPEST:
        raise _too_deep(k, whole)
    depth += 1
    if id(a) in seen:  # (met before: keyed there)
        return _Same(a)
    seen.add(id(a))
    def key(v: Any) -> Any:
        return _held(v, k, whole, seen, depth=depth)
    if is_container(a):
        if isinstance(a, Mapping):
            return type(a), tuple((key(n), key(v)) for n, v in a.items())
        return type(a), tuple(map(key, a))
    if type(a) is np.ndarray:
        return np.ndarray, a.shape, a.dtype.str, a.tobytes()
    fields = _fields(a)
    if fields is None or not (top or _users_class(type(a))):
        return _Same(a)
    return type(a), itself if top and itself is not None else _Same(a), \
        tuple(sorted((n, key(v)) for n, v in fields))


def _fields(a: Any) -> "list[tuple[str, Any]] | None":
    """An object's attributes: its ``__dict__``'s, and its ``__slots__``' that are set;
    None for a value without either."""
    own = getattr(a, "__dict__", None)
    slots = [n for c in type(a).__mro__ for n in c.__dict__.get("__slots__", ())
             if n not in ("__dict__", "__weakref__") and hasattr(a, n)]
    if type(own) is not dict and not slots:
        return None
    return (list(own.items()) if type(own) is dict else []) + \
        [(n, getattr(a, n)) for n in slots]


class _Same:
    """An object in a key by identity: equal to the key of that object alone. It holds
    the object, so that its id is not another's while the key lives."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __eq__(self, other: Any) -> bool:
        return type(other) is _Same and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


class Captured:
    """What a compiled program read from outside its arguments when it was built: the
    tensors among its constants, with copies of their values, and what the function it
    was built from reads (``reads.outside_reads``: its globals and closure variables, the
    attributes its code names, the items of the lists and dicts among them, a module's
    parameters).

    Such a value is a constant of the program, as in ``jax.jit``; but an in-place update
    of a tensor (``w -= lr * g``, ``W.data -= lr * g``) or of an array (``X[:] =
    next_batch``), or a name or an item bound to another value (``LR = 0.001``, ``W = W -
    lr * g``, ``layer.weight = ...``, ``PARAMS[0] = w2``), would leave the program
    computing with the old value while the tape, which runs the function, uses the new
    one. So the program is *stale* once one of them has changed, and its cache builds it
    again (as ``torch.compile``'s guards do): every mode agrees.

    The check costs an identity comparison per name and item read and per tensor (its
    array bound anew: ``t.data = other``), and a comparison of each tensor's and array's
    values with a copy taken when the program was built. That comparison is the only
    sound rule: a tensor's array is the user's to write unseen (``W.data -= 3.0``,
    PyTorch's habit, ``t.numpy()``, DLPack), as an outside NumPy array is, and NumPy
    keeps no count of writes (torch's version counter). It reads each captured byte once
    per call, as a program that computes with them does (``reads.differs``: some tens
    of microseconds per megabyte), and keeps a copy of each; data passed as an argument
    costs nothing, and so does a function that reads no tensor or array from outside.
    """

    __slots__ = ("tensors", "datas", "reads", "arrays")

    def on_the_tape(self) -> bool:
        """Whether a call of the program must be f's own values, which the tape records:
        f reads a tensor that requires a gradient from outside its arguments (a layer's
        weight, an item of a dict), and the tape is recording. The program holds such a
        tensor as a constant, and what f computed from it eagerly while it was recorded
        (``self.weight.T``) as constants too: its result would be cut off the tape, and
        backward() would miss the path through the weight (torch.func.grad and the tape
        follow it). Asked per call: ``requires_grad_`` can change after the program was
        built."""
        tensors = self.tensors  # (none, the common case: one test)
        return bool(tensors) and tape.is_grad_enabled() and any(t._requires_grad
                                                                for t in tensors)

    def __init__(self, tensors: Any, f: Any = None, own: frozenset[int] = frozenset(),
                 constants: "tuple[tuple[int, Any], ...]" = (),
                 reads: "list[tuple[Any, str, Any]] | None" = None):
        """``own``: the ids of the lists and dicts f wrote while it was recorded
        (``reads.recording``), its own record of its runs, which are not guarded.
        ``constants``: f's arguments that are constants of the program
        (:func:`constant_arguments`), whose reads are guarded as f's are: ``fn`` in
        ``grad(outer)(x, fn)``, whose global ``SCALE = 2.0`` makes the program stale, as
        f's own global would. ``reads``: those reads (``outside_reads(f, arguments=
        constants)``) as they were *before* f ran to be recorded (``trace.record``);
        None: read now. Taken after, they would miss what f itself bound anew while it
        ran (a warm-up flag: ``s = 0.1 if WARM else 1.0; WARM = False``): the program
        holds the value f read, the guard the one f left, so it would never be stale,
        while eager mode's next call reads the new one."""
        if reads is None:
            reads = outside_reads(f, arguments=constants) if f is not None else []
        self.reads = without(reads, own)
        # (their arrays are copied below, after f ran: the same, since they were
        # read-only while it did, reads.recording)
        outside = [a for _, a in arrays_in(self.reads)]
        # the constants, and the tensors f reads that are no constant of the program (an
        # index, x[IDX], is a parameter of its getitem; a tensor whose shape f reads)
        self.tensors = list({id(t): t for t in list(tensors) + outside
                             if isinstance(t, Tensor)}.values())
        self.datas = [t.data for t in self.tensors]  # (t.data = other, PyTorch's habit)
        watched = [a for a in outside if type(a) is not Tensor] + \
            [d for d in self.datas if not isinstance(d, np.generic)]  # (a NumPy scalar:
        # immutable, a write replaces it, which the identity test sees)
        self.arrays = [(a, array_namespace(a).asarray(a, copy=True)) for a in watched]

    def now(self) -> list:
        """``(array, copy)`` of the arrays the program reads from outside as they hold
        now: the tensors' arrays (``t.data``, bound anew or not) and the outside arrays.
        What a vjp_fn compares with, for the values at its own forward pass: the copies
        taken when the program was built are older where a write since has not made it
        stale (a program on the tape, :meth:`stale`'s ``taped``: a training step's)."""
        datas = {id(d) for d in self.datas}
        watched = [a for a, _ in self.arrays if id(a) not in datas] + \
            [t.data for t in self.tensors if not isinstance(t.data, np.generic)]
        return [(a, array_namespace(a).asarray(a, copy=True)) for a in watched]

    def stale(self, taped: bool = False) -> bool:
        """Whether what the program read from outside has changed since it was built.
        ``taped``: the call runs f itself on the tape (:meth:`on_the_tape`), not the
        program, so only a name or an item bound anew counts: the reads kept here are
        then out of date (a vjp_fn compares them), and the program is built again; a
        write into a tensor (a training step) does not rebuild it at every call."""
        if self.reads and rebound(self.reads) is not None:
            return True
        if taped:
            return False
        for t, d in zip(self.tensors, self.datas):  # (loops, not any(): the cached call's
            if t.data is not d:                      # path, without a generator's calls)
                return True
        for a, was in self.arrays:
            if differs(a, was):
                return True
        return False


_MOST_PROGRAMS = 64  # (per function and transformation: Programs)
_read = collections.OrderedDict.__getitem__


class Programs(collections.OrderedDict):
    """signature -> program, under the default device of the call. A program puts the
    tensors f makes (``mg.ones(3)``, ``mg.get_device()``) on the device that was the
    default (``mg.device``) when it was built, so a call under another default needs a
    program of its own, whatever its arguments are: the device is part of every key.

    At most ``_MOST_PROGRAMS`` of them, the least recently used dropped first (as
    ``torch.compile`` bounds its recompilations): a constant argument keyed by identity
    (a new config object on every call, :func:`constant_key`) would otherwise keep every
    program, and every object, it was ever called with. (An OrderedDict: ``get`` moves
    the program it finds to the end in one step, which another thread cannot see half
    done.)"""

    def get(self, key: tuple, default: Any = None) -> Any:
        full = (get_device(None), key)
        try:  # (one lookup to move it, one to read it: C calls, no Python frame)
            self.move_to_end(full)
            return _read(self, full)
        except KeyError:  # (none, or dropped by another thread meanwhile)
            return default

    def __getitem__(self, key: tuple) -> Any:
        return super().__getitem__((get_device(None), key))

    def __setitem__(self, key: tuple, program: Any) -> None:
        super().__setitem__((get_device(None), key), program)
        while len(self) > _MOST_PROGRAMS:
            try:
                self.popitem(last=False)
            except KeyError:  # (emptied by another thread)
                break


V = TypeVar("V")


class ByIdentity(Generic[V]):
    """A table from objects to values by identity, each entry dropped with its object.

    Not a ``weakref.WeakKeyDictionary``, which finds a key by ``==`` and ``hash``: those
    are the user's to define (two layers equal by their name, ``Scaler("lin", 1.0) ==
    Scaler("lin", 5.0)``), and a program built from one object is no program of another
    (its guard, ``Captured``, watches the object it was built from). So the key is the
    object's id, which no other object has while this one lives, and a finalizer drops
    the entry when it dies (before its id can be another's)."""

    def __init__(self) -> None:
        self._values: dict[int, V] = {}

    def setdefault(self, obj: Any, make: Callable[[], V]) -> V:
        """``obj``'s value, made by ``make()`` if it has none. TypeError if ``obj`` cannot
        be weakly referenced (a C function): no entry could be dropped with it."""
        value = self._values.get(id(obj))
        if value is None:
            weakref.finalize(obj, self._values.pop, id(obj), None)  # (first: TypeError)
            value = self._values[id(obj)] = make()
        return value


_CACHE: ByIdentity[dict] = ByIdentity()
_LOCK = threading.Lock()


def programs(f: Callable[..., Any], transformation: str, options: tuple = ()) -> dict:
    """The programs of ``f`` under ``transformation`` with ``options``. Shared by every
    transformed function of ``f`` itself (not of another f equal to it: :class:`ByIdentity`)
    with the same options."""
    with _LOCK:
        try:
            return _CACHE.setdefault(f, dict).setdefault((transformation, options), Programs())
        except TypeError:  # no weak reference to f (a C function): its caller keeps them
            return Programs()
