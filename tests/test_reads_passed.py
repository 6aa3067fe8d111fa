"""An object that f reads and passes to a helper, whose code reads its attributes
(``helper(CFG)``; ``c.scale`` in helper). f's code names no attribute of CFG, and the
helper's code reads c as an argument, not from outside: the compiled program kept
``CFG.scale`` as a constant, and after ``CFG.scale = 3.0`` it went on with 2.0 without
a word, in graph mode, source mode and ``mg.trace``; a checkpoint recomputed with 3.0
what its forward pass computed with 2.0. Oracle: the closed form d/dx sum(x * s) = s,
and torch."""

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.autodiff.checkpoint import CheckpointError
from minigraph.autodiff.reads import outside_reads

X = np.array([1.0, 2.0])


class Cfg:
    def __init__(self, scale: float):
        self.scale = scale


CFG = Cfg(2.0)


def _scale(c):
    return c.scale


def _twice_removed(c):  # (a helper that passes c on to another)
    return _scale(c)


def _by_name(c):
    return getattr(c, "sc" + "ale")


def _through_helper(x):
    return mg.sum(x * _scale(CFG))


def _through_two_helpers(x):
    return mg.sum(x * _twice_removed(CFG))


def _through_getattr(x):
    return mg.sum(x * _by_name(CFG))


def _torch_grad(scale):
    """d/dx sum(x * scale) at X: torch's."""
    return torch.func.grad(lambda t: (t * scale).sum())(torch.tensor(X)).numpy()


@pytest.fixture
def cfg():
    CFG.scale = 2.0
    yield CFG
    CFG.scale = 2.0


@pytest.mark.parametrize("f", [_through_helper, _through_two_helpers, _through_getattr])
@pytest.mark.parametrize("mode", ["graph", "source"])
def test_an_attribute_read_by_a_helper_is_watched(cfg, f, mode):
    """The gradient after ``CFG.scale = 3.0`` is 3, not the old 2."""
    g = mg.grad(f, mode=mode)
    np.testing.assert_allclose(g(mg.tensor(X)).numpy(), _torch_grad(2.0))
    cfg.scale = 3.0
    np.testing.assert_allclose(g(mg.tensor(X)).numpy(), _torch_grad(3.0))


def test_a_traced_function_sees_it(cfg):
    """``mg.trace``: the value after the change is 3 * sum(X), not 2 * sum(X)."""
    t = mg.trace(_through_helper)
    assert float(t(mg.tensor(X))) == 2.0 * X.sum()
    cfg.scale = 3.0
    assert float(t(mg.tensor(X))) == 3.0 * X.sum()


def test_the_reads_name_it(cfg):
    """outside_reads lists CFG's scale, where CFG's own dict holds it."""
    assert any(name == "scale" and where is vars(CFG)
               for where, name, _ in outside_reads(_through_two_helpers))


def test_a_checkpoint_changed_before_backward_is_refused(cfg):
    """Between the forward pass and backward(): the recomputation would use 3.0 where
    the forward pass used 2.0 (torch's checkpoint would too; minigraph refuses)."""
    x = mg.tensor(X, requires_grad=True)
    y = mg.checkpoint(_through_helper)(x)
    cfg.scale = 3.0
    with pytest.raises(CheckpointError, match="scale"):
        y.backward()


class _Report:
    def __init__(self):
        self._report_sections = [[] for _ in range(3)]


class _Session:
    def __init__(self):
        self.items = [_Report() for _ in range(4000)]


class _Hook:  # (as pytest's assertion-rewriting loader, a module's __loader__)
    def __init__(self):
        self.session = _Session()


HOOK = _Hook()
W = np.array([[0.5, -1.0], [2.0, 1.0]])


def _segment(x):
    return mg.tanh(x @ W)


def _two_segments(x):
    return mg.sum(mg.checkpoint(_segment)(mg.checkpoint(_segment)(x)))


def test_names_in_library_code_do_not_widen_what_is_read():
    """The attribute names that minigraph's own code names (``session``, ``items`` ...)
    were looked up on the user's objects too, with those of the user's functions: a
    checkpoint in graph mode then read a module's ``__loader__`` (pytest's, whose
    ``session.items`` holds every test) down to 10,000 objects and refused, in a long
    test run only. Only the user's functions' names are shared. Oracle: torch."""
    x = np.array([[0.3, -0.2], [0.1, 0.4]])
    expected = torch.func.grad(lambda t: torch.tanh(torch.tanh(t @ torch.tensor(W))
                                                    @ torch.tensor(W)).sum())(torch.tensor(x))
    got = mg.grad(_two_segments, mode="graph")(mg.tensor(x))
    np.testing.assert_allclose(got.numpy(), expected.numpy())
