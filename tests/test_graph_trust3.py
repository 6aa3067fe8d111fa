"""Transfers that share a Recv, compiled outputs that are the caller's arguments, and the
check of reads after assigns on long chains (partition.py, session.py, compile.py,
topo.py)."""

import tracemalloc

import numpy as np
import pytest

import minigraph as mg
from minigraph.graph.graph import GraphError
from minigraph.graph.topo import fifo_order, needed, refuse_reads_after_assigns


# -- 1. two transfers of one value to one device share a Recv ------------------------------

@pytest.mark.parametrize("workers", [1, 2])
def test_two_transfers_of_one_value_to_one_device_are_both_fetched(workers):
    """``m.to("cpu:1")`` twice: the partition makes one Recv for both (one Send/Recv pair
    per value and device), but kept it as the stand-in of the second transfer only, so
    fetching both, or one and a node the other feeds, raised a raw KeyError. The oracle:
    NumPy's sin, TF1's semantics (each fetch is its node's value)."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="x")
        m = mg.sin(x)
        a, b = m.to("cpu:1"), m.to("cpu:1")
        with mg.device("cpu:1"):
            c = b * 2.0
    one = np.array([0.5, 1.0, 2.0])
    sess = mg.Session(g, workers=workers)
    got_a, got_b = sess.run([a, b], {x: one})
    np.testing.assert_allclose(got_a, np.sin(one))
    np.testing.assert_allclose(got_b, np.sin(one))
    assert not np.shares_memory(got_a, got_b)  # (two fetches, two arrays of the caller's)
    got_a, got_c = sess.run([a, c], {x: one})
    np.testing.assert_allclose(got_a, np.sin(one))
    np.testing.assert_allclose(got_c, 2.0 * np.sin(one))
    parts = mg.partition(g, [a, b])
    (recv,) = parts.recvs()  # (it stands for both transfers)
    assert [o.name for o in parts.origins[id(recv)]] == [a.name, b.name]


@pytest.mark.parametrize("workers", [1, 2])
def test_gradients_across_devices_with_one_adjoint_for_two_xs(workers):
    """y on cpu reads k = h + 1 on cpu:1: the gradients of y with respect to h and k are
    one adjoint node, moved to cpu:1 by two transfers (one per x), and so are those of
    gradients(y, [h, h]): both raised a raw KeyError. Closed form: d sum(sin(k))/dh =
    d/dk = cos(k) = cos(2 x1 + 1)."""
    with mg.Graph() as g:
        with mg.device("cpu:1"):
            x1 = mg.placeholder(shape=(3,), name="x1")
            h = x1 * 2.0
            k = h + 1.0
        with mg.device("cpu"):
            y = mg.sum(mg.sin(k))
        grads = mg.gradients(y, [h, k]) + mg.gradients(y, [h, h])
    one = np.array([0.5, 1.0, 2.0])
    for got in mg.Session(g, workers=workers).run(grads, {x1: one}):
        np.testing.assert_allclose(got, np.cos(2 * one + 1))


# -- 2. a compiled output that is an input is copied, whatever node the input is -----------

def test_a_compiled_output_that_is_an_inner_node_input_is_the_callers_own():
    """compile_graph(g, [h], [h, ...]) with h an inner node (fed, as Session.run feeds
    one) returned the caller's array itself as h's output: only a Placeholder input was
    copied, so ``res += 100`` changed the caller's argument. The oracle: np.shares_memory,
    and the argument's values."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="x")
        h = mg.sin(x)
        hr = mg.reshape(h, (3, 1))
        y = h * 2.0
    f = mg.compile_graph(g, [h], [h, hr, y])
    arg = np.array([1.0, 2.0, 3.0])
    out = f(arg)
    assert not any(np.shares_memory(o.numpy(), arg) for o in out)
    res = out[0]
    with mg.no_grad():
        res += 100.0
    np.testing.assert_array_equal(arg, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(out[2].numpy(), 2.0 * arg)


# -- 3. reads after assigns: the same verdicts, in linear time and memory ------------------

def _chain(links: int, read_under_control: bool = False):
    """x, then s = s + v_k.assign(v_k + x) ``links`` times: each link reads an Assign's
    value; optionally a last node reads the first variable under a control dependency on
    the chain's end (which the first Assign is upstream of)."""
    g = mg.Graph()
    with g:
        x = mg.placeholder(shape=(), name="x")
        s, first = x, None
        for k in range(links):
            v = mg.variable(float(k), name=f"v{k}")
            first = first if first is not None else v
            s = s + v.assign(v + x)
        if read_under_control:
            with mg.control_dependencies([s]):
                s = first * 1.0
    return g, x, s


def _plan_peak(links: int) -> int:
    """The peak of memory (bytes) that checking a chain's plan allocates."""
    g, x, s = _chain(links)
    plan = fifo_order(g.nodes, needed([s], {id(x)}), {id(x)})
    tracemalloc.start()
    try:
        refuse_reads_after_assigns(plan)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_checking_reads_after_assigns_on_a_chain_of_assigns_stays_linear():
    """Planning s = s + v_k.assign(v_k + x) kept, per node, a set of every Assign upstream
    of it: quadratic time and memory (64,001 nodes took 45 s to plan). The verdicts stay
    those of TF1's semantics as this library runs them (assignments land at the end): the
    chain runs (closed form: 1 + sum of (k + 1)), a read of v0 ordered after its Assign by
    a control edge is refused, and the memory of the check grows linearly (4x the chain,
    well under the 16x of a set per node)."""
    g, x, s = _chain(50)
    assert mg.Session(g).run(s, {x: 1.0}) == 1 + sum(k + 1 for k in range(50))
    g, x, s = _chain(50, read_under_control=True)
    with pytest.raises(GraphError, match="'mul' .* reads variable 'v0' under a control "
                                         "dependency on 'v0/assign'"):
        mg.Session(g).run(s, {x: 1.0})
    small, large = _plan_peak(250), _plan_peak(1000)
    assert large < 6 * max(small, 1000), (small, large)
