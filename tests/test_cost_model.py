"""Bytes that move are counted, and one cost model predicts them (chapters 07 and 08).

The oracles are closed forms from the shapes (a value of shape s and dtype d that crosses
once moves prod(s) * itemsize(d) bytes; a ring allreduce sends 2 (n - 1) S / n per device
when n divides the tensor) and NumPy. The counters are ``sess.last_run.bytes_moved``
(what each Send copied, in a graph run across virtual devices) and ``CommStats.moved``
(what each copy of an eager allreduce held); the model is ``mg.parallel.cost_model``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import minigraph as mg
from across_devices import check_adjoints_come_back
from minigraph.parallel import cost_model as cm
from minigraph.parallel import pipeline as pp

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def eight_devices():
    mg.set_virtual_cpus(7)  # cpu, cpu:1 ... cpu:7
    yield


def names(n):
    return ["cpu"] + [f"cpu:{k}" for k in range(1, n)]


# -- a Session run counts what its Send/Recv pairs copy ------------------------------------

def test_a_run_across_two_devices_counts_every_crossing_value():
    rng = np.random.default_rng(0)
    X, W = rng.normal(size=(50, 3)), rng.normal(size=(3, 7)).astype("float32")
    with mg.Graph() as g:
        with mg.device("cpu"):
            x = mg.placeholder((50, 3), name="x")
            a = mg.sin(x)                        # (50, 3) float64, read twice on cpu:1
        with mg.device("cpu:1"):
            w = mg.placeholder((3, 7), dtype="float32", name="w")
            b = a.to("cpu:1") * 2.0
            c = mg.cos(a.to("cpu:1"))
            h = mg.matmul(mg.astype(b + c, "float32"), w)   # (50, 7) float32
        with mg.device("cpu"):
            z = mg.sum(h.to("cpu"))
    for workers in (1, 2):
        sess = mg.Session(g, workers=workers)
        got = sess.run(z, {x: X, w: W})
        want = ((2 * np.sin(X) + np.cos(np.sin(X))).astype("float32") @ W).sum()
        np.testing.assert_allclose(got, want, rtol=1e-5)
        # a crosses once (two readers, one Send), h comes back once
        assert sess.last_run.bytes_moved == {("cpu", "cpu:1"): X.nbytes,
                                             ("cpu:1", "cpu"): 50 * 7 * 4}
        assert sess.last_run.bytes_sent == {"cpu": X.nbytes, "cpu:1": 50 * 7 * 4}
        assert sess.last_run.bytes_received == {"cpu:1": X.nbytes, "cpu": 50 * 7 * 4}


def test_gradients_across_devices_count_the_adjoints_coming_back():
    check_adjoints_come_back("cpu:1")  # (test_gpu.py runs it with cuda:0)


def test_a_run_on_one_device_moves_nothing():
    with mg.Graph() as g:
        x = mg.placeholder((4,), name="x")
        y = mg.sum(x.to("cpu") * 2.0)
    sess = mg.Session(g)
    assert sess.run(y, {x: np.ones(4)}) == 8.0
    assert sess.last_run.bytes_moved == {} and sess.last_run.bytes_sent == {}


# -- the allreduce: counters against the model and the closed form --------------------------

def graph_allreduce(values, algorithm):
    """The allreduce built as a graph over len(values) devices and run: outputs, counters."""
    devs = names(len(values))
    with mg.Graph() as g:
        xs = []
        for k, d in enumerate(devs):
            with mg.device(d):
                xs.append(mg.placeholder(values[k].shape, name=f"g{k}"))
        outs, predicted = mg.parallel.allreduce_with_stats(xs, algorithm)
    sess = mg.Session(g)
    results = sess.run(outs, dict(zip(xs, values)))
    return results, sess.last_run, predicted


@pytest.mark.parametrize("algorithm", cm.ALGORITHMS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("elements", [0, 1, 5, 24, 101])
def test_allreduce_counters_agree_with_the_cost_model(algorithm, n, elements):
    rng = np.random.default_rng(elements + 10 * n)
    values = [rng.normal(size=elements) for _ in range(n)]
    devs = names(n)
    eager, stats = mg.parallel.allreduce_with_stats(
        [mg.tensor(v, device=d) for v, d in zip(values, devs)], algorithm)
    results, run, predicted = graph_allreduce(values, algorithm)
    for out in [e.numpy() for e in eager] + list(results):
        np.testing.assert_allclose(out, np.sum(values, axis=0), rtol=1e-12, atol=1e-12)
    model = cm.bytes_sent(algorithm, elements, n)
    assert [run.bytes_sent.get(d, 0) for d in devs] == model      # counted by the Sends
    assert [stats.bytes_sent.get(d, 0) for d in devs] == model    # counted by the copies
    assert run.bytes_moved == stats.moved == predicted.moved
    S = elements * 8
    assert stats.bytes_total == sum(model) == 2 * (n - 1) * S     # the same total, always
    assert stats.bytes_max_device == max(model)
    assert stats.steps == cm.steps(algorithm, n)
    if n > 1 and elements % n == 0:  # the closed forms of chapter 07
        if algorithm == "naive":
            assert model == [(n - 1) * S] + [S] * (n - 1)
        else:
            assert model == [2 * (n - 1) * S // n] * n


def test_the_ring_sends_to_its_right_neighbour_only():
    values = [np.full(12, float(k)) for k in range(4)]
    _, run, _ = graph_allreduce(values, "ring")
    devs = names(4)
    assert set(run.bytes_moved) == {(devs[i], devs[(i + 1) % 4]) for i in range(4)}
    _, run, _ = graph_allreduce(values, "parameter_server")
    assert len(run.bytes_moved) == 4 * 3   # every device to every other


def test_float32_and_uneven_chunks_are_counted_as_they_are():
    rng = np.random.default_rng(3)
    values = [rng.normal(size=(3, 5)).astype("float32") for _ in range(4)]  # 15 = 3+4+4+4
    devs = names(4)
    _, stats = mg.parallel.allreduce_with_stats(
        [mg.tensor(v, device=d) for v, d in zip(values, devs)], "ring")
    assert [stats.bytes_sent[d] for d in devs] == cm.bytes_sent("ring", 15, 4, itemsize=4)
    chunks = cm.chunks(15, 4)
    assert chunks == [3, 4, 4, 4]
    # device i sends every chunk but c[i+1] in the reduce-scatter and but c[i+2] after
    assert [stats.bytes_sent[d] for d in devs] == [
        4 * (2 * 15 - chunks[(i + 1) % 4] - chunks[(i + 2) % 4]) for i in range(4)]


# -- chapter 08's partitioner charges what the counters count -------------------------------

@pytest.mark.parametrize("m", [2, 3, 4, 8])
def test_sync_factors_are_the_counted_bytes_per_worker(m):
    w = 24 * m  # elements: every chunk the same
    values = [np.ones(w) for _ in range(m)]
    for sync, algorithm in (("allreduce", "ring"), ("parameter_server", "parameter_server")):
        _, run, _ = graph_allreduce(values, algorithm)
        busiest = max(run.bytes_sent.values())
        assert busiest == pytest.approx(pp.SYNC_FACTORS[sync](m) * w * 8)
        assert pp.SYNC_FACTORS[sync](m) == pytest.approx(2 * (m - 1) / m)
        assert cm.sync_time(algorithm, m, w * 8, 1e9) == pytest.approx(busiest / 1e9)


@pytest.mark.parametrize("m", [2, 4, 8])
def test_what_the_pipedream_text_counts(m):
    """The text's all_reduce figure, (m - 1) w / m, is half of what a ring worker sends;
    its parameter-server figure, 4 (m - 1) w / m, is what a sharded server's worker sends
    and receives together."""
    w = 8 * m
    values = [np.ones(w) for _ in range(m)]
    _, ring, _ = graph_allreduce(values, "ring")
    _, server, _ = graph_allreduce(values, "parameter_server")
    S = w * 8
    for d in names(m):
        assert ring.bytes_sent[d] == 2 * cm.PIPEDREAM_TEXT["allreduce"](m) * S
        assert server.bytes_sent[d] + server.bytes_received[d] == \
            cm.PIPEDREAM_TEXT["parameter_server"](m) * S


def test_the_partitioner_uses_the_model():
    """A stage of w weight bytes on m workers costs max(compute, 2 (m-1)/m w / B) / m."""
    layer = pp.LayerCost("node0", "L", 0.001, 0.002, 10, 4_000_000)
    for m in (2, 4):
        plan = pp.partition_pipedream(pp.Profile([layer]), workers=m, bandwidth=1e9)
        sync = 2 * (m - 1) / m * 4_000_000 / 1e9
        assert plan.stage_times[0] == pytest.approx(max(0.003, sync) / plan.replicas[0])


def test_cost_model_rejects_what_it_does_not_know():
    with pytest.raises(ValueError, match="algorithm"):
        cm.bytes_sent("gossip", 10, 2)
    with pytest.raises(ValueError, match="devices"):
        cm.sync_factor("ring", 0)
    with pytest.raises(ValueError, match="bandwidth"):
        cm.sync_time("ring", 2, 10, 0)
    with pytest.raises(ValueError, match="parameter_server"):
        mg.parallel.allreduce([mg.tensor([1.0])], "gossip")


# -- model parallelism: what the sharded loss and the concatenation move ----------------------

def sharded_classifier_run(concatenate, N=16, F=6, C=30, seed=0):
    devs = names(3)
    layer = mg.parallel.ShardedLinear(F, C, devs, seed=seed)
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(N, F)), rng.integers(0, C, size=N)
    with mg.Graph() as g:
        with mg.device("cpu"):
            x = mg.placeholder((N, F), name="x")
            labels = mg.placeholder((N,), dtype="int64", name="labels")
        ws, shards = [], []
        for d, w in zip(devs, layer.weights):
            with mg.device(d):
                ws.append(mg.placeholder(w.shape, name="w" + d.replace(":", "")))
                shards.append(mg.matmul(x.to(d), ws[-1]))
        if concatenate:
            with mg.device("cpu"):
                loss = mg.cross_entropy(mg.concatenate([s.to("cpu") for s in shards], axis=1),
                                        labels)
        else:
            loss = mg.parallel.parallel_cross_entropy(shards, labels)
        grads = mg.gradients(loss, ws)
    sess = mg.Session(g)
    values = sess.run([loss] + grads, {x: X, labels: Y,
                                       **{p: w.numpy() for p, w in zip(ws, layer.weights)}})
    return values, sess.last_run, X, Y, layer.full_weight(), [w.shape[1] for w in layer.weights]


@pytest.mark.parametrize("concatenate", [False, True])
def test_sharded_loss_moves_vectors_the_concatenation_moves_logits(concatenate):
    N, F = 16, 6
    values, run, X, Y, W, cols = sharded_classifier_run(concatenate, N, F)
    z = X @ W
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(values[0], -np.log(p[np.arange(N), Y]).mean(), rtol=1e-12)
    grad_w = np.concatenate(values[1:], axis=1)
    np.testing.assert_allclose(grad_w, X.T @ (p - np.eye(W.shape[1])[Y]) / N, atol=1e-12)
    for d, c in zip(names(3)[1:], cols[1:]):
        out, back = run.bytes_moved[("cpu", d)], run.bytes_moved[(d, "cpu")]
        out -= X.nbytes  # both versions copy the features to every device
        if concatenate:  # the logits come to cpu, their gradient goes back
            assert (out, back) == (N * c * 8, N * c * 8)
        else:  # out: the global maximum, the labels, the gradients of the sums and of the
            # picked logits; back: the row maxima, the sums of exp, the picked logits
            assert (out, back) == (4 * N * 8, 3 * N * 8)


def test_layer_split_mlp_moves_one_activation_and_its_gradient():
    sizes, batch = [6, 10, 12, 4], 9
    mlp = mg.parallel.LayerSplitMLP(sizes, ["cpu", "cpu:1"], batch, seed=0)
    rng = np.random.default_rng(0)
    mlp.step(rng.normal(size=(batch, 6)), rng.integers(0, 4, size=batch), lr=0.1)
    # layers 0 (6->10) and 1 (10->12) on cpu, 2 on cpu:1: the 9 x 12 activation goes
    # out, its gradient comes back
    assert mlp.placement == ["cpu", "cpu", "cpu:1"]
    run = mlp.session.last_run
    assert run.bytes_moved == {("cpu", "cpu:1"): batch * 12 * 8, ("cpu:1", "cpu"): batch * 12 * 8}


# -- chapter 07 quotes the counters ----------------------------------------------------------

def quoted(text, *needles):
    flat = re.sub(r"\s+", " ", text)
    for needle in needles:
        assert re.sub(r"\s+", " ", needle) in flat, f"the text no longer says {needle!r}"


def spaced(n):
    return f"{n:,}".replace(",", " ")


def test_chapter_07_quotes_the_counted_bytes():
    readme = (ROOT / "chapters/07-data-and-model-parallelism/README.md").read_text("utf-8")
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(4, 5)) for _ in range(3)]
    _, run, _ = graph_allreduce(grads, "ring")
    _, stats = mg.parallel.allreduce_with_stats(
        [mg.tensor(v, device=d) for v, d in zip(grads, names(3))], "ring")
    assert stats.moved == run.bytes_moved
    quoted(readme, f"stats.moved # {stats.moved}", f"bytes_moved # {run.bytes_moved}",
           f"bytes_total={stats.bytes_total}, bytes_max_device={stats.bytes_max_device}")
    sent = [run.bytes_sent[d] for d in names(3)]
    assert cm.chunks(20, 3) == [6, 7, 7]
    quoted(readme, "chunks of 6, 7 and 7", f"`cpu` sends {sent[0] // 8} elements ({sent[0]} bytes)",
           f"the others {sent[1] // 8}", f"would say {2 * 2 * 20 / 3:.1f}")
    assert sent[1] == sent[2]
    # the notebook's figure at n = 8, counted
    _, run8, _ = graph_allreduce([np.ones(1 << 17) for _ in range(8)], "ring")
    quoted(readme, f"({max(run8.bytes_sent.values()) / 2**20:.2f} MiB at n = 8)")
    _, naive8, _ = graph_allreduce([np.ones(1 << 17) for _ in range(8)], "naive")
    quoted(readme, f"climbs to {naive8.bytes_sent['cpu'] / 2**20:.0f} MiB at n = 8")
    # the notebook's classifier: 32 features, 6000 classes, batch 128, three devices
    for concatenate in (False, True):
        _, run, X, _, _, cols = sharded_classifier_run(concatenate, 128, 32, 6000)
        out = run.bytes_moved[("cpu", "cpu:1")] - X.nbytes
        back = run.bytes_moved[("cpu:1", "cpu")]
        quoted(readme, f"features ({spaced(X.nbytes)} bytes)")
        if concatenate:
            assert out == back == 128 * cols[1] * 8
            quoted(readme, f"{spaced(back)} bytes of logits per other device")
        else:
            assert out + back == 7 * 128 * 8
            quoted(readme, f"{spaced(out + back)} bytes per other device, seven vectors of N = 128")
