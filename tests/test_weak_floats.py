"""A Python float argument is weak in every mode, as NumPy (NEP 50) and eager mode make it.

``x * s`` with a float32 ``x`` and a Python float ``s`` is float32 in eager mode; a
compiled program (mg.trace, graph and source mode) reads ``s`` as a 0-d float64 input so
that one program serves all its values, and gave float64 until ``s`` was recorded as a
weak value (``minigraph/ops/weak.py``). Random expressions in ``x`` and ``s`` are run by
NumPy on arrays and Python floats (the oracle for the dtype and the value) and by every
mode; gradients are checked against PyTorch's autograd in float64.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import minigraph as mg

torch = pytest.importorskip("torch")

# Expressions as text over x (a tensor) and s (a Python float), with ``mg.`` functions,
# so that one text is a module's function for source mode and runs on NumPy's and
# PyTorch's stand-ins for mg below. Smooth ones only for the gradient check: a kink
# (abs, where, maximum) decided in float32 and in float64 may fall on different sides.
SMOOTH_UNARY = ["-{}", "mg.sin({})", "mg.tanh({})", "({} * 3.0)", "({} ** 2)", "(2.0 - {})"]
# (where's condition takes no part in the dtype: a float condition beside s made graph
# and source mode compute in float64 where eager mode and NumPy give float32)
KINKED_UNARY = ["abs({})", "mg.where(x > s, {}, s)",
                "mg.where(mg.astype(x - 0.5, 'float64'), {}, s)", "mg.maximum({}, s)"]
BINARY = ["({} + {})", "({} - {})", "({} * {})", "({} / (1.0 + {} ** 2))"]


def expressions(unary):
    leaves = st.sampled_from(["x", "s", "s", "0.5"])
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.builds(lambda u, a: u.format(a), st.sampled_from(unary), inner),
            st.builds(lambda b, a, c: b.format(a, c), st.sampled_from(BINARY), inner, inner)),
        max_leaves=6)


NP = types.SimpleNamespace(sin=np.sin, tanh=np.tanh, where=np.where, maximum=np.maximum,
                           sum=np.sum, astype=lambda a, dtype: np.asarray(a).astype(dtype))


def _t(v):
    return v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.float64)


TORCH = types.SimpleNamespace(sin=lambda a: torch.sin(_t(a)), tanh=lambda a: torch.tanh(_t(a)),
                              where=lambda c, a, b: torch.where(_t(c), _t(a), _t(b)),
                              maximum=lambda a, b: torch.maximum(_t(a), _t(b)),
                              sum=lambda a: torch.sum(_t(a)))

TOLERANCE = {"float32": 2e-5, "float64": 1e-12}


def _module(text):
    """``def f(x, s): return mg.sum(<text>)`` as a function in a module file (source
    mode reads the function's text), and the folder to remove afterwards."""
    folder = Path(tempfile.mkdtemp())
    path = folder / "weak_program.py"
    path.write_text(f"import minigraph as mg\n\n\ndef f(x, s):\n    return mg.sum({text})\n")
    spec = importlib.util.spec_from_file_location(f"weak_program_{abs(hash(text))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.f, folder


def _oracle(text, x, s, namespace):
    return eval(f"mg.sum({text})", {"mg": namespace, "x": x, "s": s})  # noqa: S307


dtypes = st.sampled_from(["float32", "float64", "int32", "int64"])
xs = st.lists(st.sampled_from([-1.5, -0.75, 0.25, 0.5, 1.25, 2.0]), min_size=3, max_size=3)
ss = st.sampled_from([-2.0, -0.5, 0.75, 1.5, 3.0])


@settings(max_examples=120, deadline=None)
@given(expressions(SMOOTH_UNARY + KINKED_UNARY), dtypes, xs, ss)
def test_every_mode_gives_numpys_dtype_and_value(text, dtype, x, s):
    x_np = np.array(x, dtype=dtype)
    with np.errstate(all="ignore"):
        want = np.asarray(_oracle(text, x_np, s, NP))
    f, folder = _module(text)
    try:
        results = {"eager": f(mg.tensor(x_np), s), "trace": mg.trace(f)(mg.tensor(x_np), s)}
        for mode in ("tape", "graph", "source") if dtype.startswith("float") else ():
            results[mode] = mg.value_and_grad(f, mode=mode)(mg.tensor(x_np), s)[0]
    finally:
        shutil.rmtree(folder)
        sys.modules.pop(f.__module__, None)
    for mode, got in results.items():
        assert got.dtype == want.dtype.name, f"{mode}: {text} with x {dtype}"
        tol = TOLERANCE.get(want.dtype.name, 0)  # (integers: exact)
        np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol,
                                   err_msg=f"{mode}: {text}")


@settings(max_examples=60, deadline=None)
@given(expressions(SMOOTH_UNARY), st.sampled_from(["float32", "float64"]), xs, ss)
def test_gradients_have_xs_dtype_and_pytorchs_value(text, dtype, x, s):
    x_t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    out = _oracle(text, x_t, s, TORCH)
    (want,) = torch.autograd.grad(out, x_t, allow_unused=True) if out.requires_grad else (None,)
    want = np.zeros(3) if want is None else want.numpy()
    f, folder = _module(text)
    try:
        for mode in ("tape", "forward", "graph", "source"):
            g = mg.grad(f, mode=mode)(mg.tensor(np.array(x, dtype=dtype)), s)
            assert g.dtype == dtype, f"{mode}: {text}"
            scale = max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(g.numpy(), want, rtol=1e-4 if dtype == "float32"
                                       else 1e-10, atol=1e-4 * scale, err_msg=f"{mode}: {text}")
    finally:
        shutil.rmtree(folder)
        sys.modules.pop(f.__module__, None)


def scale(x, s):
    return mg.sum(x * s)


def test_one_program_serves_every_value_of_a_weak_float():
    traced = mg.trace(scale)
    x = mg.tensor(np.ones(2, dtype=np.float32))
    for s in (0.5, -2.0, 3.25):
        out = traced(x, s)
        assert (out.dtype, out.item()) == ("float32", 2 * s)
    assert traced.recordings == 1


def test_a_differentiated_float_is_a_float64_tensor_as_in_eager_mode():
    """mg.grad makes a tensor of the number it differentiates, as mg.tensor(2.0) is
    float64: x * s is float64 then, in every mode, nested in a trace too."""
    x = mg.tensor(np.ones(2, dtype=np.float32))
    for mode in ("tape", "forward", "graph", "source"):
        v, g = mg.value_and_grad(scale, argnums=1, mode=mode)(x, 2.0)
        assert (v.dtype, g.dtype, g.item()) == ("float64", "float64", 2.0), mode
    inner = mg.trace(lambda x, s: mg.grad(scale, argnums=1)(x, s))(x, 2.0)
    assert (inner.dtype, inner.item()) == ("float64", 2.0)


def test_a_numpy_float_and_a_0d_array_stay_strong():
    """NEP 50: np.float64(2.0) and a 0-d array are not Python numbers; x * it is float64."""
    x = mg.tensor(np.ones(2, dtype=np.float32))
    for s in (np.float64(2.0), np.array(2.0), mg.tensor(2.0)):
        assert scale(x, s).dtype == "float64"
        assert mg.trace(scale)(x, s).dtype == "float64"
        assert mg.value_and_grad(scale, mode="source")(x, s)[0].dtype == "float64"


def weak_on_one_path(x, s):
    t = s
    if mg.sum(x) > 0:
        t = mg.sin(s)
    return mg.sum(x * t)


def test_a_weak_float_on_one_path_of_an_if_is_refused_in_source_mode():
    """Eager mode's dtype depends on the path (float32 with s, float64 with mg.sin(s)):
    one program cannot follow it, so source mode says so instead of picking one."""
    x = mg.tensor(np.ones(2, dtype=np.float32))
    assert weak_on_one_path(x, 2.0).dtype == "float64"
    assert weak_on_one_path(-x, 2.0).dtype == "float32"
    with pytest.raises(mg.SourceTransformError, match="Python float argument"):
        mg.grad(weak_on_one_path, mode="source")(x, 2.0)


def number_on_one_path(x, y):
    if mg.sum(x) > 0:
        t = 0.1
    else:
        t = mg.sum(x)
    return mg.sum(y * t)


def tensor_on_both_paths(x, y):
    if mg.sum(x) > 0:
        t = mg.tensor(0.1, dtype="float32")
    else:
        t = mg.sum(x)
    return mg.sum(y * t)


def test_a_number_on_one_path_of_an_if_and_a_tensor_on_the_other_is_refused():
    """In eager mode t is the Python number 0.1 on one path, which keeps its float64
    value in y * t, and a float32 tensor on the other. The join variable used to be
    filled as float32 and gave 0.4000000059604645 where eager mode (and NumPy) give 0.4;
    as float64 it would make x32 * t float64. The error names the fix, which is exact."""
    x, y = np.array([1.0, 2.0], dtype=np.float32), np.array([1.0, 3.0])
    assert number_on_one_path(mg.tensor(x), mg.tensor(y)).item() == np.sum(y * 0.1)
    with pytest.raises(mg.SourceTransformError,
                       match=r"(?s)t being the Python number 0.1 on one path of an if and a "
                             r"float32 tensor .*mg.tensor\(0.1, dtype='float32'\)"):
        mg.grad(number_on_one_path, argnums=1, mode="source")(mg.tensor(x), mg.tensor(y))
    for sign in (1.0, -1.0):
        xs = sign * x
        want = np.sum(y * (np.float32(0.1) if sign > 0 else np.sum(xs)))
        v, g = mg.value_and_grad(tensor_on_both_paths, argnums=1, mode="source")(
            mg.tensor(xs), mg.tensor(y))
        assert v.item() == want and g.dtype == "float64"


def weak_or_number(x, s):
    t = s
    if mg.sum(x) > 0:
        t = 0.1
    return mg.sum(x * t)


def weak_or_int(x, s):
    t = s
    if mg.sum(x) > 0:
        t = 2
    return mg.sum(x * t)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_float_argument_or_a_float_literal_on_the_paths_of_an_if_stays_weak(sign):
    """Both are Python floats in eager mode: the join is weak, and x32 * t float32 on
    either path, with the literal's float64 value cast as NumPy casts it. A Python int on
    one path promotes differently (int32 * 2 is int32, int32 * 2.0 float64): refused."""
    x = sign * np.array([0.5, -1.25, 2.0], dtype=np.float32)
    want = np.sum(x * (0.1 if np.sum(x) > 0 else 0.75))
    v, g = mg.value_and_grad(weak_or_number, mode="source")(mg.tensor(x), 0.75)
    assert (v.dtype, g.dtype) == ("float32", "float32") and v.item() == want
    np.testing.assert_array_equal(g.numpy(), np.full(3, np.float32(0.1 if sign > 0 else 0.75)))
    with pytest.raises(mg.SourceTransformError, match="a Python int on one path of an if"
                                                      " and a Python float"):
        mg.grad(weak_or_int, mode="source")(mg.tensor(x), 0.75)


def weak_on_both_paths(x, s):
    t = s * 2.0
    if mg.sum(x) > 0:
        t = s * 3.0
    return mg.sum(x * t)


def weak_loop(x, s):
    t = s
    for i in range(3):
        t = t * 2.0 - 1.0
    return mg.sum(x * t)


def loop_from_weak(x, s):
    h = s
    for i in range(3):
        h = h * 0.5 + mg.sum(x * x)
    return h


def _np_loop_from_weak(x, s):
    h = s
    for _ in range(3):
        h = h * 0.5 + np.sum(x * x)
    return h


@pytest.mark.parametrize("f, oracle", [
    (weak_on_both_paths, lambda x, s: np.sum(x * (s * 3.0 if np.sum(x) > 0 else s * 2.0))),
    (weak_loop, lambda x, s: np.sum(x * (((s * 2.0 - 1.0) * 2.0 - 1.0) * 2.0 - 1.0))),
    (loop_from_weak, _np_loop_from_weak),
], ids=["if", "loop", "loop from a float"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_source_mode_follows_a_weak_float_through_ifs_and_loops(f, oracle, sign):
    """A Python number on both paths of an if, or kept one by Python's arithmetic in a
    loop, stays weak; a loop variable that starts as one takes the loop's dtype, as a
    number does (eager's dtype from the first iteration on). NumPy is the oracle."""
    x = sign * np.array([0.5, -1.25, 2.0], dtype=np.float32)
    want = np.asarray(oracle(x, 0.75))
    for mode in ("graph", "source") if f is not weak_on_both_paths else ("source",):
        v, g = mg.value_and_grad(f, mode=mode)(mg.tensor(x), 0.75)
        assert (v.dtype, g.dtype) == (want.dtype.name, "float32"), mode
        np.testing.assert_allclose(v.numpy(), want, rtol=1e-6, err_msg=mode)


def number_then_wider_tensor(x, y):
    h = 0.1
    acc = mg.sum(y) * 0.0
    for i in range(2):
        acc = acc + mg.sum(x * h)
        h = mg.sum(y)
    return acc


def nested_sum_from_zero(x):
    acc = 0.0
    for i in range(2):
        for j in range(3):
            acc = acc + x[i, j] * x[i, j]
    return acc


def signed_sum_from_int_zero(x):
    acc = 0
    for i in range(3):
        if x[i] > 0:
            acc = acc + x[i]
        else:
            acc = acc - x[i]
    return acc


def number_until_the_second_iteration(x, y):
    a = 0.1
    b = 0.1
    acc = mg.sum(y) * 0.0
    for i in range(3):
        acc = acc + mg.sum(x * a)
        a = b
        b = mg.sum(y)
    return acc


def test_a_loop_variable_that_starts_as_a_number_is_read_as_eager_modes_first_iteration():
    """In eager mode the first iteration reads the number, weak: x32 * 0.1 is float32,
    while h is float64 from the second iteration on (mg.sum(y)). The program read h as a
    float64 0.1 in every iteration and gave 3.4 where eager mode and NumPy give
    3.4000000059604645. Such a first iteration is now written on its own, as straight
    code; where every operation on the number computes in the loop's dtype both ways
    (acc = 0.0, then acc + x[i]; nested, or through an if) the loop is written once.
    NumPy is the oracle of the values, the closed forms of the gradients."""
    x, y = np.array([1.0, 3.0], dtype=np.float32), np.array([0.5, 0.25])
    want = np.sum(x * 0.1) + np.sum(x * np.sum(y))
    v, g = mg.value_and_grad(number_then_wider_tensor, argnums=1, mode="source")(
        mg.tensor(x), mg.tensor(y))
    assert v.dtype == "float64" and v.item() == want == 3.4000000059604645
    np.testing.assert_array_equal(g.numpy(), np.full(2, np.sum(x, dtype=np.float64)))
    gf = mg.source_grad(number_then_wider_tensor, argnums=1)
    gf(mg.tensor(x), mg.tensor(y))
    (text,) = [p.source for p in gf.programs.values()]
    assert "x * 0.1" in text and "for i in range(1, 2):" in text
    with pytest.raises(mg.SourceTransformError, match=r"(?s)a starting as the Python number "
                       r"0.1 before a loop .*only in its second iteration \(mul computes "
                       r"in float32 with the number and in float64 with the tensor\)"
                       r".*a = mg.astype\(a, 'float64'\)"):
        mg.grad(number_until_the_second_iteration, argnums=1, mode="source")(
            mg.tensor(x), mg.tensor(y))
    a = np.array([[0.5, -1.25, 2.0], [1.5, 0.25, -3.0]], dtype=np.float32)
    for f, x, want, grad in [
            (nested_sum_from_zero, a, np.sum(a * a), 2 * a),
            (signed_sum_from_int_zero, a[0], np.sum(np.abs(a[0])), np.sign(a[0]))]:
        v, g = mg.value_and_grad(f, mode="source")(mg.tensor(x))
        assert v.dtype == g.dtype == "float32" and v.item() == want, f.__name__
        np.testing.assert_array_equal(g.numpy(), grad)
        gf = mg.source_grad(f)
        gf(mg.tensor(x))
        assert "for i in range(" in [p.source for p in gf.programs.values()][0]


def _segment(a, b):
    return a * b + mg.sin(a) * b


def _checkpointed(x, s):
    return mg.sum(mg.checkpoint(_segment)(x, s))


def test_checkpoint_hands_f_a_weak_float_inside_a_recording():
    """Eager checkpoint hands f the float itself; inside a recording checkpoint carries it
    as data and hands it to f weak again, in the forward pass and in the recomputation."""
    x = np.array([0.5, -1.25], dtype=np.float32)
    f = _checkpointed
    want = np.cos(x.astype(np.float64)) * 2.0 + 2.0  # d/dx of x s + sin(x) s at s = 2
    for mode in ("graph", "source"):
        v, g = mg.value_and_grad(f, mode=mode)(mg.tensor(x), 2.0)
        assert (v.dtype, g.dtype) == ("float32", "float32"), mode
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-6, err_msg=mode)
    assert mg.trace(f)(mg.tensor(x), 2.0).dtype == "float32"


def test_weak_arithmetic_is_pythons_in_float64():
    """s * 3.0, -s, abs(s), s ** 2 stay weak and compute in float64, as Python does; the
    program shows the cast where the value meets x."""
    def f(x, s):
        return x * (abs(-s) ** 2 * 3.0)
    x = mg.tensor(np.ones(2, dtype=np.float32))
    s = 1.0 + 2.0 ** -30  # not a float32: the float64 arithmetic shows in the last bits
    want = np.float32(abs(-s) ** 2 * 3.0)
    assert mg.trace(f)(x, s).numpy().tolist() == [want, want]
    assert "astype" in mg.trace(f).source(x, s)
    assert math.isclose(float(want), 3.0, rel_tol=1e-6)


def test_a_weak_float_meets_x_on_xs_device():
    """A Python number has no device: eager x * s runs on x's. The float's input lives
    on the default device, so the recording moves its cast value to x's (cpu:1 here);
    source mode refused the two devices before it did."""
    x = np.array([0.5, -1.25, 2.0], dtype=np.float32)
    t = mg.tensor(x, device="cpu:1")
    results = {"eager": scale(t, 0.5), "trace": mg.trace(scale)(t, 0.5)}
    for mode in ("graph", "source"):
        results[mode], g = mg.value_and_grad(scale, mode=mode)(t, 0.5)
        assert (g.dtype, g.device.name) == ("float32", "cpu:1"), mode
    for mode, v in results.items():
        assert (v.dtype, v.device.name) == ("float32", "cpu:1"), mode
        assert v.item() == pytest.approx(float(np.sum(x * np.float32(0.5))))


# -- random programs with run-time ifs and loops -----------------------------------------
# f(x, y, s): x float32 and y float64, both of shape (3,), s a Python float. Its values
# are tensors of both dtypes and shapes (3,) and (), Python floats and ints, on the paths
# of an if on a run-time value and in loops that start from a number: the class of the
# two bugs above. NumPy runs the same text (mg -> NumPy) and is the oracle of the dtype
# and of the bits; source mode must agree or refuse.

CONTROL_LEAVES = ["x", "y", "s", "0.1", "0.5", "2", "mg.sum(x)", "mg.sum(y)"]


@st.composite
def control_programs(draw):
    names = list(CONTROL_LEAVES)

    def expr():
        a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        return draw(st.sampled_from(["{} + {}", "{} - {}", "{} * {}", "mg.tanh({})"])
                    ).format(a, b)

    lines = []
    for k in range(draw(st.integers(1, 4))):
        v = f"v{k}"
        kind = draw(st.sampled_from(["assign", "if", "loop"]))
        if kind == "assign":
            lines.append(f"{v} = {expr()}")
        elif kind == "if":
            cond = draw(st.sampled_from(["mg.sum(x)", "mg.sum(y)"] +
                                        [n for n in names if n.startswith("v")]))
            lines += [f"if mg.sum({cond}) > {draw(st.sampled_from(['0.0', '1.5']))}:",
                      f"    {v} = {expr()}", "else:", f"    {v} = {expr()}"]
        else:
            element = draw(st.sampled_from(["x[i]", "y[i]", "x[i] * y[i]"]))
            lines += [f"{v} = {draw(st.sampled_from(names))}", "for i in range(3):",
                      f"    {v} = {v} {draw(st.sampled_from(['+', '*']))} "
                      f"{draw(st.sampled_from(names))} * {element}"]
        names.append(v)
    return "\n".join(lines + [f"return mg.sum({names[-1]})"])


def _control_module(body):
    folder = Path(tempfile.mkdtemp())
    path = folder / "control_program.py"
    path.write_text("import minigraph as mg\n\n\ndef f(x, y, s):\n" +
                    "".join(f"    {line}\n" for line in body.splitlines()))
    spec = importlib.util.spec_from_file_location(f"control_{abs(hash(body))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, folder


@settings(max_examples=150, deadline=None)
@given(control_programs(), st.lists(st.floats(-1.5, 1.5), min_size=6, max_size=6),
       st.sampled_from([0.1, -0.75, 1.25]))
# The first two programs it found: a loop nobody reads crashed the reverse sweep (its
# variable's adjoint had no name), and the first iteration of a loop from s computes
# s * s in Python, then in float32 with x[0], where the program computed in float64.
@example(body="v0 = x\nfor i in range(3):\n    v0 = v0 + x * x[i]\nv1 = x + x\n"
              "return mg.sum(v1)", values=[0.0] * 6, s=0.1)
@example(body="v0 = s\nfor i in range(3):\n    v0 = v0 * s * x[i] * y[i]\n"
              "return mg.sum(v0)", values=[1.0] * 6, s=0.1)
def test_source_mode_gives_numpys_dtype_and_bits_through_ifs_and_loops_or_refuses(
        body, values, s):
    x, y = np.array(values[:3], dtype=np.float32), np.array(values[3:])
    module, folder = _control_module(body)
    try:
        module.mg = NP
        with np.errstate(all="ignore"):
            want = np.asarray(module.f(x, y, s))
        module.mg = mg
        try:
            v, g = mg.value_and_grad(module.f, mode="source")(mg.tensor(x), mg.tensor(y), s)
        except mg.SourceTransformError:
            return  # (a refusal names what it cannot follow; the tests above check some)
    finally:
        shutil.rmtree(folder)
        sys.modules.pop(module.__name__, None)
    assert (v.dtype, g.dtype) == (want.dtype.name, "float32"), body
    assert v.numpy().tobytes() == want.tobytes(), f"{body}\n{v.item()!r} != {want!r}"
