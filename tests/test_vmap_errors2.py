"""mg.vmap's errors speak of one example, whatever raised them.

A batching rule runs the op on the whole batch (shape (2, 0) for examples of shape
(0,), ``axis=0`` moved to ``axis=1``). Errors a shape rule finds were already told in
the words of one example; errors a kernel raises (an empty max, a label out of range,
an integer to a negative power, a dtype the kernel refuses, two devices) named the
batched call, which the user never wrote. The oracles are NumPy's and PyTorch's own
refusals of the same one example, and the shapes written in the messages.
"""

from __future__ import annotations

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import DeviceError, DTypeError
from minigraph.ops.primitive import Primitive, bind

torch = pytest.importorskip("torch")


def _numpy_message(f, *args) -> str:
    """What NumPy says when ``f(*args)`` fails (the oracle's own words)."""
    with pytest.raises(Exception) as error:
        f(*args)
    return str(error.value)


def test_an_empty_max_names_one_example_not_the_batch():
    """max of examples of shape (0,) was reported as max(shape (2, 0) ..., axis=(1,)),
    a call f never made; min with axis=0 as min(shape (2, 0, 3), axis=(1,))."""
    said = _numpy_message(np.max, np.ones(0))
    with pytest.raises(ValueError) as error:
        mg.vmap(lambda x: mg.max(x))(mg.tensor(np.ones((2, 0))))
    message = str(error.value)
    assert message.startswith(said)
    assert "max(shape (0,) float64, axis=None" in message and "batch of 2" in message
    assert "(2, 0)" not in message and "axis=(1,)" not in message
    assert str(error.value.__cause__) == said  # the kernel's own error, chained

    said = _numpy_message(lambda a: a.min(axis=0), np.ones((0, 3)))
    with pytest.raises(ValueError) as error:
        mg.vmap(lambda x: mg.min(x, axis=0))(mg.tensor(np.ones((2, 0, 3))))
    message = str(error.value)
    assert message.startswith(said)
    assert "min(shape (0, 3) float64, axis=(0,)" in message
    assert "(2, 0, 3)" not in message and "axis=(1,)" not in message


def test_a_label_out_of_range_names_the_example_that_holds_it():
    """one_hot's range check ran on the batch of labels, shape (3, 2): the message gave
    the batched call, not which example held the bad label."""
    labels = np.array([[0, 1], [1, 2], [2, 7]])
    with pytest.raises(RuntimeError):  # PyTorch refuses example 2 alone
        torch.nn.functional.one_hot(torch.tensor(labels[2]), 3)
    with pytest.raises(IndexError) as error:
        mg.vmap(lambda y: mg.one_hot(y, 3))(mg.tensor(labels))
    message = str(error.value)
    assert "label 7" in message and "batch of 3: example 2," in message
    assert "one_hot(shape (2,) int64, num_classes=3" in message and "(3, 2)" not in message


def test_an_integer_to_a_negative_power_names_one_example():
    """x ** -1 on integers: NumPy's refusal came after pow(shape (2, 3) int64 ...)."""
    said = _numpy_message(lambda a: a ** -1, np.arange(1, 4))
    with pytest.raises(ValueError) as error:
        mg.vmap(lambda x: x ** -1)(mg.tensor(np.arange(1, 7).reshape(2, 3)))
    message = str(error.value)
    assert message.startswith(said)
    assert "pow(shape (3,) int64, -1)" in message and "batch of 2" in message
    assert "(2, 3)" not in message


def test_a_dtype_the_kernel_refuses_names_one_example():
    """A kernel's TypeError (here NumPy's invert of floats, which no shape rule checks)
    became a DTypeError about invert(shape (2, 3) float64 ...)."""
    said = _numpy_message(np.invert, np.ones(3))
    invert = Primitive("invert", lambda xp, x: xp.invert(x), lambda x: (x.shape, x.dtype),
                       differentiable=False, batch=lambda dims, x: bind(invert, x))
    with pytest.raises(DTypeError) as error:
        mg.vmap(lambda x: bind(invert, x))(mg.tensor(np.ones((2, 3))))
    message = str(error.value)
    assert message.startswith(said)
    assert "invert(shape (3,) float64)" in message and "batch of 2" in message
    assert "(2, 3)" not in message


def test_two_devices_name_one_example():
    """A batched value on cpu meeting a tensor on cpu:1: the DeviceError listed the
    batch, shape (2, 3), beside the tensor's (3,)."""
    if "cpu:1" not in mg.devices():
        pytest.skip("no cpu:1")
    w = mg.tensor(np.ones(3), device="cpu:1")
    with pytest.raises(DeviceError) as error:
        mg.vmap(lambda x: x + w)(mg.tensor(np.ones((2, 3))))
    message = str(error.value)
    assert "shape (3,) float64 on cpu, shape (3,) float64 on cpu:1" in message
    assert "batch of 2" in message and "(2, 3)" not in message


def test_nested_transformations_name_the_innermost_example():
    """vmap of vmap named max(shape (2, 3, 0), axis=(2,)); vmap under jvp, whose dual
    numbers hold the batch, named max(shape (2, 0), axis=(1,))."""
    said = _numpy_message(np.max, np.ones(0))
    with pytest.raises(ValueError) as error:
        mg.vmap(mg.vmap(mg.max))(mg.tensor(np.ones((2, 3, 0))))
    message = str(error.value)
    assert message.startswith(said) and "max(shape (0,) float64, axis=None" in message
    assert "batch of 2" in message and "batch of 3" in message
    assert "(3, 0)" not in message and "axis=(1,)" not in message

    x = mg.tensor(np.ones((2, 0)))
    with pytest.raises(ValueError) as error:
        mg.jvp(mg.vmap(mg.max), (x,), (x,))
    assert str(error.value).startswith(said) and "(2, 0)" not in str(error.value)


def test_a_shape_rule_error_gives_the_batch_size():
    """The shape-rule form named the op and one example's shapes, but not the size of
    the batch."""
    with pytest.raises(IndexError):
        np.ones(3)[5]
    with pytest.raises(IndexError) as error:
        mg.vmap(lambda x: x[5])(mg.tensor(np.ones((4, 3))))
    message = str(error.value)
    assert "batch of 4: one example is getitem(shape (3,) float64" in message
    assert "(4, 3)" not in message


def test_only_the_ops_errors_are_retold():
    """Errors of the op are retold for one example (the empty max was not); the user's
    own pass as they are: raised by f itself, or by a batching rule of the user's own,
    which fails where every example, run alone, succeeds."""
    with pytest.raises(ValueError, match=r"batch of 2: example 0"):
        mg.vmap(mg.max)(mg.tensor(np.ones((2, 0))))

    class Mine(Exception):
        def __init__(self, code: int):
            super().__init__(code)
            self.code = code

    mine = Mine(3)

    def f(x):
        mg.sin(x)
        raise mine

    with pytest.raises(Mine) as error:
        mg.vmap(f)(mg.tensor(np.ones((2, 3))))
    assert error.value is mine and error.value.code == 3

    refusal = NotImplementedError("my rule does not batch this")

    def rule(dims, x):
        raise refusal

    mine_op = Primitive("mine_op", lambda xp, x: x, lambda x: (x.shape, x.dtype), batch=rule,
                        differentiable=False)
    with pytest.raises(NotImplementedError) as error:
        mg.vmap(lambda x: bind(mine_op, x))(mg.tensor(np.ones((2, 3))))
    assert error.value is refusal


def test_a_checkpointed_f_that_fails_runs_once_and_its_error_is_its_own():
    """A kernel error inside a checkpointed f under vmap ran f five times (the shape rule
    and the example-by-example run each ran it again: its prints and counters five
    times), and f's own exception came back as its own cause, prefixed by the batched
    call. Oracle: the plain call, which runs f once."""
    runs = []

    class Mine(Exception):
        pass

    def g(x):
        runs.append(1)
        return mg.max(x, axis=0)

    with pytest.raises(ValueError, match="zero-size"):
        mg.vmap(mg.checkpoint(g))(mg.tensor(np.ones((3, 0))))
    assert len(runs) == 1

    def h(x):
        raise Mine("mine")

    with pytest.raises(Mine) as caught:
        mg.checkpoint(h)(mg.tensor([1.0]))
    assert str(caught.value) == "mine" and caught.value.__cause__ is not caught.value
