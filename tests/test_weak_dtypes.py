"""Python's numbers and dtype casts keep their values in every mode, or are refused.

In a compiled program (mg.trace, graph and source mode) a float argument ``s`` is a weak
value (``minigraph/ops/weak.py``), and Python's arithmetic on it and on what it makes,
``(s > 0)``, must be Python's: a bool is an int there (``True + True`` is 2, where NumPy's
bool addition is logical or), and an int never wraps around. A cast to a dtype
(``mg.tensor(..., dtype=)``, a feed, a constant) must keep each number, or say which one
it cannot hold. The oracles are Python's own arithmetic, NumPy's casts and PyTorch.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import DTypeError
from minigraph.graph.graph import FeedError

torch = pytest.importorskip("torch")

X = [1.0, 2.0]
COMPILED = {  # how each compiled mode computes f(x, s)
    "trace": lambda f, x, s: mg.trace(f)(x, s),
    "graph": lambda f, x, s: mg.value_and_grad(f, mode="graph")(x, s)[0],
    "source": lambda f, x, s: mg.value_and_grad(f, mode="source")(x, s)[0],
}


# -- bools are ints in Python's arithmetic -----------------------------------------------
# (module-level functions: source mode reads their code; each with Python's own version)

def add_bools(x, s): return mg.sum(x * ((s > 0) + (s > 0)))
def add_true(x, s): return mg.sum(x * ((s > 0) + True))
def sub_bools(x, s): return mg.sum(x * ((s > 0) - (s < 0)))
def neg_bool(x, s): return mg.sum(x * -(s > 0))
def pos_bool(x, s): return mg.sum(x * (+(s > 0) + (s > 0)))
def abs_bool(x, s): return mg.sum(x * abs(-(s > 0) - 3))
def pow_bools(x, s): return mg.sum(x * ((s > 0) ** (s > 0)))
def pow_negative(x, s): return mg.sum(x * (((s > 0) + 1) ** -1))


BOOL_ARITHMETIC = [
    (add_bools, lambda s: (s > 0) + (s > 0)),
    (add_true, lambda s: (s > 0) + True),
    (sub_bools, lambda s: (s > 0) - (s < 0)),
    (neg_bool, lambda s: -(s > 0)),
    (pos_bool, lambda s: +(s > 0) + (s > 0)),
    (abs_bool, lambda s: abs(-(s > 0) - 3)),
    (pow_bools, lambda s: (s > 0) ** (s > 0)),
    (pow_negative, lambda s: ((s > 0) + 1) ** -1),
]


@pytest.mark.parametrize("mode", list(COMPILED))
@pytest.mark.parametrize("f, python", BOOL_ARITHMETIC, ids=lambda v: getattr(v, "__name__", ""))
def test_bool_arithmetic_is_pythons_in_compiled_modes(f, python, mode):
    """``(s > 0) + (s > 0)`` was NumPy's bool addition, logical or (True, 1), where Python
    and eager mode give 2: a silently wrong value and gradient. ``(s > 0) - (s < 0)``,
    ``-(s > 0)`` and ``(s > 0) ** (s > 0)`` were refused as NumPy's bool arithmetic, and
    ``((s > 0) + 1) ** -1`` as an int to a negative power, where Python computes them."""
    x = mg.tensor(X)
    for s in (1.5, -0.5):
        factor = python(s)  # Python's own arithmetic
        assert COMPILED[mode](f, x, s).item() == pytest.approx(sum(X) * factor)
        if mode != "trace":
            grad = mg.grad(f, mode=mode)(x, s).numpy()
            np.testing.assert_allclose(grad, np.full(2, float(factor)))


def test_bool_sum_scales_an_int32_tensor_and_the_hessian():
    """With an int32 ``x``, ``x * ((s > 0) + (s > 0))`` traced was [1, 2], not [2, 4];
    the hessian of f(x, s) * sum(x) in graph mode was 2, not 4 (closed form: 2 * 2)."""
    xi = mg.tensor([1, 2], dtype="int32")
    assert mg.trace(add_bools)(xi, 1.5).item() == 2 * (1 + 2)
    h = mg.hessian(lambda x, s: add_bools(x, s) * mg.sum(x), mode="graph")(mg.tensor(X), 1.5)
    np.testing.assert_allclose(h.numpy(), np.full((2, 2), 4.0))


# -- Python's other operators on numbers -------------------------------------------------

def and_bools(x, s): return mg.sum(x * ((s > 0) & (s > 1)))
def or_bools(x, s): return mg.sum(x * ((s > 0) | (s > 2)))
def xor_true(x, s): return mg.sum(x * ((s > 0) ^ True))
def invert_bool(x, s): return mg.sum(x * ~(s > 0))
def divmod_float(x, s): return mg.sum(x * sum(divmod(s, 0.5)))
def round_int(x, s): return mg.sum(x * round((s > 0) + 2))
def round_float(x, s): return mg.sum(x * round(s))
def and_float(x, s): return mg.sum(x * (s & 1))
def and_ints(x, s): return mg.sum(x * (((s > 0) + 1) & 1))


@pytest.mark.parametrize("mode", ["trace", "graph"])
@pytest.mark.parametrize("f, python", [
    (and_bools, lambda s: (s > 0) & (s > 1)), (or_bools, lambda s: (s > 0) | (s > 2)),
    (xor_true, lambda s: (s > 0) ^ True), (invert_bool, lambda s: ~(s > 0)),
    (divmod_float, lambda s: sum(divmod(s, 0.5))), (round_int, lambda s: round((s > 0) + 2)),
], ids=lambda v: getattr(v, "__name__", ""))
def test_bitwise_divmod_and_round_of_numbers_are_pythons(f, python, mode):
    """``&``, ``|``, ``^``, ``~``, divmod() and round() raised Python's raw TypeError
    naming the library's class ("unsupported operand type(s) for &: 'Weak' and 'Weak'");
    on bools (and divmod on floats, round on ints) Python computes them."""
    for s in (1.5, 0.7, -0.5):
        assert COMPILED[mode](f, mg.tensor(X), s).item() == pytest.approx(sum(X) * python(s))


def test_divmod_of_a_float_argument_in_source_mode():
    """Source mode raised the same raw TypeError for divmod(s, 0.5)."""
    assert COMPILED["source"](divmod_float, mg.tensor(X), 1.75).item() == \
        pytest.approx(sum(X) * sum(divmod(1.75, 0.5)))


@pytest.mark.parametrize("mode", ["trace", "graph"])
def test_what_python_cannot_or_minigraph_does_not_compute_is_named(mode):
    """round() of a float, ``&`` of ints and of a float: the raw TypeError named 'Weak';
    now Python's own TypeError (a float has no ``&``, as Python says) or a refusal that
    names the operator and the user's line."""
    x = mg.tensor(X)
    with pytest.raises(TypeError, match="unsupported operand type.*'float' and 'int'"):
        and_float(x, 1.5)  # the oracle: Python itself
    with pytest.raises(TypeError, match=r"for &: 'float' and 'int'") as caught:
        COMPILED[mode](and_float, x, 1.5)
    assert "Weak" not in str(caught.value)
    for f, words in [(round_float, r"round\(\)"), (and_ints, "the operator & on ints")]:
        with pytest.raises(DTypeError, match=words + ".*test_weak_dtypes.py"):
            COMPILED[mode](f, x, 1.5)


# -- Python's ints do not wrap around -----------------------------------------------------

def times_2_80(x, s): return mg.sum(x * ((s > 0) * 2**40 * 2**40))
def past_2_63(x, s): return mg.sum(x * (((s > 0) + 2**62) * 4))
def power_70(x, s): return mg.sum(x * (((s > 0) + 1) ** 70))
def below_2_63(x, s): return mg.sum(x * (((s > 0) + 2**61) * 2))
def int32_times_2_40(x, s): return mg.sum(x * ((s > 0) * 2**40))
def int32_times_2_20(x, s): return mg.sum(x * ((s > 0) * 2**20))


@pytest.mark.parametrize("mode", list(COMPILED))
def test_int_arithmetic_beyond_int64_is_refused(mode):
    """``(s > 0) * 2**40 * 2**40`` gave 0 and ``((s > 0) + 2**62) * 4`` gave 12 in every
    compiled mode, where Python's ints give 2**80 and 2**64 + 4: int64 wrapped around.
    Such arithmetic is refused where the program is recorded; what int64 holds is kept
    (compared with NumPy's product of the float array and Python's exact int)."""
    x = mg.tensor(X)
    assert (1 + 2**62) * 4 > np.iinfo(np.int64).max  # the oracle: beyond int64
    for f in (times_2_80, past_2_63, power_70):
        with pytest.raises(DTypeError, match="beyond int64.*test_weak_dtypes.py"):
            COMPILED[mode](f, x, 1.5)
    for s in (1.5, -0.5):
        exact = ((s > 0) + 2**61) * 2  # Python's int
        assert COMPILED[mode](below_2_63, x, s).item() == np.sum(np.array(X) * exact)


def test_an_int_that_int32_cannot_hold_is_refused_beside_an_int32_tensor():
    """``int32_x * ((s > 0) * 2**40)`` traced was 0 (the cast wrapped); eager mode (NumPy)
    raises OverflowError for the Python int 2**40 beside an int32 array."""
    xi = mg.tensor([1, 2], dtype="int32")
    with pytest.raises(OverflowError):
        np.array([1, 2], dtype=np.int32) * 2**40  # the oracle: NumPy's NEP 50
    with pytest.raises(DTypeError, match="int32"):
        mg.trace(int32_times_2_40)(xi, 1.5)
    assert mg.trace(int32_times_2_20)(xi, 1.5).item() == 3 * 2**20


# -- casts to a dtype keep the numbers, or say which they cannot --------------------------

def _numpy_cast(value, dtype):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return np.asarray(value).astype(dtype)


def test_tensor_refuses_a_cast_that_changes_a_number_and_keeps_the_others():
    """mg.tensor(np.array([2**40]), dtype="int32") was [0] (a list was refused, an array,
    a NumPy scalar or a tensor wrapped), a NaN array given int64 was -2**63, 1e300 given
    float32 was inf. NumPy's cast (the oracle) changes each of these numbers. What a cast
    holds still converts, as PyTorch converts it: a float made an int keeps its integer
    part, int32's extremes fit, float32's range holds 3e38."""
    for data, dtype in [(np.array([2**40]), "int32"), (np.int64(2**40), "int32"),
                        ([2**40], "int32"), (mg.tensor([2**40]), "int32"),
                        (np.array([2.0**31]), "int32"), (np.array([np.nan]), "int64"),
                        (np.array([np.inf]), "int32"), (np.array([1e300]), "float32"),
                        ([-1e39], "float32")]:
        values = np.asarray(data.numpy() if isinstance(data, mg.Tensor) else data)
        assert not np.array_equal(_numpy_cast(values, dtype).astype(values.dtype), values)
        with pytest.raises(DTypeError, match=r"tensor\(\): .*(do not fit|no integer|inf in)"):
            mg.tensor(data, dtype=dtype)
    for values, dtype, torch_dtype in [([1.9, -2.7, -2.0**31 - 0.5], "int32", torch.int32),
                                       ([2**31 - 1, -2**31], "int32", torch.int32),
                                       ([3e38, np.inf, -1.0], "float32", torch.float32)]:
        got = mg.tensor(np.array(values), dtype=dtype).numpy()
        expected = torch.tensor(np.array(values)).to(torch_dtype).numpy()
        np.testing.assert_array_equal(got, expected)


def test_feeds_constants_and_variables_refuse_a_float_that_becomes_inf():
    """A feed of [1e300, 2.0] to a float32 placeholder ran as [inf, 2.0], and
    mg.constant([1e300], dtype="float32") and mg.variable held inf, where an int that
    does not fit an int32 node is refused. inf and nan, not finite to begin with, stay."""
    assert np.isinf(_numpy_cast(1e300, "float32"))  # the oracle: NumPy makes it inf
    with mg.Graph() as g:
        p = mg.placeholder(shape=(2,), dtype="float32", name="p")
        y = p * 1.0
        with pytest.raises(DTypeError, match="constant: 1e\\+300 would become inf"):
            mg.constant(np.array([1e300, 1.0]), dtype="float32")
        with pytest.raises(DTypeError, match="variable: -1e\\+39 would become inf"):
            mg.variable(np.array([-1e39]), dtype="float32")
    sess = mg.Session(g)
    with pytest.raises(FeedError, match="feed for 'p': 1e\\+300 would become inf in float32"):
        sess.run(y, feed_dict={p: np.array([1e300, 2.0])})
    out = sess.run(y, feed_dict={p: np.array([np.inf, np.nan])})
    assert np.isinf(out[0]) and np.isnan(out[1])


@pytest.mark.parametrize("make, words", [
    (lambda: mg.tensor([float("nan")], dtype="int64"), r"tensor\(\): nan has no integer"),
    (lambda: mg.tensor([float("inf")], dtype="int32"), r"tensor\(\): inf has no integer"),
    (lambda: mg.tensor(torch.ones(2, dtype=torch.bfloat16)), r"tensor\(\): dtype bfloat16"),
    (lambda: mg.tensor([1.0], dtype=torch.float32), r"tensor\(\): torch.float32"),
    (lambda: mg.astype(mg.tensor([1.0]), torch.float32), r"astype: torch.float32"),
    (lambda: mg.placeholder((2,), dtype=torch.float32), r"placeholder: torch.float32"),
])
def test_dtype_errors_name_the_function_and_the_value(make, words):
    """The errors were Python's "cannot convert float NaN to integer", "an integer ...
    does not fit" for the float inf, torch's "unsupported ScalarType BFloat16" and NumPy's
    "Cannot interpret 'torch.float32' as a data type": no function, or the wrong reason."""
    with pytest.raises(DTypeError, match=words):
        make()


# -- Python data and other libraries' arrays -------------------------------------------


@pytest.mark.parametrize("data", [[10**17 + 3, 2.0], [2**53 + 1, 0.5], [2**63 - 1, 0.5]])
def test_a_list_of_ints_and_floats_keeps_its_ints_exact(data):
    """Through NumPy's own float64 array first, [10**17 + 3, 2.0] became [10**17, 2] in
    int64, and [2**63 - 1, 0.5] was refused as too wide; NumPy and torch convert each
    number by itself."""
    import torch

    expected = torch.tensor(data, dtype=torch.int64).tolist()
    assert expected == np.asarray(data, dtype=np.int64).tolist()
    assert mg.tensor(data, dtype="int64").tolist() == expected


@pytest.mark.parametrize("values, dtype", [([2.0**40], "int32"), ([float("nan")], "int64"),
                                           ([1e300], "float32")])
def test_a_torch_tensor_is_checked_as_a_numpy_array_is(values, dtype):
    """From a torch tensor, 2**40 became 0 in int32, NaN int64's least value and 1e300
    inf in float32, where the same values from NumPy were refused."""
    import torch

    with pytest.raises(DTypeError):
        mg.tensor(np.array(values), dtype=dtype)
    with pytest.raises(DTypeError):
        mg.tensor(torch.tensor(values, dtype=torch.float64), dtype=dtype)


@pytest.mark.parametrize("data, dtype", [([float("nan")], "float64"),
                                         ([float("inf")], "float32"),
                                         ([1.0, -float("inf")], "float64")])
def test_nan_and_inf_written_by_the_user_are_kept(data, dtype):
    """A NaN or an infinity in the data, asked in a float dtype, was refused as "an
    integer ... does not fit" (and with it backward(grad=[nan]), jvp tangents inf ...):
    only a finite number that the dtype cannot hold is. Oracle: NumPy's own values."""
    np.testing.assert_array_equal(mg.tensor(data, dtype=dtype).numpy(),
                                  np.asarray(data, dtype=dtype))


@pytest.mark.parametrize("data, dtype", [([np.array([1e10])], "int32"),
                                         ([np.array(1e10), 1.0], "int32"),
                                         ([np.array([2**40])], "int32"),
                                         ([np.array([float("nan")])], "int64")])
def test_an_array_inside_python_data_is_checked_as_the_data_is(data, dtype):
    """NumPy casts an array among Python data without the range check it makes of a
    Python number: [np.array([1e10])] became [[-2147483648]] in int32. torch refuses."""
    import torch

    with pytest.raises((RuntimeError, ValueError, TypeError)):
        torch.tensor([np.asarray(d).tolist() for d in data], dtype=getattr(torch, dtype))
    with pytest.raises(DTypeError):
        mg.tensor(data, dtype=dtype)
