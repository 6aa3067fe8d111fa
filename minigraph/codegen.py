"""Writing Python: the one code generator of graph compilation and source transformation.

Two parts of minigraph turn a program into the text of a Python function and run it
with ``compile``/``exec``: graph compilation (``graph/compile.py``: one line per node,
``mul = k_mul(xp, x, y)``) and source transformation (``autodiff/source/render.py``: the
adjoint program, ``gx = ga * y + gb * mg.cos(x)``, and, for a program with loops, which
no graph holds, its variant calling kernels on arrays, ``_k_mul(_xp, ga, y)``). Both
write the same things, and this module writes them:

* a value as Python text (:func:`literal`): ``2.0``, ``(0, slice(1, None, None))``,
  ``float('inf')``; a value that has no such text (an array, a tensor, a graph node, a
  device) is written as a *name*, and the name is bound to the value in the namespace the
  function is executed in (:class:`Names`);
* one primitive applied as a call of its kernel on arrays (:meth:`Names.kernel_call`):
  ``k_sum(xp, c, axis=None, keepdims=False)``, or of its ``out`` kernel writing into a
  buffer that nothing will read again, ``ko_add(xp, mul, sin, out=mul)``;
* one primitive applied as the ``mg.`` call a user would write (:func:`mg_call`), as its
  entry in the primitive table says: ``mg.reshape(gb, (2, 4))``, ``mg.sum(c, axis=1)``;
* the function itself (:func:`define`): compiled and executed, its text kept where
  tracebacks and debuggers look for it.

The names a generated function reads from its namespace (kernels, array namespaces,
devices, constants) must never be names of its own variables: a local ``k_mul`` would
hide the kernel. :class:`Names` gives every identifier of one function out of one set,
so a collision gets a suffix (``k_mul_1``) instead of a wrong result. (A source program's
variables are named before its text is written, by ``autodiff/source/tidy.py``; its
globals start with ``_``, ``_k_mul``, ``_xp``, which no name made there does.) The
builtins that :func:`literal` writes calls of (:data:`BUILTINS`) are read from the
namespace too, so no variable may take their names either.

A name is compared as Python compares it: Python reads an identifier in its NFKC form
(``ｍｕｌ``, fullwidth, *is* ``mul``, and ``x²`` is ``x2``), so :meth:`Names.identifier`
normalises first, then keeps only what an identifier may hold.
"""

from __future__ import annotations

import keyword
import linecache
import math
import unicodedata
import weakref
from typing import Any, Callable, Hashable, Iterable

from .device import Device
from .ops.primitive import Primitive

# The types whose ``repr`` is Python that evaluates to an equal value. Exactly these
# types: a NumPy scalar is a subclass of float but its repr is ``np.float64(2.0)``.
LITERALS = (bool, int, float, str, type(None))

# The builtins generated code calls: :func:`literal` (``float('inf')``, ``slice(1, None,
# None)``) and source mode's loop indices (``abs(i - 1)``: ``source/values.py``'s Index).
# A variable of a generated function named like one would hide it, so no generated
# function's variable is given these names (here, and in ``autodiff/source/compiled.py``).
BUILTINS = ("float", "slice", "abs")


def literal(value: Any, name: Callable[[Any], str]) -> str:
    """``value`` as Python text that evaluates to it: numbers, strings, None and tuples,
    lists and slices of them; ``name(v)`` for any other value ``v`` inside it (the name
    the namespace binds to it)."""
    kind = type(value)
    if kind is float and not math.isfinite(value):
        return f"float('{value}')"  # (repr gives inf and nan, which are no Python names)
    if kind in LITERALS:
        return repr(value)
    if isinstance(value, tuple):
        inner = ", ".join(literal(x, name) for x in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(literal(x, name) for x in value) + "]"
    if kind is slice:
        parts = (value.start, value.stop, value.step)
        return f"slice({', '.join(literal(x, name) for x in parts)})"
    if value is Ellipsis:
        return "..."
    return name(value)


class Names:
    """The identifiers of one generated function, and what its global ones stand for.

    ``namespace`` is the dict the function is executed in: every global name given out
    here is bound in it (``k_mul`` to the ``mul`` entry's kernel, ``xp`` to NumPy).
    ``prefix`` starts every global name. ``spell(value)``, if given, writes the values
    its caller writes its own way (a source program's loop index, its constants, named
    beforehand), and returns None for the others.
    """

    def __init__(self, prefix: str = "", taken: Iterable[str] = (),
                 spell: Callable[[Any], str | None] | None = None):
        self.prefix = prefix
        # every identifier in use: variables, globals given out, the builtins written
        self.taken = {unicodedata.normalize("NFKC", t) for t in taken} | set(BUILTINS)
        self.spell = spell
        self.namespace: dict[str, Any] = {}
        self.devices: dict[str, Device] = {}  # (the devices among the namespace's values)
        self.given: dict[Hashable, str] = {}  # what a global name was given for -> name

    def identifier(self, text: str) -> str:
        """A new identifier made of ``text``: ``gradients/mul_1`` -> ``gradients_mul_1``,
        with a suffix if taken (``mul_1``), ``v_`` before a keyword, ``__debug__`` or what
        cannot start one (a digit). ``text`` is taken in the NFKC form Python reads it in
        (fullwidth ``ｍｕｌ`` is ``mul``, ``w₁`` is ``w1``), so that two names that
        Python reads as one are told apart here too."""
        text = unicodedata.normalize("NFKC", text)
        base = "".join(c if ("_" + c).isidentifier() else "_" for c in text) or "v"
        if not base.isidentifier() or keyword.iskeyword(base) or base == "__debug__":
            base = "v_" + base  # (__debug__ is a constant: it cannot be assigned)
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def give(self, key: Hashable, base: str, value: Any) -> str:
        """The global name bound to ``value``: the one given for ``key`` before, else a
        new one made of ``base``."""
        if key not in self.given:
            name = self.given[key] = self.identifier(self.prefix + base)
            self.namespace[name] = value
        return self.given[key]

    def kernel(self, prim: Primitive, into: bool = False) -> str:
        """``k_mul``: the primitive's kernel; ``ko_mul`` its ``out`` kernel."""
        if into:
            return self.give(("out kernel", prim.name), "ko_" + prim.name, prim.out)
        return self.give(("kernel", prim.name), "k_" + prim.name, prim.impl)

    def xp(self, device: Device) -> str:
        """The array namespace of ``device``: ``xp`` on the CPU, ``xp_cuda_0`` ..."""
        base = "xp" if device.name == "cpu" else "xp_" + device.name
        return self.give(("xp", device.name), base, device.xp)

    def device(self, device: Device) -> str:
        """``dev_cpu``: a device, as a kernel that takes one (``to_device``) needs it."""
        name = self.give(("device", device.name), "dev_" + device.name, device)
        self.devices[name] = device
        return name

    def constant(self, value: Any, base: str) -> str:
        """The name of a value that has no literal text (by identity: the namespace keeps
        the value alive, so its id is never another's)."""
        return self.give(("constant", id(value)), base, value)

    def literal(self, value: Any, base: str = "c") -> str:
        """``value`` as text (:func:`literal`); a value without one becomes a constant
        named after ``base``, a device a device's name."""
        def name(v: Any) -> str:
            spelled = self.spell(v) if self.spell is not None else None
            if spelled is not None:
                return spelled
            return self.device(v) if isinstance(v, Device) else self.constant(v, base)
        return literal(value, name)

    def kernel_call(self, prim: Primitive, args: list[str], params: dict, xp: str,
                    into: str | None = None, base: str = "") -> str:
        """``k_mul(xp, a, b)``: the primitive's kernel on the arrays named ``args``, with
        ``params`` by keyword (a constant one named ``<base><param>``); with ``into``,
        its ``out`` kernel writing into that array, ``ko_add(xp, a, b, out=a)``."""
        words = list(args) + ([] if into is None else [f"out={into}"])
        words += [f"{k}={self.literal(v, base + k)}" for k, v in params.items()]
        return f"{self.kernel(prim, into is not None)}({xp}, {', '.join(words)})"


def mg_call(prim: Primitive, args: list[str], params: dict,
            literal: Callable[[Any], str]) -> str:
    """``mg.<public>(args, <positional params>, <other params>=...)``: the call a user
    writes, as the primitive's table entry says (its ``public`` name, the parameters it
    takes by ``positional``, or its own ``write``); ``literal`` writes the parameters."""
    params = dict(params)
    if prim.write is not None:
        return prim.write(prim, args, params, literal)
    if prim.public is None:  # (no mg. function: call the table's entry)
        words = args + [f"{k}={literal(v)}" for k, v in params.items()]
        return f"mg.PRIMITIVES[{prim.name!r}]({', '.join(words)})"
    words = args + [literal(params.pop(k)) for k in prim.positional]
    words += [f"{k}={literal(v)}" for k, v in params.items()]
    return f"mg.{prim.public}({', '.join(words)})"


def define(source: str, name: str, filename: str, namespace: dict) -> Any:
    """Execute generated ``source`` in ``namespace`` and return its function ``name``.

    The text goes into ``linecache`` under ``filename``, so that tracebacks and debuggers
    show the generated lines, and leaves it when the function is garbage-collected (a
    traced function compiles once per signature: the cache must not keep them all).
    """
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    fn = namespace[name]
    GENERATED[filename] = GENERATED.get(filename, 0) + 1
    weakref.finalize(fn, _forget, filename)
    return fn


# The file names of the programs ``define`` made and that live (how many of each): a
# frame running one is minigraph's, not the user's (ops/operators.py asks; a user's
# code may have any file name, "<source>" too)
GENERATED: dict[str, int] = {}


def _forget(filename: str) -> None:
    linecache.cache.pop(filename, None)
    left = GENERATED.pop(filename, 1) - 1
    if left:
        GENERATED[filename] = left
