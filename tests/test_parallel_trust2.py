"""Data, model and pipeline parallelism held to independent oracles (PyTorch, NumPy, the
schedule's own order): the second round of bugs found in them, one test each."""

import json
import re

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph import nn
from minigraph.parallel import LayerSplitMLP, ShardedLinear
from minigraph.parallel import pipeline as pp
from minigraph.parallel.pipeline import PipelineError


def _hinge_sum(params, x, y):  # a sum over the batch, without a ``reduction`` attribute
    w, = params
    return mg.sum(mg.relu(1.0 - y * (x @ w)))


def _torch_hinge_grad(w, x, y):
    tw = torch.tensor(w, requires_grad=True)
    torch.relu(1 - torch.tensor(y) * (torch.tensor(x) @ tw)).sum().backward()
    return tw.grad.numpy()


def _hinge_batch():
    """Six rows whose first three meet their margins (a hinge loss of exactly 0 there)."""
    rng = np.random.default_rng(0)
    w = np.array([1.0, -2.0, 0.5])
    x = rng.normal(size=(6, 3))
    y = np.sign(x @ w)
    x[:3] *= 10.0 / np.abs(x[:3] @ w)[:, None]
    x[3:] *= 0.1
    return w, x, y


def test_data_parallel_sum_loss_that_is_zero_on_the_first_share():
    """A sum loss of (nearly) 0 on the first share read as a mean (np.isclose's absolute
    tolerance): its gradient came out divided by the number of devices, and the verdict
    was kept for every later call of the function."""
    mg.set_virtual_cpus(2)
    w, x, y = _hinge_batch()
    for xb, yb in [(x, y), (x[::-1].copy(), y[::-1].copy())]:
        got = mg.parallel.data_parallel_grads(_hinge_sum, [mg.tensor(w)], xb, yb,
                                              ["cpu", "cpu:1"])
        for per_device in got:
            np.testing.assert_allclose(per_device[0].numpy(), _torch_hinge_grad(w, xb, yb),
                                       rtol=1e-12)
    # a sum of squares of 2e-10 on the first share (below np.isclose's atol of 1e-8)
    rng = np.random.default_rng(1)
    x2, w2 = rng.normal(size=(4, 2)), np.array([1.0, 2.0])
    y2 = x2 @ w2 + np.array([1e-5, 1e-5, 0.5, 0.5])

    def sse(params, a, b):
        d = a @ params[0] - b
        return mg.sum(d * d)

    got = mg.parallel.data_parallel_grads(sse, [mg.tensor(w2)], x2, y2, ["cpu", "cpu:1"])
    tw = torch.tensor(w2, requires_grad=True)
    ((torch.tensor(x2) @ tw - torch.tensor(y2)) ** 2).sum().backward()
    np.testing.assert_allclose(got[0][0].numpy(), tw.grad.numpy(), rtol=1e-12)


def test_data_parallel_loss_that_cannot_be_told_is_refused_not_remembered():
    """Where every share's loss is 0 a mean and a sum read the same: the guess "mean" was
    taken (and kept for the function's later calls); now it is refused, asking for
    loss.reduction, and a later batch that tells is read afresh."""
    mg.set_virtual_cpus(2)
    w, x, y = _hinge_batch()
    with pytest.raises(ValueError, match=r"cannot tell whether the loss is a mean or a "
                                         r"sum.*loss\.reduction = 'mean' or 'sum'"):
        mg.parallel.data_parallel_grads(_hinge_sum, [mg.tensor(w)], x[:3], y[:3],
                                        ["cpu", "cpu:1"])
    got = mg.parallel.data_parallel_grads(_hinge_sum, [mg.tensor(w)], x, y, ["cpu", "cpu:1"])
    np.testing.assert_allclose(got[0][0].numpy(), _torch_hinge_grad(w, x, y), rtol=1e-12)


def test_a_string_of_devices_is_refused_by_name():
    """One device name given as ``devices`` was split into its letters: "unknown device
    'c'", a device the user never wrote."""
    mg.set_virtual_cpus(3)
    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 2))
    makers = {"ShardedLinear": lambda: ShardedLinear(3, 8, "cpu:1"),
              "LayerSplitMLP": lambda: LayerSplitMLP([4, 3, 3], "cpu:1", 2),
              "Pipeline": lambda: pp.Pipeline(model, nn.CrossEntropyLoss(), [[0], [1], [2]],
                                              devices="cpu"),
              "device_names": lambda: mg.parallel.data_parallel.device_names("cpu")}
    for who, make in makers.items():
        with pytest.raises(TypeError, match=f"{who}: devices is a list of device names"):
            make()


def test_layer_split_mlp_refuses_more_devices_than_layers():
    """Devices past the number of layers were left unused, without a word."""
    mg.set_virtual_cpus(3)
    for sizes in ([4, 3], [4, 3, 3]):
        with pytest.raises(ValueError, match=f"{len(sizes) - 1} layer\\(s\\) cannot be split "
                                             f"over 3 devices"):
            LayerSplitMLP(sizes, ["cpu", "cpu:1", "cpu:2"], batch=2)


def test_layer_split_mlp_step_is_all_or_nothing():
    """An lr array that broadcast against W0 and b0 but not W1 stepped W0 and b0, then
    failed in NumPy: the model was left half-stepped. Now lr is checked first; a valid
    step equals p - lr * g with PyTorch's gradients."""
    mg.set_virtual_cpus(2)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 4)), rng.integers(0, 3, 6)
    mlp = LayerSplitMLP([4, 5, 3], ["cpu", "cpu:1"], 6)
    before = [p.copy() for p in mlp.params]
    for lr, error in [(np.full(5, 0.1), TypeError), (float("nan"), ValueError),
                      (-0.1, ValueError)]:
        with pytest.raises(error, match="LayerSplitMLP.step: lr must be"):
            mlp.step(x, y, lr)
        for a, b in zip(before, mlp.params):
            np.testing.assert_array_equal(a, b)
    ts = [torch.tensor(p, requires_grad=True) for p in before]
    h = torch.tanh(torch.tensor(x) @ ts[0] + ts[1]) @ ts[2] + ts[3]
    torch.nn.functional.cross_entropy(h, torch.tensor(y)).backward()
    mlp.step(x, y, 0.1)
    for p, t in zip(mlp.params, ts):
        np.testing.assert_allclose(p, t.detach().numpy() - 0.1 * t.grad.numpy(), rtol=1e-12)


class _Scaled(nn.Module):
    """A linear layer whose output is multiplied by a buffer (not a parameter)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3, seed=1)
        self.scale = mg.tensor(1.5, device="cpu:1")

    def forward(self, x):
        return self.lin(x) * self.scale


def _torch_step(model, x, y, scale, reduction):
    """PyTorch's loss and gradients of Linear, Tanh, _Scaled with the given state."""
    ts = [torch.tensor(p.numpy(), requires_grad=True) for p in model.parameters()]
    h = torch.tanh(torch.tensor(x) @ ts[0].T + ts[1])
    z = (h @ ts[2].T + ts[3]) * scale
    loss = torch.nn.functional.cross_entropy(z, torch.tensor(y), reduction=reduction)
    loss.backward()
    return loss.item(), [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("recompute", [False, True])
def test_pipeline_reads_the_layers_and_the_loss_state_of_each_run(recompute):
    """The graph, built at the first run, held a buffer (``self.scale``) and the loss's
    reduction as they were then: changing them (in place, by assignment) was ignored by
    later runs with recompute=False, while recompute=True read them afresh."""
    mg.set_virtual_cpus(2)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 4)), rng.integers(0, 3, 6)
    model = nn.Sequential(nn.Linear(4, 4, seed=0), nn.Tanh(), _Scaled())
    loss = nn.CrossEntropyLoss()
    pipe = pp.Pipeline(model, loss, [[0, 1], [2]], ["cpu", "cpu:1"], "1f1b", 2,
                       recompute=recompute)
    pipe.run(x, y)

    def check(scale, reduction):
        result = pipe.run(x, y)
        want_loss, want_grads = _torch_step(model, x, y, scale, reduction)
        assert result.loss == pytest.approx(want_loss, rel=1e-12)
        for got, want in zip(result.grads, want_grads):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)

    with mg.no_grad():
        model[2].scale *= 2.0  # in place
    check(3.0, "mean")
    model[2].scale = mg.tensor(0.5, device="cpu:1")  # another tensor
    check(0.5, "mean")
    loss.reduction = "sum"
    check(0.5, "sum")


class _Identity(nn.Module):
    def forward(self, x):
        return x


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_a_pass_through_stage_keeps_its_place_in_the_order(kind):
    """A stage that only passes its input on runs no node of its own: its order was []
    and its peak_activations 0, where the schedule (and recompute=True) has it run every
    F and B."""
    mg.set_virtual_cpus(3)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 4)), rng.integers(0, 3, 6)
    sched = pp.schedule(kind, 3, 3)
    model = nn.Sequential(nn.Linear(4, 3, seed=0), _Identity(), nn.Linear(3, 3, seed=1))
    run = pp.Pipeline(model, nn.CrossEntropyLoss(), [[0], [1], [2]],
                      ["cpu", "cpu:1", "cpu:2"], sched).run(x, y)
    assert run.order == [list(ops) for ops in sched]
    assert run.peak_activations == pp.simulate(sched).peak_activations


def test_profile_from_text_names_the_line_and_the_field():
    """A line without a field raised a bare KeyError('activation_size'), a non-number an
    error naming no line, and a text of no layer line read as an empty profile."""
    head = "node1 -- Linear(in_features=4, out_features=4, bias=True) -- "
    missing = head + "forward_compute_time=1.0, backward_compute_time=2.0, parameter_size=16.0"
    with pytest.raises(PipelineError, match=r"line 2 .* has no activation_size"):
        pp.Profile.from_text("\n" + missing)
    wrong = head + ("forward_compute_time=fast, backward_compute_time=2.0, "
                    "activation_size=8.0, parameter_size=16.0")
    with pytest.raises(PipelineError, match=r"line 1 .*forward_compute_time=fast is not a "
                                            r"number"):
        pp.Profile.from_text(wrong)
    with pytest.raises(PipelineError, match="no layer line"):
        pp.Profile.from_text("\tnode1 -- node2\n")
    good = head + ("forward_compute_time=1.0, backward_compute_time=2.0, "
                   "activation_size=[8.0; 4.0], parameter_size=16.0")
    (layer,) = pp.Profile.from_text(good)
    assert (layer.forward_time, layer.backward_time, layer.activation_bytes,
            layer.parameter_bytes) == (1e-3, 2e-3, 12, 16)


def test_pipeline_label_error_names_the_row_of_the_batch():
    """A bad label was reported at its row inside its microbatch (row 0), not at its row
    of the labels the user passed (row 3)."""
    mg.set_virtual_cpus(2)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 4)), np.array([0, 1, 2, 3, 0, 1])
    model = nn.Sequential(nn.Linear(4, 4, seed=0), nn.Tanh(), nn.Linear(4, 3, seed=1))
    pipe = pp.Pipeline(model, nn.CrossEntropyLoss(), [[0, 1], [2]], ["cpu", "cpu:1"],
                       "1f1b", 2)
    with pytest.raises(mg.runtime.scheduler.NodeError) as info:
        pipe.run(x, y)
    first = str(info.value).splitlines()[0]
    assert "microbatch 1 (rows 3..5 of the batch)" in first
    assert re.search(r"label 3 \(row (\d+)\)", first)[1] == str(np.nonzero(y >= 3)[0][0])


def test_profile_from_json_names_the_layer_and_the_fields():
    """A JSON layer without a field raised LayerCost's bare TypeError ("missing 1
    required positional argument"), and a text without layers a KeyError or an empty
    profile."""
    layer = {"name": "node1", "desc": "Linear", "forward_time": 1e-3, "backward_time": 2e-3,
             "activation_bytes": 8}
    with pytest.raises(PipelineError, match="layer 0 is .*a layer gives exactly .*"
                                            "parameter_bytes"):
        pp.Profile.from_json(json.dumps({"layers": [layer]}))
    for text in ("{}", json.dumps({"layers": []})):
        with pytest.raises(PipelineError, match="no \"layers\" list"):
            pp.Profile.from_json(text)
    (back,) = pp.Profile.from_json(json.dumps({"layers": [{**layer, "parameter_bytes": 16}]}))
    assert back.parameter_bytes == 16


@pytest.mark.parametrize("field, value", [("forward_time", "abc"), ("parameter_bytes", None),
                                          ("activation_bytes", -5),
                                          ("activation_bytes", 10**400)])
def test_profile_from_json_refuses_a_value_that_is_no_number(field, value):
    """from_json checked the fields' names, not their values: "abc" and null failed later
    in the partitioner with Python's own TypeError, and -5 was partitioned silently."""
    layer = {"name": "node1", "desc": "Linear", "forward_time": 1e-3, "backward_time": 2e-3,
             "activation_bytes": 8, "parameter_bytes": 16}
    with pytest.raises(PipelineError, match=f"layer 0's {field} is .*not a number >= 0"):
        pp.Profile.from_json(json.dumps({"layers": [{**layer, field: value}]}))


def test_profile_from_text_refuses_a_negative_size_in_a_list():
    """A list of activation sizes [100; -60] was summed to 40 despite "a number >= 0"."""
    line = ("node1 -- Linear -- forward_compute_time=1.0, backward_compute_time=2.0, "
            "activation_size=[100; -60], parameter_size=16.0")
    with pytest.raises(PipelineError, match="activation_size"):
        pp.Profile.from_text(line)


@pytest.mark.parametrize("kind", ["max", "square of the mean"])
def test_data_parallel_refuses_a_loss_that_is_neither_a_mean_nor_a_sum(kind):
    """A max, or the square of a mean, reads the same on a share's rows twice over, so it
    was taken for a mean, and the shares' weighted gradients added up to another
    function's ([1.78, 2.39, -0.82] for torch's [1.22, 3.09, -0.38]). The shares' losses
    alone and together tell: it is neither, and refused."""
    mg.set_virtual_cpus(2)
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(6, 3)), rng.normal(size=3)
    y = rng.normal(size=6)

    def loss(params, a, b):
        d = a @ params[0] - b
        return mg.max(d * d) if kind == "max" else mg.mean(d) ** 2

    with pytest.raises(ValueError, match="neither"):
        mg.parallel.data_parallel_grads(loss, [mg.tensor(w)], x, y, ["cpu", "cpu:1"])


PIPE_SCALE = 1.5


class _ScaledByConfig(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3, seed=1)
        self.cfg = {"scale": 1.5}

    def forward(self, x):
        return self.lin(x) * self.cfg["scale"] * (PIPE_SCALE / 1.5)


@pytest.mark.parametrize("change", ["dict item", "global"])
def test_pipeline_rebuilds_when_a_dict_item_or_a_global_its_layers_read_changes(change):
    """Pipeline(recompute=False) held a number read from a dict attribute or a global as
    a constant of the graph built at the first run, and kept running it after the number
    changed (loss 0.994 for torch's 1.031). Oracle: torch with the new number."""
    global PIPE_SCALE
    mg.set_virtual_cpus(2)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 4)), rng.integers(0, 3, 6)
    model = nn.Sequential(nn.Linear(4, 4, seed=0), nn.Tanh(), _ScaledByConfig())
    pipe = mg.parallel.pipeline.Pipeline(model, nn.CrossEntropyLoss(), [[0, 1], [2]],
                                         ["cpu", "cpu:1"], "1f1b", 2)
    pipe.run(x, y)
    try:
        if change == "global":
            PIPE_SCALE = 3.0
        else:
            model[2].cfg["scale"] = 3.0
        got = pipe.run(x, y).loss
    finally:
        PIPE_SCALE = 1.5
    ts = [torch.tensor(p.numpy()) for p in model.parameters()]
    z = (torch.tanh(torch.tensor(x) @ ts[0].T + ts[1]) @ ts[2].T + ts[3]) * 3.0
    assert got == pytest.approx(torch.nn.functional.cross_entropy(z, torch.tensor(y)).item(),
                                rel=1e-12)


def test_data_parallel_reads_every_pair_of_shares():
    """A weighted mean sum(v d^2) / sum(v) whose first two shares weigh the same read as a
    mean on them, and the verdict was applied to a third share of other weights: a wrong
    gradient on 3 devices ([2.25, 0.98, -0.17] for torch's [2.42, 0.70, 0.47])."""
    mg.set_virtual_cpus(3)
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(6, 3)), rng.normal(size=3)
    y = np.stack([rng.normal(size=6), [1.0, 1.0, 1.0, 1.0, 3.0, 3.0]], axis=1)

    def weighted(params, a, b):
        d = a @ params[0] - b[:, 0]
        return mg.sum(b[:, 1] * d * d) / mg.sum(b[:, 1])

    with pytest.raises(ValueError, match="neither"):
        mg.parallel.data_parallel_grads(weighted, [mg.tensor(w)], x, y,
                                        ["cpu", "cpu:1", "cpu:2"])


def test_data_parallel_names_a_loss_that_is_no_scalar():
    """On two devices a loss of several numbers failed in item() ("the tensor has 3
    elements"), naming neither the loss nor data_parallel_grads."""
    mg.set_virtual_cpus(2)
    x, y = np.ones((6, 3)), np.ones(6)
    with pytest.raises(ValueError, match="must return a scalar"):
        mg.parallel.data_parallel_grads(lambda p, a, b: a @ p[0] - b, [mg.tensor(np.ones(3))],
                                        x, y, ["cpu", "cpu:1"])


PIPE_GAIN = mg.tensor(1.5)


class _ScaledByGlobalTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3, seed=1)

    def forward(self, x):
        return self.lin(x) * PIPE_GAIN


def test_pipeline_rebuilds_when_a_tensor_its_layers_read_is_written_in_place():
    """A global tensor a layer reads, written in place (G *= 2.0 under no_grad), kept the
    graph built with its old value (loss 0.994 for torch's 1.031): its values are
    compared with a copy, as compiled programs compare them."""
    global PIPE_GAIN
    mg.set_virtual_cpus(2)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 4)), rng.integers(0, 3, 6)
    PIPE_GAIN.data[...] = 1.5
    model = nn.Sequential(nn.Linear(4, 4, seed=0), nn.Tanh(), _ScaledByGlobalTensor())
    pipe = mg.parallel.pipeline.Pipeline(model, nn.CrossEntropyLoss(), [[0, 1], [2]],
                                         ["cpu", "cpu:1"], "1f1b", 2)
    pipe.run(x, y)
    with mg.no_grad():
        PIPE_GAIN *= 2.0
    got = pipe.run(x, y).loss
    ts = [torch.tensor(p.numpy()) for p in model.parameters()]
    z = (torch.tanh(torch.tensor(x) @ ts[0].T + ts[1]) @ ts[2].T + ts[3]) * 3.0
    assert got == pytest.approx(torch.nn.functional.cross_entropy(z, torch.tensor(y)).item(),
                                rel=1e-12)
