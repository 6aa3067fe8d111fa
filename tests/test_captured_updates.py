"""An update in place of a tensor f does not own, by a transformation's value, is refused
however it is written: ``buf += x`` on a global (``global buf``) or a nonlocal name, a
call whose result is bound to no name (``operator.iadd(buf, x)``, ``buf.__iadd__(x)``),
a statement over several lines, and code with no source text (``exec``, ``python -c``),
where the line cannot be read and the bytecode says where the result goes. Eager mode
writes into the tensor; a transformation cannot (its value is no array), and binding the
name would leave the transformation's value in the user's tensor after it returns (the
old answer: a Box in the global, or the update silently lost). torch.func refuses the
same updates ("would mutate a captured Tensor"); updates of f's own names are computed,
checked against closed forms."""

import operator

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import GradientError

TRANSFORMS = {
    "grad": lambda f: mg.grad(f),
    "graph": lambda f: mg.grad(f, mode="graph"),
    "forward": lambda f: mg.grad(f, mode="forward"),
    "jacfwd": lambda f: mg.jacfwd(f),
    "vmap": lambda f: mg.vmap(f),
}

CAPTURED = {
    "operator.iadd": "def f(x):\n    operator.iadd(buf, x)\n    return (x * x).sum()\n",
    "__iadd__": "def f(x):\n    buf.__iadd__(x)\n    return (x * x).sum()\n",
    "global": "def f(x):\n    global buf\n    buf += x\n    return (x * x).sum()\n",
    "nonlocal": ("def make():\n    acc = mg.tensor([0.0, 0.0])\n    def f(x):\n"
                 "        nonlocal acc\n        acc += x\n        return (x * x).sum()\n"
                 "    return f\nf = make()\n"),
    "item of a global": "def f(x):\n    bufs[0] += x\n    return (x * x).sum()\n",
    "over two lines": "def f(x):\n    bufs[0] += (x *\n                1.0)\n    return (x * x).sum()\n",
}


def _defined(text: str) -> dict:
    """Run ``text`` as ``exec`` does it, with no file behind it: no line can be read."""
    namespace = {"mg": mg, "operator": operator, "buf": mg.tensor([0.0, 0.0]),
                 "bufs": [mg.tensor([0.0, 0.0])]}
    exec(compile(text, "<string>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("spelling", sorted(CAPTURED))
@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
def test_a_captured_tensor_updated_by_a_transformations_value_is_refused(transform, spelling):
    namespace = _defined(CAPTURED[spelling])
    before = [namespace["buf"], namespace["bufs"][0]]
    with pytest.raises(GradientError, match="captured tensor"):
        TRANSFORMS[transform](namespace["f"])(mg.tensor([1.0, 2.0]))
    # the user's tensors are the ones they were, unchanged (not a transformation's value)
    assert namespace["buf"] is before[0] and namespace["bufs"][0] is before[1]
    np.testing.assert_array_equal(namespace["buf"].numpy(), [0.0, 0.0])
    np.testing.assert_array_equal(namespace["bufs"][0].numpy(), [0.0, 0.0])


OWN = {
    "a local": "def f(x):\n    h = mg.tensor([0.0, 0.0])\n    h += x\n    return (h * h).sum()\n",
    "a local over two lines": ("def f(x):\n    h = mg.tensor([0.0, 0.0])\n    h += (x *\n"
                               "          1.0)\n    return (h * h).sum()\n"),
    "a cell of its own": ("def f(x):\n    h = mg.tensor([0.0, 0.0])\n    def g():\n"
                          "        return h\n    h += x\n    return (g() * g()).sum()\n"),
}


@pytest.mark.parametrize("spelling", sorted(OWN))
@pytest.mark.parametrize("transform", ["grad", "graph", "forward"])
def test_an_update_of_fs_own_tensor_is_computed(transform, spelling):
    """h = 0 + x, so sum(h * h) has gradient 2x (closed form)."""
    f = _defined(OWN[spelling])["f"]
    x = np.array([1.0, 2.0])
    np.testing.assert_allclose(TRANSFORMS[transform](f)(mg.tensor(x)).numpy(), 2 * x)


def test_eager_mode_still_writes_through_operator_iadd():
    """Without a transformation the same call writes into the tensor, as in NumPy."""
    namespace = _defined(CAPTURED["operator.iadd"])
    namespace["f"](mg.tensor([1.0, 2.0]))
    np.testing.assert_array_equal(namespace["buf"].numpy(), [1.0, 2.0])


def _own_list_over_two_lines(x):
    bufs = [mg.zeros(())]
    bufs[0] += (x *
                x)
    return bufs[0]


class _Acc:
    pass


def _own_object_over_two_lines(x):
    a = _Acc()
    a.t = mg.zeros(())
    a.t += (x *
            x)
    return a.t


def _own_name_by_a_call(x):
    t = mg.zeros(())
    t = operator.iadd(t, x * x)
    return t


@pytest.mark.parametrize("transform", ["grad", "graph", "forward"])
@pytest.mark.parametrize("f", [_own_list_over_two_lines, _own_object_over_two_lines,
                               _own_name_by_a_call])
def test_an_update_of_what_f_made_is_computed_however_it_is_written(transform, f):
    """A container f made, updated by a statement over two lines, and a name of f's own
    bound to operator.iadd's result, were refused (the line was read alone, and a call
    was taken for a dropped result). d(x^2)/dx = 6 at 3, as torch.func.grad gives."""
    assert TRANSFORMS[transform](f)(mg.tensor(3.0)).item() == 6.0


def test_an_update_of_an_item_where_the_line_has_no_text_is_refused_saying_why():
    """Under exec the container cannot be read as f's own: refused, saying so (the
    message said "None is a tensor")."""
    f = _defined("def f(x):\n    d = {'k': mg.zeros(())}\n    d['k'] += x * x\n"
                 "    return d['k']\n")["f"]
    with pytest.raises(GradientError, match="the item is a tensor.*no source text"):
        mg.grad(f)(mg.tensor(3.0))


@pytest.mark.parametrize("filename", ["<source>", "<minigraph snippet>"])
def test_the_users_code_is_checked_whatever_its_file_is_called(filename):
    """Code compiled under a name starting like minigraph's own programs' skipped the
    check: the global was left holding a Box."""
    namespace = {"mg": mg, "G": mg.tensor(0.0)}
    exec(compile("def f(x):\n    global G\n    G += x * x\n    return x\n", filename,
                 "exec"), namespace)
    before = namespace["G"]
    with pytest.raises(GradientError, match="captured tensor"):
        mg.grad(namespace["f"])(mg.tensor(3.0))
    assert namespace["G"] is before and before.item() == 0.0
