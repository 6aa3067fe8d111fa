"""Graded tests of chapter 05: each exercise against minigraph's own runtime.

The graphs are random (fixed seeds) small dataflow graphs built with minigraph, handed to
the exercises as plain data: ``names`` (creation order) and ``inputs`` ({name: [input
names]}). Nothing here depends on thread timing: the runs use ``workers=1``, and the
dispatch rule is checked on the scheduler's decision function directly.
"""

import types
from collections import deque

import numpy as np
import pytest

import minigraph as mg
from minigraph.grading import exercises_fixture, first_difference
from minigraph.graph.topo import fifo_order
from minigraph.runtime.cost import LARGE_ELEMENTS, static_cost
from minigraph.runtime.memory import Memory
from minigraph.runtime.scheduler import Run

exercises = exercises_fixture()

# what the exercises may not call: minigraph's runtime, which does all of this on graphs
NO_RUNTIME = ("minigraph.graph.topo.fifo_order", "minigraph.runtime.session.Session",
              "minigraph.runtime.memory.Memory", "minigraph.runtime.cost.static_cost",
              "minigraph.runtime.cost.CostModel")

SEEDS = range(12)


# -- random graphs, and the same graphs as plain data --------------------------------------

def random_graph(seed, size=12):
    """A random DAG of small ops on (4, 4) and (1, 4) float64 values: elementwise ops
    (with broadcasting), x * x (an input read twice), matmul and a column sum."""
    rng = np.random.default_rng(seed)
    with mg.Graph() as g:
        nodes = [mg.placeholder(shape=(4, 4), name=f"x{k}")
                 for k in range(int(rng.integers(1, 4)))]
        squares = list(nodes)  # the (4, 4) nodes, the right operands of a matmul
        for _ in range(size):
            recent = min(int(rng.geometric(0.4)) - 1, len(nodes) - 1)
            a = nodes[len(nodes) - 1 - recent]  # mostly a recent node: chains, few sinks
            b = nodes[int(rng.integers(len(nodes)))]
            op = rng.choice(["add", "mul", "sin", "tanh", "square", "matmul", "colsum"])
            if op == "add":
                new = a + b
            elif op == "mul":
                new = a * b
            elif op == "sin":
                new = mg.sin(a)
            elif op == "tanh":
                new = mg.tanh(a)
            elif op == "square":
                new = a * a
            elif op == "matmul":
                new = a @ squares[int(rng.integers(len(squares)))]
            else:
                new = a.sum(axis=0, keepdims=True)
            nodes.append(new)
            if new.shape == (4, 4):
                squares.append(new)
    return g


def as_data(g):
    names = [n.name for n in g.nodes]
    inputs = {n.name: [i.name for i in n.inputs] for n in g.nodes}
    return names, inputs


def sinks(g):
    read = {id(i) for n in g.nodes for i in n.inputs}
    return [n for n in g.nodes if id(n) not in read]


def feeds_for(g, seed):
    rng = np.random.default_rng(seed)
    return {n: rng.normal(size=n.shape) * 0.5 for n in g.nodes if n.op == "Placeholder"}


def some_fetches(g, seed):
    """Every sink (so the whole graph runs) and a few inner nodes besides."""
    rng = np.random.default_rng(1000 + seed)
    leaves = {id(n) for n in sinks(g)}  # ids: `node in list` would compare nodes with ==
    inner = [n for n in g.nodes if n.op != "Placeholder" and id(n) not in leaves]
    extra = [n for n in inner if rng.random() < 0.2]
    return sinks(g) + extra


# -- 1. FIFO order ------------------------------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid(*NO_RUNTIME, "graphlib.TopologicalSorter", why="write Kahn's algorithm yourself")
def test_fifo_order_of_the_textbook_example(exercises):
    # z = x*y + sin(x): the order mg.Session(g, workers=1) runs it in
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        y = mg.placeholder(shape=(), name="y")
        z = x * y + mg.sin(x)
    sess = mg.Session(g, workers=1)
    sess.run(z, {x: 2.0, y: 3.0})
    names, inputs = as_data(g)
    got = exercises.fifo_order(names, inputs)
    assert got == sess.last_run.order, f"order {got}, expected {sess.last_run.order}"


@pytest.mark.points(3)
@pytest.mark.forbid(*NO_RUNTIME, "graphlib.TopologicalSorter", why="write Kahn's algorithm yourself")
def test_fifo_order_of_random_graphs(exercises):
    for seed in SEEDS:
        g = random_graph(seed)
        names, inputs = as_data(g)
        expected = [n.name for n in fifo_order(g.nodes, {id(n) for n in g.nodes})]
        got = exercises.fifo_order(names, inputs)
        assert got == expected, \
            f"graph of seed {seed}: {first_difference(got, expected, 'order')}\n{g}"
        if seed < 4:  # the order a serial session really runs in
            sess = mg.Session(g, workers=1)
            sess.run(sinks(g), feeds_for(g, seed))
            run = sess.last_run.order
            assert got == run, f"graph of seed {seed}: {first_difference(got, run, 'order')}\n{g}"


@pytest.mark.points(1)
@pytest.mark.forbid(*NO_RUNTIME, "graphlib.TopologicalSorter", why="write Kahn's algorithm yourself")
def test_fifo_order_detects_a_cycle(exercises):
    # minigraph raises GraphError, a ValueError, when nodes never become ready; the same
    # graph without the edge that closes the cycle is a chain, ordered (a function that
    # refuses everything must not pass)
    names = ["x", "a", "b", "c"]
    inputs = {"x": [], "a": ["x", "c"], "b": ["a"], "c": ["b"]}
    with pytest.raises(ValueError):
        exercises.fifo_order(names, inputs)
    got = list(exercises.fifo_order(names, dict(inputs, a=["x"])))
    assert got == ["x", "a", "b", "c"], (
        f"the chain x -> a -> b -> c: order {got}, expected ['x', 'a', 'b', 'c']")


# -- 2. reference counts: when is each value freed ------------------------------------------

class RecordingMemory(Memory):
    """minigraph's run memory, noting after which node each buffer is freed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.now = None
        self.freed = {}

    def consumed(self, node):
        self.now = node.name
        super().consumed(node)

    def _release(self, node):
        held = len(self.storage)
        super()._release(node)
        if len(self.storage) < held:
            self.freed[node.name] = self.now


def minigraph_free_after(g, fetches):
    """Drive minigraph's Memory through a serial run, as the scheduler does per node."""
    plan = fifo_order(g.nodes, {id(n) for n in g.nodes})
    feeds = {id(n): value for n, value in feeds_for(g, 0).items()}
    memory = RecordingMemory(plan, fetches, list(feeds.values()))
    for node in plan:
        if id(node) not in feeds:
            memory.produced(node, np.zeros(node.shape), False)
        memory.consumed(node)
    return {n.name: memory.freed.get(n.name) for n in plan}


@pytest.mark.points(2)
@pytest.mark.forbid(*NO_RUNTIME, why="count the references yourself")
def test_free_after_matches_reference_counting(exercises):
    for seed in SEEDS:
        g = random_graph(seed)
        names, inputs = as_data(g)
        rng = np.random.default_rng(seed)
        # any fetches: a sink that is not fetched is freed right after it runs
        fetches = [n for n in g.nodes if rng.random() < 0.3]
        order = [n.name for n in fifo_order(g.nodes, {id(n) for n in g.nodes})]
        external = [n.name for n in g.nodes if n.op == "Placeholder"]
        got = exercises.free_after(order, inputs, [f.name for f in fetches], external)
        expected = minigraph_free_after(g, fetches)
        assert got == expected, (
            f"graph of seed {seed}, fetches {[f.name for f in fetches]}: "
            f"{first_difference(got, expected, 'freed')}\n{g}")


# -- 3. the liveness lower bound ------------------------------------------------------------

@pytest.mark.points(3)
@pytest.mark.forbid(*NO_RUNTIME, why="walk the order and count live bytes yourself")
def test_liveness_lower_bound_matches_the_session(exercises):
    for seed in SEEDS:
        g = random_graph(seed, size=16)
        _, inputs = as_data(g)
        fetches = some_fetches(g, seed)
        sess = mg.Session(g, workers=1)
        sess.run(fetches, feeds_for(g, seed))
        stats = sess.last_run
        nbytes = {n.name: 8 * int(np.prod(n.shape)) for n in g.nodes}  # float64
        external = [n.name for n in g.nodes if n.op == "Placeholder"]
        got = exercises.liveness_lower_bound(stats.order, inputs, nbytes,
                                             [f.name for f in fetches], external)
        assert got == stats.lower_bound["cpu"], (
            f"graph of seed {seed}: peak {got} bytes, expected {stats.lower_bound['cpu']}:\n{g}")
        assert got <= stats.total_bytes, (  # never more than keeping everything
            f"graph of seed {seed}: peak {got} bytes, more than all results together "
            f"({stats.total_bytes})")
    # A node nobody reads and nobody fetches is freed right after it runs (the rule of
    # free_after); a session prunes such nodes, so by hand: x (external) is read by a
    # and b, c reads b. a is live alone (100 bytes) and freed; b (100); c with b (200).
    order = ["x", "a", "b", "c"]
    inputs = {"x": [], "a": ["x"], "b": ["x"], "c": ["b"]}
    got = exercises.liveness_lower_bound(order, inputs, dict.fromkeys(order, 100), ["c"], ["x"])
    assert got == 200, (f"x -> a (read by nobody, not fetched), x -> b -> c (fetched), 100 "
                        f"bytes each: peak {got}, expected 200 (a is freed as soon as it runs)")


# -- 4. cheap or expensive ------------------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid(*NO_RUNTIME, why="apply the rules yourself")
def test_cost_class_matches_static_cost(exercises):
    rng = np.random.default_rng(0)
    with mg.Graph() as g:
        small = mg.placeholder(shape=(8, 8), name="small")
        large = mg.placeholder(shape=(256, 256), name="large")  # 65536 elements
        just_below = mg.placeholder(shape=(LARGE_ELEMENTS - 1,), name="just_below")
        unknown = mg.placeholder(shape=None, name="unknown")
        c = mg.constant(rng.normal(size=(8, 8)), name="c")
        v = mg.variable(rng.normal(size=(8, 8)), name="v")
        for x in (small, large, just_below, unknown):
            mg.sin(x), x * 2.0, x + x, mg.exp(x), mg.relu(x), x.sum()
        for x in (small, large, c):
            x @ x, x.T, x.reshape(-1), x[0], mg.softmax(x, axis=1), mg.tanh(x) * x
        just_below.reshape(1, -1)
        v.assign(small * c)
        mg.maximum(large, 0.0)
    for n in g.nodes:
        table = n.prim.cost if n.prim is not None else None
        got = exercises.cost_class(n.op, n.shape, table)
        assert got == static_cost(n), f"node {n.name} ({n.op}, shape {n.shape})"


# -- 5. TensorFlow's dispatch rule ------------------------------------------------------------

class RecordingRun(Run):
    """minigraph's scheduler with the thread pool replaced by a list of batches."""

    def __init__(self, cost):
        self.cost_of = lambda node: cost[node.name]
        self.batches = []

    def _submit(self, batch):
        self.batches.append([n.name for n in batch])


def minigraph_dispatch(ready, cost, inline):
    run = RecordingRun(cost)
    node = {n: types.SimpleNamespace(name=n) for n in list(ready) + list(inline or [])}
    queue = deque(node[n] for n in inline or [])
    run._dispatch([node[n] for n in ready], queue, worker=inline is not None)
    return [n.name for n in queue], run.batches


# The rule's cases written out (ready, cost, inline) -> (inline afterwards, batches),
# the keep-last case first: a worker whose queue is empty keeps the last expensive node.
DISPATCH_CASES = [
    ((["a"], {"a": "expensive"}, []), (["a"], [])),
    ((["a", "b"], {"a": "expensive", "b": "expensive"}, []), (["b"], [["a"]])),
    ((["c", "a"], {"c": "cheap", "a": "expensive"}, []), (["c"], [["a"]])),  # cheap work first
    ((["a", "b"], {"a": "expensive", "b": "expensive"}, ["q"]), (["q"], [["a"], ["b"]])),
    ((["a", "b"], {"a": "expensive", "b": "expensive"}, None), ([], [["a"], ["b"]])),
    ((["c", "a", "d"], {"c": "cheap", "a": "expensive", "d": "cheap"}, None),
     (["c", "d"], [["a"]])),
]


@pytest.mark.points(2)
@pytest.mark.forbid(*NO_RUNTIME, why="apply TensorFlow's rule yourself")
def test_dispatch_follows_tensorflows_rule(exercises):
    for (ready, cost, inline), expected in DISPATCH_CASES:
        got = exercises.dispatch(list(ready), dict(cost), None if inline is None else list(inline))
        got = (list(got[0]), [list(b) for b in got[1]])
        assert got == expected, (f"ready={ready}, cost={cost}, inline={inline}: got {got}, "
                                 f"expected {expected}")
        assert minigraph_dispatch(ready, cost, inline) == expected  # the library agrees
    rng = np.random.default_rng(5)
    for case in range(60):
        ready = [f"n{k}" for k in range(int(rng.integers(0, 6)))]
        cost = {n: str(rng.choice(["cheap", "expensive"])) for n in ready}
        inline = None if case % 3 == 0 else [f"q{k}" for k in range(int(rng.integers(0, 3)))]
        expected = minigraph_dispatch(ready, cost, inline)
        got = exercises.dispatch(list(ready), dict(cost), None if inline is None else list(inline))
        got = (list(got[0]), [list(b) for b in got[1]])
        assert got == expected, (f"ready={ready}, cost={cost}, inline={inline}: got {got}, "
                                 f"expected {expected}")
