"""Normalising: running the function on source variables, (a.1)-(a.5).

Step 2 of the overview (see ``__init__.py``). :class:`_Normaliser` runs a function's body
statement by statement: assignments bind names, an ``if`` Python can decide runs one
branch, an ``if`` on a run-time value writes both (:meth:`~_Normaliser.dynamic_if`, with
join variables), ``for i in range(n)`` writes its body once, with loop variables carrying
values between iterations (:meth:`~_Normaliser.s_For`), and calls of plain Python
functions are inlined (:meth:`~_Normaliser.call`, :func:`_user_function`).

Its expressions look names up in Python's own order (local, closure, global, builtin);
operators and minigraph calls on source variables write lines (through ``_bind``); what
Python can decide while the program is written (shapes, numbers, calls with constant
arguments) it computes now (:meth:`~_Normaliser.guard`). What it writes is the evaluation
trace: the program in three-address form.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import itertools
import math
import operator
import types
from typing import Any, Callable, Iterable, NamedTuple, cast

import numpy as np

from ...device import Device
from ...errors import MinigraphError
from ...ops import copy as C
from ...ops.operators import holders_among, rebound_by_its_call
from ...ops.primitive import KINDS
from ...ops.shape_rules import promote
from ...ops.weak import AS_NUMBER, Weak
from ...tensor import Tensor
from .. import tape
from ..batching import BatchTracer
from ..reads import ReadOnlyWrite, read_from_outside
from .program import Fill, For, If, Line, Op, Ref, _Writer, _uses, _walk
from .reading import (SourceTransformError, Where, _assigned, _loads, _located, _read, _Source,
                      _too_deep)
from .values import Cond, Index, SrcVar, _constant, _dynamic, _loop_values


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Pow: operator.pow, ast.MatMult: operator.matmul,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_IN_PLACE = {ast.Add: operator.iadd, ast.Sub: operator.isub, ast.Mult: operator.imul,
             ast.Div: operator.itruediv, ast.FloorDiv: operator.ifloordiv,
             ast.Mod: operator.imod, ast.Pow: operator.ipow}
_UNARYOPS = {ast.USub: operator.neg, ast.UAdd: lambda v: v, ast.Not: operator.not_,
             ast.Invert: operator.invert}
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
            ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne,
            ast.Is: operator.is_, ast.IsNot: operator.is_not,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
# Builtins that may see values of the program: they only read shapes or add.
# (abs(v) is mg.abs, by __abs__; divmod(v, y) is (v // y, v % y), by __divmod__)
_SAFE_BUILTINS = (len, sum, isinstance, tuple, list, abs, divmod)
# minigraph functions that must not receive values of the program.
_FORBIDDEN = {"tensor", "zeros", "ones", "full", "as_tensor"}


class _Return(NamedTuple):
    """What a ``return`` statement returned: a block's result, ``None`` if it did not;
    with the Python objects it may be (:meth:`_Normaliser.origin_of`)."""
    value: Any
    origin: Any = frozenset()


class _OneBranch(NamedTuple):
    """The value of a name an if on a run-time value assigns in one branch only, or to
    different Python values in the two (made by :meth:`_Normaliser.join`):
    :meth:`_Normaliser.load` refuses to read it; unread, it costs nothing (the index of
    a loop in one branch, say)."""
    where: Where  # the if's
    values: bool = False  # (different Python values: the other case)


_MISSING = object()
# The deepest nesting of blocks the program may have: Python's tokenizer allows 99
# levels of indentation, and the body of the program's def takes one.
_MAX_NESTING = 98


def _sharing(env: dict, names: list[str]) -> set[tuple[str, str]]:
    """The pairs of a name among ``names`` and any name of ``env`` whose objects ``env``
    says may be one (their origins meet, a loop body's ``<top>`` origins included)."""
    sets = {k.split(">", 1)[1]: _flat(v) for k, v in env.items()
            if k.startswith(("<origin>", "<top>"))}
    return {(a, b) for a in names if a in sets for b in sets
            if a != b and sets[a] & sets[b]}


def _holding(v: Any, origin: Any, value: Any) -> frozenset:
    """The origins, among ``v``'s (``origin``), of what in ``v`` is ``value``: ``v``
    itself, or items of a list, tuple or dict it holds, nested."""
    if v is value:
        return _flat(origin)
    items = list(v.values()) if type(v) is dict else list(v) if type(v) in (list, tuple) \
        else []
    origins = origin if type(origin) is list and len(origin) == len(items) else \
        [origin] * len(items)  # (one per item for a list made by a display)
    return frozenset().union(*(_holding(i, o, value) for i, o in zip(items, origins)))


def _flat(origin: Any) -> frozenset:
    """An origin as one set: a list's items' together (see ``_Normaliser.origin``)."""
    if type(origin) is list:
        return frozenset().union(*(_flat(o) for o in origin))
    return origin if type(origin) is frozenset else frozenset()


class _Normaliser:
    """Runs a function's statements on source variables, writing three-address lines.

    Python decides what is known when the program is written (shapes, Python numbers,
    a static ``if``) and runs it now; what depends on the inputs' values becomes lines.
    """

    def __init__(self, writer: _Writer, taken: Iterable[str] = ()):
        self.w = writer
        # Loop indices keep the user's names in the text (``for i in range(n)``), written
        # before the other variables are named (tidy.py's _Namer): one is renamed where
        # its name is already the program's, a parameter or global (``taken``) or an
        # enclosing loop's index (``indices``, an inlined helper's loop inside its
        # caller's), and the names given (``index_names``) are taken for the others.
        self.taken = set(taken)
        self.indices: list[str] = []  # the enclosing loops' indices, by the program's names
        self.index_names: set[str] = set()
        # id(line) -> (the line, the user's file and line that wrote it), for errors of
        # kernels on arrays (compiled.py); the line is kept so that its id stays its own
        self.places: dict[int, tuple[Line, tuple[str, int]]] = {}
        self.stack: list[_Source] = []  # the functions being run (inlined calls nest)
        # the names the statement being run binds to a call's result (h = step(h)): they
        # do not hold what the call updates; and, for each caller of an inlined call, its
        # names and those of its statement making the call
        self.rebinding: frozenset[str] = frozenset()
        self.callers: list[tuple[dict, frozenset[str]]] = []
        self.dynamic = 0  # depth inside branches decided at run time
        self.loops = 0  # depth inside for loops (their indices' axes: values._loop_values)
        self.origins = itertools.count()  # new Python objects, for origin()
        self.returned: dict[int, Any] = {}  # an inlined call's node -> its result's origin
        self.last_return: Any = frozenset()  # the origin of the last inlined call's result
        self.end_origins: dict[str, Any] = {}  # a loop's carried names at its body's end
        self.bases: set[int] = set()  # loop variables starting as a view's base (held)
        # f's parameters that hold the caller's own tensors (not differentiated): eager
        # mode's update writes into them (operators.caller_held), the program cannot
        self.passed: dict[str, str] = {}

    @property
    def src(self) -> _Source:
        return self.stack[-1]

    # -- functions ------------------------------------------------------------------------
    def call(self, src: _Source, args: tuple, kwargs: dict, caller: dict | None = None,
             origins: tuple[tuple, dict] = ((), {})) -> Any:
        """Run ``src``'s body with its parameters bound to ``args`` (inlining a call).
        ``caller`` is the calling function's names, and ``origins`` the objects its
        arguments are (:meth:`origin_of`): a parameter is the caller's object, so an
        update in place of it is checked against the caller's names too."""
        if any(s is src for s in self.stack):
            raise self.w.refuse(f"a recursive call of {src.fn.__name__}",
                                "the program is written by inlining calls")
        try:
            signature = inspect.signature(src.fn)
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{exc} [source_grad: {self.w.where}]") from None
        bound.apply_defaults()
        env = dict(bound.arguments)
        if caller is not None:  # (the same binding, of the arguments' origins)
            by_name = signature.bind_partial(*origins[0], **origins[1]).arguments
            for name, origin in by_name.items():
                if signature.parameters[name].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                       inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                       inspect.Parameter.KEYWORD_ONLY):
                    env["<origin>" + name] = origin
            self.callers.append((caller, self.rebinding))
        self.w.reserved |= src.names
        self.stack.append(src)
        try:
            result = self.block(src.node.body, env)
        finally:
            self.stack.pop()
            if caller is not None:
                self.callers.pop()
        self.last_return = self.fresh() if result is None else result.origin
        return None if result is None else result.value

    # -- statements -------------------------------------------------------------------------
    def block(self, stmts: list[ast.stmt], env: dict) -> _Return | None:
        """Run ``stmts``; the writer's line (``where``) is the statement's while it runs,
        and the line it was before once they are done."""
        saved = self.w.where
        try:
            for k, stmt in enumerate(stmts):
                self.w.where = self.src.where(stmt)
                self.rebinding = frozenset()  # (s_Assign says which, for its call)
                start, block = len(self.w.block), self.w.block
                try:
                    absorbed = _absorb(stmts, k)
                    if absorbed is not None:  # if c: return a / rest == if c: return a else: rest
                        return self.s_If(absorbed, env)
                    result = getattr(self, "s_" + type(stmt).__name__, self.s_unknown)(stmt, env)
                    if result is not None:
                        return result
                finally:
                    self.place(block[start:], self.w.where)
            return None
        except RecursionError:  # (caught in the innermost block: where is its statement)
            raise _too_deep(self.w.where or self.src.where(), self.w.who) from None
        finally:
            self.w.where = saved

    def sub_block(self, stmts: list[ast.stmt], env: dict, runs_where: Any = None
                  ) -> tuple[list, _Return | None]:
        """A block of the program inside the current one (a loop's body, a branch of an
        if decided at run time), indented one level deeper in the program's text; a
        branch of an if on loop indices runs at the values ``runs_where`` is True."""
        if len(self.w.nesting) >= _MAX_NESTING:
            where = self.w.nesting[0]
            raise self.w.refuse(
                f"loops and ifs decided at run time nested more than {_MAX_NESTING} "
                f"deep (from line {where.lineno} on; an elif counts as an if in the else "
                f"of the one before)",
                "the program writes each one as a block inside the one before, and Python "
                "allows at most 99 levels of indentation; choose with fewer branches "
                "(mg.where, or an index into a tensor of the choices), or use mode=\"tape\" "
                "for this function")
        self.w.nesting.append(cast(Where, self.w.where))
        self.w.runs_where += [] if runs_where is None else [runs_where]
        try:
            with self.w.into([]) as block:
                result = self.block(stmts, env)
        finally:
            self.w.nesting.pop()
            if runs_where is not None:
                self.w.runs_where.pop()
        return block, result

    def s_unknown(self, node: ast.stmt, env: dict) -> None:
        raise self.w.refuse(f"a {type(node).__name__} statement")

    def s_Pass(self, node: ast.Pass, env: dict) -> None:
        return None

    def s_Expr(self, node: ast.Expr, env: dict) -> None:
        if not isinstance(node.value, ast.Constant):  # a docstring is skipped
            self.expr(node.value, env)

    def s_Assign(self, node: ast.Assign, env: dict) -> None:
        self.rebinding = rebound_by_its_call(node)
        value = self.expr(node.value, env)
        origin = self.origin_of(node.value, env, value)  # (a = b = f(x): one object)
        for target in node.targets:
            self.assign(target, value, env, origin)

    def s_AnnAssign(self, node: ast.AnnAssign, env: dict) -> None:
        """``b: T = a`` is ``b = a`` (Python does not evaluate a local's annotation): the
        same assignment, so b holds a's object too (an update in place of either is then
        refused, as after ``b = a``)."""
        if node.value is not None:
            self.s_Assign(ast.copy_location(ast.Assign([node.target], node.value), node), env)

    def s_AugAssign(self, node: ast.AugAssign, env: dict) -> None:
        """``h += y``: Python's in-place operator on a value of the program, which binds
        ``h + y`` to the name (as every transformation does: ops/operators.py) once the
        result keeps h's shape and dtype, as an update in place must; else ``h = h + y``."""
        assert isinstance(node.target, ast.Name)  # (reading refused the other targets)
        current, value = self.load(node.target.id, env), self.expr(node.value, env)
        update = _IN_PLACE.get(type(node.op))
        if update is not None and (_dynamic(current) or _dynamic(value)):
            others = self.holders(node.target.id, current, env)
            if type(current) is Tensor:  # a constant: maybe a global's or a closure's
                outside: dict[str, Any] = {}  # what the functions being run read of them
                for src in self.stack:
                    outside.update(read_from_outside(src.fn))
                others += [f"{k} (outside the function)"
                           for k in holders_among(outside, current)]
            # Python writes into the object only where its type has the in-place method
            # (a tensor's __iadd__); a number's, or a tuple's, h += y binds h + y to h
            # and leaves the other names as they were
            mutable = hasattr(type(current), f"__{update.__name__}__")
            if others and mutable:
                rebound = ast.unparse(ast.BinOp(node.target, node.op, node.value))
                raise self.w.refuse(
                    f"an update in place of {node.target.id}, whose value (or memory: a "
                    f"view) {' and '.join(others)} {'hold' if len(others) > 1 else 'holds'} "
                    f"too",
                    f"without recording the update writes into the one value, so every name "
                    f"sees the change, but the program binds a new value to one name and the "
                    f"other would keep the old one (as every transformation would: "
                    f"ops/operators.py's refuse_aliased). Write {node.target.id} = "
                    f"{rebound} for a new value, or copy first (b = a * 1.0)")
            self.assign(node.target, self.guard(lambda: update(current, value)), env)
        elif update is not None and isinstance(current, (Tensor, np.ndarray)):
            # a constant tensor or NumPy array: written into now, as eager mode writes (a
            # global's is refused: it is read-only while the program is built,
            # reads.read_only_arrays)
            def write() -> Any:
                try:
                    return update(current, value)
                except ValueError as exc:  # (read-only: say the user's line, not ours)
                    if isinstance(exc, ReadOnlyWrite) and exc.where is None:
                        exc.where = self.w.where  # (a tensor's update)
                    elif type(current) is np.ndarray and not current.flags.writeable:
                        raise ReadOnlyWrite(exc, self.w.where) from exc
                    raise
            self.assign(node.target, self.guard(write), env, self.origin(node.target.id, env))
        else:
            self.assign(node.target, self.binop(node.op, current, value), env)

    def s_Return(self, node: ast.Return, env: dict) -> _Return:
        if node.value is None:
            return _Return(None, self.fresh())
        value = self.expr(node.value, env)
        return _Return(value, self.origin_of(node.value, env, value))

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

    def assign(self, target: ast.expr, value: Any, env: dict, origin: Any = None) -> None:
        """Bind ``value`` to ``target``; ``origin`` says which Python object it is (see
        :meth:`origin`): another name's for ``b = a``, a new one by default."""
        if isinstance(target, ast.Name):
            var = value.value if type(value) is Weak else value  # (s * 3.0: a weak float)
            if type(var) is SrcVar and var.role == "temp" and var.hint is None:
                var.hint = target.id  # the user's name for a forward result
            env[target.id] = value
            env["<origin>" + target.id] = self.fresh() if origin is None else origin
            env.pop("<top>" + target.id, None)  # (bound now: see loop_body)
            return
        if isinstance(target, (ast.Tuple, ast.List)):
            values = list(value)  # a tensor: its rows, x[0], x[1], ... (ArrayOps.__iter__)
            if len(values) != len(target.elts):
                raise ValueError(f"cannot unpack {len(values)} values into "
                                 f"{len(target.elts)} names [source_grad: {self.w.where}]")
            origins = origin if isinstance(origin, list) and len(origin) == len(values) \
                else [None] * len(values)  # (a, b = b, a: each keeps its own object)
            for t, v, o in zip(target.elts, values, origins):
                self.assign(t, v, env, o)
            return
        raise self.w.refuse(f"assignment to a {type(target).__name__}")

    def holders(self, name: str, current: Any, env: dict) -> list[str]:
        """The other names, and items of the lists and tuples they hold, that may hold the
        object ``name`` holds (their origins meet, see :meth:`origin`) or a view of its
        memory: in this function, and in the callers of an inlined call (a parameter is
        the caller's object: ``def step(h): h += 1`` writes into the caller's ``h``)."""
        mine = _flat(self.origin(name, env))
        found = self.held(current, mine, env, skip=name)
        for token in sorted(t for t in mine if type(t) is str and t.startswith("<outside>")):
            outside = token[len("<outside>"):]  # (v = W, W a global tensor: W holds it;
            held_by, _, key = outside.partition("[")  # v = W["w"]: W["w"] does)
            value = self.outside_value(held_by)
            if key:
                try:
                    value = value[ast.literal_eval(key[:-1])]
                except (LookupError, TypeError, ValueError):
                    value = None
            if isinstance(value, (Tensor, np.ndarray)):
                found.append(f"{outside} (outside the function)")
        found += [what for name, what in self.passed.items() if "<own>" + name in mine]
        for depth, (caller, then) in enumerate(reversed(self.callers), 1):
            fn = self.stack[-1 - depth].fn.__name__
            found += [f"{k} (in {fn}, a caller)" for k in self.held(current, mine, caller)
                      if k not in then]
        return found

    def held(self, current: Any, mine: frozenset, env: dict, skip: str = "") -> list[str]:
        """Where ``env`` may hold an object of the origins ``mine`` (:meth:`holders`)."""
        root = _view_root(current)

        def same(v: Any, origin: Any) -> bool:
            if origin is None:  # (an item of a list made elsewhere: unknown, so h counts)
                return v is current
            if _flat(origin) & mine:
                return True
            # (one variable is not one object: x * 1.0 is written as x; a view of its
            # memory is another variable with the same root. A loop variable that starts
            # as a view's base (loop_body) meets the views only: the root variable itself
            # may be what x * 1.0 copied, another object of the same variable)
            return v is not current and root is not None and _view_root(v) is root and \
                (id(current) not in self.bases or v.view_of is not None)

        found = [k[5:] for k, top in env.items()  # (what a loop's last iteration left)
                 if k.startswith("<top>") and k[5:] != skip and top & mine]
        for k, v in env.items():
            if k == skip or k.startswith("<"):
                continue
            origin = self.origin(k, env)
            if type(v) in (list, tuple):  # the list is an object of its own; its items
                items = origin if type(origin) is list and len(origin) == len(v) else \
                    [None] * len(v)
                found += [f"{k}[{i}]" for i, (item, o) in enumerate(zip(v, items))
                          if same(item, o)]
            elif same(v, origin):
                found.append(k)
        return sorted(found)

    def fresh(self) -> frozenset:
        """The origin of a new Python object."""
        return frozenset((next(self.origins),))

    def origin(self, name: str, env: dict) -> Any:
        """Which Python objects ``name`` may hold, as eager mode would have it: a set of
        tokens, one per object made (a list of them for a list or tuple made by a
        display, one per item). Two names whose sets meet may be one object (``b = a``;
        ``b = a if c else d``), whose update in place both would see. A program variable
        cannot say so itself: ``x * 1.0`` is written as ``x``, one variable, where eager
        mode makes a new tensor, and a join variable after an if is a new variable that
        may be an old object. A parameter is the caller's object, or its own."""
        if name not in env:  # a global or closure variable: the module's own object
            return frozenset(("<outside>" + name,))
        return env.get("<origin>" + name, frozenset(("<own>" + name,)))

    def origin_of(self, expr: ast.expr, env: dict, value: Any = _MISSING) -> Any:
        """The origin of what ``expr`` evaluated to (``value``): a name's, a tuple's per
        item, the objects an expression can pass through (``a if c else b``, ``+a``, an
        inlined function returning its argument, a call or subscript whose value is a
        name's or an item's it reads: ``mg.add_n([h])``, ``[h][0]``), and otherwise a new
        object."""
        if isinstance(expr, ast.Name):
            return self.origin(expr.id, env)
        if isinstance(expr, (ast.Tuple, ast.List)):
            return [self.origin_of(e, env) for e in expr.elts]
        if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):
            origins = self.origin(expr.value.id, env)  # (hs[0]: the item's own object)
            index = expr.slice.value if isinstance(expr.slice, ast.Constant) else None
            if type(origins) is list:
                if type(index) is int and -len(origins) <= index < len(origins):
                    return origins[index]
                return _flat(origins)  # (hs[i]: any of them)
            if index is not None:  # (W["w"] of a dict or list made elsewhere: the same
                # object on every read, since f cannot assign an item: reading.py)
                return frozenset(f"{t}[{index!r}]" for t in origins)
        if isinstance(expr, ast.IfExp):
            return _flat(self.origin_of(expr.body, env)) | _flat(self.origin_of(expr.orelse,
                                                                                 env))
        if isinstance(expr, ast.BoolOp):
            return frozenset().union(*(_flat(self.origin_of(v, env)) for v in expr.values))
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.UAdd):
            return self.origin_of(expr.operand, env)  # (+a is a itself)
        if isinstance(expr, ast.Call):
            if id(expr) in self.returned:
                return self.returned.pop(id(expr))
        if isinstance(expr, (ast.Call, ast.Subscript)) and _dynamic(value):
            # The same variable as a name the call or subscript reads, or as an item of
            # one: maybe the same object, which cannot be told ([h][0], mg.add_n([h]),
            # mg.add_n(hs), x.astype(x.dtype, copy=False)); an update in place of it is
            # then refused (holders) rather than guessed to be a new object's.
            return frozenset().union(self.fresh(), *(
                _holding(env.get(n.id, _MISSING), self.origin(n.id, env), value)
                for n in ast.walk(expr) if isinstance(n, ast.Name)))
        return self.fresh()

    # -- if -----------------------------------------------------------------------------------
    def s_If(self, node: ast.If, env: dict) -> _Return | None:
        while True:
            test, negate = node.test, False
            while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, negate = test.operand, not negate
            cond = self.expr(test, env)
            if isinstance(cond, (SrcVar, Cond)):
                then, orelse = (node.orelse, node.body) if negate else (node.body, node.orelse)
                return self.dynamic_if(cond, then, orelse, env)
            if _dynamic(cond):
                raise self.w.refuse("an if on this run-time value")
            branch = node.body if bool(cond) != negate else node.orelse
            if not (branch is node.orelse and len(branch) == 1 and isinstance(branch[0], ast.If)):
                return self.block(branch, env)
            # an elif: the If alone in the else, taken here rather than by a call of block
            # per branch (a dispatch of 600 elifs would nest 1800 calls: a RecursionError)
            node = branch[0]
            self.w.where = self.src.where(node)  # (block puts back its own when done)

    def dynamic_if(self, cond: Any, then: list, orelse: list, env: dict) -> _Return | None:
        """Both branches are written; which one runs is decided by ``cond`` at run time."""
        if type(cond) is SrcVar and math.prod(cond.shape) != 1:
            raise self.w.refuse(f"an if on a value of shape {cond.shape}",
                                "an if needs one value; use mg.where to choose elementwise")
        envs = [dict(env), dict(env)]
        # (an if on loop indices: where each branch runs, for Python's arithmetic in it,
        # which values.py checks only there: ``if i > 0: s / i`` divides by no 0)
        runs = (cond.values, ~cond.values) if type(cond) is Cond else (None, None)
        self.dynamic += 1
        try:
            (b1, r1), (b2, r2) = (self.sub_block(then, envs[0], runs[0]),
                                  self.sub_block(orelse, envs[1], runs[1]))
        finally:
            self.dynamic -= 1
        if (r1 is None) != (r2 is None):
            raise self.w.refuse("return in only one branch of an if decided at run time",
                                "return in both branches, or assign and return after the if")
        names = _assigned(then + orelse)
        if r1 is not None:
            assert r2 is not None  # (returns in one branch only were refused above)
            envs[0]["<return>"], envs[1]["<return>"] = r1.value, r2.value
            names.append("<return>")
        joins = [j for n in names for j in self.join(n, envs, (b1, b2), env)]
        for n in names:  # (after the if, a name may hold the object of either branch)
            if n in envs[0] and n in envs[1]:
                a, b = self.origin(n, envs[0]), self.origin(n, envs[1])
                env["<origin>" + n] = a if a == b else _flat(a) | _flat(b)
        self.w.block.append(If(cond, b1, b2, tuple(joins)))
        if r1 is None:
            return None
        assert r2 is not None
        returned = env["<return>"]
        if isinstance(returned, _OneBranch):  # (the caller reads it without load: refused
            raise self.w.refuse(                # here, where load would refuse a name)
                f"returning different Python values (numbers, strings, ...) from the two "
                f"branches of the if at line {returned.where.lineno}, decided at run time",
                "the program is written once for both branches, so what is returned must "
                "be a tensor (or a tuple or list of them) on both; return tensors, or "
                "decide with an if on a value known when the program is built")
        return _Return(returned, _flat(r1.origin) | _flat(r2.origin))

    def join(self, name: str, envs: list, blocks: tuple, env: dict) -> list[SrcVar]:
        """The value of ``name`` after the if, bound in ``env``; the join variables it
        needs (one per tensor assigned in both branches)."""
        a, b = envs[0].get(name, _MISSING), envs[1].get(name, _MISSING)
        joins: list[SrcVar] = []
        if a is not _MISSING or b is not _MISSING:
            env[name] = self.joined(name, a, b, blocks, joins)
        return joins

    def joined(self, name: str, a: Any, b: Any, blocks: tuple, joins: list) -> Any:
        """What ``name`` holds after the if, ``a`` after one branch and ``b`` after the
        other: the same value, a join variable (appended to ``joins``), a tuple or list
        of them, or a :class:`_OneBranch` that :meth:`load` refuses."""
        if a is b:
            return a
        if a is _MISSING or b is _MISSING:
            return _OneBranch(cast(Where, self.w.where))
        if isinstance(a, _OneBranch) or isinstance(b, _OneBranch):  # (unassigned on a path
            return a if isinstance(a, _OneBranch) else b            # through an earlier if)
        if not _dynamic(a) and not _dynamic(b) and type(a) is type(b) and \
                not isinstance(a, (Tensor, np.ndarray)) and a == b:
            return a
        if type(a) in (tuple, list) and type(a) is type(b) and len(a) == len(b):
            # (return p * 2.0, p in both branches: item by item; an item that cannot be
            # joined makes the whole a marker, so that none hides inside a tuple)
            items = [self.joined(f"{name}[{k}]", x, y, blocks, joins)
                     for k, (x, y) in enumerate(zip(a, b))]
            if any(isinstance(v, _OneBranch) for v in items):
                return _OneBranch(cast(Where, self.w.where), values=True)
            return type(a)(items)
        if Weak in (type(a), type(b)) and _weak_kind(a) == _weak_kind(b):
            # a Python number of one kind on both paths (s, s * 2.0, 0.5): it stays one,
            # weak; a literal is filled exactly (float64 holds every Python float)
            w = a if type(a) is Weak else b
            va, vb = (self.as_var(v.value if type(v) is Weak else v, w.value, name, blk)
                      for v, blk in zip((a, b), blocks))
            j = SrcVar((), w.dtype, w.device, va.active or vb.active, "join", name)
            for v, blk in zip((va, vb), blocks):
                blk.append(Line((j,), Ref((v,)), "join"))
            joins.append(j)
            return Weak(j)
        if Weak in (type(a), type(b)):
            raise self._weak_on_a_path(name, a, b)
        like = a if type(a) is SrcVar else b
        if type(like) is not SrcVar:  # (refused where it is read: load)
            return _OneBranch(cast(Where, self.w.where), values=True)
        if (_number(a) or _number(b)) and like.shape == ():  # (other shapes: as_var refuses)
            raise self._number_on_a_path(name, a if _number(a) else b, like)
        va, vb = (self.as_var(v, like, name, blk) for v, blk in zip((a, b), blocks))
        if (va.shape, va.dtype, va.device.name) != (vb.shape, vb.dtype, vb.device.name):
            raise self.w.refuse(
                f"{name} with shape {va.shape} {va.dtype} after one branch and {vb.shape} "
                f"{vb.dtype} after the other", "the program is written for one shape")
        j = SrcVar(va.shape, va.dtype, va.device, va.active or vb.active, "join", name)
        for v, blk in zip((va, vb), blocks):
            blk.append(Line((j,), Ref((v,)), "join"))
        joins.append(j)
        return j

    def as_var(self, v: Any, like: SrcVar, name: str, block: list) -> SrcVar:
        """A value as a variable of ``like``'s kind: constants are lifted, numbers filled."""
        if type(v) is SrcVar:
            return v
        if type(v) is Weak:  # a loop variable starting as a Python float argument: in the
            if like.shape != ():  # loop's dtype, as a number (Fill, below)
                raise self.w.refuse(
                    f"{name} starting as a Python float argument and becoming a tensor of "
                    f"shape {like.shape} in the loop",
                    f"start it with the right shape, e.g. mg.zeros({like.shape}, ...)")
            with self.w.into(block):
                return C.astype(v.value, like.dtype, copy=False)
        if isinstance(v, Tensor):
            return _constant(v)
        if type(v) in (int, float, bool) and like.shape == ():
            filled = SrcVar((), like.dtype, like.device, False, "const", name)
            block.append(Line((filled,), Fill(v, filled)))
            return filled
        raise self.w.refuse(f"{name} being {v!r} on one path and a tensor of shape "
                            f"{like.shape} on another", "make it a tensor on every path "
                            "(for example mg.zeros(shape, dtype, device))")

    def _weak_on_a_path(self, name: str, a: Any, b: Any) -> SourceTransformError:
        """A Python float argument (or arithmetic on it) that meets a tensor, or a Python
        number of another kind, where the paths of an if join: in eager mode the dtypes
        that follow can differ by path (ops/weak.py); one variable has one."""
        if _number(b if type(a) is Weak else a):
            ka, kb = ("float" if type(v) is Weak else type(v).__name__ for v in (a, b))
            return self.w.refuse(
                f"{name} holding a Python {ka} on one path of an if and a Python {kb} on "
                "the other",
                "Python's kinds of number promote differently (x32 * 2 and x32 * 2.0 "
                "agree, xi32 * 2 and xi32 * 2.0 do not): write the number as the other's "
                "kind (2.0)")
        return self.w.refuse(
            f"{name} holding a Python float argument (or Python arithmetic on it) on one "
            f"path of an if and a tensor on the other",
            "a Python float takes the dtype of the tensors it meets, so its variable "
            "would have a different dtype on each path: make it a tensor of the dtype "
            "you want before the if (s = mg.astype(s, 'float32'))")

    def _number_on_a_path(self, name: str, number: Any, like: SrcVar) -> SourceTransformError:
        """A Python number on one path of an if and a tensor on the other. In eager mode
        the number is weak (it takes the dtype of what it meets: x32 * 0.1 is float32) and
        keeps its float64 value, while the tensor keeps its dtype: one variable of one
        dtype cannot be both (filled as float32, 0.1 would lose digits; as float64, x32 * t
        would become float64)."""
        return self.w.refuse(
            f"{name} being the Python number {number!r} on one path of an if and a "
            f"{like.dtype} tensor of shape {like.shape} on another",
            f"a Python number takes the dtype of the tensors it meets, so {name}'s dtype "
            "would depend on the path: make it a tensor on every path, "
            f"e.g. mg.tensor({number!r}, dtype={like.dtype!r})")

    # -- for ------------------------------------------------------------------------------------
    def s_For(self, node: ast.For, env: dict) -> None:
        """``for i in range(n)``: the body is written once; loop variables carry values.

        A loop variable that starts as a Python number and becomes a tensor is read as
        the number, weak, in eager mode's first iteration only; where that iteration
        would compute otherwise than the loop's body (:meth:`first_iteration`), it is
        written on its own, as straight code with ``i`` its first value, and the loop
        covers the others."""
        rng = self.expr(node.iter, env)
        if not isinstance(rng, range):
            over = "a tensor's rows" if isinstance(rng, SrcVar) else f"a {type(rng).__name__}"
            raise self.w.refuse(f"a for loop over {over}",
                                "loop with for i in range(n), n known when the program is "
                                "built (a tensor's rows: for i in range(len(x)), then x[i])")
        assert isinstance(node.target, ast.Name)  # (reading refused the other targets)
        name = node.target.id
        if isinstance(env.get(name), Index):
            raise self.w.refuse(f"a nested loop reusing the index name {name}")
        if len(rng) == 0:
            return None
        loads_in = _loads(node.body)
        carried = [n for n in _assigned(node.body)
                   if n != name and (n in env or self.src.loads[n] > loads_in[n])]
        # a carried name that the body binds before reading it (an inner loop's index
        # reused from an earlier loop, j = 0) starts each iteration unread: the loop
        # variable starts from nothing, not from what it held before the loop
        top = {k: v for k, v in env.items()
               if k not in carried or not _bound_before_read(node.body, k)}
        index, body, lvs, ends, weak = self.loop_body(node, name, rng, carried, top)
        end_origins = self.end_origins
        differs = self.first_iteration(lvs, weak, body, top)
        if differs is not None:
            env[name] = rng[0]  # the first iteration, as Python runs it
            if self.block(node.body, env) is not None:  # (reading refused return in a loop)
                raise MinigraphError("source_grad: internal error: return in a loop")
            if len(rng) == 1:
                return None
            rng = rng[1:]
            top = {k: v for k, v in env.items()
                   if k not in carried or not _bound_before_read(node.body, k)}
            index, body, lvs, ends, weak = self.loop_body(node, name, rng, carried, top)
            end_origins = self.end_origins
            again = self.first_iteration(lvs, weak, body, top)
            if again is not None:  # (a variable that becomes a tensor only in the second)
                raise again
        self.emit_loop(index, rng, body, lvs, ends, top)
        for n, lv in lvs.items():  # (after the loop, h is its last iteration's: a view of
            if _view_root(ends[n]) is not lv.view_of:  # the first value's memory only if
                lv.view_of = None                       # the body keeps it one)
        for n in carried:
            if n in lvs:
                env[n] = Weak(lvs[n]) if n in weak else lvs[n]
            elif not _dynamic(ends[n]) and ends[n] is not _MISSING:
                env[n] = ends[n]
            if n in end_origins:  # (the loop ran: the object of its last iteration's end)
                env["<origin>" + n] = end_origins[n]
        for n in _assigned(node.body):
            if n not in carried and n != name:
                env.pop(n, None)
        # after the loop the index holds its last iteration's end: the range's last
        # value, or what the body rebound it to (i = i + 1) at that value
        env[name] = _last(ends[name], self.loops)
        if env[name] is _MISSING:
            if self.src.loads[name] > loads_in[name]:  # (read elsewhere in the function)
                raise self.w.refuse(
                    f"reading {name} after the loop, whose body rebinds it to a value known "
                    "only when the program runs (a tensor, or arithmetic on the index of "
                    "an enclosing loop)",
                    "after the loop, compute the value again from what it depends on")
            env.pop(name)
        return None

    def loop_body(self, node: ast.For, name: str, rng: range, carried: list, env: dict
                  ) -> tuple[Index, list, dict, dict, set]:
        """The loop's index, its body written once, its loop variables, what each carried
        name holds at the end of the body, and the names of the weak loop variables."""
        index = Index(self.index_name(name), _loop_values(rng, self.loops))
        # What each loop variable is (shape, dtype, device, active) comes from its value
        # before the loop and at the end of the body, so writing the body may change it
        # (h = 0.0 becomes a tensor; an inactive h is assigned an active value): the body
        # is written again until nothing changes. A round can only turn None into a
        # tensor's spec or inactive into active, so the rounds end.
        # Likewise the objects the body's names may hold at its top: before the loop's
        # first iteration, or what the body left in them (``b = a`` at its end makes b
        # and a one object from the second iteration on): the rounds go on until which
        # names may share an object no longer changes (see :meth:`origin`).
        specs = {n: _spec(env.get(n, _MISSING)) for n in carried}
        names = _assigned(node.body)
        viewed = {id(v.view_of) for v in env.values()
                  if type(v) is SrcVar and v.view_of is not None}
        tops: dict[str, frozenset] = {}  # name -> what the body's ends left in it
        while True:
            lvs = {n: SrcVar(*s[:4], "loop", n) for n, s in specs.items() if s is not None}
            for n, lv in lvs.items():  # (in eager mode the first iteration's h is the
                # memory h held before the loop: a view taken of it then, v = h[1:], sees
                # h += w there, so the update must meet v, as it does without the loop)
                first = env.get(n, _MISSING)
                root = _view_root(first)
                if root is not None and id(root) in viewed:
                    lv.view_of = root
                    if first is root:  # (h itself, not a view of it: see held)
                        self.bases.add(id(lv))
            weak = {n for n, s in specs.items() if s is not None and s.weak}
            body_env = {**env, name: index,
                        **{n: Weak(lv) if n in weak else lv for n, lv in lvs.items()}}
            for n, top in tops.items():  # (a name the body has not bound yet: "<top>")
                key = "<origin>" + n if n in env else "<top>" + n
                body_env[key] = _flat(self.origin(n, env)) | top if n in env else top
            before = _sharing(body_env, names)
            self.loops += 1
            self.indices.append(index.text)
            try:
                body, _ = self.sub_block(node.body, body_env)
            finally:
                self.loops -= 1
                self.indices.pop()
            ends = {n: body_env.get(n, _MISSING) for n in [*carried, name]}
            self.end_origins = {n: body_env["<origin>" + n] for n in carried
                                if "<origin>" + n in body_env}
            tops = {n: tops.get(n, frozenset()) | _flat(body_env["<origin>" + n])
                    for n in names if "<origin>" + n in body_env}
            for n, top in tops.items():  # (what the next round's top will hold)
                body_env["<origin>" + n] = _flat(self.origin(n, env)) | top \
                    if n in env else top
            settled = {n: self.settle(n, env.get(n, _MISSING), ends[n], specs[n])
                       for n in carried}
            if settled == specs and _sharing(body_env, names) == before:
                return index, body, lvs, ends, weak
            specs = settled

    def place(self, block: list, where: Where) -> None:
        """Remember ``where`` as the user's line of the lines in ``block`` that have none
        yet (an inner statement's lines were placed at its own line, before)."""
        for stmt in _walk(block):
            if isinstance(stmt, Line):
                self.places.setdefault(id(stmt), (stmt, (where.filename, where.lineno)))

    def index_name(self, name: str) -> str:
        """The program's name for the index the user named ``name``: the user's, unless
        the program's text uses it already (a parameter, a global, an enclosing loop's
        index) or it starts with _ as the kernel text's globals do (``_xp``); then the
        first free of ``k_1``, ``k_2`` ... (``_xp`` -> ``xp``). The same for every round
        of one loop's body (the enclosing loops are the same)."""
        used = self.taken | set(self.indices)
        if name in used or name.startswith("_"):
            base = name.strip("_") or "i"
            name = next(n for n in itertools.chain([base], (f"{base}_{k}" for k in
                                                             itertools.count(1)))
                        if n not in used and n not in self.w.reserved)
        self.index_names.add(name)
        return name

    def settle(self, name: str, init: Any, end: Any, spec: _Spec | None) -> _Spec | None:
        """What loop variable ``name`` must be, after a round that ended with ``end``: None
        while it is a Python value that stays the same."""
        if end is _MISSING:
            return spec
        if type(end) is Weak or spec is not None and spec.weak:
            return self.settle_weak(name, init, end, spec)
        if type(end) is not SrcVar:
            if spec is None and (init is end or (_number(init) and _number(end) and init == end)):
                return None  # the same Python value on every iteration: nothing to carry
            if spec is None and not (init is _MISSING and not _dynamic(end)):
                raise self.w.refuse(f"{name} changing from one iteration to the next as a "
                                    "Python value", "make it a tensor")
            return spec
        if spec is None:
            if _number(init) and end.shape != ():
                raise self.w.refuse(
                    f"{name} starting as the number {init!r} and becoming a tensor of "
                    f"shape {end.shape} in the loop",
                    f"start it with the right shape, e.g. mg.zeros({end.shape}, ...)")
            return _spec(end)
        if (spec.shape, spec.dtype, spec.device.name) != (end.shape, end.dtype, end.device.name):
            raise self.w.refuse(
                f"{name} changing shape or dtype in the loop, from {spec.shape} {spec.dtype} "
                f"to {end.shape} {end.dtype}", "a loop variable keeps one shape and dtype")
        return spec._replace(active=spec.active or end.active)

    def settle_weak(self, name: str, init: Any, end: Any, spec: _Spec | None) -> _Spec:
        """A loop variable that Python's arithmetic on a float argument keeps a Python
        number (``t = s``, then ``t = t * 2.0``): a weak variable (ops/weak.py)."""
        if type(end) is Weak and (spec is None and (type(init) is Weak or _number(init))
                                  or spec is not None and spec.weak and spec.dtype == end.dtype):
            return _Spec((), end.dtype, end.device,
                         end.value.active or spec is not None and spec.active, True)
        raise self.w.refuse(f"{name} changing between a tensor and a Python float argument "
                            f"(or Python arithmetic on one) in the loop",
                            "make it a tensor of the dtype you want before the loop "
                            "(t = mg.astype(s, 'float32'))")

    def first_iteration(self, lvs: dict, weak: set, body: list, env: dict
                        ) -> SourceTransformError | None:
        """Why the loop's body would not compute eager mode's first iteration, if it
        would not. A loop variable that starts as a Python number (``acc = 0.0``, or a
        float argument) and becomes a tensor is read in the first iteration as the
        number, weak; the body reads ``lv``, filled with it in the loop's dtype. The two
        agree where every operation on ``lv`` (or on an alias of it: a join, an inner
        loop's start) computes in that dtype both ways, ``acc + x[i]``: the weak number is
        then cast to it, as the fill is. ``x32 * h`` with ``h`` float64 from the second
        iteration on is float32 in eager mode's first one; ``h * 0.3`` is float64 there,
        a Python float's arithmetic."""
        weak_before = {id(v.value): AS_NUMBER.get(str(v.dtype), 1.0)
                       for v in env.values() if type(v) is Weak}
        weak_before.update({id(lvs[n]): 1.0 for n in weak})
        for name, lv in lvs.items():
            number = env.get(name)
            if name in weak or not (_number(number) or type(number) is Weak):
                continue
            if type(number) is Weak:  # (a float argument: a Python float stands for it)
                number, what = AS_NUMBER.get(str(number.dtype), 1.0), "a Python float argument"
            else:
                what = f"the Python number {number!r}"
            why = self.read_otherwise(lv, number, body, weak_before)
            if why is not None:
                return self.w.refuse(
                    f"{name} starting as {what} before a loop that makes it a {lv.dtype} "
                    f"tensor, and becoming one only in its second iteration ({why})",
                    "in eager mode an iteration reads the number, which takes the dtype of "
                    "what it meets: start with a tensor of the loop's dtype, e.g. "
                    f"{name} = mg.astype({name}, {lv.dtype!r}) before the loop")
        return None

    @staticmethod
    def read_otherwise(lv: SrcVar, number: Any, body: list, weak_before: dict
                       ) -> str | None:
        """How an operation of ``body`` would compute otherwise in the first iteration,
        with ``number`` in ``lv``'s place, or None where none would.

        ``weak`` maps the variables that are Python numbers in that iteration to a
        number of their kind: ``lv``, the float arguments (``weak_before``), and what
        Python's arithmetic makes of them, casts included (``x * s`` casts ``s`` only
        because it meets ``x``). An operation on such values alone is Python's arithmetic
        there, in float64: the program must compute in float64 too. One that meets a
        tensor casts them to the dtype ``promote`` gives them as numbers: the program must
        compute in that dtype, with them in it. (Where a value is a number only in the
        eyes of this walk, the answer can only be a needless "otherwise".)"""
        weak = {id(lv): number, **weak_before}
        for stmt in _walk(body):
            e = getattr(stmt, "expr", None)
            if isinstance(e, Ref):
                weak.update((id(t), weak[id(v)]) for t, v in zip(stmt.targets, e.values)
                            if id(v) in weak)
                continue
            read = [v for v in _uses(stmt) if id(v) in weak]
            if not read:
                continue
            if not (isinstance(e, Op) and all(any(a is v for a in e.args) for v in read)):
                return "it is read where the program cannot follow both"
            args = [a for a in e.args if _has_dtype(a)]
            strong = promote(*args)
            as_numbers = promote(*(weak.get(id(a), a) for a in args))
            if e.prim.name == "astype" and len(args) == 1:  # (a cast of a number: in
                weak[id(stmt.targets[0])] = weak[id(args[0])]  # eager mode, no cast)
                continue
            if strong != as_numbers or any(a.dtype != strong for a in read):
                return (f"{e.prim.name} computes in {as_numbers} with the number and in "
                        f"{strong} with the tensor")
            if all(id(a) in weak or _number(a) for a in args):
                for t in stmt.targets:
                    weak[id(t)] = AS_NUMBER.get(str(t.dtype), 1.0)
        return None

    def emit_loop(self, index: Index, rng: range, body: list, lvs: dict, ends: dict,
                  env: dict) -> None:
        """Initial values before the loop, the carry at the end of its body, the loop."""
        for n, lv in lvs.items():
            init = env.get(n, _MISSING)
            if isinstance(init, _OneBranch):  # (unassigned on a path into the loop: the
                continue                      # body assigns it before reading it, or refuses)
            if _number(init):
                self.w.emit((lv,), Fill(init, lv))
            elif init is not _MISSING:
                self.w.emit((lv,), Ref((self.as_var(init, lv, n, self.w.block),)))
        pairs = []
        starts = {id(v) for v in lvs.values()}
        for n, lv in lvs.items():
            end = ends[n]
            if end is not lv and end is not _MISSING:
                value = self.as_var(end, lv, n, body)
                if id(value) in starts:  # b = a (a, b = c, a; a, b = b, a): b takes a's
                    # value from the top of the body, which the carry overwrites. A
                    # copy gives that value a variable of its own, so that the reverse
                    # sweep sends gb to the a that was read, not to the a the carry makes.
                    copy = SrcVar(value.shape, value.dtype, value.device, value.active,
                                  "temp", n)
                    body.append(Line((copy,), Ref((value,))))
                    value = copy
                pairs.append((lv, value))
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
            if isinstance(v, _OneBranch) and v.values:
                raise self.w.refuse(
                    f"reading {name}, which holds different Python values after the two "
                    f"branches of the if at line {v.where.lineno}, decided at run time",
                    "make it a tensor in both branches")
            if isinstance(v, _OneBranch):
                raise self.w.refuse(
                    f"reading {name}, which the if at line {v.where.lineno} assigns in one "
                    "branch only", "assign it in both branches (or before the if)")
            return v
        src = self.src
        if name in src.code.co_varnames:  # (a name the function assigns is its local
            # everywhere in it, as Python compiles it: unbound here, never the global)
            if self.loops and any(name in _assigned(loop.body) for loop in ast.walk(src.node)
                                  if isinstance(loop, ast.For)):
                # (Python may read what an earlier iteration assigned)
                raise self.w.refuse(
                    f"reading {name}, a local variable of {src.fn.__name__}, in a loop's body "
                    f"before it is assigned",
                    "Python raises UnboundLocalError in the first iteration, or, where an if "
                    "skips the read there, reads what an earlier iteration assigned, which "
                    "source mode carries only for names assigned before the loop; assign "
                    f"{name} before the loop")
            raise UnboundLocalError(f"cannot access local variable {name!r} where it is not "
                                    f"associated with a value [source_grad: {self.w.where}]")
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
        # (a builtin that reads the frame calling it would read this module's, not f's;
        # vars(obj) and dir(obj) read obj's and are fine)
        if name == "globals":
            return lambda: src.fn.__globals__  # type: ignore[attr-defined]
        if name in ("locals", "vars", "dir", "eval", "exec"):
            builtin = getattr(builtins, name)

            def frameless(*args: Any) -> Any:
                if name in ("vars", "dir") and args:
                    return builtin(*args)
                raise self.w.refuse(
                    f"{name}(), which reads the names of the function calling it",
                    "source mode runs f's statements itself, in minigraph's code; name "
                    "the value (W, obj.attr, getattr(obj, 'attr'))")
            return frameless
        if name == "super":
            return self.zero_argument_super(env)
        if hasattr(builtins, name):
            return getattr(builtins, name)
        raise NameError(f"name {name!r} is not defined [source_grad: {self.w.where}]")

    def zero_argument_super(self, env: dict) -> Callable[..., Any]:
        """``super`` as the method being run sees it. Python's ``super()`` without
        arguments reads the frame that calls it, its function's ``__class__`` cell and
        first argument, which is minigraph's frame here (Python raised "super(): no
        arguments"); so it is ``super(__class__, self)`` of the method's own, and the
        method it finds is read and inlined as any other."""
        src = self.src
        first = src.code.co_varnames[:min(src.code.co_argcount, 1)]

        def zero_argument_super(*args: Any) -> Any:
            if args:  # (super(Base, self) names both itself)
                return super(*args)
            # (where Python cannot either, its own error: in a function without a first
            # argument, or outside a class body)
            problem = "no arguments" if not first or first[0] not in env else \
                "__class__ cell not found" if "__class__" not in src.closure else None
            if problem is not None:
                raise RuntimeError(f"super(): {problem} [source_grad: {self.w.where}]")
            return super(src.closure["__class__"].cell_contents, env[first[0]])
        return zero_argument_super

    def outside_value(self, name: str) -> Any:
        """The value of a closure or global variable of the function being run (None if
        there is none)."""
        src = self.src
        if name in src.closure:
            try:
                return src.closure[name].cell_contents
            except ValueError:
                return None
        return src.fn.__globals__.get(name)  # type: ignore[attr-defined]

    def outside(self, name: str, v: Any, how: str) -> Any:
        """``v``, the value of ``name`` that the function reads from outside (``how``: a
        closure's or a global's); refused where it is an enclosing transformation's,
        which only flows through the program as an argument."""
        if type(v) is BatchTracer:  # (vmap batches; it does not differentiate)
            raise self.w.refuse(
                f"a function that {how} {name}, one example of the batch of an enclosing "
                "mg.vmap",
                f"pass {name} as an argument so that the batch flows through the program")
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
            base = _constant(base)
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
        try:
            return self.guard(lambda: _BINOPS[type(op)](left, right))
        except TypeError as exc:
            if not (_dynamic(left) or _dynamic(right)):
                raise
            if isinstance(exc, MinigraphError):  # (the op's own refusal, with the line:
                raise  # a dtype no kernel takes, np.uint8(200) * x, is no missing operator)
            if isinstance(left, Index) or isinstance(right, Index):
                raise self.w.refuse(f"the operator {type(op).__name__} on a loop index",
                                    "a loop index takes part in +, -, *, /, //, %, ** and "
                                    "abs() only") from None
            if isinstance(left, Cond) or isinstance(right, Cond):  # (i > 0 as a number)
                raise self.w.refuse(f"the operator {type(op).__name__} on a comparison of "
                                    f"a loop index", "it is the condition of an if (or "
                                    "the divisor of a float argument), not a number: write "
                                    "the if") from None
            raise self.w.refuse(f"the operator {type(op).__name__} on values of the "
                                "program", "minigraph has no primitive for it") from None

    def e_UnaryOp(self, node: ast.UnaryOp, env: dict) -> Any:
        v = self.expr(node.operand, env)
        if _dynamic(v) and isinstance(node.op, (ast.Not, ast.Invert)):
            raise self.w.refuse(f"{type(node.op).__name__.lower()} on a value of the program",
                                "use an if with the branches swapped, or mg.where")
        return self.guard(lambda: _UNARYOPS[type(node.op)](v))

    def e_Compare(self, node: ast.Compare, env: dict) -> Any:
        values = [self.expr(node.left, env)] + [self.expr(c, env) for c in node.comparators]
        dynamic = any(_dynamic(v) for v in values)
        if dynamic and len(node.ops) == 1 and type(node.ops[0]) in (ast.Is, ast.IsNot) \
                and not all(_dynamic(v) for v in values):
            # (`if bias is not None`: a value of the program is never the other object,
            # whatever its value turns out to be; two values of the program may be one)
            return type(node.ops[0]) is ast.IsNot
        if dynamic and (len(node.ops) > 1 or type(node.ops[0]) not in
                        (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)):
            raise self.w.refuse("a chained or identity comparison of values of the program",
                                "compare two values with <, <=, >, >=, == or !=")
        result: Any = True
        for k, (op, a, b) in enumerate(zip(node.ops, values, values[1:])):
            result = self.guard(lambda: _COMPARE[type(op)](a, b))
            # a < b < c is (a < b) and (b < c): Python asks bool() of every comparison
            # but the last, never of a lone one (W > 0 with W an array is the array)
            if not dynamic and k < len(node.ops) - 1 and not result:
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
                origins = (tuple(self.fresh() for _ in self_arg)
                           + tuple(self.origin_of(a, env) for a in node.args),
                           {cast(str, k.arg): self.origin_of(k.value, env)
                            for k in node.keywords})
                result = self.call(_read(inlined, self.w.who), self_arg + args, kwargs, env,
                                   origins)
                self.returned[id(node)] = self.last_return  # (for origin_of(node))
                return result
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
        """Run Python now; point minigraph errors at the user's line. Gradients are on
        while it runs, whatever the caller's block (an outer no_grad does not count for a
        transformation), so that a ``with mg.no_grad():`` in a function that f calls is
        seen: its values get no adjoint (values.py's ``_op``)."""
        try:
            with tape.enable_grad():
                return thunk()
        except SourceTransformError:
            raise
        except MinigraphError as exc:
            raise _located(exc, self.w.where) from None
        except ArithmeticError as exc:
            if not self.dynamic:  # (eager mode raises it here too: the user's own error)
                raise
            # eager mode computes this only where its path is taken
            raise self.w.refuse(
                f"Python arithmetic that raises {type(exc).__name__} ({exc}) on a path of "
                f"an if decided at run time",
                "source mode computes Python numbers while it writes the program, on both "
                "paths; compute this one with minigraph functions, which run when the "
                "program does, or outside the if") from None
        except Exception as exc:
            if self.w.where is not None and hasattr(exc, "add_note"):
                exc.add_note(f"while source_grad was writing the program: {self.w.where}")
            raise


def _bound_before_read(stmts: list[ast.stmt], name: str) -> bool:
    """Whether ``stmts`` never read the value ``name`` holds before them: a statement
    assigns it (``j = 0``) before any reads it, or a ``for`` over it (an inner loop's
    index: its body reads its own binding) comes first and nothing after it reads it
    (the loop may run no iteration). Anything else that reads or may assign it counts
    as a read."""
    looped = False
    for stmt in stmts:
        if isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name) and \
                stmt.target.id == name and name not in _loads([ast.Expr(stmt.iter)]):
            looped = True
        elif name in _loads([stmt]):
            return False
        elif name in _assigned([stmt]):  # (h += 1 reads h; an if may not assign it)
            return isinstance(stmt, ast.Assign)
    return looped


def _view_root(v: Any) -> SrcVar | None:
    """The variable whose memory ``v`` shares in eager mode: itself, or what a chain of
    views (``y[:1]``, ``mg.reshape(y, ...)``) was made from; None for a number."""
    if type(v) is not SrcVar:
        return None
    return v if v.view_of is None else v.view_of


def _last(v: Any, depth: int) -> Any:
    """What a loop's index holds after the loop, ``v`` being its value at the end of the
    body (the index, or what the body rebound it to: ``i = i + 1``): its value in the
    last iteration; _MISSING where that is known only when the program runs. The loop is
    nested ``depth`` deep, so its index's values lie along axis ``depth``
    (values._loop_values): at the last of them, arithmetic on the index is a Python
    number, unless it also changes with an enclosing loop's index (``i + j``). A
    Python value, or an enclosing loop's index, is the same in every iteration."""
    if not _dynamic(v):
        return v
    if type(v) is Index:
        if v.values.ndim <= depth:  # (not this loop's: an enclosing one's)
            return v
        last = np.unique(v.values[..., -1])
        if last.size == 1:
            return last.item()
    return _MISSING


def _absorb(stmts: list[ast.stmt], k: int) -> ast.If | None:
    """Statement k if it is an if one of whose branches ends in return, with the statements
    after it moved into its other branch (the same program: they run exactly when that
    branch does)."""
    stmt = stmts[k]
    if not isinstance(stmt, ast.If) or k + 1 == len(stmts):
        return None
    rest = stmts[k + 1:]  # (copied for an if only, not for every line of a long body)
    returns = [bool(b) and isinstance(b[-1], ast.Return) for b in (stmt.body, stmt.orelse)]
    if returns == [True, False]:
        return ast.copy_location(ast.If(stmt.test, stmt.body, stmt.orelse + rest), stmt)
    if returns == [False, True]:
        return ast.copy_location(ast.If(stmt.test, stmt.body + rest, stmt.orelse), stmt)
    return None


class _Spec(NamedTuple):
    """What a loop variable is: the arguments of its SrcVar, and whether it is weak."""
    shape: tuple[int, ...]
    dtype: str
    device: Device
    active: bool  # (it depends on a differentiated input)
    weak: bool = False  # (a Python float argument's: handed to the body as a Weak)


def _spec(v: Any) -> _Spec | None:
    """What a loop variable holding ``v`` is (None for a Python value)."""
    if type(v) is SrcVar:
        return _Spec(v.shape, v.dtype, v.device, v.active)
    if isinstance(v, Tensor):
        return _Spec(v.shape, v.dtype, v.device, False)
    return None


def _number(v: Any) -> bool:
    return type(v) in (int, float, bool)


def _has_dtype(a: Any) -> bool:
    """An argument that takes part in promotion: a variable or a number (not a shape)."""
    return type(a) is SrcVar or _number(a) or isinstance(a, Tensor)


def _weak_kind(v: Any) -> str | None:
    """The dtype a weak value or a Python number is read in (ops/weak.py), else None."""
    if type(v) is Weak:
        return str(v.dtype)
    return promote(v) if _number(v) else None


def _user_function(fn: Any) -> types.FunctionType | None:
    """A plain Python function (or method) the transformation reads and inlines."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        return None
    module = (fn.__module__ or "").split(".")[0]
    return None if module in ("minigraph", "numpy", "builtins") else fn
