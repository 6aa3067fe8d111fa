"""The cache and the public functions: ``SourceGrad``, ``source_grad``, ``value_and_grad``.

A program is built once per function, argnums and input signature (shapes, dtypes,
devices, and the values of static arguments), kept in the one cache of compiled programs
(``autodiff/signature.py``, shared with graph mode and ``mg.trace``), and
replayed: on arrays, calling kernels, when the program has them and nothing needs
recording, else on values (:func:`_run`); where f reads a tensor that requires a gradient
from outside its arguments, f itself runs on the tape, as in graph mode
(:meth:`SourceGrad._taped`). ``mg.source_grad(f)`` and
``mg.value_and_grad(f, mode="source")`` return a :class:`SourceGrad`; ``mg.vjp`` and
``mg.jacrev`` in source mode use one whose programs take the output's adjoint (:func:`vjp`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, TypeAlias

from ...errors import MinigraphError
from ..argnums import normalize_argnums, refuse_keywords, single
from .. import tape
from ..signature import arrays, programs, signature
from ..tape import memory_of, own_results
from .compiled import Program, _transform, _value
from .reading import _read, _too_deep

Argnums: TypeAlias = "int | tuple[int, ...]"


# -- the cache: per function, per argnums and input signature --------------------------------

class SourceGrad:
    """``mg.source_grad(f)``: f's gradient by a program written from f's source.

    Calling it builds (once per input signature) and runs that program. ``.source`` is the
    program's text, ``.forward_source`` the normalised primal (three-address form),
    ``.raw_source`` the kernels on arrays that graph compilation wrote for it (None
    without them: see ``compiled.py``'s ``_kernels``); ``.programs`` the cache.
    """

    transformation = "source_grad"  # (runs on any kind of value: see levels.transformation)

    def __init__(self, f: Callable[..., Any], argnums: Argnums = 0, with_value: bool = False,
                 seeded: bool = False, who: str = "grad"):
        self.f = f
        self.who = who  # (the function the user called, which errors name)
        self.__wrapped__ = f  # (its parameters are f's: see levels.transformation)
        self.argnums = argnums
        # refusals happen here, before anything runs (first: they include *args, which
        # has no parameter count to check argnums against)
        self._src = _read(f, who)
        code = self._src.fn.__code__  # (f's, or that of the def calling a transformation)
        # (source mode reads f's parameters, so argnums is checked against them at once)
        self.nums = normalize_argnums(argnums, code.co_argcount, who, "takes")
        self.with_value = with_value
        # a vjp's programs (``seeded``) take the output's adjoint: programs of their own
        self.seeded, self._kind = seeded, ("vjp",) if seeded else ()
        self.transforms = 0  # how many programs were written (the cache's misses)
        self.last: Program | None = None
        self.__name__ = f"grad_{self._src.node.name}"
        self._n = code.co_argcount
        # the one cache, shared by every source gradient of f with these argnums
        # (argnums=0 and argnums=(0,) differ in what they return: two programs)
        self._programs = programs(f, "source", (self.nums, single(argnums), *self._kind))
        self._short: dict[int, tuple[tuple[int, ...], dict]] = {}  # see _passed

    @property
    def programs(self) -> dict:
        """This function's programs for these argnums: signature -> Program."""
        return self._programs

    def _complete(self, args: tuple) -> tuple:
        """The arguments with f's defaults filled in (the program takes them all)."""
        missing = self._n - len(args)
        if missing < 0:  # (Python's own words: the program has a parameter per argument)
            raise TypeError(f"{self._src.fn.__name__}() takes {self._n} positional "
                            f"arguments but {len(args)} were given")
        defaults = self._src.fn.__defaults__ or ()  # (read now: f.__defaults__ may be
        if 0 < missing <= len(defaults):             # rebound, as chapter 04 says)
            return args + defaults[len(defaults) - missing:]
        return args

    def _passed(self, count: int) -> tuple[tuple[int, ...], dict]:
        """argnums and the programs' cache for a call that passes ``count`` arguments and
        lets f's defaults fill the rest: argnums count the arguments passed, as in every
        other mode (and JAX), so argnums=-1 is the last one passed, and one that names a
        default is refused, not differentiated."""
        if count not in self._short:
            nums = normalize_argnums(self.argnums, count, self.who)
            self._short[count] = nums, programs(self.f, "source",
                                                (nums, single(self.argnums), *self._kind))
        return self._short[count]

    def _resolve(self, args: tuple) -> tuple[tuple, tuple[int, ...], dict]:
        """The arguments completed with f's defaults, argnums and the cache for them."""
        nums, cache = self._passed(len(args)) if len(args) < self._n else \
            (self.nums, self._programs)
        return self._complete(args), nums, cache

    def program_for(self, *args: Any) -> Program:
        """The program for these arguments' signature (built if needed)."""
        args, nums, cache = self._resolve(args)
        return self._program(args, signature(args, nums), nums, cache)

    def value(self, *args: Any) -> Any:
        """f's value by the program's normalised primal (``mg.vjp``'s, in source mode),
        or by f itself where the tape must record it (:meth:`_taped`)."""
        args, nums, cache = self._resolve(args)
        prog = self._program(args, signature(args, nums), nums, cache)
        if prog.captured.on_the_tape():
            return self.f(*args)
        value = prog.primal(*[_value(a, k in nums) for k, a in enumerate(args)])
        # (f may come out as its argument, x * 1 simplified to x: the caller's own array)
        return own_results([value], memory_of(args))[0]

    def program(self, args: tuple, g: Any) -> Program:
        """The program of ``pullback(args, g)`` (one for every cotangent: f's output's)."""
        return self.program_for(*args)

    def pullback(self, args: tuple, g: Any) -> tuple:
        """The gradients for the output's adjoint ``g`` (a ``seeded`` program's: the vjp's
        ``vjp_fn(g)``), by the program for ``args``, which takes ``g`` after them."""
        args, nums, cache = self._resolve(args)
        key = signature(args, nums)
        prog = self._program(args, key, nums, cache)
        if prog.captured.on_the_tape():  # (the tape's pullback, which it records: _taped)
            _, pull = tape.recorded_vjp(lambda *xs: self.f(*tape.put(args, nums, xs)),
                                        tuple(args[i] for i in nums), self.who)
            return pull(g)
        return _run(prog, args + (g,), key + signature((g,)), nums, with_value=False)

    def _program(self, args: tuple, key: tuple, nums: tuple[int, ...], cache: dict) -> Program:
        prog = cache.get(key)  # the cache: no rewriting
        # (a global tensor it read was written: again; where f runs on the tape, which
        # does not run the program (_taped), only a name bound anew: Captured.stale)
        if prog is None or prog.captured.stale(prog.captured.on_the_tape()):
            self._src = _read(self.f, self.who)  # (f's code may be another: f.__code__ = ...)
            try:
                prog = _transform(self._src, args, nums, single(self.argnums), key, self.seeded,
                                  self.who)
            except RecursionError:  # (past normalize.py's walk, which names the line)
                raise _too_deep(self._src.where(), self.who) from None
            self.transforms += 1
            cache[key] = prog
        self.last = prog
        return prog

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:  # (a keyword would also miss the cache, keyed by positions)
            refuse_keywords(kwargs, self.who)
        nums, cache, passed = self.nums, self._programs, args
        if len(args) != self._n:  # (the call's cost counts: no method call when complete)
            count, args = len(args), self._complete(args)  # (too many: refused there)
            nums, cache = self._passed(count)
        key = signature(args, nums)
        prog = self._program(args, key, nums, cache)
        if prog.captured.on_the_tape():
            return self._taped(passed)
        return _run(prog, args, key, nums, self.with_value)

    def _taped(self, args: tuple) -> Any:
        """A call run by the tape, f itself, as graph mode runs it: where f reads a
        tensor that requires a gradient from outside its arguments (an attribute, a
        dict's item: ``Captured.on_the_tape``). The program holds what f computed from
        that tensor when the program was written (``H.t ** 2``) as a constant, shared
        by every call: recorded by the tape then, it is released by the first call's
        backward(), so a second one fails; computed before ``requires_grad_(True)``,
        it cuts the path through the tensor off (its gradient stays None). The tape
        computes it anew at each call, as PyTorch does."""
        value, grads = tape.value_and_grad(self.f, self.argnums, self.who)(*args)
        return (value, grads) if self.with_value else grads

    def _example(self) -> Program:
        """The last call's program, or, before any call, the program for float64 scalars
        (1.0 for every parameter). Where f cannot take those (x.shape[0], range(n)), the
        error says so, with its cause: the user never passed them."""
        if self.last is None:
            n = len(inspect.signature(self.f).parameters)
            try:
                self.program_for(*([1.0] * n))
            except Exception as exc:  # (any error: f ran on arguments it was not given)
                raise MinigraphError(
                    f".source shows the program of the last call; none was made yet, so "
                    f"source mode wrote the program for float scalars (1.0 for each "
                    f"parameter of {self._src.fn.__name__}), which it cannot take: "
                    f"call the gradient, or program_for(*args), first.\nWith float "
                    f"scalars: {type(exc).__name__}: {exc}") from exc
        assert self.last is not None  # (program_for set it)
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


def _run(prog: Program, args: tuple, key: tuple, nums: tuple, with_value: bool = True) -> Any:
    """Run the compiled program on ``args`` (whose signature is ``key``): its kernels on
    arrays when it has them and nothing needs recording (``wrap`` makes the results the
    caller's own tensors), else ``.source``'s function on values (tensors that require
    a gradient, another transformation's values). Returns ``(value, gradients)``, or the
    gradients alone without ``with_value``."""
    kernels = prog.kernels if with_value else prog.gradient_kernels
    data = None if kernels is None else arrays(args, key, static=False)
    if kernels is None or data is None:
        value, grads = prog.fn(*[_value(a, k in nums) for k, a in enumerate(args)])
        return (value, grads) if with_value else grads
    results = kernels.wrap(kernels.raw(*data))
    grads = results[-1] if prog.single else results[with_value:]
    return (results[0], grads) if with_value else grads


def source_grad(f: Callable[..., Any], argnums: Argnums = 0,
                who: str = "source_grad") -> SourceGrad:
    """The gradient of scalar ``f`` by source transformation: ``mg.source_grad(f)(x, y)``.

    ``argnums`` an int gives one gradient, a tuple a tuple. ``.source`` is the generated
    adjoint program. Unsupported Python raises :class:`SourceTransformError` here. It is
    also source mode behind ``mg.grad(f, mode="source")``: the gradients alone (``who``,
    the function the user called, is then ``grad``).
    """
    return SourceGrad(f, argnums, with_value=False, who=who)


def value_and_grad(f: Callable[..., Any], argnums: Argnums = 0,
                   who: str = "value_and_grad") -> SourceGrad:
    """Source mode behind ``mg.value_and_grad(f, mode="source")``: ``(value, grad)``."""
    return SourceGrad(f, argnums, with_value=True, who=who)


def vjp(f: Callable[..., Any], argnums: tuple[int, ...], who: str = "vjp") -> SourceGrad:
    """Source mode behind ``mg.vjp(f, *primals, mode="source")`` and ``mg.jacrev``: an
    object whose ``value(*args)`` is f's value, by the normalised primal, and whose
    ``pullback(args, g)`` the gradients for ``argnums`` by the adjoint program, written
    once per signature of ``args``, that takes the output's adjoint ``g`` as its last
    parameter (``def vjp_f(x, y, gz)``; a gradient's program starts from ``gz = 1``).
    Each call runs the forward sweep again: a program keeps nothing between calls, where
    the tape keeps f's values from the call that recorded them. Its ``source`` is the
    text of the last program. ``who``: the function the user called (``jacrev`` ...),
    which errors name."""
    return SourceGrad(f, argnums, seeded=True, who=who)
