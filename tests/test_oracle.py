"""Every differentiation mode against the closed forms of the shared oracle suite."""

from __future__ import annotations

import numpy as np
import pytest

import minigraph as mg

from oracle import CASES


@pytest.mark.parametrize("mode", list(mg.MODES))
@pytest.mark.parametrize("name", list(CASES))
def test_mode_matches_closed_form(name, mode):
    f, args, argnums, expected = CASES[name]
    grads = mg.grad(f, argnums=argnums, mode=mode)(*args)
    if isinstance(argnums, int):
        grads, expected = (grads,), (expected,)
    for g, e, i in zip(grads, expected, np.atleast_1d(argnums)):
        assert g.shape == np.shape(args[i])
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_closed_forms_match_finite_differences(name):
    """The oracle itself is checked, so a wrong closed form cannot hide."""
    f, args, argnums, _ = CASES[name]
    assert mg.gradcheck(f, [mg.tensor(a) for a in args])
