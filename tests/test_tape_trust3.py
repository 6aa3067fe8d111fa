"""The eager interpreter and the tape: views of 0-d results, item assignment of lists,
NumPy operands with Python numbers, add_n, backward()'s refusals, requires_grad switched
after use, kernel errors inside a checkpoint, and the names in forward mode's errors.
Oracles: PyTorch and NumPy."""

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.errors import GradientError, ShapeError

VIEWS = {"reshape": (lambda c: c.reshape(1), lambda c: c.reshape(1)),
         "None index": (lambda c: c[None], lambda c: c[None]),
         "ellipsis": (lambda c: c[...], lambda c: c[...]),
         "broadcast_to": (lambda c: mg.broadcast_to(c, (2,)), lambda c: c.expand(2)),
         "identity": (lambda c: mg.identity(c), lambda c: c.view_as(c))}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_views_of_a_reductions_0d_result_share_its_memory(view):
    """A reduction's 0-d result is a NumPy scalar, which has no memory: its views were
    copies, so ``c += 1`` did not show through them, as it does in PyTorch."""
    make, make_t = VIEWS[view]
    ct = torch.tensor([3.0, 4.0], dtype=torch.float64).sum()
    vt = make_t(ct)
    ct += 1
    c = mg.tensor([3.0, 4.0]).sum()
    v = make(c)
    c += 1
    assert np.ravel(v.tolist()).tolist() == vt.reshape(-1).tolist()


def test_a_write_through_a_view_of_a_0d_result_reaches_it():
    """The other way round: ``v += 1`` through ``c.reshape(1)`` left c as it was."""
    ct = torch.tensor([3.0, 4.0], dtype=torch.float64).sum()
    vt = ct.reshape(1)
    vt += 1
    c = mg.tensor([3.0, 4.0]).sum()
    v = c.reshape(1)
    v += 1
    assert c.item() == ct.item() == 8.0


def test_a_ragged_list_assigned_into_a_tensor_is_refused_naming_the_assignment():
    """``x[:] = [[5.0], [6.0, 1.0]]`` reached NumPy's "inhomogeneous shape" error, which
    names neither the assignment nor the place (PyTorch refuses the list too)."""
    with pytest.raises(TypeError):
        torch.zeros(2, 2)[:] = [[5.0], [6.0, 1.0]]
    x = mg.tensor(np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"^x\[\.\.\.\] = value: data is a ragged nested "
                                         r"list: expected a sequence of length 1 at dim 1"):
        x[:] = [[5.0], [6.0, 1.0]]
    assert x.tolist() == [[0.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("value, kind", [([0.0, None], "NoneType"), (["a", 1.0], "str")])
def test_a_list_holding_no_number_assigned_into_a_tensor_is_refused(value, kind):
    """``x[0] = [0.0, None]`` raised "'NoneType' object has no attribute 'dtype'" from the
    dtype rule, naming neither the assignment nor the value (PyTorch refuses it too;
    NumPy writes None as nan, which mg.tensor refuses)."""
    with pytest.raises((RuntimeError, ValueError)):
        torch.zeros(2, 2)[0] = torch.tensor(value)
    x = mg.tensor([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(TypeError, match=rf"^x\[\.\.\.\] = value: the value holds a {kind}"):
        x[0] = value
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0]]


NUMPY_OPERANDS = {
    "add float32 array, 2": (mg.add, np.add, (np.array([1.0, 2.0], np.float32), 2)),
    "mul float32 array, 0.5": (mg.mul, np.multiply, (np.array([1.0, 2.0], np.float32), 0.5)),
    "maximum 0.0, float32 array": (mg.maximum, np.maximum,
                                   (0.0, np.array([-1.0, 2.0], np.float32))),
    "add int32 array, 1": (mg.add, np.add, (np.array([1, 2], np.int32), 1)),
    "add float32 scalar, 2": (mg.add, np.add, (np.float32(1), 2)),
    "where": (mg.where, np.where, (np.array([True, False]), np.array([1.0, 2.0], np.float32),
                                   0.0)),
}


@pytest.mark.parametrize("case", sorted(NUMPY_OPERANDS))
def test_python_numbers_stay_weak_beside_numpy_operands(case):
    """A Python number beside NumPy arrays (no Tensor) was made a strong int64/float64
    tensor: float32 became float64, int32 int64. NumPy (NEP 50) keeps the array's dtype."""
    op, np_op, args = NUMPY_OPERANDS[case]
    got, expected = op(*args), np_op(*args)
    assert got.dtype == str(np.asarray(expected).dtype)
    np.testing.assert_array_equal(got.numpy(), expected)


def test_add_n_of_numpy_arrays_and_a_number_adds_the_number_to_every_element():
    """``mg.add_n([np.array([1., 2.]), 1.0])`` was refused as a shape mismatch ((), (2,)),
    where the same terms with a Tensor were added (NumPy: ``sum`` of the terms)."""
    terms = [np.array([1.0, 2.0]), 1.0, np.array([0.5, 0.25])]
    np.testing.assert_array_equal(mg.add_n(terms).numpy(), sum(terms))


@pytest.mark.parametrize("terms", [[], (), {}])
@pytest.mark.parametrize("where", ["eager", "graph"])
def test_add_n_of_nothing_is_refused(terms, where):
    """``mg.add_n([])`` recursed until Python's stack ran out (RecursionError), eagerly and
    in a graph; it refuses as ``concatenate([])`` does (TensorFlow: a ValueError too)."""
    with pytest.raises(ValueError, match="^add_n: needs at least one term"):
        if where == "eager":
            mg.add_n(terms)
        else:
            with mg.Graph():
                mg.add_n(terms)


@pytest.mark.parametrize("make", [lambda x: mg.sum(x > 0),
                                  lambda x: mg.sum(mg.astype(x, "int64"))])
def test_backward_of_an_integer_result_says_its_dtype_is_the_reason(make):
    """backward() of ``mg.sum(x > 0)`` said "no input of its computation had
    requires_grad=True", untrue: x had. The reason is the result's integer dtype
    (PyTorch refuses too: its result has no grad_fn)."""
    xt = torch.tensor([1.5, -2.0], requires_grad=True)
    with pytest.raises(RuntimeError):
        torch.sum(xt > 0).backward()
    x = mg.tensor([1.5, -2.0], requires_grad=True)
    with pytest.raises(GradientError, match=r"has dtype int64; only floating values "
                                               r"have gradients"):
        make(x).backward()


def _both(program):
    """``program(lib, x, c)``'s x.grad in minigraph and in PyTorch (float64)."""
    x, c = mg.tensor([1.0, 2.0]), mg.tensor([3.0, 4.0], requires_grad=True)
    program(mg, x, c)
    xt = torch.tensor([1.0, 2.0], dtype=torch.float64)
    ct = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    program(torch, xt, ct)
    got = None if x.grad is None else x.grad.numpy().tolist()
    expected = None if xt.grad is None else xt.grad.tolist()
    return got, expected


def _switched_on_after_use(lib, x, c):
    y = (x * c).sum() + (x * x).sum()  # x * c recorded because of c, x * x not
    x.requires_grad_(True)
    y.backward()


def _switched_on_between(lib, x, c):
    y = (x * c).sum()
    x.requires_grad_(True)
    (y + (x * x).sum()).backward()  # only x * x tracked x: 2x


def _switched_off_and_on(lib, x, c):
    x.requires_grad_(True)
    y = (x * x).sum()
    x.requires_grad_(False)
    y = y + (x * c).sum()  # recorded while x was untracked: no share for x
    x.requires_grad_(True)
    y.backward()


@pytest.mark.parametrize("program", [_switched_on_after_use, _switched_on_between,
                                     _switched_off_and_on])
def test_requires_grad_switched_after_use_gives_pytorchs_gradient(program):
    """``x.requires_grad_()`` after y was computed from x gave x the share of the entries
    recorded because of another argument (``x * c``) only: [3, 4], neither the derivative
    [5, 8] nor PyTorch's None. An argument counts for an entry only if it required a
    gradient when the entry was recorded and at the sweep, as in PyTorch."""
    got, expected = _both(program)
    assert got == expected


def test_a_kernel_error_inside_a_checkpoint_keeps_its_type():
    """``mg.max`` of an empty axis inside a checkpointed f raised a ShapeError: the
    checkpoint's error read "shape" in the inner error's description of its argument.
    NumPy's error is a ValueError, and so is minigraph's outside a checkpoint."""
    with pytest.raises(ValueError):
        np.max(np.zeros((0, 3)), axis=0)
    x = mg.tensor(np.zeros((0, 3)), requires_grad=True)
    f = mg.checkpoint(lambda v: mg.max(v, axis=0))
    with pytest.raises(ValueError, match="zero-size array") as caught:
        f(x)
    assert not isinstance(caught.value, ShapeError)


@pytest.mark.parametrize("returned", [lambda a: (a * a, a), lambda a: None])
@pytest.mark.parametrize("call, who", [
    (lambda f: mg.grad(f, mode="forward")(2.0), "grad"),
    (lambda f: mg.value_and_grad(f, mode="forward")(2.0), "value_and_grad"),
    (lambda f: mg.jacfwd(f)(np.ones(2)), "jacfwd"),
    (lambda f: mg.jacfwd(f, vectorize=False)(np.ones(2)), "jacfwd"),
    (lambda f: mg.hessian(f)(np.ones(2)), "hessian")])
def test_forward_modes_errors_name_the_function_called(returned, call, who):
    """Forward-mode grad and jacfwd of an f returning a tuple or None said "jvp: f must
    return a tensor", naming a function the user did not call."""
    with pytest.raises(TypeError, match=rf"^{who}: f must return a tensor, got"):
        call(returned)


def test_a_second_derivative_through_an_op_recorded_before_the_switch_is_kept():
    """backward(create_graph=True) through b = x * w * w, recorded before
    w.requires_grad_(), held w as a constant in the gradient's record, so the second
    derivative with respect to w lost b's terms ([2.98, -1.04] for [21.52, -0.19]).
    PyTorch's saved tensor is w itself. Oracle: torch, and central differences of the
    closed form L(w) = sum((w cos(xw) x + sin(xw) + w^2)^2)."""
    torch = pytest.importorskip("torch")
    X, W = [0.3, 0.7], [1.5, -0.5]

    def second(lib, tensor):
        x, w = tensor(X, requires_grad=True), tensor(W)
        b = x * w * w
        w.requires_grad_(True)
        a = lib.sin(x * w) * x
        (a + b).sum().backward(create_graph=True)
        gx = x.grad
        x.grad = w.grad = None
        (gx * gx).sum().backward()
        return np.array(w.grad.tolist())

    got = second(mg, mg.tensor)
    want = second(torch, lambda v, **k: torch.tensor(v, dtype=torch.float64, **k))
    x, w, h = np.array(X), np.array(W), 1e-6
    L = lambda w: np.sum((w * np.cos(x * w) * x + np.sin(x * w) + w * w) ** 2)  # noqa: E731
    fd = np.array([(L(w + h * e) - L(w - h * e)) / (2 * h) for e in np.eye(2)])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(got, fd, rtol=1e-6)


def test_a_flag_switched_off_and_on_several_times_before_backward_keeps_the_gradient():
    """Three off/on pairs of w's flag between y = (x * w).sum() and backward() were
    refused ("switched more than 4 times"); PyTorch gives both gradients: y's derivative
    is w for x and x for w (closed form)."""
    x, w = mg.tensor([1.0, 2.0], requires_grad=True), mg.tensor([3.0, 4.0], requires_grad=True)
    y = (x * w).sum()
    for _ in range(3):
        w.requires_grad_(False)
        w.requires_grad_(True)
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0])


def test_add_n_adds_python_numbers_as_one_numpy_op_would():
    """AddN's kernel added its terms left to right: 2 + np.True_ made an int64 first,
    which widened a float32 term to float64, where its shape rule (and
    np.result_type, NEP 50) say float32. Found by test_ops_trust's random terms."""
    terms = (2, np.True_, np.asarray(0.5, dtype=np.float32))
    assert mg.add_n(list(terms)).dtype == np.result_type(*terms).name == "float32"
    assert mg.add_n(list(terms)).item() == 3.5
