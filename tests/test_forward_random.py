"""Forward mode's gradient runs f once per input element. A function that draws random
numbers (a dropout mask) drew a new mask at each pass, so each component of the
gradient was the derivative of another function. Each pass now draws what the first
drew, and the generator is left where one run of f leaves it. Oracle: the closed form
cos(x) * mask for the mask one run draws from the same state."""

import functools

import numpy as np

import minigraph as mg

RNG = np.random.default_rng(0)


def _dropped(x):
    mask = mg.tensor((RNG.random(6) > 0.3).astype(np.float64))
    return mg.sum(mg.sin(x) * mask)


def test_every_pass_of_forward_mode_draws_the_first_pass_numbers():
    x = np.linspace(0.0, 1.0, 6)
    state = RNG.bit_generator.state
    mask = (RNG.random(6) > 0.3).astype(np.float64)
    after = RNG.bit_generator.state
    RNG.bit_generator.state = state
    g = mg.grad(_dropped, mode="forward")(mg.tensor(x))
    np.testing.assert_allclose(g.numpy(), np.cos(x) * mask)
    assert RNG.bit_generator.state == after  # (as one run of f leaves it)


DRAW = functools.partial(RNG.random, 6)


def _dropped_by_partial(x):
    return mg.sum(mg.sin(x) * mg.tensor((DRAW() > 0.3).astype(np.float64)))


def test_a_generator_behind_a_partial_is_drawn_again_from_its_state():
    """``functools.partial(rng.random, 6)`` was not taken for the generator it draws
    from: a checkpoint's recomputation drew another mask, and forward mode one per pass.
    Oracle: the closed form cos(x) * mask for the mask one run draws."""
    x = np.linspace(0.0, 1.0, 6)
    for grad in (lambda: mg.grad(_dropped_by_partial, mode="forward")(mg.tensor(x)),
                 lambda: mg.grad(mg.checkpoint(_dropped_by_partial))(mg.tensor(x))):
        state = RNG.bit_generator.state
        mask = (RNG.random(6) > 0.3).astype(np.float64)
        RNG.bit_generator.state = state
        np.testing.assert_allclose(grad().numpy(), np.cos(x) * mask)
