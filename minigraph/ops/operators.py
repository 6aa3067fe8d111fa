"""Python's operators and array methods, once for every value kind.

``Tensor``, ``Dual`` (and later graph nodes and source variables) inherit from
:class:`ArrayOps`, so ``x * y + x.sin()`` and ``x.sum(axis=0)`` mean the same primitive
calls whatever ``x`` is. A subclass only needs ``shape``, ``dtype`` and ``device``.

``x op= y`` is here too, with the one rule every kind shares: where it makes a new value
instead of writing into x (while recording, inside a transformation), it is refused if
another place holds x (:func:`refuse_aliased`: another name, a list, an object, a caller,
a module, or the caller of the transformation, :class:`passed_as_is`), since eager mode's
write would show through that place and here it would not.
"""

from __future__ import annotations

import ast
import collections
import dis
import functools
import gc
import inspect
import itertools
import linecache
import math
import operator
import os
import queue
import sys
import sysconfig
import threading
from types import (CodeType, FrameType, FunctionType, GeneratorType, MappingProxyType,
                   MethodType, ModuleType, SimpleNamespace)
from typing import Any

import numpy as np

from . import copy as C
from . import elementwise as E
from . import shape_rules as S
from .weak import AS_NUMBER, Weak
from ..errors import DTypeError, GradientError, NoArrayError, ShapeError
from . import linalg as L
from . import reduce as R
from . import shape as SH
from .primitive import KINDS, bind_one, bind_two


class ArrayOps:
    __slots__ = ()
    shape: tuple[int, ...]
    # What an error calls a value of this kind ("tensor", "graph node"); a kind that does
    # not say is named by its class, as a value inside a transformation.
    _noun: str = ""
    # ``ndarray @ x`` and ``ndarray * x``: NumPy must hand the operator to our reflected
    # methods (__rmatmul__ ...) instead of converting x to an array, which would drop it
    # from the tape or the graph. (A graph node answers NumPy itself, to refuse np.sin(node)
    # in words of its own: Node.__array_ufunc__.)
    __array_ufunc__ = None

    # -- arithmetic, with the reflected forms for ``2.0 * x`` ------------------------------
    # (These bind the primitive directly instead of calling E.add & co.: the most common
    # operations skip one Python call; ``bind_two`` is ``bind`` for two arguments.)
    def __add__(self, other: Any) -> Any: return bind_two(E.ADD, self, other)
    def __radd__(self, other: Any) -> Any: return bind_two(E.ADD, other, self)
    def __sub__(self, other: Any) -> Any: return bind_two(E.SUB, self, other)
    def __rsub__(self, other: Any) -> Any: return bind_two(E.SUB, other, self)
    def __mul__(self, other: Any) -> Any: return bind_two(E.MUL, self, other)
    def __rmul__(self, other: Any) -> Any: return bind_two(E.MUL, other, self)
    def __truediv__(self, other: Any) -> Any: return bind_two(E.DIV, self, other)
    def __rtruediv__(self, other: Any) -> Any: return bind_two(E.DIV, other, self)
    def __pow__(self, other: Any) -> Any: return bind_two(E.POW, self, other)
    def __rpow__(self, other: Any) -> Any: return bind_two(E.POW, other, self)
    def __floordiv__(self, other: Any) -> Any: return bind_two(E.FLOOR_DIVIDE, self, other)
    def __rfloordiv__(self, other: Any) -> Any: return bind_two(E.FLOOR_DIVIDE, other, self)
    def __mod__(self, other: Any) -> Any: return bind_two(E.REMAINDER, self, other)
    def __rmod__(self, other: Any) -> Any: return bind_two(E.REMAINDER, other, self)
    # divmod(x, y) is (x // y, x % y), as NumPy's np.divmod and Python's divmod give it
    def __divmod__(self, other: Any) -> Any: return self // other, self % other
    def __rdivmod__(self, other: Any) -> Any: return other // self, other % self
    def __matmul__(self, other: Any) -> Any: return L.matmul(self, other)
    def __rmatmul__(self, other: Any) -> Any: return L.matmul(other, self)
    def __neg__(self) -> Any: return bind_one(E.NEG, self, {})
    def __pos__(self) -> Any: return self
    def __abs__(self) -> Any: return E.abs(self)

    # -- x op= y: a value that cannot be written into (a transformation's, a graph's) gets
    # x op y, bound to the name by Python, as in JAX; a Tensor writes into its array
    # (Tensor.__iadd__). Either way the result keeps x's shape and dtype, or it is refused;
    # a new value is refused too where another name holds x (refuse_aliased).
    def __iadd__(self, other: Any) -> Any: return updated(E.ADD, self, other)
    def __isub__(self, other: Any) -> Any: return updated(E.SUB, self, other)
    def __imul__(self, other: Any) -> Any: return updated(E.MUL, self, other)
    def __itruediv__(self, other: Any) -> Any: return updated(E.DIV, self, other)
    def __ifloordiv__(self, other: Any) -> Any: return updated(E.FLOOR_DIVIDE, self, other)
    def __imod__(self, other: Any) -> Any: return updated(E.REMAINDER, self, other)
    def __ipow__(self, other: Any) -> Any: return updated(E.POW, self, other)

    # -- comparisons: bool results, no gradient ---------------------------------------------
    def __lt__(self, other: Any) -> Any: return E.less(self, other)
    def __le__(self, other: Any) -> Any: return E.less_equal(self, other)
    def __gt__(self, other: Any) -> Any: return E.greater(self, other)
    def __ge__(self, other: Any) -> Any: return E.greater_equal(self, other)
    # (None is no value to compare with: NotImplemented lets Python answer by identity,
    # so that x == None is False and `x in [None, y]` works, as PyTorch's)
    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return NotImplemented if other is None else E.equal(self, other)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return NotImplemented if other is None else E.not_equal(self, other)

    __hash__ = object.__hash__  # values stay usable as dict keys, as in PyTorch

    # -- indexing and shape ---------------------------------------------------------------------
    def __getitem__(self, index: Any) -> Any: return SH.getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        # (a Tensor writes into its array: Tensor.__setitem__; every other kind is a value
        # of a transformation or a graph, which a write cannot reach, as in JAX)
        raise TypeError(
            f"x[...] = value: x is a {self._kind()}, which cannot be written into: a graph "
            f"node stands for a value computed later, and a transformation's values are "
            f"recorded as operations that make new values. Build the new value instead: "
            f"mg.where(mask, value, x), or mg.concatenate of the pieces")

    # len() and iteration, once for every value kind: the first axis, as in NumPy. (A
    # graph node, a vmap example and a dual number read it from their shape too.)
    def __len__(self) -> int:
        return self._first_axis("len() of")

    def __iter__(self) -> Any:
        # Without __iter__, Python iterates by __getitem__ until an IndexError, and a 0-d
        # value would iterate as empty: list(t) == [], sum(t) == 0, and np.zeros(t) would
        # read t as the shape (). NumPy and PyTorch refuse; so do we.
        return (self[i] for i in range(self._first_axis("iteration over")))

    def _first_axis(self, what: str) -> int:
        shape = self.shape
        if shape is None:  # a graph node whose shape depends on a placeholder of any shape
            raise TypeError(f"{what} a {self._kind()} whose shape is known only when the "
                            f"graph runs: give its placeholder a shape")
        if not shape:
            raise TypeError(f"{what} a 0-d {self._kind()}: it has no axis to go along "
                            f"(x.item() or float(x) gives its number)")
        return shape[0]

    def _kind(self) -> str:
        return self._noun or f"value ({type(self).__name__}, inside a transformation)"

    # -- the array itself, which only a tensor hands out (tensor.py has these as its own) ---
    # Without them, x.data and np.from_dlpack(x) inside mg.grad, mg.vmap or a graph
    # failed with "'Box' object has no attribute 'data'", naming an internal class.
    @property
    def data(self) -> Any:
        raise NoArrayError(self._no_array_of(".data"))

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: bool | None = None) -> Any:
        raise NoArrayError(self._no_array_of("DLPack export (np.from_dlpack, torch.from_dlpack)"))

    def __dlpack_device__(self) -> Any:
        raise NoArrayError(self._no_array_of("DLPack export (np.from_dlpack, torch.from_dlpack)"))

    def _no_array_of(self, what: str) -> str:
        """Why this kind of value has no array for ``what`` (a kind may say it its way)."""
        return (f"{what}: a {self._kind()} has no array to hand out (only a tensor, outside "
                f"transformations, has one); compute with minigraph functions on it")

    def _refuse_update(self, where: str) -> None:
        """A kind whose ``x op= y`` must not rebind the name raises here (see ``updated``):
        a graph's Variable, whose state only an ``assign`` node changes."""

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def T(self) -> Any:  # noqa: N802 - NumPy's name
        return SH.transpose(self)

    @property
    def mT(self) -> Any:  # noqa: N802 - the Array API's name
        return SH.matrix_transpose(self)

    def reshape(self, *shape: Any) -> Any:
        return SH.reshape(self, shape[0] if len(shape) == 1 else shape)

    def transpose(self, *axes: Any) -> Any:
        # NumPy's spellings: x.transpose(), x.transpose(1, 0), x.transpose((1, 0)); one
        # argument is passed on as it is (None, a tuple, an integer array, which has no
        # truth value to ask)
        if not axes:
            return SH.transpose(self)
        return SH.transpose(self, axes[0] if len(axes) == 1 else axes)

    # (``dtype`` and ``out`` are NumPy's: ``np.sum(x)``, ``np.mean(x)``, ``np.max(x)`` and
    # ``np.min(x)`` call the method of a value that is not a NumPy array, passing them, so
    # that the value's own library computes its reduction. With their defaults, x's is
    # minigraph's, with its gradient; before, NumPy's call failed with "unexpected
    # keyword argument 'out'", as it still does on a PyTorch tensor.)
    def sum(self, axis: Any = None, keepdims: bool = False, *, dtype: Any = None,
            out: Any = None) -> Any:
        if dtype is not None or out is not None:
            raise _numpy_option(self, "sum", dtype, out)
        return R.sum(self, axis, keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False, *, dtype: Any = None,
             out: Any = None) -> Any:
        if dtype is not None or out is not None:
            raise _numpy_option(self, "mean", dtype, out)
        return R.mean(self, axis, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False, *, out: Any = None) -> Any:
        if out is not None:
            raise _numpy_option(self, "max", None, out)
        return R.max(self, axis, keepdims)

    def min(self, axis: Any = None, keepdims: bool = False, *, out: Any = None) -> Any:
        if out is not None:
            raise _numpy_option(self, "min", None, out)
        return R.min(self, axis, keepdims)

    def astype(self, dtype: str, copy: bool = True) -> Any:
        return C.astype(self, dtype, copy)

    def to(self, device: Any) -> Any:
        return C.to_device(self, device)

    def detach(self) -> Any:
        """PyTorch's spelling of stop_gradient, for every kind of value (a tensor's
        also shares its memory: Tensor.detach)."""
        return C.stop_gradient(self)

    # -- the tape's attributes, on a value that is not a tensor (Tensor has its own) ----------
    # A transformation's value (a box, a dual number, a batch) or a graph node answers
    # them as torch.func's wrapped tensors do: no gradient is recorded on it, and
    # backward() is refused: inside a transformation mg.grad and mg.vjp differentiate.
    @property
    def requires_grad(self) -> bool:
        return False

    @property
    def grad(self) -> Any:  # (None here; a tensor's, its gradient)
        return None

    def backward(self, *args: Any, **kwargs: Any) -> None:
        raise GradientError(
            f"backward() of a {self._kind()}: backward() differentiates what the tape "
            f"recorded on tensors, and inside a transformation (mg.grad, mg.vmap, mg.jvp) "
            f"or a graph there is none. Differentiate with mg.grad or mg.vjp of a function "
            f"(per-example gradients: mg.vmap(mg.grad(loss))), or mg.gradients in a graph")

    def __format__(self, spec: str) -> str:
        """``f"{x:.3f}"``: the number, where the value can say it (float(): a box's or
        a dual number's value inside; a batch or a graph node refuses, saying why); with
        no spec, the text print shows."""
        # (each kind has its __float__, which ArrayOps does not declare)
        return format(float(self), spec) if spec else str(self)  # type: ignore[arg-type]

    # -- elementwise functions as methods -----------------------------------------------------
    def exp(self) -> Any: return E.exp(self)
    def log(self) -> Any: return E.log(self)
    def sin(self) -> Any: return E.sin(self)
    def cos(self) -> Any: return E.cos(self)
    def tanh(self) -> Any: return E.tanh(self)
    def sigmoid(self) -> Any: return E.sigmoid(self)
    def relu(self) -> Any: return E.relu(self)
    def sqrt(self) -> Any: return E.sqrt(self)


def _numpy_option(x: ArrayOps, name: str, dtype: Any, out: Any) -> TypeError:
    """The refusal of NumPy's ``dtype=`` or ``out=`` for a reduction: minigraph's has neither
    (a TypeError, as Python's for a keyword a function does not take)."""
    of = f"{name} of a {x._kind()} of shape {S.shape_of(x)} {S.dtype_of(x)}"
    if dtype is not None:
        try:
            asked = np.dtype(dtype).name  # (np.float32, "float32": the name)
        except TypeError:
            asked = repr(dtype)
        return DTypeError(f"{of}: dtype={asked} is not supported (a NumPy option: compute "
                          f"in that dtype); cast first: x.astype(...).{name}()")
    return TypeError(f"{of}: out= is not supported (a NumPy option: write the result into "
                     f"a given array); use the value {name} returns")


def updated(prim: Any, x: Any, other: Any) -> Any:
    """``x op= other`` on a value that cannot be written into: ``x op other``, after the
    check an update in place makes (:func:`check_in_place`)."""
    value = (f"the number {other!r}" if type(other) in (bool, int, float)
             else f"a value of shape {S.shape_of(other)} {S.dtype_of(other)}")
    where = f"{prim.name} in place (a {x._kind()} of shape {x.shape} {x.dtype}, and {value})"
    check_in_place(prim, x, other, where)
    x._refuse_update(where)
    refuse_aliased(x, where)
    out = bind_two(prim, x, other)
    if _lost_history(x, out):
        refuse_untracked(prim, where)
    return out


def _lost_history(x: Any, out: Any) -> bool:
    """Whether ``out`` is a constant at a level where ``x`` is a transformation's value
    (a box of mg.grad, a dual number of forward mode ...): each wrapper of ``x``, from the
    outside in, must have one of its type and level around ``out``. A graph being
    recorded (mg.grad(mode="graph")) marks what no_grad made with a no_grad node
    (``Node._bind``): a constant to its gradients pass."""
    if getattr(out, "prim", None) is C.NO_GRAD and getattr(x, "prim", None) is not C.NO_GRAD:
        return True
    levels = set()
    while (inside := getattr(out, "_inside", None)) is not None:
        levels.add((type(out), out._priority))
        out = inside()
    while (inside := getattr(x, "_inside", None)) is not None:
        if (type(x), x._priority) not in levels:
            return True
        x = inside()
    return False


def refuse_untracked(prim: Any, where: str) -> None:
    """The refusal of an update that would bind the name to a constant where the value
    carries a derivative (being recorded, or differentiated by a transformation):
    ``h //= y`` (``prim`` has no derivative) or ``with mg.no_grad(): h += 1``. Every
    gradient through h would silently be zero. PyTorch writes into h and keeps its
    history: it refuses the first at backward() (the derivative "is not implemented"),
    and passes the second's gradient straight through to h's history; that needs a
    write, which a rebinding is not, so the second is refused here too, as eager
    minigraph refuses it at backward(), and the straight-through value is spelled out."""
    name, new = rebinding().split(" = ", 1)
    if not prim.differentiable:
        why = (f"{prim.name} has no derivative, so the new value would be a constant and "
               f"every gradient through {name} would be zero (PyTorch: its derivative is "
               f"not implemented). Compute it apart from {name} (q = mg.stop_gradient("
               f"{new})) if no gradient is meant to flow")
    else:
        why = (f"under mg.no_grad() the new value would not be recorded, so it would be "
               f"a constant and every gradient through {name} would be zero (PyTorch "
               f"writes into {name} and keeps its history). For that, write it outside "
               f"no_grad as {name} = {name} + mg.stop_gradient({new} - {name}), or "
               f"{name} = mg.stop_gradient({new}) for a constant")
    raise GradientError(f"{where}: {why}")


def refuse_aliased(x: Any, where: str) -> None:
    """An update that binds a new value to the name (recorded, or on a transformation's
    value) is refused where the code making it holds ``x``'s memory in another place:
    after ``b = a; b *= 2``, eager mode has written into the one value, so ``a`` sees the
    change too, while here ``a`` would keep the old value and every later read of it
    would differ. The same holds for a view and what it views (``v = y[:1]``, then
    ``v += 1`` or ``y += 1``), for a value that a list, tuple, dict or set, or an
    object's attribute, holds (``hs.append(h)``, then ``h += 1``; ``for h in hs: h +=
    1``), for the caller's names (``def step(h): h += 1``, called as ``step(h)``), and
    for a module's names the function reads (``G.append(h)``), and for the caller of a
    transformation that handed f its own tensor (:class:`passed_as_is`: ``y += x`` in
    ``mg.grad(f)(x, y)`` writes into the caller's ``y`` without the transformation).
    What is looked at: the function doing the update (the first frame outside
    minigraph) and its callers up to a module's top level, through the frames of
    minigraph and of libraries between them (``model(h)`` calls ``forward(h)`` through
    ``Module.__call__``; ``functools.singledispatch`` through its wrapper); their names,
    and everything inside each of their values: items of containers, an object's
    attributes (``__slots__`` too), a NumPy object array's items (``hs[0][0]``,
    ``o.p.q.r``). Above a minigraph frame, where a transformation may have put x in a
    wrapper of its own (a box, a batch), only x itself counts: the caller holds what
    the wrapper wraps, which :class:`passed_as_is` speaks for.

    Where Python's reference count shows that nothing but the update itself refers to
    x or its memory (:func:`_alone`), there is nothing to look for: a chain of updates
    then costs the same per update however many values the program keeps."""
    refs = sys.getrefcount(x)  # (first: before this function refers to x in more places)
    frame = user_frame()
    if frame is None:
        return
    alone = _alone(x, refs, frame)
    memory = _memory(x)
    names = [] if alone else _holders_in_scope(x, memory, frame)
    level = getattr(x, "_priority", None)  # (a transformation's value: its level)
    passed = [what for held, what, at in _passed()
              if _shares(memory, held) and at in (None, level)]
    names += passed
    if len(names) > 1 or passed:
        code = frame.f_code
        raise GradientError(
            f"{where}, in {code.co_name}, {code.co_filename}, line {frame.f_lineno}: "
            f"{' and '.join(sorted(names))} hold the same value, or views of one memory. "
            f"Without recording, the update writes into it and every holder sees the "
            f"change; here it makes a new value for one name and would leave the others "
            f"with the old one. Write {rebinding(frame)} for a new value (the others "
            f"keep the old one in every mode), or copy first (b = a * 1.0) if they are "
            f"meant to change apart")


def refuse_captured(where: str, x: Any, value: Any) -> None:
    """``x op= value`` where x is a tensor and ``value`` a transformation's (f's argument
    under mg.grad, a batch under mg.vmap, a graph's node): x's array cannot hold the
    result, which is the transformation's value, so the name x is bound to it, as for a
    value that cannot be written into (:func:`updated`). A name of the updating
    function's own may be, and so may an item or attribute of a container the function
    made itself (``outs[0] += x`` after ``outs = [...]``, ``a.v += x`` after ``a =
    Acc()``): they go when it returns, as torch.func allows. An item or attribute
    reached from a global, a free variable or a parameter (``self.buf += x``, ``hs[0]
    += x``) would be left holding the transformation's value after it returns, where
    eager mode writes into the tensor. Refused, as torch.func refuses an update "that
    would mutate a captured Tensor"; so is one through a local name bound to such a
    container (``outs = self.bufs``), or two levels down (``outs[0][0] += x``). Where the
    line cannot be read whole (no source text, as under ``exec``; a statement over
    several lines), the bytecode says where the result goes: to a name of f's own, or
    refused. So is a call whose result no name takes (``operator.iadd(buf, x)``): eager
    mode would have written into buf; here the update would be lost. (Source mode runs
    f's statements itself, binding f's names: its normaliser checks those updates.)"""
    refs = sys.getrefcount(x)  # (first: before this function refers to x in more places)
    frame = user_frame()
    if frame is None or _generated(frame.f_code):
        return  # (a program minigraph wrote: codegen.define's; it binds names of its own)
    stmt = _statement_at(frame)
    if not isinstance(stmt, ast.AugAssign):  # (over several lines?)
        stmt = _augmented_statement(frame)
    code = frame.f_code
    if stmt is None:  # (no source text, or a call: operator.iadd(buf, x), buf.__iadd__(x))
        if _run_by_source_mode():
            return  # (its normaliser runs f's statements, binds f's names, checks holders)
        store = _update_stored_by(frame)  # (the bytecode says where the result goes)
        name = None if store is None else \
            store.argval[0] if isinstance(store.argval, tuple) else store.argval
        if store is not None and (store.opname.startswith("STORE_FAST") or (
                store.opname == "STORE_DEREF" and name in code.co_cellvars)):
            return  # (a name of its own, as below)
        if store is None or store.opname == "POP_TOP":
            raise _captured(where, "the tensor", value, True)
        target = {"STORE_ATTR": f"the attribute {name}", "STORE_SUBSCR": "the item"}.get(
            store.opname, str(name))
        raise _captured(where, target, value, False, unread=store.opname in (
            "STORE_ATTR", "STORE_SUBSCR"))
    place = stmt.target
    if frame.f_locals is not frame.f_globals:
        own = code.co_varnames + code.co_cellvars  # (cellvars: a closure reads the name)
        if isinstance(place, ast.Name) and place.id in own:
            return  # (a name of its own, a parameter too: it goes when the function
            # returns; the caller's holders of the value are refuse_aliased's)
        # One level down only (outs[0], a.v): the container holding the tensor is then
        # the one the name holds, which _its_own reads (in outs[0][0], outs[0] may be a
        # global's list, and is not read: refused, as the other spellings)
        held = place.value if isinstance(place, (ast.Subscript, ast.Attribute)) else None
        if isinstance(held, ast.Name) and held.id in own and \
                held.id not in _parameters(code) and held.id in frame.f_locals and \
                _its_own(frame.f_locals[held.id], frame) and _alone(x, refs, frame):
            return  # (in what the function made, holding a tensor nothing else holds,
            # by its reference count: that goes when it returns too. A tensor the
            # container was given, a model's parameter, a global's, is captured: the
            # search for holders does not look inside a module or a long list)
    raise _captured(where, ast.unparse(stmt.target), value, False)


def _captured(where: str, target: str, value: Any, unbound: bool,
              unread: bool = False) -> GradientError:
    """The refusal of :func:`refuse_captured`; ``unbound``: the update is a call whose
    result no name is bound to (``operator.iadd(buf, x)``), so it would be lost;
    ``unread``: an item or attribute updated where the line has no source text."""
    what = ("a call such as operator.iadd(buf, x) updates a tensor, with a value that is a "
            f"transformation's ({value._kind()}): the update would mutate a captured tensor. "
            "Its array cannot hold the transformation's value, and the call's result is "
            "bound to no name, so the update would be lost") if unbound else (
        f"{target} is a tensor, and the value is a transformation's ({value._kind()}): the "
        f"update would mutate a captured tensor. Its array cannot hold the transformation's "
        f"value, and binding {target} to it would leave that value in {target} after the "
        f"transformation returns")
    if unread:
        what += (" (the line has no source text, as under exec, so whether f made the "
                 "container itself cannot be read)")
    return GradientError(f"{where}: {what}. Compute the new value inside f (buf = buf + x) "
                         f"and return it, or update the tensor outside f")


def _run_by_source_mode() -> bool:
    """Whether source mode's normaliser is running the update: it runs f's statements
    itself (the user's frame is then the transformation's caller), binds f's names, and
    refuses holders outside f by its own check."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and _in_minigraph(frame):
        if frame.f_globals.get("__name__") == "minigraph.autodiff.source.normalize":
            return True
        frame = frame.f_back
    return False


def _generated(code: CodeType) -> bool:
    """Whether ``code`` is a program minigraph wrote (``codegen.define`` keeps their file
    names), not the user's: a user's file name may start as one of ours."""
    from ..codegen import GENERATED  # (codegen imports the ops: at call time)

    return code.co_filename in GENERATED


def _augmented_statement(frame: FrameType) -> "ast.AugAssign | None":
    """The augmented assignment ``frame`` is at, read whole where it spans several lines
    (``bufs[0] += (x *`` and ``2)`` on the next): the in-place operator's position in the
    code (Python 3.11+) covers the statement. None where it is no such statement, or its
    text is not there."""
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is None:
        return None
    where = list(positions())[frame.f_lasti // 2]
    if None in where:
        return None
    first, last, start, end = where
    lines = [linecache.getline(frame.f_code.co_filename, k).encode()  # (columns: of UTF-8
             for k in range(first, last + 1)]                        # bytes)
    if not all(lines):
        return None
    text = b"".join(lines)[start:len(b"".join(lines[:-1])) + end].decode(errors="replace")
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return None
    return body[0] if len(body) == 1 and isinstance(body[0], ast.AugAssign) else None


def _update_stored_by(frame: FrameType) -> Any:
    """The instruction that takes the result of the update ``frame`` is running: after an
    in-place operator (``x += y``: then a STORE_FAST, STORE_DEREF, STORE_GLOBAL,
    STORE_NAME, STORE_ATTR or STORE_SUBSCR, after stack shuffles) or a call
    (``t = operator.iadd(t, y)``: a store; ``operator.iadd(buf, y)``: POP_TOP, the result
    dropped), read from the bytecode where the source text is not there (``python -c``,
    ``exec``); None where the frame is at neither."""
    instructions = list(dis.get_instructions(frame.f_code))
    at = next((k for k, i in enumerate(instructions) if i.offset == frame.f_lasti), None)
    if at is None:
        return None
    op = instructions[at]
    if not (op.opname.startswith(("INPLACE_", "CALL")) or  # (3.10's INPLACE_ADD ...;
            (op.opname == "BINARY_OP" and str(op.argrepr).endswith("="))):  # 3.11+'s)
        return None
    return next((i for i in instructions[at + 1:]
                 if i.opname not in ("SWAP", "COPY", "ROT_TWO", "ROT_THREE", "DUP_TOP")),
                None)


def _parameters(code: CodeType) -> tuple[str, ...]:
    """The names of a function's parameters (``*args`` and ``**kwargs`` too), which
    ``co_varnames`` lists first."""
    count = code.co_argcount + code.co_kwonlyargcount + \
        bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return tuple(code.co_varnames[:count])


def _its_own(v: Any, frame: FrameType) -> bool:
    """Whether nothing but ``frame``'s own names (not its parameters or free variables)
    holds the container or object ``v``, as far as the search for holders sees
    (:func:`_holders`): one the function made, not a global's, a parameter's or a
    caller's that a local name was bound to (``outs = self.bufs``)."""
    code = frame.f_code
    outside = set(_parameters(code) + code.co_freevars)
    mine = {name: w for name, w in frame.f_locals.items() if name not in outside}
    return len(_holders_in_scope(v, None, frame)) == len(_holders(mine, v, None, False))


def _holders_in_scope(x: Any, memory: Any, frame: FrameType) -> list[str]:
    """Where ``frame`` (the user's, doing the update) and its callers hold ``x`` or memory
    it shares, each written as an error names it (see :func:`refuse_aliased`)."""
    seen: set[tuple[int, str]] = set()  # (module, name): a global read by several frames
    names = _holders(frame.f_locals, x, memory, frame.f_locals is frame.f_globals,
                     frame.f_code.co_cellvars) + \
        [f"{name} (a global)"
         for name in _holders(_globals_read(frame, seen), x, memory, False)]
    wrapped = innermost(x) is not x  # (a box, a dual number, a batch: see refuse_aliased)
    caller = frame
    while caller.f_locals is not caller.f_globals:  # (up to a module's top level)
        caller = caller.f_back  # type: ignore[assignment]
        while caller is not None and (_in_minigraph(caller) or _in_a_library(caller)):
            if wrapped and _in_minigraph(caller):
                memory = None  # (above it: x itself only)
            caller = caller.f_back  # type: ignore[assignment]
        if caller is None:
            break
        module = caller.f_locals is caller.f_globals
        here = caller.f_locals if not module else {  # (a module's: not the globals read)
            k: v for k, v in caller.f_locals.items() if (id(caller.f_globals), k) not in seen}
        then = rebound_by_its_call(_statement_at(caller))  # (h = step(h): not a holder)
        names += [f"{name} (in {caller.f_code.co_name}, a caller)"
                  for name in _holders(here, x, memory, module, caller.f_code.co_cellvars)
                  if name not in then] + \
            [f"{name} (a global)"
             for name in _holders(_globals_read(caller, seen), x, memory, False)]
    return names


def _alone(x: Any, refs: int, frame: FrameType) -> bool:
    """Whether nothing refers to ``x`` but the update itself (``refs``: x's reference
    count on entry to :func:`refuse_aliased`), and, for a tensor that owns a NumPy array,
    nothing to its memory but x: then no place can hold x, or a view of it, and the
    search for holders, which reads every container in scope, is skipped.

    The update's own references: refuse_aliased's argument and getrefcount's, minigraph's
    frames between it and the user's ``frame`` (``Tensor.__iadd__``'s ``self`` ...),
    and the user's statement (``h += y``: the name h and the operand; ``hs[0] += y``: the
    list's item and the operand), :data:`_STATEMENT_REFS`, as this Python counts them.
    Anything else (another name, a container, a tape entry made from x) counts as one
    more; an array viewing x's memory refers to it as its ``.base``. (Python 3.14 may
    leave a reference it borrows uncounted, a frame's too: there the search always runs.)"""
    if sys.version_info >= (3, 14):
        return False
    own = 2 + _STATEMENT_REFS
    inner = sys._getframe(2)  # (refuse_aliased's caller)
    while inner is not frame:  # (minigraph's frames: Tensor.__iadd__, update_in_place ...)
        own += sum(v is x for v in inner.f_locals.values())
        inner = inner.f_back  # type: ignore[assignment]
    if refs > own:
        return False
    data = getattr(x, "data", None)
    # (x.data, the name data and getrefcount's argument; any other array over this
    # memory, a view, holds it as its base. Other array libraries: not read, searched.)
    if isinstance(data, np.generic):  # (a NumPy scalar: no view can share it)
        return True
    return type(data) is np.ndarray and data.base is None and sys.getrefcount(data) <= 3


class _Probe:
    def __iadd__(self, other: Any) -> int:
        return sys.getrefcount(self) - 2  # (less its own: the argument self, getrefcount's)


def _statement_refs() -> int:
    """How many references ``name += y`` holds to name's value while ``__iadd__`` runs,
    in this Python (2 up to 3.13: the name and the operand on the stack); more while a
    tracer holds the probe's frame locals."""
    p: Any = _Probe()
    p += 0
    return int(p)


# At most 2, the count of CPython 3.10 to 3.13: a tracer that reads frames' f_locals
# while minigraph is imported (a debugger stepping) adds the probe frame's own references
# to the count, and a count too high would let _alone take a value with another holder
# for alone (a wrong value where the update is not refused). A lower one is only slower.
_STATEMENT_REFS = min(_statement_refs(), 2)


# The arguments that running transformations handed f as the caller's own objects, each
# as (its memory, which argument it is): see passed_as_is. One list per thread: two
# threads may run transformations at once, and neither may drop the other's entries
# when its own run ends.
_THREAD = threading.local()


def _passed() -> list[tuple[Any, str, int | None]]:
    passed = getattr(_THREAD, "passed", None)
    if passed is None:
        passed = _THREAD.passed = []
    return passed


class passed_as_is:
    """``with passed_as_is(args, nums, "grad"):`` around a transformation's run of f: the
    arguments at positions other than ``nums`` that are the caller's tensors (``values``
    as f gets them: the tensor itself, or in graph mode the placeholder that stands for
    it) are held by the caller. Without the transformation, ``y += x`` writes into the
    caller's ``y``; inside it, an update that makes a new value instead (``x`` is a value
    being differentiated, or ``y`` a placeholder) would leave the caller's tensor as it
    was, so :func:`refuse_aliased` refuses it, as PyTorch's ``torch.func.grad`` writes
    into it. (The differentiated arguments are the transformation's own values, which
    every mode rebinds, as JAX does.)

    ``level``: the transformation's level, whose values f gets for the arguments at
    ``nums`` too (mg.vmap's batches, mg.jvp's dual numbers): an update of such a value
    itself, at that level, that shares an argument's memory (``x += 1`` on f's own
    argument) is refused as well. torch.func.vmap and jvp write into the caller's
    tensor; here the caller's tensor would be left as it was. (An update inside an
    inner transformation, of its own wrapper of the value, is that one's business.)"""

    __slots__ = ("entries", "start")

    def __init__(self, values: Any, nums: Any, who: str, caller: Any = None,
                 every: bool = False, level: int | None = None):
        """``every``: each argument but a number is held, whatever its kind (checkpoint's
        arguments, which its backward pass recomputes f from)."""
        held = caller_held(values if caller is None else caller, nums, who) if not every \
            else {k: f"the tensor passed to {who} as argument {k}"
                  for k, v in enumerate(values) if not isinstance(v, (bool, int, float))}
        memories: list[tuple[Any, str, int | None]] = [
            (_memory(values[k]), what, None) for k, what in held.items()]
        if level is not None:  # (a tensor of the caller's: a list or an array given is
            # copied into one of the transformation's own, which no one else holds)
            given = values if caller is None else caller
            memories += [(_memory(values[k]), f"the tensor passed to {who} as argument {k}",
                          level) for k in nums
                         if isinstance(given[k], ArrayOps) and type(given[k]) not in KINDS]
        self.entries = [entry for entry in memories if entry[0] is not None]
        self.start = 0

    def __enter__(self) -> None:
        passed = _passed()
        self.start = len(passed)
        passed.extend(self.entries)

    def __exit__(self, *exc: object) -> None:
        del _passed()[self.start:]


def caller_held(given: Any, nums: Any, who: str) -> dict[int, str]:
    """The positions of a transformation's arguments ``given`` that it does not
    differentiate (``nums``) and whose value eager mode's ``y += 1`` writes into (a
    tensor, the one value kind not registered with ``bind``, or a NumPy array), each
    with what an error calls it."""
    return {k: f"the tensor passed to {who} as argument {k}" for k, v in enumerate(given)
            if k not in nums and (isinstance(v, np.ndarray) or
                                  isinstance(v, ArrayOps) and type(v) not in KINDS)}


def holders_among(names: dict[str, Any], x: Any) -> list[str]:
    """Where ``names`` hold ``x`` or memory it shares, one level inside their values
    too (:func:`_holders`): source mode asks it of the globals and closure variables a
    function reads, which its own names do not show."""
    return _holders(names, x, _memory(x), False)


def _globals_read(frame: FrameType, seen: set[tuple[int, str]]) -> dict[str, Any]:
    """The module's names that the frame's code reads (``G.append(h)`` in a function),
    unless the frame is the module's own (whose locals they are) or ``seen`` has them
    (another frame of the search read them); adds them to ``seen``."""
    values = frame.f_globals
    if frame.f_locals is values:
        return {}
    read = {n: values[n] for n in frame.f_code.co_names
            if n in values and n not in frame.f_locals and (id(values), n) not in seen}
    seen.update((id(values), n) for n in read)
    return read


def user_frame() -> FrameType | None:
    """The frame of the code that called into minigraph: the first one outside it."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _in_minigraph(frame):
        frame = frame.f_back
    return frame


def raised_at(exc: BaseException) -> str:
    """Where the user's code raised ``exc``: ``file, line 12: y += 1.0``, from the
    innermost frame of its traceback outside minigraph and the libraries ("" if none)."""
    found = ""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if not (_in_minigraph(frame) or _in_a_library(frame)):
            code = linecache.getline(frame.f_code.co_filename, tb.tb_lineno).strip()
            found = f"{frame.f_code.co_filename}, line {tb.tb_lineno}: {code}"
        tb = tb.tb_next
    return found


def rebound_by_its_call(stmt: "ast.stmt | None") -> frozenset[str]:
    """The names that ``stmt`` binds to the result of a call, each read once in it and
    nowhere else: ``h`` in ``h = step(h)``. A callee's update in place of that value is
    the caller's no longer once the call returns: the name holds the result then, in
    eager mode as in a transformation, so it is not another holder of the value
    (:func:`refuse_aliased`; source mode's normaliser asks the same)."""
    if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)):
        return frozenset()
    targets = [t for target in stmt.targets
               for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
    if not all(isinstance(t, ast.Name) for t in targets):
        return frozenset()
    reads = [n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)]
    return frozenset(t.id for t in targets
                     if isinstance(t, ast.Name) and reads.count(t.id) == 1)


def _statement_at(frame: FrameType) -> "ast.stmt | None":
    """The statement ``frame`` is running, where its line holds it whole. Several on one
    line (``h = step(h); return h``) are told apart by the column of the instruction the
    frame is at (``co_positions``, Python 3.11+; before, such a line gives None)."""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    text = line.lstrip()
    try:
        body = ast.parse(text).body
    except SyntaxError:  # (a line of a longer statement: nothing is taken for granted)
        return None
    if len(body) == 1:
        return body[0]
    positions = getattr(frame.f_code, "co_positions", None)
    where = list(positions())[frame.f_lasti // 2] if positions else None
    if where is None or where[2] is None:
        return None
    column = where[2] - (len(line) - len(text))  # (ast's columns: of the stripped text)
    return next((stmt for stmt in body
                 if stmt.col_offset <= column < (stmt.end_col_offset or 0)), None)


def rebinding(frame: FrameType | None = None) -> str:
    """The user's update written as a new value: ``h += 0.5 * y`` as ``h = h + (0.5 *
    y)``, from the statement ``frame`` (the user's, by default) is at; ``name = name op
    y`` where that is not one."""
    frame = frame or user_frame()
    stmt = None if frame is None else _statement_at(frame)
    if not (isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name)):
        return "name = name op y"
    name, value = stmt.target.id, ast.unparse(stmt.value)
    simple = isinstance(stmt.value, (ast.Name, ast.Constant, ast.Attribute))  # (no brackets)
    return f"{name} = {name} {_SYMBOLS[type(stmt.op)]} {value if simple else f'({value})'}"


_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
            ast.Mod: "%", ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|",
            ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}


# Where Python's own modules and installed packages live: a caller there (pytest, IPython,
# a thread pool) is not the user's code, and the search for holders stops below it.
LIBRARIES = tuple({os.path.join(path, "") for key in ("stdlib", "platstdlib", "purelib",
                                                       "platlib")
                    if (path := sysconfig.get_paths().get(key))})


def _in_a_library(frame: FrameType) -> bool:
    return frame.f_code.co_filename.startswith(LIBRARIES)


def _holders(names: dict[str, Any], x: Any, memory: Any, module: bool,
             cells: tuple[str, ...] = ()) -> list[str]:
    """Where ``names`` (a frame's locals) hold ``x`` or memory it shares: ``h``,
    ``hs[0]``, ``d['h']``, ``o.h``, ``self.hidden[3]``, ``hs[0][0]``, ``an item of s``,
    at any depth below containers of at most ``_VIEWS_READ`` items (each container and
    object once). At a module's (a notebook's) top level, IPython's record of the cells'
    results (``_``, ``_3``, ``Out``) is left out: it holds every value a cell displayed,
    which the user does not read back.

    The items of a container are compared with ``x`` by identity at C's speed (a list
    of 60,000 tensors costs an update about a millisecond). Whether one is a view of
    ``x``'s memory, which takes a Python call per item, is asked, and the containers
    and objects among them are walked into, only in containers of at most
    ``_VIEWS_READ`` items: every update pays for what is read, and a dataset of 200,000
    rows in scope would cost each one a second. (A view, or a container holding x,
    inside a longer container is not seen.) ``memory`` None: ``x`` itself only.
    ``cells``: the frame's names that functions it made read as closure variables
    (:func:`_hidden_in`)."""
    found: list[str] = []
    walked: set[int] = set()  # (the containers and objects read: each once)
    for name, v in names.items():
        if module and (name in _OUTPUT_HISTORY or name[:1] == "_" and name[1:].isdigit()):
            continue
        if v is x or memory is not None and _shares(_memory(v), memory):
            found.append(name)
        elif _may_hold(type(v)) and not _bare(v):
            found += _inside(name, v, x, memory, walked, cells)
    return found


def _bare(v: Any) -> bool:
    """Whether ``v`` is a function that keeps nothing (no closure variable, no default):
    most of a module's names, which an update in a module's code would otherwise walk
    one by one (300 helpers made each ``h += y`` ten times slower)."""
    return type(v) is FunctionType and v.__closure__ is None and \
        v.__defaults__ is None and v.__kwdefaults__ is None


def _inside(name: str, v: Any, x: Any, memory: Any, walked: set[int],
            cells: tuple[str, ...] = ()) -> list[str]:
    """The places inside ``v`` (named ``name``), at any depth, that hold ``x`` or memory
    it shares (see :func:`_holders`)."""
    found = []
    todo = [(name, v)]  # (a stack, not recursion: a deeply nested list is no error)
    while todo:
        where, v = todo.pop()
        if id(v) in walked:
            continue
        walked.add(id(v))
        try:
            items = _contents(v)
            if items is None:
                continue
            same = any(map(operator.is_, items, itertools.repeat(x)))
            small = len(items) <= _VIEWS_READ  # (read further: see _holders)
        except Exception:  # (a user's container that raises when read, a table that
            continue       # loads lazily: an update must not fail on an unrelated object)
        views = memory is not None and (small or _viewed(memory))
        kinds = set(map(type, items)) if small else set()
        nested = {kind for kind in kinds if _may_hold(kind)}
        if not (same or views or nested):
            continue
        try:
            places = list(_places(v, cells))
        except Exception:  # (as above: what it holds is not seen)
            continue
        for place, item in places:
            if item is x or views and _shares(_memory(item), memory):
                found.append(where + place)
            elif type(item) in nested:
                todo.append((where + place, item))
    return found


_OUTPUT_HISTORY = {"_", "__", "___", "Out", "_oh"}  # IPython's names for earlier results
_VIEWS_READ = 64


def _viewed(memory: Any) -> bool:
    """Whether a view of ``memory`` (a :func:`_memory` result) may exist, so that the
    items of a container longer than ``_VIEWS_READ`` are asked too (a slice kept per
    step of a long loop). A NumPy array that is no view itself and that nothing refers
    to but its tensor (``x.data``), ``memory`` and this function has none: every view
    refers to its base. Another library's array, asked as NumPy's: it may; a graph
    node's views are not looked for there (they would cost each update a Python call
    per item)."""
    xp, data = memory
    if xp is None:
        return False
    # (x.data, the tuple memory, the name data, getrefcount's argument)
    return not (type(data) is np.ndarray and data.base is None and sys.getrefcount(data) <= 4)


def _may_hold(kind: type) -> bool:
    """Whether a value of ``kind`` may hold others that :func:`_contents` reads: a
    container, a NumPy array (of objects), a ``SimpleNamespace``, an instance of a class
    of the user's with attributes, and what keeps values out of sight
    (:func:`_hidden_in`: a function's closure, a partial's arguments ...). Not
    minigraph's own records, classes and modules, nor a library's objects (pytest's
    ``request``, a logger), whose graphs of objects can be large, and which do not keep
    the user's values."""
    if issubclass(kind, (*_SEQUENCES, dict, np.ndarray, SimpleNamespace, *_HIDING)):
        return True
    module = getattr(kind, "__module__", None)
    if not isinstance(module, str):  # (a class made with __module__ None: from nowhere
        module = ""                  # known, so not a library's)
    if issubclass(kind, (type, ModuleType, FunctionType)) or module == "builtins" \
            or module.startswith("minigraph."):  # (a graph's own records)
        return False
    source = getattr(sys.modules.get(module), "__file__", None) or ""
    return not source.startswith(LIBRARIES) and \
        (kind.__dictoffset__ != 0 or bool(_slots(kind)))


def _slots(kind: type) -> list[str]:
    """The attribute names that the ``__slots__`` of ``kind`` and its bases declare (a
    private ``__a`` as Python stores it, ``_Class__a``)."""
    names = []
    for k in kind.__mro__:
        declared = k.__dict__.get("__slots__", ())
        for name in [declared] if isinstance(declared, str) else declared:
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{k.__name__.lstrip('_')}{name}"
            if name not in ("__dict__", "__weakref__"):
                names.append(name)
    return names


def _contents(v: Any) -> Any:
    """What the container or object ``v`` holds directly (its items; an instance's
    attributes, a NumPy object array's items), as a sized collection; None for anything
    else."""
    kind = type(v)
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        return v
    if kind is dict:
        return v.values()
    # (issubclass of its type, not isinstance: isinstance asks the object's __class__,
    # which a proxy's __getattribute__ may answer with an error)
    if issubclass(kind, _SEQUENCES):  # (their subclasses, a namedtuple, a deque: after
        return v                      # the exact types, which most containers are)
    if issubclass(kind, dict):  # an OrderedDict, a defaultdict
        return v.values()
    if issubclass(kind, np.ndarray):
        return v.ravel().tolist() if v.dtype == object else None
    if issubclass(kind, _HIDING):
        return [item for _, item in _hidden_in(v)]
    if not _may_hold(kind):
        return None
    return list(_attributes(v).values())


def _attributes(v: Any) -> dict[str, Any]:
    """An instance's attributes: its ``__dict__`` and the ``__slots__`` that are set.
    An object whose ``__dict__`` cannot be read (its ``__getattribute__`` raises) is
    taken as holding none there: an update must not fail on an unrelated object."""
    try:
        attributes = getattr(v, "__dict__", None)
    except Exception:  # (the user's code raised: what it is does not matter here)
        attributes = None
    found = dict(attributes) if type(attributes) is dict else {}
    for name in _slots(type(v)):
        try:
            found[name] = object.__getattribute__(v, name)
        except AttributeError:  # (a slot never set)
            pass
    return found


def _places(v: Any, cells: tuple[str, ...] = ()) -> Any:
    """``(place, item)`` for what :func:`_contents` gives, each place written as Python
    reads it (``cells``: see :func:`_hidden_in`)."""
    kind = type(v)
    if issubclass(kind, (set, frozenset)):
        return ((f" (an item of the {kind.__name__})", item) for item in v)
    if issubclass(kind, _SEQUENCES):
        return ((f"[{i}]", item) for i, item in enumerate(v))
    if issubclass(kind, dict):
        return ((f"[{key!r}]", item) for key, item in v.items())
    if issubclass(kind, np.ndarray):
        return ((f"[{', '.join(map(str, i))}]", item) for i, item in np.ndenumerate(v))
    if issubclass(kind, _HIDING):
        return _hidden_in(v, cells)
    return ((f".{key}", item) for key, item in _attributes(v).items())


def _hidden_in(v: Any, cells: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    """``(place, item)`` for what a function-like or opaque object ``v`` keeps: a
    function's closure variables and default arguments, a ``functools.partial``'s
    function and arguments, a bound method's ``__self__``, a ``ChainMap``'s maps, a
    ``MappingProxyType``'s items, a suspended generator's names, and what any other
    iterator (``itertools.repeat(h)``, ``iter(hs)``) or an ``lru_cache`` refers to, as
    Python's collector reads it. Each is a place whose value eager mode's write would
    show through. A closure variable named in ``cells`` is left out: a function made by
    the updating frame shares that name's cell, which the update rebinds too."""
    kind = type(v)
    if issubclass(kind, FunctionType):
        closure = zip(v.__code__.co_freevars, v.__closure__ or ())
        found = [(f" (its closure variable {name})", cell.cell_contents)
                 for name, cell in closure if name not in cells and _filled(cell)]
        found += [(f".__defaults__[{i}]", d) for i, d in enumerate(v.__defaults__ or ())]
        return found + [(f".__kwdefaults__[{k!r}]", d)
                        for k, d in (v.__kwdefaults__ or {}).items()]
    if issubclass(kind, functools.partial):
        return [(".func", v.func)] + [(f".args[{i}]", a) for i, a in enumerate(v.args)] + \
            [(f".keywords[{k!r}]", a) for k, a in v.keywords.items()]
    if issubclass(kind, MethodType):
        return [(".__self__", v.__self__), (".__func__", v.__func__)]
    if issubclass(kind, collections.ChainMap):
        return [(f".maps[{i}]", m) for i, m in enumerate(v.maps)]
    if issubclass(kind, MappingProxyType):
        return [(f"[{k!r}]", item) for k, item in v.items()]
    if issubclass(kind, GeneratorType):  # (a running one is a frame of the search itself)
        frame = None if v.gi_running else v.gi_frame
        return [] if frame is None else [(f" (the generator's name {name})", item)
                                         for name, item in frame.f_locals.items()]
    return [(f" (kept by the {kind.__name__})", item) for item in gc.get_referents(v)
            if not isinstance(item, type)]


def _filled(cell: Any) -> bool:
    """Whether a closure variable's cell holds a value (the name may be unbound yet)."""
    try:
        cell.cell_contents
    except ValueError:  # (a closure variable not yet assigned)
        return False
    return True


# What keeps values out of sight of a container's items or an object's attributes
# (:func:`_hidden_in`): functions and their relatives, Python's own iterators (a
# list's, itertools' ...) and the standard library's containers that are objects (a
# queue, a UserDict), which only the collector's view of them reads.
_HIDING = (FunctionType, functools.partial, MethodType, collections.ChainMap,
           MappingProxyType, GeneratorType, collections.UserDict, collections.UserList,
           queue.Queue, queue.SimpleQueue, type(iter([])), type(iter(())),
           type(iter({})), type(iter(range(1))), type(functools.lru_cache(len)),
           *(kind for kind in vars(itertools).values()
             if isinstance(kind, type) and hasattr(kind, "__next__")))


_SEQUENCES = (list, tuple, set, frozenset, collections.deque)


def _memory(v: Any) -> Any:
    """What ``v``'s value is stored in, as eager mode would have it: under a
    transformation's wrappers (``_inside``: a box's value, a dual number's primal, a vmap
    batch), a tensor's array with its array namespace, or the graph node whose memory a
    chain of view nodes (reshape, basic indexing ...) shares; a NumPy array itself (the
    user's ``t.numpy()``, ``np.asarray(t)``, ``np.from_dlpack(t)``: eager mode's update
    shows through it, as through a ``t.detach()``), and another library's array on the
    host as NumPy's view of it (``torch.from_dlpack(t)``). None for anything else (a
    number, a source variable: source mode checks its own names)."""
    kind = type(v)  # (its type, as _contents asks)
    if issubclass(kind, np.ndarray):
        return np, v
    if not issubclass(kind, ArrayOps):  # (a user's object of another kind: not read)
        if hasattr(kind, "__dlpack__"):
            try:
                return np, np.from_dlpack(v)  # (no copy: a view of the same memory)
            except Exception:  # (a GPU's, a torch tensor that requires a gradient: not
                return None    # host memory a CPU tensor can share)
        return None
    v = innermost(v)
    data = getattr(v, "data", None)
    if data is not None and hasattr(data, "shape"):  # a tensor
        return v.device.xp, data
    if getattr(v, "graph", None) is not None and hasattr(v, "prim"):  # a graph node
        while v.prim is not None and v.args and v.prim.made_a_view(v.shape, v.params):
            v = v.args[0]
        return None, v
    return None


def innermost(v: Any) -> Any:
    """The value under a transformation's wrappers (``_inside``: a box's value, a dual
    number's primal, a vmap batch), as eager mode would have it."""
    for _ in range(100):  # (levels of nesting: a bound, not a loop over the program)
        inside = getattr(v, "_inside", None)
        if inside is None:
            return v
        v = inside()
    return v


def _shares(a: Any, b: Any) -> bool:
    """Whether two ``_memory`` results may overlap: NumPy's ``may_share_memory`` for two
    NumPy arrays (a CPU tensor's namespace is array-api-compat's, a user's array NumPy's
    own), else the array namespace's where it has one (CuPy's), else the same object.
    (It compares the memory's bounds: cheap, whatever the arrays' sizes.)"""
    if a is None or b is None:
        return False
    (xp, a), (other, b) = a, b
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.may_share_memory(a, b))
    overlap = getattr(xp, "may_share_memory", None) if xp is other else None
    return bool(overlap(a, b)) if overlap is not None else a is b


def _in_minigraph(frame: FrameType) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module == "minigraph" or module.startswith("minigraph.")


def check_in_place(prim: Any, x: Any, other: Any, where: str) -> None:
    """An update in place keeps ``x``'s shape and dtype: the primitive's shape rule must
    give them, or the update is refused (``x32 *= y64``: NumPy would cast the result down,
    x += y of a wider shape would not fit)."""
    if type(other) is Weak:  # (a recorded function's float: as the number it stands for)
        other = AS_NUMBER.get(str(other.dtype), 1.0)
    if x.shape is None or getattr(other, "shape", ()) is None:
        return  # (a graph node whose shape is known only when the graph runs: as its rule)
    shape, dtype = prim.shape(x, other)
    if tuple(shape) != tuple(x.shape):
        raise ShapeError(f"{where}: the result has shape {tuple(shape)}; an in-place update "
                         f"keeps the tensor's shape {tuple(x.shape)}")
    if dtype != S.dtype_of(x):
        raise DTypeError(f"{where}: the result has dtype {dtype}; an in-place update keeps "
                         f"the tensor's dtype {S.dtype_of(x)}")
