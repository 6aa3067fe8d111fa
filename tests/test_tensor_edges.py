"""Edges of Tensor, devices and interchange, each against an outside oracle (NumPy,
PyTorch, a closed form): 0-d results that share memory, DLPack of reversed views and
without a copy, array-api-strict devices, and errors that name what the user wrote."""

from __future__ import annotations

import importlib
import operator
import re

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import DeviceError, DTypeError, GradientError

torch = pytest.importorskip("torch")
full = importlib.import_module("minigraph.tensor").full  # (mg.tensor is the function)


def test_zeros_ones_full_with_dtype_none_follow_numpy(strict_devices):
    """dtype=None (NumPy's and PyTorch's spelling of "the default") gave int64 zeros and
    ones, from the fill value 0; NumPy gives float64, and full infers the value's dtype.
    A NumPy dtype failed on an array-api-strict device (it reached xp.full as is)."""
    for device in ("cpu", "cpu:1"):
        assert mg.zeros(3, dtype=None, device=device).dtype == np.zeros(3, dtype=None).dtype.name
        assert mg.ones(3, dtype=None, device=device).dtype == np.ones(3, dtype=None).dtype.name
        for value in (1, 1.5, True):
            want = np.full(3, value, dtype=None).dtype.name
            assert full(3, value, dtype=None, device=device).dtype == want
        assert mg.zeros(2, dtype=np.float32, device=device).dtype == "float32"


def test_a_reversed_view_exports_a_copy_through_dlpack():
    """A reversed view (x[::-1]) exported its negative strides through DLPack, and
    torch.from_dlpack / torch.tensor of it aborted the Python process (SIGABRT in
    libtorch). It now exports a C-ordered copy, and refuses copy=False in words."""
    x = mg.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    for view, want in [(x[0][::-1], np.array([3.0, 2.0, 1.0])),
                       (x[:, ::-1], np.array([[3.0, 2.0, 1.0], [6.0, 5.0, 4.0]]))]:
        exported = np.from_dlpack(view)
        assert all(s >= 0 for s in exported.strides)  # (checked first: torch would abort)
        np.testing.assert_array_equal(exported, want)
        np.testing.assert_array_equal(torch.from_dlpack(view).numpy(), want)
        np.testing.assert_array_equal(torch.tensor(view).numpy(), want)
        with pytest.raises(BufferError, match="reversed view.*copy=False"):
            view.__dlpack__(copy=False)


def test_none_in_a_tensor_is_false_as_in_numpy():
    """``None in t`` raised AttributeError ('bool' object has no attribute 'data'):
    == leaves None to Python, which answers a bool, not a tensor."""
    assert (None in mg.tensor([1.0, 2.0])) is (None in np.array([1.0, 2.0])) is False
    assert 2.0 in mg.tensor([1.0, 2.0])


def test_python_ints_beyond_int64_are_refused_on_every_device(strict_devices):
    """mg.tensor(2**63) on an array-api-strict device wrapped silently to -2**63 (its
    asarray wraps where NumPy makes uint64, or raises for dtype=int64)."""
    with pytest.raises(OverflowError):
        np.array(2**63, dtype=np.int64)  # the oracle: it does not fit
    for device in ("cpu", "cpu:1"):
        for data in (2**63, -(2**63) - 1):  # (NumPy: uint64 and object, not int64)
            with pytest.raises(DTypeError, match="does not fit in int64"):
                mg.tensor(data, device=device)
        mixed = mg.tensor([1, 2**63], device=device)  # NumPy's rule: float64
        assert (mixed.dtype, mixed.tolist()) == ("float64", np.asarray([1, 2**63]).tolist())
        with pytest.raises(DTypeError, match="does not fit in int64"):
            mg.tensor(2**63, dtype="int64", device=device)
        assert mg.tensor(2**63 - 1, device=device).item() == 2**63 - 1


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "float16"])
def test_unsupported_numpy_dtypes_are_refused_on_strict_devices(strict_devices, dtype):
    """A uint8 NumPy array on an array-api-strict device raised a raw KeyError 'uint8'
    (the memory counter's item sizes), float16 array-api-strict's own TypeError; the
    NumPy device says DTypeError, naming the dtype."""
    for device in ("cpu", "cpu:1"):
        with pytest.raises(DTypeError, match=f"dtype {dtype} is not supported"):
            mg.tensor(np.array([1, 2], dtype=dtype), device=device)


def test_numpy_of_a_tensor_on_a_strict_device_is_guarded(strict_devices):
    """On an array-api-strict device t.numpy() is the NumPy array the Array wraps, which
    was not recognised as the tensor's memory: a tensor that requires a gradient gave a
    writable array (a write changed the gradient: closed form 2w = [2, 4]), and the
    memory was not exposed, so a traced program kept a stale constant."""
    w = mg.tensor([1.0, 2.0], requires_grad=True, device="cpu:1")
    y = (w * w).sum()
    with pytest.raises(ValueError, match="read-only"):
        w.numpy()[0] = 100.0
    y.backward()
    assert w.grad.tolist() == [2.0, 4.0]

    c = mg.tensor([1.0, 2.0], device="cpu:1")
    f = mg.trace(lambda x: x * c)
    x = mg.tensor([1.0, 1.0], device="cpu:1")
    f(x)
    c.numpy()[0] = 10.0
    assert f(x).tolist() == [10.0, 2.0]  # x * c with the new c


def test_from_dlpack_without_a_copy_is_seen_by_the_write_guard():
    """mg.from_dlpack(x, copy=False) shares x's memory, but its array's owner was a DLPack
    capsule of its own, so a write through it passed the tape's guard and backward()
    silently used the new values (closed form: d/dw sum(w * x) = x at forward time)."""
    w = mg.tensor([1.0, 1.0], requires_grad=True)
    x = mg.tensor([1.0, 2.0])
    y = (w * x).sum()
    m = mg.from_dlpack(x, copy=False)
    m += 10.0
    assert x.tolist() == [11.0, 12.0]  # the memory is shared ...
    with pytest.raises(GradientError, match="changed in place"):
        y.backward()  # ... and the write is seen: [1, 2] cannot be given any more

    a = np.array([1.0, 2.0])  # two tensors over one NumPy array: one owner, too
    x1, x2 = mg.from_dlpack(a, copy=False), mg.from_dlpack(a, copy=False)
    y = (w * x1).sum()
    x2 += 10.0
    assert np.shares_memory(x1.numpy(), a)
    with pytest.raises(GradientError, match="changed in place"):
        y.backward()


def test_number_conversions_name_the_conversion():
    """float(t), int(t), complex(t) and operator.index(t) of a many-element tensor said
    "item(): ...", which the user never called."""
    t = mg.tensor([1, 2])
    for name, convert in [("float(t)", float), ("int(t)", int), ("complex(t)", complex),
                          ("operator.index(t)", operator.index)]:
        with pytest.raises(ValueError, match=rf"^{re.escape(name)}.*2 elements"):
            convert(t)
    assert complex(mg.tensor([2.5])) == complex(np.array([2.5])[0])


def test_save_names_a_foreign_tensor_class_with_its_module(tmp_path):
    """mg.save of a torch.Tensor said "is a Tensor; only tensors ... are stored"."""
    with pytest.raises(TypeError, match=r"torch\.Tensor.*mg\.from_dlpack"):
        mg.save({"w": torch.zeros(2)}, tmp_path / "m.npz")
    assert not (tmp_path / "m.npz").exists()


def test_an_unhashable_device_spec_is_a_device_error():
    """device=["cpu"] raised a raw "unhashable type: 'list'" from the registry lookup."""
    for call in (lambda: mg.tensor([1.0], device=["cpu"]),
                 lambda: mg.tensor([1.0]).to(["cpu"]),
                 lambda: mg.device({})):
        with pytest.raises(DeviceError, match="unknown device.*a name"):
            call()
