"""Every primitive in the table, checked against independent oracles.

For each primitive there is at least one case: a function that uses it, inputs away
from kinks, and a NumPy reference for the value. Each case checks

* the value against NumPy (an independent implementation);
* reverse mode (tape) against central finite differences (``mg.gradcheck``);
* forward mode (dual numbers) against the same finite differences;
* the shape/dtype rule of every primitive used against what the kernel produced;

on NumPy and again on array-api-strict's fake devices (the ``backend`` fixture).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import minigraph as mg
from minigraph.autodiff import tape
from minigraph.ops.primitive import PRIMITIVES

rng = np.random.default_rng(0)


def r(*shape, low=-1.0, high=1.0):
    return rng.uniform(low, high, size=shape)


def softmax_np(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


LABELS = np.array([0, 2, 1, 2])
A23, B23, P23 = r(2, 3), r(2, 3), r(2, 3, low=0.5, high=2.0)
M34, V3, Q4 = r(3, 4), r(3), r(4, low=0.5, high=2.0)
DISTINCT = np.array([[0.3, -1.2, 0.9], [1.5, 0.1, -0.4]])  # no ties: max is smooth here

# name -> (function, inputs, NumPy reference)
CASES = {
    "add": (lambda x, y: x + y, (r(3, 1), r(4)), lambda x, y: x + y),
    "sub": (lambda x, y: x - y, (r(2, 3), r(3)), lambda x, y: x - y),
    "mul": (lambda x, y: x * y, (r(3, 1), r(1, 4)), lambda x, y: x * y),
    "div": (lambda x, y: x / y, (A23, P23), lambda x, y: x / y),
    "neg": (lambda x: -x, (A23,), lambda x: -x),
    "AddN": (lambda x, y: mg.add_n([x, y, x]), (A23, B23), lambda x, y: 2 * x + y),
    "pow": (lambda x, y: x ** y, (P23, r(3)), lambda x, y: x ** y),
    "maximum": (lambda x, y: mg.maximum(x, y), (A23, B23), np.maximum),
    "minimum": (lambda x, y: mg.minimum(x, y), (A23, B23), np.minimum),
    # x % y away from its jumps (x / y far from an integer): d/dx 1, d/dy -floor(x / y)
    "remainder": (lambda x, y: x % y, (np.array([[3.3, -1.7, 0.45], [2.6, -0.35, 1.15]]),
                                       np.array([[0.7, 0.9, 1.3], [1.7, 0.6, 0.8]])),
                  np.remainder),
    "exp": (mg.exp, (A23,), np.exp),
    "log": (mg.log, (P23,), np.log),
    "sin": (mg.sin, (A23,), np.sin),
    "cos": (mg.cos, (A23,), np.cos),
    "tanh": (mg.tanh, (A23,), np.tanh),
    "sigmoid": (mg.sigmoid, (A23,), lambda x: 1 / (1 + np.exp(-x))),
    "log_sigmoid": (mg.log_sigmoid, (A23,), lambda x: -np.log1p(np.exp(-x))),
    "relu": (mg.relu, (DISTINCT,), lambda x: np.maximum(x, 0)),
    "abs": (mg.abs, (DISTINCT,), np.abs),
    # relu's VJP; its derivative by y is 0 away from y = 0 (the rule is None)
    "relu_grad": (mg.relu_grad, (B23, DISTINCT), lambda g, y: g * (y > 0)),
    "sqrt": (mg.sqrt, (P23,), np.sqrt),
    "where": (lambda x, y: mg.where(x > 0, x, y), (DISTINCT, B23),
              lambda x, y: np.where(x > 0, x, y)),
    "sum": (lambda x: x.sum(axis=0), (A23,), lambda x: x.sum(axis=0)),
    "mean": (lambda x: x.mean(axis=1, keepdims=True), (A23,), lambda x: x.mean(1, keepdims=True)),
    "max": (lambda x: x.max(axis=1), (DISTINCT,), lambda x: x.max(axis=1)),
    "min": (lambda x: x.min(axis=0), (DISTINCT,), lambda x: x.min(axis=0)),
    "matmul": (lambda x, y: x @ y, (A23.T.copy(), M34[:2]), lambda x, y: x @ y),
    "transpose": (lambda x: mg.transpose(x, (1, 0)), (A23,), lambda x: x.T),
    "reshape": (lambda x: x.reshape(3, 2), (A23,), lambda x: x.reshape(3, 2)),
    "broadcast_to": (lambda x: mg.broadcast_to(x, (2, 3)), (V3,),
                     lambda x: np.broadcast_to(x, (2, 3))),
    "getitem": (lambda x: x[1, 0:2], (A23,), lambda x: x[1, 0:2]),
    "scatter_add": (lambda g: mg.scatter_add(g, (slice(0, 2), 1), (3, 4)), (r(2),),
                    lambda g: np.pad(g[:, None], ((0, 1), (1, 2)))),
    "concatenate": (lambda x, y: mg.concatenate([x, y], axis=1), (A23, M34[:2]),
                    lambda x, y: np.concatenate([x, y], axis=1)),
    "softmax": (lambda x: mg.softmax(x, axis=1), (A23,), softmax_np),
    "log_softmax": (lambda x: mg.log_softmax(x, axis=0), (A23,),
                    lambda x: np.log(softmax_np(x, axis=0))),
    "nll_loss": (lambda x: mg.nll_loss(x, mg.tensor(LABELS)), (r(4, 3),),
                 lambda x: -x[np.arange(4), LABELS].mean()),
    # the VJPs of log_softmax and nll_loss, as primitives of their own
    "log_softmax_grad": (lambda g, y: mg.log_softmax_grad(g, y, axis=1), (r(4, 3), r(4, 3)),
                         lambda g, y: g - np.exp(y) * g.sum(axis=1, keepdims=True)),
    "nll_loss_grad": (lambda g: mg.nll_loss_grad(g, mg.tensor(LABELS), 3), (np.array(0.7),),
                      lambda g: -np.eye(3)[LABELS] * g / 4),
    "identity": (mg.identity, (A23,), lambda x: x),
    # float32 in the middle: finite differences need a larger step (see TOLERANCES)
    "astype": (lambda x: mg.astype(x, "float32") * 1.0, (A23,), lambda x: x.astype(np.float32)),
    "to_device": (lambda x: mg.to_device(x, "cpu:1").sum(), (A23,), lambda x: x.sum()),
    # a call of f whose intermediates are recomputed (autodiff/checkpoint.py)
    "checkpoint": (mg.checkpoint(lambda x, w: mg.sin(x @ w) * x), (A23, r(3, 3)),
                   lambda x, w: np.sin(x @ w) * x),
}

# gradcheck settings for cases whose values pass through float32
TOLERANCES = {"astype": dict(eps=1e-2, rtol=1e-3, atol=1e-4)}

# Primitives without a derivative: only their values are checked.
VALUE_CASES = {
    "less": (lambda x: x < 0.2, np.less), "less_equal": (lambda x: x <= 0.2, np.less_equal),
    "greater": (lambda x: x > 0.2, np.greater),
    "greater_equal": (lambda x: x >= 0.2, np.greater_equal),
    "equal": (lambda x: x == x[0], np.equal), "not_equal": (lambda x: x != x[0], np.not_equal),
    "stop_gradient": (mg.stop_gradient, lambda x: x),
    "no_grad": (mg.PRIMITIVES["no_grad"], lambda x: x),  # (its tangents: test_nesting.py)
    "floor_divide": (lambda x: x // 0.15, lambda x: np.floor_divide(x, 0.15)),
    "zeros_like": (mg.zeros_like, np.zeros_like), "ones_like": (mg.ones_like, np.ones_like),
    "one_hot": (lambda x: mg.one_hot(mg.tensor([2, 0]), 3), lambda x: np.eye(3)[[2, 0]]),
}


def test_every_primitive_is_checked():
    assert set(PRIMITIVES) == set(CASES) | set(VALUE_CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_matches_numpy(name, backend):
    f, inputs, ref = CASES[name]
    out = f(*[mg.tensor(x) for x in inputs])
    np.testing.assert_allclose(out.numpy(), ref(*inputs), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name,k", [(name, k) for name, (_, inputs, _) in sorted(CASES.items())
                                    if len(inputs) > 1 for k in range(len(inputs))])
def test_a_python_number_as_any_operand_matches_numpy(name, k, backend):
    """mg.relu_grad(g, 2.0) raised AttributeError ('bool' has no 'astype'): each operand of
    each primitive of several operands may be a Python number, as in NumPy, or both refuse."""
    f, inputs, ref = CASES[name]
    number = float(np.asarray(inputs[k]).flat[0])
    args = [number if j == k else mg.tensor(x) for j, x in enumerate(inputs)]
    try:
        want = ref(*[np.float64(number) if j == k else x for j, x in enumerate(inputs)])
    except ValueError:  # NumPy refuses (matmul, concatenate of a 0-d value): so do we, by name
        with pytest.raises(ValueError):
            f(*args)
        return
    np.testing.assert_allclose(f(*args).numpy(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(VALUE_CASES))
def test_nondifferentiable_value_matches_numpy(name, backend):
    f, ref = VALUE_CASES[name]
    x = np.array([0.1, 0.2, 0.3])
    out = f(mg.tensor(x, requires_grad=True))
    expected = ref(x, 0.2) if name in ("less", "less_equal", "greater", "greater_equal") else (
        ref(x, x[0]) if name in ("equal", "not_equal") else ref(x))
    np.testing.assert_array_equal(out.numpy(), expected)
    assert not out.requires_grad  # no derivative flows through these


@pytest.mark.parametrize("mode", ["tape", "forward"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name, mode, backend):
    f, inputs, _ = CASES[name]
    assert mg.gradcheck(f, [mg.tensor(x) for x in inputs], mode=mode,
                        **TOLERANCES.get(name, {}))


@pytest.mark.parametrize("name", sorted(CASES))
def test_shape_rule_matches_kernel(name):
    """Each recorded step's shape/dtype rule predicts what its kernel produced."""
    f, inputs, _ = CASES[name]
    xs = [mg.tensor(x, requires_grad=True) for x in inputs]
    entries, _ = tape._entries([f(*xs)], set())
    assert entries, "the case records at least one primitive"
    for prim, params, t, args in entries:
        assert prim.shape(*args, **params) == (t.shape, t.dtype), prim.name


UNARY = ["exp", "sin", "cos", "tanh", "sigmoid", "sqrt", "log"]


@pytest.mark.parametrize("name", UNARY)
def test_second_derivative_tape_over_tape_matches_forward_over_forward(name):
    f = getattr(mg, name)
    x = 0.7
    tape2 = mg.grad(mg.grad(f))(x).item()
    fwd2 = mg.grad(mg.grad(f, mode="forward"), mode="forward")(x).item()
    h = 1e-4  # central second difference: error O(h^2)
    fd2 = (f(x + h).item() - 2 * f(x).item() + f(x - h).item()) / h ** 2
    assert tape2 == pytest.approx(fwd2, rel=1e-10)
    assert tape2 == pytest.approx(fd2, rel=1e-5, abs=1e-6)


def test_second_derivative_of_sin_is_minus_sin():
    assert mg.grad(mg.grad(mg.sin))(1.0).item() == pytest.approx(-math.sin(1.0), rel=1e-15)
    assert mg.grad(mg.grad(mg.grad(mg.sin)))(1.0).item() == pytest.approx(-math.cos(1.0))


def test_hessian_by_jacfwd_of_jacfwd_and_jacrev_of_jacrev():
    a = np.array([[2.0, 1.0], [1.0, 3.0]])

    def f(x):  # x^T A x / 2 + sum(x^3): Hessian A + diag(6x)
        return (x * (mg.tensor(a) @ x)).sum() / 2 + (x ** 3).sum()

    x = np.array([0.5, -1.0])
    expected = a + np.diag(6 * x)
    np.testing.assert_allclose(mg.jacfwd(mg.jacfwd(f))(x).numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(mg.jacrev(mg.jacrev(f))(x).numpy(), expected, rtol=1e-12)


def test_hessians_through_the_gradient_primitives_have_closed_forms():
    """relu_grad, log_softmax_grad and nll_loss_grad have rules of their own: second
    derivatives through relu and cross_entropy, by reverse over reverse and forward over
    reverse, against closed forms."""
    x = np.array([0.5, -1.0, 2.0])  # sum(relu(x)^3): Hessian diag(6 relu(x))
    cube = lambda v: (mg.relu(v) ** 3).sum()
    for outer in (mg.jacrev, mg.jacfwd):
        np.testing.assert_allclose(outer(mg.grad(cube))(x).numpy(),
                                   np.diag(6 * np.maximum(x, 0)), rtol=1e-12)
    z, labels = DISTINCT, mg.tensor(np.array([2, 0]))  # CE's Hessian: (diag(p) - p p^T) / N
    p = softmax_np(z, axis=1)
    want = np.zeros((2, 3, 2, 3))
    for i in range(2):
        want[i, :, i, :] = (np.diag(p[i]) - np.outer(p[i], p[i])) / 2
    ce = lambda v: mg.cross_entropy(v, labels)
    for outer in (mg.jacrev, mg.jacfwd):
        np.testing.assert_allclose(outer(mg.grad(ce))(z).numpy(), want, rtol=1e-12, atol=1e-15)


def test_a_primitive_without_derivative_rules_is_refused_where_it_is_written():
    """A primitive written without jvp and vjp rules (``x ** 3`` as a student's table
    entry) was taken for a constant: mg.grad, graph mode and mg.jvp all said its
    derivative was 0, where the closed form 3 x^2 is 3 at x = 1 (JAX refuses). A rule
    list with a rule in one mode and none in the other would give 0 in that mode too.
    Now each is refused when written, and ``differentiable=False`` (a comparison's
    declaration) or ``vjp=[None]`` (no derivative through the argument) still works."""
    from minigraph.ops.primitive import Primitive, bind
    from minigraph.ops.shape_rules import same

    cube = lambda xp, x: x ** 3  # noqa: E731
    with pytest.raises(ValueError, match="'cube': no jvp and no vjp rule.*differentiable=False"):
        Primitive("cube", cube, same)
    with pytest.raises(ValueError, match="'cube': no jvp rule"):
        Primitive("cube", cube, same, vjp=[lambda g, out, x: 3.0 * x * x * g])
    with pytest.raises(ValueError, match="'cube': no vjp rule"):
        Primitive("cube", cube, same, jvp=[lambda t, out, x: 3.0 * x * x * t])
    with pytest.raises(ValueError, match="differentiable=False, but a vjp rule"):
        Primitive("cube", cube, same, vjp=[lambda g, out, x: g], differentiable=False)
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    for declared in (Primitive("cube", cube, same, differentiable=False),
                     Primitive("cube", cube, same, vjp=[None])):
        y = bind(declared, x)
        np.testing.assert_array_equal(y.numpy(), [1.0, 8.0])
        assert not y.requires_grad  # (a constant: backward() would refuse it)
    rules = Primitive("cube", cube, same, jvp=[lambda t, out, x: 3.0 * x * x * t],
                      vjp=[lambda g, out, x: 3.0 * x * x * g])
    for mode in ("tape", "graph", "forward"):
        np.testing.assert_allclose(mg.grad(lambda v: mg.sum(bind(rules, v)), mode=mode)(
            mg.tensor([1.0, 2.0])).numpy(), [3.0, 12.0], err_msg=mode)


def test_rules_for_some_arguments_in_one_mode_only_are_refused():
    """A rule in one mode and None in the other for the same argument (jvp=[rule],
    vjp=[None]) was accepted, and the other mode's derivative was 0 (closed form 3 x^2);
    a rule list shorter than the arguments failed in the sweeps with a raw IndexError."""
    from minigraph.ops.primitive import Primitive, bind
    from minigraph.ops.shape_rules import elementwise, same

    cube = lambda xp, x: x ** 3  # noqa: E731
    rule = [lambda t, out, x: 3.0 * x * x * t]
    with pytest.raises(ValueError, match="argument 0 has a jvp rule but no vjp rule"):
        Primitive("cube", cube, same, jvp=rule, vjp=[None])
    with pytest.raises(ValueError, match="argument 0 has a vjp rule but no jvp rule"):
        Primitive("cube", cube, same, jvp=[None], vjp=rule)
    with pytest.raises(ValueError, match="1 jvp rules but 2 vjp rules"):
        Primitive("cube", cube, same, jvp=rule, vjp=rule * 2)
    short = Primitive("mymul", lambda xp, x, y: x * y, elementwise("mymul"),
                      jvp=[lambda t, out, x, y: t * y], vjp=[lambda g, out, x, y: g * y])
    x, y = mg.tensor([1.0, 2.0]), mg.tensor([3.0, 4.0])
    for mode in ("tape", "graph", "forward"):
        with pytest.raises(mg.errors.GradientError,
                           match=r"'mymul' has 1 (vjp|jvp) rule but was called with 2"):
            mg.grad(lambda a, b: mg.sum(bind(short, a, b)), argnums=1, mode=mode)(x, y)


def test_gradcheck_reports_the_wrong_element():
    """A primitive with a deliberately wrong VJP is caught and the element named."""
    from minigraph.ops.primitive import Primitive, bind
    from minigraph.ops.shape_rules import same

    wrong = Primitive("square_wrong", lambda xp, x: x * x, same,
                      jvp=[lambda t, out, x: 2.0 * x * t],
                      vjp=[lambda g, out, x: 3.0 * x * g])  # should be 2 x g
    with pytest.raises(mg.errors.GradcheckError,
                       match=r"(?s)input 0 .*d out\[1\] / d input0\[1\]: analytic 6, numerical 4"):
        mg.gradcheck(lambda x: bind(wrong, x), [mg.tensor([1.0, 2.0])])
    assert mg.gradcheck(lambda x: bind(wrong, x), [mg.tensor([1.0, 2.0])], mode="forward")


def test_gradcheck_refuses_to_check_nothing_and_explains_float32():
    """With no floating input it returned True, having checked no derivative (PyTorch's
    refuses: no input requires a gradient); a float32 input failed with "3 of 3 entries
    disagree" and nothing said that eps=1e-6 is below float32's resolution."""
    with pytest.raises(ValueError, match=r"no input is floating \(dtypes \['int64'\]\)"):
        mg.gradcheck(lambda z: (z * z).sum(), [np.array([1, 2])])
    with pytest.raises(ValueError, match="mode is one of 'tape', 'graph', 'source', "
                                         "'forward', got 'dual'"):
        mg.gradcheck(lambda z: z.sum(), [np.ones(2)], mode="dual")
    x32 = np.array([0.5, -1.0, 2.0], np.float32)
    with pytest.raises(mg.errors.GradcheckError, match="input 0 is float32, which resolves "
                                                       "about 1e-7"):
        mg.gradcheck(lambda z: (mg.sin(z) * z).sum(), [x32])
    # float32 with a step and tolerances for its resolution passes (d/dz sum z sin z)
    assert mg.gradcheck(lambda z: (mg.sin(z) * z).sum(), [x32], eps=1e-2, atol=1e-3, rtol=1e-2)
    with pytest.raises(mg.errors.PytreeError, match="gradcheck: input 0 is a tuple"):
        mg.gradcheck(lambda ab: (ab[0] * ab[1]).sum(), [(np.ones(2), np.ones(2))])


def test_relu_keeps_an_integer_dtype(backend):
    # (the kernel compares floats with 0.0 for speed; an int tensor must stay int, and
    # the Array API refuses a float scalar beside an int array)
    y = mg.relu(mg.tensor(np.array([3, -2, 0])))
    assert y.dtype == "int64" and y.numpy().tolist() == [3, 0, 0]
    z = mg.relu(mg.tensor(np.array([1.5, -2.0], dtype=np.float32)))
    assert z.dtype == "float32" and z.numpy().tolist() == [1.5, 0.0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernels_that_return_shared_memory_are_marked_view(name):
    """Compiled graphs write in place into values no view can see (compile.py); they
    learn which kernels may return a view from ``Primitive.view``. Checked here against
    what NumPy reports: a kernel whose result shares memory with an argument."""
    f, inputs, _ = CASES[name]
    xs = [mg.tensor(x, requires_grad=True) for x in inputs]
    entries, _ = tape._entries([f(*xs)], set())
    for prim, params, t, args in entries:
        shares = any(isinstance(a, mg.Tensor) and np.shares_memory(np.asarray(t.data), a.data)
                     for a in args)
        assert prim.view or not shares, f"{prim.name} returned a view but is not marked view"


def test_the_ops_that_say_they_return_a_view_do():
    """``returns_view`` (what the Session's memory plan assumes of a view op on NumPy) is
    True only where the kernel's result shares its first argument's memory, on every
    case of the table; and it is given only to ops marked ``view``."""
    checked = set()
    for name, (f, inputs, _) in CASES.items():
        xs = [mg.tensor(x, requires_grad=True) for x in inputs]
        entries, _ = tape._entries([f(*xs)], set())
        for prim, params, t, args in entries:
            if prim.returns_view is not None and isinstance(args[0], mg.Tensor) \
                    and prim.returns_view(t.shape, params):
                assert np.shares_memory(np.asarray(t.data), args[0].data), (name, prim.name)
                checked.add(prim.name)
    assert all(p.view for p in mg.PRIMITIVES.values() if p.returns_view is not None)
    assert {"reshape", "transpose", "getitem"} <= checked


@pytest.mark.parametrize("index", [np.s_[1:], np.s_[0], np.s_[:, 1], np.s_[None, ..., ::2],
                                   np.s_[1, 2], np.s_[np.array([0, 2])], np.s_[[0, 1], 1]])
def test_an_index_says_it_returns_a_view_exactly_when_numpy_does(index):
    """Basic indexing leaving an axis gives a view; every axis taken by an int gives a
    NumPy scalar, an integer array a copy: getitem's ``returns_view`` against NumPy."""
    x = mg.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    ((prim, params, t, args),), _ = tape._entries([x[index]], set())
    assert prim.returns_view(t.shape, params) == np.shares_memory(np.asarray(t.data), x.data)


# -- the neutral numbers of the table, and the two places that drop such operations ------------

NEUTRAL = [(p, k) for p in PRIMITIVES.values() if p.neutral is not None for k in p.neutral[1]]


def test_the_table_names_the_neutral_numbers_of_add_sub_mul_div_and_pow():
    assert sorted((p.name, k) for p, k in NEUTRAL) == [
        ("add", 0), ("add", 1), ("div", 1), ("mul", 0), ("mul", 1), ("pow", 1), ("sub", 1)]


@pytest.mark.parametrize("prim,k", NEUTRAL, ids=lambda v: getattr(v, "name", str(v)))
def test_a_neutral_number_gives_the_other_argument_by_numpys_arithmetic(prim, k):
    """Bit for bit, signed zeros and NaN included: the number must be neutral for every x."""
    x = np.array([-2.5, -0.5, 0.25, 3.0, np.inf, -np.inf, 0.0, -0.0, np.nan])
    args = [x, x]
    args[k] = prim.neutral[0]
    with np.errstate(all="ignore"):
        out = prim.impl(np, *args)  # (NumPy computes it, not a rule)
    assert out.tobytes() == x.tobytes()
    assert prim.is_neutral(prim.neutral[0], k) and prim.is_neutral(np.full(3, prim.neutral[0]), k)


def _reciprocal_of_sum(x):
    return 1.0 / (x + 0.0)


def _first_reciprocal(x):
    return (1.0 / (x + 0.0))[0]


@pytest.mark.parametrize("mode", ["trace", "graph", "source"])
def test_x_plus_zero_is_not_dropped_the_sign_of_a_zero_tells(mode):
    """-0.0 + 0.0 is +0.0 (IEEE 754, NumPy, PyTorch), so 1 / (x + 0.0) is +inf where x is
    -0.0. Graph optimisation and source mode dropped ``+ 0.0`` as neutral and gave -inf;
    only ``x + -0.0`` is x for every x."""
    torch = pytest.importorskip("torch")
    x = np.array([-0.0, 0.0, 2.0])
    want = (1.0 / (torch.from_numpy(x) + 0.0)).numpy()
    with np.errstate(divide="ignore"):
        if mode == "trace":
            np.testing.assert_array_equal(mg.trace(_reciprocal_of_sum)(x).numpy(), want)
        else:
            value, _ = mg.value_and_grad(_first_reciprocal, mode=mode)(x)
            assert value.item() == want[0] == np.inf
    from minigraph.ops.elementwise import ADD
    assert not ADD.is_neutral(0.0, 1) and not ADD.is_neutral(0, 0) and ADD.is_neutral(-0.0, 1)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("xs, ys", [((1, 1), (1, 3)), ((4, 1), (1, 1)), ((1,), (1, 3)),
                                    ((4, 1), (1,)), ((1, 1), (1, 1)), ((2, 1), (1, 3))])
def test_matmul_keeps_ieee_nans_beside_a_one_by_one_matrix(xs, ys, dtype):
    """0 * inf is NaN (IEEE 754; PyTorch, NumPy's ``@``). NumPy's ``dot``, which the
    kernel calls for two matrices, takes a 1x1 one for a scalar and skips its zero
    products: a 0 instead of NaN."""
    torch = pytest.importorskip("torch")
    gen = np.random.default_rng(abs(hash((xs, ys))) % 2**32)
    for _ in range(20):
        x = gen.choice([0.0, 1.5, -2.0, np.inf, -np.inf, np.nan], size=xs).astype(dtype)
        y = gen.choice([0.0, 1.5, -2.0, np.inf, -np.inf, np.nan], size=ys).astype(dtype)
        want = (torch.from_numpy(x) @ torch.from_numpy(y)).numpy()
        with np.errstate(all="ignore"):
            eager = (mg.tensor(x) @ mg.tensor(y)).numpy()
            graph = mg.trace(lambda a, b: a @ b)(x, y).numpy()
        np.testing.assert_array_equal(eager, want)
        np.testing.assert_array_equal(graph, want)


@pytest.mark.parametrize("shape", [(5,), (2, 4), (7, 4), (3, 4, 1), (3, 2)])
def test_sum_to_refuses_a_shape_that_does_not_broadcast_to_x(shape):
    """sum_to(x of (3, 4), (5,)) returned shape (4,) and (2, 4) returned x unsummed: the
    target was never checked against x's shape. PyTorch's sum_to_size refuses them."""
    torch = pytest.importorskip("torch")
    x = np.arange(12.0).reshape(3, 4)
    with pytest.raises(RuntimeError):
        torch.tensor(x).sum_to_size(shape)
    with pytest.raises(mg.errors.ShapeError, match="does not broadcast to x's shape"):
        mg.sum_to(mg.tensor(x), shape)


@pytest.mark.parametrize("shape, want", [((1, 4), [[12.0, 15.0, 18.0, 21.0]]),
                                         ((3, 1), [[6.0], [22.0], [38.0]]), ((), 66.0)])
def test_sum_to_sums_down_to_a_shape_that_broadcasts(shape, want):
    x = np.arange(12.0).reshape(3, 4)
    assert mg.sum_to(mg.tensor(x), shape).tolist() == want


@pytest.mark.parametrize("labels", [[0.5, 2.7], [True, False], np.array([1.0, 2.0], "float32")])
def test_one_hot_refuses_labels_that_are_not_integers(labels):
    """A float label matched no class and gave a row of zeros, the silent loss of an
    example that one_hot's strict range check exists to prevent. PyTorch refuses."""
    with pytest.raises(TypeError, match="one_hot: labels must be integers"):
        mg.one_hot(labels, 3)
    assert mg.one_hot(2, 3).tolist() == [0.0, 0.0, 1.0]  # one Python int is a label


@pytest.mark.parametrize("index", [np.array([1, 0]), 1, [0, 1], (np.array([0, 1, 1]),),
                                   (slice(None), 1), (Ellipsis, 0)])
def test_scatter_add_reads_an_index_as_getitem_and_numpy_read_it(index):
    """An array index was read as one point (its items the coordinates), so scatter_add of
    5 at np.array([1, 0]) filled one element where np.add.at fills rows 1 and 0; an int
    index crashed inside. The oracle is np.add.at."""
    g = np.arange(1.0, 7.0).reshape(2, 3)[index] if not isinstance(index, int) else \
        np.array([1.0, 2.0, 3.0])
    want = np.zeros((2, 3))
    np.add.at(want, index if not isinstance(index, list) else np.array(index), g)
    got = mg.scatter_add(mg.tensor(g), index, (2, 3))
    np.testing.assert_array_equal(got.numpy(), want)


def test_transpose_takes_one_int_as_numpy_does():
    """transpose(x, 1) failed with "'int' object is not iterable"; NumPy takes an int as a
    permutation of one axis: a vector's own, or refused for a matrix."""
    np.testing.assert_array_equal(mg.transpose(mg.tensor([1.0, 2.0]), 0).numpy(),
                                  np.transpose(np.array([1.0, 2.0]), 0))
    with pytest.raises(ValueError):
        np.zeros((2, 3)).transpose(1)
    with pytest.raises(mg.errors.ShapeError, match="not a permutation of the 2 axes"):
        mg.tensor(np.zeros((2, 3))).transpose(1)


@pytest.mark.parametrize("f", [lambda a, b: a - b, lambda a, b: -a, lambda a, b: a - True])
def test_bool_minus_bool_is_refused_where_the_program_is_written(f):
    """NumPy refuses a bool minus a bool and the negative of a bool; eager mode said so
    naming the op, a traced function raised NumPy's bare TypeError when it ran. The
    shape rule refuses it now, in every mode, naming the op."""
    a, b = np.array([True, False]), np.array([True, True])
    with pytest.raises(TypeError):
        f(a, b)
    for call in (f, mg.trace(f)):
        with pytest.raises(mg.errors.DTypeError, match="(sub|neg): .*bool .*not supported"):
            call(mg.tensor(a), mg.tensor(b))
    assert (mg.tensor(a) - 1).tolist() == [0, -1]  # with an int, as NumPy: int64


@pytest.mark.parametrize("f, f_torch", [(mg.softmax, "softmax"), (mg.log_softmax, "log_softmax")])
def test_softmax_over_an_empty_axis_is_empty(f, f_torch):
    """NumPy's maximum over a zero-length axis raised; PyTorch returns an empty result,
    and its gradient is empty too."""
    torch = pytest.importorskip("torch")
    want = getattr(torch, f_torch)(torch.zeros((2, 0), dtype=torch.float64), 1)
    x = mg.tensor(np.zeros((2, 0)), requires_grad=True)
    y = f(x, axis=1)
    assert y.shape == tuple(want.shape) and y.dtype == "float64"
    y.sum().backward()
    assert x.grad.shape == (2, 0)
