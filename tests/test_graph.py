"""Define-and-run: graph building, the reverse-graph pass, passes, Session, compile, trace."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigraph as mg
from minigraph.autodiff.signature import programs
from minigraph.errors import DTypeError, GradientError, ShapeError
from minigraph.graph.graph import GraphError, TracedValueError
from minigraph.runtime.session import FeedError, NodeError


def textbook_graph():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), dtype="float64", name="x")
        y = mg.placeholder(shape=(), dtype="float64", name="y")
        z = x * y + mg.sin(x)
        gx, gy = mg.gradients(z, [x, y])
    return g, x, y, z, gx, gy


# -- building ------------------------------------------------------------------------------

def test_nodes_in_creation_order_with_their_attributes():
    g, x, y, z, *_ = textbook_graph()
    assert [n.name for n in g.nodes[:5]] == ["x", "y", "mul", "sin", "add"]
    assert z.op == "add" and [i.name for i in z.inputs] == ["mul", "sin"]
    assert z.device.name == "cpu" and z.shape == () and z.dtype == "float64"
    assert g["mul"].cost in ("cheap", "expensive")
    assert mg.matmul(mg.placeholder((2, 2)), mg.placeholder((2, 2))).cost == "expensive"


def test_a_chain_link_leaves_few_objects_for_the_garbage_collector():
    """Issue 4/6: Python's cyclic collector walks every object that could hold a
    reference, again on each full pass, so a large graph costs it per object. A link of
    ``y = mg.sin(y) * 1.0001`` with its gradient is five nodes (sin, mul; cos and two
    muls in the gradient), each with its arguments tuple: ten objects, no more (no node
    has a ``__dict__``, a node without parameters keeps the one shared empty dict, and
    ``inputs`` is worked out when asked, not kept)."""
    import gc

    from minigraph.autodiff.tape import NO_PARAMS

    links = 300

    def chain(g):
        x = mg.placeholder((), name="x")
        y = x
        for _ in range(links):
            y = mg.sin(y) * 1.0001
        return x, y

    gc.collect()
    before = len(gc.get_objects())
    with mg.Graph() as g:
        x, y = chain(g)
        (gx,) = mg.gradients(y, [x])
    gc.collect()
    # the graph's own few objects (itself, its list and dicts of nodes, ...) aside
    assert len(gc.get_objects()) - before <= 10 * links + 20
    assert len(g.nodes) == 1 + 5 * links + 1  # (and the seed's Const)
    for n in g.nodes:
        assert not hasattr(n, "__dict__")
        assert n.params is NO_PARAMS
    # ``inputs`` is still there for whoever asks: the nodes among the arguments
    assert y.op == "mul" and y.inputs == (y.args[0],) and y.args[1] == 1.0001
    assert y.args[0].inputs is y.args[0].args  # (sin's only argument is a node)
    # every object the collector counts starts it sooner: building a link counts its two
    # nodes and their two tuples (a ``{}`` made per call and let go is not counted twice)
    gc.disable()
    try:
        with mg.Graph() as g2:
            start = gc.get_count()[0]
            chain(g2)
            # (+30: the count also moves with what else the process frees and makes
            # meanwhile; one more object per link would be 300 more)
            assert gc.get_count()[0] - start <= 4 * links + 30
    finally:
        gc.enable()
    assert mg.Session(g).run(gx, {x: 0.5}) == pytest.approx(_chain_derivative(0.5, links))


def _chain_derivative(x0, links):
    d = 1.0
    for _ in range(links):
        d *= math.cos(x0) * 1.0001
        x0 = math.sin(x0) * 1.0001
    return d


def test_each_node_records_the_users_line():
    with mg.Graph():
        x = mg.placeholder(shape=(2,))
        y = x * 2.0  # the line recorded
    filename, line = y.location
    assert filename == __file__
    with open(__file__) as src:
        assert "the line recorded" in src.readlines()[line - 1]


def _users_helper(x):
    return mg.sin(x) * 2.0  # the helper's line


def test_the_users_line_is_the_innermost_frame_outside_minigraph_on_every_path():
    with mg.Graph():
        x = mg.placeholder(shape=(3,))
        via = {"function": mg.sin(x),  # the call
               "operator": x * 3.0,  # the call
               "method": x.sum(),  # the call
               "reflected": 2.0 - x,  # the call
               "helper": _users_helper(x)}
    with open(__file__) as src:
        lines = src.readlines()
    for how, node in via.items():
        filename, line = node.location
        assert filename == __file__, how
        expected = "the helper's line" if how == "helper" else "the call"
        assert expected in lines[line - 1], how


def test_shape_rules_answer_each_kind_of_argument_on_its_own():
    """Graph.add remembers what a shape rule said; arguments that only look alike (an int
    or a float exponent, float32 or float64) must still get their own answers."""
    with mg.Graph() as g:
        i = mg.placeholder(shape=(2,), dtype="int64")
        f32 = mg.placeholder(shape=(2,), dtype="float32")
        f64 = mg.placeholder(shape=(2, 1), dtype="float64")
        assert (i ** 2).dtype == "int64" and (i ** 2.0).dtype == "float64"
        assert (i * True).dtype == "int64" and (i * 1.0).dtype == "float64"
        assert (f32 * 2.0).dtype == "float32" and (f32 * -0.0).dtype == "float32"
        assert (f32 * f64).shape == (2, 2) and (f32 * f64).dtype == "float64"
        assert (f32 * f32).shape == (2,) and (f64 * f64).shape == (2, 1)
        known = len(g._rules_said)
        for _ in range(3):  # a NaN is one key, however many NaN objects there are
            assert (f32 * float("nan")).dtype == "float32"
        assert len(g._rules_said) == known + 1
        y = mg.placeholder(shape=(3,))
        for _ in range(2):  # the second time too: a rule that raised is asked again
            with pytest.raises(ShapeError, match=r"(?s)\(2,\) and \(3,\).*: f32 \+ y"):
                f32 + y


def test_name_and_device_scopes():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        with mg.name_scope("layer1"):
            a = mg.sin(x)
            with g.name_scope("inner"):
                b = mg.cos(a)
        with mg.device("cpu:1"):
            c = x.to("cpu:1") * 2.0
        d = c + 1.0  # unplaced: colocated with its input
    assert a.name == "layer1/sin" and b.name == "layer1/inner/cos"
    assert c.device.name == "cpu:1" and d.device.name == "cpu:1" and a.device.name == "cpu"


def test_shape_errors_quote_the_users_line():
    with mg.Graph():
        x = mg.placeholder(shape=(3,))
        y = mg.placeholder(shape=(4,))
        with pytest.raises(ShapeError, match=r"(?s)add: shapes \(3,\) and \(4,\).*test_graph.py:\d+: x \+ y"):
            x + y


def test_python_control_flow_on_a_node_is_refused():
    with mg.Graph():
        x = mg.placeholder(shape=())
        with pytest.raises(TracedValueError, match="mg.where"):
            if x > 0:
                pass
        with pytest.raises(TracedValueError):
            float(x)


def test_nodes_of_two_graphs_do_not_mix():
    with mg.Graph():
        a = mg.placeholder(shape=())
    with mg.Graph():
        b = mg.placeholder(shape=())
        with pytest.raises(GraphError, match="another graph"):
            a + b


# -- printing and drawing --------------------------------------------------------------------

def test_print_lists_one_node_per_line():
    g, *_ = textbook_graph()
    text = str(g)
    lines = text.splitlines()
    assert len(lines) == len(g.nodes) + 2
    assert any(line.strip().startswith("mul:f64[]") and "= mul(x, y)" in line and "@cpu" in line
               for line in lines)


def test_dot_has_every_node_and_edge_and_colours_gradients():
    g, *_ = textbook_graph()
    dot = g.to_dot()
    assert dot.startswith('digraph "graph" {') and dot.rstrip().endswith("}")
    assert dot.count("->") == sum(len(n.inputs) for n in g.nodes)
    assert dot.count("lightsalmon") == sum(n.name.startswith("gradients/") for n in g.nodes)


def test_drawing_forward_and_gradient_graphs():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from minigraph.viz.draw import draw_forward_and_gradient

    g, *_ = textbook_graph()
    fig = draw_forward_and_gradient(g)
    left, right = fig.axes
    def boxes(ax):  # node labels have a box; edges are annotations without one
        return [t for t in ax.texts if t.get_bbox_patch() is not None]
    assert len(boxes(left)) == 5 and len(boxes(right)) == len(g.nodes)


# -- the reverse-graph pass ---------------------------------------------------------------------

def test_textbook_gradients_through_a_session():
    g, x, y, z, gx, gy = textbook_graph()
    sess = mg.Session(g)
    zv, gxv, gyv = sess.run([z, gx, gy], feed_dict={x: 2.0, y: 3.0})
    assert zv == 6 + math.sin(2) and gxv == 3 + math.cos(2) and gyv == 2.0
    assert all(n.name.startswith("gradients/") for n in (gx, gy))
    assert gx.op == "AddN"  # two contributions, ga*y and gb*cos(x), summed once


def test_an_addn_is_a_new_array_even_of_one_term():
    """AddN is no view in the table, so compiled code hands its result (a gradient with
    two contributions) over as it is: its kernel must never return a term itself. One
    term (only a direct bind makes such a node) is copied."""
    from minigraph.ops.elementwise import ADD_N
    from minigraph.ops.primitive import bind

    assert not ADD_N.view
    for terms in ([np.ones(3)], [np.ones(3), np.full(3, 2.0)], [np.array(1.5)] * 3):
        total = ADD_N.impl(np, *terms)
        assert not any(np.shares_memory(total, t) for t in terms)
        np.testing.assert_array_equal(total, sum(terms))
    x = mg.tensor(np.ones(3))
    y = bind(ADD_N, x)
    y.data[0] = 5.0
    np.testing.assert_array_equal(x.numpy(), [1.0, 1.0, 1.0])
    grad = mg.grad(lambda a, b: a * b + mg.sin(a), argnums=(0, 1), mode="graph")
    gx, gy = grad(mg.tensor(2.0), mg.tensor(3.0))
    assert gx.item() == 3 + math.cos(2.0) and gy.item() == 2.0


def test_fifo_order_of_the_forward_pass():
    g, x, y, z, *_ = textbook_graph()
    sess = mg.Session(g)
    sess.run(z, {x: 2.0, y: 3.0})
    # sin is ready as soon as x has run; mul waits for y (see graph/topo.py)
    assert sess.last_run.order == ["x", "y", "sin", "mul", "add"]


def _grad_values(build, feeds):
    with mg.Graph() as g:
        xs, ys = build()
        grads = mg.gradients(ys, xs)
    fetch = [gr for gr in grads if gr is not None]
    values = mg.Session(g).run(fetch, {k: v for k, v in zip(xs, feeds)})
    it = iter(values)
    return [None if gr is None else next(it) for gr in grads]


def test_tensorflow_semantics():
    def square():
        x = mg.placeholder(shape=(), name="x")
        return [x], x * x
    assert _grad_values(square, [3.0]) == [6.0]

    def double():
        x = mg.placeholder(shape=(), name="x")
        return [x], x + x
    assert _grad_values(double, [3.0]) == [2.0]

    def unconnected():
        x, y = mg.placeholder(shape=()), mg.placeholder(shape=())
        return [x, y], x * 2.0
    assert _grad_values(unconnected, [1.0, 1.0]) == [2.0, None]

    def stopped():
        x = mg.placeholder(shape=())
        return [x], mg.stop_gradient(x * x) + x
    assert _grad_values(stopped, [3.0]) == [1.0]


def test_non_scalar_ys_are_seeded_with_ones_and_grad_ys_is_used():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,))
        y = x * x
        (g1,) = mg.gradients(y, [x])
        (g2,) = mg.gradients(y, [x], grad_ys=[mg.constant(np.array([1.0, 0.0, 2.0]))])
    v1, v2 = mg.Session(g).run([g1, g2], {x: np.array([1.0, 2.0, 3.0])})
    np.testing.assert_array_equal(v1, [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(v2, [2.0, 0.0, 12.0])


def test_gradients_of_gradients():
    with mg.Graph() as g:
        x = mg.placeholder(shape=())
        y = x ** 3
        (dy,) = mg.gradients(y, x)
        (d2y,) = mg.gradients(dy, x)
        (d3y,) = mg.gradients(d2y, x)
    assert mg.Session(g).run([dy, d2y, d3y], {x: 2.0}) == [12.0, 12.0, 6.0]


def test_matmul_gradients_against_the_closed_form():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    with mg.Graph() as g:
        x, w = mg.placeholder(shape=(3, 4)), mg.placeholder(shape=(4, 2))
        gx, gw = mg.gradients((x @ w).sum(), [x, w])
    vx, vw = mg.Session(g).run([gx, gw], {x: a, w: b})
    np.testing.assert_allclose(vx, np.ones((3, 2)) @ b.T)
    np.testing.assert_allclose(vw, a.T @ np.ones((3, 2)))


def test_integer_values_carry_no_gradient():
    """An integer x is refused (its None read as "loss does not depend on labels"); an
    integer value on the way to a float x carries no gradient, and is no y."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(2, 3))
        labels = mg.placeholder(shape=(2,), dtype="int64")
        loss = mg.cross_entropy(x, labels)
        with pytest.raises(DTypeError, match="int64"):
            mg.gradients(loss, [x, labels])
        (gx,) = mg.gradients(loss, [x])
    assert gx is not None
    with pytest.raises(GradientError, match="int64"):
        with g:
            mg.gradients(labels, [x])


def test_gradient_nodes_live_with_their_forward_nodes():
    with mg.Graph():
        x = mg.placeholder(shape=())
        with mg.device("cpu:1"):
            y = mg.sin(x.to("cpu:1"))
        (gx,) = mg.gradients(y, [x])
    assert gx.device.name == "cpu"
    cos_nodes = [n for n in y.graph.nodes if n.op == "cos"]
    assert cos_nodes and all(n.device.name == "cpu:1" for n in cos_nodes)



def test_gradient_nodes_ignore_an_enclosing_device_scope():
    """The gradient nodes go where their forward nodes are, whatever device scope the
    call to mg.gradients sits in (one device for all of them, or several)."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        y = mg.sin(x) * 2.0
        with mg.device("cpu:1"):
            (gx,) = mg.gradients(y, [x])
            with mg.device("cpu:2"):
                z = mg.cos(x.to("cpu:2"))
            (gz,) = mg.gradients(y + z.to("cpu"), [x])
    first = [n for n in g.nodes if n.name.startswith("gradients/")]
    assert first and all(n.device.name == "cpu" for n in first)
    second = {n.op: n.device.name for n in g.nodes if n.name.startswith("gradients_1/")}
    assert second["sin"] == "cpu:2" and second["cos"] == "cpu"
    gxv, gzv = mg.Session(g).run([gx, gz], {x: 0.5})
    assert gxv == pytest.approx(2 * math.cos(0.5))
    assert gzv == pytest.approx(2 * math.cos(0.5) - math.sin(0.5))


def test_the_gradient_with_respect_to_an_intermediate_node():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        a = x * 3.0
        y = mg.sin(a) + a
        ga, gx = mg.gradients(y, [a, x])
    gav, gxv = mg.Session(g).run([ga, gx], {x: 0.5})
    assert gav == pytest.approx(math.cos(1.5) + 1)
    assert gxv == pytest.approx(3 * (math.cos(1.5) + 1))

# -- passes ----------------------------------------------------------------------------------------

def test_passes_report_what_they_change_and_keep_the_values():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        unused = mg.exp(x)  # noqa: F841 - pruned
        a, b = mg.sin(x), mg.sin(x)  # cse
        c = mg.constant(2.0) * mg.constant(3.0)  # folded
        out = a * b + c
    result = mg.passes.optimize(g, [out])
    text = str(result)
    assert "prune: removed exp" in text
    assert "cse: sin_1 computes the same as sin" in text
    assert "fold_constants: mul (mul) is the constant 6.0" in text
    new_out, new_x = result[out], result[x]
    assert sum(n.op == "sin" for n in result.graph.nodes) == 1
    expected = mg.Session(g).run(out, {x: 0.5})
    assert mg.Session(result.graph).run(new_out, {new_x: 0.5}) == expected
    assert len(g.nodes) == 9  # the original graph is unchanged


# -- Session ----------------------------------------------------------------------------------------

def test_fetch_structures():
    g, x, y, z, gx, gy = textbook_graph()
    sess = mg.Session(g)
    feeds = {x: 2.0, "y": 3.0}
    assert sess.run(z, feeds) == 6 + math.sin(2)
    out = sess.run({"value": z, "grads": (gx, gy)}, feeds)
    assert set(out) == {"value", "grads"} and isinstance(out["grads"], tuple)
    assert sess.run("mul", feeds) == 6.0


def test_feed_errors():
    g, x, y, z, *_ = textbook_graph()
    sess = mg.Session(g)
    with pytest.raises(FeedError, match=r"placeholder 'y' .*test_graph.py.*feed_dict"):
        sess.run(z, {x: 2.0})
    with pytest.raises(ShapeError, match=r"feed for 'x': .*shape \(2,\).*shape \(\)"):
        sess.run(z, {x: np.ones(2), y: 1.0})
    with pytest.raises(FeedError, match=r"feed for 'x': .*dtype complex128.*float64 \(created at "
                                        r".*test_graph.py"):
        sess.run(z, {x: np.array(1.0 + 2.0j), y: 1.0})
    assert sess.run(z, {x: 2.0, y: 3.0}) == 6 + math.sin(2)  # still usable


def test_a_compiled_function_checks_its_arguments_as_a_session_checks_feeds():
    """The code compile_graph writes is made for its inputs' shapes and dtypes: an
    argument of another shape ran silently on (a (3,) array through a (2,) program), a
    float was cut to an int input's integer part, a float tensor computed in floats."""
    with mg.Graph() as g:
        i = mg.placeholder((2,), "int64", name="i")
        doubled = i * 2
    fn = mg.compile_graph(g, [i], [doubled])
    with pytest.raises(FeedError, match="feed for 'i': a value of dtype float64 cannot be fed"):
        fn(np.array([1.7, 2.2]))
    with pytest.raises(FeedError, match="dtype float64 cannot be fed to a node of dtype int64"):
        fn(mg.tensor([1.5, 2.0]))
    with pytest.raises(ShapeError, match=r"feed for 'i': a value of shape \(3,\)"):
        fn(np.ones(3, np.int64))
    with pytest.raises(FeedError, match="do not fit dtype int64"):
        fn(np.array([2**63, 0], np.uint64))
    (out,) = fn(np.array([3, 4], np.int32))  # a cast that keeps every value is made
    assert out.dtype == "int64" and out.numpy().tolist() == [6, 8]


@pytest.mark.parametrize("placeholder, value, fits", [
    ("int32", np.array([2**31, 1]), False), ("int32", np.array([-2**31 - 1, 1]), False),
    ("int32", np.array([2**31 - 1, -2**31]), True), ("int64", np.array([2**63, 1], np.uint64), False),
    ("int64", np.array([2**63 - 1, 0], np.uint64), True)])
def test_an_integer_feed_that_does_not_fit_the_placeholder_is_refused(placeholder, value, fits):
    """A narrowing integer cast (int64 labels fed to an int32 placeholder) would wrap a
    value that does not fit, silently: 2**31 would become -2**31."""
    with mg.Graph() as g:
        i = mg.placeholder((2,), placeholder, name="i")
        out = i + 0
    sess = mg.Session(g)
    if fits:
        np.testing.assert_array_equal(sess.run(out, {i: value}), value.astype(placeholder))
        return
    with pytest.raises(FeedError, match=f"feed for 'i': values .* do not fit dtype {placeholder}"):
        sess.run(out, {i: value})


@settings(max_examples=60, deadline=None)
@given(source=st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint32", "uint64"]),
       target=st.sampled_from(["float32", "float64"]),
       values=st.lists(st.integers(-2**63, 2**64 - 1), min_size=1, max_size=4))
def test_integers_fed_to_a_float_placeholder_arrive_exactly_or_are_refused(source, target,
                                                                         values):
    """int32 labels fed to a float32 placeholder raised NumPy's "Invalid integer data type
    'f'" (the range check asked np.iinfo about a float). Oracle: Python's own integers,
    compared with the float that came out. Where every integer of the source dtype has
    its float (int32 -> float64) the cast is made as NumPy makes it; where not (int64 ->
    float64 too, which NumPy calls safe: 2**53 + 1 rounds), the value must come out
    exactly, or the feed is refused."""
    info = np.iinfo(source)
    values = [v for v in values if info.min <= v <= info.max] or [0]
    array = np.array(values, dtype=source)
    with mg.Graph() as g:
        x = mg.placeholder((len(values),), target, name="x")
        out = x + 0
    sess = mg.Session(g)
    if np.can_cast(source, target, "safe") and source not in ("int64", "uint64"):
        np.testing.assert_array_equal(sess.run(out, {x: array}), array.astype(target))
        return
    exact = all(int(np.array(v, dtype=source).astype(target)) == v for v in values)
    if exact:
        got = sess.run(out, {x: array})
        assert [int(v) for v in np.atleast_1d(got)] == values
    else:
        with pytest.raises(FeedError, match=f"feed for 'x': .* have no exact {target}"):
            sess.run(out, {x: array})


def test_fetching_a_node_of_another_graph():
    g, *_ = textbook_graph()
    other, _, _, z2, *_ = textbook_graph()
    with pytest.raises(GraphError, match="belongs to graph"):
        mg.Session(g).run(z2, {})


def test_a_cycle_is_reported():
    with mg.Graph() as g:
        x = mg.placeholder(shape=())
        a = mg.sin(x)
        b = mg.cos(a)
    a.args = (b,)  # corrupt the graph by hand: a <- b <- a (inputs follow args)
    with pytest.raises(GraphError, match="cycle"):
        mg.Session(g).run(b, {x: 1.0})


def test_variables_keep_state_and_a_failed_run_changes_nothing():
    with mg.Graph() as g:
        w = mg.variable(np.array([1.0, 2.0]), name="w")
        x = mg.placeholder(shape=(2,))
        loss = (w * x).sum()
        (gw,) = mg.gradients(loss, [w])
        step = w.assign(w - 0.5 * gw)
    sess = mg.Session(g)
    sess.run(step, {x: np.array([2.0, 4.0])})
    np.testing.assert_array_equal(w.numpy(), [0.0, 0.0])
    sess.run(step, {x: np.array([2.0, 4.0])})
    np.testing.assert_array_equal(w.numpy(), [-1.0, -2.0])


def test_a_failing_kernel_names_the_node_and_line_and_the_session_survives():
    with mg.Graph() as g:
        w = mg.variable(np.array([1.0, 2.0]), name="w")
        v = mg.placeholder(shape=None, name="v")  # any shape: checked only when it runs
        step = w.assign(w * 2.0)
        bad = w.assign(w + v)  # fails when v does not broadcast with w
    sess = mg.Session(g)
    with pytest.raises(NodeError, match=r"(?s)node 'add' \(add\) failed.*test_graph.py:\d+: bad ="):
        sess.run(bad, {v: np.ones(3)})
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])  # nothing half-done
    sess.run(step, {})
    np.testing.assert_array_equal(w.numpy(), [2.0, 4.0])
    sess.run(bad, {v: np.ones(2)})
    np.testing.assert_array_equal(w.numpy(), [3.0, 5.0])


def test_cross_device_edges_run_through_send_and_recv():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        with mg.device("cpu:1"):
            y = mg.placeholder(shape=(), name="y")
            z = x * y  # reads x from cpu: the partitioner inserts a Send/Recv pair
    assert mg.Session(g).run(z, {x: 2.0, y: 4.0}) == 8.0
    parts = mg.partition(g)
    assert [n.op for n in parts["cpu"].nodes] == ["Placeholder", "Send"]


# -- compile and trace ------------------------------------------------------------------------------

def test_compiled_source_is_straight_line_python():
    g, x, y, z, gx, gy = textbook_graph()
    fn = mg.compile_graph(g, [x, y], [z, gx, gy], name="textbook")
    assert fn.source.startswith("def textbook(x, y):")
    body = fn.source.splitlines()[1:-1]
    assert all(" = k_" in line or ".value" in line for line in body)
    compile(fn.source, "<test>", "exec")
    out = [t.item() for t in fn(2.0, 3.0)]
    assert out == list(mg.Session(g).run([z, gx, gy], {x: 2.0, y: 3.0}))


def test_trace_records_once_per_signature_and_replays():
    calls = []

    def f(x, w, scale):
        calls.append(1)
        return mg.tanh(x @ w) * scale

    tf = mg.trace(f)
    x, w = np.ones((2, 3)), np.full((3, 4), 0.1)
    first = tf(x, w, 2)
    second = tf(x * 2, w, 2)
    assert len(calls) == 1 and tf.recordings == 1
    np.testing.assert_allclose(second.numpy(), np.tanh((x * 2) @ w) * 2)
    np.testing.assert_allclose(first.numpy(), f(mg.tensor(x), mg.tensor(w), 2).numpy())
    tf(np.ones((5, 3)), w, 2)  # a new shape records again
    tf(x, w, 3)  # so does a new static argument
    assert tf.recordings == 3
    assert "def f(x, w):" in tf.source(x, w, 2)  # (the parameters' names)


def test_trace_detects_data_dependent_control_flow():
    def f(x):
        if x.sum() > 0:  # data-dependent: cannot be recorded
            return x
        return -x

    with pytest.raises(TracedValueError, match="mg.where"):
        mg.trace(f)(np.ones(3))


def _scaled_if_positive(x, s):
    if s > 0:
        return (x * s).sum()
    return x.sum()


def test_a_branch_on_a_float_argument_names_it_and_how_to_make_it_a_constant():
    """A float is one of the graph's inputs (one graph for all its values), as a number
    is a tracer under jax.jit; the error names the argument and the fixes."""
    x = np.array([1.0, 2.0])
    with pytest.raises(TracedValueError, match=r"records f with its tensors and floats as "
                                               r"the graph's inputs.*functools\.partial"):
        mg.grad(_scaled_if_positive, mode="graph")(x, 0.5)
    with pytest.raises(TracedValueError, match=r"graph node 's' \(Placeholder\)"):
        mg.trace(lambda x, s: x * float(s))(x, 0.5)
    bound = functools.partial(_scaled_if_positive, s=0.5)
    np.testing.assert_array_equal(mg.grad(bound, mode="graph")(x).numpy(), [0.5, 0.5])
    np.testing.assert_array_equal(mg.grad(_scaled_if_positive, mode="graph")(x, -1).numpy(),
                                  [1.0, 1.0])  # an int is a constant of the graph


def test_graph_mode_grad_is_cached_per_signature():
    f = lambda x, y: (x * y + mg.sin(x)).sum()  # noqa: E731
    vg = mg.MODES["graph"](f, (0, 1))
    cache = programs(f, "graph", ((0, 1),))  # the one cache (autodiff/signature.py)
    for _ in range(3):
        value, (gx, gy) = vg(np.array([2.0, 1.0]), np.array([3.0, 4.0]))
    assert len(cache) == 1
    np.testing.assert_allclose(gx.numpy(), [3 + math.cos(2), 4 + math.cos(1)])
    vg(2.0, 3.0)
    assert len(cache) == 2


# -- deep graphs --------------------------------------------------------------------------------------

def test_a_100k_node_chain_builds_differentiates_and_runs():
    n = 100_000
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        y = x
        for _ in range(n):
            y = y * 1.0000001
        (gx,) = mg.gradients(y, [x])
    value, grad = mg.Session(g).run([y, gx], {x: 2.0})
    assert value == pytest.approx(2.0 * 1.0000001 ** n, rel=1e-9)
    assert grad == pytest.approx(1.0000001 ** n, rel=1e-9)


def test_arrays_from_a_closure_each_get_their_own_constant():
    """Regression: constants were cached by the id of a temporary that could be reused."""
    weights = [np.full((2, 2), k + 1.0) for k in range(3)]

    def f(x):
        for w in weights:
            x = mg.matmul(x, w)
        return x.sum(axis=0)

    eager = f(mg.tensor(np.eye(2))).numpy()
    np.testing.assert_array_equal(mg.trace(f)(np.eye(2)).numpy(), eager)
    np.testing.assert_array_equal(eager, [48.0, 48.0])


def test_each_gradients_pass_has_its_own_scope():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), name="x")
        (dy,) = mg.gradients(mg.sin(x), [x])
        (d2y,) = mg.gradients(dy, [x])
    assert dy.name.startswith("gradients/") and d2y.name.startswith("gradients_1/")
    assert g.to_dot().count("lightsalmon") == sum(
        n.name.startswith(("gradients/", "gradients_1/")) for n in g.nodes)


def test_simplify_drops_neutral_operations_only():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="x")
        s = mg.placeholder(shape=(), name="s")
        one = mg.constant(np.ones(3))
        a = x * one          # x: dropped
        b = (a - 0.0) / 1.0  # dropped twice
        c = s * mg.constant(1.0)  # shape () stays (); dropped
        d = s * one          # broadcasts s to (3,): kept
        e = (x + 0.0) + -0.0  # the first kept (-0.0 + 0.0 is +0.0), the second dropped
        out = mg.concatenate([b + c + d, 1.0 / e])
    result = mg.passes.simplify(g, [out])
    assert sorted(line.split(":")[1].split("(")[0].strip() for line in result.changes) == \
        ["add_1", "div", "mul", "mul_1", "sub"]
    # (a stands for x: an identity of it, a node of its own, so that a feed of a reaches
    # only a's readers, as in the original graph)
    assert result[a].op == "identity" and result[a].args == (result[x],) and \
        result[d].op == "mul" and result[e].op == "add"
    feeds = {x: np.array([1.0, -0.0, 3.0]), s: 2.0}
    with np.errstate(divide="ignore"):
        got = mg.Session(result.graph).run(result[out], {result[x]: feeds[x], result[s]: 2.0})
        assert got.tobytes() == mg.Session(g).run(out, feeds).tobytes()
    assert got[4] == np.inf  # 1 / (-0.0 + 0.0)


def test_compiled_code_writes_in_place_only_into_buffers_nobody_else_sees():
    with mg.Graph() as g:
        x, y = mg.placeholder((4,), name="x"), mg.placeholder((4,), name="y")
        m = x * y                      # dies at `add`: its buffer is reused
        add = m + mg.sin(x)
        s = mg.exp(x)                  # an output: never overwritten
        t = s * 2.0
        v = mg.tanh(y)
        r = mg.reshape(v, (2, 2))      # a view of v: v is never overwritten
        w = v + 1.0
    fn = mg.compile_graph(g, [x, y], [add, s, t, r, w])
    lines = {ln.split(" = ")[0].strip(): ln for ln in fn.source.splitlines() if " = " in ln}
    assert "out=mul" in lines["add"] and "in place: last use of mul" in lines["add"]
    assert "out=" not in lines["mul"]                      # x and y are the caller's arrays
    assert "out=" not in lines["mul_1"]                    # s = exp(x) is an output
    assert "out=" not in lines["add_1"]                    # v has a view (r) still alive
    a, b = np.linspace(-1, 1, 4), np.linspace(2, 3, 4)
    a0, b0 = a.copy(), b.copy()
    out = fn.raw(a, b)
    want = [a * b + np.sin(a), np.exp(a), np.exp(a) * 2, np.tanh(b).reshape(2, 2),
            np.tanh(b) + 1]
    for got, w_ in zip(out, want):
        np.testing.assert_allclose(got, w_, rtol=1e-15)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)


def test_compiled_source_leaves_linecache_with_its_function():
    import gc
    import linecache

    with mg.Graph() as g:
        x = mg.placeholder((), name="x")
        y = mg.sin(x) * 2.0
    fn = mg.compile_graph(g, [x], [y])
    filename = fn.raw.__wrapped__.__code__.co_filename  # (raw: the generated function, guarded)
    assert linecache.getline(filename, 2).strip().startswith("sin = k_sin")  # tracebacks show it
    del fn
    gc.collect()
    assert filename not in linecache.cache  # a traced function's versions do not pile up


def test_a_run_of_nothing_returns_the_empty_structure():
    """run([]) raised IndexError in the planner; TF1's returns [] (and checks the feeds)."""
    with mg.Graph() as g:
        x = mg.placeholder((2,), name="x")
        x * 2.0
    sess = mg.Session(g)
    assert sess.run([], {x: np.ones(2)}) == [] and sess.run({}) == {} and sess.run(()) == ()
    with pytest.raises(ShapeError, match="feed for 'x'"):
        sess.run([], {x: np.ones(3)})


@pytest.mark.parametrize("workers", [1, 2])
def test_a_closed_session_runs_nothing(workers):
    """After close() (or its with block) a run started new worker threads that nothing
    would stop; TensorFlow raises "Attempted to use a closed Session"."""
    import threading

    with mg.Graph() as g:
        x = mg.placeholder((64, 64), name="x")
        y = (x @ x) + (x @ x.T)
    with mg.Session(g, workers=workers) as sess:
        np.testing.assert_allclose(sess.run(y, {x: np.eye(64)}), 2 * np.eye(64))
    before = threading.active_count()
    from minigraph.runtime.session import SessionClosedError
    with pytest.raises(SessionClosedError, match="Session.run: this session was closed"):
        sess.run(y, {x: np.eye(64)})
    with pytest.raises(RuntimeError, match="Session.run_async: this session was closed"):
        sess.run_async(y, {x: np.eye(64)})
    assert threading.active_count() == before


def test_grad_ys_given_as_numbers_arrays_or_tensors_seed_graph_nodes():
    """A number in grad_ys flowed through the rules as an eager value: the gradient of
    sum(x) came back as a tensor, which a Session cannot fetch. Every kind becomes a
    constant of the graph; the closed forms are g * cos(x) and g."""
    X = np.array([0.1, -0.7, 2.0])
    G = np.array([1.0, 2.0, -3.0])
    with mg.Graph() as g:
        x = mg.placeholder((3,), name="x")
        of_sum = mg.gradients(mg.sum(x), [x], grad_ys=[2.0])
        seeded = [mg.gradients(mg.sin(x), [x], grad_ys=[given])[0]
                  for given in (G, mg.tensor(G), mg.constant(G), [1.0, 2.0, -3.0])]
    assert all(isinstance(n, mg.Node) for n in of_sum + seeded)
    got = mg.Session(g).run([of_sum[0]] + seeded, {x: X})
    np.testing.assert_allclose(got[0], [2.0, 2.0, 2.0])
    for value in got[1:]:
        np.testing.assert_allclose(value, G * np.cos(X), rtol=1e-15)


def test_gradients_refuses_grad_ys_of_another_shape_and_no_ys():
    with mg.Graph():
        x = mg.placeholder((3,), name="x")
        with pytest.raises(ShapeError, match=r"gradients: grad_ys\[0\] has shape \(2,\), but "
                                             r"'sin' has shape \(3,\)"):
            mg.gradients(mg.sin(x), [x], grad_ys=[np.ones(2)])
        with pytest.raises(ShapeError, match=r"grad_ys\[0\] has shape \(\)"):
            mg.gradients(mg.sin(x), [x], grad_ys=[1.0])  # (PyTorch's backward refuses too)
        with pytest.raises(GradientError, match="gradients: no ys to differentiate"):
            mg.gradients([], [x])


def test_an_update_in_place_of_a_variable_is_refused_and_assign_changes_it():
    """``w -= 0.5`` on a Variable bound the name to a new node, w - 0.5, and left the
    variable as it was on every run: a loop that ran it "trained" nothing, silently (the
    PyTorch habit; TF2's ``assign_sub``). Refused, naming the line and ``assign``; the
    graph keeps no node of the refused update. The oracle: 1.0 - 0.5 - 0.5."""
    with mg.Graph() as g:
        w = mg.variable(1.0, name="w")
        nodes = len(g.nodes)
        with pytest.raises(GraphError, match=r"test_graph.py:\d+: w -= 0.5: 'w' is a "
                                              r"Variable.*step = w.assign\(w - 0.5\)"):
            w -= 0.5
        assert len(g.nodes) == nodes
        step = w.assign(w - 0.5)
        other = mg.placeholder((), name="p")
        other -= 0.5  # (any other node: a new value, as before)
    sess = mg.Session(g)
    sess.run(step)
    sess.run(step)
    assert float(sess.run(w)) == 0.0
    assert float(sess.run(other, {g["p"]: 2.0})) == 1.5


def _times(a, s):
    return a * s


def test_python_bools_and_constant_outputs_keep_their_dtype_in_a_trace():
    """mg.trace(lambda a: True) gave tensor(1.) and lambda a: 3 tensor(3.), float64,
    where mg.tensor gives bool and int64; a Python bool beside a tensor (a + False, an
    argument True) made the graph passes fail with an AttributeError from inside (a
    neutral-element check that knew int and float only). The oracle: eager mode."""
    x = mg.tensor(np.array([1.5, -0.0], np.float32))
    assert repr(mg.trace(lambda a: True)(x)) == repr(mg.tensor(True))
    assert repr(mg.trace(lambda a: 3)(x)) == repr(mg.tensor(3))
    for f, args in [(lambda a: a + False, (x,)), (lambda a: a ** True, (x,)),
                    (_times, (x, True)), (_times, (x, False))]:
        got, want = mg.trace(f)(*args), f(*args)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        assert np.signbit(got.numpy()).tolist() == np.signbit(want.numpy()).tolist()
    value, g = mg.value_and_grad(lambda a, s: mg.sum(a * s), mode="graph")(x, True)
    assert value.item() == 1.5 and g.tolist() == [1.0, 1.0]


def test_passes_and_compile_graph_name_a_fetch_that_is_not_a_node_of_the_graph():
    """A function or a tensor among the fetches failed deep inside with an
    AttributeError ('predecessors'); a node of another graph with a KeyError, after
    optimize had pruned the whole graph without a word. A Session already said it."""
    with mg.Graph() as g:
        x = mg.placeholder((2,), name="x")
        y = mg.sin(x)
    with mg.Graph() as other:
        z = mg.cos(mg.placeholder((2,), name="x"))
    for call in (lambda: mg.passes.cse(g, [mg.sin]), lambda: mg.passes.optimize(g, [mg.ones(2)]),
                 lambda: mg.compile_graph(g, [x], [mg.sin]), lambda: mg.partition(g, [mg.sin])):
        with pytest.raises(GraphError, match=r"(fetch|output) 0 is a (function|Tensor), not "
                                             r"a node of graph"):
            call()
    for call in (lambda: mg.compile_graph(g, [x], [z]), lambda: mg.passes.optimize(g, [z])):
        with pytest.raises(GraphError, match=r"'cos' is a node of another graph \(also named"):
            call()
    np.testing.assert_allclose(mg.compile_graph(g, [x], [y])(np.ones(2))[0].numpy(),
                               np.sin(np.ones(2)))
