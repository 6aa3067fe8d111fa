"""``x // y`` and ``x % y``: floored as Python, NumPy and PyTorch floor them.

NumPy is the oracle of dtypes and values, PyTorch (torch.floor_divide, torch.remainder and
autograd) of values and of the remainder's derivative, d(x % y) = dx - floor(x / y) dy.
``x // y`` is constant between its jumps: no gradient flows through it (a zero almost
everywhere, as JAX gives it; PyTorch raises).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigraph as mg
from minigraph.errors import DTypeError

torch = pytest.importorskip("torch")

DTYPES = ["float64", "float32", "int64", "int32"]


@st.composite
def operands(draw):
    dtype = draw(st.sampled_from(DTYPES))
    values = st.integers(-9, 9) if dtype.startswith("int") else st.floats(-9, 9, width=32)
    x = np.array(draw(st.lists(values, min_size=4, max_size=4)), dtype=dtype)
    y = np.array(draw(st.lists(values.filter(lambda v: v != 0), min_size=4, max_size=4)),
                 dtype=dtype)
    return x, y


@settings(max_examples=60, deadline=None)
@given(operands(), st.sampled_from(["//", "%"]), st.sampled_from(["tensor", "number"]))
def test_values_and_dtypes_match_numpy_and_pytorch(xy, op, right):
    x, y = xy
    other = y if right == "tensor" else y[0].item()  # (a Python number: weak, as in NumPy)
    want = eval(f"x {op} other")  # noqa: S307 - NumPy's own operator is the oracle
    got = eval(f"mg.tensor(x) {op} (mg.tensor(other) if right == 'tensor' else other)")  # noqa: S307
    assert got.dtype == want.dtype.name
    np.testing.assert_array_equal(got.numpy(), want)
    torch_op = torch.floor_divide if op == "//" else torch.remainder
    np.testing.assert_array_equal(got.numpy(), torch_op(torch.tensor(x), torch.tensor(y)
                                                       if right == "tensor" else other).numpy())


def remainder_loss(x, y):
    return mg.sum(mg.sin(x % y) * y)


@pytest.mark.parametrize("mode", mg.MODES)
def test_the_remainders_gradient_is_pytorchs_in_every_mode(mode):
    x = np.array([3.3, -1.7, 0.45, 2.6, -0.35, 7.9])
    y = np.array([0.7, 0.9, -1.3, 1.7, 0.6, -0.8])  # (x / y far from an integer: no jump)
    xt, yt = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    (torch.sin(torch.remainder(xt, yt)) * yt).sum().backward()
    gx, gy = mg.grad(remainder_loss, argnums=(0, 1), mode=mode)(x, y)
    np.testing.assert_allclose(gx.numpy(), xt.grad.numpy(), rtol=1e-13)
    np.testing.assert_allclose(gy.numpy(), yt.grad.numpy(), rtol=1e-13)


def through_floor_divide(x):
    return mg.sum((x // 0.5) * x)


@pytest.mark.parametrize("mode", mg.MODES)
def test_no_gradient_flows_through_floor_divide(mode):
    """d/dx of (x // 0.5) * x is x // 0.5 (the closed form): the floor is a constant."""
    x = np.array([1.3, -0.2, 0.7])
    g = mg.grad(through_floor_divide, mode=mode)(x)
    np.testing.assert_array_equal(g.numpy(), x // 0.5)
    assert not (mg.tensor(x, requires_grad=True) // 0.5).requires_grad


def test_two_bools_are_refused_as_numpy_would_give_int8():
    with pytest.raises(DTypeError, match="floor_divide of two bools.*int8"):
        mg.tensor([True, False]) // mg.tensor([True, True])
    with pytest.raises(DTypeError, match="remainder of two bools"):
        mg.tensor([True]) % True
    np.testing.assert_array_equal((mg.tensor([True, False]) % 2).numpy(), [1, 0])


def test_an_update_in_place_writes_through_as_in_numpy():
    """``a //= 2`` (and ``%=``, ``**=``) writes into the array, so another name for it sees
    the change, as in NumPy; Python would otherwise rebind the name to a new tensor."""
    for op, want in [("//=", [1.0, -2.0, 3.0]), ("%=", [1.0, 1.0, 0.0]),
                     ("**=", [9.0, 9.0, 36.0])]:
        a = mg.tensor(np.array([3.0, -3.0, 6.0]))
        b = a
        exec(f"b {op} 2", {}, {"b": b})  # noqa: S102 - the statement under test
        np.testing.assert_array_equal(a.numpy(), want, err_msg=op)
        n = np.array([3.0, -3.0, 6.0])
        exec(f"n {op} 2", {}, {"n": n})  # noqa: S102 - NumPy's own update, the oracle
        np.testing.assert_array_equal(n, want, err_msg=op)
    counts = mg.tensor(np.array([7, 8]))
    with pytest.raises(DTypeError, match="remainder in place.*float64.*keeps the tensor's "
                                         "dtype int64"):
        counts %= 2.5


def weak_remainder(x, s):
    return mg.sum(x % s)


@pytest.mark.parametrize("mode", ["tape", "graph", "source"])
def test_a_python_float_stays_weak_with_the_new_operators(mode):
    x = np.array([3.3, -1.7, 0.45], dtype=np.float32)
    v, g = mg.value_and_grad(weak_remainder, mode=mode)(mg.tensor(x), 0.7)
    want = np.sum(x % 0.7)
    assert v.dtype == want.dtype.name == "float32" and v.item() == want
    assert mg.trace(weak_remainder)(mg.tensor(x), 0.7).dtype == "float32"
    np.testing.assert_array_equal(g.numpy(), np.ones(3, dtype=np.float32))


@settings(max_examples=40, deadline=None)
@given(operands(), st.sampled_from(["tensor", "number"]), st.booleans())
def test_divmod_is_numpys(xy, right, reflected):
    """divmod(x, y) is (x // y, x % y), as np.divmod; with a number on the left too
    (``__rdivmod__``). It raised a TypeError."""
    x, y = xy
    if reflected:  # a number or a tensor on the left, a tensor (nonzero) on the right
        left = y[0].item() if right == "number" else y
        want, got = np.divmod(left, y), divmod(left if right == "number" else mg.tensor(left),
                                               mg.tensor(y))
    else:
        other = y if right == "tensor" else y[0].item()
        want = np.divmod(x, other)
        got = divmod(mg.tensor(x), mg.tensor(other) if right == "tensor" else other)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype.name
        np.testing.assert_array_equal(g.numpy(), w)


@pytest.mark.parametrize("mode", mg.MODES)
def test_divmod_inside_every_mode(mode):
    """The remainder's half carries its gradient (d(x % 2)/dx = 1), the quotient none."""
    x = np.array([3.3, -1.7, 0.45])

    def f(v):
        q, r = divmod(v, 2.0)
        return mg.sum(q * r * r)

    g = mg.grad(f, mode=mode)(x)
    q, r = np.divmod(x, 2.0)
    np.testing.assert_allclose(g.numpy(), 2 * q * r, rtol=1e-13)
