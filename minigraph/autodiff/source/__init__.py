"""Reverse mode by source transformation: read a Python function, write its adjoint.

The textbook names three ways to implement automatic differentiation: dual numbers
(``forward.py``), a tape (``tape.py``) and *source transformation*, which this package
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

How it is written, in four steps (each module's docstring says more):

1. **Read** (``reading.py``): ``inspect.getsource`` and ``ast``; constructs the method
   cannot handle (listed at the end) are refused here, before anything runs, with an
   error (:class:`SourceTransformError`) naming the construct, function, file and line.
2. **Normalise** (``normalize.py``): the function's statements are run on *source
   variables* (:class:`SrcVar`, ``values.py``), a value kind like ``Tensor`` or ``Dual``
   whose ``_bind`` does not compute but appends a line ``t = mg.sin(x)`` to the program
   being written (``program.py``: lines, ``for`` loops, ``if`` branches) and returns a new
   source variable. Running ``x * y + mg.sin(x)`` this way *is* the normalisation to
   three-address form, the evaluation trace (a.1)-(a.5). A source variable knows the
   shape, dtype and device of its value (from the primitive's shape rule), because the
   program is specialised to one input signature.
3. **Adjoint** (``adjoint.py``): the normalised program is walked backwards; each run of
   straight-line lines goes through the one reverse sweep of every mode
   (``autodiff/backward.py``), whose primitive VJP rules, the same ones the tape uses, run
   on source variables, so they too write lines, (g.1)-(g.5). There is no second set of
   derivative rules and no second sweep. A ``for`` loop pushes the values its reverse
   needs on a stack in the forward sweep and pops them in the reverse sweep; an ``if``
   decided at run time is reversed by an ``if`` on the same condition variable (which
   the loop's stack restores inside loops).
4. **Tidy and compile** (``tidy.py``, ``render.py``, ``compiled.py``): dead lines are
   removed, single-use temporaries of the reverse sweep are written inline
   (``gx = ga * y + gb * mg.cos(x)``), names are chosen like the textbook's (a, b, ...
   for intermediates, g + name for adjoints), and the text is compiled with
   ``compile``/``exec``. The text stays in ``.source``; it calls ``mg.`` functions, so it
   runs on any value kind (tensors on any device, tensors being recorded for a gradient
   of the gradient, dual numbers). What a call on tensors that need no recording runs
   is the program as kernels on arrays (``.raw_source``, see
   ``benchmarks/bench_source.py``): a straight-line program is a graph, which graph
   compilation compiles; a program with loops or run-time ifs is written again with
   kernel calls (``_k_sin(_xp, y)``).

``cache.py`` keeps the programs, one per function, argnums and input signature (shapes,
dtypes, devices, and the values of arguments that are neither differentiated nor
tensors: ``n`` in ``range(n)``), and holds the public functions ``source_grad`` (the
gradients alone: ``mg.grad(f, mode="source")``) and ``value_and_grad``.

Decisions worth knowing (each is visible in the text):

* ``gz = 1`` is a tensor of ones of z's shape, dtype and device, not a number folded into
  the lines that read it, so every line of (g.*) appears as the textbook writes it
  (``gb = gz``, ``ga = gz``, ``gy = ga * x``); folding would save two multiplications.
  Python numbers the user wrote stay numbers (``gx = gz * 2.0``); ``x - 0``, ``x * 1`` and
  ``x ** 1`` are ``x``; lines nobody reads are removed.
* A Python float argument that is not differentiated is *weak*, as in eager mode
  (``ops/weak.py``): Python's arithmetic on it stays float64 (``t = s * 3.0``), and
  where it meets a float32 tensor a line casts it first (``a = mg.astype(t,
  'float32')``), so ``x * s`` is float32 as ``x`` is. It stays weak through an ``if``
  that keeps it a number on both paths (a float literal on the other path included) and
  through a loop of such arithmetic. A path on which a variable is a Python number (an
  argument or a literal, ``t = 0.1``) and another on which it is a tensor is refused: in
  eager mode its dtype, and the digits of 0.1, would depend on the path. A loop variable
  that starts as a number (``acc = 0.0``, or a float argument) is filled in the loop's
  dtype, which is what eager mode's first iteration computes where every operation on it
  is in that dtype (``acc + x[i]``). Elsewhere (``x32 * h``, h float64 from the second
  iteration on; ``h * 0.3``, Python's float64 arithmetic in the first) the first
  iteration is written on its own, as straight code, and the loop runs from the second.
* Values the function reads from outside its arguments (globals, closure variables) are
  *constants* of the program, captured when it is built, as ``jax.jit`` does: pass
  anything that changes as an argument. Where one is a tensor that requires a gradient
  (a layer's weight read as an attribute), a call runs f itself on the tape, as graph
  mode does, so that backward() reaches that tensor at every call.
* Python's own side effects in f (``print``, appending to a list kept outside f) happen
  while the program is *written*: once, at the first call for an input signature, and
  for both branches of an ``if`` decided at run time. Later calls run the written
  program, which does not repeat them (as ``jax.jit``); ``mode="tape"`` runs f itself.
* What Python can decide while the program is written, it decides (shapes, an ``if`` on
  a shape, calls with constant arguments, ``a, b = x`` as the rows ``x[0]``, ``x[1]``);
  ``for i in range(n)`` is written once, not unrolled; plain Python functions are
  inlined (``normalize.py`` says how).
* minigraph's transformations run on the program's values like any minigraph function
  (``mg.grad(g)(x)``, ``mg.vjp``, ``mg.jvp``, ``mg.vmap``, ``mg.trace`` inside f write
  their own lines), and a transformation handed to source mode as it is,
  ``mg.grad(mg.grad(f, mode="source"), mode="source")``, is read as a ``def`` that calls
  it with f's parameters (``reading.py``'s ``_calling``): the adjoint of an adjoint
  program, as google/tangent writes higher derivatives.

Not supported (refused with the construct and its line): ``while``, ``try``, ``with``,
lambdas and nested functions, generators and comprehensions, ``global``/``nonlocal``,
``break``/``continue``, assignment into part of a tensor, ``for`` over anything but
``range`` with bounds known when the program is built, indexing with a computed tensor,
an index whose shape changes with the loop index (``c[i % 2::2]``: shapes are checked at
every value the loops' indices take), a function whose file was edited after it was
imported (the text read is not the code that runs), different Python values (numbers,
strings) returned by the branches of an if decided at run time, loops and such ifs
(an elif is one, inside the else before it) nested more than 98 deep,
converting a value of the program to a Python number, calling functions other than
minigraph's (``np.sin(x)``) on values of the program, an update in place (``h += y``) of
a value another place may hold too (``h = x``, a list's item, the caller's name, a
global or closure tensor the function reads, a tensor argument that is not
differentiated, which the caller holds, a name that one path of a run-time if or an
earlier iteration of a loop made the same object: eager mode's write would show through
it, as in every transformation: ``ops/operators.py``; ``normalize.py``'s origins say
which objects a name may hold), Python arithmetic that raises (``1.0 / n`` with
n = 0) on a path of an if decided at run time, which is written, and so computed,
whichever path a call takes, and Python arithmetic that fails at a value a loop index
takes (``1.0 / i``, or ``s / i`` with s a float argument, at i == 0, where Python raises
ZeroDivisionError) unless an if on the loop index skips that value (``if i > 0:``): the
loop is written once for all its values.
"""

from .cache import source_grad, value_and_grad, vjp
from .compiled import _transform  # noqa: F401  (read by tests; cache.py is where it is called)
from .reading import SourceTransformError

__all__ = ["SourceTransformError", "source_grad", "value_and_grad", "vjp"]
