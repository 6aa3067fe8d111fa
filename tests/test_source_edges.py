"""Arrays and names that a transformation could not see as they are.

Each test is a bug that once gave a wrong gradient or a raw error: an array over another
library's memory (a DLPack capsule's, torch's) made read-only for good while a program
was built; a view and its base both read; an alias made by ``[h][0]`` or ``mg.add_n``
then updated in place in source mode; ``globals()["C1"]`` read in source mode, or read
by a program that then kept C1's old value. Oracles: PyTorch's autograd and closed
forms, never another mode of minigraph.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.autodiff.source import SourceTransformError
from minigraph.errors import GradientError


def _borrowed() -> dict:
    """Arrays whose memory is torch's, so NumPy will not set their flag back."""
    return {"from_dlpack": mg.from_dlpack(torch.tensor([1.0, 2.0], dtype=torch.float64),
                                          copy=False),
            "torch .numpy()": torch.tensor([1.0, 2.0], dtype=torch.float64).numpy()}


def _array(c) -> np.ndarray:
    return c.data if isinstance(c, mg.Tensor) else c


@pytest.mark.parametrize("run", ["graph", "forward", "trace", "checkpoint"])
def test_borrowed_memory_read_from_outside(run):
    """A read of an array over torch's memory made graph and forward mode, mg.trace and
    mg.checkpoint raise NumPy's "cannot set WRITEABLE flag to True", and left the array
    read-only for good. d/dw sum(w * c) = c."""
    for label, c in _borrowed().items():
        def f(w):
            return (w * c).sum()
        w = mg.tensor([1.0, 1.0])
        if run == "trace":
            got = mg.grad(mg.trace(f))(w)
        elif run == "checkpoint":
            got = mg.grad(lambda w: mg.checkpoint(f)(w))(w)
        else:
            got = mg.grad(f, mode=run)(w)
        np.testing.assert_allclose(got.numpy(), [1.0, 2.0], err_msg=label)
        assert _array(c).flags.writeable, label
        c += 1  # (still the user's to write)
        np.testing.assert_allclose(np.asarray(_array(c)), [2.0, 3.0], err_msg=label)


def test_borrowed_memory_written_by_f_is_refused_and_put_back():
    """f writing into an array over torch's memory while its program is built: the
    write is found after f returned (NumPy's flag cannot guard this array), refused, and
    undone; the array stays writable."""
    for label, c in _borrowed().items():
        def f(w):
            c[0] += 1.0
            return (w * c).sum()
        with pytest.raises(GradientError, match="in place"):
            mg.grad(f, mode="graph")(mg.tensor([1.0, 1.0]))
        np.testing.assert_array_equal(np.asarray(_array(c)), [1.0, 2.0], err_msg=label)
        assert _array(c).flags.writeable, label


def test_a_view_and_its_base_both_read():
    """f reading a view of W before W itself: the view's flag was set back first, while
    W was still read-only, and NumPy refused ("cannot set WRITEABLE flag"). d/dw of
    sum(w * V) + sum(w * W[:2]) = 2 * W[:2]."""
    W = np.array([1.0, 2.0, 3.0])
    V = W[:2]

    def f(w):
        return (w * V).sum() + (w * W[:2]).sum()
    got = mg.grad(f, mode="graph")(mg.tensor([1.0, 1.0]))
    np.testing.assert_allclose(got.numpy(), [2.0, 4.0])
    assert W.flags.writeable and V.flags.writeable


def f_new_value(x):
    h = x * 2.0
    a = mg.exp(h)
    a += 1.0
    return (h * a).sum()


def f_list(x):
    h = x * 2.0
    a = [h][0]
    a += 1.0
    return (h * h).sum()


def f_add_n(x):
    h = x * 2.0
    a = mg.add_n([h])
    a += 1.0
    return (h * h).sum()


def f_add_n_list(x):
    h = x * 2.0
    hs = [h, x]
    a = mg.add_n(hs[:1])
    a += 1.0
    return (h * h).sum()


@pytest.mark.parametrize("f", [f_list, f_add_n, f_add_n_list])
def test_source_refuses_an_update_of_what_may_be_an_alias(f):
    """``a = [h][0]`` or ``a = mg.add_n([h])`` is h itself (eager mode, PyTorch), so
    ``a += 1.0`` writes h; source mode took a for a new object and gave d/dx
    sum((2x)^2) = 8x instead of 4(2x + 1): it cannot tell, so it refuses."""
    x = np.array([1.0, 2.0, 3.0])
    t = torch.tensor(x, requires_grad=True)
    f_list(t).backward()  # (PyTorch: h is written, as in eager mode)
    np.testing.assert_allclose(t.grad.numpy(), 4 * (2 * x + 1))
    with pytest.raises(SourceTransformError, match="update in place of a, whose value"):
        mg.grad(f, mode="source")(mg.tensor(x))
    # (of aliases only: mg.exp(h) is a new tensor, updated in place;
    # d/dx sum(2x (exp(2x) + 1)) = 2 (exp(2x) + 1) + 4x exp(2x))
    got = mg.grad(f_new_value, mode="source")(mg.tensor(x))
    np.testing.assert_allclose(got.numpy(), 2 * (np.exp(2 * x) + 1) + 4 * x * np.exp(2 * x))


C1 = mg.tensor([1.0, 2.0, 3.0])


def f_globals(x):
    return (x * x * globals()["C1"]).sum()


def f_eval(x):
    return (x * eval("C1")).sum()


@pytest.mark.parametrize("mode", ["source", "graph"])
def test_globals_call_reads_fs_globals_on_every_call(mode):
    """``globals()["C1"]``: source mode ran globals() in its own module (a raw
    KeyError: 'C1'); a program built from f kept C1's value after ``C1 = ...`` (C1 is no
    name of f's code, so it was not watched). d/dx sum(x^2 C1) = 2 x C1."""
    global C1
    x = np.array([0.5, 1.5, -0.7])
    g = mg.grad(f_globals, mode=mode)
    old = C1
    try:
        for c in ([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]):
            C1 = mg.tensor(c)
            np.testing.assert_allclose(g(mg.tensor(x)).numpy(), 2 * x * np.array(c))
    finally:
        C1 = old


def test_source_refuses_eval():
    """eval("C1") would read minigraph's globals, not f's: refused, naming it."""
    with pytest.raises(SourceTransformError, match=r"eval\(\)"):
        mg.grad(f_eval, mode="source")(mg.tensor([1.0, 2.0, 3.0]))
