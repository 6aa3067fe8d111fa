"""Graded tests of chapter 09 (composing transformations).

The oracles are independent of the transformations being exercised: closed forms
(derivatives worked out by hand), central finite differences and, where PyTorch is
installed, torch.func (the same quantity computed by another library; without PyTorch
those comparisons are left out and the closed forms still decide). Shapes and dtypes
are compared exactly before the values. The functions your code differentiates run in
the sandbox (in_sandbox), which counts their calls: several exercises are about how many
passes a derivative takes.
"""

import math

import numpy as np
import pytest

import minigraph as mg
from minigraph.grading import assert_same_array, exercises_fixture, in_sandbox

exercises = exercises_fixture()

try:  # an extra oracle, not a requirement
    import torch
    import torch.func as tf
except ImportError:  # pragma: no cover - depends on the installation
    torch = tf = None

NO_HESSIAN = ("minigraph.hessian", "minigraph.jacfwd", "minigraph.jacrev")
# reverse mode, where an exercise asks for forward mode (a Jacobian by rows of mg.vjp is
# right, in one run of f, and not the exercise)
NO_REVERSE = ("minigraph.vjp", "minigraph.autodiff.tape.vjp", "minigraph.grad",
              "minigraph.value_and_grad")


def as_array(got):
    """What the student's function returned, as a NumPy array (a tensor's values)."""
    return got.numpy() if isinstance(got, mg.Tensor) else np.asarray(got)


# ---------------------------------------------------------------------------------------
# 1. mixed_partial
# ---------------------------------------------------------------------------------------

def textbook_z(x, y):
    """Example 3.1, (a.1)-(a.5): z = x*y + sin(x)."""
    return x * y + mg.sin(x)


def half_textbook_z_squared(x, y):
    """z^2 / 2 for the textbook's z: d2/dydx = x (y + cos x) + z, not constant."""
    z = x * y + mg.sin(x)
    return 0.5 * z * z


def x_exp_y(x, y):
    return x * mg.exp(y)


def sin_of_product(x, y):
    return mg.sin(x * y)


def tanh_cos(x, y):
    return mg.tanh(x) * mg.cos(y) + x * y * y


# (function, closed form of d2f/dydx, the same function in torch)
MIXED = [
    (textbook_z, lambda x, y: 1.0, lambda x, y: x * y + torch.sin(x)),
    (x_exp_y, lambda x, y: math.exp(y), lambda x, y: x * torch.exp(y)),
    (sin_of_product, lambda x, y: math.cos(x * y) - x * y * math.sin(x * y),
     lambda x, y: torch.sin(x * y)),
    (tanh_cos, lambda x, y: -(1 - math.tanh(x) ** 2) * math.sin(y) + 2 * y,
     lambda x, y: torch.tanh(x) * torch.cos(y) + x * y * y),
]


def finite_difference_mixed(fn, x, y, h=1e-4):
    """d2f/dydx by central differences (error O(h^2))."""
    return (fn(x + h, y + h) - fn(x + h, y - h) - fn(x - h, y + h) + fn(x - h, y - h)) / (4 * h * h)


@pytest.mark.points(1)
@pytest.mark.forbid(*NO_HESSIAN, why="nest mg.grad in mg.grad")
def test_mixed_partial_textbook(exercises):
    # d2z/dydx = d(y + cos x)/dy = 1 at the textbook's point (2, 3), in one run of z
    f = in_sandbox(exercises, textbook_z)
    got = exercises.mixed_partial(f, 2.0, 3.0)
    assert f.calls == 1, f"z ran {f.calls} times; nesting two grads runs it once"
    assert_same_array(got, np.float64(1.0), "d2z/dydx: ")
    # z's is 1 everywhere; z^2 / 2's is x (y + cos x) + z, which a constant does not fit
    f = in_sandbox(exercises, half_textbook_z_squared)
    got = exercises.mixed_partial(f, 2.0, 3.0)
    assert f.calls == 1, f"z^2 / 2 ran {f.calls} times; nesting two grads runs it once"
    z = 2.0 * 3.0 + np.sin(2.0)
    assert_same_array(got, np.float64(2.0 * (3.0 + np.cos(2.0)) + z), "d2(z^2 / 2)/dydx: ")


@pytest.mark.points(2)
@pytest.mark.forbid(*NO_HESSIAN, why="nest mg.grad in mg.grad")
def test_mixed_partial_closed_forms(exercises):
    rng = np.random.default_rng(901)
    for function, closed, torch_fn in MIXED:
        for x, y in rng.uniform(-1.5, 1.5, size=(3, 2)):
            x, y = float(x), float(y)
            f = in_sandbox(exercises, function)
            got = exercises.mixed_partial(f, x, y)
            what = f"{function.__name__} at ({x:.4f}, {y:.4f}): "
            assert f.calls == 1, f"{what}f ran {f.calls} times, expected once"
            assert_same_array(got, np.float64(closed(x, y)), what)
            numeric = finite_difference_mixed(lambda a, b: function(a, b).item(), x, y)
            assert abs(as_array(got) - numeric) < 1e-5, f"{what}finite differences give {numeric}"
            if tf is not None:
                ref = tf.grad(lambda b: tf.grad(torch_fn, argnums=0)(
                    torch.tensor(x, dtype=torch.float64), b))(torch.tensor(y, dtype=torch.float64))
                assert abs(as_array(got) - ref.item()) < 1e-10, f"{what}torch.func gives {ref.item()}"


# ---------------------------------------------------------------------------------------
# 2. hvp
# ---------------------------------------------------------------------------------------

def sin_times_x(x):
    """sum_i x_i sin(x_i): H = diag(2 cos x - x sin x)."""
    return (mg.sin(x) * x).sum()


def quadratic(x, *, A):
    """x.A.x / 2 for a symmetric A: H = A."""
    return 0.5 * (x * (A @ x)).sum()


def tanh_sum(x, *, W):
    """sum tanh(W x): H = W.T diag(-2 t (1 - t^2)) W with t = tanh(W x)."""
    return mg.tanh(W @ x).sum()


def hvp_cases(n, seed):
    """(name, function, its data, closed-form Hessian at x, torch version, x, v)."""
    rng = np.random.default_rng(seed)
    x, v = rng.normal(size=n), rng.normal(size=n)
    A = rng.normal(size=(n, n))
    A = A + A.T
    W = rng.normal(size=(n + 1, n)) / math.sqrt(n)
    t = np.tanh(W @ x)
    return [
        ("sin_times_x", sin_times_x, {}, np.diag(2 * np.cos(x) - x * np.sin(x)),
         lambda z: (torch.sin(z) * z).sum(), x, v),
        ("quadratic", quadratic, {"A": mg.tensor(A)}, A,
         lambda z: 0.5 * (z * (torch.tensor(A) @ z)).sum(), x, v),
        ("tanh_sum", tanh_sum, {"W": mg.tensor(W)}, W.T @ np.diag(-2 * t * (1 - t * t)) @ W,
         lambda z: torch.tanh(torch.tensor(W) @ z).sum(), x, v),
    ]


def watched_hvp(hvp, f, x, v):
    """Runs in the sandbox (in_sandbox), where the transformations' values live:
    ``hvp(f, x, v)``, and the kinds of value wrapped around the tensor f's first call
    was given, from the outside in (``levels.ValueInside``: a box of mg.grad or of
    mg.vjp, a dual number of mg.jvp). Forward over reverse hands f mg.grad's boxes
    holding mg.jvp's dual numbers, ``["Box", "Dual"]``; reverse over reverse, with the
    same values and one run of f, hands it ``["Box", "Box"]``."""
    kinds = []

    def f_watched(z):
        if not kinds:
            inside = z
            while isinstance(inside, mg.autodiff.levels.ValueInside):
                kinds.append(type(inside).__name__)
                inside = inside._inside()
        return f(z)

    return hvp(f_watched, x, v), kinds


def assert_forward_over_reverse(kinds, name):
    assert kinds == ["Box", "Dual"], (
        f"{name}: f was given {' holding '.join(kinds) or 'a plain tensor'}, expected "
        f"mg.grad's Box holding mg.jvp's Dual: push the tangent v with mg.jvp through "
        f"mg.grad(f) (forward over reverse)")


@pytest.mark.points(1)
@pytest.mark.parametrize("n", [1, 4, 12])
@pytest.mark.forbid(*NO_HESSIAN, "minigraph.vmap", why="push one tangent through mg.grad(f) with mg.jvp")
def test_hvp_closed_forms_one_pass(exercises, n):
    run = in_sandbox(exercises, watched_hvp)
    for name, function, data, H, torch_fn, x, v in hvp_cases(n, 910 + n):
        f = in_sandbox(exercises, function, **data)
        got, kinds = run(exercises.hvp, f, mg.tensor(x), mg.tensor(v))
        assert f.calls == 1, (f"{name}: f ran {f.calls} times; forward over reverse runs it "
                              f"once (building H column by column would take n = {n})")
        assert_forward_over_reverse(kinds, name)
        assert_same_array(got, H @ v, f"{name}, n = {n}: ")
        if tf is not None:
            _, ref = tf.jvp(tf.grad(torch_fn), (torch.tensor(x),), (torch.tensor(v),))
            assert_same_array(got, ref.numpy(), f"{name}: against torch.func")


@pytest.mark.points(1)
@pytest.mark.forbid(*NO_HESSIAN, "minigraph.vmap", why="push one tangent through mg.grad(f) with mg.jvp")
def test_hvp_keeps_float32(exercises):
    # float32 in, float32 out; against finite differences of the closed-form gradient
    rng = np.random.default_rng(915)
    x, v = rng.normal(size=5).astype(np.float32), rng.normal(size=5).astype(np.float32)
    f = in_sandbox(exercises, sin_times_x)
    got, kinds = in_sandbox(exercises, watched_hvp)(exercises.hvp, f, mg.tensor(x), mg.tensor(v))
    assert_forward_over_reverse(kinds, "sin_times_x, float32")
    x64, v64, h = x.astype(np.float64), v.astype(np.float64), 1e-5
    gradient = lambda z: np.sin(z) + z * np.cos(z)  # noqa: E731
    numeric = (gradient(x64 + h * v64) - gradient(x64 - h * v64)) / (2 * h)
    assert_same_array(got, numeric.astype(np.float32), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------
# 3. per_example_gradients
# ---------------------------------------------------------------------------------------

def squared_error(w, x, y):
    """(w.x - y)^2 / 2: gradient (w.x - y) x."""
    return 0.5 * ((w * x).sum() - y) ** 2


def logistic(w, x, y):
    """log(1 + exp(-y w.x)) for a label y = +-1: gradient -y x sigmoid(-y w.x)."""
    return mg.log(1.0 + mg.exp(-y * (w * x).sum()))


def sigmoid(u):
    return 1.0 / (1.0 + np.exp(-u))


PER_EXAMPLE = [
    (squared_error, lambda w, X, Y: (X @ w - Y)[:, None] * X, False),
    (logistic, lambda w, X, Y: (-Y * sigmoid(-Y * (X @ w)))[:, None] * X, True),
]


@pytest.mark.points(1)
@pytest.mark.parametrize("B, d", [(1, 3), (7, 4), (32, 2)])
@pytest.mark.forbid(*NO_HESSIAN, why="vmap the gradient of one example's loss")
def test_per_example_gradients_closed_forms(exercises, B, d):
    rng = np.random.default_rng(920 + B)
    for function, closed, labels in PER_EXAMPLE:
        w, X = rng.normal(size=d), rng.normal(size=(B, d))
        Y = rng.choice([-1.0, 1.0], size=B) if labels else rng.normal(size=B)
        loss = in_sandbox(exercises, function)
        got = exercises.per_example_gradients(loss, mg.tensor(w), mg.tensor(X), mg.tensor(Y))
        what = f"{function.__name__}, B = {B}, d = {d}: "
        assert loss.calls == 1, (f"{what}the loss ran {loss.calls} times; vmap runs it once "
                                 f"for the whole batch (a loop would run it B = {B} times)")
        assert_same_array(got, closed(w, X, Y), what)


@pytest.mark.points(1)
@pytest.mark.forbid(*NO_HESSIAN, why="vmap the gradient of one example's loss")
def test_per_example_gradients_against_torch_or_differences(exercises):
    # a small network's loss; torch.func.vmap(grad) if available, else finite differences
    def mlp_loss(w, x, y, *, V):
        h = mg.tanh(V @ x)
        return (mg.sin(w * h).sum() - y) ** 2

    rng = np.random.default_rng(925)
    B, d, k = 6, 3, 4
    V, w, X, Y = rng.normal(size=(k, d)), rng.normal(size=k), rng.normal(size=(B, d)), rng.normal(size=B)
    loss = in_sandbox(exercises, mlp_loss, V=mg.tensor(V))
    got = exercises.per_example_gradients(loss, mg.tensor(w), mg.tensor(X), mg.tensor(Y))
    assert loss.calls == 1, f"the loss ran {loss.calls} times, expected once"

    def loss_np(wv, x, y):
        return (np.sin(wv * np.tanh(V @ x)).sum() - y) ** 2

    h = 1e-6
    numeric = np.array([[(loss_np(w + h * e, X[i], Y[i]) - loss_np(w - h * e, X[i], Y[i])) / (2 * h)
                         for e in np.eye(k)] for i in range(B)])
    assert_same_array(got, numeric, "against finite differences: ", rtol=1e-6, atol=1e-8)
    if tf is not None:
        Vt = torch.tensor(V)
        ref = tf.vmap(tf.grad(lambda wt, x, y: (torch.sin(wt * torch.tanh(Vt @ x)).sum() - y) ** 2),
                      in_dims=(None, 0, 0))(torch.tensor(w), torch.tensor(X), torch.tensor(Y))
        assert_same_array(got, ref.numpy(), "against torch.func.vmap(grad)")


# ---------------------------------------------------------------------------------------
# 4. jacobian_batched
# ---------------------------------------------------------------------------------------

def tanh_layer(x, *, W, b):
    """f: R^n -> R^m, h * sin(h) with h = tanh(W x + b)."""
    h = mg.tanh(W @ x + b)
    return h * mg.sin(h)


@pytest.mark.points(1)
@pytest.mark.parametrize("n, m", [(1, 3), (4, 2), (6, 6), (9, 1)])
@pytest.mark.forbid(*NO_HESSIAN, *NO_REVERSE, why="vmap one JVP over the identity's rows")
def test_jacobian_batched_one_pass(exercises, n, m):
    rng = np.random.default_rng(930 + n)
    W, b, x = rng.normal(size=(m, n)), rng.normal(size=m), rng.normal(size=n)
    f = in_sandbox(exercises, tanh_layer, W=mg.tensor(W), b=mg.tensor(b))
    got = exercises.jacobian_batched(f, mg.tensor(x))
    assert f.calls == 1, (f"f ran {f.calls} times; one batched pass runs it once (one pass "
                          f"per basis vector would be n = {n})")
    h = np.tanh(W @ x + b)
    expected = ((np.sin(h) + h * np.cos(h)) * (1 - h * h))[:, None] * W  # closed form, (m, n)
    assert_same_array(got, expected, f"n = {n}, m = {m}: ")
    # float32 in, float32 out: the basis has x's dtype (a float64 one is refused by mg.jvp)
    W32, b32, x32 = W.astype(np.float32), b.astype(np.float32), x.astype(np.float32)
    f = in_sandbox(exercises, tanh_layer, W=mg.tensor(W32), b=mg.tensor(b32))
    got = exercises.jacobian_batched(f, mg.tensor(x32))
    assert_same_array(got, expected.astype(np.float32), f"float32, n = {n}, m = {m}: ",
                      rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------
# 5. mul_batch
# ---------------------------------------------------------------------------------------

# shapes of one example of x and of y; NumPy broadcasts them against each other
SHAPES = [((), ()), ((), (3,)), ((3,), ()), ((2, 3), (3,)), ((3,), (2, 3)),
          ((2, 1), (1, 4)), ((4,), (4,)), ((), (2, 2))]
DIMS = [(0, None), (None, 0), (0, 0)]
BATCH = 5


def batch_of(rng, shape, d):
    return rng.normal(size=((BATCH,) + shape) if d is not None else shape)


def loop_oracle(x, y, dims):
    """result[b] = x_b * y_b, one example at a time, with NumPy."""
    pick = lambda a, d, k: a[k] if d is not None else a  # noqa: E731
    return np.stack([pick(x, dims[0], k) * pick(y, dims[1], k) for k in range(BATCH)])


@pytest.mark.points(1)
@pytest.mark.parametrize("dims", DIMS, ids=["x-batched", "y-batched", "both"])
@pytest.mark.forbid("minigraph.ops.batch_rules.align", "minigraph.ops.batch_rules.elementwise",
                    "minigraph.ops.batch_rules.materialize", why="align the ranks yourself")
def test_mul_batch_matches_a_loop(exercises, dims):
    rng = np.random.default_rng(940)
    for xs, ys in SHAPES:
        x, y = batch_of(rng, xs, dims[0]), batch_of(rng, ys, dims[1])
        got = exercises.mul_batch(dims, mg.tensor(x), mg.tensor(y))
        assert_same_array(got, loop_oracle(x, y, dims),
                          f"example shapes {xs} and {ys}, dims {dims}: ")


def vmap_student_rule(rule, x, y, dx, dy, *, in_axes, how):
    """vmap of a primitive that multiplies, whose batching rule is the student's: plain,
    under mg.jvp (the rule then meets dual numbers) and under mg.grad (boxes)."""
    mul = mg.ops.elementwise.MUL
    prim = mg.ops.primitive.Primitive("mul_by_student", mul.impl, mul.shape, jvp=mul.jvp,
                                      vjp=mul.vjp, batch=rule)
    batched = mg.vmap(lambda a, b: prim(a, b), in_axes=in_axes)
    if how == "plain":
        return batched(x, y)
    if how == "jvp":
        return mg.jvp(batched, (x, y), (dx, dy))[1]

    def loss(a, b):
        out = batched(a, b)
        return (out * out).sum()

    return mg.grad(loss, argnums=(0, 1))(x, y)


@pytest.mark.points(1)
@pytest.mark.parametrize("how", ["plain", "jvp", "grad"])
@pytest.mark.forbid("minigraph.ops.batch_rules.align", "minigraph.ops.batch_rules.elementwise",
                    "minigraph.ops.batch_rules.materialize", why="align the ranks yourself")
def test_mul_batch_under_vmap_and_other_transformations(exercises, how):
    # the rule installed in a primitive's table entry, run by mg.vmap on tensors, on
    # mg.jvp's dual numbers and on mg.grad's boxes
    rng = np.random.default_rng(945)
    helper = in_sandbox(exercises, vmap_student_rule)
    for dims in DIMS:
        in_axes = tuple(dims)
        for xs, ys in SHAPES:
            x, y = batch_of(rng, xs, dims[0]), batch_of(rng, ys, dims[1])
            dx, dy = rng.normal(size=x.shape), rng.normal(size=y.shape)
            got = helper(exercises.mul_batch, mg.tensor(x), mg.tensor(y), mg.tensor(dx),
                         mg.tensor(dy), in_axes=in_axes, how=how)
            what = f"{how}, example shapes {xs} and {ys}, in_axes {in_axes}: "
            if how == "plain":
                assert_same_array(got, loop_oracle(x, y, dims), what)
            elif how == "jvp":  # d(x*y) = dx*y + x*dy, per example
                assert_same_array(got, loop_oracle(dx, y, dims) + loop_oracle(x, dy, dims), what)
            else:  # grad of sum((x*y)^2): 2 x y^2 and 2 x^2 y, summed over what was broadcast
                p = loop_oracle(x, y, dims)
                gx_full, gy_full = 2 * p * loop_oracle(np.ones_like(x), y, dims), \
                    2 * p * loop_oracle(x, np.ones_like(y), dims)
                for g, full, a, d, k in ((got[0], gx_full, x, dims[0], "x"),
                                         (got[1], gy_full, y, dims[1], "y")):
                    assert_same_array(g, sum_to_shape(full, a.shape, d), f"{what}gradient of {k}: ")


def sum_to_shape(full, shape, d):
    """Sum ``full`` (shape (BATCH,) + the broadcast example shape) back to ``shape``, the
    shape of a batched (``d`` = 0) or shared (``d`` None) argument, as a VJP must."""
    if d is None:  # shared by every example: its adjoint collects every example's share
        full = full.sum(axis=0)
    inner = shape[1:] if d is not None else shape
    off = 1 if d is not None else 0
    lead = full.ndim - off - len(inner)  # axes that broadcasting added in front
    if lead:
        full = full.sum(axis=tuple(range(off, off + lead)))
    axes = tuple(off + i for i, s in enumerate(inner) if s == 1 and full.shape[off + i] != 1)
    return full.sum(axis=axes, keepdims=True) if axes else full
