"""More edges of graphs, passes and the Session, each against an independent oracle
(NumPy, closed forms, NumPy's casting rules, counts of the copies made)."""


import numpy as np
import pytest

import minigraph as mg
import minigraph.graph.graph as graph_module
from minigraph.errors import DTypeError
from minigraph.graph.graph import FeedError, GraphError
from minigraph.graph.passes import cse, fold_constants, optimize, prune, simplify


def _merged_graph():
    """A graph whose two ``sin`` nodes compute the same: optimize merges them."""
    with mg.Graph() as g:
        x = mg.placeholder((3,), name="x")
        scale = mg.constant(2.0, name="two") * mg.constant(1.5, name="one_and_a_half")
        left = mg.sin(x * scale)
        right = mg.sin(x * scale)
        out = left + right
    return g, x, left, out


@pytest.mark.parametrize("second", [prune, cse, fold_constants, simplify, optimize,
                                    lambda g, fetches: mg.auto_place(g, ["cpu"])])
def test_a_pass_on_a_passs_graph_keeps_its_unfeedable_nodes(second):
    """Graph.unfeedable was not carried to the graph of a pass run on a pass's graph:
    optimize merged `left` and `right` and refused a feed of result[left], yet
    prune(result.graph) took the same feed, which reached `right` too: out gave [0, 0, 0]
    where the original graph gives sin(3x) + 0."""
    g, x, left, out = _merged_graph()
    xv = np.array([0.1, 0.2, 0.3])
    first = optimize(g, [out])
    then = second(first.graph, [first[out]])
    with mg.Session(then.graph) as s:
        with pytest.raises(FeedError, match="cannot be fed.*merged by cse"):
            s.run(then[first[out]], {then[first[left]]: np.zeros(3), then[first[x]]: xv})
        # unfed, the twice rewritten graph computes what the original does
        np.testing.assert_allclose(s.run(then[first[out]], {then[first[x]]: xv}),
                                   2 * np.sin(3.0 * xv))


def test_a_dict_subclass_with_a_constructor_of_its_own_comes_back_as_a_dict():
    """Fetches in a dict (or list) subclass whose constructor takes an argument failed in
    Session's _rebuild with the class's raw TypeError, after the run's Assigns were
    committed: the call failed and the variable had changed all the same."""
    class Named(dict):
        def __init__(self, tag, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.tag = tag

    class Tagged(list):  # (Tagged(values) makes an empty list tagged with the values)
        def __init__(self, tag, values=()):
            super().__init__(values)
            self.tag = tag

    with mg.Graph() as g:
        v = mg.variable(0.0, name="v")
        step = v.assign(v + 1.0)
    with mg.Session(g) as s:
        got = s.run(Named("train", step=step))
        assert type(got) is dict and got == {"step": 1.0}
        got = s.run(Tagged("train", [step, step * 2.0]))  # (one run: one assign)
        assert type(got) is list and got == [2.0, 4.0]
        assert s.run(v) == 2.0  # each run assigned once: 0 + 1 + 1


def test_reads_of_an_unchanged_array_are_not_copied():
    """Each use of a cached array made a tensor copy of it and compared the bytes of two
    more copies (tobytes): 300 reads of an 8 MB weight took 4.5 s to build. The check
    now reads the array in place and makes a tensor only for a new Const (counted here:
    no test asserts on a time)."""
    w = np.random.default_rng(0).random((1000, 1000))
    made = []
    real_tensor = graph_module.tensor

    def counting(*args, **kwargs):
        made.append(args[0])
        return real_tensor(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graph_module, "tensor", counting)
        with mg.Graph() as g:
            acc = p = mg.placeholder((1000, 1000), name="p")
            for _ in range(100):
                acc = acc + w  # the same unchanged array: the same Const
    assert len(made) == 1 and sum(n.op == "Const" for n in g.nodes) == 1
    # written in place through a strided view: a new Const, of the new value (NumPy)
    view, first = w[::2, ::3], w[0, 0]
    with g:
        before = p[::2, ::3] * view
        view[0, 0] = -0.0
        after = p[::2, ::3] * view
    ones = np.ones((1000, 1000))
    got_before, got_after = mg.Session(g).run([before, after], {p: ones})
    assert got_before[0, 0] == first != 0.0 and np.signbit(got_after[0, 0])


def test_a_constant_or_variable_dtype_takes_a_value_it_represents_exactly():
    """mg.constant(1.0, dtype="int64") and mg.variable(np.zeros(3), dtype="int32") were
    refused: the feed rule, which refuses any float-to-int cast, served constants too.
    NumPy casts them; a number that would change (1.5 -> 1, 2**40 -> int32) is still
    refused, naming it, and feeds keep their rule."""
    with mg.Graph() as g:
        c = mg.constant(1.0, dtype="int64")
        v = mg.variable(np.zeros(3), dtype="int32")
        flags = mg.constant([0.0, 1.0], dtype="bool")
        i = mg.placeholder((), "int64", name="i")
        for value, dtype, shown in ((1.5, "int64", "1.5 would become 1"),
                                    ([1.0, 2.0**40], "int32", "1099511627776.0"),
                                    (float("nan"), "int64", "nan would become"),
                                    (2, "bool", "2 would become True")):
            with pytest.raises(DTypeError, match=f"dtype {dtype} where a number would "
                                                 f"change: {shown}"):
                mg.constant(value, dtype=dtype)
        with pytest.raises(DTypeError, match="variable 'w': dtype foo is not supported"):
            mg.variable(1.0, dtype="foo", name="w")
    for node, want in ((c, np.asarray(1.0).astype("int64")),
                       (v, np.zeros(3).astype("int32")),
                       (flags, np.asarray([0.0, 1.0]).astype("bool"))):
        got = node.numpy()
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    with pytest.raises(FeedError, match="cannot be fed to a node of dtype int64"):
        mg.Session(g).run(i, {i: 1.0})


def test_a_pass_result_says_why_it_has_no_node_for_one():
    """PassResult[node] raised a bare KeyError of the node's id for a node the pass
    pruned, or a node of another graph."""
    with mg.Graph() as g:
        x = mg.placeholder((3,), name="x")
        unused = mg.exp(x)
        out = mg.sin(x)
    with mg.Graph():
        stranger = mg.placeholder((3,), name="stranger")
    result = prune(g, [out])
    assert result[out].op == "sin"
    with pytest.raises(GraphError, match="'exp' \\(exp\\) was pruned: nothing fetched"):
        result[unused]
    with pytest.raises(GraphError, match="'stranger' .* not a node of the pass's input "
                                         "graph"):
        result[stranger]
