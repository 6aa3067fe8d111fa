"""A layer or loss that draws random numbers in a Pipeline. The pipeline builds its
graph once and runs it at every step, so a user's dropout layer (``RNG.random(shape)``
in its forward) drew its mask once and every run repeated it: the same loss at every
step, where eager training draws a new mask each time. It is refused, naming the layer
and the generator; a layer that only holds a generator (among its options) is not.
Oracle: the eager model, whose losses differ from step to step (or do not)."""

import numpy as np
import pytest

import minigraph as mg
from minigraph import nn
from minigraph.parallel.pipeline import Pipeline, PipelineError

RNG = np.random.default_rng(0)
X, Y = np.ones((8, 4)), np.zeros((8, 2))


class Dropout(nn.Module):
    def forward(self, x):
        return x * mg.tensor((RNG.random(x.shape) > 0.5) * 2.0)


def noisy_loss(prediction, target):
    return mg.mean((prediction - target) ** 2) * np.random.rand()


noisy_loss.reduction = "mean"  # (the pipeline asks how microbatches' losses add up)


class Scale(nn.Module):
    """Holds a generator among its options (it made the initial weights), draws none."""

    def __init__(self):
        super().__init__()
        self.opts = {"rng": np.random.default_rng(1), "scale": 2.0}

    def forward(self, x):
        return x * self.opts["scale"]


def test_eager_training_draws_a_new_mask_at_each_step():
    """The oracle: the same model run eagerly gives another loss at each step."""
    model, loss = nn.Sequential(nn.Linear(4, 2, seed=1), Dropout()), nn.MSELoss()
    losses = {loss(model(mg.tensor(X)), mg.tensor(Y)).item() for _ in range(4)}
    assert len(losses) > 1


def test_a_layer_that_draws_is_refused():
    model = nn.Sequential(nn.Linear(4, 2, seed=1), Dropout())
    pipe = Pipeline(model, nn.MSELoss(), [[0], [1]], schedule="gpipe", microbatches=2)
    with pytest.raises(PipelineError, match=r"layer 1, a Dropout, draws random numbers "
                                            r"from RNG"):
        pipe.run(X, Y)


def test_a_loss_that_draws_is_refused():
    model = nn.Sequential(nn.Linear(4, 2, seed=1), nn.Linear(2, 2, seed=2))
    pipe = Pipeline(model, noisy_loss, [[0], [1]], schedule="gpipe", microbatches=2)
    with pytest.raises(PipelineError, match=r"the loss noisy_loss draws random numbers"):
        pipe.run(X, Y)


def test_a_layer_that_holds_a_generator_without_drawing_runs():
    """Refused at first because a generator was among what it reads; it draws nothing,
    and the pipeline's loss is the eager model's."""
    model = nn.Sequential(nn.Linear(4, 2, seed=1), Scale())
    pipe = Pipeline(model, nn.MSELoss(), [[0], [1]], schedule="gpipe", microbatches=2)
    eager = nn.MSELoss()(model(mg.tensor(X)), mg.tensor(Y)).item()
    assert pipe.run(X, Y).loss == pytest.approx(eager)
