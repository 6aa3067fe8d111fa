"""Source mode follows Python's rules for names, numbers and the loop index.

Each test is a bug that gave a silent wrong value, an untrue refusal or a raw error:
an annotated assignment (``b: float = a``) that escaped alias tracking, a loop index
rebound in the body (``i = i + 1``) forgotten after the loop, a local read before its
assignment that read the global of the same name, a float argument times the loop index,
the loop index under abs(), divmod(), /, ** and reflected // and %, two accumulators
started from one Python number refused as aliases, and a closure over a vmap batch
called "a value being differentiated". Oracles: PyTorch's autograd, closed forms and
Python itself, never another mode of minigraph.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.autodiff.source import SourceTransformError

X = np.array([0.3, 0.7, 1.1, 1.7])


def _torch_grad(fn, x: np.ndarray, *rest) -> np.ndarray:
    t = torch.tensor(x, requires_grad=True)
    grad, = torch.autograd.grad(fn(t, *rest), [t])
    return grad.numpy()


# -- b: T = a is b = a --------------------------------------------------------------------

def annotated_alias(x):
    a = x * 1.0
    b: float = a  # b is a's object, as after b = a
    b += x  # eager mode writes into it, so a changes too
    return mg.sum(a * b)


def annotated_new(x):
    a = x * 1.0
    b: float = a * 2.0
    b += x
    return mg.sum(a * b)


def test_annotated_assignment_is_an_assignment():
    """``b: float = a`` gave b an object of its own, so ``b += x`` (eager mode: a changes
    too) silently computed a and b apart; it is refused now, as after ``b = a``, and an
    annotated assignment of a new value computes as PyTorch does."""
    with pytest.raises(SourceTransformError, match="update in place of b, whose value"):
        mg.grad(annotated_alias, mode="source")(mg.tensor(X))
    got = mg.grad(annotated_new, mode="source")(mg.tensor(X)).numpy()
    want = _torch_grad(lambda t: (t * (t * 2.0 + t)).sum(), X)  # 3 x^2: 6 x
    np.testing.assert_allclose(got, want)


# -- the loop index rebound in the body ----------------------------------------------------

def one_based(x, n):
    acc = x[0] * 1.0
    for i in range(n):
        i = i + 1  # Python: after the loop, i is the body's last value, n
        acc = acc * x[i]
    return acc * x[i]


def torch_one_based(x, n):
    acc = x[0] * 1.0
    for i in range(n):
        i = i + 1
        acc = acc * x[i]
    return acc * x[i]


def rebound_to_a_tensor(x, n):
    acc = x[0] * 1.0
    for i in range(n):
        i = x[1] * 2.0
        acc = acc * i
    return acc * i


def test_loop_index_rebound_in_the_body_is_kept_after_the_loop():
    """After ``for i in range(n): i = i + 1`` Python's i is n; source mode set it to the
    range's last value, n - 1, and read the wrong element after the loop (a silent wrong
    value). A rebinding it cannot name after the loop (a tensor) is refused where read."""
    got = mg.grad(one_based, mode="source")(mg.tensor(X), 3).numpy()
    np.testing.assert_allclose(got, _torch_grad(torch_one_based, X, 3))
    with pytest.raises(SourceTransformError, match="reading i after the loop"):
        mg.grad(rebound_to_a_tensor, mode="source")(mg.tensor(X), 3)


# -- a local read before its assignment ----------------------------------------------------

SCALE = 2.0


def reads_local_early(x):
    y = x * SCALE  # SCALE is this function's local: assigned below
    SCALE = 0.5
    return mg.sum(y * SCALE)


def reads_local_early_in_loop(x, n):
    acc = x * 1.0
    for i in range(n):
        acc = acc * SCALE  # (Python: unbound in the first iteration)
        SCALE = 0.5
    return mg.sum(acc)


def test_local_read_before_assignment_is_unbound():
    """A name the function assigns is its local everywhere in it: Python raises
    UnboundLocalError where it is read first. Source mode read the module's global of the
    same name instead, and returned a gradient. In a loop's body, where Python may read
    what an earlier iteration assigned, it is refused, naming the variable."""
    for f, args in [(reads_local_early, ()), (reads_local_early_in_loop, (2,))]:
        with pytest.raises(UnboundLocalError, match="SCALE"):  # Python itself
            f(mg.tensor(X), *args)
    with pytest.raises(UnboundLocalError, match="local variable 'SCALE'"):
        mg.grad(reads_local_early, mode="source")(mg.tensor(X))
    with pytest.raises(SourceTransformError, match="reading SCALE, a local variable"):
        mg.grad(reads_local_early_in_loop, mode="source")(mg.tensor(X), 2)


# -- a float argument meets the loop index ---------------------------------------------------

def float_times_index(x, y, n):
    acc = mg.sum(x)
    for i in range(n):
        acc = acc + x[i] * (y * i) + x[i] * (i - y) + x[i] * (y * (i == 1))
    return acc


def test_float_argument_times_loop_index():
    """``y * i`` and ``y * (i == 1)`` (y a Python float argument, weak; i the loop
    index) raised a raw AttributeError ('Index' object has no attribute 'dtype'). It is
    Python's float arithmetic: weak, so a float32 x keeps float32."""
    want = _torch_grad(lambda t, y, n: t.sum() + sum(t[i] * (y * i) + t[i] * (i - y)
                                                     + t[i] * (y * (i == 1))
                                                     for i in range(n)), X, 0.5, 3)
    got = mg.grad(float_times_index, mode="source")(mg.tensor(X), 0.5, 3)
    np.testing.assert_allclose(got.numpy(), want)
    got32 = mg.grad(float_times_index, mode="source")(mg.tensor(X.astype(np.float32)), 0.5, 3)
    assert got32.dtype == "float32"
    np.testing.assert_allclose(got32.numpy(), want, rtol=1e-6)


# -- the loop index is a Python int ----------------------------------------------------------

def index_arithmetic(x, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        q, r = divmod(i, 2)
        acc = acc + x[i] * (abs(i - 1) + q + 10 * r + i / 2 + i ** 2 + 2 ** i + 1.0 / (i + 1)
                            + 7 // (i + 1) + 7 % (i + 1) + 2 ** i ** 2 + (-i) ** 2)
    return acc


def index_coefficient(i: int) -> float:
    q, r = divmod(i, 2)
    return (abs(i - 1) + q + 10 * r + i / 2 + i ** 2 + 2 ** i + 1.0 / (i + 1)
            + 7 // (i + 1) + 7 % (i + 1) + 2 ** i ** 2 + (-i) ** 2)


def negative_power(x, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        acc = acc + x[i] * 2 ** (i - 1)
    return acc


def bitwise(x, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        acc = acc + x[i] * (i & 1)
    return acc


def test_loop_index_takes_python_int_arithmetic():
    """abs(i - 1) and divmod(i, 2), though source mode lists both as safe builtins, and
    7 // (i + 1), 7 % (i + 1), raised raw TypeErrors; i / 2, i ** 2, 2 ** i and 1.0 / (i + 1)
    were refused as operators "minigraph has no primitive for", which is untrue. The
    gradient is the closed form d/dx_i = the coefficient Python computes for i."""
    got = mg.grad(index_arithmetic, mode="source")(mg.tensor(X), 4).numpy()
    np.testing.assert_allclose(got, [index_coefficient(i) for i in range(4)])
    # Python's 2 ** -1 is a float, 2 ** 1 an int: refused, saying so
    with pytest.raises(SourceTransformError, match="negative integer power"):
        mg.grad(negative_power, mode="source")(mg.tensor(X), 3)
    with pytest.raises(SourceTransformError, match="BitAnd on a loop index"):
        mg.grad(bitwise, mode="source")(mg.tensor(X), 3)


# -- Python numbers are never updated in place -----------------------------------------------

def two_accumulators(x):
    a = b = 0.0
    a += mg.sum(x)  # a Python number: a is rebound, b stays 0.0
    b += mg.sum(x * x)
    return a * b


def index_copy(x, n):
    acc = mg.sum(x) * 0.0
    for i in range(n):
        j = i
        j += 1  # an int: j is rebound, i stays
        acc = acc + x[j] * x[i]
    return acc


def test_numbers_shared_by_two_names_are_not_aliases():
    """``a = b = 0.0; a += x.sum()`` and ``j = i; j += 1`` were refused as updates in
    place of a value the other name holds too; Python numbers are immutable, so ``+=``
    rebinds the one name, as eager mode and PyTorch compute."""
    got = mg.grad(two_accumulators, mode="source")(mg.tensor(X)).numpy()
    np.testing.assert_allclose(got, _torch_grad(lambda t: t.sum() * (t * t).sum(), X))
    got = mg.grad(index_copy, mode="source")(mg.tensor(X), 3).numpy()
    want = _torch_grad(lambda t: sum(t[i + 1] * t[i] for i in range(3)), X)
    np.testing.assert_allclose(got, want)


# -- a closure over a vmap batch ---------------------------------------------------------

W0 = np.ones(3)
BATCH = np.arange(6.0).reshape(2, 3)


def sin_loss(w, x):
    return mg.sum(mg.sin(w * x) * x)


def test_closure_over_a_vmap_batch_names_vmap():
    """A source-mode function closing over a value of an enclosing mg.vmap was refused
    as closing over "a value being differentiated (by an enclosing mg.grad, jvp or
    trace ...)": nothing differentiates it. The refusal names mg.vmap now, and its advice
    (pass it as an argument) gives the closed form cos(w x) x x per example."""
    def closes_over(x):
        def inner(w):
            return mg.sum(mg.sin(w * x) * x)
        return mg.grad(inner, mode="source")(mg.tensor(W0))

    with pytest.raises(SourceTransformError, match="batch of an enclosing mg.vmap") as info:
        mg.vmap(closes_over)(mg.tensor(BATCH))
    assert "being differentiated" not in str(info.value)
    want = np.cos(W0 * BATCH) * BATCH * BATCH  # d/dw of sum(sin(w x) x), per example
    got = mg.vmap(lambda x: mg.grad(sin_loss, mode="source")(mg.tensor(W0), x))(
        mg.tensor(BATCH))
    np.testing.assert_allclose(got.numpy(), want)
