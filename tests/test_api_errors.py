"""Public APIs given the wrong kind of argument: a right result or an error that names the
API and the argument, never a silent wrong value or a raw Python/NumPy error. Oracles:
PyTorch (torch, torch.func), NumPy and hand counts."""

import re

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.errors import DeviceError, ShapeError


# -- optimizer arguments ----------------------------------------------------------------------

def test_sgd_refuses_a_single_tensor_as_pytorch_does():
    """SGD(p, lr) iterated over p's elements (new getitem results), so step() left p as
    it was; PyTorch refuses a tensor there with a TypeError."""
    with pytest.raises(TypeError, match="iterable of Tensors"):
        torch.optim.SGD(torch.tensor([1.0, 2.0], requires_grad=True), lr=0.1)
    with pytest.raises(TypeError, match=r"iterable of Tensors.*SGD\(\[p\]"):
        mg.nn.SGD(mg.tensor([1.0, 2.0], requires_grad=True), lr=0.1)


def test_sgd_checks_lr_when_it_is_made():
    """A str or None failed with Python's comparison error, an array only at step(). A
    NumPy float is a real number and still works: one step is p - lr * 2p (the gradient
    of sum(p * p), by hand)."""
    p = mg.tensor([1.0, 2.0], requires_grad=True)
    for lr in ("0.1", None, np.array([0.1])):
        with pytest.raises(TypeError, match=f"SGD: lr must be a real number, got "
                                            f"{type(lr).__name__}"):
            mg.nn.SGD([p], lr=lr)
    opt = mg.nn.SGD([p], lr=np.float64(0.1))
    (p * p).sum().backward()
    opt.step()
    np.testing.assert_allclose(p.numpy(), np.array([1.0, 2.0]) * (1 - 0.2))


# -- virtual CPU devices ----------------------------------------------------------------------

def test_a_refused_set_virtual_cpus_changes_no_device():
    """set_virtual_cpus(1.5) deleted cpu:2 and cpu:3 before its TypeError."""
    before = mg.devices()
    with pytest.raises(TypeError, match="set_virtual_cpus: n must be an int, got float 1.5"):
        mg.set_virtual_cpus(1.5)
    assert mg.devices() == before


def test_a_virtual_cpu_that_comes_back_is_the_same_device():
    """Shrinking then growing made a new cpu:2: a tensor made there before and one made
    after "lived on different devices (cpu:2)", and the old one's bytes were counted on a
    Device the registry had forgotten."""
    a = mg.tensor([1.0, 2.0], device="cpu:2")
    mg.set_virtual_cpus(1)
    mg.set_virtual_cpus(3)
    b = mg.tensor([3.0, 5.0], device="cpu:2")
    assert a.device is b.device is mg.device("cpu:2")
    np.testing.assert_array_equal((a + b).numpy(), np.array([1.0, 2.0]) + [3.0, 5.0])
    assert mg.device("cpu:2").live_bytes >= a.numpy().nbytes + b.numpy().nbytes


# -- where a copy lives -----------------------------------------------------------------------

@pytest.mark.parametrize("copy", [True, False])
def test_from_dlpack_of_a_tensor_keeps_its_device(copy):
    """A cpu:1 tensor came back on "cpu" (DLPack only says "CPU memory"), and with
    copy=False a "cpu" tensor shared cpu:1's memory; torch.from_dlpack keeps the device."""
    a = mg.tensor([1.0, 2.0], device="cpu:1")
    b = mg.from_dlpack(a, copy=copy)
    assert b.device.name == "cpu:1"
    np.testing.assert_array_equal(b.numpy(), [1.0, 2.0])
    assert np.shares_memory(b.numpy(), a.numpy()) == (not copy)


def test_tensor_of_a_tensor_stays_on_its_device_outside_a_scope():
    """mg.tensor(t) of a cpu:1 tensor moved it to "cpu"; PyTorch's torch.tensor(t) uses
    t's device when none is given. An open mg.device scope still decides (the contract)."""
    a = mg.tensor([1.0, 2.0], device="cpu:1")
    assert mg.tensor(a).device.name == "cpu:1"
    with mg.device("cpu:2"):
        assert mg.tensor(a).device.name == "cpu:2"


# -- sequences of tensors, ragged lists ---------------------------------------------------------

def test_a_sequence_of_tensors_is_refused_where_an_array_is_expected():
    """mg.tensor((x,)) and matmul((x,), W) made an array with an extra axis (or of
    objects) without a word; PyTorch refuses a tuple of a tensor of several elements."""
    with pytest.raises((TypeError, ValueError), match="only one element tensors"):
        torch.tensor((torch.ones(1, 2),))
    x, w = mg.tensor([[1.0, 2.0]]), mg.tensor([[1.0], [2.0]])
    with pytest.raises(TypeError, match=r"element 0 of the tuple is a Tensor.*mg\.stack"):
        mg.tensor((x,))
    with pytest.raises(TypeError, match=r"mg\.stack"):
        mg.matmul((x,), w)


def test_functional_call_takes_its_arguments_as_one_tuple_as_torch_does():
    """functional_call(m, {}, (x,)) gave shape (1, 1, 1): the tuple became an array."""
    m = mg.nn.Linear(2, 1, seed=0)
    tm = torch.nn.Linear(2, 1).double()
    with torch.no_grad():
        tm.weight.copy_(torch.from_numpy(m.weight.numpy().T.copy()).reshape(tm.weight.shape))
        tm.bias.copy_(torch.from_numpy(m.bias.numpy().copy()).reshape(tm.bias.shape))
    x = np.array([[1.0, 2.0]])
    want = torch.func.functional_call(tm, dict(tm.named_parameters()), (torch.from_numpy(x),))
    got = mg.nn.functional_call(m, {}, (mg.tensor(x),))
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy())
    np.testing.assert_allclose(mg.nn.functional_call(m, {}, mg.tensor(x)).numpy(),
                               want.detach().numpy())  # (one argument, as before)


def test_a_ragged_list_is_refused_naming_where_as_pytorch_does():
    """NumPy's "inhomogeneous shape after 1 dimensions" named neither the argument nor the
    place; PyTorch says "expected sequence of length 2 at dim 1 (got 1)"."""
    with pytest.raises(ValueError, match="length 2 at dim 1 \\(got 1\\)"):
        torch.tensor([[1.0, 2.0], [3.0]])
    with pytest.raises(ValueError, match="data is a ragged nested list: expected a sequence "
                                         "of length 2 at dim 1, got 1"):
        mg.tensor([[1.0, 2.0], [3.0]])
    with pytest.raises(ValueError, match="ragged.*expected a number at dim 1, got a list"):
        mg.tensor([1.0, [2.0]])
    assert mg.tensor([[], []]).shape == np.array([[], []]).shape  # (empty rows agree)


@pytest.mark.parametrize("data", [None, "a"], ids=["None", "str"])
def test_tensor_of_none_or_a_str_says_what_it_got(data):
    """It said "tensor(): dtype object is not supported", a dtype nobody asked for."""
    with pytest.raises(TypeError, match=f"cannot make a tensor of {data!r} "
                                        f"\\(a {type(data).__name__}\\)"):
        mg.tensor(data)


def test_backward_with_a_str_gradient_names_backward():
    """z.backward("x") failed in NumPy: "could not convert string to float: 'x'"."""
    z = mg.tensor(1.0, requires_grad=True) * 2
    with pytest.raises(TypeError, match="backward\\(\\): grad .* got a str"):
        z.backward("x")


# -- memory counters on Array API devices ---------------------------------------------------

def test_session_counts_bytes_on_devices_whose_arrays_have_no_nbytes(strict_devices):
    """array-api-strict arrays have no .nbytes: a run counted 0 bytes moved though 1000
    float64 (8000 bytes, the hand count) crossed from cpu to cpu:1."""
    with mg.Graph() as g:
        x = mg.placeholder((1000,), name="x")
        with mg.device("cpu:1"):
            y = mg.sum(mg.exp(x))
    sess = mg.Session(g)
    sess.run(y, {x: np.zeros(1000)})
    assert sess.last_run.bytes_moved == {("cpu", "cpu:1"): 1000 * 8}
    assert sess.last_run.peak_bytes["cpu:1"] >= 1000 * 8


# -- sessions and parallel helpers -----------------------------------------------------------

def test_session_refuses_a_feed_dict_that_is_not_a_dict_and_workers_not_an_int():
    """A list of pairs ended in "'list' object has no attribute 'items'", workers="2" in
    "'<' not supported between instances of 'str' and 'int'"."""
    with mg.Graph() as g:
        x = mg.placeholder((2,), name="x")
        y = (x * 2).sum()
    with pytest.raises(TypeError, match="run: feed_dict must be a dict .* got a list"):
        mg.Session(g).run(y, feed_dict=[(x, [1.0, 2.0])])
    with pytest.raises(TypeError, match="Session: workers must be an int, got str '2'"):
        mg.Session(g, workers="2")
    assert mg.Session(g).run(y, {x: [1.0, 2.0]}) == 6.0  # (a dict, as before: 2 * (1 + 2))


def test_scatter_of_a_scalar_and_allreduce_of_numbers_name_the_api():
    """They raised IndexError ("tuple index out of range") and AttributeError."""
    with pytest.raises(ShapeError, match="scatter: x is a 0-d tensor"):
        mg.parallel.scatter(mg.tensor(1.0), ["cpu"])
    with pytest.raises(TypeError, match="allreduce: tensors\\[0\\] is a float, not a Tensor"):
        mg.parallel.allreduce([1.0, 2.0])


def test_parallel_cross_entropy_names_shards_of_different_lengths():
    """Shards of 2 and 3 rows met in maximum(), whose error named neither the API nor
    the shards."""
    shards = [mg.tensor(np.zeros((2, 2))), mg.tensor(np.zeros((3, 2)), device="cpu:1")]
    with pytest.raises(ShapeError, match=r"parallel_cross_entropy: .* \[\(2, 2\), \(3, 2\)\]"):
        mg.parallel.parallel_cross_entropy(shards, mg.tensor([0, 1]))


# -- arguments of ops and transformations -----------------------------------------------------

def test_an_op_given_none_or_a_str_names_the_op_and_the_argument():
    """The error named tensor(), a function the caller never called."""
    w = mg.ones(2)
    for call, op in ((lambda: w + None, "add"), (lambda: w ** "a", "pow"),
                     (lambda: mg.maximum(w, "a"), "maximum")):
        with pytest.raises(TypeError, match=rf"^{op}: argument 1 \((NoneType|str)\) is not a "
                                            r"tensor"):
            call()
    with pytest.raises(TypeError):  # (PyTorch refuses the same)
        torch.ones(2) + None


def test_keepdims_and_the_elements_of_stack_are_checked_by_type():
    """keepdims="yes" is true, so the axes were kept; a str among stack's tensors was
    read as a shape-() operand ("all tensors must have the same shape")."""
    with pytest.raises(TypeError, match="sum: keepdims must be a bool, got str"):
        mg.ones((2, 3)).sum(axis=1, keepdims="yes")
    assert mg.ones((2, 3)).sum(axis=1, keepdims=np.True_).shape == (2, 1)
    for op in (mg.stack, mg.concatenate, mg.add_n):
        with pytest.raises(TypeError, match=r"element 1 is (None|'a'), not a tensor"):
            op([mg.ones(2), None if op is mg.add_n else "a"])


def test_load_state_dict_names_a_value_that_is_no_array():
    """None or a dict became a 0-d object array: "the value has shape ()"."""
    model = mg.nn.Linear(2, 2, seed=0)
    before = model.weight.numpy().copy()
    for value, kind in ((None, "NoneType"), ({}, "dict"), ("ab", "str")):
        with pytest.raises(mg.nn.StateDictError, match=f"the value for 'weight' is a {kind}, "
                                                       f"not an array of numbers"):
            model.load_state_dict({"weight": value, "bias": model.bias})
    np.testing.assert_array_equal(model.weight.numpy(), before)


def test_jvp_and_gradcheck_take_their_arguments_as_a_tuple():
    """mg.jvp(f, 1.0, 1.0) failed inside with "object of type 'float' has no len()"."""
    with pytest.raises(TypeError, match=r"jvp: primals must be a tuple or list"):
        mg.jvp(mg.sin, 1.0, 1.0)
    with pytest.raises(TypeError, match=r"jvp: tangents must be a tuple or list"):
        mg.jvp(mg.sin, (1.0,), 1.0)
    with pytest.raises(TypeError, match=r"gradcheck: inputs must be a tuple or list"):
        mg.gradcheck(mg.sin, 1.0)
    value, tangent = mg.jvp(mg.sin, (1.0,), (1.0,))
    assert float(tangent.item()) == pytest.approx(np.cos(1.0), rel=1e-15)


def test_a_bad_label_under_vmap_names_nll_loss():
    """The batching rule checked labels through one_hot, which the error named."""
    with pytest.raises(IndexError, match=r"^nll_loss: label 5"):
        mg.vmap(mg.nll_loss)(mg.zeros((2, 3, 4)), mg.tensor([[0, 1, 2], [0, 1, 5]]))


def test_set_virtual_cpus_leaves_a_registered_cpu_named_device_alone():
    """A device registered as "cpu:fast" broke every later set_virtual_cpus with
    int('fast')."""
    import importlib

    device_module = importlib.import_module("minigraph.device")

    saved = dict(device_module._registry)
    try:
        mg.register_device("cpu:fast", np)
        mg.set_virtual_cpus(2)
        assert {"cpu:fast", "cpu:1", "cpu:2"} <= set(mg.devices())
        assert "cpu:3" not in mg.devices()
    finally:
        device_module._registry.clear()
        device_module._registry.update(saved)
        mg.set_virtual_cpus(3)


def _product(x, y):
    return (x * y).sum()


def test_every_mode_refuses_mixed_devices_with_one_message():
    """The refusal of arguments on two devices was written four times (the eager
    stack/matmul check, the tape, graph building, source mode); source mode's said
    neither the shapes nor how to move one. Now every mode names the op, both devices,
    each argument and the fix; a graph adds the user's line, source mode its line."""
    x, y = mg.tensor([1.0, 2.0]), mg.tensor([3.0, 4.0], device="cpu:1")
    for mode, given in [("tape", r"shape \(2,\) float64 on cpu, shape \(2,\) float64 on cpu:1"),
                        ("graph", "'x' on cpu, 'y' on cpu:1"),
                        ("source", r"shape \(2,\) float64 on cpu, shape \(2,\) float64 on cpu:1")]:
        with pytest.raises(DeviceError) as caught:
            mg.grad(_product, mode=mode)(x, y)
        assert re.match(r"mul: arguments live on different devices \(cpu and cpu:1\): "
                        + given + r"\. minigraph never copies silently; move one with "
                        r"x\.to\('cpu'\)", str(caught.value)), (mode, str(caught.value))
        if mode != "tape":  # (a graph's node and source mode's statement: the user's line)
            assert "return (x * y).sum()" in str(caught.value), mode


def _ignores_a(x, a):
    return (x * 2.0).sum()


@pytest.mark.parametrize("array", [np.array([1.0, "s"], dtype=object), np.array(["s"]),
                                   np.ones(2, np.float16)])
def test_an_array_of_an_unsupported_dtype_is_refused_naming_the_transform_and_argument(array):
    """An object, str or float16 array passed to a compiled function was refused as
    "tensor(): dtype object is not supported", naming a function the user never called
    and no argument. NumPy's dtype names are the oracle; the tape, which hands f the
    array as it is, still gives d(2 sum x)/dx = 2."""
    x = mg.tensor([1.0, 3.0])
    for run in (mg.grad(_ignores_a, mode="graph"), mg.grad(_ignores_a, mode="source")):
        with pytest.raises(mg.errors.DTypeError,
                           match=rf"graph and source mode: argument 1 \(a NumPy array\): "
                                 rf"dtype {array.dtype.name} is not supported"):
            run(x, array)
    with pytest.raises(mg.errors.DTypeError,
                       match=rf"checkpoint\(_ignores_a\): argument 1 \(an array\): dtype "
                             rf"{array.dtype.name} is not supported"):
        mg.checkpoint(_ignores_a)(x, array)
    np.testing.assert_array_equal(mg.grad(_ignores_a)(x, array).numpy(), [2.0, 2.0])


def _reads_data(x):
    x.data
    return mg.sum(x)


def _exports(x):
    np.from_dlpack(x)
    return mg.sum(x)


@pytest.mark.parametrize("f", [_reads_data, _exports])
def test_the_array_of_a_value_inside_a_transformation_is_refused_clearly(f):
    """x.data and DLPack export (np.from_dlpack, torch.from_dlpack) of a value inside
    mg.vmap, mg.grad, mg.jvp or a graph failed with "'BatchTracer' object has no
    attribute 'data'" (or torch's "invalid capsule"), naming an internal class, where
    x.numpy() got a clear refusal; torch.func.vmap refuses .data too. On a tensor, both
    still hand out its array (NumPy's values are the oracle)."""
    x = mg.tensor([1.0, 2.0])
    calls = {"vmap": lambda: mg.vmap(f)(mg.tensor(np.ones((2, 2)))),
             "tape": lambda: mg.grad(f)(x), "forward": lambda: mg.grad(f, mode="forward")(x),
             "graph": lambda: mg.grad(f, mode="graph")(x)}
    for name, call in calls.items():
        with pytest.raises(mg.errors.NoArrayError,
                           match=r"(\.data|DLPack export).*(per example|being differentiated|"
                                 r"graph node has no array)"):
            call()
    with pytest.raises(mg.errors.NoArrayError, match="DLPack export"):
        mg.vmap(lambda v: (torch.from_dlpack(v), v)[1])(mg.tensor(np.ones((2, 2))))
    np.testing.assert_array_equal(x.data, [1.0, 2.0])
    np.testing.assert_array_equal(np.from_dlpack(x), [1.0, 2.0])
    assert getattr(mg.vmap(lambda v: getattr(v, "data", None) is None and v)(
        mg.tensor(np.ones((2, 2)))), "shape") == (2, 2)  # (getattr's default still answers)


def _times(x, y):
    return x * y


def test_a_value_that_is_not_an_array_is_named_by_op_and_argument_in_every_mode():
    """In a graph, mg.trace and graph mode, ``x * 'a'`` said "tensor(): cannot make a
    tensor of 'a'", naming a function the user never called and no argument; so did
    mg.jvp's tangents and mg.gradcheck's inputs. Eager mode's message is the model."""
    x = mg.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match=r"mul: argument 1 \(str\) is not a tensor"):
        _times(x, "a")
    with mg.Graph():
        with pytest.raises(TypeError, match=r"mul: argument 1 \(str\) is not a tensor"
                                            r"(.|\n)*at .*test_api_errors.py"):
            _times(mg.placeholder((2,), name="p"), "a")
    for run in (mg.trace(_times), mg.grad(lambda a, b: mg.sum(_times(a, b)), mode="graph")):
        with pytest.raises(TypeError, match=r"mul: argument 1 \(str\) is not a tensor"):
            run(x, "a")
    with pytest.raises(TypeError, match=r"jvp: tangent 1 \(NoneType\) is not a tensor"):
        mg.jvp(_times, (x, x), (x, None))
    with pytest.raises(TypeError, match=r"gradcheck: input 1 \(str\) is not a tensor"):
        mg.gradcheck(_times, (x, "a"))


@pytest.mark.parametrize("name", [None, 7, ["w"]])
def test_a_name_that_is_not_a_str_is_refused_clearly(name):
    """mg.name_scope(None) raised "'NoneType' object has no attribute 'strip'" and
    placeholder(name=7) "can only concatenate str (not "int") to str" (TF1 says a name
    must be a string); the graph stays usable."""
    with mg.Graph() as g:
        with pytest.raises(TypeError, match="name_scope: the name must be a str"):
            with mg.name_scope(name):
                pass
        if name is not None:  # (None is the default: an automatic name)
            for make in (lambda: mg.placeholder((2,), name=name),
                         lambda: mg.constant([1.0], name=name)):
                with pytest.raises(TypeError, match="a node's name must be a str"):
                    make()
        p = mg.placeholder((2,), name="y")
        y = p * 2.0
    np.testing.assert_array_equal(mg.Session(g).run(y, {p: np.ones(2)}), [2.0, 2.0])


def test_ops_refuse_what_is_not_an_operand_naming_the_op():
    """matmul(None, x) and x @ 'ab' said "operands must have at least one axis, got
    shapes () and (2,)" (None read as a number of shape ()), sum_to(None, (1,)) spoke of
    "x's shape ()", astype(None) and to_device(None) raised raw AttributeErrors, astype of
    a ragged list NumPy's "inhomogeneous shape"; NumPy and PyTorch raise a TypeError
    for such operands. AddN's refusal lists every term's shape, in order."""
    x = mg.tensor([1.0, 2.0])
    with pytest.raises(TypeError):
        np.ones(2) @ "ab"  # (NumPy's own refusal)
    for call, message in [(lambda: mg.matmul(None, x), "matmul: the first operand .* not NoneType"),
                          (lambda: x @ "ab", "matmul: the second operand .* not str"),
                          (lambda: mg.sum_to(None, (1,)), "sum_to: the input .* not NoneType"),
                          (lambda: mg.astype(None, "float32"), "astype: the input .* not NoneType"),
                          (lambda: mg.to_device(None, "cpu"), "to_device: x must be a tensor")]:
        with pytest.raises(TypeError, match=message):
            call()
    with pytest.raises(ShapeError, match="astype: the input is a nested list whose rows"):
        mg.astype([[1.0, 2.0], [3.0]], "float32")
    with pytest.raises(ShapeError, match=r"got the shapes \[\(2,\), \(2,\), \(3,\)\]"):
        mg.add_n([x, x, mg.tensor([1.0, 2.0, 3.0])])
    np.testing.assert_array_equal(mg.matmul([1.0, 2.0], x).numpy(), 5.0)  # (lists still work)


def test_a_broadcast_refusal_gives_each_arguments_size_in_order():
    """(3,) + (2,) said "axis -1: sizes [2, 3]", sorted, so which argument had which size
    was lost; NumPy's message lists the shapes in argument order, and so do the sizes."""
    with pytest.raises(ValueError, match=r"\(3,\) \(2,\)"):
        np.ones(3) + np.ones(2)
    with pytest.raises(ShapeError, match=r"shapes \(3,\) and \(2,\) do not broadcast "
                                         r"\(axis -1: sizes 3, 2\)"):
        mg.tensor([1.0, 2.0, 3.0]) + mg.tensor([1.0, 2.0])


def _times_a(x, a):
    return mg.sum(x * a)


def test_a_numpy_scalar_of_an_unsupported_dtype_is_named():
    """np.float16(1.0) passed to a compiled function was refused as an error of tensor(),
    and np.uint8(200) multiplied into a tensor raised a raw KeyError('uint8') in source
    mode's dtype promotion; the tape's refusal names the op and the dtype."""
    x = mg.tensor([1.0, 2.0])
    with pytest.raises(mg.errors.DTypeError, match=r"argument 1 \(a NumPy scalar\): dtype "
                                                   r"float16 is not supported"):
        mg.grad(_times_a, mode="graph")(x, np.float16(1.0))
    with pytest.raises(mg.errors.DTypeError, match="dtype uint8 is not supported"):
        mg.grad(_times_a)(x, np.uint8(200))
    with pytest.raises(mg.errors.DTypeError, match="mul: dtype uint8 is not supported"):
        mg.ops.shape_rules.elementwise("mul")(x, np.uint8(200))
    with pytest.raises(mg.errors.DTypeError, match="mul: dtype uint8 is not supported"):
        mg.grad(_times_a, mode="source")(x, np.uint8(200))  # (not "no primitive for it")


def test_graph_modes_vjp_names_vjp_for_an_output_it_cannot_take():
    """mg.vjp(f, x, mode="graph") of an f returning None said "trace(<lambda>): f must
    return graph values", naming mg.trace, which the user did not call."""
    with pytest.raises(mg.graph.graph.GraphError, match="^vjp: f must return graph values"):
        mg.vjp(lambda v: None, mg.tensor([1.0]), mode="graph")


def test_to_device_sum_to_and_graph_refuse_what_they_cannot_take_by_name():
    """to_device of a NumPy array or a torch tensor took their own .device for ours and
    failed with "'str' object has no attribute 'xp'"; sum_to of a graph node of unknown
    shape raised "object of type 'NoneType' has no len()", and of a list or a NumPy
    value whose shape already fits returned it unchanged (not a tensor, as every op
    returns); Graph(5) was accepted and to_dot() failed later. Oracles: NumPy's sums and
    the tensor's type."""
    for value in (np.ones(2), torch.ones(2)):
        with pytest.raises(TypeError, match=r"to_device: x must be a tensor.*mg\.tensor"):
            mg.to_device(value, "cpu:1")
    with mg.Graph():
        x = mg.placeholder(None, name="x")
        with pytest.raises(ShapeError, match="sum_to: x's shape is known only when the graph"):
            mg.sum_to(x, (2,))
    for value in ([1.0, 2.0], np.array([1.0, 2.0])):
        got = mg.sum_to(value, (2,))
        assert isinstance(got, mg.Tensor)
        np.testing.assert_array_equal(got.numpy(), np.asarray(value))
    with pytest.raises(TypeError, match="Graph: the name must be a str, got 5"):
        mg.Graph(5)
