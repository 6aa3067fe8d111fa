"""The chapters' reference solutions, against PyTorch: what the graded tests cannot see.

What crosses from a student's sandbox to the grader is a fresh copy of every array, so
the graded tests cannot tell whether two returned gradients are one array object; these
tests read the reference solutions directly.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"


def load_exercises(chapter: str):
    """A chapter's exercises.py (reference solutions included), under a name of its own."""
    path = next(CHAPTERS.glob(f"{chapter}-*/exercises.py"))
    spec = importlib.util.spec_from_file_location(f"reference_exercises_{chapter}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# toy graphs where an add hands one adjoint to several inputs: z = x + y; and
# z = x + (y + w), where the adjoint of z reaches x, y and w alike
ADD = [("x", "input", ()), ("y", "input", ()), ("z", "add", ("x", "y"))]
ADDS = [("x", "input", ()), ("y", "input", ()), ("w", "input", ()),
        ("q", "add", ("y", "w")), ("z", "add", ("x", "q"))]


@pytest.mark.parametrize("nodes", [ADD, ADDS], ids=["x+y", "x+(y+w)"])
def test_ch03_reverse_sweep_gives_every_input_its_own_gradient_array(nodes):
    """The reference reverse_sweep handed add's one adjoint array to both inputs: for
    z = x + y, g['x'] was g['y'], so scaling one gradient in place (an optimizer step)
    scaled the other. PyTorch's x.grad and y.grad are two tensors."""
    ex = load_exercises("03")
    names = [name for name, op, _ in nodes if op == "input"]
    rng = np.random.default_rng(0)
    feeds = {name: rng.normal(size=3) for name in names}
    grads = ex.reverse_sweep(nodes, feeds, "z")

    leaves = {name: torch.tensor(feeds[name], requires_grad=True) for name in names}
    env = dict(leaves)
    for name, op, inputs in nodes:
        if op == "add":
            env[name] = env[inputs[0]] + env[inputs[1]]
    env["z"].sum().backward()

    first = names[0]
    grads[first] *= 0.1  # scale one gradient in place, as an optimizer step would
    with torch.no_grad():
        leaves[first].grad *= 0.1
    for name in names:
        np.testing.assert_allclose(grads[name], leaves[name].grad.numpy(), rtol=1e-12,
                                   err_msg=f"the gradient of {name!r} after scaling that of "
                                           f"{first!r} in place")
