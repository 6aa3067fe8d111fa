"""Source mode on long generated functions: writing the program takes time linear in f.

``s = s + x * c`` repeated n times reads x on n lines, so the reverse sweep has n shares
of x's adjoint (``gs * c``) waiting to be written into the sum that reads them, while the
other n lines are written. The renderer used to look at every waiting share at every
line (``render.py``); and where n loops read x, each its own adjoint variable gx_k,
the namer tried every earlier number before giving one (``tidy.py``). Both made building
the program quadratic in n. The tests count those looks with a spy, not time, and check
the gradient against its closed form.
"""

from __future__ import annotations

import importlib.util
import itertools
import re

import pytest

import minigraph as mg
from minigraph.autodiff.source import render, tidy

_modules = itertools.count()


def write_sum(n, directory):
    """``def f(x)`` of n lines ``s = s + x * c_i``, in a new module (inspect reads it)."""
    lines = ["def f(x):", "    s = x * 0.0"]
    lines += [f"    s = s + x * {i % 7 + 1}.0" for i in range(n)]
    lines.append("    return s")
    path = directory / f"generated_sum_{next(_modules)}.py"
    path.write_text("\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.f


def test_a_long_sum_waits_for_its_shares_without_rescanning_them(tmp_path, monkeypatch):
    """The n shares of x's adjoint wait to be written inline into the sum that reads
    them; the renderer looked at every waiting one at every line written meanwhile (n^2
    looks at n = 400), which made building the program quadratic in n. Each is now
    looked at a bounded number of times, and the program is still right: f(x) = x *
    sum(c_i), so f'(x) = sum(c_i) (closed form)."""
    looks = {"reads": 0, "made": 0}

    class Spied(render._Inline):  # counts the reads of each waiting temporary
        def __init__(self, *args, **kwargs):
            looks["made"] += 1
            super().__init__(*args, **kwargs)

        @property
        def reads(self):
            looks["reads"] += 1
            return self._reads

        @reads.setter
        def reads(self, value):
            self._reads = value

    monkeypatch.setattr(render, "_Inline", Spied)
    n = 400
    f = write_sum(n, tmp_path)
    total = float(sum(i % 7 + 1 for i in range(n)))
    value, grad = mg.value_and_grad(f, mode="source")(mg.tensor(1.5))
    assert value.item() == pytest.approx(1.5 * total, rel=1e-12)
    assert grad.item() == pytest.approx(total, rel=1e-12)
    assert looks["made"] >= n  # (the shares did wait: the check below is about them)
    assert looks["reads"] <= 3 * looks["made"], looks


def write_loops(n, directory):
    """``def f(x)`` of n loops ``for i in range(2): s = s + x * c_i``, in a new module."""
    lines = ["def f(x):", "    s = x * 0.0"]
    for i in range(n):
        lines += ["    for i in range(2):", f"        s = s + x * {i % 7 + 1}.0"]
    lines.append("    return s")
    path = directory / f"generated_loops_{next(_modules)}.py"
    path.write_text("\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.f


def test_the_adjoints_of_one_variable_are_numbered_without_retrying_taken_names(
        tmp_path, monkeypatch):
    """Each of n loops reading x accumulates x's adjoint in a variable of its own, gx_1
    ... gx_n; naming each tried gx_1, gx_2 ... from 1 again (n^2/2 tries at n = 150),
    which made building the program quadratic in n. The search now resumes after the
    number given last, and the gradient is the closed form 2 * sum(c_i)."""
    tries = []
    free = tidy._Namer.free

    def spied(self, name, claim=False):  # records each name tried as a gx_k
        if re.fullmatch(r"gx_\d+", name):
            tries.append(name)
        return free(self, name, claim)

    monkeypatch.setattr(tidy._Namer, "free", spied)
    n = 150
    g = mg.source_grad(write_loops(n, tmp_path))
    total = 2.0 * sum(i % 7 + 1 for i in range(n))
    assert g(mg.tensor(1.5)).item() == pytest.approx(total, rel=1e-12)
    given = set(re.findall(r"\bgx_\d+\b", g.source))
    assert len(given) >= n - 1  # (the series is long: the check below is about it)
    assert len(tries) <= len(given) + 1, (len(tries), len(given))
