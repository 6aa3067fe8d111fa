"""Graded tests of chapter 06: each exercise against minigraph's own implementation.

Random graphs (fixed seeds) are built with minigraph, with nodes placed on the virtual
CPU devices ``cpu``, ``cpu:1``, ``cpu:2`` by ``mg.device`` scopes, and handed to the
exercises as plain data. Nothing here runs threads: the rendezvous is driven by a fixed
script of sends, receives and aborts.
"""

import math

import numpy as np
import pytest

import minigraph as mg
from minigraph.grading import exercises_fixture, first_difference
from minigraph.graph.topo import fifo_order
from minigraph.runtime.placement import BANDWIDTH, estimate
from minigraph.runtime.rendezvous import Rendezvous, make_key

exercises = exercises_fixture()

DEVICES = ["cpu", "cpu:1", "cpu:2"]
SEEDS = range(15)


def random_placed_graph(seed, size=10):
    """A random DAG of elementwise ops on (2, 2) values, each node on a random device."""
    rng = np.random.default_rng(seed)
    with mg.Graph() as g:
        nodes = []
        for k in range(int(rng.integers(1, 4))):
            with mg.device(str(rng.choice(DEVICES))):
                nodes.append(mg.placeholder(shape=(2, 2), name=f"x{k}"))
        for _ in range(size):
            recent = min(int(rng.geometric(0.4)) - 1, len(nodes) - 1)
            a = nodes[len(nodes) - 1 - recent]
            b = nodes[int(rng.integers(len(nodes)))]
            with mg.device(str(rng.choice(DEVICES))):
                op = rng.choice(["add", "mul", "square", "sin", "matmul"])
                if op == "add":
                    nodes.append(a + b)
                elif op == "mul":
                    nodes.append(a * b)
                elif op == "square":
                    nodes.append(a * a)  # one input read twice: it crosses once
                elif op == "sin":
                    nodes.append(mg.sin(a))
                else:
                    nodes.append(a @ b)
    return g


def as_data(g):
    order = [n.name for n in fifo_order(g.nodes, {id(n) for n in g.nodes})]
    inputs = {n.name: [i.name for i in n.inputs] for n in g.nodes}
    device = {n.name: n.device.name for n in g.nodes}
    return order, inputs, device


def entries(parts):
    """mg.partition's result in the exercise's form: names, ("Send", key), ("Recv", key)."""
    return {dev: [(n.op, n.key) if n.op in ("Send", "Recv") else n.name for n in part.nodes]
            for dev, part in parts.items()}


def two_device_graph():
    """x crosses to cpu:1 once although two nodes there read it; c comes back to cpu."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(4, 4), name="x")
        a = mg.tanh(x @ x)
        with mg.device("cpu:1"):
            b = mg.sin(x) * 2.0
            c = b + x
        with mg.device("cpu"):
            a + c
    return g


# -- 1. the transfers and their keys --------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.runtime.rendezvous.make_key", "minigraph.runtime.partition.partition", why="build the key and find the transfers yourself")
def test_make_key_and_transfers(exercises):
    for args in [("cpu", "cpu:1", "x"), ("cuda:0", "cpu", "layer1/w")]:
        got = exercises.make_key(*args)
        assert got == make_key(*args), f"make_key{args} gave {got!r}, expected {make_key(*args)!r}"
    for g in [two_device_graph()] + [random_placed_graph(seed) for seed in SEEDS]:
        _, inputs, device = as_data(g)
        expected = sorted(s.key for s in mg.partition(g).sends())
        got = exercises.transfers(inputs, device)
        assert got == expected, f"{first_difference(got, expected, 'transfers')}; graph:\n{g}"


# -- 2. partitioning with Send/Recv ---------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.runtime.partition.partition", "minigraph.runtime.session.Session", why="cut the graph yourself")
def test_partition_of_a_two_device_graph(exercises):
    g = two_device_graph()
    got = exercises.partition(*as_data(g))
    expected = entries(mg.partition(g))
    assert got == expected, f"graph:\n{g}\npartition {got}, expected {expected}"


@pytest.mark.points(4)
@pytest.mark.forbid("minigraph.runtime.partition.partition", "minigraph.runtime.session.Session", why="cut the graph yourself")
def test_partition_matches_mg_partition(exercises):
    for seed in SEEDS:
        g = random_placed_graph(seed)
        parts = mg.partition(g)
        got = exercises.partition(*as_data(g))
        expected = entries(parts)
        assert got == expected, \
            f"graph of seed {seed}: {first_difference(got, expected, 'partition')}\n{g}"
        # the invariants: one Send/Recv pair per key, only a device's own nodes
        sends = [e[1] for es in got.values() for e in es if isinstance(e, tuple) and e[0] == "Send"]
        recvs = [e[1] for es in got.values() for e in es if isinstance(e, tuple) and e[0] == "Recv"]
        assert sorted(sends) == sorted(recvs) and len(set(sends)) == len(sends), (
            f"graph of seed {seed}: Send keys {sorted(sends)}, Recv keys {sorted(recvs)}; "
            f"expected one Send and one Recv per key")


# -- 3. greedy placement --------------------------------------------------------------------

def random_costly_graph(seed, size=10):
    """Square float64 values of one random size, inputs on random devices: matmuls are
    costly, transfers of large values too, so the placer has real choices to make."""
    rng = np.random.default_rng(seed)
    n = int(rng.choice([8, 64, 160]))
    with mg.Graph() as g:
        nodes = []
        for k in range(int(rng.integers(1, 4))):
            with mg.device(str(rng.choice(DEVICES))):
                nodes.append(mg.placeholder(shape=(n, n), name=f"x{k}"))
        for _ in range(size):
            a = nodes[int(rng.integers(len(nodes)))]
            b = nodes[int(rng.integers(len(nodes)))]
            op = rng.choice(["add", "tanh", "matmul", "matmul"])
            nodes.append(a + b if op == "add" else mg.tanh(a) if op == "tanh" else a @ b)
    return g


@pytest.mark.points(3)
@pytest.mark.forbid("minigraph.runtime.placement.auto_place", "minigraph.runtime.placement.estimate", why="place the nodes greedily yourself")
def test_greedy_place_matches_auto_place(exercises):
    for seed in SEEDS:
        g = random_costly_graph(seed)
        devices = DEVICES[: 2 + seed % 2]
        placed = mg.auto_place(g, devices).graph
        expected = {n.name: n.device.name for n in placed.nodes}
        order = [n.name for n in g.nodes]
        inputs = {n.name: [i.name for i in n.inputs] for n in g.nodes}
        fixed = {n.name: n.device.name for n in g.nodes if n.prim is None}
        seconds = {n.name: estimate(n) for n in g.nodes if n.prim is not None}
        nbytes = {n.name: 8 * math.prod(n.shape) for n in g.nodes}  # float64
        got = exercises.greedy_place(order, inputs, fixed, seconds, nbytes, list(devices),
                                     BANDWIDTH)
        assert got == expected, (f"graph of seed {seed} on {devices}: "
                                 f"{first_difference(got, expected, 'placed')}\n{g}")


# -- 4. the rendezvous ----------------------------------------------------------------------

def script(seed):
    """A random sequence of sends, receives and aborts on a few keys."""
    rng = np.random.default_rng(seed)
    keys = [make_key(a, b, t) for a, b, t in
            [("cpu", "cpu:1", "x"), ("cpu:1", "cpu", "h"), ("cpu", "cpu:2", "x"),
             ("cpu:2", "cpu:1", "y")]]
    steps = []
    for k in range(int(rng.integers(4, 14))):
        kind = rng.choice(["send", "recv", "recv", "abort"], p=[0.4, 0.25, 0.25, 0.1])
        key = keys[int(rng.integers(len(keys)))]
        if kind == "send":
            steps.append(("send", key, float(k)))
        elif kind == "recv":
            steps.append(("recv", key, f"recv{k}"))
        else:
            steps.append(("abort", None, f"error{k}"))
    return steps


def play(rendezvous, steps):
    """Run the script; per step, the callback calls it caused (or the error): in their
    order for a send (the waiting Recvs are served in the order they asked), sorted for
    an abort (whose order the exercise leaves open)."""
    log = []
    for kind, key, arg in steps:
        calls = []
        try:
            if kind == "send":
                rendezvous.send(key, arg)
            elif kind == "recv":
                rendezvous.recv(key, lambda value, error, who=arg:
                                calls.append((who, value, None if error is None else str(error))))
            else:
                rendezvous.abort(RuntimeError(arg))
        except RuntimeError as exc:
            calls.append(("raised", type(exc).__name__))
        log.append((kind, key, arg, sorted(calls, key=repr) if kind == "abort" else calls))
    return log


@pytest.mark.points(3)
@pytest.mark.forbid("minigraph.runtime.rendezvous.Rendezvous", "minigraph.runtime.mpi_run.MPIRendezvous", why="write the rendezvous yourself")
def test_rendezvous_behaves_like_minigraphs(exercises):
    for seed in range(40):
        steps = script(seed)
        expected = play(Rendezvous(), steps)
        got = play(exercises.Rendezvous(), steps)
        for want, have in zip(expected, got):
            assert have == want, (f"script {steps}: at step {want[:3]}, the calls were "
                                  f"{have[3]}, expected {want[3]}")
