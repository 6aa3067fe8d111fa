"""In-place updates (``x -= y``) and the tape's write guard (autodiff/tape.py).

Oracles: NumPy's own in-place operators, closed-form derivatives, the other AD modes
(which never write in place), and the identity of the array object for "in place".
"""

from __future__ import annotations

import gc
import operator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigraph as mg
from minigraph.autodiff import tape
from minigraph.errors import DeviceError, DTypeError, GradientError, ShapeError

rng = np.random.default_rng(7)


def test_update_writes_into_the_same_array(backend):
    p0, g0 = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    p, g = mg.tensor(p0), mg.tensor(g0)
    before = p.data
    with mg.no_grad():
        p -= 0.1 * g
    assert p.data is before
    np.testing.assert_allclose(p.numpy(), p0 - 0.1 * g0, rtol=1e-15)


def test_the_plain_training_loop_updates_the_model_parameters():
    """The loop of d2l's ``sgd`` and of PyTorch tutorials: the loop variable is the
    parameter itself, so it must be written, not rebound."""
    model = mg.nn.Linear(4, 2, seed=0)
    x, labels = mg.tensor(rng.normal(size=(8, 4))), mg.tensor(rng.integers(0, 2, 8))
    params = list(model.parameters())
    arrays = [p.data for p in params]
    losses = []
    for _ in range(20):
        loss = mg.cross_entropy(model(x), labels)
        for p in params:
            p.grad = None
        loss.backward()
        with mg.no_grad():
            for p in params:
                p -= 0.5 * p.grad
        losses.append(loss.item())
    assert all(p.data is a for p, a in zip(model.parameters(), arrays))
    assert losses[-1] < 0.7 * losses[0]


def test_a_written_view_writes_its_base():
    x = mg.tensor(np.zeros(6))
    row = x.reshape(2, 3)[1]
    with mg.no_grad():
        row += 1.0
    np.testing.assert_array_equal(x.numpy(), [0, 0, 0, 1, 1, 1])


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["+=", "-=", "*=", "/="]),
                              st.booleans(), st.floats(0.5, 2.0)), min_size=1, max_size=6))
def test_a_sequence_of_updates_matches_numpy(ops):
    write = {"+=": operator.iadd, "-=": operator.isub, "*=": operator.imul,
             "/=": operator.itruediv}
    start, other = rng.normal(size=(2, 3)), rng.uniform(0.5, 2.0, size=(3,))
    want, t, o = start.copy(), mg.tensor(start), mg.tensor(other)
    array = t.data
    for op, with_tensor, number in ops:
        want = write[op](want, other if with_tensor else number)
        t = write[op](t, o if with_tensor else number)
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-14)
    assert t.data is array


# -- while recording: a new tensor, so every mode agrees ------------------------------------------

def augmented(x):
    y = x * x
    y += x          # y = x^2 + x
    y *= 2.0        # y = 2x^2 + 2x
    return y.sum()


def updates_its_argument(x):
    x *= 3.0        # the argument itself: recorded too, in the tape mode
    x += 1.0
    return (x * x).sum()  # sum((3x + 1)^2)


@pytest.mark.parametrize("mode", mg.MODES)
def test_augmented_assignment_differentiates_alike_in_every_mode(mode):
    x = rng.normal(size=4)
    np.testing.assert_allclose(mg.grad(augmented, mode=mode)(x).numpy(), 4 * x + 2,
                               rtol=1e-13)
    np.testing.assert_allclose(mg.grad(updates_its_argument, mode=mode)(x).numpy(),
                               6 * (3 * x + 1), rtol=1e-13)


def test_updating_a_parameter_while_recording_is_refused():
    """Rebinding would leave the parameter as it was: the loop would silently not train."""
    p = mg.tensor(np.array([1.0, 2.0]), requires_grad=True)
    (p * p).sum().backward()
    with pytest.raises(GradientError, match=r"sub in place .*leaf .*mg\.no_grad\(\)"):
        p -= 0.1 * p.grad
    np.testing.assert_array_equal(p.numpy(), [1.0, 2.0])
    with mg.no_grad():
        p -= 0.1 * p.grad
    np.testing.assert_allclose(p.numpy(), [0.8, 1.6])


def test_while_recording_an_update_of_a_recorded_tensor_makes_a_new_tensor():
    x = mg.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x * 3.0
    before = y
    y += 1.0
    assert y is not before and before.numpy().tolist() == [3.0, 6.0]
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


# -- the write guard ------------------------------------------------------------------------------

def recorded_loss():
    w = mg.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    x = mg.tensor(np.array([4.0, 5.0, 6.0]))
    return w, x, (w * x).sum()


def test_backward_refuses_a_value_written_after_it_was_recorded():
    w, x, loss = recorded_loss()
    with mg.no_grad():
        x += 1.0
    with pytest.raises(GradientError,
                       match=r"mul recorded an argument \(shape \(3,\) float64 on cpu\).*in place"):
        loss.backward()
    assert w.grad is None  # nothing half-done


def test_backward_refuses_a_write_through_a_view():
    w, x, loss = recorded_loss()
    with mg.no_grad():
        view = x.reshape(3, 1)
        view *= 2.0
    with pytest.raises(GradientError, match="in place"):
        loss.backward()


def test_backward_refuses_a_written_result():
    w = mg.tensor(np.array([0.5, -1.0]), requires_grad=True)
    h = mg.exp(w)  # exp's rule reads its result
    with mg.no_grad():
        h -= 1.0
    with pytest.raises(GradientError, match="exp recorded its result"):
        h.backward(np.ones(2))


def test_writes_before_recording_are_fine():
    w, x, _ = recorded_loss()
    with mg.no_grad():
        x += 1.0
        w -= 0.5
    (w * x).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [5.0, 6.0, 7.0])


def test_stamps_are_forgotten_with_their_arrays():
    x = mg.tensor(np.ones(3))
    x += 1.0
    key = id(x.data)
    assert key in tape._written
    del x
    gc.collect()
    assert key not in tape._written


# -- bad updates leave the tensor as it was ------------------------------------------------------

@pytest.mark.parametrize("dtype, other, error, message", [
    ("float64", lambda: mg.tensor(np.ones((2, 3))), ShapeError,
     "has shape \\(2, 3\\); an in-place update keeps the tensor's shape \\(3,\\)"),
    ("float32", lambda: mg.tensor(np.ones(3)), DTypeError,
     "has dtype float64; an in-place update keeps the tensor's dtype float32"),
    ("float64", lambda: mg.tensor(np.ones(3), device="cpu:1"), DeviceError, "cpu and cpu:1"),
])
def test_a_bad_update_raises_and_changes_nothing(dtype, other, error, message):
    x = mg.tensor(np.arange(3.0), dtype=dtype)
    with pytest.raises(error, match=message):
        x -= other()
    np.testing.assert_array_equal(x.numpy(), [0.0, 1.0, 2.0])


def test_an_update_cannot_turn_integers_into_floats():
    counts = mg.tensor(np.array([1, 2, 3]))
    with pytest.raises(DTypeError, match="mul in place.*float64.*keeps the tensor's dtype int64"):
        counts *= 0.5
    np.testing.assert_array_equal(counts.numpy(), [1, 2, 3])


def test_a_read_only_array_refuses_the_update_and_is_not_stamped():
    x = mg.tensor(np.zeros(3))
    x.data = np.frombuffer(np.arange(3.0).tobytes())  # read-only memory (a bytes object)
    before = tape._last_write
    with pytest.raises(ValueError, match="sub.*read-only"):
        x -= 1.0
    assert tape._last_write == before and id(x.data.base) not in tape._written
    np.testing.assert_array_equal(x.numpy(), [0.0, 1.0, 2.0])
