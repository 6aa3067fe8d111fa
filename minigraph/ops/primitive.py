"""The primitive: one operation defined once, and ``bind``, which runs it.

A :class:`Primitive` carries everything every part of minigraph needs to know about
one operation:

``impl(xp, *arrays, **params)``
    the kernel, written against the array namespace ``xp`` (NumPy, CuPy, ...);
``shape(*avals, **params) -> (shape, dtype)``
    the shape/dtype rule, which graph mode uses to know a node's result before running;
``jvp[i](t, out, *args, **params)``
    forward mode: the contribution of argument ``i``'s tangent ``t`` to the output's
    tangent. The output tangent is the sum of the contributions, which is the chain rule
    of the textbook's (b.3)-(b.5): ``da/dt = y * dx/dt + x * dy/dt``;
``vjp[i](g, out, *args, **params)``
    reverse mode: argument ``i``'s share of the output's adjoint ``g``, the terms of the
    textbook's (f.2)-(f.5): ``gx = ga * y + gb * cos(x)``;
``impl_with(xp, array, params)`` (optional, ops of one argument with parameters)
    the same kernel, given the parameters as the dict itself. The eager interpreter holds
    them as a dict, and ``impl(xp, x, **params)`` makes Python unpack it into keywords
    first: a tenth of the time of ``x.sum()`` on a small tensor (the reductions set it);
``cost``
    ``"cheap"`` or ``"expensive"``, read by the scheduler (a cheap op on a large result
    is expensive), or ``"free"``: no arithmetic whatever the size (reshape, indexing);
``out(xp, *arrays, out, **params)`` (optional)
    the kernel writing its result into a given buffer, for namespaces whose functions
    take ``out=`` (NumPy, CuPy): the runtime uses it to recycle freed memory;
``in_place``
    whether ``out`` may be one of the op's own arguments (true of elementwise kernels,
    not of ``matmul``, whose every output element reads many input elements): compiled
    graphs then compute into an argument's buffer at its last use;
``view``
    whether the kernel may return its argument, or a view sharing its memory
    (``reshape``, ``transpose``, basic indexing ...): such a value's buffer is never
    written in place while the view may still be read;
``returns_view(out_shape, params)`` (optional, for a ``view`` op)
    whether, on NumPy, the kernel returns its first argument or a view of it for these
    parameters (a transpose always; an index when it is basic and leaves an axis; a
    reshape unless it has to copy): the Session's memory plan then counts no new bytes
    for it, and checks at run time that it did (``runtime/memory.py``). None: the plan
    assumes nothing (``checkpoint`` returns whatever its function does);
``batch(dims, *args, **params)`` (``mg.vmap``)
    the batching rule: the op applied to a whole batch at once. ``dims[i]`` is ``0``
    when argument ``i`` carries the batch axis in front, ``None`` when it is the same for
    every example; the rule returns the result with the batch axis in front. ``None``
    means "no rule": vmap then refuses the op by name (see ``batch_rules.py``).

How an op is written, and what the runtime needs beyond its rules, also sit in its entry:

``symbol``
    the Python operator that writes it (``"*"`` for mul, ``"-"`` for sub and for neg,
    ``"[]"`` for indexing), read by the source renderer and ``explain``; precedences
    are Python's (:data:`PRECEDENCE`);
``public``, ``positional``
    the ``mg.`` function generated code calls, and the parameters it takes by position
    (``mg.reshape(x, (2, 3))``); ``write(args, params, literal)`` for an op whose call
    is written otherwise (``mg.concatenate([a, b], axis=0)``);
``flops(out_shape, *arg_shapes)``
    the arithmetic it does, for placement's time estimate (one per result element if
    not given; m*n*k for matmul);
``transfer``
    whether it copies between devices (``to_device``): partitioning turns it into a
    Send/Recv pair;
``neutral``
    ``(value, positions)``: the number that, as the argument at one of ``positions``,
    makes the op return its other argument, bit for bit (``x * 1`` and ``1 * x``:
    ``(1, (0, 1))``; ``x - 0``: ``(0, (1,))``; for ``add`` it is -0.0, since
    ``-0.0 + 0.0`` is ``+0.0`` in IEEE arithmetic, which ``1 / x`` tells apart). Graph
    optimisation and source transformation drop such operations (``graph/passes.py``'s
    ``simplify``, ``source/program.py``), asking :meth:`Primitive.is_neutral`.

``None`` in ``jvp``/``vjp`` means "no derivative through this argument" (an integer
index, a condition, labels); an op with no derivative at all (a comparison,
``stop_gradient``) says ``differentiable=False``, and one with neither is refused when
defined, rather than differentiated as if its derivative were 0. Both rule lists are written with minigraph's own functions,
so the same rule runs on any value that flows through it: tensors (and then a rule run
while recording gives second derivatives), dual numbers, graph nodes, source variables.

:func:`bind` is the single entry point of every operation (``mg.sin(x)`` is
``bind(sin, x)``). It looks at the kinds of its arguments and hands the work to the
interpreter of the highest-priority kind among them, like the trace levels of JAX:

=========================  ==========  =================================================
value kind                 priority    what binding does
=========================  ==========  =================================================
plain values (floats ...)  none        become tensors on the default device
``Tensor``                 0           compute now; record on the tape if needed
graph ``Node``             10          add a node to the current graph
source variable, ``Sym``   20          write the expression down (and compute it)
``Box`` of ``mg.vjp``      its level   record the op for this call's reverse sweep
``Dual`` of ``mg.jvp``     its level   compute primal and tangent together
``BatchTracer``            its level   apply the op's batching rule (``mg.vmap``)
=========================  ==========  =================================================

A transformation's values sit above the rest, at a level taken from one counter when the
transformation starts (``autodiff/levels.py``): the transformation started last, the
innermost, handles an operation first, unwraps its own values and binds again one level
down, so nested transformations never confuse their perturbations.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from ..errors import MinigraphError

Rule = Callable[..., Any]


# Python's operator precedences, loosest first, for whoever writes ops as text.
CMP, ADD, MUL, UNARY, POW, ATOM = 1, 2, 3, 4, 5, 6
PRECEDENCE = {"<": CMP, "<=": CMP, ">": CMP, ">=": CMP, "==": CMP, "!=": CMP, "+": ADD,
              "-": ADD, "*": MUL, "/": MUL, "//": MUL, "%": MUL, "@": MUL, "**": POW}


class Primitive:
    """One operation: kernel, shape rule, derivative rules and cost class."""

    __slots__ = ("name", "impl", "impl_with", "shape", "jvp", "vjp", "cost", "out",
                 "in_place", "view", "batch", "differentiable", "symbol", "public",
                 "positional", "write", "flops", "transfer", "returns_view", "neutral",
                 "promoted", "runs_user_code")

    def __init__(self, name: str, impl: Callable[..., Any], shape: Callable[..., tuple],
                 jvp: Sequence[Rule | None] | Each = (), vjp: Sequence[Rule | None] | Each = (),
                 cost: str = "cheap", out: Callable[..., Any] | None = None,
                 in_place: bool = True, view: bool = False, batch: Rule | None = None,
                 symbol: str | None = None, public: str | None = None,
                 positional: tuple[str, ...] = (), write: Callable[..., str] | None = None,
                 flops: Callable[..., float] | None = None, transfer: bool = False,
                 impl_with: Callable[[Any, Any, dict], Any] | None = None,
                 returns_view: Callable[[tuple, dict], bool] | None = None,
                 neutral: tuple[float, tuple[int, ...]] | None = None,
                 promoted: tuple[int, ...] | None = None, runs_user_code: bool = False,
                 differentiable: bool = True):
        self.name = name
        # the kernel runs a function of the user's (checkpoint's f): running it again to
        # explain an error would run f's side effects again, and its errors are f's own
        self.runs_user_code = runs_user_code
        # the arguments whose dtypes make the result's (None: all): where's condition
        # does not, so a Python float beside it takes the dtype of the values only
        self.promoted = promoted
        self.neutral = neutral
        self.symbol, self.public, self.positional, self.write = symbol, public, positional, write
        self.flops, self.transfer, self.returns_view = flops, transfer, returns_view
        self.impl = impl
        self.impl_with = impl_with
        self.shape = shape
        # (tuples: a list given here would be one the caller could change afterwards)
        self.jvp = jvp if isinstance(jvp, Each) else tuple(jvp)
        self.vjp = vjp if isinstance(vjp, Each) else tuple(vjp)
        self.cost = cost
        self.out = out
        self.in_place = out is not None and in_place
        self.view = view
        self.batch = batch
        # Looked up on every eager call, so computed once here.
        self.differentiable = differentiable and _has_rule(vjp)
        _check_rules(name, jvp, vjp, differentiable)

    def __call__(self, *args: Any, **params: Any) -> Any:
        return bind(self, *args, **params)

    def is_neutral(self, value: Any, k: int) -> bool:
        """Whether ``value``, a Python number or a NumPy array, as argument ``k`` makes
        this op return its other argument: every element the table's ``neutral`` number,
        the sign of a zero included (``x + 0.0`` is not ``x`` where x is -0.0)."""
        if self.neutral is None or k not in self.neutral[1]:
            return False
        unit = self.neutral[0]
        negative = math.copysign(1.0, unit) < 0  # (-0.0 < 0 is False: the sign bit says)
        if type(value) in (int, float, bool):  # (x * True is x; x + False is x + 0)
            return value == unit and (math.copysign(1.0, value) < 0) == negative
        return bool((value == unit).all() and (np.signbit(value) == negative).all())

    def made_a_view(self, out_shape: Any, params: dict) -> bool:
        """Whether a result of this op (of ``out_shape``, with ``params``) shares its first
        argument's memory in eager mode (``reshape``, basic indexing, ``identity`` ...):
        a write into one then shows through the other."""
        return self.view and (self.returns_view is None or
                              bool(self.returns_view(out_shape, params)))

    def __repr__(self) -> str:
        return f"<primitive {self.name}>"


def _has_rule(rules: Any) -> bool:
    return isinstance(rules, Each) or any(rule is not None for rule in rules)


def _check_rules(name: str, jvp: Any, vjp: Any, differentiable: bool) -> None:
    """A primitive has both derivative rules, ``jvp`` and ``vjp`` (``None`` for an
    argument without a derivative: ``vjp=[None]`` says it has none), or says
    ``differentiable=False``: its result is a constant to every differentiation (a
    comparison, ``stop_gradient``; ``no_grad`` keeps a jvp for mg.jvp). A missing rule is
    refused where it is written: the sweeps would take the op for a constant, and an
    ``x ** 3`` defined without rules would have derivative 0 without a word (JAX raises
    "Differentiation rule for 'cube' not implemented", at the first differentiation)."""
    if not differentiable:
        if _has_rule(vjp):
            raise ValueError(f"primitive {name!r}: differentiable=False, but a vjp rule is "
                             f"given; give one or the other")
        return
    given = {"jvp": isinstance(jvp, Each) or len(jvp) > 0,
             "vjp": isinstance(vjp, Each) or len(vjp) > 0}
    missing = [what for what in given if not given[what]]
    if len(missing) == 2 or missing and _has_rule(jvp if missing == ["vjp"] else vjp):
        raise ValueError(f"primitive {name!r}: no {' and no '.join(missing)} rule; give "
                         f"both derivative rules, jvp=[...] and vjp=[...] (None for an "
                         f"argument without a derivative), or differentiable=False if its "
                         f"result is a constant to every differentiation (as a comparison "
                         f"is); without a rule, its derivative would be taken as 0")
    if isinstance(jvp, Each) or isinstance(vjp, Each) or missing:
        return  # (a rule per argument made on demand; or vjp=[None] alone: no derivative)
    if len(jvp) != len(vjp):
        raise ValueError(f"primitive {name!r}: {len(jvp)} jvp rules but {len(vjp)} vjp "
                         f"rules; give one of each per argument (None for an argument "
                         f"without a derivative)")
    for i, (forward, reverse) in enumerate(zip(jvp, vjp)):
        if (forward is None) != (reverse is None):  # (one mode would give 0 there)
            raise ValueError(f"primitive {name!r}: argument {i} has a "
                             f"{'vjp' if forward is None else 'jvp'} rule but no "
                             f"{'jvp' if forward is None else 'vjp'} rule; give both, or "
                             f"None in both if it has no derivative")


def always_a_view(out_shape: tuple, params: dict) -> bool:
    """``returns_view`` of an op whose NumPy kernel always returns its argument or a view
    of it (``transpose``, ``identity`` ...)."""
    return True


class UfuncOut:
    """The ``out`` kernel of an op that is the array namespace's ufunc ``name``:
    ``UfuncOut("add")(xp, x, y, out=buf)`` is ``xp.add(x, y, out=buf)``.

    A class rather than a lambda so that it says which ufunc it calls: a runtime that
    runs the same kernel thousands of times may look the ufunc up once (:meth:`on`) and
    call NumPy itself (the Session's planned walk: on a scalar, the lambda and the
    ``getattr`` were a fifth of the kernel)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __call__(self, xp: Any, *arrays: Any, out: Any) -> Any:
        return getattr(xp, self.name)(*arrays, out=out)

    def on(self, xp: Any) -> Callable[..., Any]:
        """The ufunc itself, in namespace ``xp``: called as ``ufunc(*arrays, out=buf)``."""
        return getattr(xp, self.name)


def ufunc_out(name: str) -> UfuncOut:
    """The ``out`` kernel of an op that is the namespace's ufunc ``name``."""
    return UfuncOut(name)


class Each:
    """The rule list of a primitive with any number of arguments (``concatenate``):
    ``Each(make)[i]`` is ``make(i)``, the rule for argument ``i``. ``together``, if
    given, is every argument's rule at once, which the sweeps call instead: a rule per
    argument reads all n arguments, n times over, and a sweep through an n-term sum took
    time n^2. For VJPs it is ``(g, out, *xs) -> [share, ...]``; for JVPs ``(tangents, out,
    *xs) -> the output's tangent``, with None for a zero tangent."""

    def __init__(self, make: Callable[[int], Rule],
                 together: Callable[..., list] | None = None):
        self.make = make
        self.together = together

    def __getitem__(self, i: int) -> Rule:
        return self.make(i)

    def __iter__(self):  # ``differentiable`` only asks whether any rule exists
        yield self.make(0)


PRIMITIVES: dict[str, Primitive] = {}


def primitive(name: str, impl: Callable[..., Any], shape: Callable[..., tuple], *,
              jvp: Sequence[Rule | None] | Each = (), vjp: Sequence[Rule | None] | Each = (),
              cost: str = "cheap", out: Callable[..., Any] | None = None,
              in_place: bool = True, view: bool = False,
              batch: Rule | None = None, differentiable: bool = True,
              **written: Any) -> Primitive:
    """Define a primitive and enter it in the table ``PRIMITIVES``. ``written`` holds the
    optional ``symbol``, ``public``, ``positional``, ``write``, ``flops``, ``transfer``,
    ``impl_with``, ``returns_view``, ``neutral``, ``promoted``, ``runs_user_code``."""
    if name in PRIMITIVES:
        raise ValueError(f"primitive {name!r} is defined twice")
    if cost not in ("free", "cheap", "expensive"):
        raise ValueError(f"primitive {name!r}: cost must be 'free', 'cheap' or 'expensive'")
    prim = Primitive(name, impl, shape, jvp if isinstance(jvp, Each) else tuple(jvp),
                     vjp if isinstance(vjp, Each) else tuple(vjp), cost, out, in_place, view,
                     batch, differentiable=differentiable, **written)
    PRIMITIVES[name] = prim
    return prim


# ----------------------------------------------------------------------------------------
# bind: pick the interpreter from the arguments' kinds
# ----------------------------------------------------------------------------------------

# The value kinds bind knows. Each class has a ``_priority`` (an attribute, since a
# dual's priority depends on its level) and a ``_bind(prim, args, params)`` method.
# forward.py registers Dual, graph mode registers Node ... Tensors (priority 0) and
# plain values need no entry: when no registered kind is present, the eager
# interpreter runs, which keeps the most common call, on tensors only, short.
KINDS: set[type] = set()
# The eager interpreter: (apply, apply_one, apply_two), installed by the tape.
_eager: list[Callable[..., Any]] = []


def register_kind(cls: type) -> None:
    """Declare a value kind: a class with ``_priority`` and ``_bind``."""
    KINDS.add(cls)


def register_eager(apply: Callable[..., Any], apply_one: Callable[..., Any],
                   apply_two: Callable[..., Any]) -> None:
    """Install the eager interpreter (``tape.apply``), which handles priority 0, with its
    entries for one argument and for two (see :func:`bind_one`)."""
    _eager[:] = [apply, apply_one, apply_two]


def bind(prim: Primitive, *args: Any, **params: Any) -> Any:
    """Apply ``prim`` to ``args``: the one entry point of every operation."""
    top, best = None, 0
    for a in args:
        if type(a) in KINDS and a._priority > best:
            top, best = a, a._priority
    if top is None:
        return _eager[0](prim, args, params)
    return top._bind(prim, args, params)


# -- bind for the most common calls, faster --------------------------------------------------
# ``bind(prim, *args, **params)`` packs its arguments into a tuple and a dict, which keeps
# Python off its fastest call path; on small tensors that is a tenth of an eager op's
# time. The operators (``x * y``) and the functions of one tensor (``mg.sin(x)``,
# ``x.sum()``) call these instead: the same decision, for a fixed number of arguments.

def bind_one(prim: Primitive, x: Any, params: dict) -> Any:
    """``bind(prim, x, **params)``, the parameters given as a dict."""
    if type(x) in KINDS:  # (every kind's priority is above the tensors' 0)
        return x._bind(prim, (x,), params)
    return _eager[1](prim, x, params)


def bind_two(prim: Primitive, x: Any, y: Any) -> Any:
    """``bind(prim, x, y)``: two arguments, no parameters."""
    if type(y) in KINDS:  # the higher priority wins; on a tie the first, as in bind
        if type(x) in KINDS and x._priority >= y._priority:
            return x._bind(prim, (x, y), {})
        return y._bind(prim, (x, y), {})
    if type(x) in KINDS:
        return x._bind(prim, (x, y), {})
    return _eager[2](prim, x, y)


# -- errors of an op's own checks, in graph mode ----------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])


def names_user_line(op: F) -> F:
    """Decorate a public op whose Python code checks its arguments before it binds (an
    axis, a dtype, a permutation, the shapes of a stack ...): a MinigraphError it raises
    while building a graph then names the user's line, as one raised by a shape rule
    does (``Graph._infer``). The check runs before any node exists, so the value kind
    among the arguments (or in a list of them: ``stack([x, y])``) that can say where
    the user is, a graph node (its ``_locate``), adds the line to the message, once;
    tensors leave eager mode's messages as they were. (A try block costs nothing until
    something is raised, but this wrapper's call is paid by every eager call, some 0.15
    µs: so only the ops whose own work is larger wear it, the nn functions, stack,
    concatenate and a Linear layer's forward; sum, reshape, getitem ... do not, and a
    build error's traceback names the user's line for them.)"""
    @functools.wraps(op)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return op(*args, **kwargs)
        except MinigraphError as exc:
            for a in _values(args + tuple(kwargs.values())):
                locate = getattr(a, "_locate", None) if type(a) in KINDS else None
                if locate is not None:
                    locate(exc)
                    break
            raise
    return call  # type: ignore[return-value]


def _values(args: tuple) -> Any:
    """The arguments, and the items of the lists and tuples among them (one level)."""
    for a in args:
        if type(a) in (list, tuple):
            yield from a
        else:
            yield a
