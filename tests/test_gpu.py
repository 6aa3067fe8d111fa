"""CUDA through CuPy: run only where CuPy imports and a GPU exists."""

from __future__ import annotations

import math

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import GradientError
from minigraph.graph.graph import TracedValueError
from across_devices import check_adjoints_come_back, check_auto_place_keeps_copies

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


def test_numpy_of_a_gpu_tensor_is_a_host_copy_and_copy_false_refuses():
    t = mg.tensor([1.0, 2.0], device="cuda:0")
    for a in (np.array(t), np.asarray(t), t.numpy()):
        a[0] = 99.0  # a host copy: the tensor keeps its values
    assert t.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="lives on cuda:0"):
        np.asarray(t, copy=False)


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
    out["abs"] = mg.grad(lambda v: mg.sum(abs(v) * v.astype("float64")))(X[0])  # 2|v|
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


# -- the host and the GPU in one graph: copies, counters, placement, allreduce ------------------

def test_a_graph_across_host_and_gpu_counts_the_bytes_it_moves():
    """The cost-model test of chapter 07 with cuda:0 as the second device."""
    check_adjoints_come_back("cuda:0")


def test_auto_place_over_host_and_gpu_leaves_copies_where_they_copy_to():
    """A copy moved off its destination met arrays of two devices in one kernel: NumPy's
    virtual devices hid that, CuPy does not mix host and device arrays."""
    check_auto_place_keeps_copies(["cpu", "cuda:0"], "cuda:0")


def test_a_host_gradient_cannot_be_set_on_a_gpu_tensor():
    """PyTorch's .grad setter refuses a gradient on another device; a host array set by
    hand would reach CuPy's kernels in the next backward()."""
    p = mg.tensor(np.ones(3), device="cuda:0", requires_grad=True)
    with pytest.raises(mg.errors.GradientError, match="cuda:0"):
        p.grad = mg.tensor(np.ones(3))
    assert p.grad is None
    (p * p).sum().backward()
    np.testing.assert_allclose(p.grad.numpy(), 2 * np.ones(3))


def test_allreduce_between_host_and_gpu_sums_on_each_device():
    a = np.arange(10.0)
    parts = [mg.tensor(a), mg.tensor(2 * a, device="cuda:0"), mg.tensor(3 * a, device="cpu:1")]
    for algorithm in ("ring", "naive", "parameter_server"):
        out = mg.parallel.allreduce(parts, algorithm=algorithm)
        assert [t.device.name for t in out] == ["cpu", "cuda:0", "cpu:1"], algorithm
        for t in out:
            np.testing.assert_allclose(t.numpy(), 6 * a, err_msg=algorithm)


# -- DLPack and files with GPU memory ----------------------------------------------------------

def test_from_dlpack_of_gpu_memory_makes_a_gpu_tensor_copied_unless_asked_to_share():
    import cupy

    for make in (lambda: cupy.arange(6.0).reshape(2, 3), _torch_cuda_arange):
        source = make()
        if source is None:
            continue
        t = mg.from_dlpack(source)
        assert (t.device.name, t.dtype, t.shape) == ("cuda:0", "float64", (2, 3))
        t -= 1.0  # its own copy: the producer's array is as it was
        np.testing.assert_array_equal(cupy.asnumpy(cupy.from_dlpack(source)),
                                      np.arange(6.0).reshape(2, 3))
        shared = mg.from_dlpack(source, copy=False)
        shared -= 1.0  # one buffer: the producer sees the write
        mg.device("cuda:0").synchronize()
        np.testing.assert_array_equal(cupy.asnumpy(cupy.from_dlpack(source)),
                                      np.arange(6.0).reshape(2, 3) - 1)
        on_host = mg.from_dlpack(source, device="cpu")  # a move is a copy
        assert on_host.device.name == "cpu"
        np.testing.assert_array_equal(on_host.numpy(), np.arange(6.0).reshape(2, 3) - 1)


def _torch_cuda_arange():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.arange(6, dtype=torch.float64, device="cuda").reshape(2, 3)


def test_a_gpu_tensor_goes_to_torch_through_dlpack_on_the_gpu():
    source = _torch_cuda_arange()
    if source is None:
        pytest.skip("needs PyTorch with CUDA")
    import torch

    t = mg.tensor(np.arange(6.0).reshape(2, 3), device="cuda:0")
    view = torch.from_dlpack(t)
    assert view.device.type == "cuda"
    torch.testing.assert_close(view, source)


def test_save_and_load_a_gpu_state_dict(tmp_path):
    w = mg.tensor(np.arange(4.0), device="cuda:0")
    mg.save({"w": w, "b": mg.tensor(np.ones(2))}, tmp_path / "m.npz")
    back = mg.load(tmp_path / "m.npz")  # the file holds host arrays; cpu unless asked
    assert [t.device.name for t in back.values()] == ["cpu", "cpu"]
    np.testing.assert_array_equal(back["w"].numpy(), np.arange(4.0))
    on_gpu = mg.load(tmp_path / "m.npz", device="cuda:0")
    assert on_gpu["w"].device.name == "cuda:0"
    np.testing.assert_array_equal(on_gpu["w"].numpy(), np.arange(4.0))


# -- the CPU's last fixes, where CuPy's arrays could behave otherwise --------------------------

def test_backward_through_checkpoint_replays_its_recorded_program_on_the_gpu():
    """checkpoint's pullback replays a recorded program of f's backward; on cuda:0 every
    value must stay CuPy's, and the gradient of sum(tanh(W x)) is W^T (1 - tanh^2(W x))."""
    rng = np.random.default_rng(4)
    W, x = rng.normal(size=(3, 4)), rng.normal(size=4)
    Wt = mg.tensor(W, device="cuda:0")
    for _ in range(2):  # the first backward records the program, the second replays it
        v = mg.tensor(x, device="cuda:0", requires_grad=True)
        mg.sum(mg.checkpoint(lambda u: mg.tanh(Wt @ u))(v)).backward()
        assert v.grad.device.name == "cuda:0"
        np.testing.assert_allclose(v.grad.numpy(), W.T @ (1 - np.tanh(W @ x) ** 2),
                                   rtol=1e-12)


def test_item_assignment_on_the_gpu_writes_what_numpy_writes():
    a = np.arange(12.0).reshape(3, 4)
    t, want = mg.tensor(a, device="cuda:0"), a.copy()
    t[0, 1] = 7.0
    want[0, 1] = 7.0
    t[:, 2] = mg.tensor([1.0, 2.0, 3.0], device="cuda:0")
    want[:, 2] = [1.0, 2.0, 3.0]
    t[mg.tensor([2, 0], device="cuda:0")] = -1.0  # an index tensor on the GPU
    want[[2, 0]] = -1.0
    t[np.array([1]), 1:3] = 5.0
    want[np.array([1]), 1:3] = 5.0
    np.testing.assert_array_equal(t.numpy(), want)
    with pytest.raises(mg.errors.DeviceError, match="cuda:0.*cpu"):
        t[0] = mg.tensor(np.zeros(4))
    np.testing.assert_array_equal(t.numpy(), want)  # a refused write changed nothing


def test_a_1x1_matmul_on_the_gpu_keeps_ieees_nan():
    """0 * inf is NaN; NumPy's ndarray.dot skipped it next to a 1x1 matrix on the CPU."""
    for a, b in [([[0.0]], [[np.inf, 1.0]]), ([0.0], [[np.inf, 1.0]]),
                 ([[np.inf], [1.0]], [[0.0]])]:
        got = mg.tensor(a, device="cuda:0") @ mg.tensor(b, device="cuda:0")
        with np.errstate(invalid="ignore"):  # (NumPy warns of the NaN it makes)
            want = np.asarray(a) @ np.asarray(b)
        np.testing.assert_array_equal(got.numpy(), want)


def test_a_gpu_tensor_that_requires_a_gradient_is_not_shared_through_dlpack():
    import cupy

    t = mg.tensor(np.arange(3.0), device="cuda:0", requires_grad=True)
    with pytest.raises(BufferError, match="requires a gradient"):
        cupy.from_dlpack(t)
    shared = cupy.from_dlpack(t.detach())  # the same memory, cut from the tape
    shared += 1.0
    mg.device("cuda:0").synchronize()
    np.testing.assert_array_equal(t.detach().numpy(), np.arange(3.0) + 1)


def _scaled(x, s):
    return mg.sum(x * (s * 3.0))


def test_a_python_float_is_weak_on_the_gpu_in_every_compiled_mode():
    """The cast a weak float gets where it meets x (an astype node or line) runs on CuPy:
    float32 in, float32 out, as NumPy says for x * 1.5 on the host."""
    x = np.array([0.5, -1.25, 2.0], dtype=np.float32)
    want = np.sum(x * (0.5 * 3.0))
    t = mg.tensor(x, device="cuda:0")
    results = {"trace": mg.trace(_scaled)(t, 0.5)}
    for mode in ("graph", "source"):
        results[mode], g = mg.value_and_grad(_scaled, mode=mode)(t, 0.5)
        assert (g.dtype, g.device.name) == ("float32", "cuda:0"), mode
    for mode, v in results.items():
        assert (v.dtype, v.device.name) == ("float32", "cuda:0"), mode
        np.testing.assert_allclose(v.numpy(), want, rtol=1e-6, err_msg=mode)


# -- a tensor or array the caller hands a transformation, updated in place inside f ---------

def test_an_update_of_the_callers_gpu_tensor_is_written_or_refused_as_on_the_host():
    """``y += x`` on a cuda:0 tensor that is not differentiated: every transformation of
    test_inplace.REFUSED refuses it there too, and leaves y as it was; ``y += 1.0`` the
    tape writes into the caller's y once, as eager mode and torch.func.grad do (the
    closed form: y becomes [4, 5], and the gradient of sum(x * y) is that y)."""
    from test_inplace import REFUSED, adds_a_number_into_the_callers, adds_into_the_callers

    for name, (call, words) in REFUSED.items():
        y = mg.tensor([3.0, 4.0], device="cuda:0")
        error = mg.SourceTransformError if name.startswith("source") else GradientError
        with pytest.raises(error, match=words):
            call(adds_into_the_callers, mg.tensor([1.0, 2.0], device="cuda:0"), y)
        assert y.numpy().tolist() == [3.0, 4.0], name
    y = mg.tensor([3.0, 4.0], device="cuda:0")
    g = mg.grad(adds_a_number_into_the_callers)(mg.tensor([1.0, 2.0], device="cuda:0"), y)
    assert g.device.name == "cuda:0" and g.numpy().tolist() == [4.0, 5.0]
    assert y.numpy().tolist() == [4.0, 5.0]


def test_forward_mode_refuses_a_cupy_array_written_between_its_runs():
    """A CuPy array has no read-only flag: forward mode's second run read y + 1 (the
    gradient came out [4, 6], y written twice). It is compared with a copy after the
    runs: the write raises, and y holds its old values again."""
    import cupy

    from test_inplace import adds_a_number_into_the_callers

    y = cupy.asarray([3.0, 4.0])
    with pytest.raises(GradientError, match=r"its argument 1 \(cupy array of shape \(2,\)"):
        mg.grad(adds_a_number_into_the_callers, mode="forward")(
            mg.tensor([1.0, 2.0], device="cuda:0"), y)
    assert y.tolist() == [3.0, 4.0]


GPU_HALVED = []  # a module's list holding a CuPy array (set by the test)


def _halves_a_cupy_global(x):
    w = GPU_HALVED[0]
    w *= 0.5  # CuPy's own write: no read-only flag to refuse it
    return mg.sum(x * mg.tensor(w.get(), device="cuda:0"))


@pytest.mark.parametrize("mode", ["forward", "graph"])
def test_a_write_into_a_cupy_array_read_from_outside_is_refused(mode):
    """Forward mode ran f twice and halved the array twice (its gradient [1.5, 1.0],
    eager mode's [1.5, 2.0]); graph mode halved it once while recording, never again.
    The array is kept as a copy, compared after f returned, put back and refused."""
    import cupy

    x = mg.tensor([1.0, 2.0], device="cuda:0")
    GPU_HALVED[:] = [cupy.asarray([3.0, 4.0])]
    assert mg.grad(_halves_a_cupy_global)(x).numpy().tolist() == [1.5, 2.0]  # the oracle
    GPU_HALVED[:] = [cupy.asarray([3.0, 4.0])]
    with pytest.raises(GradientError, match=r"an item of GPU_HALVED, which it reads from "
                                            r"outside its arguments \(cupy array"):
        mg.grad(_halves_a_cupy_global, mode=mode)(x)
    assert GPU_HALVED[0].tolist() == [3.0, 4.0]


def _np_sum_of_its_list_and_itself(x):
    return np.sum(mg.sin(x) * x * mg.tensor(x.tolist(), device="cuda:0"))


@pytest.mark.parametrize("mode", ["tape", "forward", "graph"])
def test_numpys_sum_tolist_and_asarray_of_a_gpu_value_being_differentiated(mode):
    """np.sum(x) calls x.sum(axis=None, dtype=None, out=None); x.tolist() gives constants
    (PyTorch's convention); np.asarray(x) refuses as PyTorch's numpy() does. The oracle is
    PyTorch on the host."""
    import torch

    x0 = np.array([0.5, -2.0, 3.0])
    xt = torch.tensor(x0, requires_grad=True)
    torch.sum(torch.sin(xt) * xt * torch.tensor(x0)).backward()
    x = mg.tensor(x0, device="cuda:0")
    if mode == "graph":  # tolist of a graph node has no value to give: it refuses
        got = mg.grad(lambda x: np.sum(mg.sin(x) * x * mg.tensor(x0, device="cuda:0")),
                      mode=mode)(x)
    else:
        got = mg.grad(_np_sum_of_its_list_and_itself, mode=mode)(x)
    assert got.device.name == "cuda:0"
    np.testing.assert_allclose(got.numpy(), xt.grad.numpy(), rtol=1e-12)
    with pytest.raises(TracedValueError if mode == "graph" else GradientError,
                       match="np.asarray"):
        mg.grad(lambda x: mg.sum(x * mg.tensor(np.asarray(x), device="cuda:0")),
                mode=mode)(x)


@pytest.mark.parametrize("mode", ["graph", "source", "trace", "forward", "checkpoint"])
def test_a_write_into_a_gpu_tensor_read_from_outside_is_refused_before_it_is_made(mode):
    """A CuPy tensor's array has no read-only flag: its write was logged and refused after
    f returned, and the tensor kept the halved values. The tape now refuses the write
    before it is made, at the user's line (test_inplace.py does the same on
    array-api-strict's arrays), and a view of it too."""
    import test_inplace as T

    x = mg.tensor([0.5, 1.5], device="cuda:0")
    error = mg.autodiff.checkpoint.CheckpointError if mode == "checkpoint" else GradientError
    for f, name in [(T.halves_a_module_tensor, "HALVED_ONCE"),
                    (T.halves_a_module_tensor_through_a_view, "WEIGHTS")]:
        T.HALVED_ONCE = mg.tensor([0.7, -0.4], device="cuda:0")
        T.WEIGHTS = mg.tensor([1.0, 2.0], device="cuda:0")
        with pytest.raises(error, match=rf"f wrote into {name}, which it reads from outside "
                                        rf"its arguments \(a tensor of shape \(2,\) float64\), "
                                        rf"in place, .*line \d+"):
            T.run_once(f, mode)(x)
        assert T.HALVED_ONCE.tolist() == [0.7, -0.4] and T.WEIGHTS.tolist() == [1.0, 2.0]


GPU_SCALES = []  # a module's list holding a CuPy array (set by the test)


def _reads_gpu_scales(x):
    return mg.sum(x * mg.tensor(GPU_SCALES[0].get(), device="cuda:0"))


@pytest.mark.parametrize("mode", ["graph", "source"])
def test_a_cupy_array_written_between_calls_makes_the_program_stale(mode):
    """A compiled program keeps a copy of each array it read from outside and compares
    it on every call, on the GPU for CuPy's (test_trust.py does it with NumPy's)."""
    import cupy

    GPU_SCALES[:] = [cupy.asarray([1.0, 2.0])]
    g = mg.grad(_reads_gpu_scales, mode=mode)
    x = mg.tensor([3.0, 4.0], device="cuda:0")
    assert g(x).numpy().tolist() == [1.0, 2.0]
    GPU_SCALES[0][0] = 3.0
    assert g(x).numpy().tolist() == [3.0, 2.0]  # d/dx sum(x * s) = s
