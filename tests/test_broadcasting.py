"""Broadcasting, property-tested: values match NumPy, gradients come back in each
input's own shape, and reverse mode, forward mode and finite differences agree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays, mutually_broadcastable_shapes

import minigraph as mg
from minigraph.errors import ShapeError
from minigraph.ops.shape_rules import broadcast_shapes

BINARY = {
    "add": (lambda x, y: x + y, np.add),
    "sub": (lambda x, y: x - y, np.subtract),
    "mul": (lambda x, y: x * y, np.multiply),
    "div": (lambda x, y: x / (1.5 + y * y), lambda x, y: x / (1.5 + y * y)),
    "maximum": (mg.maximum, np.maximum),
    "minimum": (mg.minimum, np.minimum),
    "where": (lambda x, y: mg.where(x > y, x * y, y), lambda x, y: np.where(x > y, x * y, y)),
}

shapes = mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3)
floats = st.floats(-2, 2, allow_nan=False, width=64)


@st.composite
def operands(draw):
    s = draw(shapes)
    x = draw(arrays(np.float64, s.input_shapes[0], elements=floats, unique=True))
    y = draw(arrays(np.float64, s.input_shapes[1], elements=floats, unique=True))
    w = draw(arrays(np.float64, s.result_shape, elements=floats))
    return x, y, w


@pytest.mark.parametrize("name", sorted(BINARY))
@given(data=operands())
def test_binary_ops_broadcast_like_numpy(name, data):
    x, y, w = data
    f, ref = BINARY[name]
    if name in ("maximum", "minimum", "where"):
        # x == y is a kink; finite differences (step 1e-6) must not straddle one.
        assume(np.all(np.abs(np.subtract(*np.broadcast_arrays(x, y))) > 1e-3))
    np.testing.assert_allclose(f(mg.tensor(x), mg.tensor(y)).numpy(), ref(x, y), rtol=1e-12)

    def loss(a, b):  # a scalar that weighs every output element differently
        return (f(a, b) * mg.tensor(w)).sum()

    g_tape = mg.grad(loss, argnums=(0, 1))(x, y)
    g_fwd = mg.grad(loss, argnums=(0, 1), mode="forward")(x, y)
    for g, gf, inp in zip(g_tape, g_fwd, (x, y)):
        assert g.shape == inp.shape  # summed back to the input's own shape
        np.testing.assert_allclose(g.numpy(), gf.numpy(), rtol=1e-10, atol=1e-12)
    assert mg.gradcheck(loss, [mg.tensor(x), mg.tensor(y)])


@given(shapes)
def test_broadcast_shape_rule_matches_numpy(s):
    assert broadcast_shapes("op", *s.input_shapes) == np.broadcast_shapes(*s.input_shapes)


@given(st.lists(st.integers(2, 4), min_size=1, max_size=3),
       st.lists(st.integers(2, 4), min_size=1, max_size=3))
def test_broadcast_shape_rule_refuses_what_numpy_refuses(a, b):
    try:
        expected = np.broadcast_shapes(tuple(a), tuple(b))
    except ValueError:
        with pytest.raises(ShapeError, match=r"do not broadcast"):
            broadcast_shapes("op", tuple(a), tuple(b))
    else:
        assert broadcast_shapes("op", tuple(a), tuple(b)) == expected


@given(st.data())
def test_sum_to_undoes_broadcast_to(data):
    s = data.draw(shapes)
    small = s.input_shapes[0]
    x = data.draw(arrays(np.float64, small, elements=floats))
    big = mg.broadcast_to(mg.tensor(x), s.result_shape)
    back = mg.sum_to(big, small)
    copies = int(np.prod(s.result_shape)) // max(int(np.prod(small)), 1)
    np.testing.assert_allclose(back.numpy(), x * copies, rtol=1e-12)
