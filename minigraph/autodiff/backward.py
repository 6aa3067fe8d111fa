"""The reverse sweep: one loop behind every reverse mode (the textbook's (f.*) and (g.*)).

Every reverse mode of minigraph records the same thing while the function runs: a list
of *entries*, one per primitive applied, in evaluation order (a.1)-(a.5)::

    (primitive, parameters, output, arguments)

and then runs this one loop over it, backwards. Each entry's output has received its
adjoint from the entries that read it (they come later, so they were visited first);
the loop adds those shares up and hands the total to the primitive's VJP rules, which
return each argument's share::

    gz = 1;  gb = gz;  ga = gz;  gy = ga * x;  gx = ga * y + gb * cos(x)      (g.1)-(g.5)

What the record holds and what a value is differs from mode to mode; the loop does not:

=======================  ==========================  ======================================
who                      the record                  the rules run on
=======================  ==========================  ======================================
``z.backward()``         tensors' tape entries       tensors (recorded again with
                                                     ``create_graph=True``)
``mg.vjp``/``mg.grad``   boxes of one level          the values inside the boxes: tensors,
                         (``tape.py``)               dual numbers, graph nodes, source
                                                     variables, batched values ...
``mg.gradients``         graph nodes, topological    graph nodes: the loop *writes* the
                         order                       reverse graph
``explain``              the tape of one run         symbols that print what they compute
``mg.source_grad``       a straight-line run of the  source variables: the loop *writes*
                         program's lines (loops and  the adjoint program's lines
                         ifs: ``source/adjoint.py``)
=======================  ==========================  ======================================

Because the rules are written with minigraph's own functions, what a rule computes on a
graph node is a new node, on a source variable a new line of the adjoint program, on a
value of an outer transformation a value of that transformation: nesting needs no code
here. The shares of a value are added in its readers' evaluation order, as the textbook
writes (f.5) (``gx = ga * y + gb * cos(x)``, not ``gb * cos(x) + ga * y``), and each
adjoint is dropped as soon as its entry has used it, so memory falls as the sweep goes.
The loop is iterative: a chain of 100,000 entries needs no recursion.
"""

from __future__ import annotations

import gc
from typing import Any, Callable, ContextManager, Iterable, Sequence

from ..errors import GradientError, ShapeError
from ..ops.primitive import Each, Primitive

Entry = tuple  # (primitive, params, output, args): see the module's docstring


def _add_all(parts: list[Any]) -> Any:
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def _in_readers_order(parts: list[Any], total: Callable[[list[Any]], Any]) -> Any:
    """A value's adjoint from its shares. They arrive latest reader first (the sweep runs
    backwards); added in the readers' evaluation order, as (f.5) writes them."""
    return total(parts[::-1]) if len(parts) > 1 else parts[0]


def reverse_sweep(entries: Sequence[Entry], seeds: Iterable[tuple[Any, Any]],
                  active: Callable[[Any], bool],
                  value: Callable[[Any], Any] | None = None,
                  total: Callable[[list[Any]], Any] = _add_all,
                  completed: Callable[[Any, Any], Any] | None = None,
                  scope: Callable[[Any], ContextManager[Any]] | None = None,
                  sum_leaves: bool = True) -> dict[int, Any]:
    """Run the VJP rules of ``entries`` backwards, from ``seeds`` (``[(output, adjoint)]``).

    ``active(a)`` says whether argument ``a`` takes an adjoint (it depends on the inputs
    being differentiated); ``value(a)`` is what the rules receive for a recorded value
    (the box's content, say; by default the value itself); ``total(shares)`` adds a
    value's shares (``add_n`` makes one AddN node in a graph); ``completed(output, g)``
    sees each entry's adjoint once it is complete and may return what the rules should
    use instead (``explain`` names it); ``scope(v)`` is a context in which v's adjoint is
    added up and its rules run (a graph node's device).

    Returns ``{id(v): adjoint}`` for the values that are not outputs of an entry (the
    leaves, the inputs of ``mg.grad``), their shares added up; with ``sum_leaves=False``,
    ``{id(v): shares}``, as they arrived (latest reader first), for a caller that adds
    them itself (source mode, whose record is one stretch of a program: a loop adds each
    share to its accumulator, ``gw = gw + share``).
    """
    if not gc.isenabled():  # paused already (a caller's sweep, or the tape reading itself)
        return _sweep(entries, seeds, active, value, total, completed, scope, sum_leaves)
    with collector_paused():
        return _sweep(entries, seeds, active, value, total, completed, scope, sum_leaves)


class collector_paused:  # noqa: N801  (used as a function: ``with collector_paused():``)
    """Python's cyclic garbage collector off while a long loop of the library runs.

    A sweep allocates an adjoint or two per entry while the whole record is alive; every
    so many allocations the collector walks the objects that survived, and on a long
    record (a 10^5-entry tape holds about a million objects) its full passes made the
    sweep grow faster than its length (time(10^5) / time(10^4) went from about 10 to
    over 20). The sweep makes no reference cycles (each adjoint is freed by its
    reference count as soon as its entry has used it), so nothing waits for the
    collector; it runs again afterwards. Nested sweeps leave it off until the outermost
    one ends, and a caller that had switched it off finds it off.

    (A class rather than a ``contextlib.contextmanager`` generator: every backward enters
    it, and the generator's machinery costs as much as a small operation.)"""

    __slots__ = ("was_on",)

    def __enter__(self) -> None:
        self.was_on = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was_on:
            gc.enable()


def _misshapen(prim: Any, i: int, got: Any, want: Any) -> ShapeError:
    return ShapeError(f"the VJP rule of {prim.name!r} gave argument {i} a share of shape "
                      f"{tuple(got)}, but the argument has shape {tuple(want)}: a bug in "
                      f"the rule (it must sum a broadcast adjoint back, e.g. with sum_to)")


def _sweep(entries: Sequence[Entry], seeds: Iterable[tuple[Any, Any]],
           active: Callable[[Any], bool], value: Callable[[Any], Any] | None,
           total: Callable[[list[Any]], Any], completed: Callable[[Any, Any], Any] | None,
           scope: Callable[[Any], ContextManager[Any]] | None,
           sum_leaves: bool) -> dict[int, Any]:
    """The loop of :func:`reverse_sweep`."""
    shares: dict[int, list[Any]] = {}
    owner: dict[int, Any] = {}  # id -> the value itself, for scope() (graphs only)
    for out, g in seeds:
        shares.setdefault(id(out), []).append(g)
        if scope is not None:
            owner[id(out)] = out
    for entry in reversed(entries):
        prim, params, out, args = entry
        parts = shares.pop(id(out), None)
        if parts is None:  # nothing the seeds depend on reads this value
            continue
        # (a context only where one is asked for: this loop runs once per recorded op)
        context = scope(out) if scope is not None else None
        if context is not None:
            context.__enter__()
        try:
            g = parts[0] if len(parts) == 1 else _in_readers_order(parts, total)
            if completed is not None:
                g = completed(out, g)
            rules = prim.vjp
            primals = args if value is None else [value(x) for x in args]
            primal_out = out if value is None else value(out)
            together = rules.together(g, primal_out, *primals, **params) \
                if type(rules) is Each and rules.together is not None else None
            if type(rules) is tuple and len(rules) < len(args):
                raise _too_few_rules(prim, "vjp", len(rules), len(args))
            for i, a in enumerate(args):
                rule = rules[i] if together is None else together[i]
                if rule is not None and active(a):
                    # (``**params`` only where there are some: an empty one costs a
                    # fifth of a small op)
                    share = rule if together is not None else \
                        rule(g, primal_out, *primals, **params) if params else \
                        rule(g, primal_out, *primals)
                    # A share must have its argument's shape: a rule that forgot to sum
                    # a broadcast back would otherwise hand a wrong .grad on, silently.
                    # (Only where both shapes are known: a graph node's may be None, a
                    # Python number has none. Two attribute reads: this is the hot loop.)
                    want = getattr(primals[i], "shape", None)
                    if want is not None:
                        got = getattr(share, "shape", None)
                        if got is not None and got != want:
                            raise _misshapen(prim, i, got, want)
                    shares.setdefault(id(a), []).append(share)
                    if scope is not None:
                        owner[id(a)] = a
        finally:
            if context is not None:
                context.__exit__(None, None, None)
    if not sum_leaves:
        return shares
    if scope is None:
        return {k: parts[0] if len(parts) == 1 else _in_readers_order(parts, total)
                for k, parts in shares.items()}
    adjoints = {}
    for k, parts in shares.items():
        context = scope(owner[k])
        if context is not None:
            with context:
                adjoints[k] = _in_readers_order(parts, total)
        else:
            adjoints[k] = _in_readers_order(parts, total)
    return adjoints


def _too_few_rules(prim: Primitive, kind: str, rules: int, args: int) -> GradientError:
    """A primitive given fewer derivative rules than arguments (one per argument, None
    where there is no derivative), met when a sweep reaches an argument without one."""
    return GradientError(f"primitive {prim.name!r} has {rules} {kind} rule"
                         f"{'s' if rules != 1 else ''} but was called with {args} "
                         f"arguments; its table entry needs one per argument (None where an "
                         f"argument has no derivative)")
