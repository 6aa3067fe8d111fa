"""Normalising: running the function's statements on source variables, (a.1)-(a.5).

Step 2 of the overview (see ``__init__.py``). :class:`_Normaliser` runs a function's body
statement by statement: assignments bind names, an ``if`` Python can decide runs one
branch, an ``if`` on a run-time value writes both (:meth:`~_Normaliser.dynamic_if`, with
join variables), ``for i in range(n)`` writes its body once, with loop variables carrying
values between iterations (:meth:`~_Normaliser.s_For`), and calls of plain Python
functions are inlined (:meth:`~_Normaliser.call`). Its expressions are evaluated by its
base class, :class:`_Expressions` in ``expressions.py``. What it writes is the evaluation
trace: the program in three-address form.
"""

from __future__ import annotations

import ast
import inspect
import math
from typing import Any

import numpy as np

from ...errors import MinigraphError
from ...tensor import Tensor
from .errors import Where
from .expressions import _Expressions, _OneBranch
from .program import Fill, For, If, Line, Ref
from .reading import _assigned, _loads, _Source
from .values import Cond, Index, SrcVar, _contains, _dynamic
from .writer import _Writer


class _Return:
    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


_MISSING = object()


# The statements are here; the expressions (expr, e_*, load, guard ...) are inherited.
class _Normaliser(_Expressions):
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
        assert isinstance(node.target, ast.Name)  # (reading refused the other targets)
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
        assert where is not None  # (block set it for this if statement)
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
            assert r2 is not None  # (returns in one branch only were refused above)
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
        assert isinstance(node.target, ast.Name)  # (reading refused the other targets)
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
