"""Reading the function: inspect + ast, the constructs refused, errors at the user's line.

Step 1 of the overview (see ``__init__.py``). :func:`_read` parses a function once (cached
in ``_SOURCES``) into a :class:`_Source`, its definition and what it can see, and refuses
what source transformation cannot handle (``_REFUSED``: ``while``, ``try``, ``lambda`` ...)
with an error naming the construct, function, file and line. :func:`_loads` and
:func:`_assigned` tell which names a block reads and assigns.

Every later step points its errors at the user's line the same way: ``Where`` is a place
in the user's code, :func:`_refusal` makes the error for a construct the transformation
does not handle, :func:`_located` appends the line to a minigraph error (a shape error,
say) raised while the program is written.
"""

from __future__ import annotations

import __future__
import ast
import functools
import inspect
import linecache
import operator
import os
import textwrap
import types
import weakref
from collections import Counter
from typing import Any, Callable, NamedTuple, cast

from ...errors import MinigraphError


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
    ``.lineno`` say where it is; ``.who`` is the function the user called (``grad``,
    ``value_and_grad``, ``vjp``, ``source_grad`` ...), which the message starts with.
    """

    def __init__(self, problem: str, where: Where, why: str = "", construct: str = "", *,
                 who: str):
        self.construct, self.who = construct or problem, who
        self.function, self.filename, self.lineno = where.function, where.filename, where.lineno
        text = f"{who}: {problem} ({where})"
        if where.text:
            text += f"\n    {where.text.strip()}"
        if why:
            text += f"\n{why}"
        super().__init__(text)


def _refusal(construct: str, where: Where, why: str, who: str) -> SourceTransformError:
    return SourceTransformError(f"{construct} is not supported", where, why, construct, who=who)


def _too_deep(where: Where, who: str) -> SourceTransformError:
    """The refusal for code nested deeper than the transformation's recursive walk can go:
    a RecursionError, which names neither the function nor the line, becomes this."""
    return SourceTransformError(
        "an expression or a chain of branches nested this deeply is not supported", where,
        "source transformation walks the code recursively, and this nests deeper than "
        "Python's recursion limit (a sum of hundreds of terms in one expression, or "
        "hundreds of nested branches); split it into several lines, or use mode=\"tape\" "
        "or mode=\"graph\" for this function", "deeply nested code", who=who)


def _located(exc: MinigraphError, where: Where | None) -> MinigraphError:
    """The same kind of error, with the user's line appended to its message (once: the
    writer of a line and the statement around it both catch the same shape error)."""
    if where is None or isinstance(exc, SourceTransformError) or hasattr(exc, "where"):
        return exc
    located = type(exc)(f"{exc} [source_grad: {where}: {where.text.strip()}]")
    located.where = where  # type: ignore[attr-defined]
    return located


class _Source:
    """A function's parsed definition and what it can see (globals, closure cells)."""

    __slots__ = ("_fn", "code", "node", "filename", "lines", "closure", "loads", "names",
                 "keep")
    keep: Any  # (what must outlive the function's weak reference: see _calling)

    def __init__(self, fn: types.FunctionType, node: ast.FunctionDef):
        self._fn = weakref.ref(fn)  # weak: the cache below must not keep fn alive
        self.node = node
        self.code = fn.__code__  # (the code read: f.__code__ may be replaced later)
        self.filename = fn.__code__.co_filename
        self.lines = linecache.getlines(self.filename)
        self.closure = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        self.loads = _loads(node.body)
        self.names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        self.names |= {a.arg for a in node.args.args + node.args.posonlyargs}

    @property
    def fn(self) -> types.FunctionType:
        fn = self._fn()
        assert fn is not None, "the function was freed while its program was written"
        return fn

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


def _read(fn: Callable[..., Any], who: str) -> _Source:
    """Parse ``fn`` (cached, per code object: ``fn.__code__ = ...`` is read anew) and
    refuse unsupported constructs before anything runs; ``who``, the function the user
    called, is named first by a refusal."""
    if getattr(fn, "transformation", None) is not None or \
            (getattr(fn, "__module__", None) or "").startswith("minigraph.ops."):
        return _calling(fn, who)  # (mg.sin's own text binds the primitive: it is not read)
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"{who}: source mode expects a plain function defined with def, "
                        f"got {type(fn).__name__} {fn!r}")
    src = _SOURCES.get(fn)
    if src is None or src.code is not fn.__code__:
        src = _parse(fn, who)
        _check(src, who)
        _SOURCES[fn] = src
    return src


def _calling(t: Any, caller: str) -> _Source:
    """Source mode of another transformation, ``mg.grad(mg.grad(f, mode="source"),
    mode="source")``, or of a library function, ``mg.grad(mg.sin, mode="source")``: the
    text of a function that calls it, read as any other::

        def grad_f(x, y):
            return _transformed(x, y)

    Run on source variables, the inner transformation writes its own lines (an inner
    source gradient, its adjoint program's), whose adjoint the outer one then writes:
    google/tangent differentiates its own output the same way. The parameters are f's
    (``inspect.signature`` follows ``__wrapped__``: ``levels.transformation``).
    ``caller``: the function the user called, which a refusal names first."""
    from ...codegen import Names, define  # (codegen imports the primitive table)

    who = getattr(t, "transformation", None) or f"mg.{t.__name__}"
    try:
        params = list(inspect.signature(t).parameters.values())
    except (TypeError, ValueError):  # (a callable object without a Python signature)
        params = []
    if not params or any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in params):
        code = getattr(t, "__code__", None)
        stars: dict[Any, str] = {inspect.Parameter.VAR_POSITIONAL: "*",
                                 inspect.Parameter.VAR_KEYWORD: "**"}
        shown = ", ".join(stars.get(p.kind, "") + p.name for p in params) or "..."
        raise SourceTransformError(
            f"transforming {who}({shown}) itself", Where(
                getattr(t, "__qualname__", who),
                code.co_filename if code else "<minigraph>", code.co_firstlineno if code else 0),
            f"source mode writes a function that calls {who} with its "
            f"parameters, and these are not plain positional ones: write that function with "
            f"def yourself (def g(x, y): ...) and transform g", "a transformation itself",
            who=caller)
    names = Names(taken=["_transformed"])
    name = names.identifier(getattr(t, "__name__", None) or who)
    args = ", ".join(names.identifier(p.name) for p in params)
    text = f"def {name}({args}):\n    return _transformed({args})\n"
    fn = define(text, name, f"<source_grad of {who}>", {"_transformed": t})
    # f's defaults, as values (they need not have a literal text): y=2.0 stays optional
    fn.__defaults__ = tuple(p.default for p in params if p.default is not p.empty) or None
    src = _Source(fn, cast(ast.FunctionDef, ast.parse(text).body[0]))
    src.keep = fn  # (only t's SourceGrad holds this source: nothing else keeps fn alive)
    return src


def _parse(fn: types.FunctionType, who: str) -> _Source:
    code = fn.__code__
    where = Where(fn.__qualname__, code.co_filename, code.co_firstlineno)
    if fn.__name__ == "<lambda>":
        raise _refusal("a lambda", where, "source transformation reads the function's "
                       "text, and a lambda's is not its own line; define it with def", who)
    if hasattr(fn, "__wrapped__"):
        raise _refusal("a decorated function", where, "the decorator's code is not in "
                       "the text; transform the undecorated function", who)
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise SourceTransformError(
            f"the source text of {fn.__qualname__} is not available", where,
            "source transformation reads the function's text: define it in a file (a "
            "module, a test file, a temporary module imported with importlib), not "
            "interactively or with exec", "unavailable source", who=who) from None
    tree = ast.parse(text)
    ast.increment_lineno(tree, code.co_firstlineno - 1)
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        raise _refusal(f"a {type(node).__name__}", where, "", who)
    if not _runs_as(node, fn):
        raise SourceTransformError(
            f"the source of {fn.__qualname__} in its file is not the code that runs", where,
            "the file was edited after the function was defined (imported), and source "
            "transformation reads the file's text now: reload the module (importlib."
            "reload) or restart, so that the text and the function agree", "edited source",
            who=who)
    return _Source(fn, node)


def _runs_as(node: ast.FunctionDef, fn: types.FunctionType) -> bool:
    """Whether the text read for ``fn`` is the code ``fn`` runs: its file may have been
    edited since ``fn`` was defined, and ``inspect.getsource`` reads the file as it is
    now. The whole file is compiled (nothing runs), as the function was, in its module:
    what a name is there (an import, a closure's cell) changes the bytecode."""
    code = fn.__code__
    if not os.path.isfile(code.co_filename):  # a notebook cell's text lives in memory
        return True                          # (linecache's), and cannot change behind it
    compiled = _compiled_file(code.co_filename, code.co_flags & _FUTURE_FLAGS)
    if compiled is None:  # the text does not compile as a whole: a .py file edited into
        # that, or no Python file (a block of a chapter's Markdown, run by its tests and
        # the book, whose text is the function's own), which cannot be checked this way
        return not code.co_filename.endswith(".py")
    if any(_same_code(c, code) for c in compiled.get((code.co_name, code.co_firstlineno), [])):
        return True
    # pytest rewrites the asserts of the test files it imports: a function with an assert
    # runs other bytecode than its text compiles to, and cannot be checked this way
    loader = fn.__globals__.get("__loader__")  # type: ignore[attr-defined]
    return type(loader).__module__.startswith("_pytest") and \
        any(isinstance(n, ast.Assert) for n in ast.walk(node))


_FUTURE_FLAGS = functools.reduce(operator.or_, (getattr(__future__, name).compiler_flag
                                                for name in __future__.all_feature_names))
# filename -> (its text, the flags it was compiled with, its code objects by name and line)
_COMPILED: dict[str, tuple[str, int, dict[tuple[str, int], list[types.CodeType]]]] = {}


def _compiled_file(filename: str, flags: int
                   ) -> dict[tuple[str, int], list[types.CodeType]] | None:
    """The code objects of the file's current text (as linecache has it, which
    ``inspect.getsource`` has just brought up to date), by name and first line; None if
    the text does not compile."""
    text = "".join(linecache.getlines(filename))
    cached = _COMPILED.get(filename)
    if cached is not None and cached[:2] == (text, flags):
        return cached[2]
    found: dict[tuple[str, int], list[types.CodeType]] = {}
    try:
        top = compile(text, filename, "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError):
        _COMPILED.pop(filename, None)
        return None
    todo = [top]
    while todo:
        c = todo.pop()
        found.setdefault((c.co_name, c.co_firstlineno), []).append(c)
        todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    _COMPILED[filename] = (text, flags, found)
    return found


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """The same function's code: bytecode, names, constants and first line (code objects
    among the constants, a nested function's, by their own code)."""
    def consts(c: types.CodeType) -> tuple:
        return tuple(("<code>", k.co_code, k.co_names) if isinstance(k, types.CodeType)
                     else (type(k), k) for k in c.co_consts)
    fields = ("co_name", "co_code", "co_names", "co_varnames", "co_freevars",
              "co_cellvars", "co_argcount", "co_firstlineno")
    return all(getattr(a, f) == getattr(b, f) for f in fields) and consts(a) == consts(b)


def _check(src: _Source, who: str) -> None:
    """Refuse what source transformation cannot do, naming construct, function and line."""
    args = src.node.args
    if args.vararg or args.kwarg or args.kwonlyargs:
        raise _refusal("*args, **kwargs or keyword-only parameters", src.where(src.node),
                       "give the function plain positional parameters", who)
    for node in ast.walk(ast.Module(body=src.node.body, type_ignores=[])):
        refused = _REFUSED.get(type(node))
        if refused is not None:
            raise _refusal(refused[0], src.where(node), refused[1], who)
        problem = _statement_problem(node)
        if problem is not None:
            raise _refusal(problem[0], src.where(node), problem[1], who)


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
    return Counter(_names(stmts, ast.Load))


def _assigned(stmts: list[ast.stmt]) -> list[str]:
    """Names assigned in ``stmts`` (in order of first appearance)."""
    return list(dict.fromkeys(_names(stmts, ast.Store)))


def _names(stmts: list[ast.stmt], ctx: type) -> list[str]:
    """Each occurrence of a name read (``ast.Load``) or assigned (``ast.Store``) in ``stmts``."""
    return [n.id for n in ast.walk(ast.Module(body=list(stmts), type_ignores=[]))
            if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)]
