"""A function's compiled program (mg.trace, mode="graph"): where it puts its values, the
tensors it reads from outside, and what it says when it cannot.

Eager mode follows PyTorch's rule: an op's result lives on its inputs' device, inputs on
two devices are an error, and an ``mg.device`` scope places only what is made from
nothing (``mg.ones(3)``). A Python float or a NumPy array goes to the device of the
tensor it meets. A function's graph used TensorFlow's placement instead (the scope
wins, else the first input's device), so the same call gave another device, mixed two
devices without a word, and a program built under one default device was reused under
another. Oracles: that rule for the devices, NumPy and closed forms for the values.
Every test runs on NumPy's virtual devices and on array-api-strict's, whose devices
really are apart (a mixed kernel fails there), as a GPU's are.
"""

from __future__ import annotations

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import DeviceError, DTypeError
from minigraph.graph.graph import GraphError

X = np.array([0.5, -1.0, 2.0])


def f(x):
    return mg.sin(x) * 2.0


def summed(x):
    return mg.sum(mg.sin(x) * 2.0)


@pytest.mark.parametrize("how", ["trace", "graph value", "graph grad", "jacrev"])
def test_a_scope_around_the_call_does_not_move_a_result_computed_from_a_tensor(backend, how):
    x = mg.tensor(X, device="cpu:1")
    with mg.device("cpu:2"):
        if how == "trace":
            r, want = mg.trace(f)(x), 2 * np.sin(X)
        elif how == "graph value":
            r, want = mg.value_and_grad(summed, mode="graph")(x)[0], 2 * np.sin(X).sum()
        elif how == "graph grad":
            r, want = mg.grad(summed, mode="graph")(x), 2 * np.cos(X)
        else:
            r, want = mg.jacrev(f, mode="graph")(x), np.diag(2 * np.cos(X))
    assert r.device.name == "cpu:1"
    np.testing.assert_allclose(r.numpy(), want, rtol=1e-12)


def test_a_scope_inside_f_places_new_tensors_only(backend):
    def g(x):
        with mg.device("cpu:1"):
            y = mg.sin(x) * 2.0  # x's device, as in eager mode
            ones = mg.ones(3)    # made from nothing: the scope's
        return y, ones

    y, ones = mg.trace(g)(mg.tensor(X))
    assert (y.device.name, ones.device.name) == ("cpu", "cpu:1")
    np.testing.assert_allclose(y.numpy(), 2 * np.sin(X), rtol=1e-12)
    with pytest.raises(DeviceError, match="different devices"):
        y + ones  # (where the traced y was labelled cpu:1, this passed: wrongly)


def test_a_program_built_under_one_default_device_is_not_reused_under_another(backend):
    made = mg.trace(lambda n: mg.ones(n) * 2.0)
    assert made(3).device.name == "cpu"
    with mg.device("cpu:2"):
        r = made(3)
    assert r.device.name == "cpu:2"
    np.testing.assert_array_equal(r.numpy(), [2.0, 2.0, 2.0])

    def scaled(x):
        return mg.sum(x * mg.ones(3))

    x1 = mg.tensor(X, device="cpu:1")
    grad = mg.grad(scaled, mode="graph")
    with mg.device("cpu:1"):
        np.testing.assert_array_equal(grad(x1).numpy(), np.ones(3))
    with pytest.raises(DeviceError, match="different devices"):
        grad(x1)  # ones(3) is on cpu now, as it is for scaled(x1) itself


@pytest.mark.parametrize("how", ["trace", "graph", "vjp"])
def test_inputs_on_two_devices_are_refused_naming_the_line(backend, how):
    def product(a, b):
        return mg.sum(a * b)  # the line the error names

    a, b = mg.tensor(X, device="cpu:1"), mg.tensor(X)
    call = {"trace": lambda: mg.trace(product)(a, b),
            "graph": lambda: mg.grad(product, argnums=(0, 1), mode="graph")(a, b),
            "vjp": lambda: mg.vjp(product, a, b, mode="graph")}[how]
    with pytest.raises(DeviceError, match=r"mul: arguments live on different devices "
                                          r"\(cpu and cpu:1\)(.|\n)*the line the error names"):
        call()


@pytest.mark.parametrize("mode", ["tape", "forward", "graph"])
def test_a_numpy_array_goes_to_the_device_of_the_tensor_it_meets(backend, mode):
    def weighted(x, s):
        return mg.sum(x * s)

    x, s = mg.tensor(X, device="cpu:1"), np.array([3.0, 4.0, 5.0])
    g = mg.grad(weighted, mode=mode)(x, s)  # d/dx sum(x * s) = s
    assert g.device.name == "cpu:1"
    np.testing.assert_array_equal(g.numpy(), s)
    r = mg.trace(weighted)(x, s)
    assert r.device.name == "cpu:1" and float(r.item()) == pytest.approx(X @ s)
    r = mg.trace(lambda x, c: x * c)(x, 2.5)  # a float too
    assert r.device.name == "cpu:1"
    np.testing.assert_array_equal(r.numpy(), 2.5 * X)


def test_a_compiled_graph_copies_along_an_edge_across_devices(backend):
    with mg.Graph() as g:
        with mg.device("cpu"):
            x = mg.placeholder((3,), name="x")
            a = mg.sin(x)
        with mg.device("cpu:1"):
            y = a * 2.0  # reads a, which lives on cpu: a Session sends it
    fn = mg.compile_graph(g, [x], [y])
    np.testing.assert_allclose(mg.Session(g).run(y, {x: X}), 2 * np.sin(X), rtol=1e-12)
    (r,) = fn(X)
    assert r.device.name == "cpu:1"
    np.testing.assert_allclose(r.numpy(), 2 * np.sin(X), rtol=1e-12)


def test_a_tensor_read_from_outside_that_requires_a_gradient_stays_on_the_tape():
    """f reads w (requires_grad) from outside its arguments: the program held w as a
    constant, so the result was cut off the tape, and backward() missed the path through
    it without a word. Oracle: torch.func.grad and torch's backward."""
    torch = pytest.importorskip("torch")
    from torch.func import grad as torch_grad

    x, w0 = np.array([0.3, -0.8, 1.1]), np.array([0.5, 1.5, -0.7])
    wt = torch.tensor(w0, requires_grad=True)
    gt = torch_grad(lambda x: torch.sum(torch.sin(x * wt) * x))(torch.tensor(x))
    (torch.sum(gt * gt) + torch.sum(wt * wt)).backward()
    w = mg.tensor(w0, requires_grad=True)
    g = mg.grad(lambda x: mg.sum(mg.sin(x * w) * x), mode="graph")(x)
    np.testing.assert_allclose(g.numpy(), gt.detach().numpy(), rtol=1e-12)
    (mg.sum(g * g) + mg.sum(w * w)).backward()
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-12)

    wt.grad = None
    (torch.sum(torch.sin(torch.tensor(x) * wt) * torch.tensor(x)) + torch.sum(wt)).backward()
    w = mg.tensor(w0, requires_grad=True)
    traced = mg.trace(lambda x: mg.sum(mg.sin(x * w) * x))
    for _ in range(2):  # (recorded, then replayed)
        w.grad = None
        (traced(mg.tensor(x)) + mg.sum(w)).backward()
        np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-12)
    with mg.no_grad():  # nothing recorded: the compiled code itself
        assert float(traced(mg.tensor(x)).item()) == pytest.approx(
            float(np.sum(np.sin(x * w0) * x)), rel=1e-12)


def test_graph_mode_inside_graph_mode_names_the_closure():
    """The inner function closes over the outer one's x: the error blamed the inner
    function's own parameter ("node 'y' belongs to another graph")."""
    def f(x):
        def h(y):
            return x + y
        return x * mg.grad(h, mode="graph")(1.0)

    with pytest.raises(GraphError, match=r"grad_h: the function being recorded reads a "
                                            r"value of the function around it(.|\n)*return x \+ y"):
        mg.grad(f, mode="graph")(2.0)


def test_a_placeholder_takes_numpy_dtypes_and_float16_is_named_as_a_float():
    with mg.Graph():
        assert mg.placeholder((2,), np.float32).dtype == "float32"
        assert mg.placeholder((2,), np.dtype("int64")).dtype == "int64"
    with pytest.raises(DTypeError, match="dtype float16; minigraph computes in float32 "
                                            "and float64"):
        mg.grad(lambda x: mg.sum(x), mode="graph")(np.ones(2, np.float16))
    with pytest.raises(DTypeError, match=r"dtype int64; pass floats \(e.g. 2.0"):
        mg.grad(lambda x: mg.sum(x), mode="graph")(np.ones(2, np.int64))


def _loss(w, labels):
    return mg.cross_entropy(w * 2.0, labels)  # the line a gradient's error names


def test_a_failing_gradient_node_names_the_line_of_f_that_made_its_op():
    """A gradient node of a compiled graph-mode gradient said it was created at the line
    of the gradient function's first call (where the program was built), not at the
    line of f whose op it differentiates, as the value's nodes say."""
    import inspect

    line = inspect.getsourcelines(_loss)[1] + 1
    grad = mg.grad(_loss, mode="graph")
    w = mg.tensor(np.array([[0.1, 0.2, 0.3], [0.3, -0.1, 0.0]]))
    grad(w, mg.tensor([0, 2]))  # built here
    with pytest.raises(Exception, match=rf"nll_loss_grad(.|\n)*created at .*"
                                        rf"test_function_graphs.py:{line}:"):
        grad(w, mg.tensor([0, 7]))  # label 7 of 3 classes


def test_a_traced_layer_accumulates_gradients_over_micro_batches():
    """Linear computes weight.T eagerly while it is recorded: a program that held that
    tensor fed the same tape entry to every call, and the second backward() found it
    released. The tape now runs the layer itself whenever one of the tensors the
    program read requires a gradient. Oracle: the closed form, d/dW sum(x W^T) summed
    over the micro-batches is the column sums of all the rows of x."""
    layer = mg.nn.Linear(2, 1, seed=0)
    traced = mg.trace(layer)
    batches = [np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[0.0, 1.0]])]
    for xb in batches:
        mg.sum(traced(mg.tensor(xb))).backward()
    np.testing.assert_array_equal(layer.weight.grad.numpy(),
                                  np.concatenate(batches).sum(0, keepdims=True))


def test_requires_grad_set_after_the_first_call_is_followed():
    """The program decided once, when it was built, that w was a constant: unfreezing w
    (requires_grad_) afterwards left every later w.grad None. Oracle: d/dw sum(x * w) =
    x."""
    w = mg.tensor([1.0, 2.0, 3.0])
    x = mg.tensor([4.0, 5.0, 6.0])
    traced = mg.trace(lambda x: mg.sum(x * w))
    traced(x)
    w.requires_grad_(True)
    traced(x).backward()
    np.testing.assert_array_equal(w.grad.numpy(), [4.0, 5.0, 6.0])
    g = mg.grad(lambda x: mg.sum(x * w * x), mode="graph")(x)  # 2 x w: its w-path too
    mg.sum(g).backward()
    np.testing.assert_array_equal(w.grad.numpy(), [4.0, 5.0, 6.0] + 2 * x.numpy())


def test_a_replayed_program_moves_an_array_it_read_to_the_tensors_device(backend):
    """The program replayed through bind (the tape records, or mg.grad runs it) made a
    NumPy array f read a tensor of the default device, beside x on cpu:1: DeviceError,
    where eager mode and the compiled code take it. Oracle: d/dx sum(x * c) = c."""
    c = np.array([1.0, 2.0, 3.0])
    traced = mg.trace(lambda x: mg.sum(x * c))
    x = mg.tensor(X, device="cpu:1", requires_grad=True)
    traced(x).backward()
    assert x.grad.device.name == "cpu:1"
    np.testing.assert_array_equal(x.grad.numpy(), c)
    g = mg.grad(traced)(mg.tensor(X, device="cpu:1"))
    assert g.device.name == "cpu:1"
    np.testing.assert_array_equal(g.numpy(), c)


class _Scaled:
    """A callable object, not a Module: its program reads self.w."""

    def __init__(self, w):
        self.w = w

    def __call__(self, x):
        return mg.sum(x * self.w.T.T)  # (computed from self.w while it is recorded)


def test_a_traced_callable_object_follows_its_attributes():
    """The reads of a callable object were not followed (only functions, methods and
    modules): after m.w was written or bound anew, the program kept the old value.
    Oracle: the closed form sum(x * w)."""
    m = _Scaled(mg.tensor([1.0, 2.0, 3.0]))
    traced = mg.trace(m)
    x = mg.tensor([1.0, 1.0, 1.0])
    assert float(traced(x).item()) == 6.0
    m.w -= 1.0
    assert float(traced(x).item()) == 3.0
    m.w = mg.tensor([10.0, 20.0, 12.0])
    assert float(traced(x).item()) == 42.0


@pytest.mark.parametrize("how", ["jacrev", "hessian", "vjp", "grad"])
def test_graph_mode_transforms_reach_a_weight_read_from_outside(how):
    """Every graph-mode transformation of an f that reads w (requires_grad) from outside
    gives the tape its call while it records: the value is torch.func's, and backward()
    of a function of it reaches w as torch's does (second order through w)."""
    torch = pytest.importorskip("torch")
    from torch import func as tf

    w0, x0 = np.array([0.5, -1.5, 0.7]), np.array([0.3, 0.8, -1.1])
    wt, w = torch.tensor(w0, requires_grad=True), mg.tensor(w0, requires_grad=True)

    def f(x):
        return mg.sin(x * w) * x

    def ft(x):
        return torch.sin(x * wt) * x

    ours, theirs = {
        "jacrev": (mg.jacrev(f, mode="graph"), tf.jacrev(ft)),
        "hessian": (mg.hessian(lambda x: mg.sum(f(x)), mode="graph"),
                    tf.hessian(lambda x: torch.sum(ft(x)))),
        "vjp": (lambda x: mg.vjp(f, x, mode="graph")[1](mg.ones(3))[0],
                lambda x: tf.vjp(ft, x)[1](torch.ones(3))[0]),
        "grad": (mg.grad(lambda x: mg.sum(f(x)), mode="graph"),
                 tf.grad(lambda x: torch.sum(ft(x)))),
    }[how]
    a, b = ours(mg.tensor(x0)), theirs(torch.tensor(x0))
    np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-12)
    mg.sum(a * a).backward()
    torch.sum(b * b).backward()
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-12)
