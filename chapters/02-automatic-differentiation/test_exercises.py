"""Graded tests of chapter 02 (automatic differentiation).

Every test runs the same computation twice, once with your code and once with
minigraph (mg.jvp, mg.grad, mg.jacfwd, mg.jacrev), and compares. The random programs
are straight-line code over + - * sin cos exp drawn from fixed seeds.
"""

import math

import numpy as np
import pytest

import minigraph as mg
from minigraph.grading import assert_same_array, exercises_fixture, in_sandbox

exercises = exercises_fixture()

# what the exercises may not call: minigraph's own differentiation, every transform of it,
# forward or reverse (any of them gives a tangent: that of sin(u) is mg.grad(mg.sin)(u) * u'),
# and the tape's own sweep (x.backward() calls it, and it calls the one reverse sweep)
NO_AUTODIFF = ("minigraph.jvp", "minigraph.jacfwd", "minigraph.autodiff.forward.Dual",
               "minigraph.grad", "minigraph.value_and_grad", "minigraph.vjp", "minigraph.jacrev",
               "minigraph.gradients", "minigraph.hessian", "minigraph.source_grad",
               "minigraph.autodiff.tape.backward", "minigraph.autodiff.backward.reverse_sweep")

X, Y = 2.0, 3.0  # the textbook's point


def textbook(sin):
    """z = x*y + sin(x), with the sin of whoever runs it."""
    return lambda x, y: x * y + sin(x)


# ---------------------------------------------------------------------------------------
# random straight-line programs
# ---------------------------------------------------------------------------------------

UNARY = ("sin", "cos", "exp")
BINARY = ("add", "sub", "mul")


def random_program(seed, n_inputs, n_ops):
    """Inputs and a list of steps (op, i, j): value[n_inputs + k] = op(value[i], value[j]).

    Arguments favour recent values, so that the output depends on most of the program,
    and programs whose output misses an input are drawn again; exp is only applied to
    values of moderate size, so nothing overflows.
    """
    rng = np.random.default_rng(seed)
    while True:
        xs = [float(v) for v in rng.uniform(-1.5, 1.5, size=n_inputs)]
        values = list(xs)
        steps = []
        for _ in range(n_ops):
            avail = len(values)
            i = max(0, avail - int(rng.geometric(0.4)))
            j = int(rng.integers(avail))
            op = str(rng.choice(UNARY + BINARY))
            if op == "exp" and abs(values[i]) > 2.0:
                op = "sin"
            if op == "mul" and abs(values[i] * values[j]) > 50.0:
                op = "add"
            if op == "sub" and i == j:  # x - x: a constant
                op = "mul"
            steps.append((op, i, j))
            values.append(apply(op, values[i], values[j], MATH))
        if uses_every_input(steps, n_inputs):
            return xs, steps


def uses_every_input(steps, n_inputs):
    """Whether the last value depends on every input (by the program's structure)."""
    needed = {n_inputs + len(steps) - 1}
    for k in reversed(range(len(steps))):
        if n_inputs + k in needed:
            op, i, j = steps[k]
            needed |= {i} if op in UNARY else {i, j}
    return all(i in needed for i in range(n_inputs))


MATH = {"sin": math.sin, "cos": math.cos, "exp": math.exp}


def apply(op, a, b, ns):
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    return ns[op](a)


def run(steps, ns, *xs, override=None):
    """Run the program with the functions of ``ns``; ``override`` replaces one value
    (index -> value) by a variable of its own, to differentiate with respect to it."""
    values = list(xs)
    for k, (op, i, j) in enumerate(steps):
        v = apply(op, values[i], values[j], ns)
        index = len(xs) + k
        values.append(override[index] if override and index in override else v)
    return values


def mg_ns():
    return {"sin": mg.sin, "cos": mg.cos, "exp": mg.exp}


def student_ns(ex):
    return {"sin": ex.sin, "cos": ex.cos, "exp": ex.exp}


PROGRAMS = [random_program(seed, n_inputs, n_ops)
            for seed, n_inputs, n_ops in [(201, 1, 6), (202, 2, 8), (203, 3, 10),
                                          (204, 4, 12), (205, 3, 15), (206, 2, 20)]]


def close(a, b):
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)


# ---------------------------------------------------------------------------------------
# 1. Dual numbers
# ---------------------------------------------------------------------------------------

@pytest.mark.points(2)
@pytest.mark.forbid(*NO_AUTODIFF, why="carry the tangents yourself")
def test_dual_add_and_mul_match_jvp(exercises):
    # u + v, u * v, u * u, 2.5 * u + v, u - v on random duals, against mg.jvp
    D = exercises.Dual
    rng = np.random.default_rng(210)
    cases = [lambda u, v: u + v, lambda u, v: u * v, lambda u, v: u * u,
             lambda u, v: 2.5 * u + v, lambda u, v: u + 1.0, lambda u, v: u - v * v]
    for _ in range(20):
        u, v, du, dv = (float(t) for t in rng.normal(size=4))
        for f in cases:
            value, tangent = mg.jvp(f, (u, v), (du, dv))
            out = f(D(u, du), D(v, dv))
            assert isinstance(out, D), f"got {out!r}, not a Dual"
            assert close(out.value, value.item()) and close(out.tangent, tangent.item()), (
                f"got Dual({out.value}, {out.tangent}), expected ({value.item()}, "
                f"{tangent.item()})")


@pytest.mark.points(1)
@pytest.mark.parametrize("name", ["sin", "cos", "exp"])
@pytest.mark.forbid(*NO_AUTODIFF, why="carry the tangents yourself")
def test_dual_functions_match_jvp(exercises, name):
    rng = np.random.default_rng(211)
    for _ in range(20):
        u, du = (float(t) for t in rng.normal(size=2))
        value, tangent = mg.jvp(getattr(mg, name), (u,), (du,))
        out = getattr(exercises, name)(exercises.Dual(u, du))
        assert close(out.value, value.item()) and close(out.tangent, tangent.item()), (
            f"{name}(Dual({u}, {du})) gave Dual({out.value}, {out.tangent}), expected "
            f"({value.item()}, {tangent.item()})")
        assert close(getattr(exercises, name)(u), value.item()), f"{name} of a float"


@pytest.mark.points(2)
@pytest.mark.forbid(*NO_AUTODIFF, why="carry the tangents yourself")
def test_dual_numbers_on_random_programs(exercises):
    # a whole program on duals: value and directional derivative, against mg.jvp
    rng = np.random.default_rng(212)
    for xs, steps in PROGRAMS:
        ts = [float(t) for t in rng.normal(size=len(xs))]
        value, tangent = mg.jvp(lambda *a: run(steps, mg_ns(), *a)[-1], tuple(xs), tuple(ts))
        out = exercises.lift(run(steps, student_ns(exercises),
                                 *[exercises.Dual(x, t) for x, t in zip(xs, ts)])[-1])
        assert close(out.value, value.item()), "the value is wrong"
        assert close(out.tangent, tangent.item()), (
            f"tangent {out.tangent}, expected {tangent.item()}")


# ---------------------------------------------------------------------------------------
# 2. forward_gradient
# ---------------------------------------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid(*NO_AUTODIFF, why="one forward pass per input, with your Dual")
def test_forward_gradient_textbook(exercises):
    # (c.5) dz/dx = y + cos(x) and (d.5) dz/dy = x, in two passes; at the textbook's
    # point and at another one (a constant answer fits only the first)
    for x, y in [(X, Y), (-0.7, 1.9)]:
        gx, gy = mg.grad(textbook(mg.sin), argnums=(0, 1), mode="forward")(x, y)
        passes = []

        def f(a, b):
            passes.append(1)
            return textbook(exercises.sin)(a, b)

        got = exercises.forward_gradient(f, [x, y])
        assert len(passes) == 2, (f"at x={x}, y={y}: f ran {len(passes)} times; forward "
                                  f"mode needs one pass per input")
        assert close(got[0], gx.item()) and close(got[1], gy.item()), (
            f"at x={x}, y={y}: got {list(got)}, expected [{gx.item()}, {gy.item()}]")


@pytest.mark.points(2)
@pytest.mark.forbid(*NO_AUTODIFF, why="one forward pass per input, with your Dual")
def test_forward_gradient_random_programs_n_passes(exercises):
    for xs, steps in PROGRAMS:
        n = len(xs)
        expected = mg.grad(lambda *a: run(steps, mg_ns(), *a)[-1], argnums=tuple(range(n)),
                           mode="forward")(*xs)
        passes = []

        def f(*args):
            passes.append(1)
            return run(steps, student_ns(exercises), *args)[-1]

        got = exercises.forward_gradient(f, list(xs))
        assert len(passes) == n, f"{n} inputs but f ran {len(passes)} times"
        assert len(got) == n, f"{len(got)} gradients for {n} inputs, expected {n}"
        for g, e in zip(got, expected):
            assert close(g, e.item()), f"gradient {list(got)}, expected {[e.item() for e in expected]}"


# ---------------------------------------------------------------------------------------
# 3. reverse_sweep
# ---------------------------------------------------------------------------------------

@pytest.mark.points(2)
@pytest.mark.forbid(*NO_AUTODIFF, why="sweep the tape backwards yourself")
def test_reverse_sweep_textbook(exercises):
    # (g.1)-(g.5): gz = 1, gb = 1, ga = 1, gy = x, gx = y + cos(x); inputs against mg.grad,
    # at the textbook's point and at another one (a constant answer fits only the first)
    tape = [("mul", ("x", "y"), "a"), ("sin", ("x",), "b"), ("add", ("a", "b"), "z")]
    for x, y in [(X, Y), (-0.7, 1.9)]:
        values = {"x": x, "y": y, "a": x * y, "b": math.sin(x), "z": x * y + math.sin(x)}
        g = exercises.reverse_sweep(tape, values, "z")
        gx, gy = mg.grad(textbook(mg.sin), argnums=(0, 1))(x, y)
        at = f"at x={x}, y={y}"
        assert close(g["z"], 1.0) and close(g["a"], 1.0) and close(g["b"], 1.0), (
            f"{at}: gz, ga, gb = {g['z']}, {g['a']}, {g['b']}, expected 1.0 each")
        assert close(g["y"], gy.item()), f"{at}: gy = {g['y']}, expected {gy.item()}"
        assert close(g["x"], gx.item()), f"{at}: gx = {g['x']}, expected {gx.item()}"
        # from the inner variable a = x*y: d a/dx = y, d a/dy = x, and b, z are not
        # behind a (an answer that always starts from the tape's last record gives
        # gx = y + cos(x))
        g = exercises.reverse_sweep(tape, values, "a")
        assert close(g["a"], 1.0), f"{at}, output a: ga = {g['a']}, expected 1.0"
        assert close(g["x"], y) and close(g["y"], x), (
            f"{at}, output a: gx, gy = {g['x']}, {g['y']}, expected y, x = {y}, {x}")
        assert close(g.get("b", 0.0), 0.0) and close(g.get("z", 0.0), 0.0), (
            f"{at}, output a: gb, gz = {g.get('b', 0.0)}, {g.get('z', 0.0)}, expected 0 "
            f"(a depends on neither)")


def tape_of(xs, steps):
    """The program as a tape of records (op, input names, output name), and its values."""
    names = [f"x{i}" for i in range(len(xs))] + [f"v{k}" for k in range(len(steps))]
    values = run(steps, MATH, *xs)
    tape = []
    for k, (op, i, j) in enumerate(steps):
        inputs = (names[i],) if op in UNARY else (names[i], names[j])
        tape.append((op, inputs, names[len(xs) + k]))
    return tape, dict(zip(names, values)), names


@pytest.mark.points(3)
@pytest.mark.forbid(*NO_AUTODIFF, why="sweep the tape backwards yourself")
def test_reverse_sweep_random_tapes(exercises):
    # the adjoint of every variable, inputs and intermediates, against mg.grad; from the
    # last variable and from one in the middle (the output is an argument: the sweep
    # starts there, and what comes after it on the tape gets no adjoint)
    for xs, steps in PROGRAMS:
        tape, values, names = tape_of(xs, steps)
        n = len(xs)
        for out in (len(names) - 1, n + len(steps) // 2):
            g = exercises.reverse_sweep(tape, dict(values), names[out])
            at = f"output {names[out]} of a tape of {len(tape)} records"
            expected = mg.grad(lambda *a: run(steps, mg_ns(), *a)[out],
                               argnums=tuple(range(n)))(*xs)
            for name, e in zip(names, expected):
                assert close(g.get(name, 0.0), e.item()), (
                    f"{at}: adjoint of input {name}: {g.get(name, 0.0)}, expected {e.item()}")
            for index in range(n, out):  # an intermediate: override it by a variable
                def rest(v, index=index):
                    return run(steps, mg_ns(), *xs, override={index: v})[out]
                e = mg.grad(rest)(values[names[index]])
                assert close(g.get(names[index], 0.0), e.item()), (
                    f"{at}: adjoint of {names[index]}: {g.get(names[index], 0.0)}, "
                    f"expected {e.item()}")
            for name in names[out + 1:]:  # computed after the output: it cannot change it
                assert close(g.get(name, 0.0), 0.0), (
                    f"{at}: adjoint of {name}: {g.get(name, 0.0)}, expected 0 ({name} is "
                    f"computed after {names[out]})")


# ---------------------------------------------------------------------------------------
# 4. Jacobians
# ---------------------------------------------------------------------------------------

def tanh_layer(x, *, W, b):
    """f: R^n -> R^m, a small tanh layer followed by an elementwise product. It runs in
    the sandbox (in_sandbox), where mg.jvp and mg.vjp can trace it."""
    h = mg.tanh(W @ x + b)
    return h * mg.sin(h)


def random_map(seed, n, m):
    """The layer's weights and a point x, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    W, b = mg.tensor(rng.normal(size=(m, n))), mg.tensor(rng.normal(size=m))
    return {"W": W, "b": b}, rng.normal(size=n)


@pytest.mark.points(1)
@pytest.mark.parametrize("n, m", [(1, 3), (4, 2), (5, 5)])
@pytest.mark.forbid("minigraph.jacfwd", "minigraph.jacrev", why="build the Jacobian column by column")
def test_jacobian_fwd_by_columns(exercises, n, m):
    weights, x = random_map(220 + n, n, m)
    expected = mg.jacfwd(lambda v: tanh_layer(v, **weights))(mg.tensor(x)).numpy()
    f = in_sandbox(exercises, tanh_layer, **weights)
    got = np.asarray(exercises.jacobian_fwd(f, x.copy()))
    assert got.shape == (m, n), f"shape {got.shape}, expected {(m, n)}"
    assert f.calls == n, f"f ran {f.calls} times; forward mode needs n = {n} passes"
    assert_same_array(got, expected)


@pytest.mark.points(1)
@pytest.mark.parametrize("n, m", [(3, 1), (2, 4), (5, 5)])
@pytest.mark.forbid("minigraph.jacfwd", "minigraph.jacrev", why="build the Jacobian row by row")
def test_jacobian_rev_by_rows(exercises, n, m):
    weights, x = random_map(230 + n, n, m)
    expected = mg.jacrev(lambda v: tanh_layer(v, **weights))(mg.tensor(x)).numpy()
    f = in_sandbox(exercises, tanh_layer, **weights)
    got = np.asarray(exercises.jacobian_rev(f, x.copy()))
    assert got.shape == (m, n), f"shape {got.shape}, expected {(m, n)}"
    assert f.calls == 1, f"f ran {f.calls} times; reverse mode runs it once and sweeps m times"
    assert_same_array(got, expected)
