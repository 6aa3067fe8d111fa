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


# -- every way of differentiating, and the runtime, on the GPU: the CPU's numbers ----------------

def _mlp(w1, b1, w2, x, labels):
    return mg.cross_entropy(mg.tanh(x @ w1 + b1) @ w2, labels)


def _on(device):
    """Every mode's gradient of a small MLP, the transforms of chapter 09 and a graph run
    three ways, on ``device``; each result must live there too."""
    rng = np.random.default_rng(3)
    w1, b1, w2 = rng.normal(size=(5, 4)), rng.normal(size=4), rng.normal(size=(4, 3))
    x, labels = rng.normal(size=(6, 5)), np.array([0, 1, 2, 2, 1, 0])
    W, xs = rng.normal(size=(3, 4)), rng.normal(size=(5, 4))
    on = {"w1": mg.tensor(w1, device=device), "b1": mg.tensor(b1, device=device),
          "w2": mg.tensor(w2, device=device), "x": mg.tensor(x, device=device),
          "labels": mg.tensor(labels, device=device)}
    out = {}
    for mode in ("tape", "forward", "graph", "source"):
        grads = mg.grad(_mlp, argnums=(0, 1, 2), mode=mode)(*on.values())
        for k, g in enumerate(grads):
            out[f"{mode} {k}"] = g
    Wt, X = mg.tensor(W, device=device), mg.tensor(xs, device=device)

    def f(v):
        return mg.sum(mg.tanh(Wt @ v) ** 2)
    out["vmap(grad)"] = mg.vmap(mg.grad(f))(X)
    out["jacrev"] = mg.jacrev(lambda v: mg.tanh(Wt @ v))(X[0])
    out["jacfwd"] = mg.jacfwd(lambda v: mg.tanh(Wt @ v))(X[0])
    out["hessian"] = mg.hessian(f)(X[0])
    out["checkpoint"] = mg.grad(lambda v: mg.sum(mg.checkpoint(lambda u: mg.tanh(Wt @ u))(v)))(X[0])
    out["trace"] = mg.trace(mg.grad(f))(X[0])
    with mg.Graph() as g, mg.device(device):
        v = mg.placeholder((4,), name="v")
        (gv,) = mg.gradients(mg.sum(mg.tanh(mg.constant(W) @ v) ** 2), [v])
    (out["compiled"],) = mg.compile_graph(g, [v], [gv])(X[0])
    for name, t in out.items():
        assert t.device.name == device, f"{name} came back on {t.device.name}"
    out = {name: t.numpy() for name, t in out.items()}
    out["session"] = mg.Session(g).run(gv, {v: xs[0]})  # (a Session hands back NumPy)
    return out


def test_every_mode_transform_and_graph_run_on_the_gpu_gives_the_cpus_numbers():
    cpu, gpu = _on("cpu"), _on("cuda:0")
    assert cpu.keys() == gpu.keys()
    for name in cpu:
        np.testing.assert_allclose(gpu[name], cpu[name], rtol=1e-9, atol=1e-12, err_msg=name)
