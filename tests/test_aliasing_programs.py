"""Random programs that update values in place while other places hold them: names, lists,
helpers that write into their arguments, a module's tensor, an argument the caller holds
(``v2``), ifs decided at run time, loops. Each mode is then called again after the
module's ``W``, and the item ``WS["w"]`` of its dict, are bound to new tensors: a
compiled program must see them (``Captured``).

Without recording, an update writes into the one object, and every holder sees it
(NumPy's semantics, eager mode's). While recording, and inside every transformation, it
binds a new value to one name; so each mode must give eager mode's value and derivative,
or refuse (ops/operators.py's ``refuse_aliased``; source mode's origins in
``source/normalize.py``). The oracles: eager mode without recording for the value and
for what f leaves in the caller's tensor, and central finite differences of it for the
gradient; never another mode.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minigraph as mg
from minigraph.errors import GradientError
from minigraph.graph.graph import TracedValueError
from program_files import load_module  # (tests/program_files.py)

HELPERS = '''import minigraph as mg

W = mg.tensor([0.7, -0.4])  # a module's tensor: an update of it writes into the module
WS = {"w": mg.tensor([0.2, 0.9])}  # a tensor in a module's dict


def bump(a, b):
    a += 0.25 * b
    return a


def scale(a):
    a *= 1.5
    return a * 1.0


def fresh(a, b):
    a = a + b
    return a


def f(x, v2):
    v0 = x * 1.5
    v1 = mg.cos(x) + 0.1
'''

name = st.integers(0, 20)  # (taken modulo the names defined so far)
statement = st.one_of(
    st.tuples(st.just("new"), name, name, st.sampled_from(["{a} * {b}", "{a} + {b}",
                                                           "mg.sin({a}) * {b}", "{a} * 0.7",
                                                           "{a} * 1.0"])),
    st.tuples(st.just("update"), name, name, st.sampled_from(["+=", "*=", "-="])),
    st.tuples(st.just("list"), name, name, st.just("")),
    st.tuples(st.just("item"), name, name, st.sampled_from(["0", "1", "-1"])),
    st.tuples(st.just("call"), name, name, st.sampled_from(["bump", "scale", "fresh"])),
    st.tuples(st.just("if"), name, name, st.just("")),
    st.tuples(st.just("loop"), name, name, st.sampled_from(["{b}", "{b} * 0.9"])),
    st.tuples(st.just("same"), name, name, st.just("")),
    st.tuples(st.just("global"), name, name, st.sampled_from(["W", 'WS["w"]'])))


def program(statements: list) -> str:
    """The text of ``f``: a few statements over v0, v1, ...; every value in the result."""
    lines, k, lists = [], 3, []  # (v2 is f's argument: the caller's tensor)
    for kind, i, j, extra in statements:
        a, b = f"v{i % k}", f"v{j % k}"
        if kind == "new":
            lines.append(f"v{k} = " + extra.format(a=a, b=b))
            k += 1
        elif kind == "update":
            lines.append(f"{a} {extra} {b if extra != '*=' else 0.5}")
        elif kind == "list":
            lists.append(f"l{len(lists)}")
            lines.append(f"{lists[-1]} = [{a}, {b}]")
        elif kind == "item" and lists:
            lines.append(f"v{k} = {lists[i % len(lists)]}[{extra}]")
            k += 1
        elif kind == "call":
            target = f"v{k}" if j % 2 else a
            lines.append(f"{target} = {extra}({a}, {b})" if extra != "scale"
                         else f"{target} = scale({a})")
            k += target == f"v{k}"
        elif kind == "if":
            lines += [f"if mg.sum({a}) > 0.1:", f"    v{k} = {b}", "else:", f"    v{k} = {a} * 0.5"]
            k += 1
        elif kind == "loop":
            lines += ["for i in range(2):", f"    {a} *= 0.5", f"    {b} = " + extra.format(b=a)]
        elif kind == "same":
            lines.append(f"v{k} = {a} * 3.0 if False else {a}")
            k += 1
        elif kind == "global":
            lines.append(f"v{k} = {extra}")
            k += 1
    terms = [f"mg.sum(v{i})" for i in range(k)] + [f"mg.sum({n}[0]) + mg.sum({n}[-1])"
                                                   for n in lists]
    return HELPERS + "".join(f"    {line}\n" for line in lines) + "    return " + \
        " + ".join(terms) + "\n"


X = np.array([0.3, -0.8])
Y = np.array([0.5, 1.2])  # the argument not differentiated, v2: f may write into it


W_AGAIN = np.array([-0.3, 1.1])  # what the module's W is bound to before a second call
WS_AGAIN = np.array([1.4, -0.6])  # and its WS["w"]


def bind_anew(module, w):
    """W and the item WS["w"] bound to new tensors (of ``w``, and of WS_AGAIN)."""
    module.W = mg.tensor(w)
    module.WS["w"] = mg.tensor(WS_AGAIN)


def eager(text, tmp, x, w=None):
    """f's value without recording, in a module of its own (f may write into W; ``w``:
    W bound to a new tensor of it first, and WS["w"]), and what f left in the caller's
    tensor ``Y``."""
    y = mg.tensor(Y)
    module = load_module(text, tmp)
    if w is not None:
        bind_anew(module, w)
    return float(module.f(mg.tensor(x), y).item()), y.numpy()


def finite_differences(text, tmp, x, w=None, eps=1e-6):
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (eager(text, tmp, x + e, w)[0] - eager(text, tmp, x - e, w)[0]) / (2 * eps)
    return g


def recorded(f, x, y):
    t = mg.tensor(x, requires_grad=True)
    value = f(t, y)
    value.backward()
    return value, t.grad


REFUSALS = (GradientError, mg.SourceTransformError, TracedValueError)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(statements=st.lists(statement, min_size=2, max_size=8))
def test_every_mode_gives_eager_modes_value_or_refuses(statements, tmp_path_factory):
    text = program(statements)
    want, want_y = eager(text, tmp_path_factory, X)
    want_grad = finite_differences(text, tmp_path_factory, X)
    again, _ = eager(text, tmp_path_factory, X, W_AGAIN)
    again_grad = finite_differences(text, tmp_path_factory, X, W_AGAIN)
    for mode in [*mg.MODES, "recorded"]:
        module = load_module(text, tmp_path_factory)  # (a fresh W for every mode)
        y = mg.tensor(Y)
        call = (lambda x, y: recorded(module.f, x, y)) if mode == "recorded" else \
            mg.value_and_grad(module.f, mode=mode)
        try:
            value, grad = call(X, y)
        except REFUSALS:
            continue  # an alias it cannot follow (or graph mode's if on a value): refused
        assert float(value.item()) == pytest.approx(want, rel=1e-12, abs=1e-12), mode
        np.testing.assert_allclose(grad.numpy(), want_grad, rtol=1e-5, atol=1e-6,
                                   err_msg=mode)
        np.testing.assert_allclose(y.numpy(), want_y, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{mode}: the caller's tensor after f")
        # a second call after W and WS["w"] are bound to new tensors: a compiled program
        # that kept the old ones is stale, and must be built again
        bind_anew(module, W_AGAIN)
        value, grad = call(X, mg.tensor(Y))
        assert float(value.item()) == pytest.approx(again, rel=1e-12, abs=1e-12), \
            f"{mode}, after W was bound anew"
        np.testing.assert_allclose(grad.numpy(), again_grad, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{mode}, after W was bound anew")
