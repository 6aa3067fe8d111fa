"""Graded tests of chapter 04: each compares the student's function with minigraph's own
implementation (mg.compile_graph, mg.trace and its signature, mg.passes.cse) on random
inputs drawn with fixed seeds."""

import ast

import numpy as np
import pytest

import minigraph as mg
from minigraph.graph.trace import signature as mg_signature
from minigraph.grading import assert_same_array, exercises_fixture, in_sandbox

exercises = exercises_fixture()

#: the longest source the tests parse here, in the grader: ast.parse takes hundreds of
#: times a text's size in memory (2 MB of "a=x;" took 1.3 GB, outside --memory and
#: --timeout), and a graph_to_source of these graphs is a few hundred characters
MAX_SOURCE = 64 * 1024

# -- helpers (part of the tests, not of the exercises) ----------------------------------------

TOY_FUNCTIONS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "neg": lambda a: -a,
    "sin": np.sin,
    "cos": np.cos,
    "exp": np.exp,
    "tanh": np.tanh,
}

MG_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "neg": lambda a: -a,
    "sin": mg.sin,
    "cos": mg.cos,
    "exp": mg.exp,
    "tanh": mg.tanh,
}

TEXTBOOK = [
    ("x", "input", ()),
    ("y", "input", ()),
    ("a", "mul", ("x", "y")),
    ("b", "sin", ("x",)),
    ("z", "add", ("a", "b")),
]


def toy_evaluate(nodes, feeds):
    values = {}
    for name, op, inputs in nodes:
        values[name] = (np.asarray(feeds[name], dtype=np.float64) if op == "input"
                        else TOY_FUNCTIONS[op](*(values[i] for i in inputs)))
    return values


def random_graph(seed, n_inputs=3, n_ops=12, duplicates=0, chain=0.7, tie=False):
    """A random toy graph, mostly a chain (each node reads the previous one) with side
    branches. With `duplicates`, that many times a node repeats an earlier node's op and
    inputs under a new name (a common subexpression), and the next node reads both. With
    `tie`, the nodes that nothing reads are added up at the end, so that the last node
    needs them all."""
    rng = np.random.default_rng(seed)
    nodes = [(f"x{i}", "input", ()) for i in range(n_inputs)]
    ops = ["add", "sub", "mul", "neg", "sin", "cos", "tanh"]
    dup_at = set(rng.choice(np.arange(2, n_ops), size=duplicates, replace=False).tolist())
    for k in range(n_ops):
        computed = [n for n in nodes if n[1] != "input"]
        if k in dup_at and computed:
            original, op, inputs = computed[int(rng.integers(len(computed)))]
            nodes.append((f"n{k}", op, inputs))
            nodes.append((f"n{k}_r", ["add", "mul"][int(rng.integers(2))], (f"n{k}", original)))
            continue
        op = ops[int(rng.integers(len(ops)))]
        arity = 2 if op in ("add", "sub", "mul") else 1
        first = len(nodes) - 1 if rng.random() < chain else int(rng.integers(len(nodes)))
        picks = [first] + [int(rng.integers(len(nodes))) for _ in range(arity - 1)]
        nodes.append((f"n{k}", op, tuple(nodes[p][0] for p in picks)))
    if tie:
        read = {i for _, _, inputs in nodes for i in inputs}
        unread = [name for name, op, _ in nodes if op != "input" and name not in read]
        for k, name in enumerate(unread[1:]):
            nodes.append((f"tie{k}", "add", (nodes[-1][0], name)))
    return nodes


def inputs_of(nodes):
    return [name for name, op, _ in nodes if op == "input"]


def to_minigraph(nodes, shape=(4,)):
    graph, env = mg.Graph(), {}
    with graph:
        for name, op, inputs in nodes:
            env[name] = (mg.placeholder(shape, name=name) if op == "input"
                         else MG_OPS[op](*(env[i] for i in inputs)))
    return graph, env


def random_feeds(names, seed, shape=(4,)):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape) for _ in names]


# -- 1. graph_to_source -------------------------------------------------------------------------

def _cases():
    yield TEXTBOOK, ["x", "y"], ["z"]
    yield TEXTBOOK, ["y", "x"], ["z"]  # the parameters in the order of inputs: f(y, x)
    for seed in range(5):
        nodes = random_graph(seed)
        yield nodes, inputs_of(nodes), [nodes[-1][0]]
    nodes = random_graph(7, n_ops=15)  # several outputs, some nodes unused
    yield nodes, inputs_of(nodes), [nodes[-1][0], nodes[-4][0], nodes[-7][0]]


def run_source(*feeds, source, k):
    """The student's source, defined and called (in the sandbox: see below)."""
    namespace = {"np": np}
    exec(compile(source, f"<graph {k}>", "exec"), namespace)
    return namespace["f"](*feeds)


@pytest.mark.points(2)
@pytest.mark.forbid("minigraph.graph.compile.compile_graph", "minigraph.graph.compile.define", "minigraph.graph.passes.prune", why="write the source code yourself")
def test_graph_to_source_computes_the_graph(exercises):
    for k, (nodes, inputs, outputs) in enumerate(_cases()):
        source = exercises.graph_to_source(nodes, inputs, outputs, name="f")
        graph, env = to_minigraph(nodes)
        compiled = mg.compile_graph(graph, [env[i] for i in inputs], [env[o] for o in outputs])
        feeds = random_feeds(inputs, seed=40 + k)
        # The student's text is code: it runs in the sandbox, as exercises.py does, and
        # only its values come back (run here, it would run as the grader)
        assert isinstance(source, str), f"graph {k}: graph_to_source must return a str"
        got = in_sandbox(exercises, run_source, source=source, k=k)(*feeds)
        want = compiled(*feeds)
        assert isinstance(got, tuple) and len(got) == len(outputs), (
            f"graph {k}: the function must return a tuple of {len(outputs)} values")
        for o, g, w in zip(outputs, got, want):
            assert_same_array(g, w.numpy(), f"graph {k}, inputs {inputs}, output {o}",
                              rtol=1e-12, atol=0.0)
    # the parameters in the order of inputs, not of the graph: f(y, x) = x*y + sin(x)
    source = exercises.graph_to_source(TEXTBOOK, ["y", "x"], ["z"], name="f")
    x, y = np.array([2.0, -0.5]), np.array([3.0, 1.5])
    (got,) = in_sandbox(exercises, run_source, source=source, k="y, x")(y, x)
    assert_same_array(got, x * y + np.sin(x), "f(y, x) for inputs ['y', 'x'] (TEXTBOOK)",
                      rtol=1e-12, atol=0.0)


@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.graph.compile.compile_graph", "minigraph.graph.compile.define", "minigraph.graph.passes.prune", why="write the source code yourself")
def test_graph_to_source_is_straight_line_and_pruned(exercises):
    for k, (nodes, inputs, outputs) in enumerate(_cases()):
        source = exercises.graph_to_source(nodes, inputs, outputs, name="f")
        assert isinstance(source, str), f"graph {k}: graph_to_source must return a str"
        assert len(source) <= MAX_SOURCE, (
            f"graph {k}: graph_to_source returned {len(source)} characters; this graph "
            f"needs a few hundred, and the grader reads at most {MAX_SOURCE}")
        tree = ast.parse(source)
        assert len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef), (
            f"graph {k}: the source must be one function definition")
        fn = tree.body[0]
        params = [a.arg for a in fn.args.args]
        assert fn.name == "f" and params == list(inputs), (
            f"graph {k}: expected def f({', '.join(inputs)}), got def {fn.name}"
            f"({', '.join(params)})")
        *assigns, ret = fn.body
        assert all(isinstance(s, ast.Assign) for s in assigns) and isinstance(ret, ast.Return), (
            f"graph {k}: straight-line code: assignments, then one return (no loops, no ifs)")
        graph, env = to_minigraph(nodes)
        compiled = mg.compile_graph(graph, [env[i] for i in inputs], [env[o] for o in outputs])
        lines = [ln for ln in compiled.source.splitlines() if " = k_" in ln or " = ko_" in ln]
        assert len(assigns) == len(lines), (
            f"graph {k}: {len(assigns)} assignments, but the outputs need {len(lines)} nodes "
            f"(mg.compile_graph writes one line each)")
    with pytest.raises(ValueError, match="y"):  # y is needed but not an input
        exercises.graph_to_source(TEXTBOOK, ["x"], ["z"])


# -- 2. compile_source -------------------------------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.graph.compile.define", "minigraph.graph.compile.compile_graph", why="compile and execute the source yourself")
def test_compile_source(exercises):
    source = ("def fancy(a, b, c, d):\n"
              "    e = a + b\n"
              "    f = np.tanh(c * d)\n"
              "    return (e * f, e - f)\n")
    fancy = exercises.compile_source(source, "fancy")
    rng = np.random.default_rng(5)
    a, b, c, d = rng.normal(size=(4, 3))
    got = fancy(a, b, c, d)
    e, f = a + b, np.tanh(c * d)
    assert_same_array(got[0], e * f, rtol=1e-7, atol=0.0)
    assert_same_array(got[1], e - f, rtol=1e-7, atol=0.0)
    # a second function from the same text: a fresh namespace each time
    again = exercises.compile_source(source.replace("np.tanh", "np.sin"), "fancy")
    assert_same_array(again(a, b, c, d)[0], e * np.sin(c * d), rtol=1e-7, atol=0.0)
    assert_same_array(fancy(a, b, c, d)[0], e * f, rtol=1e-7, atol=0.0)
    # ... and not exercises.py's own: a text defining `evaluate` must leave it alone
    shadow = "def evaluate(nodes, feeds):\n    return 'the compiled text'\n"
    shadowed = exercises.compile_source(shadow, "evaluate")(None, None)
    assert shadowed == "the compiled text", (
        f"the compiled `evaluate` returned {shadowed!r}, expected 'the compiled text'")
    values = exercises.evaluate(TEXTBOOK, {"x": 2.0, "y": 3.0})
    assert isinstance(values, dict), (
        f"after compile_source of a text defining `evaluate`, exercises.evaluate returned "
        f"{values!r}, expected its dict of values: run the text in a fresh namespace, "
        f"not in the module's globals()")
    assert_same_array(values["z"], 2.0 * 3.0 + np.sin(2.0), "evaluate(TEXTBOOK)['z']")


# -- 3. signature --------------------------------------------------------------------------------------

@pytest.mark.points(2)
@pytest.mark.forbid("minigraph.graph.trace.signature", why="build the signature yourself")
def test_signature_matches_minigraph(exercises):
    rng = np.random.default_rng(6)
    a3, b3, a4 = rng.normal(size=3), rng.normal(size=3), rng.normal(size=4)
    m23 = rng.normal(size=(2, 3))
    cases = [
        (2.0,), (3.5,), (2,), (3,), ("relu",), (None,), ((1, 2),),
        (a3,), (b3,), (a4,), (m23,), (a3.astype(np.float32),), (b3.astype(np.float32),),
        (mg.tensor(a3),), (mg.tensor(b3),), (mg.tensor(a4),), (mg.tensor(a3).to("cpu:1"),),
        (mg.tensor(a3.astype(np.float32)),), (mg.tensor(1.5),),
        (a3, 2.0), (b3, 1.0), (a3, 2), (a3, 3), (a3, b3), (2.0, a3), (a3, "tanh"),
        # a string by its value, a list and a tuple by their types
        ("tanh",), (a3, "relu"), ([1, 2],), ((1, [2]),), ((1, (2,)),),
        # a constant by type and value (True is not 1), a float in one by its bits
        (True,), (False,), (1,), (np.int64(2),), ((True, 2),), ((0.0,),), ((-0.0,),),
        # a NumPy float scalar is data, a 0-d array of its dtype (not a weak float)
        (np.float64(2.0),), (np.array(2.0),), (np.float32(2.0),),
        (np.array(2.0, np.float32),),
    ]
    got = [exercises.signature(args) for args in cases]
    want = [mg_signature(args) for args in cases]
    for g in got:
        hash(g)  # a cache key must be hashable
    for i in range(len(cases)):
        for j in range(len(cases)):
            if (want[i] == want[j]) != (got[i] == got[j]):
                relation = "equal" if want[i] == want[j] else "different"
                raise AssertionError(f"arguments #{i} and #{j} should have {relation} "
                                     f"signatures (minigraph: {want[i]} vs {want[j]})")


# -- 4. Hybrid --------------------------------------------------------------------------------------------

def model(x, y, n, *, w):
    h = x
    for _ in range(n):
        h = mg.tanh(mg.matmul(h, w) * y) + x
    return h


def two_outputs(x, y):
    a = x * y + mg.sin(x)
    return a, mg.exp(-a * a)


def counting(function, runs, **data):
    """``function`` for mg.trace, counting how often its Python body runs."""
    def f(*args):
        runs.append(1)  # Python side effect: happens only while recording
        return function(*args, **data)
    return f


@pytest.mark.points(3)
@pytest.mark.forbid("minigraph.trace", why="record and cache the graphs yourself")
def test_hybrid_records_once_per_signature(exercises):
    rng = np.random.default_rng(8)
    rows = lambda k: rng.normal(size=(k, 4))  # noqa: E731
    w = np.random.default_rng(7).normal(size=(4, 4)) / 2.0
    calls = [(rows(2), rows(2), 2), (rows(2), rows(2), 2), (rows(3), rows(3), 2),
             (rows(2), rows(2), 3), (rows(2), rows(2), 2), (rows(3), rows(3), 2),
             (mg.tensor(rows(2)), rows(2), 2), (rows(2).astype(np.float32),
                                                rows(2).astype(np.float32), 2)]
    for function, data, arg_lists in [
            (model, {"w": mg.tensor(w)}, calls),
            (two_outputs, {}, [(2.0, 3.0), (0.5, -1.0), (rows(3), rows(3)), (1.5, 2.0),
                               (rows(3), rows(3)),
                               # a weak float takes the float32 array's dtype
                               (rows(3).astype(np.float32), 2.0),
                               (rows(3).astype(np.float32), -0.5),
                               (np.float64(2.0), rows(3).astype(np.float32))])]:
        theirs = []
        f = in_sandbox(exercises, function, **data)  # its body runs in the sandbox
        hybrid, traced = exercises.Hybrid(f), mg.trace(counting(function, theirs, **data))
        for k, args in enumerate(arg_lists):
            got, want = hybrid(*args), traced(*args)
            if isinstance(want, tuple):
                assert isinstance(got, tuple) and len(got) == len(want), f"call {k}: a tuple"
                pairs = zip(got, want)
            else:
                pairs = [(got, want)]
            for g, w_ in pairs:
                assert isinstance(g, np.ndarray), (
                    f"call {k} of {function.__name__}: got a {type(g).__name__}, expected "
                    f"a NumPy array (np.ndarray: call .numpy() on the compiled results)")
                assert_same_array(g, w_.numpy(), f"call {k} of {function.__name__}",
                                  rtol=1e-5, atol=0.0)
            assert hybrid.recordings == traced.recordings, (
                f"after call {k} of {function.__name__}: {hybrid.recordings} recordings, "
                f"mg.trace made {traced.recordings}")
            assert f.calls == hybrid.recordings, (
                f"after call {k}: f's Python body ran {f.calls} times for "
                f"{hybrid.recordings} recordings; a replay must not run it")


# -- 5. cse ---------------------------------------------------------------------------------------

@pytest.mark.points(3)
@pytest.mark.forbid("minigraph.graph.passes.cse", "minigraph.graph.passes.optimize", "minigraph.graph.passes.simplify", why="find the common subexpressions yourself")
def test_cse_matches_minigraph(exercises):
    graphs = [random_graph(seed, n_inputs=2, n_ops=14, duplicates=4, chain=0.9, tie=seed % 2)
              for seed in range(50, 58)]
    graphs.append(TEXTBOOK + [("a2", "mul", ("x", "y")), ("b2", "sin", ("x",)),
                              ("z2", "add", ("a2", "b2")), ("w", "mul", ("z", "z2")),
                              ("v", "mul", ("y", "x"))])  # y*x is not x*y to minigraph
    for k, nodes in enumerate(graphs):
        outputs = [nodes[-1][0]] if k % 2 else [nodes[-1][0], nodes[-3][0]]
        new_nodes, replaced = exercises.cse(nodes, outputs)
        graph, env = to_minigraph(nodes)
        result = mg.passes.cse(graph, [env[o] for o in outputs])
        kept = {name for name, _, _ in nodes if id(env[name]) in result.mapping}
        assert set(replaced) == kept, (
            f"graph {k}: `replaced` should name exactly the nodes the outputs need: "
            f"{sorted(kept)}")
        assert len(new_nodes) == len(result.graph.nodes), (
            f"graph {k}: {len(new_nodes)} nodes after cse, minigraph keeps "
            f"{len(result.graph.nodes)}")
        for a in kept:
            for b in kept:
                same = result[env[a]] is result[env[b]]
                assert (replaced[a] == replaced[b]) == same, (
                    f"graph {k}: {a} and {b} should {'' if same else 'not '}be merged")
        names = {name for name, _, _ in new_nodes}
        for name, op, inputs in new_nodes:
            assert all(i in names for i in inputs), f"graph {k}: {name} reads a removed node"
        feeds = dict(zip(inputs_of(nodes), random_feeds(inputs_of(nodes), seed=60 + k)))
        before, after = toy_evaluate(nodes, feeds), toy_evaluate(new_nodes, feeds)
        for o in outputs:
            assert_same_array(after[replaced[o]], before[o], f"graph {k}, output {o}",
                              rtol=1e-12, atol=0.0)
