"""Forward mode's numbers: a tangent's dtype, zero tangents at infinite derivatives, the
derivative of maximum and minimum at ties, and what the gradient entry points refuse.

Oracles: torch.func.jvp and torch.autograd (CPU), and closed forms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import minigraph as mg
from minigraph import nn
from minigraph.errors import DTypeError

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (NumPy's 0/0, log(0))

X32 = np.array([1.0, 2.0], dtype=np.float32)
C64 = np.array([0.5, 0.25])

# f(x, c) in minigraph and in PyTorch; every one's rule for x hands the tangent on as it is
PROMOTING = {
    "add": (lambda x, c: x + c, lambda x, c: x + c),
    "sub": (lambda x, c: x - c, lambda x, c: x - c),
    "maximum": (mg.maximum, torch.maximum),
    "minimum": (mg.minimum, torch.minimum),
    "where": (lambda x, c: mg.where(x > 1.5, x, c), lambda x, c: torch.where(x > 1.5, x, c)),
    "remainder": (mg.remainder, torch.remainder),
    "add_n": (lambda x, c: mg.add_n([x, c, x]), lambda x, c: x + c + x),
}


@pytest.mark.parametrize("name", sorted(PROMOTING))
def test_tangent_has_its_values_dtype_whatever_the_rule_returns(name):
    """x32 + c64 is float64, but add's rule hands the float32 tangent on: mg.jvp gave a
    float64 value with a float32 tangent (so did sub, maximum, minimum, where, remainder
    and add_n), where torch.func.jvp gives a float64 tangent."""
    f, f_torch = PROMOTING[name]
    c, ct = mg.tensor(C64), torch.tensor(C64)
    out, tangent = mg.jvp(lambda x: f(x, c), (mg.tensor(X32),), (mg.tensor([1.0, 3.0],
                                                                           "float32"),))
    want_out, want = torch.func.jvp(lambda x: f_torch(x.double(), ct),
                                    (torch.tensor(X32),), (torch.tensor([1.0, 3.0]),))
    assert out.dtype == tangent.dtype == "float64" and want.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), want_out.numpy(), rtol=1e-15)
    np.testing.assert_allclose(tangent.numpy(), want.numpy(), rtol=1e-15)


def test_a_promoted_tangent_keeps_its_precision_and_chains():
    """The float32 tangent of x32 + c64 overflowed in (x + c) * 1e300 (inf, not 1e300)
    and underflowed in * 1e-46 (0); mg.jacfwd of x + c was float32 where that of x * c
    is float64; and mg.jvp refused its own output's tangent as the tangent of that
    output. torch.func.jvp and jacfwd: float64, 1e300, 1e-46."""
    x, c = mg.tensor(X32), mg.tensor(C64)
    xt, ct = torch.tensor(X32), torch.tensor(C64)
    for k in (1e300, 1e-46):
        _, tangent = mg.jvp(lambda x: (x + c) * k, (x,), (mg.ones_like(x),))
        _, want = torch.func.jvp(lambda x: (x.double() + ct) * k, (xt,), (torch.ones(2),))
        np.testing.assert_allclose(tangent.numpy(), want.numpy(), rtol=1e-15)
    jac = mg.jacfwd(lambda x: x + c)(x)
    assert jac.dtype == "float64"
    np.testing.assert_array_equal(jac.numpy(), torch.func.jacfwd(
        lambda x: x.double() + ct)(xt).numpy())
    out, tangent = mg.jvp(lambda x: x + c, (x,), (mg.ones_like(x),))
    _, chained = mg.jvp(mg.sin, (out,), (tangent,))  # the pushforward of sin after x + c
    _, want = torch.func.jvp(lambda x: torch.sin(x.double() + ct), (xt,), (torch.ones(2),))
    np.testing.assert_allclose(chained.numpy(), want.numpy(), rtol=1e-15)


# Functions whose derivative is inf or nan at one element (x[0]) and finite at the others
SINGULAR = [
    ("sqrt", lambda x: mg.sqrt(x).sum(), lambda x: x.sqrt().sum(), [0.0, 4.0, 1.0]),
    ("log", lambda x: mg.log(x).sum(), lambda x: x.log().sum(), [0.0, 4.0, 1.0]),
    ("x ** 0.5", lambda x: (x ** 0.5).sum(), lambda x: (x ** 0.5).sum(), [0.0, 4.0, 1.0]),
    ("1 / x", lambda x: (1.0 / x).sum(), lambda x: (1.0 / x).sum(), [0.0, 4.0, 1.0]),
    ("exp", lambda x: mg.exp(x).sum(), lambda x: x.exp().sum(), [1000.0, 1.0, -2.0]),
    ("sin", lambda x: mg.sin(x).sum(), lambda x: x.sin().sum(), [math.inf, 1.0, 2.0]),
    ("cos", lambda x: mg.cos(x).sum(), lambda x: x.cos().sum(), [math.inf, 1.0, 2.0]),
    ("x * inf", lambda x: (x * mg.tensor([math.inf, 2.0, 3.0])).sum(),
     lambda x: (x * torch.tensor([math.inf, 2.0, 3.0], dtype=x.dtype)).sum(), [1.0, 4.0, 1.0]),
    ("2 ** x", lambda x: (mg.tensor([-2.0, 2.0, 3.0]) ** x).sum(),
     lambda x: (torch.tensor([-2.0, 2.0, 3.0], dtype=x.dtype) ** x).sum(), [0.5, 3.0, 1.0]),
    ("3 % x", lambda x: mg.remainder(3.0, x).sum(),  # d/dx (3 - (3 // x) x) = -(3 // x)
     lambda x: (3.0 - torch.floor_divide(3.0, x).detach() * x).sum(), [0.0, 2.0, 4.0]),
]


@pytest.mark.parametrize("name, f, f_torch, x0", SINGULAR, ids=[s[0] for s in SINGULAR])
def test_forward_grad_gives_the_other_elements_their_finite_derivatives(name, f, f_torch,
                                                                        x0, backend):
    """Forward mode's one-hot tangents put a 0 in x[0] for x[1]'s pass, and sqrt's rule
    t / (2 sqrt(x)) made it 0 / 0 = nan there, which the sum spread to d/dx[1]: the
    gradient of sqrt(x).sum() at [0, 4, 1] was [inf, nan, nan] (torch.autograd, and the
    reverse modes: [inf, 0.25, 0.5]). A zero tangent element gives a zero output tangent
    element now, in every rule whose derivative can be inf or nan."""
    xt = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    want = torch.autograd.grad(f_torch(xt), xt)[0].numpy()
    assert np.isfinite(want[1:]).all()
    got = mg.grad(f, mode="forward")(mg.tensor(x0)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-14)  # (inf and nan where torch's are)


def test_jacfwd_of_sqrt_is_diagonal_and_a_moving_input_still_meets_inf():
    """jacfwd (batched or not) of sqrt at [0, 4, 1] had nan off the diagonal (closed form:
    diag(1 / (2 sqrt x)), 0 elsewhere). A tangent that does move x[0] still gets the
    derivative the mathematics gives: inf (or -inf), and nan for sqrt at -1, as
    torch.func.jvp."""
    x = mg.tensor([0.0, 4.0, 1.0])
    closed = np.diag([math.inf, 0.25, 0.5])
    for vectorize in (True, False):
        np.testing.assert_array_equal(mg.jacfwd(mg.sqrt, vectorize=vectorize)(x).numpy(),
                                      closed)
    for x0, t0 in (([0.0, 4.0], [1.0, 0.0]), ([0.0, 4.0], [-2.0, 1.0]), ([-1.0, 4.0],
                                                                            [1.0, 0.0])):
        _, tangent = mg.jvp(mg.sqrt, (mg.tensor(x0),), (mg.tensor(t0),))
        _, want = torch.func.jvp(torch.sqrt, (torch.tensor(x0),), (torch.tensor(t0),))
        np.testing.assert_array_equal(tangent.numpy(), want.numpy())


def _extremes(x, y):
    return (mg.maximum(x, y) + 2.0 * mg.minimum(x, y)).sum()


@pytest.mark.parametrize("mode", ["tape", "forward", "graph", "source"])
def test_maximum_and_minimum_split_a_tie_as_torch_does(mode):
    """At x == y, maximum and minimum gave the whole derivative to x (TensorFlow's rule),
    so maximum(x, y) + minimum(x, y) had gradient (2, 0) at a tie where torch.maximum
    and torch.minimum, jax.numpy.maximum and mg.max split it evenly: (1, 1)."""
    x0, y0 = np.array([2.0, 1.0, 3.0]), np.array([2.0, 5.0, -1.0])  # a tie at index 0
    xt, yt = torch.tensor(x0, requires_grad=True), torch.tensor(y0, requires_grad=True)
    want = torch.autograd.grad(
        (torch.maximum(xt, yt) + 2.0 * torch.minimum(xt, yt)).sum(), (xt, yt))
    got = mg.grad(_extremes, argnums=(0, 1), mode=mode)(mg.tensor(x0), mg.tensor(y0))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert got[0].numpy()[0] == got[1].numpy()[0] == 1.5  # (1 + 2) / 2 each


def test_maximum_and_minimum_jvp_at_a_tie_is_the_mean_of_the_tangents():
    """The JVP rule at a tie gave x's tangent; torch.func.jvp gives the mean of both."""
    x0, y0 = torch.tensor([2.0, 1.0, 3.0]), torch.tensor([2.0, 5.0, -1.0])
    dx, dy = torch.tensor([1.0, 1.0, 1.0]), torch.tensor([3.0, 3.0, 3.0])
    for f, f_torch in ((mg.maximum, torch.maximum), (mg.minimum, torch.minimum)):
        _, got = mg.jvp(f, (mg.tensor(x0.numpy()), mg.tensor(y0.numpy())),
                        (mg.tensor(dx.numpy()), mg.tensor(dy.numpy())))
        _, want = torch.func.jvp(f_torch, (x0, y0), (dx, dy))
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        assert got.numpy()[0] == 2.0


@pytest.mark.parametrize("make, dtype", [
    (lambda: mg.placeholder(shape=(2,), dtype="int64", name="n"), "int64"),
    (lambda: mg.placeholder(shape=(2,), dtype="bool", name="n"), "bool"),
    (lambda: mg.variable(np.array([1, 2]), name="n"), "int64"),
])
def test_gradients_refuses_an_integer_or_bool_x(make, dtype):
    """mg.gradients(y, [an int64 or bool placeholder, an int64 variable]) gave None, which
    says y does not depend on x, for y = sum(n * x), whose derivative by n is x (closed
    form), and which every other entry point refuses to take. With respect to the float
    x it is n, as before."""
    with mg.Graph() as g:
        n = make()
        x = mg.placeholder(shape=(2,), dtype="float64", name="x")
        y = mg.sum(n * x)
        with pytest.raises(DTypeError, match=rf"gradients: .*'n' \(\w+\) of dtype {dtype}"):
            mg.gradients(y, [x, n])
        (gx,) = mg.gradients(y, [x])
    n0 = np.array([3, 4], dtype=dtype) if n.op == "Placeholder" else np.array([1, 2])
    feed = {x: np.array([1.0, 1.0]), **({n: n0} if n.op == "Placeholder" else {})}
    np.testing.assert_array_equal(mg.Session(g).run(gx, feed), n0.astype(np.float64))


@pytest.mark.parametrize("mode", ["tape", "forward"])
@pytest.mark.parametrize("value", [nn.Sequential(nn.Linear(3, 1, seed=0)), {"w": 1.0},
                                   object(), "w", None], ids=lambda v: type(v).__name__)
def test_grad_with_respect_to_something_not_an_array_says_so(mode, value):
    """Tape and forward mode said "tensor(): dtype object is not supported" for a Module
    (or a dict, an object) as the argument to differentiate, naming neither grad nor
    the argument; graph and source mode name both, as they do now."""
    with pytest.raises(TypeError, match=rf"^grad: argument 0 must be a float, array or "
                                        rf"tensor to be differentiated, got "
                                        rf"{type(value).__name__}$"):
        mg.grad(lambda m, x: x.sum(), argnums=0, mode=mode)(value, mg.tensor([1.0]))


@pytest.mark.parametrize("differentiate", [
    lambda g: mg.jacfwd(g), lambda g: mg.grad(g, mode="forward"), lambda g: mg.grad(g)])
def test_the_derivative_of_a_jvp_in_its_tangent_keeps_an_infinite_element(differentiate):
    """jvp(f, (x,), (t,)) is linear in t, its derivative in t is f's gradient, here
    1 / (2 sqrt(x)) = [inf, 0.25, 0.5] at x = [0, 4, 1] (closed form). The zero put in for
    0 * inf where t is 0 has no derivative in t: it gave 0 (forward) or nan (tape) for
    inf. A tangent some transformation differentiates keeps its term as it is."""
    x = mg.tensor([0.0, 4.0, 1.0])
    with np.errstate(divide="ignore", invalid="ignore"):
        got = differentiate(lambda t: mg.jvp(lambda a: mg.sqrt(a).sum(), (x,), (t,))[1])(
            mg.tensor([0.0, 1.0, 0.0]))
    np.testing.assert_array_equal(got.numpy(), [np.inf, 0.25, 0.5])


@pytest.mark.parametrize("mode", ["tape", "forward"])
def test_grad_takes_what_mg_tensor_takes(mode):
    """A buffer (array.array) is data to mg.tensor, and was to grad, until the check for
    a Module refused everything without a shape. Closed form: d/dx sum(x * x) = 2x."""
    import array

    got = mg.grad(lambda x: mg.sum(x * x), mode=mode)(array.array("d", [1.0, 2.0]))
    np.testing.assert_array_equal(got.numpy(), [2.0, 4.0])
