"""Tensor behaviour: dtypes, conversions, operators, indexing, reductions."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import DTypeError, ShapeError


def test_dtype_defaults_follow_numpy(backend):
    assert mg.tensor(1.0).dtype == "float64"
    assert mg.tensor([1, 2]).dtype == "int64"
    assert mg.tensor([True]).dtype == "bool"
    assert mg.tensor(np.ones(2, np.float32)).dtype == "float32"
    assert mg.tensor([1, 2], dtype="float32").dtype == "float32"


def test_python_numbers_are_weak(backend):
    x = mg.tensor([1.0, 2.0], dtype="float32")
    assert (x * 2.0).dtype == "float32"
    assert (2 + x).dtype == "float32"
    assert (x + mg.tensor([1.0, 1.0])).dtype == "float64"  # two tensors promote


def test_float32_gradient_stays_float32():
    x = mg.tensor([1.0, 2.0], dtype="float32", requires_grad=True)
    (mg.sin(x) * 3.0).sum().backward()
    assert x.grad.dtype == "float32"
    np.testing.assert_allclose(x.grad.numpy(), 3 * np.cos([1.0, 2.0]), rtol=1e-6)


def test_conversions():
    x = mg.tensor([[1.0, 2.0]])
    assert isinstance(x.numpy(), np.ndarray)
    assert mg.tensor(3.5).item() == 3.5
    assert float(mg.tensor([2.0])) == 2.0
    assert len(x) == 1 and x.ndim == 2 and x.size == 2 and x.shape == (1, 2)
    with pytest.raises(ValueError, match="2 elements"):
        x.item()
    assert mg.tensor(x).numpy() is not x.numpy()  # tensor() copies


def test_repr_shows_dtype_device_and_grad():
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    assert repr(x) == "tensor([1., 2.], dtype=float64, device=cpu, requires_grad=True)"
    assert "grad_fn=<mul>" in repr(x * 2.0)
    assert repr(mg.tensor(3, device="cpu:1")) == "tensor(3, dtype=int64, device=cpu:1)"


def test_reflected_operators_and_unary_minus(backend):
    x = mg.tensor([1.0, 2.0])
    np.testing.assert_allclose((1.0 - x).numpy(), [0.0, -1.0])
    np.testing.assert_allclose((2.0 / x).numpy(), [2.0, 1.0])
    np.testing.assert_allclose((2.0 ** x).numpy(), [2.0, 4.0])
    np.testing.assert_allclose((-x).numpy(), [-1.0, -2.0])
    m = mg.tensor([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_allclose((m @ m).numpy(), m.numpy() @ m.numpy())
    np.testing.assert_allclose(m.T.numpy(), m.numpy().T)


def test_matmul_vectors_follow_numpy():
    a, v = np.arange(6.0).reshape(2, 3), np.array([1.0, -1.0, 2.0])
    np.testing.assert_allclose((mg.tensor(a) @ mg.tensor(v)).numpy(), a @ v)
    np.testing.assert_allclose((mg.tensor(v) @ mg.tensor(a.T)).numpy(), v @ a.T)
    assert (mg.tensor(v) @ mg.tensor(v)).shape == ()
    assert mg.gradcheck(lambda x, y: x @ y, [mg.tensor(a), mg.tensor(v)])
    assert mg.gradcheck(lambda x, y: x @ y, [mg.tensor(v), mg.tensor(v)])


def test_batched_matmul_gradient_sums_over_broadcast_batch():
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(4, 2, 3)), rng.normal(size=(3, 5))
    assert mg.gradcheck(lambda x, w: x @ w, [mg.tensor(x), mg.tensor(w)])


def test_comparisons_are_not_differentiable():
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    c = x > 1.5
    assert c.dtype == "bool" and not c.requires_grad
    np.testing.assert_array_equal(c.numpy(), [False, True])


def test_indexing_and_slicing_are_differentiable():
    x = np.arange(12.0).reshape(3, 4)
    for index in [(1,), (slice(0, 2), slice(1, None, 2)), (Ellipsis, 0), (None, 2, slice(None))]:
        got = mg.tensor(x)[index]
        np.testing.assert_array_equal(got.numpy(), x[index])
        assert mg.gradcheck(lambda t: t[index] * 2.0, [mg.tensor(x)])


def test_integer_array_indexing_adds_gradients_of_repeats():
    x = mg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x[mg.tensor([0, 2, 2])].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 0.0, 2.0])


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1), -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_match_numpy(axis, keepdims, backend):
    x = np.array([[0.3, -1.2, 0.9], [1.5, 0.1, -0.4]])
    for name in ["sum", "mean", "max", "min"]:
        got = getattr(mg.tensor(x), name)(axis=axis, keepdims=keepdims)
        np.testing.assert_allclose(got.numpy(), getattr(x, name)(axis=axis, keepdims=keepdims))
        assert mg.gradcheck(lambda t: getattr(t, name)(axis=axis, keepdims=keepdims),
                            [mg.tensor(x)])


def test_max_splits_the_gradient_between_ties():
    x = mg.tensor([1.0, 3.0, 3.0], requires_grad=True)
    x.max().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.5, 0.5])


@pytest.mark.parametrize("mode", ["tape", "forward", "graph", "source"])
def test_min_at_ties_and_minimum_away_from_them_follow_pytorch(mode):
    """mg.min shares the gradient between tied minima as torch.amin does (row 0 has a
    tie). mg.minimum is checked against torch.minimum away from ties here; at a tie both
    split the gradient evenly (the next test)."""
    torch = pytest.importorskip("torch")
    x0, y0 = np.array([[3.0, 1.0, 1.0], [2.0, 2.0, 5.0]]), np.array([0.5, 4.0, 1.5])
    xt = torch.tensor(x0, requires_grad=True)
    yt = torch.tensor(y0, requires_grad=True)
    (torch.amin(xt, dim=1).sum() * 2 + (torch.minimum(xt, yt) * xt).sum()).backward()

    def f(x, y):
        return mg.min(x, axis=1).sum() * 2 + (mg.minimum(x, y) * x).sum()

    gx, gy = mg.grad(f, argnums=(0, 1), mode=mode)(mg.tensor(x0), mg.tensor(y0))
    np.testing.assert_allclose(gx.numpy(), xt.grad.numpy(), rtol=1e-15)
    np.testing.assert_allclose(gy.numpy(), yt.grad.numpy(), rtol=1e-15)
    assert float(np.min(mg.tensor(x0))) == 1.0  # np.min calls the tensor's own min


def _sum_of_maximum(x, y):
    return mg.sum(mg.maximum(x, y))


def _sum_of_minimum(x, y):
    return mg.sum(mg.minimum(x, y))


@pytest.mark.parametrize("mode", ["tape", "forward", "graph", "source"])
def test_maximum_and_minimum_split_a_tie_evenly(mode):
    """At x == y, maximum and minimum are not differentiable; minigraph splits the
    derivative evenly between x and y, as torch.maximum, jax.numpy.maximum and its own
    mg.max do, in every mode, reverse and forward (it gave it all to x, TensorFlow's
    rule). Closed form: d/dx = d/dy = 1/2 at the ties, the plain derivative elsewhere."""
    x0, y0 = np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 5.0])  # a tie at index 0
    for f, want in [(_sum_of_maximum, [[0.5, 1.0, 0.0], [0.5, 0.0, 1.0]]),
                    (_sum_of_minimum, [[0.5, 0.0, 1.0], [0.5, 1.0, 0.0]])]:
        gx, gy = mg.grad(f, argnums=(0, 1), mode=mode)(mg.tensor(x0), mg.tensor(y0))
        assert gx.numpy().tolist() == want[0] and gy.numpy().tolist() == want[1]


def _sqrt_of_relu(x):
    return mg.sum(mg.sqrt(mg.relu(x)))


def _sqrt_of_maximum(x):
    return mg.sum(mg.sqrt(mg.maximum(x, 0.0)))


def _sqrt_of_minus_minimum(x):
    return mg.sum(mg.sqrt(-mg.minimum(x, 0.0)))


@pytest.mark.parametrize("mode", ["tape", "graph", "source", "forward"])
def test_what_relu_maximum_and_minimum_do_not_select_gets_zero_even_from_inf(mode):
    """sqrt's derivative at 0 is inf, and relu's, maximum's and minimum's VJPs
    multiplied g by a 0/1 mask: 0 * inf gave nan at x = -1 (or 4), where the function is
    constant nearby and its derivative 0, as PyTorch and finite differences say. A
    nan argument gives both arguments the gradient, as PyTorch does. (Forward mode
    meets the same inf the other way round, relu's zero tangent times sqrt's inf; a
    zero tangent now stays zero there, where torch.func.jacfwd gives nan.)"""
    torch = pytest.importorskip("torch")
    x0 = np.array([-1.0, 4.0, 0.25])
    fns = [(_sqrt_of_relu, lambda t: torch.sqrt(torch.relu(t)).sum()),
           (_sqrt_of_maximum, lambda t: torch.sqrt(torch.maximum(t, torch.zeros(()))).sum()),
           (_sqrt_of_minus_minimum,
            lambda t: torch.sqrt(-torch.minimum(t, torch.zeros((), dtype=t.dtype))).sum())]
    for f, f_torch in fns:
        xt = torch.tensor(x0, requires_grad=True)
        f_torch(xt).backward()
        g = mg.grad(f, mode=mode)(mg.tensor(x0))
        np.testing.assert_array_equal(g.numpy(), xt.grad.numpy(), err_msg=f.__name__)
        assert np.isfinite(g.numpy()).all()
    gx, gy = mg.grad(_sum_of_maximum, argnums=(0, 1), mode=mode)(
        mg.tensor([1.0, np.nan]), mg.tensor([np.nan, 2.0]))
    assert gx.tolist() == [1.0, 1.0] and gy.tolist() == [1.0, 1.0]  # torch's, at nan
    for dtype in ("float64", "float32"):  # (a 0-d float64 g is an np.float64: a float)
        assert mg.grad(_sqrt_of_relu, mode=mode)(mg.tensor(-1.0, dtype=dtype)).item() == 0.0


def _scaled_relu(x, s):
    return mg.sum(mg.relu(x)) * s


def _relu(x):
    return mg.relu(x)


@pytest.mark.parametrize("mode", ["tape", "graph", "source"])
def test_relu_passes_an_inf_or_nan_adjoint_where_its_input_is_positive(mode):
    """A compiled program lets relu's VJP write into relu's own output, its last reader;
    the kernel read y > 0 again after the write had put g there, and an inf or nan
    adjoint came back as zeros (a nan loss gave zero gradients, hiding the divergence).
    Oracles: PyTorch, and the closed form g where x > 0, else 0."""
    torch = pytest.importorskip("torch")
    x0 = np.array([1.0, 2.0, -1.0, 3.0])
    got = mg.grad(_scaled_relu, mode=mode)(mg.tensor(x0), -np.inf)
    xt = torch.tensor(x0, requires_grad=True)
    (torch.relu(xt).sum() * -np.inf).backward()
    np.testing.assert_array_equal(got.numpy(), xt.grad.numpy())
    assert got.tolist() == [-np.inf, -np.inf, 0.0, -np.inf]
    g0 = np.array([-np.inf, -5.0, 7.0, np.nan])
    (gx,) = mg.vjp(_relu, mg.tensor(x0), mode=mode)[1](mg.tensor(g0))
    np.testing.assert_array_equal(gx.numpy(), np.where(x0 > 0, g0, 0.0))


def test_relu_and_pow_keep_numpys_dtypes_for_bools():
    """relu of a 0-d bool made by an op (an np.bool_) gave int64, where NumPy and a bool
    array give bool: its zero was the Python 0. True ** b (a bool tensor) gave int8, a
    dtype minigraph does not have, where b ** True was refused; both are refused now."""
    assert mg.relu(mg.tensor(np.float32(2.0)) < 3).dtype == "bool"
    assert mg.relu(mg.tensor([2.0]) < 3).dtype == "bool"
    b = mg.tensor([True, False])
    for power in (lambda: True ** b, lambda: b ** True, lambda: b ** b):
        with pytest.raises(mg.errors.DTypeError, match="a bool to a bool power"):
            power()
    assert (b ** 2).tolist() == [1, 0] and (2 ** b).tolist() == [2, 1]  # int64, as NumPy


def test_reshape_with_minus_one():
    x = mg.tensor(np.arange(6.0))
    assert x.reshape(2, -1).shape == (2, 3)
    assert x.reshape((-1,)).shape == (6,)


def test_gradient_accumulates_where_a_value_is_used_twice():
    x = mg.tensor(3.0, requires_grad=True)
    (x * x + x).backward()  # 2x + 1
    assert x.grad.item() == 7.0
    (x * 2.0).backward()  # .grad accumulates across calls, as in PyTorch
    assert x.grad.item() == 9.0


def test_no_grad_records_nothing():
    x = mg.tensor(1.0, requires_grad=True)
    with mg.no_grad():
        y = x * 2.0
        with mg.enable_grad():
            w = x * 2.0
    assert not y.requires_grad and y.is_leaf
    assert w.requires_grad
    assert mg.is_grad_enabled()


def test_detach_and_stop_gradient_cut_the_tape():
    x = mg.tensor(2.0, requires_grad=True)
    assert mg.grad(lambda x: x * x.detach())(x).item() == 2.0
    assert mg.grad(lambda x: x * mg.stop_gradient(x))(2.0).item() == 2.0


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(TypeError, match="int64"):
        mg.tensor([1, 2], requires_grad=True)
    with pytest.raises(TypeError, match="2.0 rather than 2"):
        mg.grad(mg.sin)(2)


def test_nested_grad_does_not_confuse_perturbations():
    # d/dx [x * d/dy (x * y)] = d/dx [x * x] = 2x: the inner derivative is w.r.t. y only.
    def f(x):
        return x * mg.grad(lambda y: x * y)(x)
    assert mg.grad(f)(3.0).item() == 6.0
    assert mg.grad(f, mode="forward")(3.0).item() == 6.0


def test_vjp_and_jacobians_agree():
    rng = np.random.default_rng(2)
    a = rng.normal(size=(3, 2))

    def f(x):
        return mg.tanh(mg.tensor(a) @ x)

    x = rng.normal(size=2)
    jf, jr = mg.jacfwd(f)(x), mg.jacrev(f)(x)
    expected = (1 - np.tanh(a @ x) ** 2)[:, None] * a
    np.testing.assert_allclose(jf.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(jr.numpy(), expected, rtol=1e-12)
    out, vjp_fn = mg.vjp(f, x)
    (gx,) = vjp_fn(np.array([1.0, 0.0, 2.0]))
    np.testing.assert_allclose(gx.numpy(), expected.T @ [1.0, 0.0, 2.0], rtol=1e-12)


def test_value_and_grad_returns_both():
    v, (gx, gy) = mg.value_and_grad(lambda x, y: x * y, argnums=(0, 1))(2.0, 5.0)
    assert (v.item(), gx.item(), gy.item()) == (10.0, 5.0, 2.0)
    v, g = mg.value_and_grad(lambda x, y: x * y, argnums=1, mode="forward")(2.0, 5.0)
    assert (v.item(), g.item()) == (10.0, 2.0)


def test_grad_of_an_unused_argument_is_zero():
    assert mg.grad(lambda x, y: x * 2.0, argnums=1)(1.0, 4.0).item() == 0.0


def test_numpy_operands_on_the_left_keep_the_tape():
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    x = mg.tensor([1.0, -1.0], requires_grad=True)
    y = (a @ x).sum() + (np.float64(2.0) * x).sum()  # NumPy scalars and arrays on the left
    assert isinstance(y, mg.Tensor)
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), a.sum(axis=0) + 2.0)


# -- the eager fast paths keep their meaning (issue 20) ------------------------------------

@pytest.mark.parametrize("name", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axis,keepdims", [(None, False), (None, True), ((0,), False),
                                           ((1,), True), ((0, 1), False)])
def test_reduction_kernel_given_the_dict_is_the_kernel(name, axis, keepdims):
    """``Primitive.impl_with`` (the eager interpreter's call) gives the bits ``impl`` gives."""
    from minigraph.ops.primitive import PRIMITIVES

    prim = PRIMITIVES[name]
    a = np.arange(6.0).reshape(2, 3) - 2.5
    params = {"axis": axis, "keepdims": keepdims}
    got = prim.impl_with(np, a, params)
    want = prim.impl(np, a, **params)
    assert np.shape(got) == np.shape(want) and np.array_equal(got, want)
    np.testing.assert_array_equal(got, getattr(np, name)(a, axis=axis, keepdims=keepdims))


def test_shared_parameter_dicts_stay_empty_and_unwritten():
    """Entries without parameters share one dict, reductions over every axis another:
    recording, sweeping, releasing and higher-order sweeps never write into them."""
    from minigraph.autodiff import tape
    from minigraph.errors import GradientError
    from minigraph.ops import reduce as R

    x = mg.tensor([0.5, -1.0, 2.0], requires_grad=True)
    y = (x * x + mg.sin(x)).sum()
    (gx,) = [g for _, g in tape.sweep([y], [mg.tensor(1.0)], create_graph=True)[0]]
    gx.sum().backward()
    y.backward()
    assert tape.NO_PARAMS == {}
    assert R._ALL_AXES == {"axis": None, "keepdims": False}
    with pytest.raises(GradientError, match="released"):
        y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy() + np.cos(x.numpy())
                               + 2 - np.sin(x.numpy()))


def test_no_grad_blocks_in_threads_keep_their_own_mode():
    """Recording is per thread; the count of open no_grad blocks (a list, no lock) comes
    back to zero when every thread has left its blocks."""
    import threading

    from minigraph.autodiff import tape

    x = mg.tensor(1.0, requires_grad=True)
    seen = []
    start = threading.Barrier(4)

    def work(off: bool) -> None:
        start.wait()
        for _ in range(200):
            if off:
                with mg.no_grad():
                    seen.append(("off", (x * 2.0).requires_grad))
            else:
                seen.append(("on", (x * 2.0).requires_grad))

    threads = [threading.Thread(target=work, args=(k % 2 == 0,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(recorded == (mode == "on") for mode, recorded in seen)
    assert tape._blocks_off == [] and mg.is_grad_enabled()


def test_one_grad_mode_object_entered_twice_restores_each_entry():
    """A no_grad/enable_grad object may be reused, nested or in two threads at once: each
    exit restores what its own entry found (the saved modes are the thread's, not the
    object's). Closed form: recording is on again after the outer block."""
    import threading

    x = mg.tensor(1.0, requires_grad=True)
    off, on = mg.no_grad(), mg.enable_grad()
    with off:
        with on:
            with off:
                assert not (x * 2.0).requires_grad
            assert (x * 2.0).requires_grad  # back to enable_grad's mode
            with on:
                pass
            assert (x * 2.0).requires_grad
        assert not (x * 2.0).requires_grad
        with off:  # the same object, nested in itself
            pass
        assert not (x * 2.0).requires_grad
    assert (x * 2.0).requires_grad and mg.is_grad_enabled()

    inside, leave = threading.Barrier(2), threading.Barrier(2)
    seen = []

    def work() -> None:
        with off:  # both threads hold the same object open at once
            inside.wait()
            seen.append((x * 2.0).requires_grad)
            leave.wait()
        seen.append((x * 2.0).requires_grad)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == [False, False, True, True] and mg.is_grad_enabled()


def test_backward_and_in_place_find_the_tape_module():
    x = mg.tensor(3.0, requires_grad=True)
    (x * x).backward()
    assert x.grad.item() == 6.0
    with mg.no_grad():
        x -= 1.0
    assert x.item() == 2.0


def test_vjp_hands_back_arrays_apart_from_the_callers_cotangent():
    """The gradient of x + 0.0 is the cotangent itself: vjp_fn copies it, as backward()
    does with its ``grad``, so writing into one leaves the other alone."""
    for cotangent in (mg.tensor([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0])):
        _, vjp_fn = mg.vjp(lambda t: t + 0.0, mg.tensor(np.ones(3)))
        (gx,) = vjp_fn(cotangent)
        np.testing.assert_array_equal(gx.numpy(), [1.0, 2.0, 3.0])
        gx.data[0] = 9.0
        np.testing.assert_array_equal(np.asarray(getattr(cotangent, "data", cotangent)),
                                      [1.0, 2.0, 3.0])


@pytest.mark.parametrize("dtype", ["float16", "int8", "complex128", np.uint8])
def test_astype_refuses_a_dtype_tensor_refuses(dtype):
    """astype made float16, int8 and complex128 tensors that no kernel, device or rule
    knows (in a graph, a KeyError when the graph ran); it refuses them as tensor() does."""
    x = mg.tensor([1.0, 2.0])
    with pytest.raises(DTypeError, match="astype: dtype .* is not supported; use one of "
                                         "float32, float64, int64, int32, bool"):
        x.astype(dtype)
    with mg.Graph(), pytest.raises(DTypeError, match="is not supported"):
        mg.placeholder((2,)).astype(dtype)
    with pytest.raises(DTypeError, match="tensor\\(\\): dtype .* is not supported"):
        mg.tensor(np.ones(2), dtype=dtype)


def test_a_dtype_may_be_numpys_as_numpy_users_write_it():
    x = mg.tensor([1.5, 2.5])
    assert x.astype(np.float32).dtype == "float32"
    assert x.astype(np.dtype("int32")).numpy().tolist() == [1, 2]
    assert mg.tensor([1, 2], dtype=np.float64).dtype == "float64"


def test_every_op_that_takes_a_dtype_refuses_one_minigraph_does_not_compute_in():
    labels = mg.tensor([0, 2])
    with pytest.raises(DTypeError, match="one_hot: dtype float16 is not supported"):
        mg.one_hot(labels, 3, "float16")
    with pytest.raises(DTypeError, match="nll_loss_grad: dtype int8 is not supported"):
        mg.nll_loss_grad(mg.tensor(1.0), labels, 3, "int8")
    with pytest.raises(ValueError, match="num_classes must be an int >= 0, got -1"):
        mg.one_hot(labels, -1)
    with pytest.raises(ValueError, match="nll_loss_grad: num_classes must be an int >= 0, got -3"):
        mg.nll_loss_grad(mg.tensor(1.0), labels, -3)
    with pytest.raises(ValueError, match="one_hot: num_classes must be an int >= 0, got True"):
        mg.one_hot(labels, True)
    assert mg.one_hot(labels, np.int64(3), np.float32).numpy().tolist() == \
        [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]


def test_assigning_a_gradient_checks_it_as_pytorch_does():
    """A .grad of another shape, dtype or device was taken as it was: the next backward()
    failed halfway (after using up the tape), or a float32 leaf's gradient became float64."""
    x = mg.tensor(np.ones(3, np.float32), requires_grad=True)
    for bad, what in [(mg.tensor(np.ones(4, np.float32)), r"shape \(4,\) float32"),
                      (mg.tensor(np.ones(3)), r"shape \(3,\) float64"),
                      (mg.tensor(np.ones(3, np.float32), device="cpu:1"), r"shape \(3,\) float32 on cpu:1")]:
        with pytest.raises(mg.errors.GradientError, match=f"cannot assign a gradient of {what}"):
            x.grad = bad
    with pytest.raises(TypeError, match="a Tensor or None, got ndarray"):
        x.grad = np.ones(3, np.float32)
    assert x.grad is None
    x.grad = mg.tensor(np.ones(3, np.float32))  # what fits is taken, as it is
    (x * 2.0).sum().backward()
    assert x.grad.dtype == "float32" and x.grad.numpy().tolist() == [3.0, 3.0, 3.0]
    x.grad = None
    assert x.grad is None


def test_a_backward_that_fails_changes_no_gradient_and_keeps_the_tape(monkeypatch):
    """Gradients were set leaf by leaf and the tape released before they were: a failure
    in the second leaf's accumulation left the first leaf's .grad added to, and the tape
    gone, so backward() could not be run again."""
    from minigraph.autodiff import tape

    x = mg.tensor(np.ones(3), requires_grad=True)
    y = mg.tensor(np.ones(3), requires_grad=True)
    z = (x * 2.0 + y * 3.0).sum()
    x.grad, y.grad = mg.tensor(np.ones(3)), mg.tensor(np.ones(3))
    calls = []
    real = tape._own

    def fail_on_second(g, handed):  # the second leaf's gradient cannot be handed out
        calls.append(g)
        if len(calls) == 2:
            raise MemoryError("injected")
        return real(g, handed)

    monkeypatch.setattr(tape, "_own", fail_on_second)
    with pytest.raises(MemoryError, match="injected"):
        z.backward()
    assert x.grad.numpy().tolist() == y.grad.numpy().tolist() == [1.0, 1.0, 1.0]
    monkeypatch.setattr(tape, "_own", real)
    z.backward()  # the tape is still there
    assert x.grad.numpy().tolist() == [3.0] * 3 and y.grad.numpy().tolist() == [4.0] * 3


@pytest.mark.parametrize("call", [lambda: mg.Tensor([1.0, 2.0]), lambda: mg.Tensor(np.ones(2)),
                                  lambda: mg.Tensor(np.ones(2), "cpu")])
def test_mg_Tensor_called_as_torch_Tensor_points_to_mg_tensor(call):
    """torch.Tensor([1.0, 2.0]) makes a tensor; mg.Tensor is the library's wrapper of an
    array already on a Device, and said "missing 1 required positional argument: 'device'"
    or "'str' object has no attribute 'live_bytes'"."""
    gc.collect()  # (an earlier test's garbage, collected during the call, would count)
    before = mg.get_device("cpu").live_bytes
    with pytest.raises(TypeError, match=r"^Tensor\(.*\): .*make a tensor with mg\.tensor\("):
        call()
    assert mg.get_device("cpu").live_bytes == before  # nothing counted for it


# -- nested lists are arrays, in every op ---------------------------------------------------------
# The eager interpreter turns a list into a tensor when the kernel runs; the op's front
# function read its shape first, as a number's (), so mg.sum(L, axis=0) gave L back
# unsummed, mg.max(L, axis=-1) too, and matmul recursed without end. NumPy is the oracle.
_L = [[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]]
_LIST_CASES = {
    "sum axis 0": (lambda L: mg.sum(L, axis=0), lambda A: A.sum(axis=0)),
    "max axis -1": (lambda L: mg.max(L, axis=-1), lambda A: A.max(axis=-1)),
    "mean axis 1": (lambda L: mg.mean(L, axis=1), lambda A: A.mean(axis=1)),
    "sum_to": (lambda L: mg.sum_to(L, (3,)), lambda A: A.sum(axis=0)),
    "softmax": (lambda L: mg.softmax(L, axis=1),
                lambda A: np.exp(A) / np.exp(A).sum(1, keepdims=True)),
    "reshape -1": (lambda L: mg.reshape(L, (3, -1)), lambda A: A.reshape(3, -1)),
    "transpose": (lambda L: mg.transpose(L), lambda A: A.T),
    "stack": (lambda L: mg.stack([L[0], L[1]], axis=1), lambda A: np.stack([A[0], A[1]], 1)),
    "concatenate": (lambda L: mg.concatenate([L[0], L[1]]), lambda A: A.reshape(-1)),
    "matmul": (lambda L: mg.matmul(L, [[1.0], [2.0], [3.0]]), lambda A: A @ [[1.0], [2.0], [3.0]]),
    "matmul vectors": (lambda L: mg.matmul(L[0], L[1]), lambda A: A[0] @ A[1]),
    "astype": (lambda L: mg.astype(L, "float32"), lambda A: A.astype("float32")),
    "cross_entropy": (lambda L: mg.cross_entropy(L, [2, 0]),
                      lambda A: -(A - np.log(np.exp(A).sum(1, keepdims=True)))[[0, 1], [2, 0]]
                      .mean()),
}


@pytest.mark.parametrize("name", sorted(_LIST_CASES))
def test_an_op_given_nested_lists_computes_what_numpy_computes(name):
    op, numpy_op = _LIST_CASES[name]
    got, want = op(_L), np.asarray(numpy_op(np.array(_L)))
    assert (got.shape, got.dtype) == (want.shape, want.dtype.name)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_gradients_through_ops_that_read_a_list_s_shape():
    """d/dx sum(max(x * L, axis=-1)) with L a list: the max's axis is L's, not a number's;
    in graph mode matmul read the list's shape as () and refused it."""
    A = np.array(_L)
    x = np.array([[0.5], [2.0]])
    for mode in ("tape", "forward", "graph"):
        g = mg.grad(lambda x: mg.sum(mg.max(x * _L, axis=-1)), mode=mode)(x)
        # the max of each row of x * A is x * (the max of A's row, as x > 0)
        np.testing.assert_allclose(g.numpy(), A.max(axis=1, keepdims=True), rtol=1e-12,
                                   err_msg=mode)
        # x.T @ L: a graph node (or tensor) times a matrix given as a list
        g = mg.grad(lambda x: mg.sum(mg.matmul(mg.transpose(x), _L)), mode=mode)(x)
        np.testing.assert_allclose(g.numpy(), A.sum(axis=1, keepdims=True), rtol=1e-12,
                                   err_msg=mode)


def test_a_one_element_tensor_formats_its_number_as_pytorch_s_does():
    """print(f"loss {loss:.4f}") in a training loop raised "unsupported format string"."""
    torch = pytest.importorskip("torch")
    for value in (3.14159, -2.5e-7, 12):
        for spec in (".2f", ".3e", "8.3f", "", "g"):
            ours = format(mg.tensor(value), spec)
            if spec:
                assert ours == format(torch.tensor(value), spec) == format(value, spec)
            else:  # no spec: the tensor's text, as print shows it
                assert ours == str(mg.tensor(value))
    assert f"{mg.tensor([[7]]):d}" == "7"
    with pytest.raises(TypeError, match=r"format spec '\.2f'.*2 elements \(shape \(2,\)\)"):
        f"{mg.tensor([1.0, 2.0]):.2f}"


def test_an_integer_tensor_is_an_index_and_a_float_one_is_not():
    assert list(range(mg.tensor(3))) == [0, 1, 2] and "abc"[mg.tensor(1, dtype="int32")] == "b"
    with pytest.raises(TypeError, match="only an integer tensor can be an index; this one is "
                                        "float64"):
        range(mg.tensor(3.0))


def test_iteration_goes_over_the_first_axis_and_refuses_a_0d_tensor_as_numpy_does():
    """A 0-d tensor iterated as empty: list(t) == [], sum(t) == 0, np.zeros(t) had shape ()."""
    for a in (np.arange(3.0), np.arange(6.0).reshape(2, 3), np.zeros((0, 2))):
        rows = list(mg.tensor(a))
        assert len(rows) == len(a) == len(mg.tensor(a))
        for row, want in zip(rows, a, strict=True):
            np.testing.assert_array_equal(row.numpy(), want)
    assert float(sum(mg.tensor([1.5, 2.0, 4.0]))) == sum(np.array([1.5, 2.0, 4.0]))
    assert np.zeros(mg.tensor(3)).shape == np.zeros(np.array(3)).shape == (3,)
    batch = np.arange(6.0).reshape(2, 3)  # under vmap, each example's rows
    np.testing.assert_array_equal(mg.vmap(lambda r: sum(r))(batch).numpy(), batch.sum(axis=1))
    for zero_d in (mg.tensor(3.0), mg.tensor(3)):
        with pytest.raises(TypeError):
            iter(np.asarray(zero_d))  # the oracle refuses too
        with pytest.raises(TypeError, match=r"^iteration over a 0-d tensor.*x\.item\(\)"):
            list(zero_d)
        with pytest.raises(TypeError, match="0-d tensor"):
            sum(zero_d)
        with pytest.raises(TypeError, match=r"^len\(\) of a 0-d tensor"):
            len(zero_d)
    with mg.Graph():
        with pytest.raises(TypeError, match=r"^iteration over a 0-d graph node"):
            list(mg.placeholder((), name="y"))
        unknown = mg.placeholder(None, name="any") * 2.0  # a shape known only at run time
        for ask in (len, list):
            with pytest.raises(TypeError, match="whose shape is known only when the graph "
                                                "runs: give its placeholder a shape"):
                ask(unknown)
    with pytest.raises(TypeError, match=r"^len\(\) of a 0-d vmap example"):
        mg.vmap(len)(np.ones(3))
    assert mg.vmap(lambda r: len(r) * r.sum())(np.ones((2, 3))).tolist() == [9.0, 9.0]


def test_in_asks_whether_some_element_equals_the_value_as_numpy_does():
    for a in (np.array(5.0), np.array([1.0, 2.0]), np.arange(6).reshape(2, 3)):
        for v in (5.0, 2, 7, np.array([3, 4, 5]), mg.tensor(2.0)):
            try:
                want = (np.asarray(v) if isinstance(v, mg.Tensor) else v) in a
            except ValueError:  # shapes that do not broadcast: both refuse
                with pytest.raises(ValueError):
                    v in mg.tensor(a)
                continue
            assert (v in mg.tensor(a)) == want, (a, v)


@pytest.mark.parametrize("mode", ["tape", "forward", "graph", "source"])
def test_python_s_sum_over_a_vector_differentiates_in_every_mode(mode):
    """sum() and unpacking iterate: the rows are indexing primitives, so gradients flow."""
    def f(x):
        a, b, c = x
        return sum(x) + a * c  # noqa: the builtin on purpose
    x = np.array([0.5, -1.0, 2.0])
    got = mg.grad(f, mode=mode)(x)
    np.testing.assert_allclose(got.numpy(), [1.0 + x[2], 1.0, 1.0 + x[0]], rtol=1e-12)
    def total(s):
        return sum(s)  # noqa: the builtin on purpose
    with pytest.raises(TypeError, match="iteration over a 0-d"):
        mg.grad(total, mode=mode)(2.0)


def test_bool_of_several_elements_is_ambiguous_and_says_bool():
    with pytest.raises(ValueError, match=r"^bool\(\) of a tensor of 2 elements .*ambiguous"):
        bool(mg.tensor([1.0, 2.0]))
    assert bool(mg.tensor([[0.5]])) and not bool(mg.tensor(0.0))


@pytest.mark.parametrize("make", [mg.zeros, mg.ones])
def test_zeros_and_ones_take_shapes_as_numpy_does(make):
    for shape in (3, (2, np.int64(3)), [2, 2], ()):
        want = np.zeros(shape) if make is mg.zeros else np.ones(shape)
        np.testing.assert_array_equal(make(shape).numpy(), want)
    for bad in (2.0, None, (2, 1.5)):
        with pytest.raises(TypeError, match=f"^{make.__name__}: "):
            make(bad)
    with pytest.raises(ShapeError, match=f"^{make.__name__}: a size must be >= 0"):
        make((-1, 2))


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "bool"])
def test_astype_to_the_same_dtype_is_a_new_tensor_as_numpy_s(dtype):
    """astype returned x itself when the dtype was already right, so an in-place update
    of the converted tensor changed x; NumPy's astype and the Array API's copy."""
    a = np.array([1, 0, 2]).astype(dtype)
    for x in (mg.tensor(a), mg.tensor(a)):
        converted = [mg.astype(x, dtype), x.astype(dtype)]
        for c in converted:
            assert c is not x and not np.shares_memory(c.numpy(), x.numpy())
            np.testing.assert_array_equal(c.numpy(), a)
        assert mg.astype(x, dtype, copy=False) is x
    if dtype.startswith("float"):
        w = mg.tensor(a, requires_grad=True)
        with mg.no_grad():
            moved = w.astype(dtype)
            moved -= 1.0
        np.testing.assert_array_equal(w.numpy(), a)  # the parameter is as it was
        g = mg.grad(lambda v: mg.sum(v.astype(dtype) * 3.0))(mg.tensor(a))
        np.testing.assert_array_equal(g.numpy(), np.full(3, 3.0, dtype))


def test_create_graph_keeps_every_gradient_on_the_tape():
    """backward(create_graph=True) copied a gradient whose memory another gradient shared
    (add hands a and b one adjoint) into a tensor off the tape: a gradient penalty on it
    got half its value. Oracles: PyTorch, and the closed form 72 (a + b)^3."""
    torch = pytest.importorskip("torch")
    a, b = mg.tensor([1.0, 2.0], requires_grad=True), mg.tensor([3.0, 4.0], requires_grad=True)
    ((a + b) ** 3).sum().backward(create_graph=True)
    assert a.grad.requires_grad and b.grad.requires_grad
    penalty = (a.grad * a.grad).sum() + (b.grad * b.grad).sum()
    a.grad = b.grad = None
    penalty.backward()
    at, bt = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in ([1.0, 2.0],
                                                                                 [3.0, 4.0]))
    ((at + bt) ** 3).sum().backward(create_graph=True)
    p = (at.grad ** 2).sum() + (bt.grad ** 2).sum()
    at.grad = bt.grad = None
    p.backward()
    np.testing.assert_allclose(a.grad.numpy(), at.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), 72 * np.array([4.0, 6.0]) ** 3, rtol=1e-12)


def test_two_threads_accumulate_into_one_leaf_without_losing_a_share():
    """Each backward() read .grad and wrote the sum later, unlocked: two threads lost
    updates (117,651 of 120,000 in a probe). The count is the closed form."""
    import sys
    import threading

    x = mg.tensor([1.0], requires_grad=True)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (threads switch often: a lost update shows quickly)
    try:
        def work():
            for _ in range(2000):
                (x * 3.0).sum().backward()
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert x.grad.item() == 2 * 2000 * 3.0


def test_requires_grad_is_checked_when_it_is_set():
    """requires_grad was a plain attribute: an int tensor could require a gradient (d(2.5
    t)/dt came out as the int 2), and switching it off on a recorded result cut the
    gradient through it silently ([2, 4] for the closed form 4x = [4, 8]). PyTorch
    refuses both."""
    t = mg.tensor([1, 2])
    with pytest.raises(mg.errors.DTypeError, match="only floating-point tensors"):
        t.requires_grad = True
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    for switch_off in (lambda: setattr(y, "requires_grad", False),
                       lambda: y.requires_grad_(False)):
        with pytest.raises(mg.errors.GradientError, match="only a leaf tensor's flag"):
            switch_off()
    (y * x).sum().backward()
    assert x.grad.tolist() == [4.0, 8.0]
    x.requires_grad = False  # a leaf's flag changes
    assert not (x * 2).requires_grad


def test_a_seed_of_another_dtype_is_cast_to_the_outputs():
    """A float32 seed of a float64 output ran the sweep in float32: 1e40 overflowed to inf
    and 1.1 came back as 1.10000002. PyTorch's engine casts the seed."""
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    (x * 1e40).backward(mg.tensor(np.ones(2, np.float32)))
    assert x.grad.tolist() == [1e40, 1e40] and x.grad.dtype == "float64"


def _constants(x):
    yield x * x


def test_no_grad_refuses_to_decorate_a_generator_and_keeps_a_functions_name():
    """@mg.no_grad() on a generator function switched recording off only while the
    generator was made: its body ran recorded. (PyTorch wraps each resumption; refusing
    is the smaller rule.) The wrapper of a plain function lost its name and docstring."""
    with pytest.raises(TypeError, match="generator function _constants"):
        mg.no_grad()(_constants)

    @mg.no_grad()
    def scaled(v):
        """Doubles v."""
        return v * 2.0
    assert scaled.__name__ == "scaled" and scaled.__doc__ == "Doubles v."
    assert not scaled(mg.tensor(1.0, requires_grad=True)).requires_grad


def test_a_recorded_update_with_a_numpy_scalar_keeps_the_rule_of_updates():
    """y += np.float64(1) on a recorded float32 y made y float64 (the scalar was weak for
    the check and strong for the computation); without recording the same update is
    refused, as chapter 01's rule says (an update keeps the dtype)."""
    x = mg.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    y = x * 2
    with pytest.raises(mg.errors.DTypeError, match="keeps the tensor's dtype float32"):
        y += np.float64(1.0)
    z = mg.tensor(np.array([1.0, 2.0], np.float32))
    with pytest.raises(mg.errors.DTypeError, match="keeps the tensor's dtype float32"):
        z += np.float64(1.0)
    y += 1.0  # a Python float is weak: float32 stays
    assert y.dtype == "float32"


def test_detach_of_a_reductions_result_shares_its_value():
    """A reduction's 0-d result holds a NumPy scalar; detach() shared the scalar and a
    write into the detached tensor replaced it, leaving the original at 6 where PyTorch
    (and a NumPy 0-d view) gives 7. The write is then seen by backward, as PyTorch's
    version counter sees it."""
    t = mg.tensor([1.0, 2.0], requires_grad=True)
    s = (t * 2).sum()
    y = s * s
    d = s.detach()
    d += 1.0
    assert s.item() == 7.0 and d.item() == 7.0
    with pytest.raises(mg.errors.GradientError, match="changed in place afterwards"):
        y.backward()


def test_comparing_with_none_is_false_as_in_pytorch():
    """x == None raised a DTypeError naming tensor(); `x in [None]` and list.index with a
    None before x failed with it. PyTorch answers False."""
    x = mg.tensor([1.0, 2.0])
    assert (x == None) is False and (x != None) is True  # noqa: E711
    assert x not in [None] and [None, x].index(x) == 1


def test_a_tensor_is_not_its_own_gradient():
    """x.grad = x was accepted: the next backward() added into x itself. PyTorch
    refuses it."""
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(mg.errors.GradientError, match="its own gradient"):
        x.grad = x
    x.grad = x.detach() * 1.0  # a copy is a gradient
    (x * 3.0).sum().backward()
    assert x.grad.tolist() == [4.0, 5.0] and x.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("mode", ["tape", "forward", "graph", "source"])
def test_relu_at_a_nan_input_passes_the_gradient_as_pytorch_and_maximum_do(mode):
    """relu's gradient masked by y > 0, which is False at NaN: 0 there, where PyTorch's
    relu and minigraph's own maximum(x, 0) give 1."""
    torch = pytest.importorskip("torch")
    x0 = np.array([np.nan, -1.0, 2.0, 0.0])
    xt = torch.tensor(x0, requires_grad=True)
    torch.relu(xt).sum().backward()
    got = mg.grad(_sum_of_relu, mode=mode)(mg.tensor(x0))
    np.testing.assert_array_equal(got.numpy(), xt.grad.numpy())
    at_max = mg.grad(_sum_of_maximum_with_zero, mode=mode)(mg.tensor(x0)).numpy()
    np.testing.assert_array_equal(got.numpy()[:3], at_max[:3])  # (at 0, a tie: max gives x 1)


def _sum_of_relu(x):
    return mg.sum(mg.relu(x))


def _sum_of_maximum_with_zero(x):
    return mg.sum(mg.maximum(x, 0.0))
