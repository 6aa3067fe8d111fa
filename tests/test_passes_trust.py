"""Graph passes keep the original graph's meaning: a feed, a fetch or a gradient of a
pass's graph is right or refused, never silently different (graph/passes.py,
graph/gradients.py)."""

import struct

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.errors import GradientError
from minigraph.graph import passes
from minigraph.graph.graph import GraphError
from minigraph.graph.topo import needed
from minigraph.runtime.scheduler import NodeError


@pytest.mark.parametrize("rewrite", [passes.simplify, passes.optimize])
def test_a_feed_of_a_dropped_node_does_not_reach_the_placeholder_it_stood_for(rewrite):
    """simplify mapped y = x * 1 to the placeholder x itself and left it feedable, so a
    feed of y became a feed of x: z = x + y with x = 2 and y fed 5 gave 10, not 7, and
    {x: 2, y: 5} collapsed to one key."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), dtype="float64", name="x")
        y = x * 1.0
        z = x + y
    r = rewrite(g, [z, y, x])
    assert r[y] is not r[x]
    with mg.Session(r.graph) as s:
        assert s.run(r[z], {r[x]: 2.0, r[y]: 5.0}) == 2.0 + 5.0  # closed form
        assert s.run([r[y], r[z]], {r[x]: 2.0}) == [2.0, 4.0]


@pytest.mark.parametrize("second", [passes.simplify, passes.optimize])
def test_cse_then_simplify_leaves_the_placeholder_feedable(second):
    """cse marked the merged x * 1.0 unfeedable; simplify then replaced it by the
    placeholder x and carried the mark onto x: the graph could not be fed at all."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(), dtype="float64", name="x")
        z = x * 1.0 + x * 1.0
    first = passes.cse(g, [z])
    then = second(first.graph, [first[z]])
    assert mg.Session(then.graph).run(then[first[z]], {then[first[x]]: 2.0}) == 4.0


def test_gradients_refuse_a_node_a_pass_merged_or_folded():
    """mg.gradients with respect to a node cse merged gave the derivative with respect
    to both (5 for 2), and one folded into its reader gave None (for 1.5): a derivative
    perturbs the node as a feed would, and such feeds are refused. The node simplify
    dropped from y = x * 1 (x a placeholder or a variable) is an identity of x now: the
    derivatives with respect to it and to x are right (PyTorch)."""
    with mg.Graph() as g:
        x = mg.placeholder((), name="x")
        a, b = mg.sin(x), mg.sin(x)
        z1 = a * 2.0 + b * 3.0
        y = x * 1.0
        z2 = y + x
        c1 = mg.constant(2.0, name="c1")
        z3 = x * (c1 * mg.constant(3.0))
        v = mg.variable(0.5, name="v")
        w = v * 1.0
        z4 = w * 3.0 + v
    r = passes.optimize(g, [z1, z2, z3, z4, a, y, w, c1, x])
    with r.graph:
        with pytest.raises(GradientError, match="'sin' .*merged by cse"):
            mg.gradients(r[z1], [r[a]])
        with pytest.raises(GradientError, match="'c1' .*folded into"):
            mg.gradients(r[z3], [r[c1]])
        grads = mg.gradients(r[z2], [r[y]]) + mg.gradients(r[z4], [r[w], r[v]])
    xt = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)  # x, and v
    yt = (xt * 1.0).requires_grad_()
    yt.retain_grad()
    (yt + xt).backward()
    vt = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    wt = vt * 1.0
    wt.retain_grad()
    (wt * 3.0 + vt).backward()
    want = [yt.grad.item(), wt.grad.item(), vt.grad.item()]  # 1, 3, 4
    assert mg.Session(r.graph).run(grads, {r[x]: 0.5}) == want


def test_a_fold_that_signals_is_left_to_the_run_and_its_errstate():
    """fold_constants computed 1 / 0 when the pass ran, so a run under
    np.errstate(all="raise") returned inf where the unoptimised run (and NumPy) raise."""
    with mg.Graph() as g:
        x = mg.placeholder((), name="x")
        y = x + mg.constant(1.0) / mg.constant(0.0)
    r = passes.optimize(g, [y])
    with np.errstate(all="raise"):
        with pytest.raises(FloatingPointError):  # the oracle: NumPy raises
            np.float64(1.0) / np.float64(0.0)
        with pytest.raises(NodeError, match="divide by zero"):
            mg.Session(r.graph).run(r[y], {r[x]: 1.0})
    with np.errstate(all="ignore"):
        assert mg.Session(r.graph).run(r[y], {r[x]: 1.0}) == np.float64(1.0) + np.inf


def test_cse_keeps_nan_literals_of_different_bits_apart():
    """value_key keyed a float by float.hex, 'nan' for every NaN: x * nan and x * -nan
    were merged, and a NaN's payload lost (the bits differed from NumPy's)."""
    payload = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000123))[0]
    literals = [float("nan"), -float("nan"), payload]
    xv = np.array([1.0, 2.0])
    with mg.Graph() as g:
        x = mg.placeholder((2,), name="x")
        outs = [x * v for v in literals]
    r = passes.cse(g, outs)
    got = mg.Session(r.graph).run([r[o] for o in outs], {r[x]: xv})
    for v, value in zip(literals, got):
        np.testing.assert_array_equal(value.view(np.uint64), (xv * v).view(np.uint64))


def test_a_folded_arrays_change_line_shows_its_first_items_only():
    """fold_constants built the repr of the whole folded array to keep 57 characters of
    it (82 MB and seconds for a 2000x2000 fold): the line says the dtype, the shape and
    the first items."""
    w = np.arange(12.0).reshape(3, 4)
    with mg.Graph() as g:
        x = mg.placeholder((3, 4), name="x")
        y = x + mg.constant(w) * 2.0
    r = passes.fold_constants(g, [y])
    first = ", ".join(repr(v) for v in (w * 2.0).ravel()[:4].tolist())
    assert r.changes == [f"fold_constants: mul (mul) is the constant "
                         f"float64[3, 4] [{first}, ...]"]


def test_optimize_removes_what_no_fetch_needs_after_folding_and_dropping():
    """optimize kept the constants its folds read and the unit of a dropped x * 1 (21 of
    24 nodes needed by no fetch, with their arrays); they go now, and the pass says why."""
    cv = np.arange(4.0)
    with mg.Graph() as g:
        x = mg.placeholder((4,), name="x")
        c = mg.constant(cv, name="c")
        one = mg.constant(1.0, name="one")
        y = x * one + (c * 1.5 + 0.25)
    r = passes.optimize(g, [y])
    assert needed([r[y]]) == {id(n) for n in r.graph.nodes}
    for node in (c, one):
        with pytest.raises(GraphError, match=f"'{node.name}' .*pruned: .*folded or dropped"):
            r[node]
    assert "prune: removed c (Const), read only by what was folded or dropped" in r.changes
    xv = np.array([1.0, -2.0, 3.0, 0.5])
    np.testing.assert_array_equal(mg.Session(r.graph).run(r[y], {r[x]: xv}),
                                  xv + (cv * 1.5 + 0.25))


def test_a_pass_result_says_a_node_was_made_after_the_pass_ran():
    """PassResult[node] said a node created after the pass ran "was pruned ... Run the
    pass with it among the fetches", for auto_place too, which prunes nothing."""
    with mg.Graph() as g:
        x = mg.placeholder((2,), name="x")
        y = mg.sin(x)
    for r in (mg.auto_place(g, ["cpu"]), passes.prune(g, [y])):
        with g:
            late = mg.cos(x)
        with pytest.raises(GraphError, match="'cos.*' \\(cos\\) was created after the pass"):
            r[late]
