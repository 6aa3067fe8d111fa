"""Reverse mode by source transformation: read a Python function, write its adjoint.

The textbook names three ways to implement automatic differentiation: dual numbers
(``forward.py``), a tape (``tape.py``) and *source transformation*, which this module
implements. ``mg.source_grad(f)`` reads the text of ``f`` and writes a new Python function
that computes f's value and its gradient; for the textbook's z = x*y + sin(x)::

    def grad_f(x, y):
        # forward sweep: the evaluation trace (a.*), one primitive per line
        a = x * y
        b = mg.sin(x)
        z = a + b
        # reverse sweep: the adjoint trace (g.*), in reverse order
        gz = mg.ones((), 'float64', 'cpu')
        gb = gz
        ga = gz
        gy = ga * x
        gx = ga * y + gb * mg.cos(x)
        return z, (gx, gy)

How it is written, in four steps:

1. **Read** (:func:`_read`): ``inspect.getsource`` and ``ast``; constructs the method
   cannot handle (``while``, ``try``, ``lambda``, ``with``, ``global`` ...) are refused
   here, before anything runs, with an error naming the construct, function, file and line.
2. **Normalise** (:class:`_Normaliser`): the function's statements are run on *source
   variables* (:class:`SrcVar`), a value kind like ``Tensor`` or ``Dual`` whose ``_bind``
   does not compute but appends a line ``t = mg.sin(x)`` to the program being written and
   returns a new source variable. Running ``x * y + mg.sin(x)`` this way *is* the
   normalisation to three-address form, the evaluation trace (a.1)-(a.5). A source
   variable knows the shape, dtype and device of its value (from the primitive's shape
   rule), because the program is specialised to one input signature.
3. **Adjoint** (:class:`_Reverse`): the normalised program is walked backwards and each
   line's primitive VJP rules, the same ones the tape uses, are run on source variables,
   so they too write lines, (g.1)-(g.5). There is no second set of derivative rules.
   A ``for`` loop pushes the values its reverse needs on a stack in the forward sweep and
   pops them in the reverse sweep; an ``if`` decided at run time is reversed by an ``if``
   on the same condition variable (which the loop's stack restores inside loops).
4. **Tidy and compile**: dead lines are removed, single-use temporaries of the reverse
   sweep are written inline (``gx = ga * y + gb * mg.cos(x)``), names are chosen like
   the textbook's (a, b, ... for intermediates, g + name for adjoints), and the text is
   compiled with ``compile``/``exec``. The text stays in ``.source``.

Decisions worth knowing (each is visible in the text):

* ``gz = 1`` is a tensor of ones of z's shape, dtype and device, not a number folded into
  the lines that read it, so every line of (g.*) appears as the textbook writes it
  (``gb = gz``, ``ga = gz``, ``gy = ga * x``); folding would save two multiplications.
  Python numbers the user wrote stay numbers (``gx = gz * 2.0``); ``x + 0``, ``x * 1`` and
  ``x ** 1`` are ``x``; lines nobody reads are removed.
* The program is specialised to one input signature (shapes, dtypes, devices, and the
  values of arguments that are neither differentiated nor tensors: ``n`` in
  ``range(n)``), built once, cached per function, and replayed. Values the function reads
  from outside its arguments (globals, closure variables) are *constants* of the program,
  captured when it is built, as ``jax.jit`` does: pass anything that changes as an argument.
* What Python can decide while the program is written, it decides (shapes, ``if`` on a
  shape, calls with constant arguments: constant folding). An ``if`` on a tensor is
  written with both branches and decided when the program runs; ``for i in range(n)`` is
  written once, not unrolled. Plain Python functions called with values of the program
  are inlined.
* Two renderings of one program are compiled: ``.source`` calls ``mg.`` functions, so it
  runs on any value kind (tensors on any device, tensors being recorded for a gradient
  of the gradient, dual numbers); ``.raw_source`` calls the primitives' kernels on arrays
  directly, as graph compilation does, and is what a call on tensors that need no
  recording runs (see ``benchmarks/bench_source.py``).

Not supported (refused with the construct and its line): ``while``, ``try``, ``with``,
lambdas and nested functions, generators and comprehensions, ``global``/``nonlocal``,
``break``/``continue``, assignment into part of a tensor, ``for`` over anything but
``range`` with bounds known when the program is built, indexing with a computed tensor,
converting a value of the program to a Python number, and calling functions other than
minigraph's (``np.sin(x)``) on values of the program.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import inspect
import itertools
import keyword
import linecache
import math
import operator
import sys
import textwrap
import threading
import types
import weakref
from collections import Counter
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from ..device import Device, get_device
from ..errors import DeviceError, DTypeError, GradientError, MinigraphError
from ..ops import copy as C
from ..ops import shape as SH
from ..ops.operators import ArrayOps
from ..ops.primitive import KINDS, Primitive, bind, register_kind
from ..tensor import FLOAT_DTYPES, Tensor, tensor
from . import tape
from .forward import Dual

Argnums = "int | tuple[int, ...]"


# ========================================================================================
# 1. Errors that point at the user's line
# ========================================================================================

class Where(NamedTuple):
    """A place in the user's code: function, file, line, and the line's text."""
    function: str
    filename: str
    lineno: int
    text: str = ""

    def __str__(self) -> str:
        return f"in {self.function}, {self.filename}, line {self.lineno}"


class SourceTransformError(MinigraphError, NotImplementedError):
    """Python that source transformation does not handle, found before anything runs.

    ``.construct`` names it (``"a while loop"``); ``.function``, ``.filename`` and
    ``.lineno`` say where it is.
    """

    def __init__(self, problem: str, where: Where, why: str = "", construct: str = ""):
        self.construct = construct or problem
        self.function, self.filename, self.lineno = where.function, where.filename, where.lineno
        text = f"source_grad: {problem} ({where})"
        if where.text:
            text += f"\n    {where.text.strip()}"
        if why:
            text += f"\n{why}"
        super().__init__(text)


def _refusal(construct: str, where: Where, why: str = "") -> SourceTransformError:
    return SourceTransformError(f"{construct} is not supported", where, why, construct)


def _located(exc: MinigraphError, where: Where | None) -> MinigraphError:
    """The same kind of error, with the user's line appended to its message."""
    if where is None or isinstance(exc, SourceTransformError):
        return exc
    located = type(exc)(f"{exc} [source_grad: {where}: {where.text.strip()}]")
    return located


# ========================================================================================
# 2. Reading the function: inspect + ast, and the constructs refused before anything runs
# ========================================================================================

class _Source:
    """A function's parsed definition and what it can see (globals, closure cells)."""

    __slots__ = ("_fn", "node", "filename", "lines", "closure", "loads", "names")

    def __init__(self, fn: types.FunctionType, node: ast.FunctionDef):
        self._fn = weakref.ref(fn)  # weak: the cache below must not keep fn alive
        self.node = node
        self.filename = fn.__code__.co_filename
        self.lines = linecache.getlines(self.filename)
        self.closure = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        self.loads = _loads(node.body)
        self.names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        self.names |= {a.arg for a in node.args.args + node.args.posonlyargs}

    @property
    def fn(self) -> types.FunctionType:
        return self._fn()

    def where(self, node: ast.AST | None = None) -> Where:
        lineno = getattr(node, "lineno", None) or self.node.lineno
        text = self.lines[lineno - 1] if 0 < lineno <= len(self.lines) else ""
        return Where(self.fn.__qualname__, self.filename, lineno, text)


_SOURCES: "weakref.WeakKeyDictionary[Callable, _Source]" = weakref.WeakKeyDictionary()

_NO_CLOSURES = ("define it at module level and call it, or inline its body; a nested "
                "function could close over values being differentiated")
_REFUSED: dict[type, tuple[str, str]] = {
    ast.While: ("a while loop", "its number of iterations is decided by the data as the "
                "program runs, so its adjoint cannot be written in advance; use "
                "`for i in range(n)` with n known when the program is built"),
    ast.Try: ("try/except", "the adjoint of a jump to an exception handler is not defined"),
    ast.With: ("a with block", "its context manager runs code the transformation cannot "
               "see; move it outside the function"),
    ast.AsyncWith: ("async with", ""),
    ast.AsyncFor: ("async for", ""),
    ast.Await: ("await", ""),
    ast.AsyncFunctionDef: ("an async function", ""),
    ast.Lambda: ("a lambda", _NO_CLOSURES),
    ast.FunctionDef: ("a nested function definition", _NO_CLOSURES),
    ast.ClassDef: ("a class definition inside the function", ""),
    ast.GeneratorExp: ("a generator expression", "write the loop out with for i in range(n)"),
    ast.ListComp: ("a list comprehension", "write the loop out with for i in range(n)"),
    ast.SetComp: ("a set comprehension", ""),
    ast.DictComp: ("a dict comprehension", ""),
    ast.Yield: ("yield (a generator function)", "a generator's values leave and come back "
                "one by one; differentiate a function that returns a value"),
    ast.YieldFrom: ("yield from (a generator function)", ""),
    ast.Global: ("a global statement", "the function must not assign outside itself; "
                 "return the value instead"),
    ast.Nonlocal: ("a nonlocal statement", "the function must not assign outside itself; "
                   "return the value instead"),
    ast.Import: ("an import inside the function", "import at module level"),
    ast.ImportFrom: ("an import inside the function", "import at module level"),
    ast.Delete: ("del", ""),
    ast.Break: ("break", "the reverse sweep must know how many iterations ran; use a "
                "for loop over a fixed range"),
    ast.Continue: ("continue", "use an if inside the loop body instead"),
    ast.Match: ("a match statement", "use if/else"),
    ast.NamedExpr: ("an assignment expression (:=)", "assign on its own line"),
    ast.Starred: ("a starred expression (*args)", "pass the arguments one by one"),
    ast.Dict: ("a dict display", ""),
    ast.Set: ("a set display", ""),
}
if hasattr(ast, "TryStar"):
    _REFUSED[ast.TryStar] = _REFUSED[ast.Try]


def _read(fn: Callable[..., Any]) -> _Source:
    """Parse ``fn`` (cached) and refuse unsupported constructs before anything runs."""
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"source_grad: expects a plain function defined with def, got "
                        f"{type(fn).__name__} {fn!r}")
    src = _SOURCES.get(fn)
    if src is None:
        src = _parse(fn)
        _check(src)
        _SOURCES[fn] = src
    return src


def _parse(fn: types.FunctionType) -> _Source:
    code = fn.__code__
    where = Where(fn.__qualname__, code.co_filename, code.co_firstlineno)
    if fn.__name__ == "<lambda>":
        raise _refusal("a lambda", where, "source transformation reads the function's "
                       "text, and a lambda's is not its own line; define it with def")
    if hasattr(fn, "__wrapped__"):
        raise _refusal("a decorated function", where, "the decorator's code is not in "
                       "the text; transform the undecorated function")
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise SourceTransformError(
            f"the source text of {fn.__qualname__} is not available", where,
            "source transformation reads the function's text: define it in a file (a "
            "module, a test file, a temporary module imported with importlib), not "
            "interactively or with exec", "unavailable source") from None
    tree = ast.parse(text)
    ast.increment_lineno(tree, code.co_firstlineno - 1)
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        raise _refusal(f"a {type(node).__name__}", where)
    return _Source(fn, node)


def _check(src: _Source) -> None:
    """Refuse what source transformation cannot do, naming construct, function and line."""
    args = src.node.args
    if args.vararg or args.kwarg or args.kwonlyargs:
        raise _refusal("*args, **kwargs or keyword-only parameters", src.where(src.node),
                       "give the function plain positional parameters")
    for node in ast.walk(ast.Module(body=src.node.body, type_ignores=[])):
        refused = _REFUSED.get(type(node))
        if refused is not None:
            raise _refusal(refused[0], src.where(node), refused[1])
        problem = _statement_problem(node)
        if problem is not None:
            raise _refusal(problem[0], src.where(node), problem[1])


def _statement_problem(node: ast.AST) -> tuple[str, str] | None:
    """Finer refusals: for/else, assignments into tensors, return inside a loop ..."""
    if isinstance(node, ast.For):
        if node.orelse:
            return "for ... else", "move the else block after the loop"
        if not isinstance(node.target, ast.Name):
            return "a for loop with several targets", "loop over range(n) with one index"
        if any(isinstance(n, ast.Return) for n in ast.walk(ast.Module(node.body, []))):
            return "return inside a for loop", "return after the loop"
    targets = (node.targets if isinstance(node, ast.Assign) else
               [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
    for target in targets:
        for t in ast.walk(target):
            if isinstance(t, ast.Subscript):
                return ("an assignment into part of a value (x[...] = ...)",
                        "values are not changed in place; build a new one with "
                        "mg.where or mg.concatenate")
            if isinstance(t, ast.Attribute):
                return "an assignment to an attribute", "return the value instead"
    if isinstance(node, ast.Call) and any(k.arg is None for k in node.keywords):
        return "**kwargs in a call", "pass the keyword arguments one by one"
    return None


def _loads(stmts: list[ast.stmt]) -> Counter:
    """How often each name is read in ``stmts``."""
    body = ast.Module(body=list(stmts), type_ignores=[])
    return Counter(n.id for n in ast.walk(body)
                   if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))


def _assigned(stmts: list[ast.stmt]) -> list[str]:
    """Names assigned in ``stmts`` (in order of first appearance)."""
    body = ast.Module(body=list(stmts), type_ignores=[])
    seen: dict[str, None] = {}
    for n in ast.walk(body):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            seen.setdefault(n.id)
    return list(seen)


# ========================================================================================
# 3. The values the transformation runs on
# ========================================================================================

class _Writing(threading.local):
    writer: "_Writer | None" = None


_writing = _Writing()


def _writer() -> "_Writer":
    w = _writing.writer
    if w is None:
        raise RuntimeError("a source variable was used outside source transformation")
    return w


class SrcVar(ArrayOps):
    """A variable of the program being written: its shape, dtype and device, no value.

    ``mg.sin(v)`` on a source variable appends the line ``t = mg.sin(v)`` to the program
    and returns the source variable ``t`` (see ``_Writer.op``). ``role`` says what it is:
    ``input``, ``temp`` (a forward line's result), ``loop``/``join`` (a variable assigned
    on several paths), ``const`` (a constant of the program), ``adjoint`` (an adjoint
    ``gx``) or ``rtemp`` (a temporary of the reverse sweep). ``hint`` is the user's name
    for it, or for an adjoint the variable whose adjoint it is.
    """

    __slots__ = ("shape", "dtype", "device", "active", "role", "hint", "name", "value")
    _priority = 20  # above tensors and graph nodes: operations on it are written down
    __array_ufunc__ = None  # NumPy defers to our operators (np.float64(2) * v)

    def __init__(self, shape: tuple[int, ...], dtype: str, device: Device,
                 active: bool = False, role: str = "temp", hint: Any = None,
                 value: Any = None):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device
        self.active = active  # does it depend on a differentiated input?
        self.role, self.hint, self.value = role, hint, value
        self.name: str | None = None

    def _bind(self, prim: Primitive, args: tuple, params: dict) -> "SrcVar":
        return _writer().op(prim, args, params)

    def __getitem__(self, index: Any) -> Any:
        parts = index if isinstance(index, tuple) else (index,)
        if any(_contains(p, SrcVar) for p in parts):
            raise _writer().refuse(
                "indexing with a tensor computed in the function",
                "an index must be known when the program is built: numbers, slices, "
                "the loop index, or constant integer arrays")
        if any(_contains(p, Index) for p in parts):
            return _writer().index_by_loop(self, parts)
        return SH.getitem(self, index)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def _needs_value(self, what: str) -> SourceTransformError:
        return _writer().refuse(
            f"{what} of a value computed in the function",
            "the program is written before any value exists; decide with an if on a "
            "tensor (compared with >, <, ...) or use mg.where, and keep numbers as tensors")

    def __bool__(self) -> bool: raise self._needs_value("the truth value")
    def __float__(self) -> float: raise self._needs_value("float()")
    def __int__(self) -> int: raise self._needs_value("int()")
    def __index__(self) -> int: raise self._needs_value("using as an integer")
    def __iter__(self) -> Iterator: raise self._needs_value("iterating over the rows")
    def __array__(self, *a: Any, **k: Any) -> Any: raise self._needs_value("np.asarray()")
    def item(self) -> Any: raise self._needs_value(".item()")
    def numpy(self) -> Any: raise self._needs_value(".numpy()")

    def detach(self) -> Any:
        return C.stop_gradient(self)

    def __repr__(self) -> str:
        return f"SrcVar({self.name or self.role}: {self.shape} {self.dtype})"


register_kind(SrcVar)

_ATOM, _POW, _UNARY, _MUL, _ADD, _CMP = 6, 5, 4, 3, 2, 1


class Index:
    """A Python int known only when the program runs: a loop index, or arithmetic on one.

    It prints as its text (``i + 1``); for shape rules it stands for the first and the
    last value it takes (``values``), which must give the same shapes.
    """

    __slots__ = ("text", "values", "prec")
    _priority = 20  # ``tensor * i`` is written down too

    def __init__(self, text: str, values: tuple, prec: int = _ATOM):
        self.text, self.values, self.prec = text, tuple(values), prec

    def _bind(self, prim: Primitive, args: tuple, params: dict) -> SrcVar:
        return _writer().op(prim, args, params)

    def _arith(self, other: Any, fn: Callable, sym: str, prec: int, right: bool) -> Any:
        if isinstance(other, Index):
            values, text = [fn(a, b) for a, b in zip(self.values, other.values)], other
        elif type(other) in (int, float):
            values, text = [fn(a, other) if not right else fn(other, a)
                            for a in self.values], other
        else:
            return NotImplemented
        first, second = (text, self) if right else (self, text)
        return Index(f"{_paren(first, prec)} {sym} {_paren(second, prec + 1)}", values, prec)

    def __add__(self, o: Any) -> Any: return self._arith(o, operator.add, "+", _ADD, False)
    def __radd__(self, o: Any) -> Any: return self._arith(o, operator.add, "+", _ADD, True)
    def __sub__(self, o: Any) -> Any: return self._arith(o, operator.sub, "-", _ADD, False)
    def __rsub__(self, o: Any) -> Any: return self._arith(o, operator.sub, "-", _ADD, True)
    def __mul__(self, o: Any) -> Any: return self._arith(o, operator.mul, "*", _MUL, False)
    def __rmul__(self, o: Any) -> Any: return self._arith(o, operator.mul, "*", _MUL, True)
    def __floordiv__(self, o: Any) -> Any:
        return self._arith(o, operator.floordiv, "//", _MUL, False)

    def __mod__(self, o: Any) -> Any: return self._arith(o, operator.mod, "%", _MUL, False)

    def __neg__(self) -> "Index":
        return Index(f"-{_paren(self, _UNARY)}", [-v for v in self.values], _UNARY)

    def _compare(self, other: Any, sym: str) -> Any:
        if not isinstance(other, (Index, int, float)):
            return NotImplemented  # i < x.sum(): the tensor's comparison writes a line
        return Cond(f"{_paren(self, _CMP + 1)} {sym} {_paren(other, _CMP + 1)}")

    def __lt__(self, o: Any) -> Any: return self._compare(o, "<")
    def __le__(self, o: Any) -> Any: return self._compare(o, "<=")
    def __gt__(self, o: Any) -> Any: return self._compare(o, ">")
    def __ge__(self, o: Any) -> Any: return self._compare(o, ">=")
    def __eq__(self, o: Any) -> Any: return self._compare(o, "==")  # type: ignore[override]
    def __ne__(self, o: Any) -> Any: return self._compare(o, "!=")  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    def _unknown(self, what: str) -> SourceTransformError:
        return _writer().refuse(
            f"{what} of the loop index {self.text}",
            "the loop index is only known when the program runs: it can index tensors, "
            "take part in arithmetic and in if conditions, not decide anything while the "
            "program is written")

    def __bool__(self) -> bool: raise self._unknown("the truth value")
    def __index__(self) -> int: raise self._unknown("using as a Python int (range, list index)")
    def __int__(self) -> int: raise self._unknown("int()")
    def __float__(self) -> float: raise self._unknown("float()")

    def __repr__(self) -> str:
        return f"Index({self.text})"


register_kind(Index)


class Cond:
    """A condition known only when the program runs, from the loop index: ``i == 0``."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __bool__(self) -> bool:
        raise _writer().refuse(f"the truth value of {self.text} outside an if",
                               "use it directly as the condition of an if")


def _paren(v: Any, prec: int) -> str:
    if isinstance(v, Index):
        return v.text if v.prec >= prec else f"({v.text})"
    return repr(v) if not (isinstance(v, (int, float)) and v < 0) else f"({v!r})"


def _contains(v: Any, kind: type) -> bool:
    if isinstance(v, kind):
        return True
    if isinstance(v, (tuple, list)):
        return any(_contains(x, kind) for x in v)
    if isinstance(v, slice):
        return any(_contains(x, kind) for x in (v.start, v.stop, v.step))
    return False


def _dynamic(v: Any) -> bool:
    """Whether ``v`` is (or holds) something only known when the program runs."""
    return _contains(v, SrcVar) or _contains(v, Index) or isinstance(v, Cond)


def _concrete(v: Any, k: int = 0) -> Any:
    """``v`` with loop indices replaced by their k-th representative value (for shapes)."""
    if isinstance(v, Index):
        return v.values[k]
    if isinstance(v, tuple):
        return tuple(_concrete(x, k) for x in v)
    if isinstance(v, slice):
        return slice(_concrete(v.start, k), _concrete(v.stop, k), _concrete(v.step, k))
    return v


# ========================================================================================
# 4. The program: lines, loops and branches
# ========================================================================================

class Op:
    """``prim(*args, **params)``: one primitive, the three-address form's right side."""
    __slots__ = ("prim", "args", "params")

    def __init__(self, prim: Primitive, args: tuple, params: dict):
        self.prim, self.args, self.params = prim, args, params


class Ref:
    """``a, b = x, y``: copies of references (aliases, loop and branch joins, push)."""
    __slots__ = ("values",)

    def __init__(self, values: tuple):
        self.values = tuple(values)


class Fill:
    """A new tensor of one value: the seed ``gz = 1``, a zero adjoint, a number made a tensor."""
    __slots__ = ("value", "shape", "dtype", "device")

    def __init__(self, value: float, like: SrcVar):
        self.value, self.shape, self.dtype, self.device = value, like.shape, like.dtype, like.device


class Line:
    """``targets = expr``; ``kind`` marks the special lines: carry, join, push, pop."""
    __slots__ = ("targets", "expr", "kind")

    def __init__(self, targets: tuple, expr: Any, kind: str = ""):
        self.targets, self.expr, self.kind = tuple(targets), expr, kind


class For:
    """``for index in range(...)`` (or ``reversed(range(...))`` in the reverse sweep).

    ``carry`` pairs each loop variable with the value it has at the end of the body.
    """
    __slots__ = ("index", "range", "body", "reverse", "carry", "dropped")

    def __init__(self, index: Index, rng: range, body: list, reverse: bool = False,
                 carry: tuple = ()):
        self.index, self.range, self.body, self.reverse = index, rng, body, reverse
        self.carry = tuple(carry)
        self.dropped = False


class If:
    """``if cond: then else: orelse``; ``joins`` are the variables both branches assign."""
    __slots__ = ("cond", "then", "orelse", "joins", "dropped")

    def __init__(self, cond: Any, then: list, orelse: list, joins: tuple = ()):
        self.cond, self.then, self.orelse, self.joins = cond, then, orelse, tuple(joins)
        self.dropped = False


def _vars(v: Any) -> Iterator[SrcVar]:
    if type(v) is SrcVar:
        yield v
    elif isinstance(v, (tuple, list)):
        for x in v:
            yield from _vars(x)


def _uses(stmt: Any) -> list[SrcVar]:
    """The variables a line reads (a loop's or branch's own condition for If)."""
    if isinstance(stmt, If):
        return list(_vars(stmt.cond))
    e = stmt.expr
    if isinstance(e, Op):
        return list(_vars(e.args))
    if isinstance(e, Ref):
        return list(_vars(e.values))
    return []


def _walk(block: list) -> Iterator[Any]:
    """Every statement of a block and of its nested blocks (an explicit stack)."""
    stack = list(reversed(block))
    while stack:
        stmt = stack.pop()
        yield stmt
        if isinstance(stmt, For):
            stack.extend(reversed(stmt.body))
        elif isinstance(stmt, If):
            stack.extend(reversed(stmt.orelse))
            stack.extend(reversed(stmt.then))


def _defined(block: list) -> set[int]:
    """Ids of the variables assigned anywhere in ``block``."""
    return {id(t) for s in _walk(block) if isinstance(s, Line) for t in s.targets}


# ========================================================================================
# 5. The writer: where SrcVar._bind appends its lines
# ========================================================================================

class _Writer:
    """The program being written: the current block, and the user's line we are at."""

    def __init__(self) -> None:
        self.block: list = []
        self.role = "temp"  # role of new variables: "temp" (forward) or "rtemp" (reverse)
        self.where: Where | None = None
        self.hints: dict[int, tuple[Any, str]] = {}  # id(constant) -> (constant, name)
        self.reserved: set[str] = set()  # every name of the functions read

    @contextlib.contextmanager
    def into(self, block: list) -> Iterator[list]:
        saved, self.block = self.block, block
        try:
            yield block
        finally:
            self.block = saved

    def refuse(self, construct: str, why: str = "") -> SourceTransformError:
        where = self.where or Where("?", "?", 0)
        return _refusal(construct, where, why)

    def emit(self, targets: tuple, expr: Any, kind: str = "") -> None:
        self.block.append(Line(targets, expr, kind))

    def new(self, like: Any, role: str, hint: Any = None, active: bool = False) -> SrcVar:
        return SrcVar(like.shape, like.dtype, like.device, active, role, hint)

    def op(self, prim: Primitive, args: tuple, params: dict) -> SrcVar:
        """Append ``t = prim(*args, **params)``; ``t``'s shape and dtype come from the
        primitive's shape rule, so errors are found while the program is written."""
        try:
            shape, dtype = prim.shape(*(_concrete(a) for a in args),
                                      **{k: _concrete(v) for k, v in params.items()})
        except MinigraphError as exc:
            raise _located(exc, self.where) from None
        shape = tuple(shape)
        device = self.device_of(prim, args, params)
        same = _identity(prim, args, shape, dtype)
        if same is not None:
            return same
        active = prim.differentiable and any(type(a) is SrcVar and a.active for a in args)
        out = SrcVar(shape, dtype, device, active, self.role)
        self.emit((out,), Op(prim, tuple(args), dict(params)))
        return out

    def device_of(self, prim: Primitive, args: tuple, params: dict) -> Device:
        devices = {a.device.name: a.device for a in args if isinstance(a, (SrcVar, Tensor))}
        if len(devices) > 1:
            raise _located(DeviceError(
                f"{prim.name}: arguments live on different devices "
                f"({' and '.join(sorted(devices))}); minigraph never copies silently"),
                self.where)
        if prim is C.TO_DEVICE:
            return params["device"]
        return next(iter(devices.values())) if devices else get_device(None)

    def index_by_loop(self, x: SrcVar, parts: tuple) -> SrcVar:
        """``x[i]`` with a loop index: the shape must not depend on the index's value."""
        shapes = {SH.GETITEM.shape(x, index=_concrete(parts, k))[0] for k in (0, 1)}
        if len(shapes) > 1:
            raise self.refuse("an index whose shape changes with the loop index",
                              f"this one gives shapes {sorted(shapes)}; the program is "
                              "written once for every iteration")
        return bind(SH.GETITEM, x, index=parts)


def _identity(prim: Primitive, args: tuple, shape: tuple, dtype: str) -> SrcVar | None:
    """``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``, ``x ** 1`` are ``x`` (same shape, dtype)."""
    if len(args) != 2:
        return None
    x, y = args

    def keep(v: Any) -> SrcVar | None:
        return v if type(v) is SrcVar and v.shape == shape and v.dtype == dtype else None

    def number(v: Any, k: int) -> bool:
        return type(v) in (int, float) and v == k

    name = prim.name
    if name in ("add", "sub", "mul", "div", "pow"):
        unit = 0 if name in ("add", "sub") else 1
        if number(y, unit):
            return keep(x)
        if name in ("add", "mul") and number(x, unit):
            return keep(y)
    return None


# ========================================================================================
# 6. Normalising: running the function's statements on source variables (a.1)-(a.5)
# ========================================================================================

class _Return:
    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class _OneBranch:
    """A name an if on a run-time value assigns in one branch only: reading it fails."""
    __slots__ = ("name", "where")

    def __init__(self, name: str, where: Where):
        self.name, self.where = name, where


_MISSING = object()

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Pow: operator.pow, ast.MatMult: operator.matmul,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
            ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne,
            ast.Is: operator.is_, ast.IsNot: operator.is_not,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
# Builtins that may see values of the program: they only read shapes or add.
_SAFE_BUILTINS = (len, sum, isinstance, tuple, list)
# minigraph functions that must not receive values of the program.
_FORBIDDEN = {"tensor", "zeros", "ones", "full", "as_tensor"}


class _Normaliser:
    """Runs a function's statements on source variables, writing three-address lines.

    Python decides what is known when the program is written (shapes, Python numbers,
    a static ``if``) and runs it now; what depends on the inputs' values becomes lines.
    """

    def __init__(self, writer: _Writer):
        self.w = writer
        self.stack: list[_Source] = []  # the functions being run (inlined calls nest)
        self.dynamic = 0  # depth inside branches decided at run time

    @property
    def src(self) -> _Source:
        return self.stack[-1]

    # -- functions ------------------------------------------------------------------------
    def call(self, src: _Source, args: tuple, kwargs: dict) -> Any:
        """Run ``src``'s body with its parameters bound to ``args`` (inlining a call)."""
        if any(s is src for s in self.stack):
            raise self.w.refuse(f"a recursive call of {src.fn.__name__}",
                                "the program is written by inlining calls")
        try:
            bound = inspect.signature(src.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{exc} [source_grad: {self.w.where}]") from None
        bound.apply_defaults()
        self.w.reserved |= src.names
        saved = self.w.where
        self.stack.append(src)
        try:
            result = self.block(src.node.body, dict(bound.arguments))
        finally:
            self.stack.pop()
            self.w.where = saved
        return None if result is None else result.value

    # -- statements -------------------------------------------------------------------------
    def block(self, stmts: list[ast.stmt], env: dict) -> _Return | None:
        for k, stmt in enumerate(stmts):
            self.w.where = self.src.where(stmt)
            rest = _absorb(stmt, stmts[k + 1:])
            if rest is not None:  # if c: return a / rest  ==  if c: return a else: rest
                return self.s_If(rest, env)
            result = getattr(self, "s_" + type(stmt).__name__, self.s_unknown)(stmt, env)
            if result is not None:
                return result
        return None

    def sub_block(self, stmts: list[ast.stmt], env: dict) -> tuple[list, _Return | None]:
        with self.w.into([]) as block:
            result = self.block(stmts, env)
        return block, result

    def s_unknown(self, node: ast.stmt, env: dict) -> None:
        raise self.w.refuse(f"a {type(node).__name__} statement")

    def s_Pass(self, node: ast.Pass, env: dict) -> None:
        return None

    def s_Expr(self, node: ast.Expr, env: dict) -> None:
        if not isinstance(node.value, ast.Constant):  # a docstring is skipped
            self.expr(node.value, env)

    def s_Assign(self, node: ast.Assign, env: dict) -> None:
        value = self.expr(node.value, env)
        for target in node.targets:
            self.assign(target, value, env)

    def s_AnnAssign(self, node: ast.AnnAssign, env: dict) -> None:
        if node.value is not None:
            self.assign(node.target, self.expr(node.value, env), env)

    def s_AugAssign(self, node: ast.AugAssign, env: dict) -> None:
        current = self.load(node.target.id, env)
        self.assign(node.target, self.binop(node.op, current, self.expr(node.value, env)), env)

    def s_Return(self, node: ast.Return, env: dict) -> _Return:
        return _Return(None if node.value is None else self.expr(node.value, env))

    def s_Assert(self, node: ast.Assert, env: dict) -> None:
        test = self.expr(node.test, env)
        if _dynamic(test):
            raise self.w.refuse("an assert on a value computed in the function")
        if not test:
            raise AssertionError(self.expr(node.msg, env) if node.msg else "")

    def s_Raise(self, node: ast.Raise, env: dict) -> None:
        if self.dynamic:
            raise self.w.refuse("raise inside an if decided at run time",
                                "check inputs with an if on shapes or Python values")
        raise self.expr(node.exc, env) if node.exc else RuntimeError("raise")

    def assign(self, target: ast.expr, value: Any, env: dict) -> None:
        if isinstance(target, ast.Name):
            if type(value) is SrcVar and value.role == "temp" and value.hint is None:
                value.hint = target.id  # the user's name for a forward result
            env[target.id] = value
            return
        if isinstance(target, (ast.Tuple, ast.List)):
            if _contains(value, SrcVar) and not isinstance(value, (tuple, list)):
                raise self.w.refuse("unpacking a tensor into several names",
                                    "index it (x[0], x[1]) instead")
            values = list(value)
            if len(values) != len(target.elts):
                raise ValueError(f"cannot unpack {len(values)} values into "
                                 f"{len(target.elts)} names [source_grad: {self.w.where}]")
            for t, v in zip(target.elts, values):
                self.assign(t, v, env)
            return
        raise self.w.refuse(f"assignment to a {type(target).__name__}")

    # -- if -----------------------------------------------------------------------------------
    def s_If(self, node: ast.If, env: dict) -> _Return | None:
        test, negate = node.test, False
        while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, negate = test.operand, not negate
        cond = self.expr(test, env)
        if isinstance(cond, (SrcVar, Cond)):
            then, orelse = (node.orelse, node.body) if negate else (node.body, node.orelse)
            return self.dynamic_if(cond, then, orelse, env)
        if _dynamic(cond):
            raise self.w.refuse("an if on this run-time value")
        return self.block(node.body if bool(cond) != negate else node.orelse, env)

    def dynamic_if(self, cond: Any, then: list, orelse: list, env: dict) -> _Return | None:
        """Both branches are written; which one runs is decided by ``cond`` at run time."""
        if type(cond) is SrcVar and math.prod(cond.shape) != 1:
            raise self.w.refuse(f"an if on a value of shape {cond.shape}",
                                "an if needs one value; use mg.where to choose elementwise")
        where = self.w.where
        envs = [dict(env), dict(env)]
        self.dynamic += 1
        try:
            (b1, r1), (b2, r2) = (self.sub_block(then, envs[0]), self.sub_block(orelse, envs[1]))
        finally:
            self.dynamic -= 1
        self.w.where = where
        if (r1 is None) != (r2 is None):
            raise self.w.refuse("return in only one branch of an if decided at run time",
                                "return in both branches, or assign and return after the if")
        names = _assigned(then + orelse)
        if r1 is not None:
            envs[0]["<return>"], envs[1]["<return>"] = r1.value, r2.value
            names.append("<return>")
        joins = [self.join(n, envs, (b1, b2), env, where) for n in names]
        self.w.block.append(If(cond, b1, b2, tuple(j for j in joins if j is not None)))
        return _Return(env["<return>"]) if r1 is not None else None

    def join(self, name: str, envs: list, blocks: tuple, env: dict,
             where: Where) -> SrcVar | None:
        """The value of ``name`` after the if: a join variable assigned in both branches."""
        a, b = envs[0].get(name, _MISSING), envs[1].get(name, _MISSING)
        if a is b:
            if a is not _MISSING:
                env[name] = a
            return None
        if a is _MISSING or b is _MISSING:
            env[name] = _OneBranch(name, where)
            return None
        if not _dynamic(a) and not _dynamic(b) and type(a) is type(b) and \
                not isinstance(a, (Tensor, np.ndarray)) and a == b:
            env[name] = a
            return None
        like = a if type(a) is SrcVar else b
        if type(like) is not SrcVar:
            raise self.w.refuse(f"{name} holding different Python values in the two branches "
                                "of an if decided at run time",
                                "make it a tensor in both branches")
        va, vb = (self.as_var(v, like, name, blk) for v, blk in zip((a, b), blocks))
        if (va.shape, va.dtype, va.device.name) != (vb.shape, vb.dtype, vb.device.name):
            raise self.w.refuse(
                f"{name} with shape {va.shape} {va.dtype} after one branch and {vb.shape} "
                f"{vb.dtype} after the other", "the program is written for one shape")
        j = SrcVar(va.shape, va.dtype, va.device, va.active or vb.active, "join", name)
        for v, blk in zip((va, vb), blocks):
            blk.append(Line((j,), Ref((v,)), "join"))
        env[name] = j
        return j

    def as_var(self, v: Any, like: SrcVar, name: str, block: list) -> SrcVar:
        """A value as a variable of ``like``'s kind: constants are lifted, numbers filled."""
        if type(v) is SrcVar:
            return v
        if isinstance(v, Tensor):
            return self.const(v)
        if type(v) in (int, float, bool) and like.shape == ():
            filled = SrcVar((), like.dtype, like.device, False, "const", name)
            block.append(Line((filled,), Fill(v, filled)))
            return filled
        raise self.w.refuse(f"{name} being {v!r} on one path and a tensor of shape "
                            f"{like.shape} on another", "make it a tensor on every path "
                            "(for example mg.zeros(shape, dtype, device))")

    def const(self, t: Tensor) -> SrcVar:
        """A constant tensor as a variable of the program (named in its namespace)."""
        return SrcVar(t.shape, t.dtype, t.device, False, "const", None, t)

    # -- for ------------------------------------------------------------------------------------
    def s_For(self, node: ast.For, env: dict) -> None:
        """``for i in range(n)``: the body is written once; loop variables carry values."""
        rng = self.expr(node.iter, env)
        if not isinstance(rng, range):
            raise self.w.refuse(f"a for loop over a {type(rng).__name__}",
                                "loop with for i in range(n), n known when the program is built")
        name = node.target.id
        if isinstance(env.get(name), Index):
            raise self.w.refuse(f"a nested loop reusing the index name {name}")
        if len(rng) == 0:
            return None
        where = self.w.where
        index = Index(name, (rng[0], rng[-1]))
        loads_in = _loads(node.body)
        carried = [n for n in _assigned(node.body)
                   if n != name and (n in env or self.src.loads[n] > loads_in[n])]
        specs: dict[str, tuple | None] = {n: _spec(env.get(n, _MISSING)) for n in carried}
        for _ in range(4):  # until the loop variables' shapes and activity settle
            lvs = {n: SrcVar(s[0], s[1], s[2], s[3], "loop", n)
                   for n, s in specs.items() if s is not None}
            body_env = {**env, name: index, **lvs}
            self.w.where = where
            body, _ = self.sub_block(node.body, body_env)
            ends = {n: body_env.get(n, _MISSING) for n in carried}
            self.w.where = where
            settled = {n: self.settle(n, env.get(n, _MISSING), ends[n], specs[n])
                       for n in carried}
            if settled == specs:
                break
            specs = settled
        else:  # pragma: no cover - shapes and activity can only grow a few times
            raise MinigraphError("source_grad: internal error: loop variables do not settle")
        self.w.where = where
        self.emit_loop(index, rng, body, lvs, ends, env)
        for n in carried:
            if n in lvs:
                env[n] = lvs[n]
            elif not _dynamic(ends[n]) and ends[n] is not _MISSING:
                env[n] = ends[n]
        for n in _assigned(node.body):
            if n not in carried and n != name:
                env.pop(n, None)
        env[name] = rng[-1]  # after the loop the index is its last value, a known int
        return None

    def settle(self, name: str, init: Any, end: Any, spec: tuple | None) -> tuple | None:
        """The loop variable ``name`` needs: (shape, dtype, device, active), or None."""
        if end is _MISSING:
            return spec
        if type(end) is not SrcVar:
            if spec is None and (init is end or (_number(init) and _number(end) and init == end)):
                return None  # the same Python value on every iteration: nothing to carry
            if spec is None and not (init is _MISSING and not _dynamic(end)):
                raise self.w.refuse(f"{name} changing from one iteration to the next as a "
                                    "Python value", "make it a tensor")
            return spec
        aval = (end.shape, end.dtype, end.device.name)
        if spec is None:
            if _number(init) and end.shape != ():
                raise self.w.refuse(
                    f"{name} starting as the number {init!r} and becoming a tensor of "
                    f"shape {end.shape} in the loop",
                    f"start it with the right shape, e.g. mg.zeros({end.shape}, ...)")
            return (end.shape, end.dtype, end.device, end.active)
        if (spec[0], spec[1], spec[2].name) != aval:
            raise self.w.refuse(
                f"{name} changing shape or dtype in the loop, from {spec[0]} {spec[1]} to "
                f"{end.shape} {end.dtype}", "a loop variable keeps one shape and dtype")
        return (spec[0], spec[1], spec[2], spec[3] or end.active)

    def emit_loop(self, index: Index, rng: range, body: list, lvs: dict, ends: dict,
                  env: dict) -> None:
        """Initial values before the loop, the carry at the end of its body, the loop."""
        for n, lv in lvs.items():
            init = env.get(n, _MISSING)
            if _number(init):
                self.w.emit((lv,), Fill(init, lv))
            elif init is not _MISSING:
                self.w.emit((lv,), Ref((self.as_var(init, lv, n, self.w.block),)))
        pairs = []
        for n, lv in lvs.items():
            end = ends[n]
            if end is not lv and end is not _MISSING:
                pairs.append((lv, self.as_var(end, lv, n, body)))
        if pairs:
            body.append(Line(tuple(p[0] for p in pairs), Ref(tuple(p[1] for p in pairs)),
                             "carry"))
        self.w.block.append(For(index, rng, body, carry=tuple(pairs)))

    # -- expressions --------------------------------------------------------------------------
    def expr(self, node: ast.expr, env: dict) -> Any:
        method = getattr(self, "e_" + type(node).__name__, None)
        if method is None:
            raise self.w.refuse(f"a {type(node).__name__} expression")
        return method(node, env)

    def e_Constant(self, node: ast.Constant, env: dict) -> Any:
        return node.value

    def e_Name(self, node: ast.Name, env: dict) -> Any:
        return self.load(node.id, env)

    def load(self, name: str, env: dict) -> Any:
        """A local, then a closure cell, a global, a builtin: Python's own order."""
        if name in env:
            v = env[name]
            if isinstance(v, _OneBranch):
                raise self.w.refuse(
                    f"reading {name}, which the if at line {v.where.lineno} assigns in one "
                    "branch only", "assign it in both branches (or before the if)")
            return v
        src = self.src
        if name in src.closure:
            try:
                return self.outside(name, src.closure[name].cell_contents, "closes over")
            except ValueError:
                raise NameError(f"free variable {name!r} has no value yet "
                                f"[source_grad: {self.w.where}]") from None
        if name in src.fn.__globals__:
            return self.outside(name, src.fn.__globals__[name], "reads the global")
        if hasattr(builtins, name):
            return getattr(builtins, name)
        raise NameError(f"name {name!r} is not defined [source_grad: {self.w.where}]")

    def outside(self, name: str, v: Any, how: str) -> Any:
        if type(v) in KINDS or (isinstance(v, Tensor) and v.requires_grad):
            raise self.w.refuse(
                f"a function that {how} {name}, a value being differentiated (by an "
                "enclosing mg.grad, jvp or trace, or requires_grad=True)",
                f"pass {name} as an argument so the derivative can flow through it")
        if isinstance(v, (Tensor, np.ndarray)):
            self.w.hints.setdefault(id(v), (v, name))
        return v

    def e_Attribute(self, node: ast.Attribute, env: dict) -> Any:
        base = self.expr(node.value, env)
        try:
            return getattr(base, node.attr)
        except AttributeError:
            if isinstance(base, SrcVar):
                raise self.w.refuse(f"the attribute .{node.attr} of a value of the program",
                                    "use minigraph functions and tensor methods") from None
            raise

    def e_Subscript(self, node: ast.Subscript, env: dict) -> Any:
        base, index = self.expr(node.value, env), self.expr(node.slice, env)
        if isinstance(base, Tensor) and _dynamic(index):
            base = self.const(base)
        elif not isinstance(base, (SrcVar, Tensor)) and _dynamic(index):
            raise self.w.refuse("indexing a Python sequence with the loop index",
                                "keep per-iteration values in one tensor and index that")
        return self.guard(lambda: base[index])

    def e_Slice(self, node: ast.Slice, env: dict) -> slice:
        part = (lambda n: None if n is None else self.expr(n, env))
        return slice(part(node.lower), part(node.upper), part(node.step))

    def e_Tuple(self, node: ast.Tuple, env: dict) -> tuple:
        return tuple(self.expr(e, env) for e in node.elts)

    def e_List(self, node: ast.List, env: dict) -> list:
        return [self.expr(e, env) for e in node.elts]

    def e_BinOp(self, node: ast.BinOp, env: dict) -> Any:
        return self.binop(node.op, self.expr(node.left, env), self.expr(node.right, env))

    def binop(self, op: ast.operator, left: Any, right: Any) -> Any:
        fn = _BINOPS[type(op)]
        if _dynamic(left) or _dynamic(right):
            try:
                return self.guard(lambda: fn(left, right))
            except TypeError:
                raise self.w.refuse(f"the operator {type(op).__name__} on values of the "
                                    "program", "minigraph has no primitive for it") from None
        return self.guard(lambda: fn(left, right))

    def e_UnaryOp(self, node: ast.UnaryOp, env: dict) -> Any:
        v = self.expr(node.operand, env)
        if isinstance(node.op, ast.USub):
            return self.guard(lambda: -v)
        if isinstance(node.op, ast.UAdd):
            return v
        if _dynamic(v):
            raise self.w.refuse(f"{type(node.op).__name__.lower()} on a value of the program",
                                "use an if with the branches swapped, or mg.where")
        return (operator.not_ if isinstance(node.op, ast.Not) else operator.invert)(v)

    def e_Compare(self, node: ast.Compare, env: dict) -> Any:
        values = [self.expr(node.left, env)] + [self.expr(c, env) for c in node.comparators]
        dynamic = any(_dynamic(v) for v in values)
        if dynamic and (len(node.ops) > 1 or type(node.ops[0]) not in
                        (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)):
            raise self.w.refuse("a chained or identity comparison of values of the program",
                                "compare two values with <, <=, >, >=, == or !=")
        result: Any = True
        for op, a, b in zip(node.ops, values, values[1:]):
            result = self.guard(lambda: _COMPARE[type(op)](a, b))
            if not dynamic and not result:
                return result
        return result

    def e_BoolOp(self, node: ast.BoolOp, env: dict) -> Any:
        value: Any = None
        for e in node.values:
            value = self.expr(e, env)
            if _dynamic(value):
                raise self.w.refuse("and/or on a value of the program",
                                    "use nested ifs, or combine tensors with mg.where")
            if bool(value) == isinstance(node.op, ast.Or):
                return value
        return value

    def e_IfExp(self, node: ast.IfExp, env: dict) -> Any:
        test = self.expr(node.test, env)
        if _dynamic(test):
            raise self.w.refuse("a conditional expression (a if c else b) on a value of "
                                "the program", "use an if statement or mg.where")
        return self.expr(node.body if test else node.orelse, env)

    def e_JoinedStr(self, node: ast.JoinedStr, env: dict) -> str:
        parts = []
        for v in node.values:
            if isinstance(v, ast.FormattedValue):
                x = self.expr(v.value, env)
                if _dynamic(x):
                    raise self.w.refuse("formatting a value of the program into a string")
                x = {-1: x, 115: str(x), 114: repr(x), 97: ascii(x)}[v.conversion]
                spec = self.expr(v.format_spec, env) if v.format_spec else ""
                parts.append(format(x, spec))
            else:
                parts.append(v.value)
        return "".join(parts)

    def e_Call(self, node: ast.Call, env: dict) -> Any:
        fn = self.expr(node.func, env)
        args = tuple(self.expr(a, env) for a in node.args)
        kwargs = {k.arg: self.expr(k.value, env) for k in node.keywords}
        if _dynamic(args) or _dynamic(tuple(kwargs.values())):
            inlined = _user_function(fn)
            if inlined is not None:
                self_arg = (fn.__self__,) if isinstance(fn, types.MethodType) else ()
                return self.call(_read(inlined), self_arg + args, kwargs)
            self.check_callee(fn)
        result = self.guard(lambda: fn(*args, **kwargs))
        if isinstance(result, Tensor) and len(node.args) == 1 and \
                isinstance(node.args[0], ast.Name):  # mg.tensor(X) is named X
            self.w.hints.setdefault(id(result), (result, node.args[0].id))
        return result

    def check_callee(self, fn: Any) -> None:
        """Only minigraph functions (and a few builtins) may see values of the program."""
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
        module = getattr(fn, "__module__", None) or ""
        if any(fn is safe for safe in _SAFE_BUILTINS):
            return
        if not module.startswith("minigraph"):
            raise self.w.refuse(
                f"calling {name} on a value of the program",
                "only minigraph functions (mg.sin, mg.sum, ...), tensor methods and plain "
                "Python functions defined with def can take values being differentiated")
        if module.startswith(("minigraph.autodiff", "minigraph.graph", "minigraph.runtime")) \
                or getattr(fn, "__name__", "") in _FORBIDDEN:
            raise self.w.refuse(
                f"mg.{getattr(fn, '__name__', name)} on a value of the program",
                "nested differentiation, tracing, and making new tensors from values of "
                "the program are not supported inside a transformed function")

    def guard(self, thunk: Callable[[], Any]) -> Any:
        """Run Python now (no tape recording); point minigraph errors at the user's line."""
        try:
            with tape.no_grad():
                return thunk()
        except SourceTransformError:
            raise
        except MinigraphError as exc:
            raise _located(exc, self.w.where) from None
        except Exception as exc:
            if self.w.where is not None and hasattr(exc, "add_note"):
                exc.add_note(f"while source_grad was writing the program: {self.w.where}")
            raise


def _absorb(stmt: ast.stmt, rest: list[ast.stmt]) -> ast.If | None:
    """An if one of whose branches ends in return, with the statements after it moved
    into its other branch (the same program: they run exactly when that branch does)."""
    if not isinstance(stmt, ast.If) or not rest:
        return None
    returns = [bool(b) and isinstance(b[-1], ast.Return) for b in (stmt.body, stmt.orelse)]
    if returns == [True, False]:
        return ast.copy_location(ast.If(stmt.test, stmt.body, stmt.orelse + rest), stmt)
    if returns == [False, True]:
        return ast.copy_location(ast.If(stmt.test, stmt.body + rest, stmt.orelse), stmt)
    return None


def _spec(v: Any) -> tuple | None:
    """The (shape, dtype, device, active) a loop variable starting at ``v`` needs."""
    if type(v) is SrcVar:
        return (v.shape, v.dtype, v.device, v.active)
    if isinstance(v, Tensor):
        return (v.shape, v.dtype, v.device, False)
    return None


def _number(v: Any) -> bool:
    return type(v) in (int, float, bool)


def _user_function(fn: Any) -> types.FunctionType | None:
    """A plain Python function (or method) the transformation reads and inlines."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        return None
    module = (fn.__module__ or "").split(".")[0]
    return None if module in ("minigraph", "numpy", "builtins") else fn


# ========================================================================================
# 7. The adjoint: the VJP rules run on source variables, backwards (g.1)-(g.5)
# ========================================================================================

class _LoopCtx:
    """A loop being reversed: the variables defined inside it, and the accumulators
    (``gw = gw + ...``) of variables defined outside it that receive adjoints inside."""
    __slots__ = ("defined", "accs")

    def __init__(self, defined: set[int]):
        self.defined = defined
        self.accs: dict[int, tuple[SrcVar, SrcVar]] = {}


class _Reverse:
    """Writes the reverse sweep: adjoints flow from each line to the variables it read.

    ``shares[id(v)]`` lists v's adjoint contributions ``(position, share)`` not yet added.
    A variable's adjoint is complete when the sweep reaches its definition (every reader
    comes after it), and is then written as the sum of its shares, in the readers'
    evaluation order, as the textbook writes (f.5): ``gx = ga * y + gb * cos(x)``.
    """

    def __init__(self, writer: _Writer, forward: list):
        self.w = writer
        self.position = {id(s): k for k, s in enumerate(_walk(forward))}
        self.loops: list[_LoopCtx] = []
        self.vars: dict[int, SrcVar] = {}  # id -> variable, for every share recorded
        # (forward, reverse) loops and branches inside loops, inner first: the regions
        # whose values the stack saves (see _insert_stack)
        self.pairs: list[tuple[Any, Any]] = []

    def run(self, forward: list, out: SrcVar, inputs: list[SrcVar]) -> list[SrcVar]:
        shares: dict[int, list] = {}
        if out.active:
            seed = self.w.new(out, "adjoint", out)  # (g.1): gz = 1
            self.w.emit((seed,), Fill(1, seed))
            shares[id(out)] = [(math.inf, seed)]
        self.block(forward, shares)
        grads = [self.complete(x, shares) for x in reversed(inputs)][::-1]
        return [g if g is not None else self.zeros(x) for g, x in zip(grads, inputs)]

    def zeros(self, like: SrcVar) -> SrcVar:
        z = self.w.new(like, "adjoint", like)
        self.w.emit((z,), Fill(0, z))
        return z

    # -- straight-line code ---------------------------------------------------------------
    def block(self, stmts: list, shares: dict) -> None:
        for stmt in reversed(stmts):
            if isinstance(stmt, For):
                self.loop(stmt, shares)
            elif isinstance(stmt, If):
                self.branch(stmt, shares)
            elif stmt.kind != "carry" and isinstance(stmt.expr, Op):
                self.op_line(stmt, shares)
            elif stmt.kind != "carry" and isinstance(stmt.expr, Ref):
                self.ref_line(stmt, shares)

    def op_line(self, line: Line, shares: dict) -> None:
        """``out = prim(*args)``: each read argument gets ``prim.vjp[i](gout, out, *args)``."""
        out = line.targets[0]
        g = self.complete(out, shares) if out.active else None
        if g is None:
            return
        prim, args, params = line.expr.prim, line.expr.args, line.expr.params
        for i, a in enumerate(args):
            rule = prim.vjp[i] if type(a) is SrcVar and a.active else None
            if rule is not None:
                self.add(a, rule(g, out, *args, **params), self.position[id(line)], shares)

    def ref_line(self, line: Line, shares: dict) -> None:
        """``a, b = x, y``: the adjoint of a copy is the adjoint of the original."""
        gs = [self.complete(t, shares) if t.active else None for t in line.targets]
        for v, g in zip(line.expr.values, gs):
            if g is not None and type(v) is SrcVar and v.active:
                self.add(v, g, self.position[id(line)], shares)

    def total(self, entries: list) -> SrcVar | None:
        """The sum of shares in evaluation order of their readers (a new variable)."""
        terms = [s for _, s in sorted(entries, key=lambda e: e[0])]
        if not terms:
            return None
        result = terms[0]
        for t in terms[1:]:
            result = result + t
        return result

    def complete(self, v: SrcVar, shares: dict) -> SrcVar | None:
        """v's whole adjoint ``gv``, once all of v's readers have been reversed."""
        total = self.total(shares.pop(id(v), []))
        if total is None:
            return None
        if total.role == "rtemp" and total.hint is None:
            total.role, total.hint = "adjoint", v  # the sum itself becomes gv
            return total
        if total.role == "adjoint" and total.hint is v:
            return total
        alias = self.w.new(v, "adjoint", v)  # gb = gz: (g.2), (g.3)
        self.w.emit((alias,), Ref((total,)))
        return alias

    def add(self, v: SrcVar, share: Any, position: float, shares: dict) -> None:
        """Record a share of v's adjoint; inside a loop, outer variables accumulate."""
        if type(share) is not SrcVar:
            raise MinigraphError(f"source_grad: internal error: a VJP rule gave "
                                 f"{type(share).__name__} for {v!r}")
        acc = self.accumulator(v)
        if acc is not None:
            self.w.emit((acc,), Ref((acc + share,)))  # gw = gw + ...
            return
        self.vars[id(v)] = v
        shares.setdefault(id(v), []).append((position, share))

    def accumulator(self, v: SrcVar) -> SrcVar | None:
        """The accumulator ``gv`` if v is defined outside a loop being reversed."""
        for ctx in self.loops:  # the outermost loop v is defined outside of
            if id(v) not in ctx.defined:
                if id(v) not in ctx.accs:
                    ctx.accs[id(v)] = (v, self.w.new(v, "adjoint", v))
                return ctx.accs[id(v)][1]
        return None

    def carried_adjoint(self, lv: SrcVar, shares: dict) -> SrcVar:
        """``gh``: the adjoint of loop variable h, carried backwards through the loop."""
        total = self.total(shares.pop(id(lv), []))
        if total is not None and (total.role == "rtemp" and total.hint is None or
                                  total.role == "adjoint" and total.hint is lv):
            total.role, total.hint = "adjoint", lv  # only the loop reads it: reuse it
            return total
        var = self.w.new(lv, "adjoint", lv)
        self.w.emit((var,), Ref((total,)) if total is not None else Fill(0, var))
        return var

    def assign(self, var: SrcVar, entries: list) -> None:
        """``var = sum of entries`` (or zeros when there is none)."""
        total = self.total(entries)
        self.w.emit((var,), Ref((total,)) if total is not None else Fill(0, var))

    # -- loops ------------------------------------------------------------------------------
    def loop(self, fwd: For, shares: dict) -> None:
        """Reverse a loop: ``for i in reversed(range(n))``, the body's adjoint inside.

        The loop variables' adjoints (``gh``) are carried backwards: the adjoint of h at
        the end of an iteration is given to the value h was assigned from, and the
        adjoint h's start value collects becomes ``gh`` for the iteration before.
        """
        where = self.position[id(fwd)]
        la = {id(lv): (lv, self.carried_adjoint(lv, shares)) for lv, _ in fwd.carry
              if lv.active}
        ctx = _LoopCtx(_defined(fwd.body))
        self.loops.append(ctx)
        body, inner = [], {}
        with self.w.into(body):
            for lv, end in fwd.carry:
                if id(lv) in la and type(end) is SrcVar and end.active:
                    self.add(end, la[id(lv)][1], math.inf, inner)
            self.block(fwd.body, inner)
            updates = [(var, self.total(inner.pop(id(lv), []))) for lv, var in la.values()]
            moved = [(var, t) for var, t in updates if t is not None and t is not var]
            if moved:
                self.w.emit(tuple(p[0] for p in moved), Ref(tuple(p[1] for p in moved)))
            for var, t in updates:
                if t is None:
                    self.w.emit((var,), Fill(0, var))
        self.loops.pop()
        if inner:
            raise MinigraphError("source_grad: internal error: adjoints left in a loop body")
        for v, acc in ctx.accs.values():
            self.assign(acc, shares.pop(id(v), []))
        rev = For(fwd.index, fwd.range, body, reverse=True)
        self.w.block.append(rev)
        self.pairs.append((fwd, rev))
        for v, acc in list(ctx.accs.values()) + list(la.values()):
            shares[id(v)] = [(where, acc)]

    # -- branches ---------------------------------------------------------------------------
    def branch(self, fwd: If, shares: dict) -> None:
        """Reverse an if with an if on the same condition: the branch that ran forward
        is the branch whose adjoint runs. Outer variables' adjoints are merged."""
        where = self.position[id(fwd)]
        seeds = {}
        for j in fwd.joins:  # complete: their readers come after the if
            g = self.complete(j, shares) if j.active else None
            if g is not None:
                seeds[id(j)], self.vars[id(j)] = g, j
        blocks, lefts = ([], []), []
        for stmts, block in zip((fwd.then, fwd.orelse), blocks):
            local = {k: [(math.inf, g)] for k, g in seeds.items()}
            with self.w.into(block):
                self.block(stmts, local)
            lefts.append(local)
        outer = {k: self.vars[k] for left in lefts for k in left}  # from before the if
        for v in outer.values():
            acc = self.w.new(v, "adjoint", v)
            for block, local in zip(blocks, lefts):
                with self.w.into(block):
                    self.assign(acc, shares.get(id(v), []) + local.get(id(v), []))
            shares[id(v)] = [(where, acc)]
        rev = If(fwd.cond, blocks[0], blocks[1])
        self.w.block.append(rev)
        if self.loops:  # a branch's values are saved by the branch that computed them
            self.pairs.append((fwd, rev))


# ========================================================================================
# 8. Tidying: dead code, the loops' stack, names
# ========================================================================================

def _prune(block: list, live: set[int], drop: bool = True) -> set[int]:
    """Remove lines whose results nobody reads (backwards liveness); return live-in.

    ``live`` is updated in place (a new set per line would make long programs quadratic).
    """
    keep = []
    for stmt in reversed(block):
        if isinstance(stmt, For):
            live = _prune_loop(stmt, live, drop)
            if not stmt.body:
                stmt.dropped = True
                continue
        elif isinstance(stmt, If):
            live_t = _prune(stmt.then, set(live), drop)
            live_e = _prune(stmt.orelse, set(live), drop)
            if drop and not stmt.then and not stmt.orelse:
                stmt.dropped = True
                continue
            live = live_t | live_e | {id(v) for v in _uses(stmt)}
        elif stmt.kind in ("push", "pop"):
            live.difference_update(id(t) for t in stmt.targets)
            live.update(id(v) for v in _uses(stmt))
        else:
            pairs = [k for k, t in enumerate(stmt.targets) if id(t) in live]
            if not pairs:
                continue
            if drop and isinstance(stmt.expr, Ref) and len(pairs) < len(stmt.targets):
                stmt.targets = tuple(stmt.targets[k] for k in pairs)
                stmt.expr = Ref(tuple(stmt.expr.values[k] for k in pairs))
            live.difference_update(id(t) for t in stmt.targets)
            live.update(id(v) for v in _uses(stmt))
        keep.append(stmt)
    if drop:
        block[:] = keep[::-1]
    return live


def _prune_loop(loop: For, after: set[int], drop: bool) -> set[int]:
    """A loop's live-in: iterate the body's liveness to a fixed point (the back edge)."""
    live = set(after)
    while True:
        new = after | _prune(loop.body, set(live), drop=False)
        if new == live:
            break
        live = new
    if drop:
        _prune(loop.body, set(live))
    return live


def _exposed(block: list) -> list[SrcVar]:
    """Variables read in ``block`` before it assigns them: what one iteration needs."""
    defined: set[int] = set()
    found: dict[int, SrcVar] = {}
    for stmt in block:
        for v in _uses(stmt) if isinstance(stmt, (Line, If)) else ():
            if id(v) not in defined:
                found.setdefault(id(v), v)
        if isinstance(stmt, Line):
            defined |= {id(t) for t in stmt.targets}
        elif isinstance(stmt, For):
            for v in _exposed(stmt.body):
                if id(v) not in defined:
                    found.setdefault(id(v), v)
            defined |= _defined(stmt.body)
        elif isinstance(stmt, If):
            for v in _exposed(stmt.then) + _exposed(stmt.orelse):
                if id(v) not in defined:
                    found.setdefault(id(v), v)
            defined |= _defined(stmt.then) & _defined(stmt.orelse)
    return list(found.values())


def _must_defined(block: list) -> set[int]:
    """Ids of the variables a forward block assigns on every path through it."""
    out: set[int] = set()
    for stmt in block:
        if isinstance(stmt, Line):
            out |= {id(t) for t in stmt.targets}
        elif isinstance(stmt, For):
            out |= _must_defined(stmt.body)  # loops run at least once (empty ones vanish)
        elif isinstance(stmt, If):
            out |= _must_defined(stmt.then) & _must_defined(stmt.orelse)
    return out


def _insert_stack(pairs: list[tuple[Any, Any]]) -> bool:
    """The stack: at the end of each forward loop iteration (or branch inside a loop),
    push what the matching reverse block reads of it; pop it where that block starts.
    Inner regions first, so that their pops already define what they restore."""
    used = False
    for fwd, rev in pairs:
        if fwd.dropped or rev.dropped:
            continue
        regions = ([(fwd.body, rev.body)] if isinstance(fwd, For) else
                   [(fwd.then, rev.then), (fwd.orelse, rev.orelse)])
        for forward, reverse in regions:
            inside = _must_defined(forward)
            saved = tuple(v for v in _exposed(reverse) if id(v) in inside)
            if saved:
                carry = bool(forward) and getattr(forward[-1], "kind", "") == "carry"
                forward.insert(len(forward) - carry, Line((), Ref(saved), "push"))
                reverse.insert(0, Line(saved, None, "pop"))
                used = True
    return used


_LETTERS = "abcdefhjkmnpqrstuvwxy"  # no g (adjoints), i, l, o (easily misread), z (output)


class _Namer:
    """Readable, unique names: the user's where free, else a, b, c, ..., then t1, t2 ..."""

    def __init__(self, taken: set[str], reserved: set[str]):
        self.taken = set(taken)  # names given out
        self.reserved = set(reserved)  # the user's names: only a hint may claim one
        self.letters = iter(_LETTERS)
        self.counter = itertools.count(1)

    def free(self, name: str, claim: bool = False) -> bool:
        return (name.isidentifier() and not keyword.iskeyword(name) and name not in self.taken
                and (claim or name not in self.reserved))

    def take(self, name: str) -> str:
        self.taken.add(name)
        return name

    def fresh(self, hint: str | None = None) -> str:
        if hint and self.free(hint, claim=True):
            return self.take(hint)
        for c in self.letters:
            if self.free(c):
                return self.take(c)
        while True:
            name = f"t{next(self.counter)}"
            if self.free(name):
                return self.take(name)

    def numbered(self, base: str) -> str:
        if self.free(base):
            return self.take(base)
        for k in itertools.count(1):
            if self.free(f"{base}_{k}"):
                return self.take(f"{base}_{k}")
        raise AssertionError  # pragma: no cover

    def series(self, base: str) -> str:
        for k in itertools.count(1):
            if self.free(f"{base}{k}"):
                return self.take(f"{base}{k}")
        raise AssertionError  # pragma: no cover


def _program_vars(block: list) -> Iterator[SrcVar]:
    """Every variable of a block, in order: targets and arguments, conditions."""
    for stmt in _walk(block):
        if isinstance(stmt, Line):
            yield from stmt.targets
            yield from _uses(stmt)
        elif isinstance(stmt, If):
            yield from _vars(stmt.cond)


def _name_all(namer: _Namer, forward: list, reverse: list, out: SrcVar,
              consts: dict[int, tuple[Any, str]], hints: dict) -> None:
    """Name constants, forward variables (loop and join variables first), adjoints."""
    order = list(_program_vars(forward)) + [out] + list(_program_vars(reverse))
    for v in order:
        if v.role == "const" and v.value is not None and v.name is None:
            v.name = _const_name(v.value, namer, consts, hints)
    for roles in (("loop", "join"), ("temp", "const")):  # the user's names, where free
        for v in order:
            if v.name is None and v.role in roles and isinstance(v.hint, str) and \
                    namer.free(v.hint, claim=True):
                v.name = namer.take(v.hint)
    if out.name is None and out.role in ("temp", "join"):
        out.name = namer.fresh(out.hint if isinstance(out.hint, str) and
                               namer.free(out.hint, claim=True) else "z")
    for v in order:
        if v.name is None and v.role in ("temp", "const", "loop", "join"):
            v.name = namer.fresh(None)
    for v in order:
        if v.role == "adjoint" and v.name is None:  # gx: the adjoint of x
            v.name = namer.numbered("g" + v.hint.name)
    for k, v in enumerate(order):
        if v.name is None:  # reverse temporaries: provisional, renamed after inlining
            v.name = f"_t{k}"


def _const_name(value: Any, namer: _Namer, consts: dict, hints: dict) -> str:
    """The namespace name of a constant: the user's name for it where known, else c1 ..."""
    if id(value) not in consts:
        hint = hints.get(id(value), (None, None))[1]
        name = hint if hint and namer.free(hint, claim=True) else None
        consts[id(value)] = (value, namer.take(name) if name else namer.series("c"))
    return consts[id(value)][1]


# ========================================================================================
# 9. Writing the text: mg.* calls (.source) or kernels on arrays (.raw_source)
# ========================================================================================

_INFIX = {"add": ("+", _ADD), "sub": ("-", _ADD), "mul": ("*", _MUL), "div": ("/", _MUL),
          "matmul": ("@", _MUL), "pow": ("**", _POW), "less": ("<", _CMP),
          "less_equal": ("<=", _CMP), "greater": (">", _CMP),
          "greater_equal": (">=", _CMP), "equal": ("==", _CMP), "not_equal": ("!=", _CMP)}
# primitives called as mg.<name>(args, <these params positionally>, <others by keyword>)
_PUBLIC = {"maximum": (), "exp": (), "log": (), "sin": (), "cos": (), "tanh": (),
           "sigmoid": (), "relu": (), "sqrt": (), "where": (), "sum": (), "mean": (),
           "max": (), "reshape": ("shape",), "transpose": ("axes",),
           "broadcast_to": ("shape",), "scatter_add": ("index", "shape"), "softmax": (),
           "log_softmax": (), "one_hot": ("num_classes", "dtype"), "cross_entropy": (),
           "identity": (), "stop_gradient": (), "astype": ("dtype",)}
_LITERALS = (bool, int, float, str, type(None))


def _infix(name: str, left: tuple[str, int], right: tuple[str, int]) -> tuple[str, int]:
    """``left op right`` with the parentheses Python's precedence needs."""
    sym, prec = _INFIX[name]
    if name == "pow":  # right-associative, and tighter than a unary minus on its left
        need_left, need_right = left[1] > prec, right[1] >= _UNARY
    elif prec == _CMP:  # comparisons chain: parenthesise both sides
        need_left, need_right = left[1] > prec, right[1] > prec
    else:  # left-associative: a - (b - c)
        need_left, need_right = left[1] >= prec, right[1] > prec
    lt = left[0] if need_left else f"({left[0]})"
    rt = right[0] if need_right else f"({right[0]})"
    return f"{lt} {sym} {rt}", prec


class _Text:
    """Turns program statements into lines of Python, inlining single-use temporaries."""

    def __init__(self, consts: dict, raw: bool, counts: Counter):
        self.consts = consts  # id(value) -> (value, name)
        self.raw = raw
        self.counts = counts  # how often each variable is read
        self.inlined: set[int] = set()  # decided by a planning pass
        self.used: set[int] = set()  # temporaries really written inline
        self.planning = False
        self.stack = "stack"
        self.kernels: dict[str, Any] = {}
        self.devices: dict[str, Device] = {}
        self.fills: dict[str, Any] = {}  # raw fills: functions, or arrays made once
        self.escaping: set[int] = set()  # variables that are (copies of) what is returned

    # -- values ------------------------------------------------------------------------------
    def value(self, v: Any, subst: dict) -> tuple[str, int]:
        if type(v) is SrcVar:
            return subst.get(id(v), (v.name, _ATOM))
        if isinstance(v, Index):
            return v.text, v.prec
        negative = type(v) in (int, float) and (v < 0 or math.copysign(1, v) < 0)
        return self.literal(v), _UNARY if negative else _ATOM

    def literal(self, v: Any) -> str:
        if type(v) is float and not math.isfinite(v):
            return f"float('{v}')"
        if type(v) in _LITERALS:  # (not NumPy scalars: they are constants, as eagerly)
            return repr(v)
        if isinstance(v, Index):
            return v.text
        if isinstance(v, tuple):
            inner = ", ".join(self.literal(x) for x in v)
            return f"({inner},)" if len(v) == 1 else f"({inner})"
        if isinstance(v, list):
            return "[" + ", ".join(self.literal(x) for x in v) + "]"
        if isinstance(v, slice):
            return f"slice({self.literal(v.start)}, {self.literal(v.stop)}, {self.literal(v.step)})"
        if v is Ellipsis:
            return "..."
        if isinstance(v, Device):
            return repr(v.name)
        return self.consts[id(v)][1]

    # -- expressions ---------------------------------------------------------------------------
    def op(self, e: Op, subst: dict) -> tuple[str, int]:
        args = [self.value(a, subst) for a in e.args]
        if self.raw:
            return self.kernel_call(e, args), _ATOM
        name = e.prim.name
        if name in _INFIX and len(args) == 2:
            return _infix(name, args[0], args[1])
        if name == "neg":
            return "-" + (args[0][0] if args[0][1] >= _UNARY else f"({args[0][0]})"), _UNARY
        if name == "getitem":
            return self.getitem(args[0], e.params["index"]), _ATOM
        return self.call(e, [a[0] for a in args]), _ATOM

    def getitem(self, x: tuple[str, int], index: tuple) -> str:
        def part(p: Any) -> str | None:
            if p is None or isinstance(p, (int, Index)) and not isinstance(p, bool):
                return "None" if p is None else self.literal(p)
            if p is Ellipsis:
                return "..."
            if isinstance(p, slice) and all(q is None or isinstance(q, (int, Index))
                                            for q in (p.start, p.stop, p.step)):
                s = ":".join("" if q is None else self.literal(q)
                             for q in (p.start, p.stop, p.step))
                return s[:-1] if s.endswith(":") and p.step is None else s
            return None
        parts = [part(p) for p in index]
        if any(p is None for p in parts):
            return f"mg.getitem({x[0]}, {self.literal(index)})"
        base = x[0] if x[1] >= _ATOM else f"({x[0]})"
        return f"{base}[{', '.join(parts) if parts else '()'}]"

    def call(self, e: Op, args: list[str]) -> str:
        name, params = e.prim.name, dict(e.params)
        if name == "concatenate":
            return f"mg.concatenate([{', '.join(args)}], axis={params['axis']})"
        if name == "to_device":
            return f"mg.to_device({args[0]}, {params['device'].name!r})"
        if name not in _PUBLIC:
            words = args + [f"{k}={self.literal(v)}" for k, v in params.items()]
            return f"mg.PRIMITIVES[{name!r}]({', '.join(words)})"
        if name in ("sum", "mean", "max"):
            axis = params.pop("axis")
            if axis is not None:
                params["axis"] = axis[0] if len(axis) == 1 else axis
            if params.pop("keepdims"):
                params["keepdims"] = True
        words = args + [self.literal(params.pop(k)) for k in _PUBLIC[name]]
        words += [f"{k}={self.literal(v)}" for k, v in params.items()]
        return f"mg.{name}({', '.join(words)})"

    def kernel_call(self, e: Op, args: list[tuple[str, int]]) -> str:
        """``_k_sin(_xp, x)``: the primitive's kernel on arrays, as graph compilation does."""
        kname = "_k_" + e.prim.name
        self.kernels[kname] = e.prim.impl
        words = [a[0] for a in args] + [f"{k}={self.literal(v)}" for k, v in e.params.items()
                                         if not isinstance(v, Device)]
        words += [f"{k}={self.device_name(v)}" for k, v in e.params.items()
                  if isinstance(v, Device)]
        return f"{kname}(_xp, {', '.join(words)})"

    def device_name(self, d: Device) -> str:
        name = "_dev_" + "".join(c if c.isalnum() else "_" for c in d.name)
        self.devices[name] = d
        return name

    def fill(self, f: Fill, target: SrcVar) -> str:
        if self.raw:
            self.device_name(f.device)  # (checked: one device for kernels on arrays)
            name = f"_fill{len(self.fills)}"
            if id(target) in self.escaping:  # returned: a new array on every call
                self.fills[name] = functools.partial(_raw_fill, f.value, f.shape, f.dtype,
                                                     f.device)
                return f"{name}()"
            # Only read, by kernels that never write into their arguments: made once.
            self.fills[name] = _raw_fill(f.value, f.shape, f.dtype, f.device)
            return name
        if f.value in (0, 1) and not isinstance(f.value, bool):
            which = "ones" if f.value == 1 else "zeros"
            return f"mg.{which}({f.shape!r}, {f.dtype!r}, {f.device.name!r})"
        return f"mg.tensor({self.literal(f.value)}, {f.dtype!r}, {f.device.name!r})"

    # -- statements ----------------------------------------------------------------------------
    def line(self, line: Line, subst: dict) -> str:
        names = ", ".join(t.name for t in line.targets)
        if line.kind == "push":
            vals = ", ".join(self.value(v, subst)[0] for v in line.expr.values)
            saved = vals if len(line.expr.values) == 1 else f"({vals})"
            return f"{self.stack}.append({saved})"
        if line.kind == "pop":
            return f"{names} = {self.stack}.pop()"
        e = line.expr
        if isinstance(e, Op):
            return f"{names} = {self.op(e, subst)[0]}"
        if isinstance(e, Fill):
            return f"{names} = {self.fill(e, line.targets[0])}"
        return f"{names} = {', '.join(self.value(v, subst)[0] for v in e.values)}"

    def block(self, stmts: list, depth: int, inline: bool) -> list[str]:
        pad = "    " * depth
        out: list = []
        pending: dict[int, list] = {}  # id(temp) -> [text, prec, reads, entry, used]
        for stmt in stmts:
            if isinstance(stmt, Line):
                subst, reads = self.substitute(stmt, pending)
                entry = self.candidate(stmt, subst, reads) if inline else None
                if entry is not None:
                    pending[id(stmt.targets[0])] = entry
                    out.append(entry)
                else:
                    out.append(pad + self.line(stmt, subst))
                self.kill(pending, {t.name for t in stmt.targets}, keep=entry)
            else:
                self.kill(pending, {v.name for v in _program_vars([stmt])})
                out += self.compound(stmt, depth, inline)
        return [x if isinstance(x, str) else pad + x[3] for x in out
                if isinstance(x, str) or not x[4]]

    def substitute(self, stmt: Line, pending: dict) -> tuple[dict, set[str]]:
        subst, reads = {}, set()
        for v in _uses(stmt):
            entry = pending.pop(id(v), None)
            if entry is not None:
                subst[id(v)] = (entry[0], entry[1])
                reads |= entry[2]
                entry[4] = True
                self.used.add(id(v))
            reads.add(v.name)
        return subst, reads

    def candidate(self, stmt: Line, subst: dict, reads: set[str]) -> list | None:
        """A reverse temporary read once becomes part of its reader's line."""
        t = stmt.targets[0] if len(stmt.targets) == 1 else None
        if t is None or stmt.kind or t.role != "rtemp" or self.counts[id(t)] != 1 or \
                not isinstance(stmt.expr, Op):
            return None
        text, prec = self.op(stmt.expr, subst)
        if (self.planning and len(text) > 64) or (not self.planning and id(t) not in self.inlined):
            return None
        return [text, prec, reads, self.line(stmt, subst), False]

    @staticmethod
    def kill(pending: dict, names: set[str], keep: Any = None) -> None:
        for k, entry in list(pending.items()):
            if entry is not keep and entry[2] & names:
                del pending[k]

    def compound(self, stmt: Any, depth: int, inline: bool) -> list[str]:
        pad = "    " * depth
        if isinstance(stmt, For):
            r = stmt.range
            rng = (f"range({r.stop})" if r.start == 0 and r.step == 1 else
                   f"range({r.start}, {r.stop})" if r.step == 1 else
                   f"range({r.start}, {r.stop}, {r.step})")
            head = f"for {stmt.index.text} in {'reversed(' + rng + ')' if stmt.reverse else rng}:"
            return [pad + head] + self.block(stmt.body, depth + 1, inline)
        cond = stmt.cond.text if isinstance(stmt.cond, Cond) else stmt.cond.name
        then = self.block(stmt.then, depth + 1, inline)
        orelse = self.block(stmt.orelse, depth + 1, inline)
        if not then:
            return [f"{pad}if not ({cond}):"] + orelse
        return [f"{pad}if {cond}:"] + then + ([f"{pad}else:"] + orelse if orelse else [])


# ========================================================================================
# 10. The compiled program, the cache, and the public functions
# ========================================================================================

class Program:
    """One function's value-and-gradient program for one input signature.

    ``source`` is the text (``mg.`` calls), ``forward_source`` the normalised primal,
    ``raw_source`` the same program calling kernels on arrays; ``fn`` and ``raw`` are
    their compiled functions.
    """

    def __init__(self, signature: tuple, source: str, forward_source: str, fn: Callable,
                 raw_source: str | None, raw: Callable | None, out: SrcVar,
                 grads: list[SrcVar], single: bool):
        self.signature, self.source, self.forward_source = signature, source, forward_source
        self.fn, self.raw_source, self.raw = fn, raw_source, raw
        self.out_device = out.device
        self.grad_devices = [g.device for g in grads]
        self.single = single

    def __repr__(self) -> str:
        return f"<source_grad program\n{self.source}>"


def _compile(source: str, name: str, namespace: dict) -> Callable:
    filename = f"<source_grad {name} {id(source):x}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


def _transform(src: _Source, args: tuple, nums: tuple[int, ...], single: bool,
               signature: tuple) -> Program:
    """Read, normalise, reverse, tidy and compile ``src`` for these arguments."""
    writer = _Writer()
    params = list(inspect.signature(src.fn).parameters)
    saved, _writing.writer = _writing.writer, writer
    try:
        inputs, call_args = _inputs(src, args, nums, params, writer)
        norm = _Normaliser(writer)
        out = _output(norm.call(src, call_args, {}), writer, src)
        forward = writer.block
        writer.block, writer.role = [], "rtemp"
        reverse = _Reverse(writer, forward)
        grads = reverse.run(forward, out, inputs)
        backward = writer.block
    finally:
        _writing.writer = saved
    return _finish(src, params, forward, backward, out, grads, reverse.pairs, writer,
                   single, signature)


def _inputs(src: _Source, args: tuple, nums: tuple, params: list[str],
            writer: _Writer) -> tuple[list[SrcVar], tuple]:
    """Source variables for the run-time arguments; other arguments stay Python values."""
    inputs, call_args = [], []
    for k, a in enumerate(args):
        value = _as_runtime(a, k in nums)
        if value is None:
            call_args.append(a)
            continue
        shape, dtype, device = value
        if k in nums and dtype not in FLOAT_DTYPES:
            raise DTypeError(f"grad: cannot differentiate with respect to argument {k} of "
                             f"dtype {dtype}; pass floats (e.g. 2.0 rather than 2)")
        var = SrcVar(shape, dtype, device, k in nums, "input")
        var.name = params[k]
        call_args.append(var)
        if k in nums:
            inputs.append(var)
    writer.where = src.where()
    return inputs, tuple(call_args)


def _as_runtime(a: Any, differentiated: bool) -> tuple | None:
    """(shape, dtype, device) of an argument passed at run time, None for a static one."""
    if isinstance(a, Tensor):
        return a.shape, a.dtype, a.device
    if type(a) is Dual:
        return _as_runtime(a.primal, True)
    if isinstance(a, np.ndarray):
        t = tensor(a)
        return t.shape, t.dtype, t.device
    if differentiated and type(a) in (float, int, bool):
        t = tensor(a)
        return t.shape, t.dtype, t.device
    if type(a) in KINDS:
        raise TypeError(f"source_grad: cannot take a {type(a).__name__} argument")
    return None


def _output(out: Any, writer: _Writer, src: _Source) -> SrcVar:
    """f's returned value as a variable of the program; it must be one scalar."""
    if isinstance(out, Tensor):
        out = SrcVar(out.shape, out.dtype, out.device, False, "const", None, out)
    elif type(out) in (int, float):
        const = SrcVar((), "float64", get_device(None), False, "const")
        writer.emit((const,), Fill(float(out), const))
        out = const
    if type(out) is not SrcVar:
        raise TypeError(f"grad: f must return a Tensor, got {type(out).__name__} "
                        f"[source_grad: {src.where()}]")
    if math.prod(out.shape) != 1:
        raise GradientError(f"grad: f must return a scalar, it returned shape {out.shape}; "
                            f"use mg.jacrev for a vector output")
    return out


def _finish(src: _Source, params: list[str], forward: list, backward: list, out: SrcVar,
            grads: list[SrcVar], pairs: list, writer: _Writer, single: bool,
            signature: tuple) -> Program:
    """Dead code, the stack, names, text, compile."""
    in_forward = {id(s) for s in forward}
    live = {id(out)} | {id(g) for g in grads}
    whole = forward + backward
    _prune(whole, set(live))
    if _insert_stack(pairs):
        if any(isinstance(s, Line) and s.kind == "pop" and any(t is out for t in s.targets)
               for s in _walk(whole)):  # the reverse sweep restores it: return a copy
            kept = SrcVar(out.shape, out.dtype, out.device, out.active, "temp", "z")
            copy = Line((kept,), Ref((out,)))
            in_forward.add(id(copy))
            at = sum(1 for s in whole if id(s) in in_forward)
            whole.insert(at, copy)
            out, live = kept, live | {id(kept)}
        _prune(whole, set(live))
    forward[:] = [s for s in whole if id(s) in in_forward]
    backward[:] = [s for s in whole if id(s) not in in_forward]
    namer = _Namer(set(params) | {"mg", "range", "reversed", "stack", "_stack"},
                   writer.reserved)
    consts: dict[int, tuple[Any, str]] = {}
    _name_all(namer, forward, backward, out, consts, writer.hints)
    _collect_consts(whole, namer, consts, writer.hints)
    texts = _texts(src.fn.__name__, params, forward, backward, out, grads, single,
                   consts, namer)
    return _build_program(src.fn.__name__, texts, consts, out, grads, signature, single)


def _collect_consts(block: list, namer: _Namer, consts: dict, hints: dict) -> None:
    """Name every non-literal value a line uses (tensors, arrays) as a constant."""
    def visit(v: Any) -> None:
        if isinstance(v, (tuple, list)):
            for x in v:
                visit(x)
        elif isinstance(v, slice):
            visit((v.start, v.stop, v.step))
        elif not isinstance(v, (SrcVar, Index, Device)) and type(v) not in _LITERALS \
                and v is not Ellipsis:
            _const_name(v, namer, consts, hints)
    for stmt in _walk(block):
        if isinstance(stmt, Line) and isinstance(stmt.expr, Op):
            visit(stmt.expr.args)
            visit(tuple(stmt.expr.params.values()))


def _texts(name: str, params: list[str], forward: list, backward: list, out: SrcVar,
           grads: list[SrcVar], single: bool, consts: dict, namer: _Namer) -> dict:
    """The program's two texts (mg calls, kernels) and the normalised primal's."""
    counts = Counter(id(v) for s in _walk(forward + backward)
                     for v in (_uses(s) if isinstance(s, (Line, If)) else ()))
    for v in [out] + grads:
        counts[id(v)] += 1
    plan = _Text(consts, False, counts)
    plan.planning = True
    plan.block(backward, 1, inline=True)
    for v in _program_vars(backward):  # final names of the reverse temporaries left
        if v.role == "rtemp" and v.name.startswith("_t") and id(v) not in plan.used:
            v.name = namer.fresh(None)
    stack = "_stack" if "stack" in namer.reserved else "stack"
    names = [g.name for g in grads]
    ret = f"{out.name}, " + (names[0] if single else
                             f"({', '.join(names)}{',' if len(names) == 1 else ''})")
    texts: dict[Any, Any] = {}
    escaping = _escaping(forward + backward, [out] + grads)
    for raw in (False, True):
        text = _Text(consts, raw, counts)
        text.inlined, text.stack, text.escaping = plan.used, stack, escaping
        body = text.block(forward, 1, inline=False)
        back = text.block(backward, 1, inline=True)
        pushes = any(isinstance(s, Line) and s.kind == "push" for s in _walk(forward))
        texts[raw] = (_assemble(f"grad_{name}", params, body, back, ret, consts,
                                stack if pushes else None), text)
    texts["forward"] = _forward_text(name, params, forward, out, consts, counts)
    return texts


def _forward_text(name: str, params: list[str], forward: list, out: SrcVar, consts: dict,
                  counts: Counter) -> str:
    """The normalised primal alone: the forward sweep without the stack, then return."""
    primal = _copy(forward)
    _strip_stack(primal)
    _prune(primal, {id(out)})
    lines = _Text(consts, False, counts).block(primal, 1, inline=False)
    return (f"def {name}({', '.join(params)}):\n" + _constants_comment(consts) +
            "\n".join(lines + [f"    return {out.name}"]) + "\n")


def _escaping(block: list, returned: list[SrcVar]) -> set[int]:
    """Ids of the returned variables and of everything they may be a copy of."""
    found = {id(v) for v in returned}
    copies = [s for s in _walk(block) if isinstance(s, Line) and isinstance(s.expr, Ref)]
    grew = True
    while grew:
        grew = False
        for line in copies:
            if any(id(t) in found for t in line.targets):
                new = {id(v) for v in _vars(line.expr.values)} - found
                found |= new
                grew = grew or bool(new)
    return found


def _assemble(name: str, params: list[str], forward: list[str], backward: list[str],
              ret: str, consts: dict, stack: str | None) -> str:
    lines = [f"def {name}({', '.join(params)}):"]
    if stack:
        lines.append(f"    {stack} = []  # what the reverse sweep needs of each loop iteration")
    lines.append("    # forward sweep: the evaluation trace (a.*), one primitive per line")
    lines += forward
    lines.append("    # reverse sweep: the adjoint trace (g.*), in reverse order")
    lines += backward
    lines.append(f"    return {ret}")
    return lines[0] + "\n" + _constants_comment(consts) + "\n".join(lines[1:]) + "\n"


def _constants_comment(consts: dict) -> str:
    if not consts:
        return ""
    shown = []
    for value, cname in consts.values():
        if isinstance(value, Tensor):
            shown.append(f"{cname}: {value.shape} {value.dtype} on {value.device.name}")
        else:
            shown.append(f"{cname}: {type(value).__name__}")
    return "    # constants, captured when this program was built: " + "; ".join(shown) + "\n"


def _copy(block: list) -> list:
    """A copy of a block's structure (lines are shared, loops and ifs copied)."""
    out = []
    for s in block:
        if isinstance(s, For):
            c = For(s.index, s.range, _copy(s.body), s.reverse, s.carry)
            out.append(c)
        elif isinstance(s, If):
            out.append(If(s.cond, _copy(s.then), _copy(s.orelse), s.joins))
        else:
            out.append(Line(s.targets, s.expr, s.kind))
    return out


def _strip_stack(block: list) -> None:
    """Remove the pushes (the normalised primal needs no stack), in every nested block."""
    blocks = [block] + [b for s in _walk(block) for b in
                        ((s.body,) if isinstance(s, For) else
                         (s.then, s.orelse) if isinstance(s, If) else ())]
    for b in blocks:
        b[:] = [x for x in b if getattr(x, "kind", "") != "push"]


def _build_program(name: str, texts: dict, consts: dict, out: SrcVar,
                   grads: list[SrcVar], signature: tuple, single: bool) -> Program:
    mg = sys.modules["minigraph"]
    source, _ = texts[False]
    namespace: dict[str, Any] = {"mg": mg}
    namespace.update({cname: value for value, cname in consts.values()})
    fn = _compile(source, f"grad_{name}", namespace)
    raw_source, text = texts[True]
    raw = None
    if _raw_ok(consts, text, out, grads):
        devices = dict(text.devices)
        ns: dict[str, Any] = {**text.fills, **text.kernels, **devices}
        ns["_xp"] = next(iter(devices.values())).xp if devices else out.device.xp
        ns.update({cname: (value.data if isinstance(value, Tensor) else value)
                   for value, cname in consts.values()})
        raw = _compile(raw_source, f"grad_{name}", ns)
    return Program(signature, source, texts["forward"], fn, raw_source if raw else None,
                   raw, out, grads, single)


def _raw_ok(consts: dict, text: _Text, out: SrcVar, grads: list[SrcVar]) -> bool:
    """Kernels on arrays need one device without a GPU context (NumPy-like arrays)."""
    devices = {d.name: d for d in text.devices.values()}
    devices[out.device.name] = out.device
    devices.update({g.device.name: g.device for g in grads})
    for value, _ in consts.values():
        if isinstance(value, Tensor):
            devices[value.device.name] = value.device
    return len({id(d.xp) for d in devices.values()}) == 1 and len(devices) == 1 and \
        all(d.context is None for d in devices.values())


def _raw_fill(value: float, shape: tuple, dtype: str, device: Device) -> Any:
    return device.xp.full(shape, value, dtype=device.dtype(dtype),
                          **({} if device.native is None else {"device": device.native}))


# -- the cache: per function, per argnums and input signature --------------------------------

_PROGRAMS: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()
_grad_mode = tape._mode  # read on every call: is the tape recording?
_LOCK = threading.Lock()


def _signature(args: tuple, nums: tuple) -> tuple:
    """What a program is specialised to: (device, shape, dtype) of run-time arguments,
    the value of the others. Devices are compared as objects, first: a device registered
    again under the same name (another array library) gets its own program, and dtypes
    of two array libraries are never compared."""
    key = []
    for k, a in enumerate(args):
        t = type(a)
        if t is Tensor:  # (the hot path: the array's own dtype object, no name lookup)
            key.append((a.device, a.data.shape, a.data.dtype))
        elif t in (float, int, bool) and k in nums:  # becomes a tensor, default device
            key.append((t, get_device(None)))
        elif t is Dual:
            key.append(("dual", a.primal.shape, a.primal.dtype, a.primal.device))
        elif isinstance(a, np.ndarray):
            key.append(("ndarray", a.shape, a.dtype.name, get_device(None)))
        else:
            try:
                hash(a)
            except TypeError:
                raise TypeError(f"source_grad: argument {k} ({type(a).__name__}) is neither "
                                f"a tensor nor a hashable Python value; programs are built "
                                f"per value of such arguments") from None
            key.append(("static", t, a))
    return tuple(key)


class SourceGrad:
    """``mg.source_grad(f)``: f's gradient by a program written from f's source.

    Calling it builds (once per input signature) and runs that program. ``.source`` is the
    program's text, ``.forward_source`` the normalised primal (three-address form),
    ``.raw_source`` the kernel-level variant; ``.programs`` the cache.
    """

    def __init__(self, f: Callable[..., Any], argnums: Argnums = 0, with_value: bool = False):
        self.f = f
        self.argnums = argnums
        self.nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        self.with_value = with_value
        self._src = _read(f)  # refusals happen here, before anything runs
        self.transforms = 0  # how many programs were written (the cache's misses)
        self.last: Program | None = None
        self.__name__ = f"grad_{f.__name__}"
        self._defaults = f.__defaults__ or ()
        self._n = f.__code__.co_argcount
        with _LOCK:  # shared by every gradient of f with these argnums
            self._programs = _PROGRAMS.setdefault(f, {}).setdefault(self.nums, {})

    @property
    def programs(self) -> dict:
        """This function's programs for these argnums: signature -> Program."""
        return self._programs

    def _complete(self, args: tuple) -> tuple:
        """The arguments with f's defaults filled in (the program takes them all)."""
        missing = self._n - len(args)
        if missing > 0 and missing <= len(self._defaults):
            return args + self._defaults[len(self._defaults) - missing:]
        return args

    def program_for(self, *args: Any) -> Program:
        """The program for these arguments' signature (built if needed)."""
        args = self._complete(args)
        key = _signature(args, self.nums)
        prog = self._programs.get(key)
        if prog is None:
            prog = _transform(self._src, args, self.nums, isinstance(self.argnums, int), key)
            self.transforms += 1
            self._programs[key] = prog
        self.last = prog
        return prog

    def __call__(self, *args: Any) -> Any:
        if len(args) < self._n:
            args = self._complete(args)
        prog = self._programs.get(_signature(args, self.nums))  # the cache: no rewriting
        if prog is None:
            prog = self.program_for(*args)
        self.last = prog
        value, grads = _run(prog, args, self.nums)
        return (value, grads) if self.with_value else grads

    def _example(self) -> Program:
        if self.last is None:
            n = len(inspect.signature(self.f).parameters)
            try:
                self.program_for(*([1.0] * n))
            except MinigraphError as exc:
                raise type(exc)(f"{exc}\n(.source shows the program of the last call; "
                                f"none was made yet and float scalars do not fit: call "
                                f"the gradient, or program_for(*args), first)") from None
        return self.last

    @property
    def source(self) -> str:
        """The adjoint program of the last call (float64 scalars if none yet)."""
        return self._example().source

    @property
    def forward_source(self) -> str:
        """The normalised primal: one primitive per line, (a.1)-(a.5)."""
        return self._example().forward_source

    @property
    def raw_source(self) -> str | None:
        return self._example().raw_source


def _run(prog: Program, args: tuple, nums: tuple) -> tuple[Any, Any]:
    """Run the compiled program: on arrays when nothing needs recording, else on values."""
    arrays = _arrays(args, nums) if prog.raw is not None else None
    if arrays is None:
        return prog.fn(*[_value(a, k in nums) for k, a in enumerate(args)])
    value, grads = prog.raw(*arrays)
    if prog.single:
        return Tensor(value, prog.out_device), Tensor(grads, prog.grad_devices[0])
    return Tensor(value, prog.out_device), tuple(
        [Tensor(g, d) for g, d in zip(grads, prog.grad_devices)])


def _arrays(args: tuple, nums: tuple) -> list | None:
    """The arguments as arrays, or None if a value needs its own interpreter: a dual
    number, or a tensor the tape records (a gradient of this gradient)."""
    recording = _grad_mode.enabled
    arrays = []
    for k, a in enumerate(args):
        t = type(a)
        if t is Tensor:
            if a.requires_grad and recording:
                return None
            arrays.append(a.data)
        elif t is Dual:
            return None
        else:
            arrays.append(_array(a, k in nums))
    return arrays


def _array(a: Any, differentiated: bool) -> Any:
    """An argument as the kernels take it (other Python values are the program's own)."""
    if differentiated and type(a) is float:
        return get_device(None).asarray(a)
    if isinstance(a, np.ndarray) or (differentiated and type(a) in (int, bool)):
        return tensor(a).data
    return a


def _value(a: Any, differentiated: bool) -> Any:
    """An argument as the mg. program takes it: arrays and numbers to differentiate
    become tensors; other Python values are the program's own (built in)."""
    if isinstance(a, np.ndarray) or (differentiated and type(a) in (float, int, bool)):
        return tensor(a)
    return a


def source_grad(f: Callable[..., Any], argnums: Argnums = 0) -> SourceGrad:
    """The gradient of scalar ``f`` by source transformation: ``mg.source_grad(f)(x, y)``.

    ``argnums`` an int gives one gradient, a tuple a tuple. ``.source`` is the generated
    adjoint program. Unsupported Python raises :class:`SourceTransformError` here.
    """
    return SourceGrad(f, argnums, with_value=False)


def value_and_grad(f: Callable[..., Any], argnums: Argnums = 0) -> SourceGrad:
    """Source mode behind ``mg.value_and_grad(f, mode="source")``: ``(value, grad)``."""
    return SourceGrad(f, argnums, with_value=True)
