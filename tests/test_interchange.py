"""Copies, files and interchange: pickle, copy, deepcopy, DLPack, tolist, state dicts,
mg.save / mg.load.

Oracles: the values themselves (NumPy's array_equal, dtype and shape), PyTorch (its
state_dict keys, its outputs for the same weights, its DLPack import), and the rules
PyTorch follows (deepcopy of a non-leaf raises; pickle drops .grad, deepcopy keeps it).
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minigraph as mg
from minigraph.errors import DeviceError, DTypeError, GradientError, MinigraphError
from minigraph.interchange import ArchiveError
from minigraph.nn import StateDictError

torch = pytest.importorskip("torch")

DTYPES = ["float32", "float64", "int64", "bool"]
DEVICES = ["cpu", "cpu:1"]


@st.composite
def tensors(draw):
    """A tensor of any supported dtype, 0-d or empty included, on cpu or cpu:1."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    values = draw(hnp.arrays(np.dtype(dtype), shape,
                             elements={"allow_nan": False} if dtype.startswith("f") else None))
    requires_grad = dtype.startswith("float") and draw(st.booleans())
    return mg.tensor(values, device=draw(st.sampled_from(DEVICES)), requires_grad=requires_grad)


def assert_same_tensor(new, old):
    """Same dtype, shape, device, requires_grad and values; its own memory; a leaf."""
    assert isinstance(new, mg.Tensor)
    assert (new.dtype, new.shape, new.device, new.requires_grad) == \
        (old.dtype, old.shape, old.device, old.requires_grad)
    assert new.device is old.device  # the process's one Device object, found by name
    np.testing.assert_array_equal(new.numpy(), old.numpy())
    assert new.is_leaf
    assert not np.shares_memory(np.asarray(new.numpy()), np.asarray(old.numpy()))


# -- pickle, copy, deepcopy ------------------------------------------------------------------

@given(tensors())
def test_pickle_copy_deepcopy_round_trips(t):
    for new in (pickle.loads(pickle.dumps(t)), copy.copy(t), copy.deepcopy(t)):
        assert_same_tensor(new, t)


@given(tensors())
def test_copies_are_independent_of_the_original(t):
    before = t.numpy().copy()
    for new in (pickle.loads(pickle.dumps(t)), copy.copy(t), copy.deepcopy(t)):
        with mg.no_grad():
            if t.dtype == "bool":
                new.data[...] = ~new.data
            else:
                new += 1
        np.testing.assert_array_equal(t.numpy(), before)


def test_pickle_and_copy_of_a_recorded_tensor_give_a_leaf():
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    for new in (pickle.loads(pickle.dumps(y)), copy.copy(y)):
        assert new.is_leaf and new.requires_grad
        np.testing.assert_array_equal(new.numpy(), [3.0, 6.0])
        new.sum().backward()  # a leaf of its own: its gradient, nothing reaches x
        np.testing.assert_array_equal(new.grad.numpy(), [1.0, 1.0])
    assert x.grad is None


def test_deepcopy_of_a_recorded_tensor_is_refused_as_in_pytorch():
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    y = mg.sin(x)
    with pytest.raises(GradientError, match=r"deepcopy.*shape \(2,\).*recorded operation "
                                            r"\(sin\).*leaves"):
        copy.deepcopy(y)
    with pytest.raises(RuntimeError):  # PyTorch raises a RuntimeError here
        copy.deepcopy(torch.sin(torch.ones(2, requires_grad=True)))
    copy.deepcopy(y.detach())  # the values alone copy


def test_deepcopy_keeps_grad_pickle_drops_it_as_in_pytorch():
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    d = copy.deepcopy(x)
    np.testing.assert_array_equal(d.grad.numpy(), [2.0, 4.0])
    assert d.grad is not x.grad and not np.shares_memory(d.grad.numpy(), x.grad.numpy())
    assert pickle.loads(pickle.dumps(x)).grad is None
    assert copy.copy(x).grad is None
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    (tx * tx).sum().backward()
    assert copy.deepcopy(tx).grad is not None and pickle.loads(pickle.dumps(tx)).grad is None


def test_a_zero_d_kernel_result_copies_and_pickles():
    s = mg.sum(mg.tensor([1.0, 2.0]))  # its array may be a NumPy scalar
    for new in (pickle.loads(pickle.dumps(s)), copy.copy(s), copy.deepcopy(s)):
        assert new.shape == () and new.item() == 3.0 and new.dtype == "float64"


def test_a_device_pickles_by_name_and_comes_back_as_the_same_object():
    for name in mg.devices():
        if name.startswith("cpu"):
            dev = mg.get_device(name)
            assert pickle.loads(pickle.dumps(dev)) is dev
            assert copy.deepcopy(dev) is dev


def test_unpickling_on_a_device_that_does_not_exist_here_names_it():
    data = pickle.dumps(mg.tensor([1.0], device="cpu:1"))
    assert data.count(b"cpu:1") == 1
    data = data.replace(b"cpu:1", b"cpu:9")  # as if pickled where cpu:9 exists
    with pytest.raises(DeviceError, match=r"cannot unpickle a tensor on device 'cpu:9'.*"
                                          r"does not exist.*set_virtual_cpus"):
        pickle.loads(data)


def test_pickle_on_array_api_strict_devices(backend):
    t = mg.tensor([[1.0, 2.0]], device="cpu:1", requires_grad=True)
    new = pickle.loads(pickle.dumps(t))
    assert (new.device, new.dtype, new.shape, new.requires_grad) == ("cpu:1", "float64",
                                                                    (1, 2), True)
    np.testing.assert_array_equal(new.numpy(), [[1.0, 2.0]])
    np.testing.assert_array_equal(copy.deepcopy(t).numpy(), [[1.0, 2.0]])


def small_model(seed=0):
    return mg.nn.Sequential(mg.nn.Linear(3, 5, seed=seed), mg.nn.Tanh(),
                            mg.nn.Linear(5, 2, seed=seed + 1))


def test_modules_deepcopy_and_pickle_with_their_own_parameters():
    model = small_model()
    x = mg.tensor(np.linspace(-1, 1, 12).reshape(4, 3))
    for new in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(new) is mg.nn.Sequential and len(new) == 3
        np.testing.assert_array_equal(new(x).numpy(), model(x).numpy())
        for (k, p), (k2, q) in zip(model.named_parameters(), new.named_parameters()):
            assert k == k2 and p is not q and q.requires_grad
            assert not np.shares_memory(p.numpy(), q.numpy())
        with mg.no_grad():
            new[0].weight -= 1.0
        assert not np.array_equal(new(x).numpy(), model(x).numpy())


def test_deepcopy_keeps_a_shared_parameter_shared():
    a, b = mg.nn.Linear(2, 2, seed=0), mg.nn.Linear(2, 2, seed=1)
    b.weight = a.weight  # tied weights
    new = copy.deepcopy(mg.nn.Sequential(a, b))
    assert new[0].weight is new[1].weight and new[0].weight is not a.weight


def test_copy_copy_of_a_module_shares_parameters_but_not_its_tables():
    model = small_model()
    shallow = copy.copy(model[0])
    assert shallow.weight is model[0].weight
    shallow.weight = mg.tensor(np.zeros((5, 3)), requires_grad=True)
    assert model[0].weight is not shallow.weight  # the original's table is untouched


def test_del_never_raises_for_a_half_built_tensor():
    half = mg.Tensor.__new__(mg.Tensor)  # what a failed unpickle can leave behind
    half.__del__()
    del half


def test_no_exception_on_stderr_from_del_at_exit_or_after_failed_loads():
    script = textwrap.dedent("""
        import copy, pickle
        import numpy as np
        import minigraph as mg
        x = mg.tensor(np.ones((100, 100)), requires_grad=True)
        y = (x * 2).sum()
        y.backward()
        keep = [x, y, copy.deepcopy(x), pickle.loads(pickle.dumps(y)),
                mg.tensor(1.0, device="cpu:1")]
        model = copy.deepcopy(mg.nn.Sequential(mg.nn.Linear(3, 4), mg.nn.ReLU()))
        half = mg.Tensor.__new__(mg.Tensor)
        bad = pickle.dumps(mg.tensor([1.0], device="cpu:1")).replace(b"cpu:1", b"cpu:9")
        try:
            pickle.loads(bad)
        except mg.errors.DeviceError:
            pass
        keep.append(model)
        keep.append(half)
        cycle = [keep]
        cycle.append(cycle)  # left for the collector at shutdown
        print("done")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert result.stderr == ""


# -- tolist ------------------------------------------------------------------------------------

@given(tensors())
def test_numpy_array_and_asarray_copy_or_share_as_they_do_for_an_ndarray(t):
    """np.array(t) returned the tensor's own array (NumPy 2 passes copy=True to __array__
    and trusts the answer), so writing into that copy changed the tensor. (Under no_grad:
    while recording, NumPy may not read a tensor that requires a gradient at all.)"""
    with mg.no_grad():
        _copies_or_shares_as_an_ndarray(t)


def _copies_or_shares_as_an_ndarray(t):
    own = t.numpy()   # on the CPU, the tensor's own array (chapter 01)
    for call in (lambda a: np.array(a), lambda a: np.array(a, copy=True),
                 lambda a: np.asarray(a), lambda a: np.asarray(a, copy=None),
                 lambda a: np.asarray(a, dtype=own.dtype, copy=False)):
        ours, oracle = call(t), call(own)
        np.testing.assert_array_equal(ours, oracle)
        assert np.shares_memory(ours, own) == np.shares_memory(oracle, own)
    other = np.float32 if own.dtype != np.float32 else np.float64
    with pytest.raises(ValueError):
        np.asarray(own, dtype=other, copy=False)  # the oracle: a cast cannot avoid a copy
    with pytest.raises(ValueError):
        np.asarray(t, dtype=other, copy=False)
    before = own.copy()
    copied = np.array(t)
    if copied.size:
        copied[...] = 1 - copied if copied.dtype != bool else ~copied
    np.testing.assert_array_equal(t.numpy(), before)


@given(tensors())
def test_tolist_is_numpys(t):
    assert t.tolist() == t.numpy().tolist()
    assert type(t.tolist()) is type(t.numpy().tolist())


def test_tolist_gives_python_numbers():
    assert mg.tensor(2.5).tolist() == 2.5 and type(mg.tensor(2.5).tolist()) is float
    assert mg.tensor([[1, 2]]).tolist() == [[1, 2]]
    assert type(mg.tensor([[1, 2]]).tolist()[0][0]) is int
    assert mg.tensor([True]).tolist() == [True]
    assert mg.sum(mg.tensor([1.0, 2.0])).tolist() == 3.0
    assert mg.tensor(np.zeros((2, 0))).tolist() == [[], []]


# -- DLPack ------------------------------------------------------------------------------------

@given(tensors())
def test_numpy_and_torch_read_a_tensor_through_dlpack(t):
    if t.requires_grad:  # (refused, as PyTorch refuses it: see the next test)
        t = t.detach()
    a = np.from_dlpack(t)
    np.testing.assert_array_equal(a, t.numpy())
    assert a.dtype == np.dtype(t.dtype) and a.shape == t.shape
    if t.size:  # DLPack shares the tensor's memory
        assert np.shares_memory(a, t.numpy())
    tt = torch.from_dlpack(t)
    np.testing.assert_array_equal(tt.numpy(), t.numpy())
    assert tuple(tt.shape) == t.shape and str(tt.dtype) == f"torch.{t.dtype}"
    assert t.__dlpack_device__()[0] == 1  # kDLCPU


def test_a_tensor_that_requires_a_gradient_is_exported_only_detached_or_copied():
    """torch.from_dlpack ignores DLPack's read-only flag: a shared export would let
    view.add_(1) change a value backward() reads, and the gradient, without a word."""
    w = mg.tensor([1.0, 2.0], requires_grad=True)
    loss = (w * w).sum()
    for consumer in (np.from_dlpack, torch.from_dlpack):
        with pytest.raises(BufferError, match=r"requires a gradient.*t\.detach\(\)"):
            consumer(w)
    copied = np.from_dlpack(w, copy=True)
    copied += 10.0
    shared = torch.from_dlpack(w.detach())  # the explicit way out, as in PyTorch
    assert np.shares_memory(shared.numpy(), w.data) and not np.shares_memory(copied, w.data)
    loss.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 4.0])
    torch_w = torch.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises((BufferError, RuntimeError), match="require"):  # (the convention)
        torch_w.__dlpack__()


def test_dlpack_export_shares_memory_both_ways():
    t = mg.tensor([1.0, 2.0, 3.0])
    view = torch.from_dlpack(t)
    t -= 1.0
    np.testing.assert_array_equal(view.numpy(), [0.0, 1.0, 2.0])
    view.mul_(2)
    np.testing.assert_array_equal(t.numpy(), [0.0, 2.0, 4.0])


def test_dlpack_export_of_a_zero_d_result_and_of_a_broadcast_view():
    s = mg.sum(mg.tensor([1.0, 2.0]))
    assert np.from_dlpack(s) == 3.0 and torch.from_dlpack(s).item() == 3.0
    b = mg.broadcast_to(mg.tensor([1.0, 2.0]), (3, 2))
    np.testing.assert_array_equal(np.from_dlpack(b), np.ones((3, 1)) * [1.0, 2.0])


@given(tensors(), st.sampled_from(DEVICES))
def test_mg_from_dlpack_round_trips_torch_and_numpy(t, device):
    values = t.numpy()
    for source in (torch.from_numpy(values.copy()), values.copy(), t):
        new = mg.from_dlpack(source, device=device)
        assert (new.dtype, new.shape, new.device.name) == (t.dtype, t.shape, device)
        assert new.is_leaf and not new.requires_grad
        np.testing.assert_array_equal(new.numpy(), values)


def test_mg_from_dlpack_defaults_to_cpu_and_copies():
    source = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = mg.from_dlpack(source)
    assert (t.device.name, t.dtype, t.shape) == ("cpu", "float32", (2, 3))
    t -= 1.0  # minigraph's own buffer: the producer's tensor is as it was
    np.testing.assert_array_equal(source.numpy(), np.arange(6).reshape(2, 3))
    with mg.device("cpu:1"):  # the data is in CPU memory: "cpu", whatever the scope
        assert mg.from_dlpack(source).device.name == "cpu"


def test_mg_from_dlpack_copy_false_shares():
    source = np.arange(4.0)
    t = mg.from_dlpack(source, copy=False)
    t -= 1.0
    np.testing.assert_array_equal(source, [-1.0, 0.0, 1.0, 2.0])
    with pytest.raises(DeviceError, match="copy=False.*cpu.*'cpu:1'"):
        mg.from_dlpack(source, device="cpu:1", copy=False)


def test_mg_from_dlpack_errors():
    with pytest.raises(TypeError, match=r"a list has no __dlpack__.*mg\.tensor"):
        mg.from_dlpack([1.0, 2.0])
    with pytest.raises(DTypeError, match="float16 is not supported"):
        mg.from_dlpack(torch.ones(2, dtype=torch.float16))
    with pytest.raises(TypeError, match="require gradient"):  # PyTorch's own refusal
        mg.from_dlpack(torch.ones(2, requires_grad=True))


# -- state dicts -------------------------------------------------------------------------------

class Block(mg.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = mg.tensor(np.ones(4), requires_grad=True)
        self.fc = mg.nn.Linear(4, 4, seed=3)
        self.head = mg.nn.Sequential(mg.nn.Linear(4, 3, seed=4), mg.nn.ReLU(),
                                     mg.nn.Linear(3, 2, bias=False, seed=5))

    def forward(self, x):
        return self.head(self.fc(x * self.scale))


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))
        self.fc = torch.nn.Linear(4, 4)
        self.head = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(),
                                        torch.nn.Linear(3, 2, bias=False))

    def forward(self, x):
        return self.head(self.fc(x * self.scale))


def torch_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def mg_mlp():
    return mg.nn.Sequential(mg.nn.Linear(8, 16), mg.nn.ReLU(), mg.nn.Linear(16, 4))


@pytest.mark.parametrize("make", [(mg_mlp, torch_mlp), (Block, TorchBlock)],
                         ids=["sequential", "nested"])
def test_state_dict_keys_are_pytorchs(make):
    mine, theirs = make[0](), make[1]()
    sd = mine.state_dict()
    assert isinstance(sd, OrderedDict)
    assert list(sd.keys()) == list(theirs.state_dict().keys())
    for (key, p), (key2, v) in zip(mine.named_parameters(), sd.items()):
        assert key == key2 and v.shape == p.shape and v.dtype == p.dtype
        assert not v.requires_grad and not np.shares_memory(v.numpy(), p.numpy())


def test_a_shared_parameter_has_both_keys_as_in_pytorch():
    a, b = mg.nn.Linear(2, 2), mg.nn.Linear(2, 2)
    b.weight = a.weight
    ta, tb = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    tb.weight = ta.weight
    assert list(mg.nn.Sequential(a, b).state_dict()) == \
        list(torch.nn.Sequential(ta, tb).state_dict())


def test_state_dict_values_are_copies():
    model = mg_mlp()
    sd = model.state_dict()
    before = model[0].weight.numpy().copy()
    sd["0.weight"] -= 1.0
    np.testing.assert_array_equal(model[0].weight.numpy(), before)
    with mg.no_grad():
        model[0].weight -= 1.0
    np.testing.assert_array_equal(sd["0.weight"].numpy(), before - 1.0)
    np.testing.assert_array_equal(model.state_dict()["0.weight"].numpy(), before - 1.0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_torch_models_weights_give_torchs_outputs(dtype):
    theirs = torch_mlp()
    mine = mg.nn.Sequential(mg.nn.Linear(8, 16, dtype=dtype), mg.nn.ReLU(),
                            mg.nn.Linear(16, 4, dtype=dtype))
    result = mine.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    assert result.missing_keys == [] and result.unexpected_keys == []
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    expected = theirs(torch.from_numpy(x)).detach().numpy()
    out = mine(mg.tensor(x.astype(dtype)))
    assert out.dtype == dtype
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
    mine.load_state_dict(theirs.state_dict())  # torch CPU tensors are read as arrays too
    np.testing.assert_allclose(mine(mg.tensor(x.astype(dtype))).numpy(), expected,
                               rtol=1e-5, atol=1e-6)


def test_load_writes_in_place_so_an_optimizer_keeps_working():
    model, source = mg_mlp(), mg_mlp()
    params = model.parameters()
    arrays = [p.data for p in params]
    opt = mg.nn.SGD(params, lr=0.1)
    model.load_state_dict(source.state_dict())
    assert all(p is q for p, q in zip(model.parameters(), params))
    assert all(p.data is a for p, a in zip(params, arrays))
    for p, q in zip(params, source.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    x = mg.tensor(np.ones((2, 8)))
    model(x).sum().backward()
    before = model[0].weight.numpy().copy()
    opt.step()
    assert not np.array_equal(model[0].weight.numpy(), before)


def test_a_tape_recorded_before_a_load_refuses_backward():
    model = mg_mlp()
    loss = model(mg.tensor(np.ones((2, 8)))).sum()
    model.load_state_dict(mg_mlp().state_dict())
    with pytest.raises(GradientError, match="in place"):
        loss.backward()


def snapshot(model):
    return [(k, p.numpy().copy(), p.data) for k, p in model.named_parameters()]


def assert_unchanged(model, snap):
    for (k, p), (k2, values, array) in zip(model.named_parameters(), snap):
        assert k == k2 and p.data is array
        np.testing.assert_array_equal(p.numpy(), values)


def test_missing_and_unexpected_keys_are_named_in_one_error():
    model = mg_mlp()
    sd = model.state_dict()
    good = {k: v + 1.0 for k, v in sd.items()}
    del good["2.bias"]
    good["3.weight"] = mg.tensor(np.ones((4, 16)))
    snap = snapshot(model)
    with pytest.raises(StateDictError) as info:
        model.load_state_dict(good)
    message = str(info.value)
    assert "missing key(s)" in message and "'2.bias'" in message
    assert "unexpected key(s)" in message and "'3.weight'" in message
    assert "Sequential" in message
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, MinigraphError)
    assert_unchanged(model, snap)  # the good keys were not loaded either
    result = model.load_state_dict(good, strict=False)
    assert result.missing_keys == ["2.bias"] and result.unexpected_keys == ["3.weight"]
    np.testing.assert_array_equal(model[0].weight.numpy(), sd["0.weight"].numpy() + 1.0)


def test_a_shape_mismatch_names_the_key_and_both_shapes_and_loads_nothing():
    model = mg_mlp()
    sd = {k: v + 1.0 for k, v in model.state_dict().items()}
    sd["2.bias"] = mg.tensor(np.zeros(5))  # the last key is wrong: the others come first
    snap = snapshot(model)
    with pytest.raises(StateDictError, match=r"size mismatch for '2\.bias'.*\(5,\).*\(4,\)"):
        model.load_state_dict(sd)
    assert_unchanged(model, snap)
    with pytest.raises(StateDictError, match=r"size mismatch for '2\.bias'"):
        model.load_state_dict(sd, strict=False)  # shapes are checked even then (PyTorch)
    assert_unchanged(model, snap)


def test_a_value_of_another_kind_is_refused():
    model = mg.nn.Sequential(mg.nn.Linear(2, 1))
    snap = snapshot(model)
    with pytest.raises(StateDictError, match=r"dtype mismatch for '0\.bias'.*<U1.*float64"):
        model.load_state_dict({"0.weight": np.ones((1, 2)), "0.bias": np.array(["a"])})
    assert_unchanged(model, snap)
    with pytest.raises(TypeError, match="expected a dict"):
        model.load_state_dict([("0.weight", np.ones((1, 2)))])
    model.load_state_dict({"0.weight": np.ones((1, 2), dtype=np.int64),
                           "0.bias": np.zeros(1, dtype=np.float32)})  # same kind: converted
    assert model[0].weight.dtype == "float64" and model[0].weight.tolist() == [[1.0, 1.0]]


# -- mg.save / mg.load -------------------------------------------------------------------------

@given(st.lists(tensors(), min_size=0, max_size=4), st.sampled_from(DEVICES))
def test_save_and_load_round_trip(tmp_path_factory, values, device):
    path = tmp_path_factory.mktemp("save") / "state.npz"
    sd = OrderedDict((f"layer{len(values) - i}.w", t) for i, t in enumerate(values))
    mg.save(sd, path)
    back = mg.load(path, device=device)
    assert isinstance(back, OrderedDict) and list(back) == list(sd)
    for key, t in sd.items():
        new = back[key]
        assert (new.dtype, new.shape, new.device.name) == (t.dtype, t.shape, device)
        assert new.is_leaf and not new.requires_grad
        np.testing.assert_array_equal(new.numpy(), t.numpy())
    archive = np.load(path, allow_pickle=False)  # an ordinary NumPy archive
    assert archive.files == list(sd)


def test_keys_that_end_in_npy_come_back_with_their_own_values(tmp_path):
    """The archive member of key k is k + ".npy"; NumPy's archive[k] finds the member
    "a.npy" (key "a") for the key "a.npy" before "a.npy.npy", so both keys loaded a's
    values. Each member is read by its own name now."""
    path = tmp_path / "state.npz"
    sd = {"a": mg.tensor([1.0, 2.0]), "a.npy": mg.tensor([3.0, 4.0]),
          "a.npy.npy": mg.tensor([5.0])}
    mg.save(sd, path)
    assert {k: v.tolist() for k, v in mg.load(path).items()} == \
        {"a": [1.0, 2.0], "a.npy": [3.0, 4.0], "a.npy.npy": [5.0]}


def test_save_a_model_load_into_another(tmp_path):
    model, other = Block(), Block()
    with mg.no_grad():
        for p in other.parameters():
            p -= 1.0
    path = tmp_path / "block.npz"
    mg.save(model.state_dict(), path)
    other.load_state_dict(mg.load(path))
    x = mg.tensor(np.ones((2, 4)))
    np.testing.assert_array_equal(other(x).numpy(), model(x).numpy())
    assert mg.load(path)["fc.weight"].device.name == "cpu"
    with mg.device("cpu:2"):
        assert mg.load(path, device=None)["fc.weight"].device.name == "cpu:2"


def test_keys_that_are_numpy_savez_argument_names_are_kept(tmp_path):
    sd = OrderedDict([("file", np.ones(2)), ("allow_pickle", np.zeros(1)), ("arr_0", np.ones(1)),
                      ("a/b.c", np.ones(1)), ("émoji ✓", np.ones(1))])
    mg.save(sd, tmp_path / "names.npz")
    assert list(mg.load(tmp_path / "names.npz")) == list(sd)


def test_save_refuses_bad_values_and_keys_and_writes_nothing(tmp_path):
    path = tmp_path / "x.npz"
    cases = [({"a": [1.0, 2.0]}, TypeError, r"value for 'a' is a list"),
             ({"a": 3.0}, TypeError, r"value for 'a' is a float"),
             ({"a": np.array([object()])}, DTypeError, r"'a' has dtype object"),
             ({"h": np.ones(2, dtype=np.float16)}, DTypeError, r"'h' has dtype float16"),
             ({1: np.ones(2)}, TypeError, r"keys must be strings, got 1"),
             ({"a\x00b": np.ones(2)}, ArchiveError, r"key 'a\\x00b' cannot be stored"),
             ({"": np.ones(2)}, ArchiveError, r"key '' cannot be stored"),
             ([np.ones(2)], TypeError, r"expected a dict")]
    for sd, error, message in cases:
        with pytest.raises(error, match=message):
            mg.save(sd, path)
    assert os.listdir(tmp_path) == []


def test_a_failed_save_leaves_an_existing_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "model.npz"
    mg.save({"w": np.arange(3.0)}, path)
    before = path.read_bytes()
    calls = []

    def failing_write(f, array, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        return real_write(f, array, **kwargs)

    real_write = np.lib.format.write_array
    monkeypatch.setattr(np.lib.format, "write_array", failing_write)
    with pytest.raises(OSError, match="disk full"):
        mg.save({"w": np.zeros(3), "b": np.zeros(2)}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.npz"]  # no temporary file left behind
    monkeypatch.undo()
    np.testing.assert_array_equal(mg.load(path)["w"].numpy(), np.arange(3.0))


class _Payload:
    """Unpickling this would create a file: the proof that a load did unpickle."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_load_never_unpickles(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.npz"
    attack = np.empty(1, dtype=object)
    attack[0] = _Payload(str(marker))
    np.savez(evil, weight=np.ones(2), attack=attack)
    with pytest.raises(ArchiveError, match=r"'attack' is not an array .* without unpickling; "
                       r"refused \(Object arrays"):
        mg.load(evil)
    assert not marker.exists()
    pickled = tmp_path / "model.pkl"
    pickled.write_bytes(pickle.dumps({"w": _Payload(str(marker))}))
    with pytest.raises(ArchiveError, match=r"not an \.npz archive.*without unpickling"):
        mg.load(pickled)
    assert not marker.exists()


def test_load_refuses_a_single_npy_file(tmp_path):
    np.save(tmp_path / "one.npy", np.ones(2))
    with pytest.raises(ArchiveError, match=r"single array \(\.npy\)"):
        mg.load(tmp_path / "one.npy")


# -- regressions: each docstring says what was wrong ---------------------------------------------

def _flip(path, find, offset, bit, out):
    """A copy of ``path`` with one bit flipped, ``offset`` bytes into ``find``."""
    raw = bytearray(path.read_bytes())
    raw[raw.index(find) + offset] ^= bit
    out.write_bytes(bytes(raw))
    return out


@pytest.mark.parametrize("find, offset, bit", [
    (b"(2, 5000)", 4, 0x04),  # the shape (2, 5000) becomes (2, 1000)
    (b"'<f8'", 3, 0x0C),      # the dtype '<f8' becomes '<f4': the bytes read as garbage
])
def test_load_refuses_an_entry_whose_crc_does_not_match(tmp_path, find, offset, bit):
    """An entry was read only as far as its (corrupted) header said, so zipfile never
    reached the end where it checks the CRC-32, and a one-bit flip loaded as another
    shape or dtype. Oracle: zipfile's own check, testzip(), names the entry."""
    good = tmp_path / "good.npz"
    mg.save({"w": np.arange(10000.0).reshape(2, 5000), "b": np.ones(3)}, good)
    bad = _flip(good, find, offset, bit, tmp_path / "bad.npz")
    with zipfile.ZipFile(bad) as z:
        assert z.testzip() == "w.npy"
    with pytest.raises(ArchiveError, match=r"bad\.npz'.*entry 'w' is damaged.*CRC"):
        mg.load(bad)


def test_damaged_files_raise_archive_error_naming_the_file(tmp_path):
    """An empty, truncated or damaged file escaped as EOFError or BadZipFile, a lost
    directory entry loaded one key fewer, and short .npy data was called an object
    array. Oracles: zipfile's end record (how many entries there are) and the bytes cut."""
    good = tmp_path / "good.npz"
    mg.save({"w": np.arange(6.0), "y": np.array([1, 2])}, good)
    raw = good.read_bytes()
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "half.npz").write_bytes(raw[:len(raw) // 2])
    # a comment length in the central directory: the entry after it is swallowed
    lost = _flip(good, b"PK\x01\x02", 32, 0x80, tmp_path / "lost.npz")
    end = raw.rindex(b"PK\x05\x06")
    assert int.from_bytes(raw[end + 10:end + 12], "little") == 2  # what the end record says
    npy = io.BytesIO()
    np.lib.format.write_array(npy, np.arange(4.0))
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z:
        z.writestr("a.npy", npy.getvalue()[:-8])  # a consistent CRC, 8 data bytes missing
    cases = [("empty", r"not an \.npz archive"), ("half", r"not an \.npz archive"),
             ("lost", r"end record says it has 2 entries, its directory lists 1"),
             ("short", r"entry 'a' is not an array")]
    for name, message in cases:
        with pytest.raises(ArchiveError, match=rf"'.*{name}\.npz'.*{message}"):
            mg.load(tmp_path / f"{name}.npz")


def test_save_refuses_keys_a_zip_name_cannot_hold_before_writing(tmp_path):
    """A key longer than a zip name's 65535 bytes (struct.error) or not encodable as
    UTF-8 (UnicodeEncodeError) failed half-way through writing. Oracle: the encoded
    length, and an empty folder afterwards."""
    long_key = "k" * 70000
    assert len((long_key + ".npy").encode("utf-8")) > 0xFFFF
    for key, message in [(long_key, "70004 bytes long"), ("\udcff", "not valid Unicode")]:
        with pytest.raises(ArchiveError, match=message):
            mg.save({"ok": np.ones(1), key: np.ones(1)}, tmp_path / "x.npz")
    assert os.listdir(tmp_path) == []


def test_save_gives_the_file_the_mode_open_gives_under_the_umask(tmp_path):
    """save set the mode 0o644 whatever the umask: under umask 077 a private file became
    readable by everyone. Oracle: the mode of a file made by open()."""
    old = os.umask(0o077)
    try:
        for mask in (0o077, 0o022):
            os.umask(mask)
            mg.save({"a": np.ones(1)}, tmp_path / f"{mask:o}.npz")
            open(tmp_path / f"{mask:o}.txt", "w").close()
            modes = {os.stat(tmp_path / f"{mask:o}.{ext}").st_mode & 0o777
                     for ext in ("npz", "txt")}
            assert modes == {0o666 & ~mask}
    finally:
        os.umask(old)


def test_mg_from_dlpack_of_a_negated_torch_view():
    """z.conj().imag is a view PyTorch marks as negated; its __dlpack__ exports the
    memory without the sign, so mg.from_dlpack gave every value negated. Oracle: the
    closed form -Im(z), and torch's own values."""
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex128)
    im = z.conj().imag
    assert im.is_neg()
    t = mg.from_dlpack(im)
    np.testing.assert_array_equal(t.numpy(), [-2.0, 4.0])
    np.testing.assert_array_equal(t.numpy(), im.resolve_neg().numpy())
    with pytest.raises(TypeError, match=r"torch\.Tensor is a negated view.*copy=True"):
        mg.from_dlpack(im, copy=False)


def test_save_and_chrome_trace_write_as_open_does_and_name_the_users_path(tmp_path):
    """mg.save to a missing folder said "No such file or directory:
    '/missing/.m.npz.879d....tmp'", and to a folder it wrote the whole archive into the
    folder's parent before failing on a name the user never chose; mg.save replaced a
    link with a file, where np.save (the oracle, as open does) writes through it and
    to_chrome_trace did too. One write (minigraph/files.py) now serves both."""
    state = {"w": mg.tensor([1.0, 2.0])}
    with pytest.raises(FileNotFoundError) as expected:
        open(tmp_path / "missing" / "m.npz", "wb")
    with pytest.raises(FileNotFoundError) as got:
        mg.save(state, tmp_path / "missing" / "m.npz")
    assert str(got.value) == str(expected.value)
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        mg.save(state, tmp_path)
    assert list(tmp_path.iterdir()) == []  # (no temporary file left behind)

    target, link = tmp_path / "real.npz", tmp_path / "link.npz"
    target.write_bytes(b"an older file")
    link.symlink_to(target)
    mg.save(state, link)
    assert link.is_symlink()
    np.testing.assert_array_equal(mg.load(target)["w"].numpy(), [1.0, 2.0])


def test_what_cannot_be_replaced_whole_is_written_as_open_writes_it(tmp_path):
    """mg.save replaced a FIFO with a regular file (its reader got nothing), failed on
    /dev/stdout, broke a hard link (the other name kept the old content), wrote
    "out.npz/" as out.npz and called "" a folder; open(path, "wb"), the oracle, writes
    into the FIFO and through the link, and refuses the other two."""
    state = {"w": mg.tensor([1.0, 2.0])}
    for bad, error in (("", FileNotFoundError), (str(tmp_path / "out.npz") + "/",
                                                 IsADirectoryError)):
        with pytest.raises(error):
            open(bad, "wb")
        with pytest.raises(error):
            mg.save(state, bad)
    assert list(tmp_path.iterdir()) == []

    first, second = tmp_path / "a.npz", tmp_path / "b.npz"
    first.write_bytes(b"old")
    os.link(first, second)
    mg.save(state, first)
    np.testing.assert_array_equal(np.load(second)["w"], [1.0, 2.0])  # (one file, two names)

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    mg.save(state, fifo)
    reader.join(10)
    assert fifo.is_fifo() and got and got[0].startswith(b"PK")  # (a zip: the archive)
