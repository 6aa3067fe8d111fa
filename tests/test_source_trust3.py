"""Source mode: a negative zero, a nested number accumulator, a value of an enclosing
transformation, the line a failing adjoint kernel names.

Each test is a bug that gave a wrong value, an internal error, or an error that named
the wrong cause or the wrong line: a Python ``-0.0`` written as ``mg.zeros`` in
``.source``, an inner loop's accumulator started from a number inside an outer loop, a
vmap's batched value read through a dict and reported as "got BatchTracer", a kernel of
the reverse sweep placed at f's ``def`` line. Oracles: PyTorch's autograd and closed
forms, never another mode of minigraph.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.autodiff.source import SourceTransformError
from minigraph.errors import MinigraphError

X = np.array([0.3, 0.7, 1.1])


# -- a Python -0.0 keeps its sign in the program's text --------------------------------------

def negative_zero_start(x, w, n):
    h = -0.0
    for i in range(n):
        h = h * w[i]  # w > 0: h stays -0.0
    return mg.sum(x * mg.exp(1.0 / h))  # exp(1 / -0.0) = exp(-inf) = 0


def test_a_negative_zero_start_value_keeps_its_sign_in_the_source_text():
    """A loop variable starting at the Python number -0.0 was written as ``mg.zeros``
    (+0.0) in ``.source`` (render.py tested ``value in (0, 1)``, and -0.0 == 0): the text
    runs for an input that requires a gradient, where 1 / h became +inf, the value inf
    and the gradient inf. Oracle: PyTorch on the same program (value 0, gradient 0)."""
    w = np.array([0.5, 2.0])
    t = torch.tensor(X, requires_grad=True)
    h = torch.tensor(-0.0, dtype=torch.float64)
    for i in range(2):
        h = h * torch.tensor(w)[i]
    want_value = torch.sum(t * torch.exp(1.0 / h))
    want_grad, = torch.autograd.grad(want_value, t)
    with np.errstate(divide="ignore"):
        value, grad = mg.value_and_grad(negative_zero_start, mode="source")(
            mg.tensor(X, requires_grad=True), mg.tensor(w), 2)
    assert value.item() == want_value.item() == 0.0
    np.testing.assert_array_equal(grad.detach().numpy(), want_grad.numpy())
    sg = mg.source_grad(negative_zero_start)
    with np.errstate(divide="ignore"):
        sg(mg.tensor(X), mg.tensor(w), 2)
    assert "h = mg.tensor(-0.0, 'float64', 'cpu')" in sg.source


# -- an inner accumulator started from a number inside an outer loop --------------------------

def row_sums(x):
    total = x[0] * 0.0
    for i in range(2):
        h = 0.0  # the inner loop's start: a number, again on every outer iteration
        for j in range(3):
            h = h * x[i] + x[j]
        total = total + h * h
    return total


def row_sums_in_a_branch(x, c):
    total = x[0] * 0.0
    for i in range(2):
        if x[2] > c:  # decided at run time
            h = 0.5
            for j in range(2):
                h = h * x[j]
        else:
            h = x[2]
        total = total + h
    return total


def _torch_row_sums(x):
    total = x[0] * 0.0
    for i in range(2):
        h = torch.tensor(0.0, dtype=torch.float64)
        for j in range(3):
            h = h * x[i] + x[j]
        total = total + h * h
    return total


def _torch_row_sums_in_a_branch(x, c):
    total = x[0] * 0.0
    for i in range(2):
        if x[2] > c:
            h = torch.tensor(0.5, dtype=torch.float64)
            for j in range(2):
                h = h * x[j]
        else:
            h = x[2]
        total = total + h
    return total


@pytest.mark.parametrize("requires_grad", [False, True])
def test_an_inner_accumulator_started_from_a_number_in_an_outer_loop(requires_grad):
    """``h = 0.0`` in an outer loop's body, then ``h = h ... `` in an inner loop: the
    adjoint reaching the start value h = 0.0 (a Fill, which reads nothing) was never
    taken off, and source mode failed with "internal error: adjoints left in a loop
    body". Oracle: PyTorch on the same program, plainly and under a run-time if."""
    t = torch.tensor(X, requires_grad=True)
    want, = torch.autograd.grad(_torch_row_sums(t), t)
    got = mg.grad(row_sums, mode="source")(mg.tensor(X, requires_grad=requires_grad))
    np.testing.assert_allclose(got.detach().numpy(), want.numpy(), rtol=1e-12)
    for c in (1.0, 2.0):  # the branch with the inner loop, and the other
        t = torch.tensor(X, requires_grad=True)
        want, = torch.autograd.grad(_torch_row_sums_in_a_branch(t, c), t)
        got = mg.grad(row_sums_in_a_branch, mode="source")(
            mg.tensor(X, requires_grad=requires_grad), c)
        np.testing.assert_allclose(got.detach().numpy(), want.numpy(), rtol=1e-12)


# -- a value of an enclosing transformation read through a container ---------------------------

_kept: dict = {}


def reads_kept(w):
    return mg.sum(w * _kept["x"])


def _outer(x):
    _kept["x"] = x
    return mg.grad(reads_kept, mode="source")(np.ones(3))


def test_a_value_of_an_enclosing_transformation_read_through_a_dict_is_named():
    """f read a vmap's batched value through a global dict, so f's result was a
    BatchTracer: source mode said "grad: f must return a tensor, got BatchTracer", which
    f does. The refusal now says what happened (a value of a transformation around this
    one, read from outside f's arguments) and what to do, for a vmap's value and for a
    tape's. (The answer exists, d/dw sum(w * x) = x: mode='tape' gives it.)"""
    for run, kind in ((lambda: mg.vmap(_outer)(np.arange(6.0).reshape(2, 3)), "BatchTracer"),
                      (lambda: mg.grad(lambda x: mg.sum(_outer(x)))(mg.tensor(X)), "Box")):
        with pytest.raises(SourceTransformError) as info:
            run()
        msg = str(info.value)
        assert f"f returning a {kind}, a value of a transformation around this one" in msg
        assert "outside its arguments" in msg and "mode='tape'" in msg
        assert "got" not in msg


# -- a failing kernel of the reverse sweep names the line of f that made its op ---------------

def cross_entropy_loss(x, y):
    h = mg.tanh(x)
    return mg.cross_entropy(h, y)  # the line the gradient's nll_loss_grad comes from


def cross_entropy_in_a_loop(x, y):
    t = x[0, 0] * 0.0
    for i in range(2):
        h = mg.tanh(x) * (i + 1.0)
        t = t + mg.cross_entropy(h, y)  # the line the gradient's nll_loss_grad comes from
    return t


def _line_of(fn, text: str) -> str:
    lines, first = inspect.getsourcelines(fn)
    k = next(k for k, line in enumerate(lines) if text in line)
    return f"test_source_trust3.py:{first + k}:"


def test_a_failing_adjoint_kernel_names_the_line_of_f_that_made_its_op():
    """A kernel of the reverse sweep that failed at run time (nll_loss_grad, a label out
    of range) said it was "created at" f's def line: the reverse sweep's lines were not
    placed. Each now has the line of the forward op it differentiates, as graph mode's
    gradient nodes do. Oracle: the line of f that calls mg.cross_entropy."""
    grad = mg.grad(cross_entropy_loss, mode="source")
    x = mg.tensor(np.ones((2, 3)))
    grad(x, mg.tensor([0, 2]))
    with pytest.raises(MinigraphError) as info:
        grad(x, mg.tensor([0, 9]))  # label 9 of 3 classes
    msg = str(info.value)
    assert "nll_loss_grad" in msg
    assert _line_of(cross_entropy_loss, "return mg.cross_entropy") in msg


def test_a_failing_adjoint_kernel_in_a_loop_names_the_line_of_f(monkeypatch):
    """The same for a program with a loop, whose kernels are a text of their own. The
    forward kernel is made to accept the label (clipped), so that only the gradient's
    kernel fails, as in the straight-line program where the forward's is not run."""
    prim = mg.PRIMITIVES["nll_loss"]
    real = prim.impl
    monkeypatch.setattr(prim, "impl", lambda xp, logp, labels: real(
        xp, logp, xp.clip(labels, 0, logp.shape[1] - 1)))
    grad = mg.grad(cross_entropy_in_a_loop, mode="source")
    x = mg.tensor(np.ones((2, 3)))
    grad(x, mg.tensor([0, 2]))
    with pytest.raises(MinigraphError) as info:
        grad(x, mg.tensor([0, 9]))
    msg = str(info.value)
    assert "nll_loss_grad" in msg
    assert _line_of(cross_entropy_in_a_loop, "t = t + mg.cross_entropy") in msg


_HELD: dict = {}


def _reads_a_held_tensor(w):
    return mg.sum(w * _HELD["x"] ** 2)


def test_a_tensor_read_through_a_dict_keeps_its_gradient_on_the_tape():
    """Source mode's kernels ran on arrays when f read a tensor that requires a gradient
    through a container (a dict's item, which the program holds as a constant): the
    path through it was cut off the tape, and backward() gave x.grad = [1, 1, 1] where
    PyTorch gives 2 w x + 1. Graph mode runs such a call on the tape; so does source
    mode now."""
    w0, x0 = np.array([0.5, 1.0, 1.5]), np.array([1.5, 2.0, 2.5])
    x = mg.tensor(x0, requires_grad=True)
    _HELD["x"] = x
    try:
        value, grad = mg.value_and_grad(_reads_a_held_tensor, mode="source")(mg.tensor(w0))
        (value + mg.sum(grad) + mg.sum(x)).backward()
    finally:
        _HELD.clear()
    tx = torch.tensor(x0, requires_grad=True)
    tw = torch.tensor(w0, requires_grad=True)
    v = torch.sum(tw * tx ** 2)
    (g,) = torch.autograd.grad(v, tw, create_graph=True)
    (v + g.sum() + tx.sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
