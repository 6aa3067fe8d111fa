"""Errors that teach: each names the operation, the shapes, dtypes or devices involved."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    ((-2, -12), ShapeError, "a size must be >= 0"), ((2.0, 12), TypeError, "must be an integer, got float 2.0")])
def test_reshape_refuses_sizes_numpy_refuses(shape, error, message):
    """Two -1s became (24, 24) with a message about 576 elements; (-2, -12) passed the
    shape rule (its product is 24), so a graph node got a negative shape."""
    x = mg.tensor(np.zeros((2, 3, 4)))
    with pytest.raises(error, match=message):
        x.reshape(*shape)
    with pytest.raises(error, match=message), mg.Graph():
        mg.placeholder((2, 3, 4)).reshape(*shape)
    assert x.reshape(np.int64(4), -1).shape == (4, 6)  # NumPy's ints are ints


_X23 = np.arange(6.0).reshape(2, 3)


@pytest.mark.parametrize("who, call, error, message", [
    ("reshape", lambda x: mg.reshape(x, None), TypeError, "a shape is an integer or a tuple"),
    ("reshape", lambda x: mg.reshape(x, 6.0), TypeError, "a shape is an integer or a tuple"),
    ("broadcast_to", lambda x: mg.broadcast_to(x, None), TypeError, "a shape is an integer"),
    ("broadcast_to", lambda x: mg.broadcast_to(x, (4, 2.0, 3)), TypeError,
     r"every size of the shape \(4, 2.0, 3\) must be an integer, got float 2.0"),
    ("sum_to", lambda x: mg.sum_to(x, "3"), TypeError, "a shape is an integer or a tuple"),
    ("placeholder", lambda x: mg.placeholder(2.5), TypeError, "a shape is an integer"),
    ("placeholder", lambda x: mg.placeholder((2, True)), TypeError, ".*got bool True"),
    ("placeholder", lambda x: mg.placeholder((-1, 3)), ShapeError, "a size must be >= 0"),
    ("placeholder", lambda x: mg.placeholder((None, 3)), ShapeError,
     r"shape \(None, 3\) has a size None .TensorFlow's unknown size.*shape=None"),
    ("sum", lambda x: mg.sum(x, axis=1.0), TypeError, "axis must be an integer, got float 1.0"),
    ("mean", lambda x: mg.mean(x, axis=(0, "1")), TypeError, "axis must be an integer, got str"),
    ("max", lambda x: mg.max(x, axis=True), TypeError, "axis must be an integer, got bool"),
    ("softmax", lambda x: mg.softmax(x, axis=None), TypeError, "axis must be an integer"),
    ("concatenate", lambda x: mg.concatenate([x, x], axis=0.0), TypeError, "axis must be an"),
    ("stack", lambda x: mg.stack(None), TypeError, "takes a list or tuple of tensors, got None"),
    ("concatenate", lambda x: mg.concatenate(2), TypeError, "takes a list or tuple of tensors"),
    ("add_n", lambda x: mg.add_n(None), TypeError, "takes a list or tuple of tensors"),
])
@pytest.mark.parametrize("where", ["eager", "graph"])
def test_shapes_axes_and_operands_of_the_wrong_kind_are_refused_by_the_op(who, call, error,
                                                                         message, where):
    """A float axis, a None shape or a number where a list of tensors belongs failed deep
    inside ("'float' object is not iterable", "'<=' not supported between 'int' and
    'NoneType'"), naming no op; a float 0.0 axis of a 0-d tensor was taken. NumPy refuses
    each with a TypeError; minigraph names the op, in eager and in graph mode."""
    with mg.Graph() if where == "graph" else contextlib.nullcontext():
        x = mg.placeholder((2, 3)) if where == "graph" else mg.tensor(_X23)
        with pytest.raises(error, match=f"^{who}: {message}"):
            call(x)
    with pytest.raises(TypeError, match="^sum: axis must be an integer, got float 0.0"):
        mg.sum(mg.tensor(1.0), axis=0.0)


def test_shapes_and_axes_numpy_takes_are_taken_with_numpy_s_meaning():
    x = mg.tensor(_X23)
    for got, want in [(mg.reshape(x, 6), _X23.reshape(6)),
                      (mg.reshape(x, [np.int64(3), -1]), _X23.reshape(3, -1)),
                      (mg.broadcast_to(x, [4, 2, 3]), np.broadcast_to(_X23, (4, 2, 3))),
                      (mg.broadcast_to(x[0], np.int64(3)), np.broadcast_to(_X23[0], 3)),
                      (mg.sum_to(mg.broadcast_to(x[0], (2, 3)), 3), 2 * _X23[0]),
                      (mg.sum(x, axis=np.int32(1)), _X23.sum(axis=1)),
                      (mg.mean(x, axis=[0, 1]), _X23.mean(axis=(0, 1))),
                      (mg.softmax(x, axis=np.int64(0)), np.exp(_X23) / np.exp(_X23).sum(0)),
                      (mg.stack(x), np.stack(_X23)), (mg.add_n(x), _X23.sum(0))]:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-15)
        assert got.shape == want.shape
    with mg.Graph():
        assert mg.placeholder(3).shape == (3,) and mg.placeholder([2, 3]).shape == (2, 3)


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


# -- a list, tuple or dict of arrays given to a transformation --------------------------------
# JAX and torch.func read one as a pytree (each array an input of its own); minigraph's
# transformations took it as one array, stacked: vmap(lambda ab: ab[0] * ab[1])((X, X))
# batched across the two arrays and returned shape (2, 3) where JAX's and torch.func's
# answer has shape (5, 3), without a word. Every transformation now refuses it.

def _source_sum(ab):  # (source mode reads a function's text: a def, not a lambda)
    return (ab[0] * ab[1]).sum()


_TRANSFORMS = {
    "grad tape": lambda a: mg.grad(_source_sum)(a),
    "grad forward": lambda a: mg.grad(_source_sum, mode="forward")(a),
    "grad graph": lambda a: mg.grad(_source_sum, mode="graph")(a),
    "grad source": lambda a: mg.grad(_source_sum, mode="source")(a),
    "value_and_grad": lambda a: mg.value_and_grad(_source_sum)(a),
    "vjp": lambda a: mg.vjp(_source_sum, a),
    "jvp primal": lambda a: mg.jvp(_source_sum, (a,), (1.0,)),
    "jvp tangent": lambda a: mg.jvp(lambda x: x * 2.0, (np.ones(3),), (a,)),
    "jacrev": lambda a: mg.jacrev(lambda ab: ab[0] * ab[1])(a),
    "jacfwd": lambda a: mg.jacfwd(lambda ab: ab[0] * ab[1])(a),
    "hessian": lambda a: mg.hessian(_source_sum)(a),
    "vmap": lambda a: mg.vmap(lambda ab: ab[0] * ab[1])(a),
    "vmap of grad": lambda a: mg.vmap(mg.grad(_source_sum))(a),
    "trace": lambda a: mg.trace(_source_sum)(a),
    "checkpoint": lambda a: mg.checkpoint(_source_sum)(a),
}


@pytest.mark.parametrize("name", sorted(_TRANSFORMS))
@pytest.mark.parametrize("kind", [tuple, list, "tensors", "dict"])
def test_a_container_of_arrays_is_refused_by_every_transformation(name, kind):
    parts = [np.arange(3.0) + 1, np.arange(3.0) - 1]
    if kind == "tensors":
        arg = (mg.tensor(parts[0]), mg.tensor(parts[1]))
    elif kind == "dict":
        arg = {0: parts[0], 1: parts[1]}
    else:
        arg = kind(parts)
    with pytest.raises(mg.errors.PytreeError, match=r"(argument|primal|tangent) 0 is a "
                       r"(tuple|list|dict) of arrays or tensors.*separate arguments"):
        _TRANSFORMS[name](arg)
    with pytest.raises(TypeError):  # (a PytreeError is a TypeError too)
        _TRANSFORMS[name](arg)


def _nest(depth: int, leaf):
    """``leaf`` inside ``depth`` lists, tuples or dicts, with numbers beside it."""
    for k in range(depth):
        leaf = [1.0, leaf] if k % 3 == 0 else (leaf, 2.0) if k % 3 == 1 else {"w": leaf}
    return leaf


@settings(max_examples=40, deadline=None)
@given(depth=st.integers(1, 5), shape=st.lists(st.integers(0, 3), max_size=2),
       which=st.sampled_from(["grad", "vmap", "jacfwd", "vjp"]),
       leaf_kind=st.sampled_from(["array", "tensor"]))
def test_an_array_at_any_depth_of_a_container_is_refused(depth, shape, which, leaf_kind):
    leaf = np.ones(shape) if leaf_kind == "array" else mg.tensor(np.ones(shape))
    arg = _nest(depth, leaf)
    call = {"grad": lambda: mg.grad(lambda a: 0.0)(arg),
            "vmap": lambda: mg.vmap(lambda a: a)(arg),
            "jacfwd": lambda: mg.jacfwd(lambda a: a)(arg),
            "vjp": lambda: mg.vjp(lambda a: a, arg)}[which]
    with pytest.raises(mg.errors.PytreeError):
        call()


def test_nested_lists_of_numbers_are_still_arrays_in_every_transformation():
    """Numbers in a list are one array, as mg.tensor makes it (no pytree meaning could be
    confused with it: JAX's vmap refuses a list of scalars). Closed forms: d/dx sum x^3 =
    3x^2, the Jacobian of x^3 is diag(3x^2), its Hessian diag(6x)."""
    x = [1.0, 2.0]
    cube = lambda r: r * r * r  # noqa: E731
    np.testing.assert_allclose(mg.grad(lambda r: cube(r).sum())(x).numpy(), [3.0, 12.0])
    np.testing.assert_allclose(mg.grad(lambda r: cube(r).sum(), mode="forward")(x).numpy(),
                               [3.0, 12.0])
    # jacrev read the Jacobian's shape from the list itself and raised a reshape error
    np.testing.assert_allclose(mg.jacrev(cube)(x).numpy(), np.diag([3.0, 12.0]))
    np.testing.assert_allclose(mg.jacfwd(cube)(x).numpy(), np.diag([3.0, 12.0]))
    np.testing.assert_allclose(mg.hessian(lambda r: cube(r).sum())(x).numpy(),
                               np.diag([6.0, 12.0]))
    np.testing.assert_allclose(mg.vmap(lambda r: r * 2.0)([[1.0, 2.0], [3.0, 4.0]]).numpy(),
                               [[2.0, 4.0], [6.0, 8.0]])
    # a tuple of numbers given to a compiled program is a constant of it, as before
    assert float(mg.trace(lambda v, o: v * o[1])(2.0, (3.0, 4.0))) == 8.0


def test_a_container_left_unbatched_is_passed_as_it_is():
    """in_axes=None: the argument is the same for every example, as in JAX."""
    X = np.arange(6.0).reshape(3, 2)
    got = mg.vmap(lambda r, ab: r * ab[0] + ab[1], in_axes=(0, None))(X, (np.ones(2), 1.0))
    np.testing.assert_allclose(got.numpy(), X + 1.0)


def test_grad_names_itself_when_an_argument_is_an_integer():
    """(It said vjp, the function grad calls.)"""
    with pytest.raises(DTypeError, match="^grad: cannot differentiate"):
        mg.grad(lambda r: r * r)(3)


def _one_by_one(r):  # (a def: source mode reads it)
    return (r[:1] * 2.0).reshape((1, 1))


@pytest.mark.parametrize("mode", ["tape", "forward", "graph", "source"])
def test_every_mode_takes_an_output_of_one_element_whatever_its_shape(mode):
    """The tape and source mode took a (1, 1) output as a scalar (PyTorch's backward()
    takes any one-element tensor); forward and graph mode refused all but () and (1,).
    d/dr (2 r_0) = (2, 0, 0)."""
    got = mg.grad(_one_by_one, mode=mode)(np.array([0.5, 1.0, 2.0]))
    np.testing.assert_array_equal(got.numpy(), [2.0, 0.0, 0.0])
    with pytest.raises(GradientError, match="must return a scalar, it returned shape \\(2, 1\\)"):
        mg.grad(lambda r: r[:2].reshape((2, 1)), mode="tape" if mode == "source" else mode)(
            np.array([0.5, 1.0, 2.0]))


@pytest.mark.parametrize("returned", [None, {"a": 1.0}, "text"])
def test_vmap_and_jvp_name_what_f_returned(returned):
    """They said "tensor(): dtype object is not supported" for such an output."""
    X = np.ones((4, 2))
    kind = type(returned).__name__
    with pytest.raises(mg.autodiff.batching.BatchingError,
                       match=f"vmap: output 0 is a {kind}; f must return a tensor or a number"):
        mg.vmap(lambda r: returned)(X)
    with pytest.raises(TypeError, match=f"jvp: f must return a tensor, got {kind}"):
        mg.jvp(lambda r: returned, (X,), (X,))


def test_vmap_names_a_nested_tuple_among_its_outputs():
    """((r, r), r): output 0 is itself a tuple (it blamed "element 0 of the list")."""
    with pytest.raises(mg.autodiff.batching.BatchingError, match="vmap: output 0 is a tuple"):
        mg.vmap(lambda r: ((r, r), r))(np.ones((4, 2)))


def _takes_a_keyword(x, scale=2.0):
    return (x * scale).sum()


@pytest.mark.parametrize("call", [
    lambda: mg.grad(_takes_a_keyword)(np.ones(2), scale=3.0),
    lambda: mg.grad(_takes_a_keyword, mode="forward")(np.ones(2), scale=3.0),
    lambda: mg.grad(_takes_a_keyword, mode="graph")(np.ones(2), scale=3.0),
    lambda: mg.grad(_takes_a_keyword, mode="source")(np.ones(2), scale=3.0),
    lambda: mg.value_and_grad(_takes_a_keyword)(np.ones(2), scale=3.0),
    lambda: mg.jacrev(_takes_a_keyword)(np.ones(2), scale=3.0),
    lambda: mg.jacfwd(_takes_a_keyword)(np.ones(2), scale=3.0),
    lambda: mg.hessian(_takes_a_keyword, argnums=(0,))(np.ones(2), scale=3.0),
    lambda: mg.trace(_takes_a_keyword)(np.ones(2), scale=3.0),
])
def test_a_keyword_argument_is_refused_by_name(call):
    """Python's own message named an inner function ("grad.<locals>.gradient() got an
    unexpected keyword argument"); vmap and checkpoint already refused by name."""
    with pytest.raises(TypeError, match=r"^(grad|value_and_grad|jacrev|jacfwd|hessian|trace): "
                                        r"pass f's arguments by position \(got keywords "
                                        r"\['scale'\]\)"):
        call()


def _value_of_f():
    return mg.sin(mg.tensor(2.0)) * 3.0  # what mg.grad(f(x)) hands over: a value, not f


@pytest.mark.parametrize("who, transform", [
    ("grad", lambda f: mg.grad(f)),
    *[(f"grad ({mode})", lambda f, mode=mode: mg.grad(f, mode=mode))
      for mode in ("forward", "graph", "source")],
    ("value_and_grad", lambda f: mg.value_and_grad(f)),
    ("jacrev", lambda f: mg.jacrev(f)),
    ("jacfwd", lambda f: mg.jacfwd(f)),
    ("hessian", lambda f: mg.hessian(f)),
    ("hessian", lambda f: mg.hessian(f, argnums=(0,))),
    ("vmap", lambda f: mg.vmap(f)),
    ("checkpoint", lambda f: mg.checkpoint(f)),
    ("trace", lambda f: mg.trace(f)),
    ("vjp", lambda f: mg.vjp(f, 1.0)),
    ("jvp", lambda f: mg.jvp(f, (1.0,), (1.0,))),
    ("gradcheck", lambda f: mg.gradcheck(f, [1.0])),
])
@pytest.mark.parametrize("given", ["value", None, "text"])
def test_a_transformation_given_no_function_says_so_at_once(who, transform, given):
    """mg.grad(f(x)) failed only at the call, with "'Tensor' object is not callable"
    (JAX refuses at once: "Expected a callable value"). Every transformation now refuses
    where it is applied, by its name, and says to pass f itself when given a value."""
    name = who.split()[0]
    f = _value_of_f() if given == "value" else given
    with pytest.raises(TypeError, match=f"^{name}: f must be a function, got "
                                        f"{'None' if f is None else 'a ' + type(f).__name__}"
                       ) as caught:
        transform(f)
    assert ("pass the function itself" in str(caught.value)) == (given == "value")


@pytest.mark.parametrize("who, call", [
    ("Session", lambda g: mg.Session(g)),
    ("compile_graph", lambda g: mg.compile_graph(g, [], [])),
    ("partition", lambda g: mg.partition(g)),
    ("auto_place", lambda g: mg.auto_place(g, ["cpu", "cpu:1"])),
])
@pytest.mark.parametrize("given", ["graph.py", mg.tensor(1.0), False])
def test_what_takes_a_graph_refuses_anything_else_by_name(who, call, given):
    """compile_graph, partition and auto_place raised AttributeError ('... has no
    attribute nodes') from inside; Session took a string and failed at its first run."""
    with pytest.raises(TypeError, match=f"^{who}: expects a Graph .* got a "
                                        f"{type(given).__name__}$"):
        call(given)


@pytest.mark.parametrize("tangent", [np.array([1.0]), np.ones(3), mg.tensor(1.0),
                                     np.ones((2, 1))])
def test_jvp_refuses_an_array_tangent_of_another_shape_than_its_primal(tangent):
    """A (1,) tangent for a (2,) primal was broadcast to [1, 1], a direction the caller
    never wrote (jax.jvp and torch.func.jvp refuse it); a (3,) one failed inside
    broadcast_to. A Python number is still broadcast, as documented."""
    x = np.array([1.0, 2.0])
    with pytest.raises(ShapeError, match=r"^jvp: tangent 0 has shape .*, its primal \(2,\)"):
        mg.jvp(lambda v: v * 3.0, (x,), (tangent,))
    _, t = mg.jvp(lambda v: v * 3.0, (x,), (2.0,))
    np.testing.assert_array_equal(t.numpy(), [6.0, 6.0])


# -- an integer argument to differentiate -----------------------------------------------------
# Each mode had its own check, and they disagreed: DTypeError from the tape and source mode,
# GradientError from forward mode and jvp, TypeError from graph mode for a Python int. JAX
# raises a TypeError for all of them ("grad requires real- or complex-valued inputs"); now
# one function (argnums.refuse_integers) does it for every transformation.

def _square_sum(x):  # (source mode reads a function's text: a def, not a lambda)
    return (x * x).sum()


_INTEGER_TAKERS = {
    **{f"grad {m}": (lambda m: lambda a: mg.grad(_square_sum, mode=m)(a))(m)
       for m in ("tape", "forward", "graph", "source")},
    **{f"value_and_grad {m}": (lambda m: lambda a: mg.value_and_grad(_square_sum, mode=m)(a))(m)
       for m in ("tape", "forward", "graph", "source")},
    "vjp": lambda a: mg.vjp(_square_sum, a),
    "jvp": lambda a: mg.jvp(_square_sum, (a,), (1,)),
    "jacrev": lambda a: mg.jacrev(lambda x: x * 2.0)(a),
    "jacfwd": lambda a: mg.jacfwd(lambda x: x * 2.0)(a),
    "hessian": lambda a: mg.hessian(_square_sum)(a),
}


@pytest.mark.parametrize("name", sorted(_INTEGER_TAKERS))
@pytest.mark.parametrize("arg", [3, np.array([1, 2]), mg.tensor([1, 2], dtype="int32")],
                         ids=["int", "int64 array", "int32 tensor"])
def test_an_integer_argument_is_refused_alike_by_every_transformation(name, arg):
    who = name.split()[0]  # (value_and_grad's errors said grad, which was not called)
    with pytest.raises(DTypeError, match=rf"^{who}: cannot differentiate with respect to "
                                         rf"argument 0 of dtype int(64|32); pass floats"):
        _INTEGER_TAKERS[name](arg)

