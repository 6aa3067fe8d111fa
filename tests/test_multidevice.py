"""Several devices: partitioning, Send/Recv, per-device executors, data and model
parallelism. Most tests run on array-api-strict's fake devices (fixture
``strict_devices``): an array of one device meeting an array of another raises there,
so a result proves that every cross-device edge went through Send/Recv."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigraph as mg
from minigraph.ops.primitive import Primitive
from minigraph.ops.shape_rules import same
from minigraph.runtime.session import NodeError

from across_devices import check_auto_place_keeps_copies

DEVICES = ["cpu", "cpu:1", "cpu:2"]
A = np.random.default_rng(3).normal(size=(4, 4)) * 0.5


def two_device_graph():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(4, 4), name="x")
        a = mg.tanh(x @ x)
        with mg.device("cpu:1"):
            b = mg.sin(x) * 2.0  # x crosses to cpu:1 once ...
            c = b + x            # ... even though two nodes there read it
        d = a + c                # c comes back to cpu
    return g, x, d


def test_partition_invariants(strict_devices):
    g, x, d = two_device_graph()
    parts = mg.partition(g)
    assert set(parts) == {"cpu", "cpu:1"}
    for name, part in parts.items():
        assert all(n.device.name == name for n in part.nodes)  # only its own nodes
    sends, recvs = parts.sends(), parts.recvs()
    assert sorted(s.key for s in sends) == sorted(r.key for r in recvs)  # one Recv per Send
    assert len({s.key for s in sends}) == len(sends)
    assert sorted(s.key for s in sends) == ["cpu:1;cpu;add", "cpu;cpu:1;x"]
    send = next(s for s in sends if s.tensor_name == "x")
    assert (send.op, send.send_device, send.recv_device) == ("Send", "cpu", "cpu:1")


def test_partitioned_run_equals_the_single_device_run(strict_devices):
    g, x, d = two_device_graph()
    value = mg.Session(g).run(d, {x: A})
    expected = np.tanh(A @ A) + np.sin(A) * 2.0 + A
    np.testing.assert_allclose(value, expected, rtol=1e-12)


def test_a_missing_send_recv_would_be_caught(strict_devices):
    """The fake devices really refuse mixed arrays: the proof above is not vacuous."""
    import array_api_strict as xps

    a = xps.asarray([1.0], device=xps.Device("CPU_DEVICE"))
    b = xps.asarray([1.0], device=xps.Device("device1"))
    with pytest.raises(ValueError, match="different devices"):
        a + b


def test_gradients_across_devices(strict_devices):
    with mg.Graph() as g:
        w = mg.placeholder(shape=(4, 4), name="w")
        x = mg.placeholder(shape=(4, 4), name="x")
        with mg.device("cpu:1"):
            h = mg.tanh(x.to("cpu:1") @ w.to("cpu:1"))
        with mg.device("cpu:2"):
            loss = (h.to("cpu:2") ** 2).sum()
        (gw,) = mg.gradients(loss, [w])
    assert gw.device.name == "cpu"  # a gradient lives with its variable
    got = mg.Session(g).run(gw, {w: A, x: A.T})
    h_ = np.tanh(A.T @ A)
    np.testing.assert_allclose(got, A.T.T @ (2 * h_ * (1 - h_ ** 2)), rtol=1e-12)


def test_trace_shows_devices_as_processes_and_transfers_as_flows(strict_devices, tmp_path):
    g, x, d = two_device_graph()
    sess = mg.Session(g)
    sess.run(d, {x: A})
    trace = sess.last_run.chrome_trace()
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names == {"cpu", "cpu:1"}
    starts = [e for e in trace["traceEvents"] if e["ph"] == "s"]
    ends = [e for e in trace["traceEvents"] if e["ph"] == "f"]
    assert sorted(e["id"] for e in starts) == sorted(e["id"] for e in ends) and len(starts) == 2
    json.dumps(trace)


def test_a_send_runs_before_the_kernels_that_became_ready_with_it():
    """Chapter 06's two branches: b's Send to cpu:1 was queued behind a's matmul on cpu,
    so cpu:1 waited a whole matmul before it could start (over MPI, two ranks gained
    1.3-1.4x instead of 1.7x)."""
    rng = np.random.default_rng(0)
    with mg.Graph() as g:
        a = mg.placeholder((64, 64), name="a")
        b = mg.placeholder((64, 64), name="b")
        left = mg.tanh(a @ a)
        with mg.device("cpu:1"):
            right = mg.tanh(b @ b)
        out = left + right
    feeds = {a: rng.normal(size=(64, 64)), b: rng.normal(size=(64, 64))}
    sess = mg.Session(g, workers=1)
    got = sess.run(out, feeds)
    np.testing.assert_allclose(got, np.tanh(feeds[a] @ feeds[a]) + np.tanh(feeds[b] @ feeds[b]),
                               rtol=1e-12)
    on_cpu = [e for e in sorted(sess.last_run.events, key=lambda e: e["ts"])
              if e["pid"] == "cpu"]
    order = [e["op"] for e in on_cpu]
    assert order.index("Send") < order.index("matmul"), order


def test_partition_dot_clusters_devices_and_dashes_transfers():
    g, _, _ = two_device_graph()
    dot = mg.partition(g).to_dot()
    assert dot.count("subgraph cluster_") == 2 and 'label="cpu:1"' in dot
    assert dot.count("style=dashed") == 2


@st.composite
def placed_dags(draw):
    n = draw(st.integers(1, 15))
    return [(draw(st.sampled_from(["add", "mul", "tanh", "matmul"])),
             draw(st.integers(0, k)), draw(st.integers(0, k)),
             draw(st.sampled_from(DEVICES))) for k in range(n)]


def build_placed(dag, fail_at=None):
    with mg.Graph() as g:
        x = mg.placeholder(shape=(4, 4), name="x")
        nodes = [x]
        for k, (op, i, j, dev) in enumerate(dag):
            with mg.device(dev):
                a, b = nodes[i], nodes[j]
                if k == fail_at:
                    nodes.append(g.add(_failing(), (a,), {}))
                elif op == "tanh":
                    nodes.append(mg.tanh(a))
                elif op == "matmul":
                    nodes.append((a @ b) * 0.25)
                else:
                    nodes.append(a + b if op == "add" else a * b)
    return g, x, nodes


def _failing():
    def impl(xp, a):
        raise RuntimeError("injected failure")
    return Primitive("fail", impl, same, vjp=[None])


@settings(max_examples=25)
@given(placed_dags(), st.sampled_from([1, 2]))
def test_random_placements_give_the_single_device_values(dag, workers):
    g, x, nodes = build_placed(dag)
    with mg.Session(g, workers=workers) as sess:
        got = sess.run(nodes[-1], {x: A})
    values = [A]
    for op, i, j, _ in dag:
        a, b = values[i], values[j]
        values.append({"tanh": lambda: np.tanh(a), "matmul": lambda: (a @ b) * 0.25,
                       "add": lambda: a + b, "mul": lambda: a * b}[op]())
    np.testing.assert_allclose(got, values[-1], rtol=1e-12)


@settings(max_examples=15)
@given(placed_dags(), st.data())
def test_no_deadlock_when_a_kernel_fails_anywhere(dag, data):
    fail_at = data.draw(st.integers(0, len(dag) - 1))
    g, x, nodes = build_placed(dag, fail_at)
    fetch = nodes[1:]  # everything, so the failing node is needed
    for workers in (1, 2):
        with mg.Session(g, workers=workers) as sess:
            with pytest.raises(NodeError, match="injected failure"):
                sess.run(fetch, {x: A})


# -- data parallelism ---------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["ring", "naive", "parameter_server"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_allreduce_gives_every_device_the_sum(algorithm, n, strict_devices):
    rng = np.random.default_rng(n)
    parts = [rng.normal(size=(5, 3)) for _ in range(n)]
    tensors = [mg.tensor(p, device=d) for p, d in zip(parts, DEVICES)]
    out, stats = mg.parallel.allreduce_with_stats(tensors, algorithm)
    for t, o in zip(tensors, out):
        assert o.device is t.device
        np.testing.assert_allclose(o.numpy(), sum(parts), rtol=1e-12)


@pytest.mark.parametrize("algorithm", ["ring", "naive", "parameter_server"])
@pytest.mark.parametrize("devices", [["cpu"], ["cpu", "cpu"], ["cpu:1", "cpu:2", "cpu:1"]])
def test_allreduce_hands_every_device_a_tensor_of_its_own(algorithm, devices):
    """With one device there is nothing to add, and the caller's own tensor came back;
    with two replicas on one device, "naive" handed both the same tensor (a send to the
    same device is no copy). A write into one result then changed the input or the
    other result. Every result is a buffer of its own, as MPI's Allreduce writes one."""
    tensors = [mg.tensor(np.full(4, float(k + 1)), device=d) for k, d in enumerate(devices)]
    out = mg.parallel.allreduce(tensors, algorithm)
    total = sum(range(1, len(devices) + 1))
    with mg.no_grad():
        out[0] -= total  # in place, in the first result only
    assert [t.tolist() for t in tensors] == [[k + 1.0] * 4 for k in range(len(devices))]
    assert out[0].tolist() == [0.0] * 4
    assert all(o.tolist() == [float(total)] * 4 for o in out[1:])


@pytest.mark.parametrize("algorithm", ["ring", "naive", "parameter_server"])
def test_allreduce_refuses_replicas_of_different_shapes_or_dtypes(algorithm):
    """A float32 replica beside a float64 one came back float64, its dtype changed by the
    sum; torch.distributed's all_reduce refuses mixed dtypes, and so does this one."""
    mixed = [mg.tensor(np.ones(3, np.float32), device=DEVICES[0]),
             mg.tensor(np.ones(3), device=DEVICES[1])]
    with pytest.raises(mg.errors.DTypeError,
                       match=r"allreduce: every device must give the same dtype, .*"
                             r"\['float32', 'float64'\]"):
        mg.parallel.allreduce(mixed, algorithm)
    with pytest.raises(ValueError, match="same shape"):
        mg.parallel.allreduce([mg.tensor(np.ones(3)), mg.tensor(np.ones(4))], algorithm)


def test_ring_allreduce_moves_less_through_the_busiest_device():
    tensors = [mg.tensor(np.ones(3000), device=d) for d in DEVICES]
    _, ring = mg.parallel.allreduce_with_stats(tensors, "ring")
    _, naive = mg.parallel.allreduce_with_stats(tensors, "naive")
    size, n = 3000 * 8, 3
    assert ring.bytes_max_device == 2 * (n - 1) * size // n  # 2 (n-1)/n S per device
    assert naive.bytes_max_device == (n - 1) * size          # the root sends the sum n-1 times
    assert ring.bytes_total == naive.bytes_total == 2 * (n - 1) * size
    _, server = mg.parallel.allreduce_with_stats(tensors, "parameter_server")
    assert server.bytes_sent == {d: 2 * (n - 1) * size // n for d in DEVICES}  # as the ring's
    assert server.steps == 2 and ring.steps == 2 * (n - 1)


def test_scatter_and_gather():
    x = np.arange(14.0).reshape(7, 2)
    parts = mg.parallel.scatter(x, DEVICES)
    assert [p.device.name for p in parts] == DEVICES and [p.shape[0] for p in parts] == [2, 2, 3]
    np.testing.assert_array_equal(mg.parallel.gather(parts, "cpu").numpy(), x)


def test_data_parallel_step_equals_the_single_device_step(strict_devices):
    rng = np.random.default_rng(5)
    x, w1, w2 = rng.normal(size=(12, 6)), rng.normal(size=(6, 8)), rng.normal(size=(8, 3))
    labels = rng.integers(0, 3, size=12)

    def loss(params, xb, yb):
        w1_, w2_ = params
        return mg.cross_entropy(mg.tanh(xb @ w1_) @ w2_, yb)

    params = [mg.tensor(w1), mg.tensor(w2)]
    single = mg.grad(lambda a, b: loss([a, b], mg.tensor(x), mg.tensor(labels)), (0, 1))(*params)
    per_device = mg.parallel.data_parallel_grads(loss, params, x, labels, DEVICES)
    for k, grads in enumerate(per_device):
        for g, s in zip(grads, single):
            assert g.device.name == DEVICES[k]
            np.testing.assert_allclose(g.numpy(), s.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rows", [1, 2])
def test_a_batch_smaller_than_the_devices_gives_the_whole_batch_gradient(rows):
    """scatter gives a device no rows; its mean loss would be 0/0 (NumPy warned twice per
    step) and its share is nothing: the gradient is still the whole batch's (PyTorch's)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(rows)
    x, w = rng.normal(size=(rows, 4)), rng.normal(size=(4, 3))
    labels = rng.integers(0, 3, size=rows)

    def loss(params, xb, yb):
        return mg.cross_entropy(mg.tanh(xb @ params[0]), yb)

    wt = torch.tensor(w, requires_grad=True)
    torch.nn.functional.cross_entropy(torch.tanh(torch.tensor(x) @ wt),
                                      torch.tensor(labels)).backward()
    assert len(DEVICES) > rows
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        per_device = mg.parallel.data_parallel_grads(loss, [mg.tensor(w)], x, labels, DEVICES)
    for k, (g,) in enumerate(per_device):
        assert g.device.name == DEVICES[k]
        np.testing.assert_allclose(g.numpy(), wt.grad.numpy(), rtol=1e-12)


def test_data_parallel_gradients_of_an_empty_batch_are_refused():
    def loss(params, xb, yb):
        return mg.cross_entropy(xb @ params[0], yb)

    w = mg.tensor(np.ones((4, 3)))
    empty_x, empty_y = np.zeros((0, 4)), np.zeros(0, dtype=np.int64)
    with pytest.raises(ValueError, match=r"data_parallel_grads: the batch is empty.*\(0, 4\)"):
        mg.parallel.data_parallel_grads(loss, [w], empty_x, empty_y, DEVICES)
    with pytest.raises(ValueError, match="data_parallel_grads_across_ranks: the batch is empty"):
        mg.parallel.data_parallel_grads_across_ranks(loss, [w], mg.tensor(empty_x),
                                                     mg.tensor(empty_y))


# -- model parallelism ---------------------------------------------------------------------------

def test_parallel_cross_entropy_equals_the_unsharded_loss_and_gradients(strict_devices):
    rng = np.random.default_rng(7)
    layer = mg.parallel.ShardedLinear(6, 11, DEVICES, seed=1)
    x = mg.tensor(rng.normal(size=(5, 6)))
    labels = mg.tensor(np.array([0, 4, 10, 7, 3]))
    loss = mg.parallel.parallel_cross_entropy(layer(x), labels)
    loss.backward()
    w, b = mg.tensor(layer.full_weight()), mg.tensor(layer.full_bias())
    ref_loss, (gw, gb) = mg.value_and_grad(
        lambda w_, b_: mg.cross_entropy(x @ w_ + b_, labels), (0, 1))(w, b)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    got_w = np.concatenate([p.grad.numpy() for p in layer.weights], axis=1)
    np.testing.assert_allclose(got_w, gw.numpy(), rtol=1e-10, atol=1e-12)
    for p, d in zip(layer.weights, DEVICES):
        assert p.grad.device.name == d  # p - y, computed where the shard lives
    # the logits' gradient on each shard is (softmax - onehot) / N, the closed form
    shards = layer(x)
    logits = x.numpy() @ layer.full_weight() + layer.full_bias()
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    expected = (p - np.eye(11)[labels.numpy()]) / 5
    g_shards = mg.grad(lambda *ss: mg.parallel.parallel_cross_entropy(list(ss), labels),
                       argnums=(0, 1, 2))(*[s.detach() for s in shards])
    np.testing.assert_allclose(np.concatenate([g.numpy() for g in g_shards], axis=1), expected,
                               rtol=1e-10, atol=1e-12)


def test_sharded_memory_is_balanced_where_concatenating_is_not():
    n, c = 64, 3000
    layer = mg.parallel.ShardedLinear(32, c, DEVICES, seed=2)
    x = mg.tensor(np.random.default_rng(0).normal(size=(n, 32)))
    labels = mg.tensor(np.random.default_rng(1).integers(0, c, size=n))

    def peaks(fn):
        devs = [mg.device(d) for d in DEVICES]
        base = [d.live_bytes for d in devs]
        for d in devs:
            d.reset_peak()
        fn().backward()
        return [d.peak_bytes - b for d, b in zip(devs, base)]

    sharded = peaks(lambda: mg.parallel.parallel_cross_entropy(layer(x), labels))
    naive = peaks(lambda: mg.cross_entropy(
        mg.concatenate([s.to("cpu") for s in layer(x)], axis=1), labels))
    assert max(sharded) / min(sharded) <= 1.2
    assert max(naive) / max(min(naive), 1) > 2  # the concatenating version loads one device


def test_auto_place_spreads_independent_branches_and_keeps_chains_together():
    with mg.Graph() as g:
        x = mg.placeholder(shape=(64, 64), name="x")
        left = x
        right = x
        for _ in range(3):
            left = mg.tanh(left @ left)
            right = mg.sin(right @ right)
        out = left + right
    placed = mg.auto_place(g, ["cpu", "cpu:1"])
    devices = {n.name: n.device.name for n in placed.graph.nodes}
    lefts = [n.name for n in g.nodes if n.op == "tanh"]
    rights = [n.name for n in g.nodes if n.op == "sin"]
    assert len({devices[n] for n in lefts}) == 1 and len({devices[n] for n in rights}) == 1
    assert devices[lefts[0]] != devices[rights[0]]  # two branches, two devices
    feed = np.eye(64) * 0.1
    np.testing.assert_allclose(mg.Session(placed.graph).run(placed[out], {placed[x]: feed}),
                               mg.Session(g).run(out, {x: feed}), rtol=1e-12)


@pytest.mark.parametrize("devices", [["cpu", "cpu:2"], ["cpu", "cpu:1", "cpu:2"]])
def test_auto_place_leaves_explicit_copies_where_they_copy_to(devices, strict_devices):
    """x.to("cpu:1") was moved like any node: the copy then said cpu while its kernel
    (to_device, device=cpu:1) put the value on cpu:1, so the partitioner sent nothing
    where a node read it beside a cpu value, and the kernel met arrays of two devices
    (array-api-strict's fake devices refuse that; NumPy devices hid it, a GPU would not).
    Every copy must sit on its destination, and the run must equal NumPy's."""
    check_auto_place_keeps_copies(devices, "cpu:1")  # (test_gpu.py: cpu and cuda:0)


def test_control_dependencies_order_nodes_even_across_devices(strict_devices):
    with mg.Graph() as g:
        w = mg.variable(np.array([1.0, 2.0]), name="w")
        step = w.assign(w * 10.0)
        with mg.device("cpu:1"):
            y = mg.placeholder(shape=(2,), name="y")
            with mg.control_dependencies([step]):
                after = y * 2.0  # reads nothing of step, but runs after it
    assert after.control_inputs == (step,)
    assert "^w/assign" in str(g)
    parts = mg.partition(g)
    control = [s for s in parts.sends() if s.params["control"]]
    assert len(control) == 1 and control[0].shape == (0,)  # an empty tensor crosses
    for workers in (1, 2):
        sess = mg.Session(g, workers=workers)
        sess.run(after, {y: np.ones(2)})
        order = sess.last_run.order
        assert order.index("w/assign") < order.index("mul_1")


def test_a_session_takes_an_array_of_its_device_library_as_it_is(strict_devices):
    """A feed already on the node's device (a CuPy array for cuda:0; here an
    array-api-strict array on device1, which refuses to become a NumPy array) is not
    sent through the host."""
    import array_api_strict as xps

    with mg.Graph() as g, mg.device("cpu:1"):
        x = mg.placeholder((2,), name="x")
        y = x * 2.0
    value = xps.asarray([1.0, 2.0], device=xps.Device("device1"))
    np.testing.assert_array_equal(mg.Session(g).run(y, {x: value}), [2.0, 4.0])
    with pytest.raises(mg.errors.ShapeError, match="feed for 'x'.*shape \\(3,\\)"):
        mg.Session(g).run(y, {x: xps.asarray([1.0, 2.0, 3.0], device=xps.Device("device1"))})


def test_data_parallel_refuses_x_and_y_of_different_batch_sizes():
    """x (6, 2) and y (3, 1) were split separately: each device paired two rows of x with
    one of y, the loss broadcast them, and a gradient came back where one device's
    mg.grad (and PyTorch) refuses the shapes."""
    from minigraph.parallel import data_parallel_grads

    mg.set_virtual_cpus(3)
    w = mg.tensor(np.ones((2, 1)))

    def loss(params, x, y):
        return mg.mean((x @ params[0] - y) ** 2)
    with pytest.raises(mg.errors.ShapeError):
        mg.grad(lambda w: loss([w], mg.tensor(np.ones((6, 2))), mg.tensor(np.ones((3, 1)))))(w)
    with pytest.raises(mg.errors.ShapeError, match="x has shape \\(6, 2\\) and y \\(3, 1\\)"):
        data_parallel_grads(loss, [w], np.ones((6, 2)), np.ones((3, 1)),
                            ["cpu", "cpu:1", "cpu:2"])


def test_sharded_linear_needs_a_class_per_shard():
    """Two classes over three devices made an empty shard, and parallel_cross_entropy
    failed inside max of a (6, 0) array; one device gives the loss."""
    from minigraph.parallel import ShardedLinear

    mg.set_virtual_cpus(3)
    with pytest.raises(ValueError, match="2 output classes cannot be split over 3 devices"):
        ShardedLinear(4, 2, ["cpu", "cpu:1", "cpu:2"])
