"""Transformations that hand back what they should: vmap's outputs and errors, values that
escape their transformation, no_grad inside a differentiated function, and source mode's
comparisons, results and deep code. Oracles: torch.func, NumPy, closed forms."""

from __future__ import annotations

import collections
import importlib.util
import sys

import numpy as np
import pytest

import minigraph as mg
from minigraph.autodiff.source.reading import SourceTransformError
from minigraph.errors import ShapeError

torch = pytest.importorskip("torch")
tf = torch.func

Pair = collections.namedtuple("Pair", "value slope")


def _module(tmp_path, name: str, lines: list[str]):
    """A module written to a file: source mode reads a function's text from its file."""
    path = tmp_path / f"{name}.py"
    path.write_text("\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- vmap ------------------------------------------------------------------------------------

def test_vmap_returns_a_namedtuple_field_by_field():
    """vmap rebuilt a tuple output with type(out)(list), which a namedtuple's constructor
    refuses (it takes its fields one by one): a raw TypeError."""
    x = np.arange(6.0).reshape(2, 3)
    got = mg.vmap(lambda a: Pair(mg.sin(a), mg.cos(a)))(x)
    want = tf.vmap(lambda a: Pair(torch.sin(a), torch.cos(a)))(torch.tensor(x))
    assert type(got) is Pair
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy())


def test_vmap_refuses_graph_values_of_unknown_shape_by_name():
    """An unbatched argument (or a value f reads from outside) of unknown shape reached the
    batching rules, which crashed with raw TypeErrors from len(None)."""
    with mg.Graph():
        x = mg.placeholder(shape=(5, 3), name="x")
        w = mg.placeholder(name="w")  # shape=None
        with pytest.raises(ShapeError, match=r"argument 1 has an unknown shape \(the graph value 'w'"):
            mg.vmap(lambda a, b: mg.sin(a) * b, in_axes=(0, None))(x, w)
        with pytest.raises(ShapeError, match=r"mul's operand has an unknown shape \(the graph value 'w'"):
            mg.vmap(lambda a: a * w)(x)
        with pytest.raises(ShapeError, match=r"output 0 has an unknown shape"):
            mg.vmap(lambda a: mg.sin(w))(x)


@pytest.mark.parametrize("f, on_numpy, example, batched", [
    (lambda a: a.reshape((3,)), lambda a: a.reshape((3,)), "reshape(shape (2,)", "(4, 2)"),
    (lambda a: a[5], lambda a: a[5], "shape (2,)", "(4, 2)"),
    (lambda a: a + mg.tensor([1.0, 2.0, 3.0]), lambda a: a + np.array([1.0, 2.0, 3.0]),
     "shapes (2,) and (3,)", "(4, 2)"),
    (lambda a: mg.concatenate([a, mg.tensor(np.ones((2, 2)))], axis=0),
     lambda a: np.concatenate([a, np.ones((2, 2))], axis=0), "axis 0", "axis 1"),
])
def test_vmap_errors_speak_of_one_example(f, on_numpy, example, batched):
    """An error inside f named the batching rule's call (shape (4, 2), axis 1), which the
    user never wrote; the shapes f sees are (2,), as in JAX's and torch.func's errors."""
    with pytest.raises((ValueError, IndexError)):
        on_numpy(np.ones(2))  # NumPy refuses the same one example
    with pytest.raises((ValueError, IndexError)) as error:
        mg.vmap(f)(mg.tensor(np.ones((4, 2))))
    message = str(error.value)
    assert example in message and "inside mg.vmap" in message
    assert batched not in message


# -- values that escape their transformation ---------------------------------------------------

def test_escaped_values_are_refused_at_their_first_use():
    """A batched value, a recorded box or a dual number stored in a list kept working after
    its transformation returned: later top-level calls returned it wrapped (not a
    Tensor), and each op on a box was appended to a finished tape. JAX raises its
    UnexpectedTracerError at the first use."""
    from minigraph.autodiff.levels import EscapedValueError  # (the class came with the fix)

    leak: list = []

    def keep(a):
        leak.append(a * a)
        return (a * a * a).sum()

    mg.vmap(keep)(np.ones((2, 3)))
    mg.grad(keep)(mg.tensor([1.0, 2.0]))
    mg.grad(keep, mode="forward")(mg.tensor([1.0, 2.0]))
    for value, name in zip(leak, ("mg.vmap", "mg.grad", "mg.jvp")):
        with pytest.raises(EscapedValueError, match=f"^add: a value of {name}.* escaped"):
            value + 1.0
        with pytest.raises(EscapedValueError, match="returned; return it"):
            mg.grad(lambda y: (y * value).sum())(mg.tensor(np.ones(value.shape)))
    # a transformation started afterwards is unaffected (torch.func's value)
    g = mg.grad(lambda y: (y * y).sum())(mg.tensor([3.0]))
    assert type(g) is mg.Tensor and g.item() == 6.0


# -- no_grad inside a differentiated function ---------------------------------------------------

def _cube(x):
    return x * x * x


@pytest.mark.parametrize("inner", ["forward", "value_and_grad", "vjp"])
def test_a_transformation_under_no_grad_records_only_its_own_level(inner):
    """A transformation started inside `with mg.no_grad():` switched recording back on for
    every level (a global enable_grad), so the outer grad differentiated through the block:
    first-order MAML got a second-order term. Oracle: torch.func, closed form 3 x^2 / x^3."""
    def held(x, no_grad, grad, value_and_grad, vjp):
        with no_grad():
            if inner == "forward":
                return grad(_cube)(x)
            if inner == "value_and_grad":
                return value_and_grad(_cube)(x)[0]
            return vjp(_cube, x)[0]

    def f(x):
        return held(x, mg.no_grad, lambda h: mg.grad(h, mode="forward"),
                    mg.value_and_grad, mg.vjp) * x

    def f_torch(x):
        return held(x, torch.no_grad, tf.grad,
                    lambda h: (lambda x: tf.grad_and_value(h)(x)[::-1]), tf.vjp) * x

    want = tf.grad(f_torch)(torch.tensor(1.5, dtype=torch.float64)).item()
    assert want == (6.75 if inner == "forward" else 3.375)
    assert mg.grad(f)(1.5).item() == pytest.approx(want, abs=1e-12)


def test_value_and_grad_under_no_grad_returns_a_value_without_history():
    """Under a top-level mg.no_grad(), value_and_grad's value came back requiring a gradient
    (its f ran under a global enable_grad); torch.func.grad_and_value's does not."""
    x = mg.tensor(1.5, requires_grad=True)
    with mg.no_grad():
        value, grad = mg.value_and_grad(_cube)(x)
    xt = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        grad_t, value_t = tf.grad_and_value(_cube)(xt)
    assert value.requires_grad == value_t.requires_grad == False  # noqa: E712
    assert (value.item(), grad.item()) == (value_t.item(), grad_t.item())


# -- results that are the caller's own arrays --------------------------------------------------

def _times_one(x):
    return x * 1


def _identity(x):
    return x


def test_source_vjp_output_is_not_the_callers_input():
    """mg.vjp(f, x, mode="source") handed back x's own buffer when f simplified to x
    (x * 1): writing into the output changed x. NumPy: x * 1 is a new array."""
    x = mg.tensor(np.array([1.0, 2.0], np.float32))
    out, _ = mg.vjp(_times_one, x, mode="source")
    assert not np.shares_memory(out.numpy(), x.numpy())
    assert not np.shares_memory(x.numpy() * 1, x.numpy())  # the oracle


def test_forward_value_and_grad_value_is_not_the_callers_input():
    """value_and_grad(f, mode="forward") returned x itself as f's value when f returns x."""
    x = mg.tensor(2.0)
    value, grad = mg.value_and_grad(_identity, mode="forward")(x)
    assert (value.item(), grad.item()) == (2.0, 1.0)  # closed form: d/dx x = 1
    assert not np.shares_memory(value.numpy(), x.numpy())


# -- source mode ------------------------------------------------------------------------------

_W = mg.tensor([3.0, -7.0, 2.0])
_WN = np.array([3.0, -7.0, 2.0])


def _masked(y):
    m = _W > 0
    return mg.sum(mg.where(m, _W, 0.0)) * y


def _counted(y):
    return mg.sum(y * (_WN > 0))


def test_source_mode_compares_a_captured_array():
    """A lone comparison of a captured array (W > 0) crashed: the short-circuit of chained
    comparisons called bool() on the result, which Python asks only between links."""
    assert mg.grad(_masked, mode="source")(1.0).item() == 5.0  # d/dy y (3 + 2)
    assert mg.grad(_counted, mode="source")(1.0).item() == 2.0  # d/dy y (1 + 0 + 1)


def test_source_mode_takes_a_long_elif_chain(tmp_path):
    """Each elif is an If in the previous one's else, walked by recursion: 600 branches
    raised a raw RecursionError. Closed form: branch k computes x * (k + 1)."""
    lines = ["def f(x, k):", "    if k == 0:", "        y = x * 1.0"]
    for i in range(1, 600):
        lines += [f"    elif k == {i}:", f"        y = x * {float(i + 1)}"]
    lines += ["    else:", "        y = x * 0.5", "    return y"]
    f = _module(tmp_path, "long_elif", lines).f
    assert mg.grad(f, mode="source")(0.7, 599).item() == 600.0


def test_source_mode_refuses_an_expression_too_deep_to_walk(tmp_path):
    """A 600-term sum raised a raw RecursionError, naming neither function nor line."""
    lines = ["def f(x):", "    return " + " + ".join(["x * 1.0"] * 600)]
    f = _module(tmp_path, "long_sum", lines).f
    assert mg.grad(f)(0.7).item() == pytest.approx(600.0)  # the tape's (closed form: 600)
    with pytest.raises(SourceTransformError, match=r"in f, .*line 2(.|\n)*mode=\"tape\""):
        mg.grad(f, mode="source")(0.7)
    assert sys.getrecursionlimit() >= 1000  # (no limit was raised to get here)
