"""CUDA through CuPy: run only where CuPy imports and a GPU exists."""

from __future__ import annotations

import math

import numpy as np
import pytest

import minigraph as mg

pytestmark = pytest.mark.skipif(not mg.cuda_available(),
                                reason="needs CuPy and a CUDA GPU")


def test_textbook_example_on_the_gpu():
    x = mg.tensor(2.0, device="cuda:0", requires_grad=True)
    y = mg.tensor(3.0, device="cuda:0", requires_grad=True)
    (x * y + mg.sin(x)).backward()
    assert x.grad.device.name == "cuda:0"
    assert x.grad.item() == pytest.approx(3 + math.cos(2), rel=1e-12)
    assert y.grad.item() == 2.0


def test_copies_between_host_and_gpu_and_gradients():
    a = np.arange(6.0).reshape(2, 3)
    x = mg.tensor(a, requires_grad=True)
    y = (x.to("cuda:0") ** 2).sum()
    y.backward()
    assert y.device.name == "cuda:0" and x.grad.device.name == "cpu"
    np.testing.assert_allclose(x.grad.numpy(), 2 * a)


def test_gpu_matches_cpu_on_an_mlp_step():
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(8, 5)), rng.normal(size=(5, 3))
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1])

    def loss(w, device):
        return mg.cross_entropy(mg.tensor(x, device=device) @ w,
                                mg.tensor(labels, device=device))

    g_cpu = mg.grad(loss)(mg.tensor(w), "cpu")
    g_gpu = mg.grad(loss)(mg.tensor(w, device="cuda:0"), "cuda:0")
    np.testing.assert_allclose(g_gpu.numpy(), g_cpu.numpy(), rtol=1e-10)


def test_relu_grad_and_an_in_place_update_on_the_gpu():
    x = np.array([[-1.5, 0.5, 2.0], [0.25, -0.75, 1.0]])
    p = mg.tensor(x, device="cuda:0")
    g = mg.grad(lambda t: (mg.relu(t) * t).sum())(p)  # d/dt relu(t) t = 2t where t > 0
    np.testing.assert_allclose(g.numpy(), np.where(x > 0, 2 * x, 0.0), rtol=1e-14)
    before = p.data
    with mg.no_grad():
        p -= 0.5 * g
    mg.device("cuda:0").synchronize()
    assert p.data is before
    np.testing.assert_allclose(p.numpy(), np.where(x > 0, 0.0, x), atol=1e-15)
