"""Forward mode with dual numbers (the textbook's (b.*), (c.*) and (d.*)).

A :class:`Dual` carries a value and its tangent, the derivative of that value with
respect to one chosen direction ``t`` of the inputs. Every operation on duals computes
the primal as usual and the tangent from the primitive's JVP rules, in the *same order*
as the evaluation itself, so nothing needs to be stored: with ``dx = 1, dy = 0`` the
program computes (c.1)-(c.5), with ``dx = 0, dy = 1`` it computes (d.1)-(d.5). One pass
gives one directional derivative; a full gradient over n inputs needs n passes, which
is why a Jacobian costs n passes of f's cost forward, and ``jacfwd`` is cheap only
for few inputs (batched into one pass by ``vmap``, the arithmetic stays n times f's).

Levels keep nested uses apart (``jacfwd(jacfwd(f))``, ``jvp`` of ``grad``): every ``jvp``
call makes duals of a new, higher level (``levels.py``), and an operation is handled by
the highest level among its arguments; a dual of another level counts there as a
constant with zero tangent. The primal and tangent may be any value (a tensor, a box of
``grad``, a graph node ...): the JVP rules are minigraph code and run on whatever they are.
"""

from __future__ import annotations

import math
import threading
from contextlib import nullcontext
from typing import Any, Callable

import numpy as np

from ..errors import DTypeError, GradientError, ShapeError
from ..ops import copy as C
from ..ops import shape as SH
from ..ops.operators import ArrayOps, passed_as_is
from ..ops.primitive import Each, Primitive, bind, register_kind
from ..ops.shape_rules import shape_of
from ..ops.weak import Weak
from ..tensor import Tensor, tensor, zeros
from .argnums import (Argnums, is_value, normalize_argnums, refuse_keywords,
                      refuse_non_functions, refuse_pytrees, single)
from .backward import _too_few_rules
from .levels import (ValueInside, escaped, level_running, new_level, running,
                     transformation)
from .reads import outside_reads, read_only_arrays, rebound
from .signature import ByIdentity
from .tape import (_differentiable, as_gradient, grad_mode_depth, memory_of, own_results,
                   records_since)


class Dual(ValueInside, ArrayOps):
    """A primal value with its tangent; ``tangent is None`` stands for zero."""

    # (__weakref__: weakref.ref(dual) and weakref.finalize in f, as on a tensor)
    __slots__ = ("primal", "tangent", "level", "_priority", "__weakref__")

    def __init__(self, primal: Any, tangent: Any, level: int):
        self.primal = primal
        self.tangent = tangent
        self.level = level
        self._priority = level  # above tensors, graph nodes, source variables (levels.py)

    shape = property(lambda self: shape_of(self.primal))
    dtype = property(lambda self: self.primal.dtype)
    device = property(lambda self: self.primal.device)

    def _bind(self, prim: Primitive, args: tuple, params: dict) -> Any:
        """Apply ``prim``: primal from the primals, tangent = sum of the JVP terms."""
        if self.level not in running:
            raise escaped("mg.jvp (or mg.grad(mode='forward'))", prim.name)
        primals, tangents = [], []
        for a in args:
            if type(a) is Dual and a.level == self.level:
                primals.append(a.primal)
                tangents.append(a.tangent)
            else:
                primals.append(a)
                tangents.append(None)
        out = bind(prim, *primals, **params)
        depth = _GRAD_LEVELS.get(self.level)
        if depth is not None and (prim is C.NO_GRAD or not records_since(depth)):
            return out  # inside no_grad, under forward-mode grad: a constant (see _jvp)
        outer, _pushing.level = _pushing.level, self.level  # (for :func:`rerun_jvp`)
        try:
            tangent = push_tangents(prim, params, out, primals, tangents)
        finally:
            _pushing.level = outer
        if tangent is None:
            return out  # a zero tangent: the result is a constant at this level
        return Dual(out, tangent, self.level)

    def _inside(self) -> Any:  # (what float(dual), dual.item() ... read: ValueInside)
        return self.primal

    def __repr__(self) -> str:
        return f"Dual(primal={self.primal!r}, tangent={self.tangent!r})"


register_kind(Dual)


def push_tangents(prim: Primitive, params: dict, out: Any, primals: list,
                  tangents: list) -> Any:
    """The one forward-tangent step: ``out``'s tangent from its arguments' tangents, the
    sum of the primitive's JVP terms, (b.3)-(b.5): ``da = dx * y + x * dy``. ``None`` in
    ``tangents`` is a zero tangent; the result is ``None`` when every term is zero. Dual
    numbers run it for every operation, ``explain`` runs it on symbols to print (c.*).

    The tangent has ``out``'s shape, dtype and device, whatever the rules return: a rule
    that hands ``t`` on (``add``'s, ``where``'s ...) gives a float32 tangent for the
    float64 result of ``x32 + c64``, in which a later ``* 1e300`` overflows, and which
    ``jvp`` refuses as a tangent of that result (JAX's and torch.func's rule)."""
    tangent = None
    if not prim.jvp:  # (no rule: comparisons, stop_gradient ...; no_grad has one only)
        return None
    if type(prim.jvp) is Each and prim.jvp.together is not None:  # (n arguments at once)
        tangent = prim.jvp.together(tangents, out, *primals, **params)
    else:
        if type(prim.jvp) is tuple and len(prim.jvp) < len(tangents):
            raise _too_few_rules(prim, "jvp", len(prim.jvp), len(tangents))
        for i, t in enumerate(tangents):
            rule = prim.jvp[i] if t is not None else None
            if rule is not None:
                term = rule(t, out, *primals, **params)
                tangent = term if tangent is None else tangent + term
    if tangent is None:
        return None
    # out's dtype and device (a cast, a copy, only where they differ), as a gradient has
    # its input's: the same helper; cast before the broadcast, which makes more elements.
    # (Two tensors that agree, the common case, are compared here: the dtype property
    # names the dtype, a tenth of a microsecond, for every op of every pass.)
    if type(tangent) is not Tensor or type(out) is not Tensor or \
            tangent.data.dtype != out.data.dtype or tangent.device is not out.device:
        tangent = as_gradient(tangent, out)
    if shape_of(tangent) != shape_of(out):
        tangent = SH.broadcast_to(tangent, shape_of(out))  # a broadcast argument's tangent
    return tangent


def _as_tensor(x: Any) -> Any:
    """A primal as a tensor, as eager mode makes one of a number (a recorded function's
    float, a ``Weak``, included: its float64 value)."""
    if type(x) is Weak:
        return x.value
    return x if isinstance(x, (Tensor, Dual)) or hasattr(x, "_bind") else tensor(x)


def jvp(f: Callable[..., Any], primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    """``out, tangent_out = mg.jvp(f, (x, y), (dx, dy))``: one forward-mode pass.

    A tangent may be a number (broadcast to its primal's shape) or a tensor. A ``with
    mg.no_grad():`` block inside f does not stop tangents (the tape's switch; nor does it
    stop torch.func.jvp); ``mg.stop_gradient`` does.
    """
    for what, given in (("primals", primals), ("tangents", tangents)):
        if not isinstance(given, (tuple, list)):  # (len(2.0) failed inside, naming nothing)
            raise TypeError(f"jvp: {what} must be a tuple or list, one per argument of f "
                            f"(JAX's rule), got {type(given).__name__}: write "
                            f"mg.jvp(f, (x,), (dx,))")
    return _jvp(f, primals, tangents, for_grad=False, held=True)


transformation(jvp, "jvp")  # (it takes the values: see mg.vjp's mark in tape.py)


# The levels of mg.grad(f, mode="forward")'s passes, each with the grad-mode blocks open
# when it started, which it ignores (tape.grad_mode_depth). There a value computed inside
# ``with mg.no_grad():`` is a constant, as on the tape and in torch.func.grad, so that
# every mode gives the same gradient; mg.jvp's own passes ignore the block, as
# torch.func.jvp.
_GRAD_LEVELS: dict[int, int] = {}


class _Pushing(threading.local):
    """The level whose tangents a JVP rule is pushing now, in this thread (None: none)."""
    level: int | None = None


_pushing = _Pushing()


def rerun_jvp(f: Callable[..., Any], primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    """:func:`jvp` of f for a JVP rule that runs f again (checkpoint's): a pass of
    forward-mode ``grad``, where ``with mg.no_grad():`` makes a constant, if the pass
    whose tangents the rule is pushing is one; else mg.jvp's, which ignores the block.
    Without it, f inside a checkpoint would ignore the block where f outside one does
    not, and mg.grad(mode="forward") would disagree with the other modes."""
    return _jvp(f, primals, tangents, for_grad=_pushing.level in _GRAD_LEVELS)


def _jvp(f: Callable[..., Any], primals: tuple, tangents: tuple,
         for_grad: bool, who: str = "jvp", held: bool = False) -> tuple[Any, Any]:
    """:func:`jvp`, or one pass of forward-mode ``grad`` (``for_grad``), for the function
    ``who`` that the user called (jvp, grad, jacfwd), whose name its errors give.
    ``held``: the primals are the caller's tensors (mg.jvp's), which f's ``x += 1``
    would leave as they were: refused (see ``passed_as_is``), where torch.func.jvp
    writes into them. (grad and jacfwd pass copies of their own, which f may rebind.)"""
    refuse_non_functions(f, who)
    if len(primals) != len(tangents):
        raise ValueError(f"{who}: {len(primals)} primals but {len(tangents)} tangents")
    refuse_pytrees(primals, range(len(primals)), who, "primal")
    refuse_pytrees(tangents, range(len(tangents)), who, "tangent")
    level = new_level()
    duals = []
    for k, (p, given) in enumerate(zip(primals, tangents)):
        p = _differentiable(p, k, who)
        number = isinstance(given, (int, float))
        try:
            t = tensor(given, dtype=p.dtype, device=p.device) if number else _as_tensor(given)
        except (TypeError, ValueError) as exc:  # (None, a str: say which tangent)
            raise type(exc)(f"{who}: tangent {k} ({type(given).__name__}) is not a tensor, "
                            f"an array or a number: {exc}") from None
        if t.dtype != p.dtype or t.device != p.device:  # (JAX's rule: a tangent is of its
            # primal's kind; a float64 tangent would make the float32 result's tangent float64)
            raise DTypeError(f"{who}: a tangent must have its primal's dtype and device: primal "
                             f"{p.dtype} on {p.device.name}, tangent {t.dtype} on "
                             f"{t.device.name} (a Python number takes the primal's)")
        if shape_of(t) != shape_of(p):
            if not number:  # (JAX's and torch.func's rule)
                raise ShapeError(f"{who}: tangent {k} has shape {shape_of(t)}, its primal "
                                 f"{shape_of(p)}; a tangent is a direction in the primal's "
                                 f"space, of its shape (a Python number is broadcast to it)")
            t = SH.broadcast_to(t, shape_of(p))
        duals.append(Dual(p, t, level))
    if for_grad:  # (an outer no_grad does not stop a transformation: grad_mode_depth)
        _GRAD_LEVELS[level] = grad_mode_depth()
    caller = passed_as_is(duals, range(len(duals)), who, primals, level=level) if held \
        else nullcontext()  # (primals: the caller's, a tensor of which is refused)
    try:
        with caller, level_running(level):
            out = f(*duals)
    finally:
        _GRAD_LEVELS.pop(level, None)
    if type(out) is Dual and out.level == level:
        if for_grad:  # (a pass of mg.grad: the tangent is summed into a gradient)
            return out.primal, out.tangent
        # the caller's own arrays: f = lambda x: x + 0.0 gives the caller's tangent back
        given = memory_of([*primals, *tangents])
        primal, tangent = own_results([out.primal, out.tangent], given)
        return primal, tangent
    if isinstance(out, (tuple, list, dict)):  # (as vjp: one output, whose tangent is one)
        raise TypeError(f"{who}: f must return a tensor, got {type(out).__name__} (for "
                        f"several outputs, one {who} per output, or mg.stack them)")
    if not is_value(out):
        raise TypeError(f"{who}: f must return a tensor, got {type(out).__name__}")
    out = _as_tensor(out)
    return out, zeros(shape_of(out), out.dtype, out.device)


def _gather(parts: list, shape: tuple) -> Any:
    """The gradient of shape ``shape`` from its elements' tangents, one pass each (each of
    one element). A single element, a scalar x, needs no concatenation, a reshape at
    most: the concatenation and reshapes took a quarter of the time of the textbook's
    gradient by forward mode (141 against 103 µs, ``benchmarks/bench_eager.py``'s row)."""
    if len(parts) == 1:
        t = parts[0]
        return t if shape_of(t) == shape else SH.reshape(t, shape)
    return SH.reshape(SH.concatenate([SH.reshape(t, (1,)) for t in parts]), shape)


def basis_vectors(x: Any) -> list[Tensor]:
    """The unit vectors of x's shape, dtype and device: zeros with a one at flat position
    k, for k = 0, 1, ... (constants, whatever kind of value x is)."""
    shape, xp = shape_of(x), x.device.xp
    vectors = []
    for k in range(math.prod(shape)):  # (one small write each: no identity matrix to cut)
        e = zeros(math.prod(shape), x.dtype, x.device)
        e.data[k] = 1
        vectors.append(Tensor(xp.reshape(e.data, shape), x.device))
    return vectors


def identity_rows(x: Any) -> Tensor | None:
    """The identity over x's elements as a batch: row k, of x's shape, has a one at flat
    position k. None for an empty x (a batch of nothing)."""
    shape = shape_of(x)
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return None
    return tensor(np.eye(n).reshape((n, *shape)), dtype=x.dtype, device=x.device)


def jacobian_from_rows(rows: Any, out: Any, x: Any, outputs_first: bool) -> Any:
    """The Jacobian d out / d x, of shape ``out.shape + x.shape``, from a batch of rows:
    one per output element (reverse mode, ``outputs_first``) or one per input element
    (forward mode, then transposed). On x's device, as a gradient is (``as_gradient``):
    forward mode's rows are tangents of f's output, on the output's device."""
    out_shape, in_shape = shape_of(out), shape_of(x)
    m = int(np.prod(out_shape, dtype=np.int64))
    n = int(np.prod(in_shape, dtype=np.int64))
    if rows is None or m == 0 or n == 0:
        return zeros(out_shape + in_shape, x.dtype, x.device)
    if not outputs_first:
        rows = SH.transpose(SH.reshape(rows, (n, m)))
    jac = SH.reshape(rows, out_shape + in_shape)
    return jac if jac.device is x.device else C.to_device(jac, x.device)


def jacfwd(f: Callable[..., Any], argnums: Argnums = 0, vectorize: bool = True) -> Callable:
    """The Jacobian by forward mode: one tangent per *input* element. With ``vectorize``
    (the default) all n of them go through f in one batched pass (``vmap`` of ``jvp``
    over the identity's rows, as JAX does); ``vectorize=False`` makes n passes, one per
    input element, as chapter 02 counts them."""
    from ..ops.shape import stack
    from .batching import vmap

    refuse_non_functions(f, "jacfwd")

    def jac(*args: Any, **kwargs: Any) -> Any:
        refuse_keywords(kwargs, "jacfwd")
        nums = normalize_argnums(argnums, len(args), "jacfwd")
        refuse_pytrees(args, nums, "jacfwd")
        args = tuple(_differentiable(a, i, "jacfwd") if i in nums else a
                     for i, a in enumerate(args))
        jacs = []
        runs = len(nums) if vectorize else _runs(args, nums)
        with _read_only(f, args, nums, runs, "jacfwd"):
            for i in nums:
                x = args[i]

                def along(xi: Any) -> Any:
                    own = _others_copied(args, nums, i) if len(nums) > 1 else args
                    with passed_as_is(own, nums, "jacfwd"):
                        return f(*own[:i], xi, *own[i + 1:])

                rows = identity_rows(x)
                if rows is None:
                    columns, out = None, along(x)
                elif vectorize:  # the output once (unbatched), its tangents as a batch
                    out, columns = vmap(lambda t: _jvp(along, (x,), (t,), for_grad=False,
                                                       who="jacfwd"),
                                        out_axes=(None, 0))(rows)
                else:
                    passes = [_jvp(along, (x,), (e,), for_grad=False, who="jacfwd")
                              for e in basis_vectors(x)]
                    out, columns = passes[0][0], stack([t for _, t in passes])
                jacs.append(jacobian_from_rows(columns, out, x, outputs_first=False))
        return jacs[0] if single(argnums) else tuple(jacs)

    return transformation(jac, "jacfwd", f)


def _others_copied(args: tuple, nums: tuple[int, ...], i: int) -> list:
    """The arguments of the run that perturbs argument i: the other differentiated ones
    as copies, which f may update in place (``x += 1``) without the next run seeing it,
    as it may update the tape's boxes (a copy that an outer tape records: ``astype``)."""
    own = list(args)
    for k in nums:
        a = own[k]
        if k != i and type(a) is Tensor:
            own[k] = C.astype(a, str(a.dtype)) if a.requires_grad else \
                Tensor(a.device.asarray(a.data, copy=True), a.device)
    return own


def _read_only(f: Callable[..., Any], args: tuple, nums: tuple[int, ...], runs: int,
               who: str) -> Any:
    """While forward mode runs f ``runs`` times: the tensors and arrays among the
    arguments it does not differentiate, and those f reads from outside (a global, an
    item of one), are read-only (``reads.read_only_arrays``), so that a run writing into
    one (``y += 1.0``, which eager mode's one run makes once) raises before it writes,
    instead of handing the next run the written value. An array without a read-only
    flag (CuPy's) is compared with a copy after the runs and put back."""
    if runs == 1:
        return nullcontext()
    return read_only_arrays(f, f"{who} (forward mode)", f"; forward mode runs f {runs} "
                            f"times on the same arguments, and each run would start from "
                            f"the value the one before wrote (use a reverse mode, which runs "
                            f"f once)", GradientError,
                            [None if k in nums else a for k, a in enumerate(args)])


def _drawing_once(f: Callable[..., Any], who: str) -> Callable[..., Any]:
    """f, or, where f draws random numbers, f drawing at each of forward mode's passes
    the numbers its first pass drew (checkpoint's ``_Drawing``, from the generators'
    states before it): every pass must differentiate one function. A dropout mask drawn
    anew for each input element gave a gradient whose components were the derivatives
    of as many functions; the generators are left where one run of f leaves them.
    Which generators f reads is found once per f, and again when a name it read is
    bound anew (``reads.rebound``: identity tests, where reading them costs tens of
    microseconds a call)."""
    try:
        known = _GENERATORS.setdefault(f, lambda: [None])  # (a cell: found again below)
    except TypeError:  # (no weak reference to f: found at every call)
        known = [None]
    if known[0] is None or rebound(known[0][0]) is not None:
        from .checkpoint import CheckpointError, _generator_states  # (it imports this one)

        reads = outside_reads(f)
        try:
            generators = [(name, g) for name, g, _ in _generator_states(reads)]
        except CheckpointError:
            raise GradientError(f"{who} (forward mode): f reads a random number generator "
                                f"whose state cannot be set (random.SystemRandom); forward "
                                f"mode runs f once per input element, and each run would "
                                f"draw other numbers. Use a reverse mode, which runs f "
                                f"once") from None
        known[0] = (reads, generators)
    if not known[0][1]:
        return f
    from .checkpoint import _Drawing, _state

    return _Drawing(f, [(name, g, _state(g)) for name, g in known[0][1]])


# f -> [(what f reads, the generators among it)], for _drawing_once
_GENERATORS: "ByIdentity[list]" = ByIdentity()


def _runs(args: tuple, nums: tuple[int, ...]) -> int:
    """How many times forward mode runs f for a gradient: once per input element."""
    return sum(math.prod(shape_of(args[i])) for i in nums)


def value_and_grad(f: Callable[..., Any], argnums: Argnums = 0,
                   who: str = "grad") -> Callable:
    """Forward mode behind ``mg.value_and_grad(f, mode="forward")`` and ``mg.grad``: n
    passes for n inputs; ``who`` is the function the user called, which errors name."""

    def wrapped(*args: Any, **kwargs: Any) -> tuple:
        refuse_keywords(kwargs, who)
        nums = normalize_argnums(argnums, len(args), who)
        refuse_pytrees(args, nums, who)
        args = tuple(_differentiable(a, i, who) if i in nums else a
                     for i, a in enumerate(args))
        value = None
        grads = []
        fn = _drawing_once(f, who) if _runs(args, nums) > 1 else f
        with _read_only(f, args, nums, _runs(args, nums), who):
            for i in nums:
                x = args[i]
                parts = []
                for e in basis_vectors(x):
                    own = _others_copied(args, nums, i) if len(nums) > 1 else args
                    with passed_as_is(own, nums, who):
                        value, t = _jvp(lambda xi: fn(*own[:i], xi, *own[i + 1:]), (x,),
                                        (e,), for_grad=True, who=who)
                    if math.prod(shape_of(value)) != 1:  # (one number, as the tape)
                        raise GradientError(f"{who}: f must return a scalar, it returned "
                                            f"shape {shape_of(value)}; use mg.jacfwd for a "
                                            f"vector output")
                    parts.append(t)
                grads.append(as_gradient(_gather(parts, shape_of(x)), x)
                             if parts else zeros(shape_of(x), x.dtype, x.device))
        if value is None:
            value = f(*args)
        # (f may return its argument: the caller's own array, as the other modes hand it)
        value = own_results([value], memory_of(args))[0]
        return value, grads[0] if single(argnums) else tuple(grads)

    return wrapped
