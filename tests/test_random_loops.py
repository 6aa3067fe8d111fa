"""Random programs with control flow, in every mode, against PyTorch autograd (float64).

The straight-line programs of test_source.py and test_random_programs.py never rebind
names, and a loop is where source transformation does most of its own work: loop
variables carried from one iteration to the next, their adjoints carried back, values
saved on a stack, ifs decided at run time inside the loop. So these programs rebind the
names a, b, c in every way Python allows: tuple assignments that read the old values
(``a, b = b * a, a``: b takes a's value from *before* the line), rotations, a temporary
(``t = a; a = ...; b = t``), in a ``for`` loop, in ifs on run-time values, before and
after the loop; in the loop, items and powers by the index (``a * w[i] ** i``); loops
inside run-time ifs. The oracle is the same text run by PyTorch (``mg.`` becomes
``torch.``), differentiated by its autograd; every mode must give its gradients (graph
mode, which refuses an if on a value, those of the programs without one).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minigraph as mg

from program_files import load_pair

torch = pytest.importorskip("torch")

VARS = ("a", "b", "c")


@st.composite
def expressions(draw, depth=0):
    if depth > 1 or draw(st.booleans()):
        return draw(st.sampled_from(VARS + ("x", "w")))
    op = draw(st.sampled_from(("sin", "tanh", "+", "*", "-")))
    if op in ("sin", "tanh"):
        return f"NS.{op}({draw(expressions(depth + 1))})"
    return f"({draw(expressions(depth + 1))} {op} {draw(expressions(depth + 1))})"


@st.composite
def statements(draw, pad, in_loop, branches=True):
    """One statement (an if is one too) as lines of text indented by ``pad``."""
    kinds = ["pair", "rotate", "through_t", "assign"] + (["if"] if branches else []) \
        + (["indexed"] if in_loop else ["loop_in_if"] if branches else [])
    kind = draw(st.sampled_from(kinds))
    u, v, t = draw(st.permutations(VARS))
    if kind == "pair":  # u, v = <expr>, <a name>: the right side reads the old values
        return [f"{pad}{u}, {v} = {draw(expressions())}, {draw(st.sampled_from(VARS))}"]
    if kind == "rotate":
        return [f"{pad}{u}, {v}, {t} = {v}, {t}, {draw(expressions())}"]
    if kind == "through_t":
        return [f"{pad}t = {u}", f"{pad}{u} = {draw(expressions())}", f"{pad}{v} = t"]
    if kind == "assign":
        return [f"{pad}{u} = {draw(expressions())} * 0.7"]
    if kind == "indexed":
        return [f"{pad}{u} = {u} * w[i] ** i + {draw(expressions())} * 0.5"]
    threshold = draw(st.sampled_from(("0.0", "0.5", "-0.5")))
    lines = [f"{pad}if NS.sum({u}) > {threshold}:"]
    if kind == "loop_in_if":  # a loop inside an if decided at run time
        lines.append(f"{pad}    for i in range({draw(st.integers(1, 2))}):")
        for _ in range(draw(st.integers(1, 2))):
            lines += draw(statements(pad + "        ", True, branches=False))
        return lines
    for _ in range(draw(st.integers(1, 2))):
        lines += draw(statements(pad + "    ", in_loop, branches=False))
    if draw(st.booleans()):
        lines.append(f"{pad}else:")
        for _ in range(draw(st.integers(1, 2))):
            lines += draw(statements(pad + "    ", in_loop, branches=False))
    return lines


@st.composite
def loop_programs(draw):
    """The body of ``f(x, w)``: a, b, c set, rebound, looped over, summed."""
    lines = ["a = x * 1.0", "b = w * 1.0", "c = x * w"]
    for _ in range(draw(st.integers(0, 2))):
        lines += draw(statements("", in_loop=False))
    lines.append(f"for i in range({draw(st.integers(1, 3))}):")
    for _ in range(draw(st.integers(1, 4))):
        lines += draw(statements("    ", in_loop=True))
    for _ in range(draw(st.integers(0, 2))):
        lines += draw(statements("", in_loop=False))
    return lines + ["return NS.sum(a * 1.3 + b * 0.7 + c * c)"]


def source_of(lines, ns, name):
    body = "\n".join("    " + line.replace("NS.", ns + ".") for line in lines)
    return f"def {name}(x, w):\n{body}\n"


@given(loop_programs(), st.integers(0, 2**32 - 1))
def test_every_mode_differentiates_random_loops_as_pytorch_does(tmp_path_factory, lines,
                                                                  seed):
    f, f_torch = load_pair(source_of, lines, tmp_path_factory)
    x, w = np.random.default_rng(seed).uniform(-1.0, 1.0, size=(2, 3))
    xt, wt = (torch.tensor(v, requires_grad=True) for v in (x, w))
    expected = [np.zeros(3) if g is None else g.numpy() for g in
                torch.autograd.grad(f_torch(xt, wt), (xt, wt), allow_unused=True)]
    # (graph mode records f once for all values: an if on a value is refused there)
    branches = any(line.lstrip().startswith("if ") for line in lines)
    for mode in [m for m in mg.MODES if not (branches and m == "graph")]:
        grads = mg.grad(f, argnums=(0, 1), mode=mode)(x, w)
        for g, e, name in zip(grads, expected, "xw"):
            np.testing.assert_allclose(g.numpy(), e, rtol=1e-9, atol=1e-12,
                                       err_msg=f"d/d{name} in {mode} mode of\n"
                                               + source_of(lines, "mg", "f"))
