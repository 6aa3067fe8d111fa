"""Errors that teach: each names the operation, the shapes, dtypes or devices involved."""

from __future__ import annotations

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import DeviceError, DTypeError, GradientError, ShapeError


def test_shape_mismatch_names_the_op_and_both_shapes():
    with pytest.raises(ShapeError, match=r"add: shapes \(3,\) and \(4,\) do not broadcast"):
        mg.tensor(np.ones(3)) + mg.tensor(np.ones(4))
    with pytest.raises(ValueError):  # a ShapeError is also a ValueError
        mg.tensor(np.ones(3)) * mg.tensor(np.ones(2))


def test_matmul_mismatch_names_inner_sizes():
    with pytest.raises(ShapeError, match=r"matmul: shapes \(2, 3\) and \(4, 5\) do not fit"):
        mg.tensor(np.ones((2, 3))) @ mg.tensor(np.ones((4, 5)))


def test_reshape_mismatch_names_both_shapes():
    with pytest.raises(ShapeError, match=r"reshape: .*shape \(2, 3\).*\(4,\)"):
        mg.tensor(np.ones((2, 3))).reshape(4)


@pytest.mark.parametrize("shape, error, message", [
    ((-1, -1), ShapeError, "or -1 for one size to be inferred, got shape \\(-1, -1\\)"),
    ((-2, -12), ShapeError, "a size must be >= 0"), ((2.0, 12), TypeError, "must be integers")])
def test_reshape_refuses_sizes_numpy_refuses(shape, error, message):
    """Two -1s became (24, 24) with a message about 576 elements; (-2, -12) passed the
    shape rule (its product is 24), so a graph node got a negative shape."""
    x = mg.tensor(np.zeros((2, 3, 4)))
    with pytest.raises(error, match=message):
        x.reshape(*shape)
    with pytest.raises(error, match=message), mg.Graph():
        mg.placeholder((2, 3, 4)).reshape(*shape)
    assert x.reshape(np.int64(4), -1).shape == (4, 6)  # NumPy's ints are ints


def test_backward_on_a_non_scalar_needs_a_gradient():
    y = mg.tensor([1.0, 2.0], requires_grad=True) * 2.0
    with pytest.raises(GradientError, match=r"shape \(2,\).*scalar output only.*grad="):
        y.backward()
    y.backward(mg.tensor([1.0, 1.0]))  # with an explicit gradient it works


def test_backward_without_any_tracked_input():
    with pytest.raises(GradientError, match="requires_grad=True"):
        (mg.tensor(1.0) * 2.0).backward()


def test_grad_of_a_vector_function_points_to_jacobians():
    with pytest.raises(GradientError, match="jacrev"):
        mg.grad(lambda x: x * 2.0)(np.ones(3))
    with pytest.raises(GradientError, match="jacfwd"):
        mg.grad(lambda x: x * 2.0, mode="forward")(np.ones(3))


def test_unknown_mode_lists_the_modes():
    with pytest.raises(ValueError, match=r"unknown mode 'magic'; available here: tape, forward"):
        mg.grad(mg.sin, mode="magic")


def test_mixed_devices_name_both_devices():
    with pytest.raises(DeviceError, match=r"cpu and cpu:2"):
        mg.maximum(mg.tensor(1.0), mg.tensor(1.0, device="cpu:2"))


def test_bad_axis_and_bad_index():
    with pytest.raises(IndexError, match=r"axis 2 .*shape \(2, 3\)"):
        mg.tensor(np.ones((2, 3))).sum(axis=2)
    with pytest.raises(IndexError, match=r"getitem"):
        mg.tensor(np.ones(3))[5]


def test_cross_entropy_checks_labels():
    logits = mg.tensor(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="labels must be integers"):
        mg.cross_entropy(logits, mg.tensor([0.0, 1.0]))
    with pytest.raises(ShapeError, match=r"logits \(N, C\) and labels \(N,\)"):
        mg.cross_entropy(logits, mg.tensor([0, 1, 2]))


def test_a_failed_op_leaves_the_tape_usable():
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3.0
    with pytest.raises(ShapeError):
        y + mg.tensor(np.ones(3))
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_a_tangent_of_another_dtype_or_device_is_refused():
    """JAX's rule: a tangent is of its primal's dtype (a float64 tangent on a float32
    primal would give the float32 result a float64 tangent) and, here, on its device."""
    mg.set_virtual_cpus(2)
    x32 = mg.tensor([1.0, 2.0], dtype="float32")
    with pytest.raises(DTypeError, match="primal float32 on cpu, tangent float64 on cpu"):
        mg.jvp(mg.sin, (x32,), (np.ones(2),))
    with pytest.raises(DTypeError, match="tangent float64 on cpu:1"):
        mg.jvp(mg.sin, (np.ones(2),), (mg.tensor(np.ones(2), device="cpu:1"),))
    out, t = mg.jvp(mg.sin, (x32,), (1.0,))  # a number takes the primal's dtype
    assert out.dtype == t.dtype == "float32"
    assert np.allclose(t.numpy(), np.cos([1.0, 2.0]))
