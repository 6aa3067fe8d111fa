"""The reverse sweep pauses Python's cyclic collector and always gives it back."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import minigraph as mg
from minigraph.autodiff.backward import collector_paused


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
