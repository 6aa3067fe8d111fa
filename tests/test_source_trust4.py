"""Source mode: a tensor that requires a gradient read from outside f, the function an
error names, a Python float divided by a loop index that takes the value 0, super().

Each test is a bug that gave a wrong value, a raw or misleading error: a program's
constant computed from such a tensor when the program was written (released by the
first backward(), or cut off the tape before ``requires_grad_``), errors naming ``grad``
or ``source_grad`` where the user called value_and_grad, vjp or grad, ``y / i`` computing
inf at i == 0 where Python raises, Python's raw "super(): no arguments". Oracles:
PyTorch's autograd, Python itself and closed forms, never another mode of minigraph.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.autodiff.source import SourceTransformError
from minigraph.errors import GradientError

W0, X0 = np.array([0.5, 1.0, 1.5]), np.array([1.5, 2.0, 2.5])


def _line(fn, text: str) -> str:
    """``line N)``, the place a refusal gives for the line of ``fn`` containing ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return f"line {first + next(k for k, line in enumerate(lines) if text in line)})"


# -- a tensor that requires a gradient, read from outside f: f runs on the tape -------------

class _Holder:
    pass


_HELD = _Holder()


def _weighted_squares(w):
    return mg.sum(w * _HELD.t ** 2)


def _weighted_squares_vector(w):
    return w * _HELD.t ** 2


def _scaled_squares(w):
    return mg.sum(w * _HELD.t ** 2 * _HELD.u)


def _torch_x_grad(with_value: bool) -> np.ndarray:
    """x.grad of backward() through [value +] sum(gradient), by PyTorch."""
    tx = torch.tensor(X0, requires_grad=True)
    tw = torch.tensor(W0, requires_grad=True)
    v = torch.sum(tw * tx ** 2)
    (g,) = torch.autograd.grad(v, tw, create_graph=True)
    ((v if with_value else 0.0) + g.sum()).backward()
    return tx.grad.numpy()


@pytest.mark.parametrize("with_value", [True, False])
def test_every_call_reading_a_held_tensor_backpropagates_to_it(with_value):
    """f reads x (requires_grad) through an object's attribute. The program held
    ``x ** 2`` as a constant computed on the tape when it was written: the first call's
    backward() released that tape, and the second call's failed ("the tape behind this
    tensor ... was used by an earlier backward() and released"). Each call now runs f on
    the tape, as PyTorch builds a fresh graph per call (value_and_grad and grad)."""
    x = mg.tensor(X0, requires_grad=True)
    _HELD.t = x
    if with_value:
        vg = mg.value_and_grad(_weighted_squares, mode="source")
    else:
        g = mg.grad(_weighted_squares, mode="source")
    for _ in range(2):
        x.grad = None
        if with_value:
            value, grad = vg(mg.tensor(W0))
            (value + mg.sum(grad)).backward()
        else:
            mg.sum(g(mg.tensor(W0))).backward()
        np.testing.assert_allclose(x.grad.numpy(), _torch_x_grad(with_value), rtol=1e-12)


def test_requires_grad_set_after_the_program_was_written_reaches_the_tensor():
    """The program was written while y needed no gradient, so ``y ** 2`` was a constant
    off the tape; after ``y.requires_grad_(True)`` the next call's value was cut off
    from y: backward() said no input required a gradient, or, where f also read a tensor
    that did (u), left y.grad None, silently. Oracle: PyTorch, y.grad = 2 w y u."""
    y = mg.tensor(X0)
    u = mg.tensor([2.0], requires_grad=True)
    _HELD.t, _HELD.u = y, u
    vg = mg.value_and_grad(_scaled_squares, mode="source")
    vg(mg.tensor(W0))  # (written now, y needing no gradient)
    y.requires_grad_(True)
    value, _ = vg(mg.tensor(W0))
    value.backward()
    ty = torch.tensor(X0, requires_grad=True)
    torch.sum(torch.tensor(W0) * ty ** 2 * torch.tensor([2.0])).backward()
    assert y.grad is not None
    np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy(), rtol=1e-12)


def test_a_source_vjp_reading_a_held_tensor_backpropagates_at_every_call():
    """mg.vjp in source mode: the value and the pullback's gradient both came from the
    program's constant ``x ** 2``, recorded once: the second call's backward() hit the
    released tape. Oracle: PyTorch's autograd, x.grad = 2 w x + 2 x."""
    x = mg.tensor(X0, requires_grad=True)
    _HELD.t = x
    tx = torch.tensor(X0, requires_grad=True)
    tw = torch.tensor(W0, requires_grad=True)
    out = tw * tx ** 2
    (gw,) = torch.autograd.grad(out, tw, torch.ones(3, dtype=torch.float64),
                                create_graph=True)
    (out.sum() + gw.sum()).backward()
    for _ in range(2):
        x.grad = None
        value, vjp_fn = mg.vjp(_weighted_squares_vector, mg.tensor(W0), mode="source")
        (grad,) = vjp_fn(mg.ones(3, "float64"))
        np.testing.assert_allclose(grad.numpy(), gw.detach().numpy(), rtol=1e-12)
        (mg.sum(value) + mg.sum(grad)).backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12)


# -- errors name the function the user called -----------------------------------------------

def _vector_out(v):
    return v * 2.0


def _nothing_out(v):
    return None


def _while_loop(v):
    while v.sum() > 10.0:
        v = v * 0.5
    return mg.sum(v)


def _number_of_a_value(v):
    return mg.sum(v) * float(mg.sum(v))


@pytest.mark.parametrize("call, who", [
    (lambda x: mg.value_and_grad(_vector_out, mode="source")(x), "value_and_grad"),
    (lambda x: mg.value_and_grad(_nothing_out, mode="source")(x), "value_and_grad"),
    (lambda x: mg.source_grad(_vector_out)(x), "source_grad"),
])
def test_a_wrong_output_names_the_function_called(call, who):
    """f returning a vector or None: source mode said "grad: f must return ..." whatever
    the user called (value_and_grad, source_grad), where every other mode names it."""
    with pytest.raises((TypeError, GradientError)) as caught:
        call(mg.tensor([1.0, 2.0]))
    assert str(caught.value).startswith(f"{who}: f must return a ")


@pytest.mark.parametrize("call, who", [
    (lambda f, x: mg.grad(f, mode="source")(x), "grad"),
    (lambda f, x: mg.value_and_grad(f, mode="source")(x), "value_and_grad"),
    (lambda f, x: mg.vjp(f, x, mode="source"), "vjp"),
    (lambda f, x: mg.source_grad(f)(x), "source_grad"),
])
@pytest.mark.parametrize("f, construct", [(_while_loop, "a while loop"),
                                          (_number_of_a_value, "calling float on a value")])
def test_a_refusal_names_the_function_called(call, who, f, construct):
    """Every source-mode refusal began with "source_grad:", also when the user called
    mg.grad, mg.value_and_grad or mg.vjp: one found reading f (a while loop) and one
    found writing the program (float() of a value of the program)."""
    with pytest.raises(SourceTransformError) as caught:
        call(f, mg.tensor([1.0, 2.0]))
    assert str(caught.value).startswith(f"{who}: {construct}")
    assert caught.value.who == who


# -- a Python float divided by a loop index that takes the value 0 ---------------------------

def _float_over_index(x, y, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        acc = acc + x[i] * (y / i)
    return acc


def _float_modulo_index(x, y, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        acc = acc + x[i] * (y % i)
    return acc


def _float_floor_over_index(x, y, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        acc = acc + x[i] * (y // (i - 1))
    return acc


def _float_over_condition(x, y, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        acc = acc + x[i] * (y / (i > 0))
    return acc


def _literal_over_index(x, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        acc = acc + x[i] * (1.0 / i)
    return acc


@pytest.mark.parametrize("f, text", [(_float_over_index, "(y / i)"),
                                     (_float_modulo_index, "(y % i)"),
                                     (_float_floor_over_index, "(y // (i - 1))"),
                                     (_float_over_condition, "(y / (i > 0))")])
def test_a_float_divided_by_a_loop_index_that_is_zero_is_refused(f, text):
    """y / i, y a float argument, at i == 0: Python (eager mode) raises
    ZeroDivisionError, source mode wrote a tensor division and returned inf or nan
    gradients without a word. Now refused, naming the line."""
    x = mg.tensor([1.0, 2.0, 3.0])
    with pytest.raises(ZeroDivisionError):  # the oracle: Python's own arithmetic
        f(x, 2.0, 3)
    with pytest.raises(SourceTransformError, match="ZeroDivisionError") as caught:
        mg.grad(f, mode="source")(x, 2.0, 3)
    assert _line(f, text) in str(caught.value)


def test_a_number_divided_by_a_loop_index_that_is_zero_names_the_line():
    """1.0 / i at i == 0 raised NumPy's raw FloatingPointError ("divide by zero
    encountered in divide"), naming neither f's line nor i; Python raises
    ZeroDivisionError. Now the refusal names the expression and the line."""
    x = mg.tensor([1.0, 2.0, 3.0])
    with pytest.raises(ZeroDivisionError):
        _literal_over_index(x, 3)
    with pytest.raises(SourceTransformError, match=r"1\.0 / i") as caught:
        mg.grad(_literal_over_index, mode="source")(x, 3)
    assert _line(_literal_over_index, "(1.0 / i)") in str(caught.value)


def _divided_where_an_if_skips_zero(x, y, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        if i > 0:
            acc = acc + x[i] * (1.0 / i) * (y / i)
        else:
            acc = acc + x[i] * (y % (i + 1))
    return acc


def _divided_where_the_else_runs_at_zero(x, y, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        if i > 0:
            acc = acc + x[i]
        else:
            acc = acc + x[i] * (y / i)
    return acc


def test_a_division_by_the_loop_index_in_a_branch_that_skips_zero_is_written():
    """``if i > 0: ... 1.0 / i`` failed with NumPy's raw FloatingPointError: Python's
    arithmetic on the index was computed at every value it takes, also at i == 0, where
    the branch never runs. Only the values at which the line runs are checked now (and
    the else branch, which runs at i == 0, is refused). Closed form: d/dx[i] = y / i**2
    for i > 0, y % 1 for i == 0."""
    x = mg.tensor([1.0, 2.0, 3.0])
    got = mg.grad(_divided_where_an_if_skips_zero, mode="source")(x, 2.5, 3)
    np.testing.assert_allclose(got.numpy(), [2.5 % 1, 2.5, 2.5 / 4], rtol=1e-12)
    with pytest.raises(ZeroDivisionError):  # (Python: the else branch divides by 0)
        _divided_where_the_else_runs_at_zero(x, 2.5, 3)
    with pytest.raises(SourceTransformError) as caught:
        mg.grad(_divided_where_the_else_runs_at_zero, mode="source")(x, 2.5, 3)
    assert _line(_divided_where_the_else_runs_at_zero, "(y / i)") in str(caught.value)


def _float_over_zero(x, y):
    return mg.sum(x) * (y / 0)


@pytest.mark.parametrize("mode", ["graph", "source"])
def test_a_float_argument_divided_by_zero_raises_as_python_does(mode):
    """y / 0, y a float argument: Python raises ZeroDivisionError, a compiled program
    computed inf (the divisor, a number, is known while f is recorded)."""
    x = mg.tensor([1.0, 2.0])
    with pytest.raises(ZeroDivisionError):
        _float_over_zero(x, 2.0)
    with pytest.raises(ZeroDivisionError):
        mg.grad(_float_over_zero, mode=mode)(x, 2.0)


def _float_over_shifted_index(x, y, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        acc = acc + x[i] * (y / (i + 1)) + x[i] * (y % (i + 1))
    return acc


def test_a_float_divided_by_a_loop_index_that_is_never_zero_is_differentiated():
    """The check refuses a zero divisor only: y / (i + 1) and y % (i + 1) keep Python's
    values (closed form: d/dx[i] = y / (i + 1) + y % (i + 1))."""
    x = mg.tensor([1.0, 2.0, 3.0])
    got = mg.grad(_float_over_shifted_index, mode="source")(x, 2.5, 3)
    want = [2.5 / (i + 1) + 2.5 % (i + 1) for i in range(3)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    with pytest.raises(SourceTransformError):  # (and y / i, the same loop, is refused)
        mg.grad(_float_over_index, mode="source")(x, 2.5, 3)


# -- super() in a method f calls -----------------------------------------------------------

SCALE = 2.0


class _Base:
    def forward(self, x):
        return x * SCALE


class _Child(_Base):
    def forward(self, x):
        return super().forward(x) + 1.0


class _GrandChild(_Child):
    def forward(self, x):
        return super().forward(x) * x


_MODEL = _GrandChild()


def _through_super(x):
    return mg.sum(_MODEL.forward(x))


def _super_outside_a_method(x):
    return mg.sum(super().forward(x))


def test_super_without_arguments_in_a_method_is_followed():
    """super().forward(x) in a method f calls failed with Python's raw "RuntimeError:
    super(): no arguments" (super() read minigraph's frame, not the method's). Closed
    form: d/dx sum((2 x + 1) x) = 4 x + 1, through two levels of super()."""
    x = np.array([1.0, 2.0, -0.5])
    got = mg.grad(_through_super, mode="source")(mg.tensor(x))
    np.testing.assert_allclose(got.numpy(), 4 * x + 1, rtol=1e-12)


def test_super_outside_a_method_is_pythons_error_with_the_line():
    """Where Python's super() cannot work either (no class around it), source mode gives
    Python's own error and the line (it gave "super(): no arguments", the wrong cause)."""
    x = mg.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match="__class__ cell not found"):
        _super_outside_a_method(x)
    with pytest.raises(RuntimeError, match="__class__ cell not found") as caught:
        mg.grad(_super_outside_a_method, mode="source")(x)
    assert "_super_outside_a_method" in str(caught.value)


@pytest.mark.parametrize("mode", ["source", "graph"])
def test_vjp_and_jacrev_after_a_held_tensor_is_bound_anew(mode):
    """f reads HELD.t, a tensor that requires a gradient; after HELD.t was bound to
    another tensor and mg.vjp called again, vjp_fn refused ("f reads t, which holds
    another value since mg.vjp ran f ... call mg.vjp again"): the program kept for f's
    taped calls was never built again, so the reads vjp_fn compares were the first
    tensor's. Oracle: torch.func.vjp of w * t**2, and jacrev's diagonal."""
    w0 = np.array([0.5, 1.0, 1.5])
    for t0 in (np.array([1.5, 2.0, 2.5]), np.array([3.0, 4.0, 5.0])):
        _HELD.t = mg.tensor(t0, requires_grad=True)
        want = torch.func.vjp(lambda w: w * torch.tensor(t0) ** 2, torch.tensor(w0))[1](
            torch.ones(3, dtype=torch.float64))[0].numpy()
        _, vjp_fn = mg.vjp(_weighted_squares_vector, mg.tensor(w0), mode=mode)
        np.testing.assert_allclose(vjp_fn(mg.ones(3, "float64"))[0].numpy(), want)
        jac = mg.jacrev(_weighted_squares_vector, mode=mode)(mg.tensor(w0)).numpy()
        np.testing.assert_allclose(np.diag(jac), want)
