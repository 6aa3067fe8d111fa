"""Graded tests of chapter 03: each compares the student's function with minigraph's own
implementation (mg.sum_to, mg.vjp, mg.jacrev, mg.jacfwd, mg.gradients + mg.Session) on
random inputs drawn with fixed seeds."""

import numpy as np
import pytest

import minigraph as mg
from minigraph.grading import assert_same_array, exercises_fixture, in_sandbox

exercises = exercises_fixture()

# what the exercises may not call: minigraph's own differentiation, which does all of this
# (the tape's own sweep too: x.backward() calls it, and it calls the one reverse sweep)
NO_AUTODIFF = ("minigraph.grad", "minigraph.value_and_grad", "minigraph.vjp", "minigraph.jvp",
               "minigraph.gradients", "minigraph.jacrev", "minigraph.jacfwd", "minigraph.hessian",
               "minigraph.source_grad", "minigraph.autodiff.tape.backward",
               "minigraph.autodiff.backward.reverse_sweep")

# -- helpers (part of the tests, not of the exercises) ----------------------------------------

TOY_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "neg": lambda a: -a,
    "sin": np.sin,
    "cos": np.cos,
    "exp": np.exp,
    "ones_like": np.ones_like,
}

# The same ops on minigraph values (graph nodes here). ones_like(a) does not depend on the
# value of a: stop_gradient cuts the derivative, as in the toy graphs.
MG_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "neg": lambda a: -a,
    "sin": mg.sin,
    "cos": mg.cos,
    "exp": mg.exp,
    "ones_like": lambda a: mg.stop_gradient(a) * 0.0 + 1.0,
}

TEXTBOOK = [
    ("x", "input", ()),
    ("y", "input", ()),
    ("a", "mul", ("x", "y")),
    ("b", "sin", ("x",)),
    ("z", "add", ("a", "b")),
]

# x appears three times, u not at all, exp's VJP reads its output
REUSE = [
    ("x", "input", ()),
    ("w", "input", ()),
    ("u", "input", ()),
    ("p", "mul", ("x", "x")),
    ("q", "exp", ("w",)),
    ("r", "sub", ("p", "q")),
    ("s", "cos", ("x",)),
    ("t", "mul", ("r", "s")),
    ("v", "neg", ("t",)),
    ("out", "add", ("v", "q")),
]

# ones_like passes no gradient on: d out/dx = 1 - w (not 2x(1 - w)), and u, which reaches
# out only through a ones_like, gets None
ONES = [
    ("x", "input", ()),
    ("w", "input", ()),
    ("u", "input", ()),
    ("o", "ones_like", ("x",)),
    ("a", "mul", ("o", "x")),
    ("p", "ones_like", ("u",)),
    ("b", "sub", ("p", "w")),
    ("out", "mul", ("a", "b")),
]


def toy_evaluate(nodes, feeds):
    values = {}
    for name, op, inputs in nodes:
        values[name] = (np.asarray(feeds[name], dtype=np.float64) if op == "input"
                        else np.asarray(TOY_OPS[op](*(values[i] for i in inputs))))
    return values


def random_graph(seed, n_inputs=3, n_ops=10):
    """A random toy graph; its last node is the output."""
    rng = np.random.default_rng(seed)
    nodes = [(f"x{i}", "input", ()) for i in range(n_inputs)]
    ops = ["add", "sub", "mul", "neg", "sin", "cos"]
    for k in range(n_ops):
        op = ops[rng.integers(len(ops))]
        arity = 2 if op in ("add", "sub", "mul") else 1
        # favour recent nodes, so that the graph is deep rather than wide
        picks = [max(0, len(nodes) - 1 - int(rng.integers(0, 4))) for _ in range(arity)]
        if k < n_inputs:  # every input is read at least once
            picks[0] = k
        nodes.append((f"n{k}", op, tuple(nodes[p][0] for p in picks)))
    return nodes


def inputs_of(nodes):
    return [name for name, op, _ in nodes if op == "input"]


def inner_node(nodes):
    """A node in the middle of a graph, neither an input nor the last node: the tests
    differentiate it too, so that an answer that always starts from the last node fails."""
    computed = [name for name, op, _ in nodes if op != "input"]
    return computed[len(computed) // 2]


def random_feeds(nodes, seed, shape=(4,)):
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=shape) for name in inputs_of(nodes)}


def minigraph_gradients(nodes, y, feeds, order=1):
    """{input: gradient} by minigraph: the toy graph rebuilt with mg, mg.gradients (run
    `order` times), then mg.Session."""
    shape = np.shape(next(iter(feeds.values())))
    graph, env = mg.Graph(), {}
    with graph:
        for name, op, inputs in nodes:
            env[name] = (mg.placeholder(shape, name=name) if op == "input"
                         else MG_OPS[op](*(env[i] for i in inputs)))
        names = inputs_of(nodes)
        grads = {}
        for x in names:
            g = env[y]
            for _ in range(order):
                g = mg.gradients(g, [env[x]])[0] if g is not None else None
            grads[x] = g
    sess = mg.Session(graph)
    feed = {env[x]: feeds[x] for x in names}
    return {x: None if g is None else sess.run(g, feed) for x, g in grads.items()}


def assert_same_gradients(got, expected, what):
    for x, want in expected.items():
        if want is None:
            assert got[x] is None, f"{what}: y does not depend on {x!r}; expected None"
        else:
            assert got[x] is not None, f"{what}: the gradient for {x!r} is missing (None)"
            # (shape and dtype first: assert_allclose alone would broadcast a scalar
            # gradient against the input's shape and pass it)
            assert_same_array(got[x], want, f"{what}: the gradient for {x!r}", rtol=1e-8,
                              atol=1e-10)


# -- 1. sum_to ------------------------------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.sum_to", "minigraph.ops.reduce.sum_to", *NO_AUTODIFF, why="sum the broadcast axes yourself")
def test_sum_to(exercises):
    rng = np.random.default_rng(0)
    cases = [((4, 3), (3,)), ((4, 3), (1, 3)), ((4, 3), (4, 1)), ((2, 4, 3), (4, 1)),
             ((2, 4, 3), ()), ((5,), (5,)), ((3, 1, 2), (1, 1, 2)), ((2, 3), (2, 3))]
    for big, small in cases:
        g = rng.normal(size=big)
        got = np.asarray(exercises.sum_to(g, small))
        want = mg.sum_to(mg.tensor(g), small).numpy()
        assert_same_array(got, want, f"sum_to(g of {big}, {small})", rtol=1e-12, atol=0.0)


# -- 2. vjp_mul -------------------------------------------------------------------------------

@pytest.mark.points(2)
@pytest.mark.forbid("minigraph.sum_to", *NO_AUTODIFF, why="write the VJP of mul yourself")
def test_vjp_mul_broadcasting(exercises):
    rng = np.random.default_rng(1)
    shapes = [((3,), (3,)), ((4, 3), (3,)), ((4, 1), (1, 5)), ((2, 1, 3), (4, 1)),
              ((), (5,)), ((2, 3), ())]
    for xs, ys in shapes:
        x, y = rng.normal(size=xs), rng.normal(size=ys)
        g = rng.normal(size=np.broadcast_shapes(xs, ys))
        _, vjp_fn = mg.vjp(lambda a, b: a * b, x, y)
        want_x, want_y = (t.numpy() for t in vjp_fn(g))
        got_x, got_y = (np.asarray(v) for v in exercises.vjp_mul(g, x, y))
        assert got_x.shape == xs and got_y.shape == ys, (
            f"vjp_mul with x {xs}, y {ys}: got shapes {got_x.shape}, {got_y.shape}")
        assert_same_array(got_x, want_x, f"gx, x {xs} y {ys}", atol=0.0)
        assert_same_array(got_y, want_y, f"gy, x {xs} y {ys}", atol=0.0)


# -- 3 and 4. Jacobians by rows and by columns --------------------------------------------

def sin_times_linear(x, *, a, b):
    return mg.sin(mg.matmul(a, x)) * mg.matmul(b, x)


def tanh_of_squares(x, *, c):
    return mg.tanh(mg.matmul(c, x * x)) + 1.0


def _functions():
    """(function, its data, a point): the functions run in the sandbox (in_sandbox),
    where mg.vjp and mg.jvp can trace them; the grader runs them too, for the answer."""
    rng = np.random.default_rng(2)
    a, b = mg.tensor(rng.normal(size=(3, 4))), mg.tensor(rng.normal(size=(3, 4)))
    c = mg.tensor(rng.normal(size=(5, 2)))
    return [
        (sin_times_linear, {"a": a, "b": b}, rng.normal(size=4)),
        (tanh_of_squares, {"c": c}, rng.normal(size=2)),
    ]


@pytest.mark.points(2)
@pytest.mark.forbid("minigraph.jacrev", "minigraph.jacfwd", why="build the Jacobian row by row")
def test_jacobian_by_rows(exercises):
    for k, (function, data, x) in enumerate(_functions()):
        f = in_sandbox(exercises, function, **data)
        got = np.asarray(exercises.jacobian_by_rows(f, x))
        want = mg.jacrev(lambda v: function(v, **data))(x).numpy()
        assert_same_array(got, want, f"function {k}")
        assert f.calls == 1, (f"function {k}: f ran {f.calls} times; one forward pass "
                              f"(mg.vjp) serves all the rows")


@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.jacrev", "minigraph.jacfwd", why="build the Jacobian column by column")
def test_jacobian_by_columns(exercises):
    for k, (function, data, x) in enumerate(_functions()):
        f = in_sandbox(exercises, function, **data)
        got = np.asarray(exercises.jacobian_by_columns(f, x))
        want = mg.jacfwd(lambda v: function(v, **data))(x).numpy()
        assert_same_array(got, want, f"function {k}")
        assert f.calls == x.size, (f"function {k}: f ran {f.calls} times; by columns, forward "
                                   f"mode takes one pass (mg.jvp) per input, {x.size} here")


# -- 5. reverse_sweep ---------------------------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid(*NO_AUTODIFF, why="sweep the toy graph backwards yourself")
def test_reverse_sweep_textbook(exercises):
    # at the textbook's point and at another one (a constant answer fits only the first)
    for x, y in [(2.0, 3.0), (-0.7, 1.9)]:
        got = exercises.reverse_sweep(TEXTBOOK, {"x": x, "y": y}, "z")
        assert set(got) == {"x", "y"}, f"expected one entry per input, got {sorted(got)}"
        assert np.isclose(got["x"], y + np.cos(x)), (
            f"(g.5): gx = y + cos(x) = {y + np.cos(x)} at x={x}, y={y}; got {got['x']}")
        assert np.isclose(got["y"], x), f"(g.4): gy = x = {x} at x={x}, y={y}; got {got['y']}"
        # from the inner node a = x*y: d a/dx = y, d a/dy = x (not the gradients of z)
        got = exercises.reverse_sweep(TEXTBOOK, {"x": x, "y": y}, "a")
        assert np.isclose(got["x"], y) and np.isclose(got["y"], x), (
            f"d a/dx, d a/dy for a = x*y at x={x}, y={y}: expected {y}, {x}; got "
            f"{got['x']}, {got['y']}")


@pytest.mark.points(2)
@pytest.mark.forbid(*NO_AUTODIFF, why="sweep the toy graph backwards yourself")
def test_reverse_sweep_random_graphs(exercises):
    graphs = [REUSE, ONES] + [random_graph(seed) for seed in range(10, 16)]
    for k, nodes in enumerate(graphs):
        feeds = random_feeds(nodes, seed=100 + k)
        for y in [nodes[-1][0], inner_node(nodes)]:
            got = exercises.reverse_sweep(nodes, feeds, y)
            assert set(got) == set(inputs_of(nodes)), f"graph {k}, y {y!r}: one entry per input"
            assert_same_gradients(got, minigraph_gradients(nodes, y, feeds), f"graph {k}, y {y!r}")


# -- 6. gradient_graph ----------------------------------------------------------------------------

def _check_structure(nodes, new_nodes, grads, xs, what):
    known = {name for name, _, _ in nodes}
    for node in new_nodes:
        assert isinstance(node, tuple) and len(node) == 3, f"{what}: {node!r} is not (name, op, inputs)"
        name, op, inputs = node
        assert name not in known, f"{what}: node name {name!r} is used twice"
        assert op in TOY_OPS, f"{what}: node {name!r} has op {op!r}; use the ops of OPS"
        for i in inputs:
            assert i in known, f"{what}: node {name!r} reads {i!r} before it is defined"
        known.add(name)
    assert len(grads) == len(xs), (
        f"{what}: {len(grads)} gradient names for the {len(xs)} xs {list(xs)}; expected "
        f"one per x, in the order of xs")
    for g in grads:
        assert g is None or g in known, f"{what}: gradient {g!r} is not a node"


@pytest.mark.points(1)
@pytest.mark.forbid(*NO_AUTODIFF, why="emit the gradient nodes yourself")
def test_gradient_graph_textbook(exercises):
    new_nodes, grads = exercises.gradient_graph(TEXTBOOK, "z", ["x", "y"])
    _check_structure(TEXTBOOK, new_nodes, grads, ["x", "y"], "textbook")
    for x, y in [(2.0, 3.0), (-0.5, 1.5)]:  # a graph: the same nodes serve any feeds
        values = toy_evaluate(TEXTBOOK + list(new_nodes), {"x": x, "y": y})
        assert np.isclose(values[grads[0]], y + np.cos(x)), f"gx at x={x}, y={y}"
        assert np.isclose(values[grads[1]], x), f"gy at x={x}, y={y}"
    # the gradients asked for, in the order of xs, of the node asked for (closed forms:
    # dz/dy = x, dz/dx = y + cos(x); d a/dx = y, d a/dy = x for the inner node a = x*y)
    x, y = 2.0, 3.0
    for out, xs, want in [("z", ["y"], [x]), ("z", ["y", "x"], [x, y + np.cos(x)]),
                          ("a", ["x", "y"], [y, x])]:
        what = f"gradient_graph(TEXTBOOK, {out!r}, {xs})"
        new_nodes, grads = exercises.gradient_graph(TEXTBOOK, out, xs)
        _check_structure(TEXTBOOK, new_nodes, grads, xs, what)
        values = toy_evaluate(TEXTBOOK + list(new_nodes), {"x": x, "y": y})
        got = [None if g is None else float(values[g]) for g in grads]
        assert all(g is not None and np.isclose(g, w) for g, w in zip(got, want)), (
            f"{what} at x={x}, y={y}: {got}, expected {want}")


@pytest.mark.points(3)
@pytest.mark.forbid(*NO_AUTODIFF, why="emit the gradient nodes yourself")
def test_gradient_graph_random_graphs(exercises):
    graphs = [REUSE, ONES] + [random_graph(seed, n_ops=12) for seed in range(20, 26)]
    for k, nodes in enumerate(graphs):
        # every input for the last node; for an inner one, the inputs but the first, in
        # reverse (the gradients asked for, in the order asked)
        for y, xs in [(nodes[-1][0], inputs_of(nodes)),
                      (inner_node(nodes), inputs_of(nodes)[:0:-1])]:
            what = f"graph {k}, y {y!r}, xs {xs}"
            new_nodes, grads = exercises.gradient_graph(nodes, y, xs)
            _check_structure(nodes, new_nodes, grads, xs, what)
            for trial in range(2):
                feeds = random_feeds(nodes, seed=200 + 10 * k + trial)
                values = toy_evaluate(nodes + list(new_nodes), feeds)
                got = {x: None if g is None else values[g] for x, g in zip(xs, grads)}
                want = minigraph_gradients(nodes, y, feeds)
                assert_same_gradients(got, {x: want[x] for x in xs}, what)


# -- 7. second_derivative ---------------------------------------------------------------------------

@pytest.mark.points(2)
@pytest.mark.forbid(*NO_AUTODIFF, why="apply your gradient_graph twice")
def test_second_derivative(exercises):
    graphs = [TEXTBOOK, REUSE] + [random_graph(seed, n_ops=8) for seed in range(30, 35)]
    for k, nodes in enumerate(graphs):
        feeds = random_feeds(nodes, seed=300 + k, shape=(3,))
        for y in [nodes[-1][0], inner_node(nodes)]:
            want = minigraph_gradients(nodes, y, feeds, order=2)
            for x in inputs_of(nodes):
                what = f"graph {k}, y {y!r}, x {x!r}"
                new_nodes, name = exercises.second_derivative(nodes, y, x)
                _check_structure(nodes, new_nodes, [name], [x], what)
                got = None if name is None else toy_evaluate(nodes + list(new_nodes), feeds)[name]
                assert_same_gradients({x: got}, {x: want[x]}, f"{what}, d2y/d{x}2")
