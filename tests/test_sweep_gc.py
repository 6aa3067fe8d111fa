"""The reverse sweep pauses Python's cyclic collector and always gives it back; the tape
it releases refuses a second sweep."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import minigraph as mg
from minigraph.autodiff.backward import collector_paused
from minigraph.errors import GradientError


def test_a_backward_leaves_the_collector_as_it_found_it():
    assert gc.isenabled()
    x = mg.tensor(0.5, requires_grad=True)
    y = x
    for _ in range(50):
        y = mg.sin(y)
    y.backward()
    assert gc.isenabled()
    expected, v = 1.0, 0.5  # d/dx of sin applied 50 times: the product of cos(y_k)
    for _ in range(50):
        expected, v = expected * np.cos(v), np.sin(v)
    assert x.grad.item() == pytest.approx(expected, rel=1e-12)
    gc.disable()
    try:
        mg.grad(lambda t: mg.sin(t) * t)(0.3)
        assert not gc.isenabled()  # the caller switched it off: it stays off
    finally:
        gc.enable()


def test_a_failing_sweep_gives_the_collector_back():
    with pytest.raises(RuntimeError):
        with collector_paused():
            with collector_paused():  # nested: the inner one leaves it off
                assert not gc.isenabled()
            assert not gc.isenabled()
            raise RuntimeError("a VJP rule failed")
    assert gc.isenabled()


def test_a_recorded_op_makes_no_objects_beyond_its_tensor_and_entry():
    """Issue 20: every object a recorded op leaves is one more for the collector's full
    passes over a long tape. An op without parameters shares one empty dict; a released
    tape shares one entry."""
    from minigraph.autodiff import tape

    x = mg.tensor(0.5, requires_grad=True)
    a = mg.sin(x)
    b = a * x
    c = mg.sum(b)
    assert a._entry[1] is tape.NO_PARAMS and b._entry[1] is tape.NO_PARAMS
    assert c._entry[1] == {"axis": None, "keepdims": False}
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        y = x
        for _ in range(100):
            y = mg.sin(y)
        # each of the 100 ops: its tensor and its entry (a transient dict is given back)
        assert gc.get_count()[0] - before <= 2 * 100 + 5
    finally:
        gc.enable()
    c.backward()
    assert a._entry is tape.RELEASED_ENTRY and b._entry is tape.RELEASED_ENTRY
    assert x.grad.item() == pytest.approx(np.cos(0.5) * 0.5 + np.sin(0.5))


def test_a_released_tape_refuses_every_later_backward_through_it():
    """The shared released entry (sequence number -1) is never swept: a backward through
    it, from the same output, from a tensor computed after the release, or from one that
    reads only part of the released tape, raises and says what to do."""
    for later in (lambda y, z: z, lambda y, z: z * 2.0, lambda y, z: y + 1.0):
        x = mg.tensor(2.0, requires_grad=True)
        y = x * x
        z = mg.sin(y)
        z.backward()
        assert x.grad.item() == pytest.approx(np.cos(4.0) * 4.0)
        with pytest.raises(GradientError, match="released.*retain_graph=True"):
            later(y, z).backward()
        assert x.grad.item() == pytest.approx(np.cos(4.0) * 4.0)  # nothing added
