"""Graded tests of the example chapter, written the way chapter authors write them."""

import numpy as np
import pytest

import minigraph as mg
from minigraph.grading import assert_same_array, exercises_fixture

exercises = exercises_fixture()


@pytest.mark.points(1)
def test_add(exercises):
    assert exercises.add(2, 3) == 5


@pytest.mark.points(2)
def test_mean(exercises):
    xs = np.random.default_rng(0).normal(size=7)
    assert np.isclose(exercises.mean(list(xs)), mg.tensor(xs).mean().item())


@pytest.mark.points(3)
def test_dual_mul(exercises):
    a, b, da, db = np.random.default_rng(1).normal(size=4)
    value, tangent = mg.jvp(lambda x, y: x * y, (a, b), (da, db))
    out = exercises.dual_mul((a, da), (b, db))
    assert_same_array(out, (value.item(), tangent.item()), rtol=1e-5, atol=1e-8, dtype=False)


@pytest.mark.points(1)
@pytest.mark.parametrize("x, expected", [(-2.5, -1), (0, 0), (4, 1)])
def test_sign(exercises, x, expected):
    assert exercises.sign(x) == expected


@pytest.mark.points(2)
class TestCounter:
    def test_steps(self, exercises):
        counter = exercises.Counter()
        assert [counter.step(), counter.step(2)] == [1, 3]
