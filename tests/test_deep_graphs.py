"""Deep chains: no recursion anywhere, so 100,000 operations differentiate."""

from __future__ import annotations

import math

import pytest

import minigraph as mg

N = 100_000


def chain(x, n=N):
    for _ in range(n):
        x = x * 1.0000001 + 0.0
    return x


def test_tape_backward_through_100k_operations():
    x = mg.tensor(1.5, requires_grad=True)
    y = x
    for _ in range(N):
        y = mg.sin(y) * 0.5 + y * 0.5  # a 300,000-entry tape
    y.backward()
    # Closed form by the chain rule, computed independently in plain Python floats.
    v, d = 1.5, 1.0
    for _ in range(N):
        d *= 0.5 * math.cos(v) + 0.5
        v = 0.5 * math.sin(v) + 0.5 * v
    assert y.item() == pytest.approx(v, rel=1e-12)
    assert x.grad.item() == pytest.approx(d, rel=1e-9, abs=1e-300)


def test_forward_mode_through_100k_operations():
    out, tangent = mg.jvp(chain, (2.0,), (1.0,))
    assert tangent.item() == pytest.approx(1.0000001 ** N, rel=1e-9)
    assert out.item() == pytest.approx(2.0 * 1.0000001 ** N, rel=1e-9)


def test_grad_of_100k_chain_and_freeing_it():
    g = mg.grad(chain)(2.0)
    assert g.item() == pytest.approx(1.0000001 ** N, rel=1e-9)
    # Dropping a 100k-deep tape must not overflow the C stack when Python frees it.
    x = mg.tensor(1.0, requires_grad=True)
    y = chain(x)
    del y, x
