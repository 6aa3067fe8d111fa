"""Compiled graphs under the state lock, one node as the fetches, exact int -> float feeds,
and NumPy on a traced float argument (graph.py, compile.py, ops/weak.py)."""

import threading

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import DTypeError
from minigraph.graph.graph import FeedError, GraphError, TracedValueError
from minigraph.runtime.scheduler import NodeError


def _increment_from_two_threads(make_runs, n: int = 400) -> float:
    """v <- v + 1, ``n`` times in each of two threads (each running what make_runs gives);
    returns v's value afterwards, which a serial order of the runs leaves at 2n."""
    with mg.Graph() as g:
        v = mg.variable(np.zeros(2000), name="v")
        a = v.assign(v + 1.0)
    runs = make_runs(g, v, a)
    threads = [threading.Thread(target=lambda f=f: [f() for _ in range(n)]) for f in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return float(mg.Session(g).run(v)[0])


def test_a_compiled_assign_runs_under_the_graphs_state_lock():
    """compile_graph's program read and assigned variables without the state lock that a
    Session's run holds: two threads each adding 1 n times lost about half the updates
    (closed form: 2n). It holds the lock now, shared with Sessions and pass graphs; a
    program without state takes none; a failing kernel still names its node's line."""
    n = 400

    def compiled_twice(g, v, a):
        f = mg.compile_graph(g, [], [a])
        return [f, f]

    def session_and_compiled_pass(g, v, a):
        r = mg.passes.optimize(g, [a])
        s = mg.Session(g)
        return [lambda: s.run(a), mg.compile_graph(r.graph, [], [r[a]])]

    assert _increment_from_two_threads(compiled_twice, n) == 2 * n
    assert _increment_from_two_threads(session_and_compiled_pass, n) == 2 * n

    with mg.Graph() as g:
        x = mg.placeholder(None, name="x")
        v = mg.variable(np.ones(3), name="v")
        bad = mg.matmul(mg.sin(x), x) + v  # the user's line
        y = mg.cos(x)
    assert "with state_lock" not in mg.compile_graph(g, [x], [y]).source
    line = bad.location[1]
    with pytest.raises(NodeError, match=rf"'matmul'.*\n.*:{line}: "):
        mg.compile_graph(g, [x], [bad])(np.ones((2, 3)))


def test_one_node_as_the_fetches_is_one_fetch_and_leaves_the_graph_as_it_was():
    """The passes (optimize(g, y) ...) and compile_graph(g, [x], y) iterated the node y:
    they added getitem nodes y[0], y[1] to the user's graph and optimised or compiled for
    those (a tuple of scalars back); a 0-d node failed as "iteration over a 0-d graph
    node". One node is one fetch now, as Session.run(y) takes it, and a compiled function
    returns its value alone."""
    with mg.Graph() as g:
        x = mg.placeholder((2,), name="x")
        y = mg.sin(x)
        s = y.sum()
    before = list(g.nodes)
    value = np.array([0.5, 1.0])
    for run_pass in (mg.passes.prune, mg.passes.optimize):
        r = run_pass(g, y)
        assert [n.op for n in r.graph.nodes] == ["Placeholder", "sin"]
    out = mg.compile_graph(g, [x], y)(value)
    np.testing.assert_allclose(out.numpy(), np.sin(value))
    total = mg.compile_graph(g, x, s)(value)
    np.testing.assert_allclose(total.numpy(), np.sin(value).sum())
    assert mg.passes.cse(g, s)[s].shape == ()
    assert list(g.nodes) == before  # (nothing added to the user's graph)
    with pytest.raises(GraphError, match="compile_graph: expects a node or a list of nodes"):
        mg.compile_graph(g, [x], mg.tensor(value))  # (a tensor's rows are no fetches)


def test_integers_that_float64_would_round_are_refused_as_for_float32():
    """2**53 + 1 fed to a float64 placeholder, or given to mg.constant/mg.variable with
    dtype float64, silently became 2**53 (NumPy calls int64 -> float64 a safe cast), while
    2**24 + 1 to float32 was refused. Oracle: Python's exact ints (float(n) != n)."""
    n = 2**53 + 1
    assert float(n) != n and float(n - 1) == n - 1
    with mg.Graph() as g:
        p = mg.placeholder((1,), dtype="float64", name="p")
        y = p * 1.0
    sess = mg.Session(g)
    with pytest.raises(FeedError, match="no exact float64"):
        sess.run(y, {p: np.array([n])})
    with pytest.raises(DTypeError, match="no exact float64"):
        mg.constant(n, dtype="float64")
    with pytest.raises(DTypeError, match="no exact float64"):
        mg.variable(np.array([1, n]), dtype="float64")
    # what a float64 holds exactly is taken: 2**53, and every int32
    assert sess.run(y, {p: np.array([n - 1])})[0] == n - 1
    big = np.array([2**31 - 1], dtype=np.int32)
    assert sess.run(y, {p: big})[0] == 2**31 - 1
    assert mg.constant(n - 1, dtype="float64").value.item() == n - 1


def test_numpy_on_a_traced_float_argument_raises_the_traced_value_error():
    """A float argument of a traced function (a Weak value) had no __array__: np.asarray(s)
    and mg.tensor(s) failed as "dtype object is not supported", np.sqrt(s) as "operand
    'Weak' does not support ufuncs". They raise the TracedValueError a traced tensor
    gets, naming the argument; NumPy's operators on it still work (np.float64(2) * s)."""
    t = mg.tensor(np.array([1.0, 2.0]))
    for f in (lambda t, s: t * np.asarray(s), lambda t, s: t * np.sqrt(s),
              lambda t, s: t + mg.tensor(s)):
        with pytest.raises(TracedValueError, match="graph node 's'"):
            mg.trace(f)(t, 2.0)
    with pytest.raises(TracedValueError, match="graph node 's'"):  # (d/dt: s stays weak)
        mg.grad(lambda t, s: (t * np.sqrt(s)).sum(), mode="graph")(t, 2.0)

    def g(t, s):  # NumPy's operators on s: answered by Weak's own (oracle: NumPy)
        return t * (np.float64(2) * s) + (np.array([1.0, 5.0]) - s) * (np.int64(2) ** s)

    expected = np.array([1.0, 2.0]) * 6.0 + (np.array([1.0, 5.0]) - 3.0) * 8.0
    np.testing.assert_allclose(mg.trace(g)(t, 3.0).numpy(), expected)
    df = mg.grad(lambda s: g(t, s).sum(), mode="graph")(3.0)  # d/ds, closed form:
    closed = 2 * 3.0 + (-2 * 8.0 + (np.array([1.0, 5.0]) - 3.0).sum() * 8.0 * np.log(2))
    np.testing.assert_allclose(float(df), closed)
