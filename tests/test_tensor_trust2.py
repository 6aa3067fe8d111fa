"""A kernel's 0-d result (held as NumPy's scalar) under writes and reads, holders of a
tensor's memory outside minigraph, and the errors of tensor(), transposes, reductions,
indexing and composite functions. Oracles: PyTorch's refusals and sharing, NumPy's
refusals and results, closed forms."""

import numpy as np
import pytest

import minigraph as mg
from minigraph.autodiff.checkpoint import CheckpointError
from minigraph.errors import DeviceError, DTypeError, GradientError, ShapeError

torch = pytest.importorskip("torch")

READS = {"numpy": lambda c: c.numpy(), "detach": lambda c: c.detach(),
         "asarray": lambda c: np.asarray(c), "from_dlpack": lambda c: np.from_dlpack(c)}


@pytest.mark.parametrize("read", sorted(READS))
def test_a_read_after_a_write_into_a_0d_result_keeps_the_write_seen(read):
    """``c += 1`` into a reduction's 0-d result that the tape had read was refused by
    backward(), unless c was merely read in between (c.numpy(), c.detach(), ...): the
    read made c's NumPy scalar an array, the write's stamp stayed on the tensor, and
    backward() gave x.grad = [8, 8], the derivative at the new value (it is 7 at the
    value recorded). PyTorch refuses the sweep."""
    xt = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    ct = torch.tensor([3.0, 4.0], dtype=torch.float64).sum()
    yt = (ct * xt).sum()
    ct += 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        yt.backward()
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    c = mg.tensor([3.0, 4.0]).sum()
    y = (c * x).sum()
    c += 1
    READS[read](c)
    with pytest.raises(GradientError, match="changed in place"):
        y.backward()


def test_a_read_after_a_write_into_a_0d_result_is_seen_by_the_pullback_and_its_own_rule():
    """The same through mg.vjp's pullback (it gave [8, 8]), and for exp's result, which
    its derivative reads (it gave 2 for d exp(x)/dx = 1 at 0)."""
    c = mg.tensor([3.0, 4.0]).sum()
    _, vjp_fn = mg.vjp(lambda x: (c * x).sum(), mg.tensor([1.0, 2.0]))
    c += 1
    c.numpy()
    with pytest.raises(GradientError, match="changed in place"):
        vjp_fn(1.0)
    x = mg.tensor(0.0, requires_grad=True)
    y = mg.exp(x)
    with mg.no_grad():
        y += 1
    y.numpy()
    with pytest.raises(GradientError, match="changed in place"):
        y.backward()


def test_a_read_of_a_guarded_0d_result_does_not_lift_the_guard():
    """While checkpoint runs f, what f reads from outside is read-only; a 0-d result is
    guarded by its tensor (a scalar has no read-only flag). ``Y.numpy()`` in f made it an
    array without the guard, and f's ``Y += 1`` went through, once per run of f: Y was
    5 where the one write of eager mode gives 4. It is refused, and Y keeps 3 + 4 = 7."""
    Y = mg.tensor([3.0, 4.0]).sum()

    def f(x):
        Y.numpy()
        Y.__iadd__(1.0)
        return (x * 2).sum()

    with pytest.raises(CheckpointError, match="wrote into Y"):
        mg.checkpoint(f)(mg.tensor([1.0, 2.0], requires_grad=True))
    assert Y.item() == 7.0


HOLDERS = {"numpy": lambda c: c.numpy(), "asarray": lambda c: np.asarray(c),
           "np.from_dlpack": lambda c: np.from_dlpack(c),
           "torch.from_dlpack": lambda c: torch.from_dlpack(c)}


@pytest.mark.parametrize("hold", sorted(HOLDERS))
def test_a_recorded_update_is_refused_where_an_array_shares_the_memory(hold):
    """``c += w`` while recording makes a new value for the name c; a NumPy (or torch)
    array over c's memory was not counted as another holder, so it silently kept the
    old values, where eager mode's write (and PyTorch's, oracle) shows through it. It is
    refused, as it is for a ``c.detach()`` holder."""
    ct = torch.tensor([1.0, 2.0])
    held_t = ct.numpy()
    ct += torch.tensor([1.0, 2.0], requires_grad=True)
    assert held_t.tolist() == [2.0, 4.0]  # the oracle: the holder sees the update
    w = mg.tensor([1.0, 2.0], requires_grad=True)
    c = mg.tensor([1.0, 2.0])
    held = HOLDERS[hold](c)
    with pytest.raises(GradientError, match="hold the same value"):
        c += w
    assert np.asarray(held).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("data", [[1.0, 2.0], 1.0])
def test_matrix_transpose_of_fewer_than_two_axes_says_so(data):
    """x.mT of a vector spoke of "axes (0, 0)", of a 0-d of "axis -1": axes the user
    never wrote. NumPy: "matrix transpose with ndim < 2 is undefined"."""
    with pytest.raises(ValueError) as numpy_error:
        np.asarray(data).mT
    x = mg.tensor(data)
    for transposed in (lambda: x.mT, lambda: mg.matrix_transpose(x)):
        with pytest.raises(ShapeError) as error:
            transposed()
        assert str(numpy_error.value) in str(error.value)
        assert f"shape {x.shape}" in str(error.value)


def test_transpose_takes_an_integer_array_and_refuses_a_float():
    """x.transpose(np.array([1, 0])) raised NumPy's truth-value error (NumPy transposes);
    mg.transpose(x, 1.5) raised "'float' object is not iterable" (NumPy: a TypeError
    saying it wants integers)."""
    a = np.arange(6.0).reshape(2, 3)
    x = mg.tensor(a)
    assert x.transpose(np.array([1, 0])).tolist() == a.transpose(np.array([1, 0])).tolist()
    for axes in (1.5, [1.5, 0], np.array([[1, 0]])):
        with pytest.raises(TypeError):
            a.transpose(axes)
        with pytest.raises(TypeError, match="transpose: ax[ie]s must be"):
            mg.transpose(x, axes)


@pytest.mark.parametrize("axis", [(0, 0), (0, -1), (-1, -1, 0)])
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min"])
def test_a_reduction_of_a_0d_tensor_refuses_an_axis_named_twice(name, axis):
    """axis=(0, 0) or (0, -1) on a 0-d tensor returned the value; on a vector it is
    refused, and NumPy and PyTorch ("dim 0 appears multiple times") refuse both."""
    with pytest.raises(RuntimeError, match="multiple times"):
        torch.sum(torch.tensor(2.0), dim=axis)
    with pytest.raises(ShapeError, match="names an axis twice"):
        getattr(mg, name)(mg.tensor(2.0), axis=axis)


def test_an_index_tensor_on_another_device_is_refused():
    """x[i], x[i] = 5.0 and mg.scatter_add(x, i, ...) with the index tensor i on cpu:1
    and x on cpu read i through a silent copy; mixing devices is an error (PyTorch
    refuses a CUDA index for a CPU tensor), naming both devices. x keeps its values."""
    with mg.device("cpu:1"):
        i = mg.tensor([1, 0])
    x = mg.tensor([10.0, 20.0])
    with pytest.raises(DeviceError, match=r"getitem: .*\(cpu and cpu:1\)"):
        x[i]
    with pytest.raises(DeviceError, match=r"x\[\.\.\.\] = value: .*\(cpu and cpu:1\)"):
        x[i] = 5.0
    assert x.tolist() == [10.0, 20.0]
    with pytest.raises(DeviceError, match=r"scatter_add: .*\(cpu and cpu:1\)"):
        mg.scatter_add(x, i, (3,))


@pytest.mark.parametrize("data", [2**63, [2**63], [-2**63 - 1], 2**64])
def test_an_integer_beyond_int64_is_named(data):
    """mg.tensor(2**63) said "dtype uint64 is not supported", [-2**63 - 1] and 2**64
    "dtype object": dtypes the user never asked for. PyTorch refuses the overflow."""
    with pytest.raises((OverflowError, RuntimeError, ValueError)):
        torch.tensor(data)
    with pytest.raises(DTypeError, match="does not fit in int64"):
        mg.tensor(data)


@pytest.mark.filterwarnings("ignore:Creating a tensor from a list of numpy")
def test_an_array_among_the_rows_of_ragged_data_is_named():
    """mg.tensor([[1.0, 2.0], np.array([3.0])]) reached NumPy's "inhomogeneous shape"
    error; PyTorch: "expected sequence of length 2 at dim 1 (got 1)"."""
    with pytest.raises(ValueError, match="expected sequence of length 2 at dim 1"):
        torch.tensor([[1.0, 2.0], np.array([3.0])])
    with pytest.raises(ValueError, match="ragged .* length 2 at dim 1, got a ndarray of "
                                         r"shape \(1,\)"):
        mg.tensor([[1.0, 2.0], np.array([3.0])])
    assert mg.tensor([np.array([1.0, 2.0]), [3.0, 4.0]]).tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_a_device_error_names_the_function_called_and_its_shapes():
    """mg.stack([a, b]) on two devices spoke of "concatenate" and shapes (1, 2); a @ b of
    vectors of shapes (1, 2) and (2, 1): the inner steps, not what the user called
    (PyTorch names torch.stack, matmul)."""
    a = mg.tensor([1.0, 2.0])
    b = mg.tensor([1.0, 2.0], device="cpu:1")
    given = r"\(cpu and cpu:1\): shape \(2,\) float64 on cpu, shape \(2,\) float64 on cpu:1"
    with pytest.raises(DeviceError, match="^stack: .*" + given):
        mg.stack([a, b])
    with pytest.raises(DeviceError, match="^matmul: .*" + given):
        a @ b


def test_stack_puts_host_data_where_the_tensors_live():
    """mg.stack([a tensor on cpu:1, a NumPy array]) made the array a tensor on cpu (its
    reshape) and refused, naming concatenate and shapes the user never wrote, where
    mg.concatenate and b * array place host data on the tensor's device. Oracle: NumPy's
    stack of the same values."""
    mg.set_virtual_cpus(2)
    b = mg.tensor([1.0, 2.0], device="cpu:1")
    for host in (np.ones(2), [1.0, 1.0]):
        out = mg.stack([b, host])
        assert out.device.name == "cpu:1"
        np.testing.assert_array_equal(out.numpy(), np.stack([[1.0, 2.0], np.ones(2)]))


@pytest.mark.parametrize("value", ["False", "no", 0, 1, None, 1.0])
def test_requires_grad_takes_true_or_false_only_as_pytorch_does(value):
    """``requires_grad="False"`` read the string's truth and turned gradients on (the
    constructor, the setter and requires_grad_ alike). PyTorch refuses every non-bool
    there ("requires_grad must be a bool"), and so does minigraph now; the tensor is
    left as it was."""
    with pytest.raises(TypeError):
        torch.tensor([1.0]).requires_grad_(value)
    with pytest.raises(TypeError, match=r"tensor\(\): requires_grad must be True or False"):
        mg.tensor([1.0, 2.0], requires_grad=value)
    t = mg.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="requires_grad must be True or False"):
        t.requires_grad = value
    with pytest.raises(TypeError, match="requires_grad must be True or False"):
        t.requires_grad_(value)
    assert t.requires_grad is False
    assert mg.tensor([1.0], requires_grad=np.bool_(True)).requires_grad is True
