"""Pipeline parallelism: schedules and their closed forms, the simulator, partitioning
against brute force, profiles, and a real pipelined run against the plain step."""

from __future__ import annotations

import itertools
import math

import matplotlib
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minigraph as mg
from minigraph import nn
from minigraph.parallel import pipeline as pp

matplotlib.use("Agg")

KINDS = ["gpipe", "1f1b"]
small = st.integers(1, 6)


# -- schedules ---------------------------------------------------------------------------------

@given(p=small, m=st.integers(1, 10))
def test_every_schedule_runs_each_pass_once_forward_first(p, m):
    for kind in KINDS:
        s = pp.schedule(kind, stages=p, microbatches=m)
        assert s.stages == p and s.microbatches == m
        for ops in s:
            every = [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
            assert sorted(ops) == sorted(every)
            assert [k for kind_, k in ops if kind_ == "F"] == list(range(m))
            assert [k for kind_, k in ops if kind_ == "B"] == list(range(m))
            assert all(ops.index(("F", k)) < ops.index(("B", k)) for k in range(m))


def test_gpipe_runs_all_forwards_then_all_backwards():
    s = pp.schedule("gpipe", stages=3, microbatches=4)
    for ops in s:
        assert [kind for kind, _ in ops] == ["F"] * 4 + ["B"] * 4


@given(p=small, m=st.integers(1, 10))
def test_1f1b_warms_up_then_alternates_then_drains(p, m):
    s = pp.schedule("1f1b", stages=p, microbatches=m)
    for stage, ops in enumerate(s):
        kinds = "".join(kind for kind, _ in ops)
        warmup = min(p - 1 - stage, m)
        # p-1-s warm-up forwards, and the steady phase opens with one more forward
        assert len(kinds) - len(kinds.lstrip("F")) == min(warmup + 1, m)
        steady = kinds[warmup:2 * m - warmup]
        assert steady == "FB" * (m - warmup)  # one forward, one backward
        assert kinds[2 * m - warmup:] == "B" * warmup  # the drain


def test_1f1b_for_four_stages_and_eight_microbatches_reads_as_in_the_papers():
    s = pp.schedule("1f1b", stages=4, microbatches=8)
    assert " ".join(f"{k}{i}" for k, i in s[0]) == \
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
    assert " ".join(f"{k}{i}" for k, i in s[3]) == \
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"
    assert "stage 3: F0 B0 F1" in str(s)


def test_schedule_rejects_bad_arguments():
    with pytest.raises(pp.PipelineError, match="kind"):
        pp.schedule("interleaved", stages=2, microbatches=2)
    with pytest.raises(pp.PipelineError, match="microbatches"):
        pp.schedule("1f1b", stages=2, microbatches=0)


# -- simulation against the closed forms ----------------------------------------------------------

@given(p=small, m=st.integers(1, 12), f=st.integers(1, 5), b=st.integers(1, 5))
def test_uniform_stages_match_the_closed_forms(p, m, f, b):
    for kind in KINDS:
        r = pp.simulate(pp.schedule(kind, p, m), forward=f, backward=b)
        assert r.makespan == (m + p - 1) * (f + b)
        assert r.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
        assert r.bubble_fraction == pytest.approx(pp.bubble_closed_form(p, m), abs=1e-12)
        assert r.busy == [m * (f + b)] * p


@given(p=small, m=st.integers(1, 10), f=st.integers(1, 4), b=st.integers(1, 4),
       c=st.integers(0, 3))
def test_gpipe_with_transfers_adds_two_crossings_per_cut(p, m, f, b, c):
    r = pp.simulate(pp.schedule("gpipe", p, m), forward=f, backward=b, comm=c)
    assert r.makespan == (m + p - 1) * (f + b) + 2 * (p - 1) * c


@given(p=small, m=st.integers(1, 10))
def test_activations_in_flight(p, m):
    gpipe = pp.simulate(pp.schedule("gpipe", p, m))
    ofob = pp.simulate(pp.schedule("1f1b", p, m))
    assert gpipe.peak_activations == [m] * p
    assert ofob.peak_activations == [min(p - s, m) for s in range(p)]  # stage s: at most p - s
    for r in (gpipe, ofob):
        for s in range(p):
            assert max(held for _, held in r.activation_curve(s)) == r.peak_activations[s]
            assert r.activation_curve(s)[-1][1] == 0  # all released at the flush


@given(p=small, m=st.integers(1, 8), data=st.data())
def test_timeline_respects_order_dependencies_and_transfers(p, m, data):
    costs = st.lists(st.floats(0.1, 5), min_size=p, max_size=p)
    f, b = data.draw(costs), data.draw(costs)
    c = data.draw(st.lists(st.floats(0, 2), min_size=p - 1, max_size=p - 1))
    for kind in KINDS:
        sched = pp.schedule(kind, p, m)
        r = pp.simulate(sched, forward=f, backward=b, comm=c)
        at = {(s, kind_, k): (t0, t1) for s, kind_, k, t0, t1 in r.timeline}
        for s in range(p):
            rows = sorted((t0, t1, (kind_, k))
                          for (s2, kind_, k), (t0, t1) in at.items() if s2 == s)
            assert [op for _, _, op in rows] == sched[s]  # in the schedule's order ...
            assert all(a[1] <= b_[0] + 1e-12 for a, b_ in zip(rows, rows[1:]))  # ... one at a time
        for (s, kind_, k), (t0, t1) in at.items():
            assert t1 - t0 == pytest.approx(f[s] if kind_ == "F" else b[s])
            if kind_ == "F" and s > 0:
                assert t0 >= at[(s - 1, "F", k)][1] + c[s - 1] - 1e-9
            if kind_ == "B":
                assert t0 >= at[(s, "F", k)][1] - 1e-9
                if s < p - 1:
                    assert t0 >= at[(s + 1, "B", k)][1] + c[s] - 1e-9
        idle = p * r.makespan - sum(t1 - t0 for t0, t1 in at.values())
        assert r.bubble_fraction == pytest.approx(idle / (p * r.makespan))


def test_a_deadlocking_schedule_is_reported():
    bad = [[("F", 0), ("F", 1), ("B", 1), ("B", 0)],
           [("F", 0), ("B", 0), ("F", 1), ("B", 1)]]
    assert pp.simulate(bad).makespan > 0  # out of order, but it can run
    stuck = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)],
             [("F", 1), ("F", 0), ("B", 0), ("B", 1)]]
    with pytest.raises(pp.PipelineError,
                       match="deadlock.*stage 0 waits at B0.*stage 1 waits at F1"):
        pp.simulate(stuck)


def test_simulate_checks_its_inputs():
    s = pp.schedule("1f1b", 3, 4)
    with pytest.raises(pp.PipelineError, match="forward needs 3 values"):
        pp.simulate(s, forward=[1, 1])
    with pytest.raises(pp.PipelineError, match="comm"):
        pp.simulate(s, comm=-1)
    with pytest.raises(pp.PipelineError, match="stage 1 must run"):
        pp.simulate([[("F", 0), ("B", 0)], [("F", 0)]])


def test_drawings_of_timelines_and_activations():
    sims = {k: pp.simulate(pp.schedule(k, 2, 3), 1, 2) for k in KINDS}
    fig = pp.draw_comparison(sims)
    timeline, curves = fig.axes[0], fig.axes[1]
    assert len(fig.axes) == 4
    assert len(timeline.collections) == 2 * 2 * 3  # a box per pass: 2 stages x (3 F + 3 B)
    assert [t.get_text() for t in timeline.texts].count("2") == 4
    assert len(curves.lines) == 2  # one curve per stage


# -- partitioning -----------------------------------------------------------------------------

def brute_force(costs, p):
    n, best = len(costs), math.inf
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


@given(costs=st.lists(st.integers(0, 30), min_size=1, max_size=9), data=st.data())
def test_partition_is_optimal(costs, data):
    p = data.draw(st.integers(1, len(costs)))
    stages = pp.partition(costs, p)
    assert len(stages) == p and all(stages)
    assert [i for s in stages for i in s] == list(range(len(costs)))  # contiguous, in order
    assert max(pp.stage_times(costs, stages)) == brute_force(costs, p)


def test_partition_examples_and_errors():
    assert pp.partition([1, 2, 3, 4, 5], 2) == [[0, 1, 2], [3, 4]]
    assert pp.partition([9, 1, 1, 1], 2) == [[0], [1, 2, 3]]
    with pytest.raises(pp.PipelineError, match="between 1 and the number of layers"):
        pp.partition([1, 2], 3)
    with pytest.raises(pp.PipelineError, match="layer 1"):
        pp.partition([1, -2, 3], 2)


def layer(t, a=0, w=0, name="node"):
    return pp.LayerCost(name, "Layer()", t / 2, t / 2, a, w)


def brute_force_pipedream(layers, workers, bandwidth, factor):
    n, best = len(layers), math.inf
    t = [c.forward_time + c.backward_time for c in layers]

    def stage(a, b, m):
        weights = sum(c.parameter_bytes for c in layers[a:b])
        return max(sum(t[a:b]), factor(m) * weights / bandwidth) / m

    for p in range(1, min(n, workers) + 1):
        for cuts in itertools.combinations(range(1, n), p - 1):
            bounds = (0, *cuts, n)
            comm = [2 * layers[c - 1].activation_bytes / bandwidth for c in cuts]
            for reps in itertools.product(range(1, workers + 1), repeat=p):
                if sum(reps) <= workers:
                    times = [stage(a, b, r) for (a, b), r in zip(zip(bounds, bounds[1:]), reps)]
                    best = min(best, max(times + comm))
    return best


# bytes a worker sends per byte of weights: a ring allreduce and a parameter server sharded
# over the m workers both send 2 (m - 1) w / m (chapter 07; tests/test_cost_model.py counts it)
FACTORS = {"parameter_server": lambda m: 2 * (m - 1) / m, "allreduce": lambda m: 2 * (m - 1) / m}


@given(data=st.data(), sync=st.sampled_from(sorted(FACTORS)))
def test_pipedream_partition_is_optimal(data, sync):
    entry = st.tuples(st.integers(0, 20), st.integers(0, 64), st.integers(0, 64))
    raw = data.draw(st.lists(entry, min_size=1, max_size=5))
    layers = [layer(t, a, w) for t, a, w in raw]
    workers = data.draw(st.integers(1, 4))
    bandwidth = data.draw(st.sampled_from([1.0, 4.0, 16.0]))
    plan = pp.partition_pipedream(pp.Profile(layers), workers, bandwidth, sync)
    best = brute_force_pipedream(layers, workers, bandwidth, FACTORS[sync])
    assert plan.slowest == pytest.approx(best)
    assert [i for s in plan.stages for i in s] == list(range(len(layers)))
    assert plan.workers <= workers and len(plan.replicas) == len(plan.stages)
    assert plan.slowest == pytest.approx(max(plan.stage_times + plan.comm_times))


def test_pipedream_replicates_a_slow_layer_and_avoids_a_heavy_cut():
    plan = pp.partition_pipedream([layer(8.0)], workers=4, bandwidth=1e9)
    assert (plan.stages, plan.replicas, plan.slowest) == ([[0]], [4], 2.0)
    # a huge activation between layers 0 and 1: cutting there costs more than not cutting
    layers = [layer(4.0, a=10**9), layer(4.0)]
    plan = pp.partition_pipedream(layers, workers=2, bandwidth=1e9)
    assert plan.stages == [[0, 1]] and plan.replicas == [2] and plan.slowest == 4.0
    cheap = pp.partition_pipedream([layer(4.0, a=10), layer(4.0)], workers=2, bandwidth=1e9)
    assert cheap.slowest == 4.0
    with pytest.raises(pp.PipelineError, match="sync"):
        pp.partition_pipedream(layers, 2, 1e9, sync="gossip")
    with pytest.raises(pp.PipelineError, match="Profile"):
        pp.partition_pipedream([1.0, 2.0], 2, 1e9)


# -- profiles --------------------------------------------------------------------------------

def small_model():
    return nn.Sequential(nn.Linear(8, 16, seed=1), nn.ReLU(), nn.Linear(16, 4, seed=2))


def test_profile_records_times_and_sizes_per_layer():
    model = small_model()
    prof = pp.profile(model, np.ones((32, 8)), repeat=2)
    assert len(prof) == 3 and [c.name for c in prof] == ["node0", "node1", "node2"]
    assert [c.activation_bytes for c in prof] == [32 * 16 * 8, 32 * 16 * 8, 32 * 4 * 8]
    assert [c.parameter_bytes for c in prof] == [(16 * 8 + 16) * 8, 0, (4 * 16 + 4) * 8]
    assert all(c.forward_time >= 0 and c.backward_time >= 0 for c in prof)
    assert prof[0].desc == repr(model[0])
    assert all(p.grad is None for p in model.parameters())  # the profile leaves no trace
    assert len(pp.partition(prof, 2)) == 2
    with pytest.raises(TypeError, match="Sequential"):
        pp.profile(model[0], np.ones((2, 8)))


def test_profile_files_round_trip(tmp_path):
    prof = pp.Profile([pp.LayerCost("node0", "Linear(in_features=8, out_features=16, bias=True)",
                                    0.00125, 0.0025, 4096, 1152),
                       pp.LayerCost("node1", "ReLU()", 0.0001, 0.0002, 4096, 0)])
    assert pp.Profile.load(prof.save(tmp_path / "p.json")).layers == prof.layers
    text = prof.to_text()
    assert text.splitlines()[0] == (
        "node0 -- Linear(in_features=8, out_features=16, bias=True) -- forward_compute_time=1.250, "
        "backward_compute_time=2.500, activation_size=4096.0, parameter_size=1152.000")
    assert "\tnode0 -- node1" in text
    back = pp.Profile.load(prof.save(tmp_path / "p.txt"))
    assert back.layers == prof.layers
    with pytest.raises(ValueError, match="json or .txt"):
        prof.save(tmp_path / "p.csv")


def test_profile_reads_pipedreams_text_form():
    text = ("node4 -- Block(2, 3) -- forward_compute_time=2.000, backward_compute_time=4.000, "
            "activation_size=[1024.0; 256.0], parameter_size=4096.000\n"
            "node5 -- Head -- forward_compute_time=1.000, backward_compute_time=1.500, "
            "activation_size=512.0, parameter_size=0.000\n"
            "\tnode4 -- node5\n")
    prof = pp.Profile.from_text(text)
    assert [c.name for c in prof] == ["node4", "node5"]
    assert prof[0].desc == "Block(2, 3)" and prof[0].activation_bytes == 1280
    assert prof.compute_times() == pytest.approx([0.006, 0.0025])


# -- a real pipelined run --------------------------------------------------------------------------

RNG = np.random.default_rng(5)
X = RNG.normal(size=(10, 6))
LABELS = RNG.integers(0, 3, size=10)


def five_layers():
    return nn.Sequential(nn.Linear(6, 8, seed=1), nn.Tanh(), nn.Linear(8, 8, seed=2),
                         nn.ReLU(), nn.Linear(8, 3, seed=3))


def plain_step(model, loss_fn, x, labels):
    model.zero_grad()
    loss = loss_fn(model(mg.tensor(x)), mg.tensor(labels))
    loss.backward()
    grads = [p.grad.numpy() for p in model.parameters()]
    model.zero_grad()
    return loss.item(), grads


@pytest.mark.parametrize("kind, stages, m", [
    ("gpipe", [[0, 1], [2, 3, 4]], 4),
    ("1f1b", [[0, 1], [2, 3, 4]], 4),
    ("1f1b", [[0], [1, 2], [3, 4]], 3),
    ("gpipe", [[0], [1, 2], [3, 4]], 1),
    ("1f1b", [[0, 1, 2, 3, 4]], 2),
])
def test_pipelined_gradients_equal_the_plain_step(kind, stages, m):
    model, loss_fn = five_layers(), nn.CrossEntropyLoss()
    loss, grads = plain_step(model, loss_fn, X, LABELS)
    pipe = pp.Pipeline(model, loss_fn, stages, schedule=kind, microbatches=m)
    run = pipe.run(X, LABELS)  # 10 rows in m microbatches: uneven sizes for m = 3, 4
    assert run.loss == pytest.approx(loss, rel=1e-13)
    for g, expected in zip(run.grads, grads):
        np.testing.assert_allclose(g, expected, rtol=1e-11, atol=1e-15)
    p = len(stages)
    sched = pp.schedule(kind, p, m)
    assert run.order == list(sched)  # each device ran its passes in the schedule's order
    assert run.peak_activations == pp.simulate(sched).peak_activations
    assert run.sends == 2 * (p - 1) * m  # an activation forward, a gradient back, per cut
    assert all(p_.grad is None for p_ in model.parameters())  # run() stores nothing


def test_pipelined_run_on_strict_devices_goes_through_send_recv(strict_devices):
    """array-api-strict's devices refuse mixed arrays: every crossing was a Send/Recv."""
    model, loss_fn = five_layers(), nn.CrossEntropyLoss()
    loss, grads = plain_step(model, loss_fn, X, LABELS)
    run = pp.Pipeline(model, loss_fn, [[0], [1, 2], [3, 4]], ["cpu", "cpu:1", "cpu:2"],
                      schedule="1f1b", microbatches=4).run(X, LABELS)
    assert run.loss == pytest.approx(loss, rel=1e-13)
    for g, expected in zip(run.grads, grads):
        np.testing.assert_allclose(g, expected, rtol=1e-11, atol=1e-15)


def test_1f1b_keeps_fewer_activations_alive_than_gpipe():
    model, loss_fn = nn.Sequential(nn.Linear(6, 64, seed=1), nn.Tanh(), nn.Linear(64, 3, seed=2)), \
        nn.CrossEntropyLoss()
    x, labels = RNG.normal(size=(96, 6)), RNG.integers(0, 3, size=96)
    peaks = {kind: pp.Pipeline(model, loss_fn, [[0, 1], [2]], schedule=kind,
                               microbatches=16).run(x, labels).peak_bytes for kind in KINDS}
    # Stage 0 keeps each microbatch's tanh output (6 x 64 float64) until its backward:
    # 16 of them under GPipe, at most 2 under 1F1B (plus a few temporaries in both).
    stash = 6 * 64 * 8
    assert peaks["gpipe"][0] >= 16 * stash
    assert peaks["1f1b"][0] < 8 * stash


def test_pipeline_backward_then_sgd_equals_the_plain_training_step():
    loss_fn = nn.MSELoss(reduction="sum")
    target = RNG.normal(size=(10, 3))
    plain, piped = five_layers(), five_layers()
    for model in (plain, piped):
        model[0].weight.grad = mg.ones((8, 6))  # backward adds to an existing gradient
    loss_fn(plain(mg.tensor(X)), mg.tensor(target)).backward()
    nn.SGD(plain.parameters(), lr=0.01).step()
    pipe = pp.Pipeline(piped, loss_fn, [[0, 1, 2], [3, 4]], schedule="gpipe", microbatches=5)
    pipe.backward(X, target)
    nn.SGD(piped.parameters(), lr=0.01).step()
    for a, b in zip(plain.parameters(), piped.parameters()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-12)
    second = pipe.run(X, target)  # the graph is reused, with the new parameter values
    expected, _ = plain_step(plain, loss_fn, X, target)
    assert second.loss == pytest.approx(expected, rel=1e-12)
    assert len(pipe._plans) == 1


def squared_error(out, y):  # a loss of one's own: a sum over the batch
    return mg.sum((out - y) ** 2)


def test_a_loss_function_says_whether_it_is_a_mean_or_a_sum():
    """The microbatch losses add up to the minibatch's by weights n_k / N for a mean and
    by ones for a sum. A plain function does not say which it computes: the pipeline
    took it for a mean, and a sum came out divided by the number of microbatches
    (half the loss and the gradients with 2). Now it must say; one microbatch needs no
    answer. The oracle: the plain tape step on the whole batch."""
    target = RNG.normal(size=(10, 3))
    model = five_layers()
    with pytest.raises(pp.PipelineError, match="squared_error has no reduction"):
        pp.Pipeline(model, squared_error, [[0, 1, 2], [3, 4]], microbatches=2).run(X, target)
    expected_loss, expected_grads = plain_step(model, squared_error, X, target)
    one = pp.Pipeline(model, squared_error, [[0, 1, 2], [3, 4]], microbatches=1).run(X, target)
    assert one.loss == pytest.approx(expected_loss, rel=1e-12)

    def summed(out, y):
        return squared_error(out, y)
    summed.reduction = "sum"
    for kind in ("gpipe", "1f1b"):
        run = pp.Pipeline(model, summed, [[0, 1, 2], [3, 4]], schedule=kind,
                          microbatches=2).run(X, target)
        assert run.loss == pytest.approx(expected_loss, rel=1e-12)
        for got, want in zip(run.grads, expected_grads):
            np.testing.assert_allclose(got, want, rtol=1e-10)


def test_pipeline_rejects_what_it_cannot_run():
    model, loss_fn = five_layers(), nn.CrossEntropyLoss()
    with pytest.raises(pp.PipelineError, match="consecutive"):
        pp.Pipeline(model, loss_fn, [[0, 2], [1, 3, 4]])
    with pytest.raises(pp.PipelineError, match="2 stages need 2 devices"):
        pp.Pipeline(model, loss_fn, [[0, 1], [2, 3, 4]], devices=["cpu"])
    with pytest.raises(mg.errors.DeviceError, match="cpu:99"):
        pp.Pipeline(model, loss_fn, [[0, 1], [2, 3, 4]], devices=["cpu", "cpu:99"])
    with pytest.raises(pp.PipelineError, match="cannot be cut into 16"):
        pp.Pipeline(model, loss_fn, [[0, 1], [2, 3, 4]], microbatches=16).run(X, LABELS)
    stuck = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("F", 0), ("B", 0), ("B", 1)]]
    with pytest.raises(pp.PipelineError, match="deadlock"):
        pp.Pipeline(model, loss_fn, [[0, 1], [2, 3, 4]], schedule=stuck)
    with pytest.raises(TypeError, match="Sequential"):
        pp.Pipeline(model[0], loss_fn, [[0]])


class _Scaled(nn.Module):
    """A layer that keeps a tensor that is not a parameter (a buffer, in PyTorch's words)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3, seed=1)
        self.scale = mg.tensor(1.5)

    def forward(self, x):
        return self.lin(x) * self.scale


def test_a_frozen_or_unused_parameter_keeps_its_grad_none():
    """Pipeline.backward gave every parameter a .grad: a frozen one (requires_grad False)
    its gradient, an unused one zeros, so SGD moved the first and weight decay shrank
    the second. Oracles: the tape and PyTorch leave both at None, and the step leaves
    them where they were."""
    torch = pytest.importorskip("torch")
    mg.set_virtual_cpus(2)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 4)), rng.integers(0, 3, 8)

    def make():
        m = nn.Sequential(nn.Linear(4, 5, seed=0), nn.Tanh(), nn.Linear(5, 3, seed=1))
        m[0].weight.requires_grad = False
        m[1].unused = mg.tensor(np.ones(3), requires_grad=True)  # no path reaches it
        return m

    plain, piped = make(), make()
    nn.CrossEntropyLoss()(plain(mg.tensor(x)), mg.tensor(y)).backward()
    pp.Pipeline(piped, nn.CrossEntropyLoss(), [[0, 1], [2]], ["cpu", "cpu:1"], "1f1b",
                2).backward(x, y)
    tm = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    tm[0].weight.requires_grad_(False)
    with torch.no_grad():
        for p, q in zip(tm.parameters(), [piped[0].weight, piped[0].bias, piped[2].weight,
                                          piped[2].bias]):
            p.copy_(torch.tensor(q.numpy()))
    torch.nn.functional.cross_entropy(tm(torch.tensor(x, dtype=torch.float32)),
                                      torch.tensor(y)).backward()
    assert tm[0].weight.grad is None and plain[0].weight.grad is None
    assert piped[0].weight.grad is None and piped[1].unused.grad is None
    for p, q in zip(plain.parameters(), piped.parameters()):
        if p.grad is not None:
            np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-12)
    before = [p.numpy().copy() for p in piped.parameters()]
    nn.SGD(piped.parameters(), 0.5, weight_decay=0.5).step()
    np.testing.assert_array_equal(piped[0].weight.numpy(), before[0])
    np.testing.assert_array_equal(piped[1].unused.numpy(), np.ones(3))


def test_recomputation_refuses_a_layers_tensor_on_another_device():
    """With recompute=True the stage's layers run eagerly on the stage's device; a
    tensor a layer keeps on another device failed inside the checkpoint node with a
    device error about mul. It is refused when the pipeline is made, naming it."""
    mg.set_virtual_cpus(2)
    model = nn.Sequential(nn.Linear(4, 5, seed=0), nn.Tanh(), _Scaled())
    pp.Pipeline(model, nn.CrossEntropyLoss(), [[0, 1], [2]], ["cpu", "cpu:1"])  # (fine)
    with pytest.raises(pp.PipelineError, match=r"layer 2 keeps scale, a tensor on cpu"):
        pp.Pipeline(model, nn.CrossEntropyLoss(), [[0, 1], [2]], ["cpu", "cpu:1"],
                    recompute=True)
