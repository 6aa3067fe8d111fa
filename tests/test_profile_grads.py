"""``pipeline.profile`` times each layer's forward and backward passes and promises to
leave the parameters' ``.grad`` as they were. It set them aside by reference, and since
backward() adds into an existing ``.grad`` in place (PyTorch's AccumulateGrad), its
timed passes added into the very tensors it then put back: a training step's gradients
came out changed. Oracle: copies of the gradients taken before the call."""

import numpy as np

import minigraph as mg
from minigraph import nn
import minigraph.parallel.pipeline as pp


def test_profile_leaves_the_gradients_as_they_were():
    model = nn.Sequential(nn.Linear(4, 8, seed=1), nn.Linear(8, 2, seed=2))
    x = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
    mg.sum(model(mg.tensor(x)) ** 2).backward()
    held = [p.grad for p in model.parameters()]
    before = [g.numpy().copy() for g in held]
    pp.profile(model, x, repeat=2, warmup=1)
    for p, g, was in zip(model.parameters(), held, before):
        assert p.grad is g  # (the user's tensors, put back)
        np.testing.assert_array_equal(g.numpy(), was)
