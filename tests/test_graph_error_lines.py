"""Errors made while a graph is built name the user's line (file:line), in every graph mode.

A shape rule's error always named it (``Graph._infer``: "in node 'add' created at
file:12"), but the checks an op's Python code makes before its node exists (an axis, a
dtype, a permutation, the shapes of a stack, a layer's input width, mg.gradients'
refusals) did not, and some of them raised bare ValueErrors and TypeErrors. NumPy on
a graph node (np.sin(node)) and a node fed as a value said things the user never wrote.

The oracle for "the user's line" is the line of the offending call in this file, read
with ``inspect``; the oracle for a refusal being right is NumPy's or PyTorch's own
refusal of the same thing, or arithmetic done by NumPy on the same values.
"""

import inspect

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.errors import AxisError, DTypeError, MinigraphError, ShapeError
from minigraph.graph.graph import FeedError, GraphError, TracedValueError


def refusal(call, error=MinigraphError):
    """The message of the ``error`` that ``call()`` raises, and ``file:line`` of the line
    the caller wrote the call on (the lambda's line)."""
    line = inspect.currentframe().f_back.f_lineno
    with pytest.raises(error) as info:
        call()
    return str(info.value), f"{__file__}:{line}"


def assert_names(message, where, *words):
    """``where`` appears in ``message`` once, and so does each of ``words``."""
    assert message.count(where) == 1, message
    for word in words:
        assert word in message, (word, message)


def test_axis_out_of_range_names_the_line_in_a_graph():
    """An out-of-range axis (softmax, log_softmax, stack, concatenate) was refused by the
    op's own check, before its node existed, without the user's line; a broadcast error
    in the same graph named it. (The cheapest ops, sum, mean, reshape, transpose, are not
    wrapped: one more Python call cost each eager call some 7%, and a build error's
    traceback names the line too.)"""
    with mg.Graph():
        x = mg.placeholder(shape=(3, 2), name="x")
        assert_names(*refusal(lambda: mg.softmax(x, axis=2), AxisError), "softmax: axis 2")
        assert_names(*refusal(lambda: mg.log_softmax(x, axis=2), AxisError), "log_softmax")
        assert_names(*refusal(lambda: mg.stack([x, x], axis=4), AxisError), "stack: axis 4")
        assert_names(*refusal(lambda: mg.concatenate([x, x], axis=2), AxisError),
                     "concatenate: axis 2")
        # a shape rule's error names the line once, not again by the op's wrapper
        assert_names(*refusal(lambda: mg.reshape(x, (7,)), ShapeError), "in node 'reshape'")
    # eager mode's message is as it was: no line (NumPy refuses the axis too)
    with pytest.raises(np.exceptions.AxisError):
        np.ones((3, 2)).sum(axis=2)
    message, _ = refusal(lambda: mg.softmax(mg.tensor(np.ones((3, 2))), axis=2), AxisError)
    assert "softmax: axis 2" in message and "test_graph_error_lines" not in message


def test_wrapper_checks_name_the_line_in_a_graph():
    """The other checks op wrappers make before binding (stack of unequal shapes, a
    placeholder's or a constant's unknown dtype) named no line; a placeholder's unknown
    dtype was a bare TypeError, and a float axis one too."""
    with mg.Graph():
        x = mg.placeholder(shape=(3,), name="x")
        y = mg.placeholder(shape=(4,), name="y")
        assert_names(*refusal(lambda: mg.stack([x, y]), ShapeError), "stack: all tensors")
        assert_names(*refusal(lambda: mg.placeholder(shape=(2,), dtype="float16"), DTypeError),
                     "placeholder: dtype float16 is not supported")
        assert_names(*refusal(lambda: mg.constant(1.0, dtype="float16"), DTypeError),
                     "constant: dtype float16 is not supported")
        with pytest.raises(DTypeError, match="sum: axis must be an integer, got float 1.0"):
            x.sum(axis=1.0)
    with pytest.raises(TypeError):  # (still the class NumPy and PyTorch users catch)
        mg.sum(mg.tensor([1.0]), axis=0.0)


def f_softmax(x):
    return mg.softmax(x, axis=3).sum()


def f_stack(a, b):
    return mg.stack([a, b]).sum()


def test_traced_function_errors_name_the_line_in_f():
    """mg.trace and mg.grad(mode='graph') record f: a wrapper's check failing in f named
    no line of f."""
    softmax_line = f"{__file__}:{inspect.getsourcelines(f_softmax)[1] + 1}"
    stack_line = f"{__file__}:{inspect.getsourcelines(f_stack)[1] + 1}"
    X = mg.tensor(np.ones((3, 2)))
    for run in (mg.trace(f_softmax), mg.grad(f_softmax, mode="graph")):
        with pytest.raises(AxisError) as info:
            run(X)
        assert_names(str(info.value), softmax_line, "softmax: axis 3")
    A, B = mg.tensor([1.0, 2, 3]), mg.tensor([1.0, 2, 3, 4])
    for run in (mg.trace(f_stack), mg.grad(f_stack, mode="graph")):
        with pytest.raises(ShapeError) as info:
            run(A, B)
        assert_names(str(info.value), stack_line, "stack: all tensors")


def test_nn_checks_name_the_line_and_float_labels_are_a_dtype_error():
    """cross_entropy's label checks, one_hot's and nn.Linear's input width named no line
    in a graph; float labels were a bare TypeError (PyTorch refuses float class indices
    too: a RuntimeError for cross_entropy)."""
    with pytest.raises(RuntimeError):
        torch.nn.functional.cross_entropy(torch.ones(3, 4), torch.zeros(3))
    lin = mg.nn.Linear(4, 2)
    with mg.Graph():
        z = mg.placeholder(shape=(3, 4), name="logits")
        li = mg.placeholder(shape=(2,), dtype="int64", name="labels_int")
        lf = mg.placeholder(shape=(3,), name="labels_float")
        w = mg.placeholder(shape=(3, 5), name="wide")
        assert_names(*refusal(lambda: mg.cross_entropy(z, li), ShapeError),
                     "cross_entropy: expected logits (N, C) and labels (N,)")
        assert_names(*refusal(lambda: mg.cross_entropy(z, lf), DTypeError),
                     "cross_entropy: labels must be integers")
        assert_names(*refusal(lambda: mg.one_hot(lf, 4), DTypeError), "one_hot: labels")
        assert_names(*refusal(lambda: mg.nn.CrossEntropyLoss()(z, lf), DTypeError),
                     "cross_entropy: labels must be integers")
        assert_names(*refusal(lambda: lin(w), ShapeError), "in_features=4")
    with pytest.raises(DTypeError, match="^cross_entropy: labels must be integers"):
        mg.cross_entropy(mg.tensor(np.ones((3, 4))), mg.tensor(np.zeros(3)))


def test_a_slice_step_of_zero_is_a_getitem_error_with_the_line():
    """x[::0] in a graph raised NumPy's bare "ValueError: slice step cannot be zero" from
    the shape rule's probe array: no op, no shape, no line. NumPy and PyTorch refuse a
    zero step too, with a ValueError, which the ShapeError still is."""
    for refuse in (lambda: np.ones(3)[::0], lambda: torch.ones(3)[::0]):
        with pytest.raises(ValueError):
            refuse()
    with mg.Graph():
        x = mg.placeholder(shape=(3,), name="x")
        message, where = refusal(lambda: x[::0], ShapeError)
    assert_names(message, where, "getitem", "shape (3,)", "slice step cannot be zero")
    with pytest.raises(ValueError):
        x[::0]


def test_numpy_ufunc_on_a_graph_node_is_a_teaching_error():
    """np.sin(node) said "operand 'Node' does not support ufuncs": no mg.sin, no line.
    NumPy's operators with an array on the left still build nodes, whose values are
    NumPy's own arithmetic on the fed values."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(3,), name="x")
        message, where = refusal(lambda: np.sin(x), TracedValueError)
        assert_names(message, where, "np.sin()", "mg.sin(...)", "graph node 'x'")
        message, where = refusal(lambda: np.add(x, 1.0), TracedValueError)
        assert_names(message, where, "np.add()", "mg.add(...)")
        a = np.array([1.0, -2.0, 4.0])
        ys = [a * x, a - x, a / x, a ** x, a < x, np.float64(2.0) * x, *divmod(a, x)]
    value = np.array([0.5, 3.0, 2.0])
    got = mg.Session(g).run(ys, {x: value})
    for out, want in zip(got, [a * value, a - value, a / value, a ** value, a < value,
                               2.0 * value, *np.divmod(a, value)]):
        np.testing.assert_array_equal(out, want)


def test_feeding_a_graph_node_is_a_feed_error():
    """sess.run(z, {x: y * 3}) said "np.asarray() needs the value of graph node ...
    Python control flow ...": a function the user never called, a cause that was not
    theirs, and no feed; mg.tensor(node) also named np.asarray()."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=(2,), name="x")
        y = mg.placeholder(shape=(2,), name="y")
        z = x * 2 + y
    sess = mg.Session(g)
    with pytest.raises(FeedError, match="^feed for 'x': a graph node is not a value") as info:
        sess.run(z, {x: y * 3, y: np.ones(2)})
    assert "np.asarray()" not in str(info.value) and "control flow" not in str(info.value)
    np.testing.assert_array_equal(sess.run(z, {x: np.ones(2), y: np.ones(2)}), [3.0, 3.0])
    with pytest.raises(TracedValueError) as info:
        mg.tensor(z)
    assert "np.asarray()" not in str(info.value) and "mg.tensor" in str(info.value)


def test_gradients_refusals_name_the_line_of_the_call():
    """mg.gradients refused an integer y, a float for an x, grad_ys of another shape and
    a y of unknown shape without the line of the call; the float's message told the user
    to build inside mg.Graph(), where they were."""
    with mg.Graph():
        a = mg.placeholder(shape=(2,), name="a")
        i = mg.placeholder(shape=(2,), dtype="int64", name="i")
        u = mg.placeholder(shape=None, name="u")
        y = a * 2
        assert_names(*refusal(lambda: mg.gradients((i * 2).sum(), [i]),
                              mg.errors.GradientError), "dtype int64")
        message, where = refusal(lambda: mg.gradients(y.sum(), [3.0]), GraphError)
        assert_names(message, where, "expected graph nodes, got float")
        assert "with mg.Graph()" not in message
        assert_names(*refusal(lambda: mg.gradients(y, [a], grad_ys=mg.constant(np.ones(3))),
                              ShapeError), "grad_ys[0] has shape (3,)")
        assert_names(*refusal(lambda: mg.gradients((u * a).sum(), [a]),
                              mg.errors.GradientError), "unknown shape")


def test_bare_errors_of_empty_operand_lists_are_minigraph_errors():
    """concatenate([]), stack([]) and add_n([]) raised bare ValueErrors (NumPy refuses
    np.concatenate([]) with a ValueError too, which ShapeError still is)."""
    with pytest.raises(ValueError):
        np.concatenate([])
    for call, who in ((lambda: mg.concatenate([]), "concatenate"),
                      (lambda: mg.stack([]), "stack"), (lambda: mg.add_n([]), "add_n")):
        with pytest.raises(ShapeError, match=f"^{who}: needs at least one"):
            call()
