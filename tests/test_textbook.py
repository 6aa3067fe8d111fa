"""The textbook's worked example z = x*y + sin(x) at x = 2, y = 3, against closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

import minigraph as mg
from minigraph.autodiff.explain import evaluation_trace, explain, forward_trace, reverse_trace
from minigraph.cli import gradients_by_every_mode, main, textbook_f

DZDX = 3 + math.cos(2)  # y + cos x = 2.5838531634528574
DZDY = 2.0  # x


def test_closed_form_constant():
    assert DZDX == 2.5838531634528574


def test_forward_values():
    x, y = mg.tensor(2.0), mg.tensor(3.0)
    assert (x * y).item() == 6.0
    assert mg.sin(x).item() == math.sin(2)
    assert textbook_f(x, y).item() == 6 + math.sin(2)


@pytest.mark.parametrize("method", list(gradients_by_every_mode()))
def test_every_mode_gives_the_closed_form(method):
    gx, gy = gradients_by_every_mode()[method]
    assert gx == pytest.approx(DZDX, rel=1e-15)
    assert gy == DZDY


def test_evaluation_trace_is_a1_to_a5():
    assert evaluation_trace(textbook_f, x=2.0, y=3.0) == [
        "(a.1) x = 2", "(a.2) y = 3", "(a.3) a = x * y = 6",
        f"(a.4) b = sin(x) = {math.sin(2):.6g}", f"(a.5) z = a + b = {6 + math.sin(2):.6g}"]


def test_forward_traces_are_c_and_d():
    c = forward_trace(textbook_f, {"x": 1, "y": 0}, "c", x=2.0, y=3.0)
    assert c == ["(c.1) dx = 1", "(c.2) dy = 0", "(c.3) da = dx * y + x * dy = 3",
                 f"(c.4) db = dx * cos(x) = {math.cos(2):.6g}",
                 f"(c.5) dz = da + db = {DZDX:.6g}"]
    d = forward_trace(textbook_f, {"x": 0, "y": 1}, "d", x=2.0, y=3.0)
    assert [line.rsplit(" = ", 1)[1] for line in d] == ["0", "1", "2", "-0", "2"]  # 0 cos 2


def test_reverse_trace_is_g1_to_g5():
    assert reverse_trace(textbook_f, x=2.0, y=3.0) == [
        "(g.1) gz = 1", "(g.2) gb = gz = 1", "(g.3) ga = gz = 1", "(g.4) gy = ga * x = 2",
        f"(g.5) gx = ga * y + gb * cos(x) = {DZDX:.6g}"]


def test_demo_prints_everything_and_succeeds(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for label in ["(a.5)", "(c.5)", "(d.5)", "(g.5)", "2.5838531634528574",
                  'grad(mode="tape")', 'grad(mode="forward")']:
        assert label in out
    assert " NO" not in out


def test_python_dash_m_minigraph_runs_the_same_command():
    """``python -m minigraph demo`` works where the ``minigraph`` script is not on PATH."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "minigraph", "demo"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "2.5838531634528574" in done.stdout and "(g.5)" in done.stdout


@pytest.mark.parametrize("f, inputs, message", [
    (lambda x: (x * x).sum(), {"x": [1.0, 2.0]}, r"input x has shape \(2,\)"),
    (lambda x: 3.0, {"x": 2.0}, "got a float"),
    (lambda x: mg.stack([x, x]), {"x": 2.0}, r"got shape \(2,\)"),
    (lambda x: mg.tensor(3.0), {"x": 2.0}, "got a value that no input reaches"),
    (lambda x: x, {"x": 2.0}, "returned one of its inputs unchanged"),
])
def test_explain_refuses_what_has_no_textbook_trace(f, inputs, message):
    """A vector input's forward trace printed "dx = 1" and a directional derivative under
    the heading d/dx; a constant output raised AttributeError, the identity IndexError."""
    with pytest.raises(ValueError, match=message):
        explain(f, **inputs)


def _with_constant(x, y):
    return x * mg.tensor(2.0) + mg.sin(y)


def _with_no_grad(x, y):
    with mg.no_grad():
        c = x * 3.0
    return c * y + x


def _calls_grad(x, y):
    return mg.grad(textbook_f)(x, y) * y  # (y + cos x) y


def _checkpointed(x, y):
    return mg.checkpoint(textbook_f)(x, y) * x


@pytest.mark.parametrize("f, gx, gy", [
    (_with_constant, 2.0, math.cos(3.0)),
    (_with_no_grad, 1.0, 6.0),  # c = 3x is a constant: d/dx (c y + x) = 1
    (_calls_grad, -math.sin(2.0) * 3.0, 2 * 3.0 + math.cos(2.0)),
    (_checkpointed, 2 * DZDX + 6 + math.sin(2.0), 2.0 * 2.0),
])
def test_explain_traces_constants_values_made_without_recording_and_other_transformations(
        f, gx, gy):
    """explain raised KeyError on any tensor f made without recording it (mg.tensor(2.0),
    a value computed under no_grad, the seed of an inner mg.grad): it is printed as its
    number now. The gradients it prints are checked against closed forms."""
    text = explain(f, x=2.0, y=3.0)
    lines = {line.split(") ", 1)[1].split(" = ", 1)[0]: line.rsplit(" = ", 1)[1]
             for line in text.splitlines() if line.startswith("  (g.")}
    assert float(lines["gx"]) == pytest.approx(gx, rel=1e-5)
    assert float(lines["gy"]) == pytest.approx(gy, rel=1e-5)
    assert " at 0x" not in text  # (parameters by name: fn=textbook_f, not a repr)


def test_every_printed_expression_evaluates_to_its_printed_value():
    """(-2.0) ** x printed as "-2 ** x = 4", which Python reads as -4; x = -0.0 printed as
    "x = 0" beside "y / x = -inf". Each evaluation line's expression, evaluated with the
    values printed before it, gives the value printed after it."""
    def f(x, y):
        return (-2.0) ** x + y / (x * 0.0) + mg.sin(x) * -3.0

    env = {"sin": np.sin}
    for line in evaluation_trace(f, x=2.0, y=-1.0):
        name, rest = line.split(") ", 1)[1].split(" = ", 1)
        expr, _, value = rest.rpartition(" = ")
        if not expr:  # an input: "x = 2"
            env[name] = np.float64(rest)
            continue
        with np.errstate(divide="ignore"):
            env[name] = eval(expr, {}, env)  # noqa: S307
        assert env[name] == pytest.approx(float(value), rel=1e-5), line
    assert evaluation_trace(lambda x: 1.0 / x, x=-0.0)[:2] == ["(a.1) x = -0",
                                                               "(a.2) z = 1 / x = -inf"]


def test_explain_names_any_number_of_values_and_labels_every_input():
    """With more intermediates than letters, explain raised KeyError (the names ran out);
    with more than six inputs the forward traces stopped at the sixth, and the fifth was
    labelled (g.*), the reverse trace's label; an input named z met the output's name."""
    def chain(x, y):
        z = x
        for _ in range(30):
            z = z * y
        return z

    text = explain(chain, x=1.0, y=1.0)
    assert "(a.32) z = t6 * y = 1" in text and "gy = " in text
    inputs = {name: 1.0 for name in "pqrstuv"}
    text = explain(lambda *args: sum(args[1:], args[0]), **inputs)
    labels = [line.strip()[1] for line in text.splitlines() if ".1) dp = " in line]
    assert labels == ["c", "d", "e", "f", "h", "i", "j"]
    with pytest.raises(ValueError, match="input named z"):
        explain(lambda x, z: x * z, x=1.0, z=2.0)
