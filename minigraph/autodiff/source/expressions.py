"""Normalising, expressions: evaluating the function's expressions on source variables.

The expression half of step 2, (a.1)-(a.5): :class:`_Expressions` is the base class of
``normalize.py``'s :class:`_Normaliser`, which runs the statements. Names are looked up
in Python's own order (local, closure, global, builtin); operators and minigraph calls on
source variables write lines (through ``_bind``); what Python can decide while the program
is written (shapes, numbers, calls with constant arguments) it computes now
(:meth:`_Expressions.guard`). Plain Python functions called with values of the program
are read and inlined (:func:`_user_function`).
"""

from __future__ import annotations

import ast
import builtins
import operator
import types
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np

from ...errors import MinigraphError
from ...ops.primitive import KINDS
from ...tensor import Tensor
from .. import tape
from .errors import SourceTransformError, Where, _located
from .reading import _read, _Source
from .values import SrcVar, _dynamic
from .writer import _Writer


# Made by _Normaliser.join (normalize.py) for a name set in one branch; load() below
# refuses to read it.
class _OneBranch:
    """A name an if on a run-time value assigns in one branch only: reading it fails."""
    __slots__ = ("name", "where")

    def __init__(self, name: str, where: Where):
        self.name, self.where = name, where


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


class _Expressions:
    """The expressions of :class:`_Normaliser` (``normalize.py``), which inherits them.

    It uses what the normaliser provides: ``self.w`` (the writer), ``self.src`` (the
    function being run), ``self.call`` (inline a call) and ``self.const`` (a constant).
    """

    w: _Writer  # set by _Normaliser.__init__

    if TYPE_CHECKING:  # what _Normaliser defines, declared here for the type checker
        @property
        def src(self) -> _Source: ...  # the function being run
        def call(self, src: _Source, args: tuple, kwargs: dict) -> Any: ...
        def const(self, t: Tensor) -> SrcVar: ...

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
        # (mypy reads a property that returns a types.FunctionType as a bound method,
        # which has no __globals__; the function has them)
        if name in src.fn.__globals__:  # type: ignore[attr-defined]
            return self.outside(name, src.fn.__globals__[name], "reads the global")  # type: ignore[attr-defined]
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
        parts: list[Any] = []  # str pieces
        for v in node.values:
            if isinstance(v, ast.FormattedValue):
                x = self.expr(v.value, env)
                if _dynamic(x):
                    raise self.w.refuse("formatting a value of the program into a string")
                x = {-1: x, 115: str(x), 114: repr(x), 97: ascii(x)}[v.conversion]
                spec = self.expr(v.format_spec, env) if v.format_spec else ""
                parts.append(format(x, spec))
            else:  # (the other parts of an f-string are its text, in Constants)
                parts.append(cast(ast.Constant, v).value)
        return "".join(parts)

    def e_Call(self, node: ast.Call, env: dict) -> Any:
        fn = self.expr(node.func, env)
        args = tuple(self.expr(a, env) for a in node.args)
        # (every keyword has a name: reading refused **kwargs in a call)
        kwargs = {cast(str, k.arg): self.expr(k.value, env) for k in node.keywords}
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
        if getattr(fn, "transformation", None) is not None:
            return  # mg.grad(g), mg.jvp ...: they run on source variables, writing lines
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


def _user_function(fn: Any) -> types.FunctionType | None:
    """A plain Python function (or method) the transformation reads and inlines."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        return None
    module = (fn.__module__ or "").split(".")[0]
    return None if module in ("minigraph", "numpy", "builtins") else fn
