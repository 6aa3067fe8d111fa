"""Copies and casts: identity, stop_gradient, astype, to_device; zeros_like, ones_like.

``to_device`` is the one primitive whose result lives on another device than its
argument: its kernel is a real copy into the destination's memory (NumPy to NumPy for
virtual CPUs, host to GPU through CuPy), and its VJP copies the adjoint back, so a
tensor's gradient always lives on the tensor's own device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import batch_rules as B
from . import shape_rules as S
from .primitive import KINDS, always_a_view, bind, primitive


def _view_of(xp: Any, x: Any) -> Any:
    """A view of ``x``'s memory (``x[...]``), not ``x`` itself: two tensors over the
    same array would each count its bytes in their device's memory (a view counts none).
    A number is its own value."""
    return x[...] if hasattr(x, "shape") and not isinstance(x, np.generic) else x


IDENTITY = primitive(
    "identity", _view_of, S.same,
    jvp=[lambda t, out, x: t],
    vjp=[lambda g, out, x: g], view=True, returns_view=always_a_view,
    batch=B.elementwise("identity"),
    public="identity", cost="free")

STOP_GRADIENT = primitive("stop_gradient", _view_of, S.same, view=True,
                          returns_view=always_a_view,
                          batch=B.elementwise("stop_gradient"), differentiable=False,
    public="stop_gradient", cost="free")

# What ``with mg.no_grad():`` leaves in a recorded program (a graph that mg.trace or
# mode="graph" records, a source program): the value, through which no adjoint flows, as
# on the tape, which records nothing there. Unlike stop_gradient, mg.jvp's and mg.jacfwd's
# tangents pass, as the block does not stop them on the tape either (forward-mode grad
# stops them, as it does inside the block: forward.py's Dual._bind). A tangent that
# passes is as hidden from a reverse sweep around it as the value, hence its rule.
def _no_grad_jvp(t: Any, out: Any, x: Any) -> Any:
    return bind(NO_GRAD, t)


NO_GRAD = primitive("no_grad", _view_of, S.same, view=True,
                    returns_view=always_a_view, jvp=[_no_grad_jvp],
                    batch=B.elementwise("no_grad"), differentiable=False, cost="free")
# (no mg. function: a written program calls the table's entry, mg.PRIMITIVES['no_grad'],
# as codegen.mg_call writes every primitive without a public name)

ASTYPE = primitive(
    "astype", lambda xp, x, dtype: xp.astype(x, getattr(xp, dtype)),
    lambda x, dtype: (S.shape_of(x), dtype),
    jvp=[lambda t, out, x, dtype: astype(t, dtype, copy=False)],
    vjp=[lambda g, out, x, dtype: astype(g, x.dtype, copy=False)],
    batch=B.elementwise("astype"),
    public="astype", positional=("dtype",))

def _write_to_device(prim: Any, args: list[str], params: dict, literal: Any) -> str:
    return f"mg.to_device({args[0]}, {params['device'].name!r})"


TO_DEVICE = primitive(
    "to_device", lambda xp, x, device, source: device.copy_from(x, source), S.same,
    jvp=[lambda t, out, x, device, source: to_device(t, device)],
    vjp=[lambda g, out, x, device, source: to_device(g, source)],
    view=True,  # between array libraries the copy may go through shared host memory
    batch=B.elementwise("to_device"),
    public="to_device", write=_write_to_device, transfer=True)


# Constants shaped like a value, of any kind: a transformation that must start from ones
# (the seed gz = 1 of (g.1)) or answer zeros (an input the output does not depend on)
# makes them with these, so that they are graph nodes in a graph, lines in a source
# program, and batched under vmap. Their result does not depend on x's value: no rules.
ZEROS_LIKE = primitive("zeros_like", lambda xp, x: xp.zeros_like(x), S.same,
                       batch=B.elementwise("zeros_like"), differentiable=False,
    public="zeros_like")
ONES_LIKE = primitive("ones_like", lambda xp, x: xp.ones_like(x), S.same,
                      batch=B.elementwise("ones_like"), differentiable=False,
    public="ones_like")


def zeros_like(x: Any) -> Any:
    """Zeros of ``x``'s shape, dtype and device (PyTorch's and NumPy's name)."""
    return bind(ZEROS_LIKE, x)


def ones_like(x: Any) -> Any:
    """Ones of ``x``'s shape, dtype and device."""
    return bind(ONES_LIKE, x)


def identity(x: Any) -> Any:
    """``x`` itself, as a new value (the chain rule sees a separate variable)."""
    return bind(IDENTITY, x)


def stop_gradient(x: Any) -> Any:
    """``x``, through which no derivative flows (``detach`` in PyTorch)."""
    return bind(STOP_GRADIENT, x)


def astype(x: Any, dtype: str, copy: bool = True) -> Any:
    """``x`` converted to ``dtype``; casting to an integer or bool stops gradients.

    A new tensor even when ``x`` has the dtype already, as NumPy's and the Array API's
    ``astype`` (it returned ``x`` itself, so an in-place update of the "converted" tensor
    changed ``x``); ``copy=False`` gives ``x`` itself then, as the library's own rules ask.
    (Values of a transformation or a graph cannot be written in place: no copy is made.)"""
    dtype = S.supported_dtype("astype", dtype)
    S.input_shape("astype", "input", x)  # (None, a str, a ragged list: refused naming astype)
    if S.dtype_of(x) == dtype and (not copy or type(x) in KINDS):
        return x
    if dtype not in S.FLOATS:
        x = stop_gradient(x)
    return bind(ASTYPE, x, dtype=dtype)


def to_device(x: Any, device: Any) -> Any:
    """A copy of ``x`` on ``device`` (differentiable: the gradient is copied back)."""
    from ..device import Device, get_device

    dst, src = get_device(device), getattr(x, "device", None)
    if not isinstance(src, Device):  # (a number or a list lives on no device, a NumPy or
        # torch array on one of its library's: mg.tensor puts it on one of ours)
        raise TypeError(f"to_device: x must be a tensor, not {type(x).__name__}; "
                        f"mg.tensor(x, device={dst.name!r}) makes one on that device")
    return x if dst is src else bind(TO_DEVICE, x, device=dst, source=src)
