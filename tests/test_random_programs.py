"""Random straight-line programs (hypothesis): every mode gives the same values.

A program is a list of instructions ``(op, i, j)`` over earlier values, in the
three-address form of the textbook's (a.1)-(a.5). It is run twice, by two independent
interpreters: one on minigraph values, one on plain NumPy. Values must match NumPy,
and the gradient must be the same in every differentiation mode and match central
finite differences of the NumPy program.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import minigraph as mg

# name -> (minigraph version, NumPy version); all smooth and defined everywhere
OPS = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div": (lambda a, b: a / (1.0 + b * b), lambda a, b: a / (1.0 + b * b)),
    "sin": (lambda a, b: mg.sin(a), lambda a, b: np.sin(a)),
    "cos": (lambda a, b: mg.cos(a), lambda a, b: np.cos(a)),
    "tanh": (lambda a, b: mg.tanh(a), lambda a, b: np.tanh(a)),
    "sigmoid": (lambda a, b: mg.sigmoid(a), lambda a, b: 1 / (1 + np.exp(-a))),
    "exp_tanh": (lambda a, b: mg.exp(mg.tanh(a)), lambda a, b: np.exp(np.tanh(a))),
}


@st.composite
def programs(draw, n_inputs=2):
    length = draw(st.integers(1, 12))
    prog = []
    for k in range(length):
        n = n_inputs + k  # values defined so far
        prog.append((draw(st.sampled_from(sorted(OPS))), draw(st.integers(0, n - 1)),
                     draw(st.integers(0, n - 1))))
    return prog


def run(prog, inputs, which):
    values = list(inputs)
    for op, i, j in prog:
        values.append(OPS[op][which](values[i], values[j]))
    return values[-1]


def numeric_grad(prog, x, eps=1e-6):
    grads = []
    for k in range(len(x)):
        hi, lo = list(x), list(x)
        hi[k] += eps
        lo[k] -= eps
        grads.append((run(prog, hi, 1) - run(prog, lo, 1)) / (2 * eps))
    return grads


@given(programs(), st.lists(st.floats(-2, 2), min_size=2, max_size=2))
def test_every_mode_agrees_on_random_programs(prog, x):
    assume(abs(run(prog, x, 1)) < 1e3)  # repeated squaring can overflow; keep it tame
    value = run(prog, [mg.tensor(v) for v in x], 0)
    assert value.item() == pytest.approx(run(prog, x, 1), rel=1e-12, abs=1e-12)
    expected = numeric_grad(prog, x)
    f = lambda a, b: run(prog, [a, b], 0)  # noqa: E731
    for mode in mg.MODES:
        if mode == "source":
            continue  # reads f's text: test_source.py runs random programs from temp modules
        grads = mg.grad(f, argnums=(0, 1), mode=mode)(*x)
        for g, e in zip(grads, expected):
            assert g.item() == pytest.approx(e, rel=1e-5, abs=1e-6), mode


@given(programs(n_inputs=1), st.floats(-1.5, 1.5))
def test_second_derivatives_agree_on_random_programs(prog, x):
    assume(abs(run(prog, [x], 1)) < 1e3)
    f = lambda a: run(prog, [a], 0)  # noqa: E731
    h = 1e-4
    fd2 = (run(prog, [x + h], 1) - 2 * run(prog, [x], 1) + run(prog, [x - h], 1)) / h ** 2
    results = {
        "tape over tape": mg.grad(mg.grad(f))(x).item(),
        "forward over forward": mg.grad(mg.grad(f, mode="forward"), mode="forward")(x).item(),
        "forward over tape": mg.grad(mg.grad(f), mode="forward")(x).item(),
        "tape over forward": mg.grad(mg.grad(f, mode="forward"))(x).item(),
    }
    for name, value in results.items():
        assert value == pytest.approx(fd2, rel=1e-4, abs=1e-4), name


@given(programs(), st.lists(st.floats(-2, 2), min_size=2, max_size=2))
def test_eager_graph_compiled_and_traced_values_agree(prog, x):
    assume(abs(run(prog, x, 1)) < 1e3)
    eager = run(prog, [mg.tensor(v) for v in x], 0).item()
    with mg.Graph() as g:
        a, b = mg.placeholder(shape=(), name="a"), mg.placeholder(shape=(), name="b")
        out = run(prog, [a, b], 0)
    if not isinstance(out, mg.Node):  # the program ignored both inputs
        return
    in_session = mg.Session(g).run(out, {a: x[0], b: x[1]})
    compiled = mg.compile_graph(g, [a, b], [out])(*x)[0].item()
    traced = mg.trace(lambda p, q: run(prog, [p, q], 0))(*x).item()
    assert in_session == eager and compiled == eager and traced == eager


# Views share memory with the value they read: a compiled function that wrote into a
# value's buffer in place (compile.py's in_place_plan) while a view of it is still to be
# read, or returned, would give wrong results here.
ARRAY_OPS = dict(OPS, rev=(lambda a, b: a[::-1], lambda a, b: a[::-1]),
                 flat=(lambda a, b: mg.reshape(a, (3, 2)).reshape((2, 3)),
                       lambda a, b: a.reshape(3, 2).reshape(2, 3)))


@st.composite
def array_programs(draw):
    """A program and which of its values are outputs. Views are drawn often, and operands
    mostly among the last few values, so that a view made from a value is often read
    after the value's last other reader (the case an in-place write would break)."""
    ops = sorted(ARRAY_OPS) + ["rev", "flat"] * 3
    prog = []
    for k in range(draw(st.integers(1, 12))):
        n = 2 + k
        recent = st.integers(max(0, n - 3), n - 1)
        prog.append((draw(st.sampled_from(ops)), draw(recent),
                     draw(recent | st.integers(0, n - 1))))
    outputs = draw(st.sets(st.integers(2, 1 + len(prog)))) | {1 + len(prog)}
    return prog, sorted(outputs)


def run_all(prog, inputs, which):
    values = list(inputs)
    for op, i, j in prog:
        values.append(ARRAY_OPS[op][which](values[i], values[j]))
    return values


@settings(max_examples=300)  # the pattern above is one program in tens: search longer
@given(array_programs(), st.integers(0, 2**32 - 1))
def test_compiled_arrays_with_in_place_kernels_match_numpy(case, seed):
    prog, outputs = case
    x = np.random.default_rng(seed).uniform(-2, 2, size=(2, 2, 3))
    kept = x.copy()
    expected = run_all(prog, [x[0], x[1]], 1)
    assume(all(np.all(np.abs(v) < 1e3) for v in expected))
    with mg.Graph() as g:
        a, b = mg.placeholder((2, 3), name="a"), mg.placeholder((2, 3), name="b")
        nodes = run_all(prog, [a, b], 0)
    compiled = mg.compile_graph(g, [a, b], [nodes[k] for k in outputs])
    got = compiled.raw(x[0], x[1])
    for k, value in zip(outputs, got):
        np.testing.assert_allclose(value, expected[k], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(x, kept)  # the inputs were never written into
