"""A layer or loss that draws random numbers in a Pipeline. The pipeline builds its
graph once and runs it at every step, so a user's dropout layer (``RNG.random(shape)``
in its forward) drew its mask once and every run repeated it: the same loss at every
step, where eager training draws a new mask each time. It is refused, naming the layer
and the generator. Oracle: the eager model, whose losses differ from step to step."""

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
