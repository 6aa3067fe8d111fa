"""Edges of define-and-run graphs and the Session, each against an independent oracle
(NumPy, closed forms, the graph's own declared shapes and dtypes, TF1's documented rules)."""

import collections
import os

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import DTypeError, GradientError, ShapeError
from minigraph.graph.graph import FeedError, GraphError
from minigraph.graph.passes import cse, optimize


def test_an_array_changed_in_place_between_two_uses_gives_its_new_value():
    """The graph kept one Const per array or tensor object, by id: after arr[0] = 100 (or
    t *= 3) a second use of the object read the copy taken at its first use."""
    arr, t = np.array([1.0, 2.0]), mg.tensor([1.0, 2.0])
    with mg.Graph() as g:
        x = mg.placeholder(shape=(2,), name="x")
        y1, z1 = x * arr, x * t
        arr[0] = 100.0
        with mg.no_grad():
            t *= 3.0
        y2, z2 = x * arr, x * t
        y3 = x * arr  # unchanged since y2: the same value
    got = mg.Session(g).run([y1, y2, z1, z2, y3], {x: np.ones(2)})
    for value, want in zip(got, ([1.0, 2.0], [100.0, 2.0], [1.0, 2.0], [3.0, 6.0],
                                 [100.0, 2.0])):
        np.testing.assert_array_equal(value, want)


def test_a_feed_the_optimised_graph_would_ignore_is_refused():
    """optimize folded and dropped the ops reading a Const, yet a feed of the Const (which
    Session.run honours on the original graph, as TF1 does) was accepted and ignored:
    x * c gave [1, 2] for a fed c of [5, 5]. A node merged by cse would pass a feed to the
    readers of both nodes."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(2,), name="x")
        c = mg.constant(np.array([1.0, 1.0]), name="c")
        k = mg.constant(2.0, name="k")
        y, z = x * c, x + k * 3.0
        a, b = mg.exp(x), mg.exp(x)
    xv = np.array([1.0, 2.0])
    np.testing.assert_allclose(mg.Session(g).run(y, {x: xv, c: [5.0, 5.0]}), xv * 5.0)
    res = optimize(g, [y, z, c, k])  # (c and k fetched too, or optimize prunes them)
    sess = mg.Session(res.graph)
    with pytest.raises(FeedError, match="'c' cannot be fed .* dropped"):
        sess.run(res[y], {res[x]: xv, res[c]: [5.0, 5.0]})
    with pytest.raises(FeedError, match="'k' cannot be fed .* folded into"):
        sess.run(res[z], {res[x]: xv, res[k]: 10.0})
    with pytest.raises(FeedError, match="compile_graph: 'k' cannot be fed"):
        mg.compile_graph(res.graph, [res[x], res[k]], [res[z]])
    # the placeholders are fed as before, and give NumPy's values
    got = sess.run([res[y], res[z]], {res[x]: xv})
    np.testing.assert_allclose(got[0], xv)
    np.testing.assert_allclose(got[1], xv + 6.0)
    merged = cse(g, [a, b])
    with pytest.raises(FeedError, match="stands for 'exp_1' too"):
        mg.Session(merged.graph).run(merged[b], {merged[b]: xv})


def test_an_assign_of_a_value_of_unknown_shape_or_dtype_is_checked_when_it_runs():
    """An Assign whose value depends on a shape=None placeholder was checked only when
    built, where its shape and dtype are unknown: the (2,) float64 variable stored a
    (2, 2) value, or a float32 one, in a run and in a compiled function."""
    with mg.Graph() as g:
        v = mg.variable(np.array([1.0, 2.0]), name="v")
        y = mg.placeholder(shape=None, name="y")
        f = mg.placeholder(shape=None, dtype="float32", name="f")
        step, cast = v.assign(v + y), v.assign(f * 1.0)
    sess = mg.Session(g)
    with pytest.raises(ShapeError, match=r"variable 'v' has shape \(2,\).*shape \(2, 2\)"):
        sess.run(step, {y: np.ones((2, 2))})
    with pytest.raises(DTypeError, match="dtype float32"):
        sess.run(cast, {f: np.array([0.1, 0.2], np.float32)})
    with pytest.raises(mg.errors.MinigraphError, match=r"shape \(3, 2\)"):
        mg.compile_graph(g, [y], [step])(np.ones((3, 2)))
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])  # left as it was
    assert v.numpy().dtype == np.float64
    sess.run(step, {y: np.array([10.0, 20.0])})  # a value that fits is stored
    mg.compile_graph(g, [y], [step])(np.array([1.0, 1.0]))
    np.testing.assert_array_equal(v.numpy(), [12.0, 23.0])


def test_gradients_through_a_node_of_unknown_shape_are_refused_by_name():
    """With grad_ys given, mg.gradients through x * b for a shape=None x failed inside
    reduce.sum_to with Python's TypeError (len(None)); so did a grad_ys placeholder of
    unknown shape for a y of known shape. With b of unknown shape too, the gradient of
    an x fed as (3,) came out (2, 3): nothing knew to sum the broadcast back."""
    with mg.Graph():
        x = mg.placeholder(shape=None, name="x")
        b = mg.placeholder(shape=(2, 3), name="b")
        w = mg.placeholder(shape=(3,), name="w")
        gy = mg.placeholder(shape=None, name="gy")
        u = mg.placeholder(shape=None, name="u")
        with pytest.raises(GradientError, match=r"'mul' \(mul\) has an unknown shape.*\('x'\)"):
            mg.gradients(x * b, [x, b], grad_ys=[np.ones((2, 3))])
        with pytest.raises(GradientError, match=r"has an unknown shape.*\('u', 'x'\)"):
            mg.gradients(x * u, [x], grad_ys=[np.ones((2, 3))])
        with pytest.raises(GradientError, match=r"grad_ys\[0\] 'gy' has an unknown shape"):
            mg.gradients(w * b, [w, b], grad_ys=[gy])


def test_a_user_file_named_like_the_package_is_the_users():
    """user_location took every file whose path began with the package folder's path for
    minigraph's own: the nodes of <repo>/minigraph_homework.py had no line."""
    parent = os.path.dirname(os.path.dirname(os.path.abspath(mg.__file__)))
    filename = os.path.join(parent, "minigraph_homework.py")
    ns = {"mg": mg}
    exec(compile("with mg.Graph():\n    y = mg.placeholder(shape=(), name='x') * 2.0\n",
                 filename, "exec"), ns)
    assert ns["y"].location == (filename, 2)


def test_a_missing_feed_names_only_the_fetches_that_need_it():
    """The error named the first three fetches ('sin', 'cos', 'exp'), not the one that
    reads the placeholder ('mul'); in a run across devices it named none."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        y = mg.placeholder(shape=(), name="y")
        a, b, d = mg.sin(x), mg.cos(x), mg.exp(x)
        c = a * y
    with pytest.raises(FeedError, match="the fetches 'mul' depend on it") as info:
        mg.Session(g).run([a, b, d, c], {x: 1.0})
    assert "'sin'" not in str(info.value)
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="x")
        y = mg.placeholder(shape=(3,), name="y")
        with mg.device("cpu:1"):
            c = mg.exp(x) + y
    with pytest.raises(FeedError, match="placeholder 'y'.*the fetches 'add' depend on it"):
        mg.Session(g).run(c, {x: [1.0, 2.0, 3.0]})


@pytest.mark.parametrize("dep", [mg.tensor([1.0]), 3.0, np.ones(2)],
                         ids=["tensor", "float", "array"])
def test_control_dependencies_refuse_what_is_no_node(dep):
    """A tensor, a number or an array was taken (and a stray Const added), then every
    run and print(g) failed with "'Tensor' object has no attribute 'predecessors'"."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        with pytest.raises(GraphError, match="control_dependencies: control input 0 is a"):
            with mg.control_dependencies([dep]):
                x * 2.0
        with pytest.raises(GraphError, match="expects a list of nodes"):
            with mg.control_dependencies(x):  # (iterated: 7 getitem and const nodes)
                pass
        with mg.control_dependencies(["x"]):  # a name, as in TF1
            y = x * 2.0
    assert len(g) == 2 and y.control_inputs == (x,)


def test_constant_and_variable_refuse_a_dtype_that_changes_a_value():
    """mg.constant(1.5, dtype="int32") gave 1, mg.constant(2**24 + 1, dtype="float32")
    16777216 and mg.variable(2**40, dtype="int32") NumPy's bare OverflowError, where a feed
    or an assign of the same value is refused (and TF1's constant refuses it)."""
    with mg.Graph():
        with pytest.raises(DTypeError, match="cannot be made a constant of dtype int32"):
            mg.constant(1.5, dtype="int32")
        with pytest.raises(DTypeError, match="variable 'v': a value of dtype float64"):
            mg.variable([1.5, 2.7], dtype="int64", name="v")
        with pytest.raises(DTypeError, match="have no exact float32"):
            mg.constant(2**24 + 1, dtype="float32")
        with pytest.raises(DTypeError, match="do not fit dtype int32"):
            mg.variable(2**40, dtype="int32")
        for value, dtype in ((3, "float32"), (1.5, "float32"), ([1, 2], "int32")):
            np.testing.assert_array_equal(mg.constant(value, dtype=dtype).numpy(),
                                          np.asarray(value, dtype=dtype))


def test_a_node_of_another_graph_of_the_same_name_is_told_apart():
    """"node 'x' belongs to graph 'graph', not to this session's graph 'graph'": the two
    graphs had the default name, and the node's line was not given."""
    with mg.Graph() as g1:
        x = mg.placeholder(shape=(), name="x")
        y = x * 2.0
    with mg.Graph():
        other = mg.placeholder(shape=(), name="x")
    with pytest.raises(GraphError, match=r"another graph of the same name.*created at .*"
                                         r"test_graph_edges.py"):
        mg.Session(g1).run(y, {other: 1.0})


def test_mapping_fetches_come_back_as_their_own_type():
    """An OrderedDict or a defaultdict of fetches came back as a plain dict; TF1 returns
    the fetches' own mapping type, a defaultdict with its default_factory."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        y = x * 2.0
    sess = mg.Session(g)
    got = sess.run(collections.OrderedDict(y=y, x=x), {x: 1.5})
    assert type(got) is collections.OrderedDict and list(got) == ["y", "x"]
    assert got["y"] == 3.0
    got = sess.run(collections.defaultdict(list, y=y), {x: 1.5})
    assert type(got) is collections.defaultdict and got["y"] == 3.0
    assert got["missing"] == []


def test_an_empty_name_scope_is_the_top_level():
    """name_scope("") named a node "/x", which no fetch by name finds; TF1 goes back to
    the top-level scope."""
    with mg.Graph() as g:
        with mg.name_scope("a"):
            with mg.name_scope(""):
                x = mg.placeholder(shape=(), name="x")
            y = x * 2.0
    assert (x.name, y.name) == ("x", "a/mul")
    assert mg.Session(g).run("x", {"x": 1.5}) == 1.5


def test_detach_in_a_graph_and_under_vmap_is_stop_gradient():
    """x.detach() raised AttributeError on a graph node (mg.grad(mode="graph"), mg.trace)
    and on vmap's batched value. Closed form: f(x) = sum(x * x) with the second factor
    detached, so df/dx = x (PyTorch's torch.func.grad gives the same)."""
    xv = np.array([0.5, 1.5, -0.7])
    batch = np.stack([xv, 2 * xv])

    def f(x):
        return (x * x.detach()).sum()

    want = xv
    np.testing.assert_allclose(mg.grad(f, mode="graph")(mg.tensor(xv)).numpy(), want)
    np.testing.assert_allclose(mg.trace(f)(mg.tensor(xv)).numpy(), np.sum(xv * xv))
    np.testing.assert_allclose(mg.vmap(f)(mg.tensor(batch)).numpy(),
                               np.sum(batch * batch, axis=1))
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="x")
        (gx,) = mg.gradients(f(x), [x])
    np.testing.assert_allclose(mg.Session(g).run(gx, {x: xv}), want)
