"""Source mode never computes silently with something it did not check.

Each test is a bug that once gave a wrong gradient, or an error that named neither the
construct nor the user's line: a tuple returned from an if decided at run time, a slice
whose shape changes with the loop index, a file edited after import, a long elif chain,
``.source`` before any call, a reused inner loop index. Oracles: PyTorch's autograd and
closed forms, never another mode of minigraph.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.autodiff.source import SourceTransformError
from minigraph.errors import MinigraphError


def _torch_grad(fn, x: np.ndarray, *rest: np.ndarray) -> np.ndarray:
    t = torch.tensor(x, requires_grad=True)
    grad, = torch.autograd.grad(fn(t, *(torch.tensor(r) for r in rest)), [t])
    return grad.numpy()


def _module(path: str, text: str):
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- an if decided at run time whose branches return a tuple, a list, a number ------------

def step(p):
    if mg.sum(p) > 0:
        return p * 2.0, p * 1.5
    return p * 0.5, p * 3.0


def uses_second(x):
    a, b = step(x)
    return mg.sum(x * b) + mg.sum(a)


def pick_list(p):
    if mg.sum(p) > 0:
        return [p * 2.0, p]
    return [p, p * 3.0]


def uses_item(x):
    return mg.sum(x * pick_list(x)[1])


def pick_number(p):
    if mg.sum(p) > 0:
        return 2.0
    return 3.0


def uses_number(x):
    return mg.sum(x * pick_number(x))


def mode_name(p):
    if mg.sum(p) > 0:
        return "square"
    return "triple"


def uses_name(x):
    if mode_name(x) == "square":
        return mg.sum(x * x)
    return mg.sum(x * 3.0)


def step_torch(p):
    if torch.sum(p) > 0:
        return p * 2.0, p * 1.5
    return p * 0.5, p * 3.0


@pytest.mark.parametrize("x", [np.array([0.3, -0.7, 1.2]), np.array([-0.3, -0.7, 0.2])])
def test_tuple_and_list_returned_from_a_runtime_if_are_joined_item_by_item(x):
    """The join stored an internal marker for a tuple (or list) returned from both
    branches, and the caller unpacked the marker's fields: b was True, so the gradient
    of sum(x * b) came out as ones, silently."""
    def torch_second(t):
        a, b = step_torch(t)
        return torch.sum(t * b) + torch.sum(a)

    def torch_item(t):
        return torch.sum(t * (torch.stack([t * 2.0, t]) if torch.sum(t) > 0
                              else torch.stack([t, t * 3.0]))[1])

    for fn, oracle in ((uses_second, torch_second), (uses_item, torch_item)):
        got = mg.grad(fn, mode="source")(x).numpy()
        np.testing.assert_allclose(got, _torch_grad(oracle, x), rtol=1e-12)


@pytest.mark.parametrize("fn, line", [(uses_number, pick_number), (uses_name, mode_name)])
def test_python_values_returned_from_a_runtime_if_are_refused(fn, line):
    """A number or a string per branch left the join as the marker itself: NumPy's
    ValueError for x * marker, or marker == "square" silently False. Source mode cannot
    return a Python value that depends on a run-time condition: it refuses, at the if."""
    with pytest.raises(SourceTransformError, match="different Python values") as info:
        mg.grad(fn, mode="source")(np.array([0.3, -0.7, 1.2]))
    assert info.value.lineno == line.__code__.co_firstlineno + 1  # (the if's line)


# -- a loop index in a slice: the shape is checked at every value ---------------------------

def parity(x, c):
    s = x[0] * 0.0
    for i in range(3):
        s = s + mg.sum(x * c[i % 2::2])
    return s


def corners(x, c):
    s = x[0] * 0.0
    for i in range(2):
        for j in range(2):
            s = s + mg.sum(x * c[j - i:])
    return s


def nested_windows(x, c):
    s = x[0] * 0.0
    for i in range(3):
        for j in range(2):
            s = s + mg.sum(x * c[i + j:i + j + 1]) * x[j - i]
            if i == j:
                s = s * 1.5
    return s


def nested_windows_torch(x, c):
    s = x[0] * 0.0
    for i in range(3):
        for j in range(2):
            s = s + torch.sum(x * c[i + j:i + j + 1]) * x[j - i]
            if i == j:
                s = s * 1.5
    return s


def test_slice_whose_shape_changes_with_the_loop_index_is_refused():
    """Shapes were checked at the loop's first and last index only: c[i % 2::2] has
    shape (1,) at i = 1 only, and the program was written for shape (2,): a wrong
    gradient, silently."""
    with pytest.raises(SourceTransformError, match="changes with the loop index"):
        mg.grad(parity, mode="source")(np.array([0.7]), np.array([1.0, 2.0, 3.0]))


def test_nested_loop_indices_are_checked_at_every_pair_of_values():
    """In nested loops the indices' values were paired (first, first), (last, last):
    c[j - i:] has shape (1,) at the mixed corners only, unchecked. Every pair is
    checked now; index arithmetic whose shapes hold at every pair (i + j, j - i, i == j)
    computes what PyTorch computes."""
    with pytest.raises(SourceTransformError, match="changes with the loop index"):
        mg.grad(corners, mode="source")(np.array([0.7]), np.array([1.0, 2.0]))
    x, c = np.array([0.7, 0.3, 1.1]), np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    got = mg.grad(nested_windows, mode="source")(x, c).numpy()
    np.testing.assert_allclose(got, _torch_grad(nested_windows_torch, x, c), rtol=1e-12)


# -- the function's file edited after import --------------------------------------------------

def test_source_of_an_edited_file_is_refused(tmp_path):
    """inspect.getsource reads the file as it is now: after an edit, source mode
    differentiated the new text (3x^2) while f ran the old one (2x), silently."""
    path = str(tmp_path / "edited_after_import.py")
    mod = _module(path, "import minigraph as mg\n\ndef f(x):\n    return mg.sum(x * x)\n")
    x = np.array([1.0, 2.0])
    np.testing.assert_allclose(mg.grad(mod.f, mode="source")(x).numpy(), 2 * x)  # unedited
    g = _module(path.replace(".py", "_2.py"),
                "import minigraph as mg\n\ndef g(x):\n    return mg.sum(x * x)\n")
    with open(g.__file__, "w") as f:
        f.write("import minigraph as mg\n\ndef g(x):\n    return mg.sum(x * x * x)\n")
    with pytest.raises(SourceTransformError, match="not the code that runs.*\n.*edited"):
        mg.grad(g.g, mode="source")(x)


# -- a long elif chain --------------------------------------------------------------------------

def _elif_chain(tmp_path, n: int):
    lines = ["import minigraph as mg", "", "def f(x):", "    s = mg.sum(x)",
             "    if s > 0.0:", "        y = x * 1.0"]
    for k in range(1, n):
        lines += [f"    elif s > {-k * 0.1:.1f}:", f"        y = x * {k + 1}.0"]
    lines += ["    else:", "        y = x * x", "    return mg.sum(y * x)"]
    return _module(str(tmp_path / f"elif_chain_{n}.py"), "\n".join(lines) + "\n").f


def test_elif_chain_deeper_than_python_allows_is_refused_with_its_line(tmp_path):
    """Each elif is written as an if inside the else before it: 99 of them made
    Python's IndentationError in the generated text, naming neither construct nor line.
    (A short chain computes the closed form; 98 still fit, which takes seconds to write.)"""
    x = np.array([-0.15, 0.0])  # s = -0.15: the third branch, d/dx sum(3x * x) = 6x
    np.testing.assert_allclose(mg.grad(_elif_chain(tmp_path, 5), mode="source")(x).numpy(),
                               6 * x)
    with pytest.raises(SourceTransformError,
                       match=r"nested more than 98 deep \(from line 5 on") as info:
        mg.grad(_elif_chain(tmp_path, 99), mode="source")(x)
    assert "elif" in str(info.value)


# -- .source before any call ----------------------------------------------------------------------

def loop_static(x, n):
    h = x
    for i in range(n):
        h = mg.sin(h) * x
    return h


def loop_rows(x):
    s = 0.0
    for i in range(x.shape[0]):
        s = s + x[i] * x[i]
    return s


@pytest.mark.parametrize("fn", [loop_static, loop_rows])
def test_source_before_a_call_says_how_to_get_the_program(fn):
    """.source before any call writes the program for float scalars; where f cannot take
    them, the error was a TypeError from re-raising SourceTransformError without its
    where, or a bare IndexError from x.shape[0]."""
    with pytest.raises(MinigraphError, match=r"(?s)\.source shows the program of the last "
                                             r"call.*float scalars.*program_for"):
        mg.source_grad(fn).source


# -- an inner loop's index name reused -----------------------------------------------------------

def reused_index(x):
    s = x * 1.0
    for j in range(3):
        s = s * x[j]
    for i in range(2):
        for j in range(2):
            s = s + mg.sin(x[j])
    return mg.sum(s)


def reused_index_torch(x):
    s = x * 1.0
    for j in range(3):
        s = s * x[j]
    for i in range(2):
        for j in range(2):
            s = s + torch.sin(x[j])
    return torch.sum(s)


def test_inner_loop_index_reused_from_an_earlier_loop():
    """j, left at 2 by the first loop, was carried by the outer loop (which the inner
    for rebinds before any read) and refused as a Python value changing between
    iterations."""
    x = np.array([0.3, -0.7, 1.2])
    got = mg.grad(reused_index, mode="source")(x).numpy()
    np.testing.assert_allclose(got, _torch_grad(reused_index_torch, x), rtol=1e-12)
