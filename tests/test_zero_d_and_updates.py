"""A kernel's 0-d result (held as NumPy's scalar) and updates in place: the checks an
update makes, whatever the tensor holds, and what the user gets shared. Oracles:
Python's and PyTorch's integer arithmetic, PyTorch's sharing of memory, torch.func's
refusal of an update of a captured tensor, closed forms."""

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import DTypeError, GradientError

torch = pytest.importorskip("torch")


def _zero_d_results():
    """Computed 0-d integer tensors (NumPy scalars inside), and one made from a number."""
    return {"sum": mg.tensor([3, 4]).sum(), "item": mg.tensor([7, 8])[0],
            "add": mg.tensor(7) + 0, "made": mg.tensor(7)}


@pytest.mark.parametrize("kind", ["sum", "item", "add", "made"])
@pytest.mark.parametrize("op", ["//=", "%="])
def test_an_integer_update_of_a_0d_result_by_zero_raises(kind, op):
    """``s //= 0`` on a reduction's result answered 0 (Python's operator on the NumPy
    scalar, not the kernel, which refuses), where Python and PyTorch raise."""
    with pytest.raises(RuntimeError):  # the oracle
        t = torch.tensor(7)
        t //= 0
    s = _zero_d_results()[kind]
    before = s.item()
    with pytest.raises(ZeroDivisionError):
        exec(f"s {op} 0", {}, {"s": s})
    assert s.item() == before and s.dtype == "int64"


@pytest.mark.parametrize("kind", ["sum", "made"])
def test_an_integer_update_that_would_make_a_float_is_refused(kind):
    """``s /= t`` of two int64 tensors made the 0-d result float64 3.5, and an int64
    array ``x /= y`` truncated to [1, 2]; PyTorch and NumPy refuse to cast the float
    result into the integers."""
    with pytest.raises(RuntimeError):  # the oracle
        t = torch.tensor([3, 4])
        t /= torch.tensor([2, 2])
    s = _zero_d_results()[kind]
    with pytest.raises(DTypeError):
        s /= mg.tensor(2)
    assert s.dtype == "int64" and s.item() == 7
    x = mg.tensor([3, 4])
    with pytest.raises(DTypeError):
        x /= mg.tensor([2, 2])
    np.testing.assert_array_equal(x.numpy(), [3, 4])
    b = mg.tensor([True, False]).max()
    with pytest.raises(DTypeError):  # (bool // bool is NumPy's int8, a dtype minigraph has not)
        b //= mg.tensor(True)
    assert b.dtype == "bool"


def test_a_0d_results_memory_is_shared_as_any_tensors():
    """``.numpy()``, ``np.asarray`` and DLPack of a reduction's result handed out a copy
    (``from_dlpack(s, copy=False)`` too, which must never copy): writes on either side
    were lost. PyTorch shares them."""
    ts = torch.tensor([1.0, 2.0]).sum()
    tn = ts.numpy()
    tn += 100
    assert ts.item() == 103.0  # the oracle
    s = mg.tensor([1.0, 2.0]).sum()
    a = s.numpy()
    a += 100
    assert s.item() == 103.0
    s = mg.tensor([1.0, 2.0]).sum()
    exported = np.from_dlpack(s, copy=False)
    exported[...] = 42.0
    assert s.item() == 42.0
    s -= 1.0
    assert exported == 41.0
    s = mg.tensor([1.0, 2.0]).sum()
    view = np.asarray(s)
    s += 1.0
    assert view == 4.0
    copied = np.from_dlpack(s, copy=True)  # a copy, asked for: its own
    copied[...] = 0.0
    assert s.item() == 4.0


MODEL = mg.nn.Linear(1, 1)
LAYERS = [[mg.tensor(float(i))] for i in range(100)]  # longer than the search reads


def _a_parameter_in_a_list_of_its_own(x):
    ps = list(MODEL.parameters())
    ps[1] += x * x
    return mg.sum(ps[1])


def _a_global_tensor_in_a_list_of_its_own(x):
    outs = [LAYERS[5][0]]
    outs[0] += x * x
    return outs[0]


def _a_new_tensor_in_a_list_of_its_own(x):
    outs = [mg.tensor(5.0)]
    outs[0] += x * x
    return outs[0]


@pytest.mark.parametrize("mode", ["tape", "forward", "graph"])
@pytest.mark.parametrize("f", [_a_parameter_in_a_list_of_its_own,
                               _a_global_tensor_in_a_list_of_its_own])
def test_a_captured_tensor_in_a_container_f_made_is_still_captured(mode, f):
    """f's own list holding a model's parameter or a global's tensor: ``outs[0] += v``
    was allowed (the list is f's), returned a gradient and left the tensor as it was,
    where eager mode writes into it; torch.func refuses ("would mutate a captured
    Tensor"), and so does minigraph now."""
    tm = torch.nn.Linear(1, 1)

    def oracle(x):
        ps = list(tm.parameters())
        ps[1] += x * x
        return ps[1].sum()
    with pytest.raises(RuntimeError, match="captured"):
        torch.func.grad(oracle)(torch.tensor(3.0))
    before = (MODEL.bias.item(), LAYERS[5][0].item())
    with pytest.raises(GradientError, match="captured tensor"):
        mg.grad(f, mode=mode)(3.0)
    assert (MODEL.bias.item(), LAYERS[5][0].item()) == before


@pytest.mark.parametrize("mode", ["tape", "forward", "graph"])
def test_a_tensor_f_made_in_its_own_list_is_updated(mode):
    """5 + x**2 has derivative 2x = 6 at 3 (closed form)."""
    assert mg.grad(_a_new_tensor_in_a_list_of_its_own, mode=mode)(3.0).item() == 6.0


class _LazyRows(dict):  # a table whose rows load on demand
    def values(self):
        raise OSError("rows not loaded")

    def items(self):
        raise OSError("rows not loaded")


class _Remote:  # a proxy whose every attribute needs a connection
    __slots__ = ("a",)

    def __getattribute__(self, name):
        raise ConnectionError(f"not connected ({name})")


TABLE, PROXY = _LazyRows(a=1), _Remote()


def _updates_its_own(x):
    y = x * 1.0
    y += x
    return y


@pytest.mark.parametrize("mode", ["tape", "forward", "graph"])
def test_an_unrelated_object_that_raises_when_read_does_not_break_an_update(mode):
    """The search for other holders of y read every value in scope, and a dict subclass
    whose values() raises, or a proxy whose __getattribute__ does (isinstance asks
    __class__), made ``y += x`` raise their errors. d(2x)/dx = 2."""
    assert TABLE and PROXY is not None  # (module globals that f's scope shows)
    assert mg.grad(_updates_its_own, mode=mode)(2.0).item() == 2.0
