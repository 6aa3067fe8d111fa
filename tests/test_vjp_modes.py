"""``mg.vjp`` and ``mg.jacrev`` in the three reverse modes, checked against torch.func.

Tape mode records f and sweeps the record; graph and source mode compile, per signature,
a program that takes the output's adjoint (a reverse graph seeded by a placeholder, an
adjoint program ``def vjp_f(x, y, gz)``). The oracle is PyTorch (``torch.func.vjp``,
``jacrev``, ``hessian``) on random programs that hypothesis writes as Python source
(source mode reads text), with and without a loop; never another minigraph mode.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minigraph as mg
from minigraph.autodiff.signature import programs as cached_programs
from minigraph.errors import DTypeError, GradcheckError, GradientError, ShapeError
from program_files import load_pair  # (tests/program_files.py)

torch = pytest.importorskip("torch")
tf = pytest.importorskip("torch.func")

REVERSE = ("tape", "graph", "source")
COMPILED = ("graph", "source")

# -- random vector programs, written as source files ----------------------------------------

UNARY = {"sin": "{ns}.sin({a})", "tanh": "{ns}.tanh({a})", "exp": "{ns}.exp(0.3 * {a})",
         "square": "{a} * {a}"}
BINARY = {"add": "{a} + {b}", "mul": "{a} * {b}", "div": "{a} / (1.5 + {b} * {b})",
          "mix": "{a} * {ns}.sum({b})"}  # (mixes the elements: a Jacobian that is not diagonal)

step = st.one_of(
    st.tuples(st.sampled_from(sorted(UNARY)), st.integers(0, 50), st.just(0)),
    st.tuples(st.sampled_from(sorted(BINARY)), st.integers(0, 50), st.integers(0, 50)))
programs = st.tuples(st.lists(step, min_size=1, max_size=5), st.booleans())


def source_of(prog: tuple, ns: str, name: str) -> str:
    """``def name(x, y)`` on vectors, in namespace ``ns``; with a loop, the steps are the
    body of ``for i in range(2)`` updating ``h`` (source mode writes the loop once)."""
    steps, loop = prog
    names, pad = (["h", "y"], "        ") if loop else (["x", "y"], "    ")
    lines = [f"def {name}(x, y):"]
    if loop:
        lines += ["    h = x", "    for i in range(2):"]
    for k, (op, i, j) in enumerate(steps):
        a, b = names[i % len(names)], names[j % len(names)]
        template = UNARY.get(op) or BINARY[op]
        lines.append(f"{pad}v{k} = " + template.format(ns=ns, a=a, b=b))
        names.append(f"v{k}")
    if loop:
        lines.append(f"{pad}h = {names[-1]} * 0.5 + h")
        names.append("h")
    lines.append(f"    return {names[-1]} + x * y * 0.5")
    return "\n".join(lines) + "\n"


def load(prog, tmp_path_factory) -> tuple:
    """The program as an mg function and a torch function, each defined in a real file."""
    return load_pair(source_of, prog, tmp_path_factory)


vectors = st.lists(st.floats(-1.5, 1.5), min_size=3, max_size=3)
SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _t(v) -> "torch.Tensor":
    return torch.tensor(np.asarray(v, dtype=np.float64))


@pytest.mark.parametrize("mode", REVERSE)
@SETTINGS
@given(prog=programs, x=vectors, y=vectors, g=vectors)
def test_vjp_and_jacrev_of_random_programs_are_torchs(mode, prog, x, y, g, tmp_path_factory):
    f, f_torch = load(prog, tmp_path_factory)
    want_out, pull = tf.vjp(f_torch, _t(x), _t(y))
    want = pull(_t(g))
    out, vjp_fn = mg.vjp(f, mg.tensor(x), mg.tensor(y), mode=mode)
    got = vjp_fn(mg.tensor(g))
    np.testing.assert_allclose(out.numpy(), want_out.numpy(), rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-10)
    jac = mg.jacrev(f, argnums=(0, 1), mode=mode)(mg.tensor(x), mg.tensor(y))
    for a, b in zip(jac, tf.jacrev(f_torch, argnums=(0, 1))(_t(x), _t(y))):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-10)


# -- fixed functions -------------------------------------------------------------------------

def f(x, y):
    return mg.sin(x) * y + x * mg.sum(y)


def f_torch(x, y):
    return torch.sin(x) * y + x * torch.sum(y)


def textbook(x, y):
    return x * y + mg.sin(x)


X, Y = np.array([0.3, -1.2, 0.7]), np.array([1.1, 0.4, -0.5])


def _through(mode):
    def inner(x, y):  # a function that calls vjp in ``mode``, for an outer gradient
        _, pull = mg.vjp(f, x, y, mode=mode)
        gx, gy = pull(mg.cos(y))
        return mg.sum(gx * gy)
    return inner


def through_tape(x, y):  # (defs in this file: source mode, as an outer mode, reads them)
    return _through("tape")(x, y)


def through_graph(x, y):
    _, pull = mg.vjp(f, x, y, mode="graph")
    gx, gy = pull(mg.cos(y))
    return mg.sum(gx * gy)


def through_source(x, y):
    _, pull = mg.vjp(f, x, y, mode="source")
    gx, gy = pull(mg.cos(y))
    return mg.sum(gx * gy)


THROUGH = {"graph": through_graph, "source": through_source}


def _oracle_through(x, y):
    _, pull = tf.vjp(f_torch, x, y)
    gx, gy = pull(torch.cos(y))
    return torch.sum(gx * gy)


@pytest.mark.parametrize("inner", COMPILED)
@pytest.mark.parametrize("outer", ["tape", "forward", "graph", "source"])
def test_a_gradient_through_a_compiled_vjp_is_torchs(outer, inner):
    """The compiled vjp's program, replayed on an outer mode's values, carries that mode's
    perturbation: every outer mode of grad over it gives torch's second derivatives."""
    want = tf.grad(_oracle_through, argnums=(0, 1))(_t(X), _t(Y))
    got = mg.grad(THROUGH[inner], argnums=(0, 1), mode=outer)(mg.tensor(X), mg.tensor(Y))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10)


def scalar(x):
    return mg.sum(mg.sin(x) * x) * mg.sum(x)


def scalar_torch(x):
    return torch.sum(torch.sin(x) * x) * torch.sum(x)


@pytest.mark.parametrize("mode", COMPILED)
def test_hessians_from_compiled_jacrev_are_torchs(mode):
    want = tf.hessian(scalar_torch)(_t(X)).numpy()
    by_forward = mg.jacfwd(mg.jacrev(scalar, mode=mode))(mg.tensor(X)).numpy()
    by_reverse = mg.jacrev(mg.jacrev(scalar, mode=mode), mode=mode)(mg.tensor(X)).numpy()
    np.testing.assert_allclose(by_forward, want, rtol=1e-10)
    np.testing.assert_allclose(by_reverse, want, rtol=1e-10)


@pytest.mark.parametrize("mode", COMPILED)
def test_vmap_and_trace_of_compiled_jacrev_are_torchs(mode):
    xs = np.stack([X, Y, X * 2])
    want = tf.vmap(tf.jacrev(f_torch), in_dims=(0, None))(_t(xs), _t(Y)).numpy()
    got = mg.vmap(mg.jacrev(f, mode=mode), in_axes=(0, None))(mg.tensor(xs), mg.tensor(Y))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10)
    traced = mg.trace(mg.jacrev(f, argnums=(0, 1), mode=mode))(mg.tensor(X), mg.tensor(Y))
    for a, b in zip(traced, tf.jacrev(f_torch, argnums=(0, 1))(_t(X), _t(Y))):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10)


@pytest.mark.parametrize("mode", COMPILED)
@pytest.mark.parametrize("vectorize", [True, False])
def test_float32_jacrev_with_a_static_argument(mode, vectorize):
    """A float32 program, argnums=1 and a static int (the loop's bound) in between."""
    x, y = X.astype(np.float32), Y.astype(np.float32)
    got = mg.jacrev(repeated, argnums=2, vectorize=vectorize, mode=mode)(x, 3, y)
    want = tf.jacrev(repeated_torch, argnums=2)(torch.tensor(x), 3, torch.tensor(y))
    assert got.dtype == "float32"
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def repeated(x, n, y):
    h = x
    for i in range(n):
        h = mg.tanh(h * y) + x
    return h


def repeated_torch(x, n, y):
    h = x
    for i in range(n):
        h = torch.tanh(h * y) + x
    return h


# -- one program per signature, and what the source program looks like ---------------------

@pytest.mark.parametrize("mode", COMPILED)
def test_one_program_serves_every_value(mode):
    """Building is per signature: ten vjps at ten points write one program (as many
    calls of one signature to mg.grad(mode=...) do), and each is right."""
    for k in range(10):
        x, y, g = X + k, Y - k, np.cos(X * k)
        _, pull = mg.vjp(f, mg.tensor(x), mg.tensor(y), mode=mode)
        want = tf.vjp(f_torch, _t(x), _t(y))[1](_t(g))
        for a, b in zip(pull(mg.tensor(g)), want):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    assert len(cached_programs(f, mode, ((0, 1), False, "vjp") if mode == "source"
                               else ((0, 1), "vjp"))) == 1


def test_the_source_programs_take_the_outputs_adjoint():
    """The adjoint of the textbook's program, with gz a parameter: (g.1) is the caller's."""
    _, pull = mg.vjp(textbook, 2.0, 3.0, mode="source")
    assert pull.source.splitlines()[0] == "def vjp_textbook(x, y, gz):"
    assert "mg.ones" not in pull.source and "a = x * y" in pull.source
    assert [v.item() for v in pull(2.0)] == [2 * (3.0 + np.cos(2.0)), 4.0]


# -- the contract of vjp_fn in every mode -----------------------------------------------------

def ident(x):
    return x


def constant(x):
    return 3.0


def pair(x):
    return x, x


def doubled(x):
    return x * 2.0


W = mg.tensor([1.0, 2.0])


def reads_a_global(x):
    return x * W


@pytest.mark.parametrize("mode", REVERSE)
def test_gradients_are_the_callers_own_arrays(mode):
    g = mg.tensor([5.0, 6.0])
    (gx,) = mg.vjp(ident, mg.tensor([1.0, 2.0]), mode=mode)[1](g)
    assert gx.numpy().tolist() == [5.0, 6.0]
    assert not np.shares_memory(gx.numpy(), g.numpy())


@pytest.mark.parametrize("mode", REVERSE)
def test_a_constant_output_has_zero_gradients(mode):
    out, pull = mg.vjp(constant, mg.tensor([1.0, 2.0]), mode=mode)
    assert out.item() == 3.0 and pull()[0].numpy().tolist() == [0.0, 0.0]


@pytest.mark.parametrize("mode", REVERSE)
def test_bad_cotangents_and_outputs_are_refused_in_every_mode(mode):
    x = mg.tensor([1.0, 2.0])
    with pytest.raises(GradientError, match="output has shape \\(2,\\).*scalar output only"):
        mg.vjp(ident, x, mode=mode)[1]()
    with pytest.raises(ShapeError, match="gradient has shape \\(3,\\), the output \\(2,\\)"):
        mg.vjp(ident, x, mode=mode)[1](mg.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError, match="vjp: f must return a tensor, got tuple"):
        mg.vjp(pair, x, mode=mode)
    with pytest.raises(DTypeError, match="argument 0 of dtype int64"):
        mg.vjp(ident, mg.tensor([1, 2]), mode=mode)


def test_a_tuple_output_is_refused_naming_the_transformation_asked_for():
    """mg.grad and mg.jacrev on the tape run mg.vjp, and their refusal of a tuple said
    "vjp: ...", a transformation the user never called."""
    x = mg.tensor([1.0, 2.0])
    for name, call in [("grad", lambda: mg.grad(pair)(x)),
                       ("jacrev", lambda: mg.jacrev(pair)(x))]:
        with pytest.raises(TypeError, match=f"^{name}: f must return a tensor, got tuple "
                                            r"\(for several outputs"):
            call()


@pytest.mark.parametrize("mode", COMPILED)
def test_a_cotangent_of_another_dtype_is_refused_by_a_compiled_program(mode):
    """The program is written for the output's dtype (jax.vjp refuses the same)."""
    _, pull = mg.vjp(doubled, mg.tensor(1.0, dtype="float32"), mode=mode)
    with pytest.raises(DTypeError, match=f"g is float64 and f's output float32; in mode "
                                         f"'{mode}'.*pass g as float32"):
        pull(mg.tensor(1.0))
    (gx,) = pull(2.0)  # (a Python number takes the output's dtype)
    assert gx.dtype == "float32" and gx.item() == 4.0


def test_unknown_modes_are_refused_naming_the_reverse_ones():
    with pytest.raises(ValueError, match="vjp: unknown mode 'forward'; reverse mode runs in "
                                         "tape, graph, source .*mg.jvp, mg.jacfwd"):
        mg.vjp(ident, 1.0, mode="forward")
    with pytest.raises(ValueError, match="jacrev: unknown mode 'nope'"):
        mg.jacrev(ident, mode="nope")


@pytest.mark.parametrize("mode", REVERSE)
def test_a_global_written_in_place_is_read_again(mode):
    """A program read W when it was built; after ``W -= 1`` it is built again (the tape
    reads W when it runs): every mode gives d(x*W)/dx = W as it is now."""
    global W  # (the same tensor, written in place)
    x = mg.tensor([1.0, 2.0])
    assert mg.vjp(reads_a_global, x, mode=mode)[1](mg.ones((2,)))[0].numpy().tolist() == [1, 2]
    W -= 1.0
    try:
        assert mg.vjp(reads_a_global, x, mode=mode)[1](mg.ones((2,)))[0].numpy().tolist() == \
            [0, 1]
    finally:
        W += 1.0


@pytest.mark.parametrize("mode", REVERSE)
def test_results_land_on_the_default_device(mode):
    with mg.device("cpu:1"):
        out, pull = mg.vjp(doubled, 2.0, mode=mode)
        assert out.device.name == pull(1.0)[0].device.name == "cpu:1"
        assert mg.jacrev(doubled, mode=mode)(2.0).device.name == "cpu:1"


@pytest.mark.parametrize("mode", ["tape", "graph", "source", "forward"])
def test_gradcheck_in_every_mode(mode):
    assert mg.gradcheck(f, [X, Y], mode=mode)


def writes_into_its_arguments(x, y):
    x += 1.0  # (a write into each argument: every evaluation must start from the inputs)
    y *= 2.0
    return x * y


@pytest.mark.parametrize("mode", ["tape", "graph", "source", "forward"])
def test_gradcheck_of_a_function_that_writes_into_its_arguments(mode):
    """gradcheck gives every evaluation of f its own copies of the inputs. It evaluated f
    on the caller's tensors, so each call saw the previous calls' writes: the finite
    differences measured those (a false failure, by 2e6) and the inputs came back
    changed. The Jacobians are the closed forms d/dx = diag(2y), d/dy = diag(2(x+1))."""
    x, y = mg.tensor([1.0, 2.0]), mg.tensor([3.0, 4.0])
    assert mg.gradcheck(writes_into_its_arguments, [x, y], mode=mode)
    assert x.numpy().tolist() == [1.0, 2.0] and y.numpy().tolist() == [3.0, 4.0]
    dx = mg.jacfwd if mode == "forward" else functools.partial(mg.jacrev, mode=mode)
    got = dx(writes_into_its_arguments, argnums=(0, 1))(mg.tensor([1.0, 2.0]),
                                                           mg.tensor([3.0, 4.0]))
    np.testing.assert_allclose(got[0].numpy(), np.diag([6.0, 8.0]))
    np.testing.assert_allclose(got[1].numpy(), np.diag([4.0, 6.0]))


def test_gradcheck_still_fails_a_wrong_derivative_of_such_a_function():
    """(The copies do not hide a wrong Jacobian: a derivative rule made wrong on purpose
    is caught.)"""
    from minigraph.ops.primitive import PRIMITIVES
    mul = PRIMITIVES["mul"]
    right = mul.vjp
    mul.vjp = [right[0], lambda g, out, a, b: g * a * 3.0]
    try:
        with pytest.raises(GradcheckError, match="input 1"):
            mg.gradcheck(writes_into_its_arguments,
                         [mg.tensor([1.0, 2.0]), mg.tensor([3.0, 4.0])])
    finally:
        mul.vjp = right


def rounded_down(x):
    return mg.astype(x * 3.0, "int64")


def rounded_sum(x):
    return mg.astype(mg.sum(x) * 3.0, "int64")


@pytest.mark.parametrize("mode", ["tape", "forward", "graph", "source"])
def test_an_integer_output_is_piecewise_constant_zeros_in_every_mode(mode):
    """Its derivative is zero wherever it exists; graph mode used to refuse it alone."""
    x = mg.tensor([0.3, 0.9])
    assert mg.grad(rounded_sum, mode=mode)(x).numpy().tolist() == [0.0, 0.0]
    if mode != "forward":
        out, pull = mg.vjp(rounded_down, x, mode=mode)
        assert out.numpy().tolist() == [0, 2]
        assert pull(mg.tensor([1, 1]))[0].numpy().tolist() == [0.0, 0.0]
        assert mg.jacrev(rounded_down, mode=mode)(x).numpy().tolist() == [[0.0, 0.0]] * 2


V = mg.tensor([2.0, 3.0])


def scaled(x):
    return mg.sin(x) * V


@pytest.mark.parametrize("mode", REVERSE)
@pytest.mark.parametrize("changed", ["argument", "global"])
def test_a_value_changed_in_place_between_vjp_and_vjp_fn_is_refused(mode, changed):
    """vjp_fn read the new value: after x += 1, the gradient of x * x came out 2 (x + 1)
    next to the value x * x, in every mode, without a word. PyTorch's version counters
    refuse it; so does every mode now. Updating after vjp_fn is fine."""
    global V
    x = mg.tensor([1.0, 2.0])
    f = doubled_square if changed == "argument" else scaled
    _, pull = mg.vjp(f, x, mode=mode)
    if changed == "argument":
        x += 1.0
    else:
        V += 1.0
    try:
        with pytest.raises(GradientError, match="changed in place .*after mg.vjp ran f"):
            pull(mg.ones((2,)))
    finally:
        if changed == "global":
            V -= 1.0
    x = mg.tensor([1.0, 2.0])
    _, pull = mg.vjp(f, x, mode=mode)
    first = pull(mg.ones((2,)))[0].numpy().tolist()
    x += 1.0  # after the pullback: its result stands
    assert first == ([2.0, 4.0] if changed == "argument" else
                     (np.cos([1.0, 2.0]) * [2.0, 3.0]).tolist())


def doubled_square(x):
    return x * x


@pytest.mark.parametrize("mode", COMPILED)
def test_backward_through_a_compiled_vjp_is_torchs(mode):
    """Arguments that require a gradient: the compiled program runs through bind (not its
    kernels on arrays), so the tensor tape records it and backward() goes through it."""
    g = np.array([1.0, 2.0, -1.0])
    xt, yt = (torch.tensor(a, requires_grad=True) for a in (X, Y))
    gx, gy = tf.vjp(f_torch, xt, yt)[1](_t(g))
    (gx * gy).sum().backward()
    x, y = mg.tensor(X, requires_grad=True), mg.tensor(Y, requires_grad=True)
    a, b = mg.vjp(f, x, y, mode=mode)[1](mg.tensor(g))
    (a * b).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(y.grad.numpy(), yt.grad.numpy(), rtol=1e-12)
