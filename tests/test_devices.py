"""Devices: names, scopes, virtual CPUs kept apart, real copies, clear errors."""

from __future__ import annotations

import importlib
import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import DeviceError


def test_default_devices():
    names = mg.devices()
    assert names[:4] == ["cpu", "cpu:1", "cpu:2", "cpu:3"]


def test_virtual_cpu_count_is_configurable():
    try:
        mg.set_virtual_cpus(5)
        assert "cpu:5" in mg.devices()
        mg.set_virtual_cpus(1)
        assert "cpu:2" not in mg.devices()
    finally:
        mg.set_virtual_cpus(3)
    assert mg.devices()[:4] == ["cpu", "cpu:1", "cpu:2", "cpu:3"]


def test_devices_are_listed_cpus_first_whatever_order_they_were_made_in():
    """On a GPU machine cuda:0 came between cpu:1 and cpu:2 once set_virtual_cpus had
    remade cpu:2 and cpu:3 after it (the list was the registry's insertion order)."""
    registry = importlib.import_module("minigraph.device")._registry
    try:
        mg.register_device("other:10", np)
        mg.register_device("other:9", np)
        mg.set_virtual_cpus(1)
        mg.set_virtual_cpus(11)
        listed = [n for n in mg.devices() if not n.startswith("cuda")]  # (a GPU's, if any)
        assert listed[:13] == ["cpu"] + [f"cpu:{k}" for k in range(1, 12)] + ["other:9"]
        assert listed.index("other:10") == listed.index("other:9") + 1
    finally:
        del registry["other:10"], registry["other:9"]
        mg.set_virtual_cpus(3)


def test_device_scope_sets_the_default(backend):
    assert mg.tensor(1.0).device.name == "cpu"
    with mg.device("cpu:2"):
        assert mg.tensor(1.0).device.name == "cpu:2"
        with mg.device("cpu:1"):
            assert mg.zeros(2).device.name == "cpu:1"
        assert mg.sin(1.0).device.name == "cpu:2"
    assert mg.tensor(1.0).device == "cpu"


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(DeviceError, match=r"unknown device 'tpu:0'; known devices: cpu, cpu:1"):
        mg.tensor(1.0, device="tpu:0")


def test_mixed_devices_are_refused_naming_both(backend):
    a, b = mg.tensor([1.0, 2.0]), mg.tensor([1.0, 2.0], device="cpu:1")
    with pytest.raises(DeviceError, match=r"mul: .*cpu and cpu:1.*x.to\('cpu'\)"):
        a * b


def test_to_is_a_real_copy_and_differentiable(backend):
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    y = x.to("cpu:1")
    assert y.device.name == "cpu:1" and x.device.name == "cpu"
    assert y.data is not x.data
    np.testing.assert_array_equal(y.numpy(), [1.0, 2.0])
    (y * y).sum().backward()
    assert x.grad.device.name == "cpu"  # a tensor's gradient lives on its own device
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])
    assert x.to("cpu") is x


def test_copy_does_not_share_memory_between_virtual_devices():
    x = mg.tensor([1.0, 2.0])
    y = x.to("cpu:1")
    x.data[0] = 100.0
    assert y.numpy()[0] == 1.0


def test_forward_mode_through_a_transfer(backend):
    out, t = mg.jvp(lambda x: (x.to("cpu:2") * 3.0).sum(), (mg.tensor([1.0, 2.0]),), (1.0,))
    assert out.device.name == "cpu:2" and t.device.name == "cpu:2"
    assert t.item() == 6.0


def across_devices(x):
    return mg.sum(mg.sin(x.to("cpu:2")) * 2.0)


@pytest.mark.parametrize("mode", ["tape", "forward", "graph", "source"])
def test_a_gradient_lives_on_its_inputs_device_in_every_mode(mode):
    """Forward mode's gradient is made of the output's tangents, which live where f's
    output was computed: it came back on cpu:2 for an x on cpu:1, where the other modes,
    and backward(), put it on x's device; so did jacfwd where jacrev did not. The
    values: d/dx sum(2 sin x) = 2 cos x."""
    x = mg.tensor([1.0, 2.0], device="cpu:1")
    g = mg.grad(across_devices, mode=mode)(x)
    assert g.device.name == "cpu:1"
    np.testing.assert_allclose(g.numpy(), 2 * np.cos([1.0, 2.0]), rtol=1e-14)
    if mode == "tape":
        for jac in (mg.jacfwd(across_devices)(x), mg.jacrev(across_devices)(x)):
            assert jac.device.name == "cpu:1"
            np.testing.assert_allclose(jac.numpy(), 2 * np.cos([1.0, 2.0]), rtol=1e-14)


def test_cuda_without_cupy_or_gpu_says_what_is_missing():
    if mg.cuda_available():
        pytest.skip("a GPU is present here")
    with pytest.raises(DeviceError, match=r"cuda:0.*(CuPy|CUDA|GPU)"):
        mg.tensor(1.0, device="cuda:0")


def test_each_device_counts_its_own_memory():
    dev = mg.device("cpu:3")
    before = dev.live_bytes
    x = mg.tensor(np.zeros(1000), device="cpu:3")
    assert dev.live_bytes - before == 8000
    assert mg.device("cpu").live_bytes >= 0
    del x
    assert dev.live_bytes == before


def test_synchronize_waits_for_the_device_and_returns_at_once_on_a_cpu():
    class Queue:  # a native device with a queue to wait for, as cupy.cuda.Device has
        waited = 0

        def synchronize(self):
            self.waited += 1

    native = Queue()
    dev = mg.Device("fake:0", mg.device("cpu").xp, native)
    dev.synchronize()
    dev.synchronize()
    assert native.waited == 2  # handed to the native device, once per call
    t = mg.ones((3,), device="cpu:1") * 2.0
    mg.device("cpu:1").synchronize()  # no native device: nothing to wait for, no error
    assert t.numpy().tolist() == [2.0, 2.0, 2.0]


def test_identity_and_stop_gradient_count_no_memory_of_their_own():
    """identity and stop_gradient returned their argument's own array, and the device
    counted its bytes once per tensor over it: 24,000 live bytes for one 1000-float64
    buffer (8,000 by hand). They return a view now, which counts nothing, as every
    view does."""
    mg.set_virtual_cpus(3)
    dev = mg.get_device("cpu:3")
    before = dev.live_bytes
    x = mg.tensor(np.ones(1000), device="cpu:3")
    dev.reset_peak()
    kept = [mg.identity(x), mg.stop_gradient(x), x.detach()]
    assert all(np.shares_memory(k.numpy(), x.numpy()) for k in kept)
    assert dev.live_bytes - before == 8000 and dev.peak_bytes - before == 8000
