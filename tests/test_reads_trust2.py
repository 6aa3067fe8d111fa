"""What a function reads from outside its arguments (``reads.outside_reads``), read
through its bytecode: a module imported inside f, an attribute read by ``hasattr``, a
class pattern or an ``operator.attrgetter``, a base class's method reached through
``super()``; a method named ``eval`` is not the builtin; and a module's checkpoint whose
parameter is bound to another array before backward(). A compiled program that missed
one was reused after it changed (a stale gradient), and a checkpoint recomputed with the
new value. Oracles: closed forms, NumPy's generator, torch."""

import operator
import sys

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.autodiff.checkpoint import CheckpointError

nn = mg.nn
X = np.array([1.0, 2.0])


def _torch_grad(scale):
    """d/dx sum(x * scale) at X: torch's."""
    return torch.func.grad(lambda t: (t * scale).sum())(torch.tensor(X)).numpy()


def test_a_module_parameter_bound_to_another_array_before_backward_is_refused():
    """``lin.weight.data = W0 * 10`` between the forward pass of ``mg.checkpoint(lin)``
    and backward(): the parameters are the checkpoint's arguments, no longer watched as
    reads, and the recomputation used the new array: x.grad [[40, 60]] where the forward
    pass computed with W0 (column sums [[4, 6]]). It is refused, naming the parameter."""
    w0 = np.array([[1.0, 2.0], [3.0, 4.0]])
    lin = nn.Linear(2, 2, bias=False)
    lin.weight.data = w0.copy()
    x = mg.tensor([[1.0, -1.0]], requires_grad=True)
    mg.sum(mg.checkpoint(lin)(x)).backward()  # (unchanged: the closed form)
    np.testing.assert_array_equal(x.grad.numpy(), w0.sum(axis=0)[None])
    y = mg.sum(mg.checkpoint(lin)(x))
    lin.weight.data = w0 * 10
    with pytest.raises(CheckpointError, match=r"parameter weight \(shape \(2, 2\)"):
        y.backward()


@pytest.fixture
def cfgmod(tmp_path, monkeypatch):
    """A user's module ``reads_trust2_cfg`` holding ``SCALE = 2.0``, importable."""
    (tmp_path / "reads_trust2_cfg.py").write_text("SCALE = 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import reads_trust2_cfg
    yield reads_trust2_cfg
    sys.modules.pop("reads_trust2_cfg", None)


def _from_import(x):
    from reads_trust2_cfg import SCALE
    return mg.sum(x * SCALE)


def _plain_import(x):
    import reads_trust2_cfg
    return mg.sum(x * reads_trust2_cfg.SCALE)


@pytest.mark.parametrize("f", [_from_import, _plain_import])
def test_a_module_imported_inside_f_is_watched(cfgmod, f):
    """``from cfg import SCALE`` or ``import cfg; cfg.SCALE`` inside f: the module is a
    local of f (IMPORT_NAME, not a global load), so graph mode's program went on with
    SCALE = 2.0 after ``cfg.SCALE = 3.0``."""
    g = mg.grad(f, mode="graph")
    np.testing.assert_array_equal(g(mg.tensor(X)).numpy(), _torch_grad(2.0))
    cfgmod.SCALE = 3.0
    np.testing.assert_array_equal(g(mg.tensor(X)).numpy(), _torch_grad(3.0))


def _dropout_imported_inside(x):
    import numpy as np  # (a local of f: np is not a global it reads)
    m = (np.random.rand(8) > 0.5) * 1.0
    return mg.sum(mg.tensor(m) * x * x)


def test_a_checkpoint_draws_again_from_numpy_imported_inside_f():
    """f doing ``import numpy as np`` in its body: the checkpoint did not find the global
    generator of np.random among f's reads, did not set its state again for the
    recomputation, which drew another dropout mask: the derivative of another function."""
    x0 = np.arange(1.0, 9.0)
    np.random.seed(0)
    want = 2 * ((np.random.rand(8) > 0.5) * 1.0) * x0  # d/dx sum(m x x) = 2 m x
    np.random.seed(0)
    x = mg.tensor(x0, requires_grad=True)
    mg.checkpoint(_dropout_imported_inside)(x).backward()
    np.testing.assert_array_equal(x.grad.numpy(), want)


class _Cfg:
    __match_args__ = ("scale",)

    def __init__(self):
        self.scale = 2.0


CFG = _Cfg()
_GET_SCALE = operator.attrgetter("scale")  # (made outside f, called inside)


def _has_bias(x):
    return mg.sum(x * (3.0 if hasattr(CFG, "bias") else 2.0))


def _bias_or(x):
    return mg.sum(x * getattr(CFG, "bias", 2.0))


def _keyword_pattern(x):
    match CFG:
        case _Cfg(scale=s):
            return mg.sum(x * s)
    return mg.sum(x)


def _positional_pattern(x):
    match CFG:
        case _Cfg(s):  # (the attribute __match_args__ names)
            return mg.sum(x * s)
    return mg.sum(x)


def _getter(x):
    return mg.sum(x * _GET_SCALE(CFG))


@pytest.mark.parametrize("f, attribute", [
    (_has_bias, "bias"), (_bias_or, "bias"), (_keyword_pattern, "scale"),
    (_positional_pattern, "scale"), (_getter, "scale")])
def test_an_attribute_read_by_name_or_pattern_is_watched(f, attribute):
    """hasattr(CFG, "bias"), getattr(CFG, "bias", 2.0) (an attribute absent when the
    program was built), ``case Cfg(scale=s)`` and ``case Cfg(s)`` (MATCH_CLASS), and an
    attrgetter made outside f: none was watched, and graph mode's program went on with
    the old factor 2 after the attribute became 3."""
    g = mg.grad(f, mode="graph")
    np.testing.assert_array_equal(g(mg.tensor(X)).numpy(), _torch_grad(2.0))
    setattr(CFG, attribute, 3.0)
    try:
        got = g(mg.tensor(X)).numpy()
    finally:
        CFG.scale = 2.0
        CFG.__dict__.pop("bias", None)
    np.testing.assert_array_equal(got, _torch_grad(3.0))


SCALE = 2.0


class _Base:
    def forward(self, x):
        return x * SCALE


class _Child(_Base):
    def forward(self, x):
        return super().forward(x) + 0.0


CHILD = _Child()


def _through_super(x):
    return mg.sum(CHILD.forward(x))


def test_a_base_class_method_reached_through_super_is_read():
    """``super().forward(x)``: only the first class defining ``forward`` was read, so
    the global SCALE that the base class's method reads was not watched: graph mode went
    on with 2 after SCALE = 3, and a checkpoint recomputed with 3 (x.grad [3, 3] for a
    forward pass that computed with 2) instead of refusing."""
    global SCALE
    g = mg.grad(_through_super, mode="graph")
    try:
        np.testing.assert_array_equal(g(mg.tensor(X)).numpy(), _torch_grad(2.0))
        SCALE = 3.0
        np.testing.assert_array_equal(g(mg.tensor(X)).numpy(), _torch_grad(3.0))
        SCALE = 2.0
        y = mg.checkpoint(_through_super)(mg.tensor(X, requires_grad=True))
        SCALE = 3.0
        with pytest.raises(CheckpointError, match="f reads SCALE"):
            y.backward()
    finally:
        SCALE = 2.0


STEP = 0  # (a counter that _polynomial never reads)


class _Poly:
    def __init__(self, c):
        self.c = c

    def eval(self, x):
        return x * self.c


POLY = _Poly(2.0)


def _polynomial(x):
    return mg.sum(POLY.eval(x))


def test_a_method_named_eval_does_not_make_every_global_read():
    """``POLY.eval(x)``: the attribute ``eval`` was taken for the builtin (which may read
    any global), so every global of the module was watched, and a checkpoint refused its
    backward after the unrelated ``STEP += 1`` ("f reads STEP")."""
    global STEP
    x = mg.tensor(X, requires_grad=True)
    y = mg.checkpoint(_polynomial)(x)
    STEP += 1
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), _torch_grad(2.0))
