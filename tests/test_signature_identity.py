"""Compiled programs belong to the very function and constant objects they were built
from, and guard what f read before it ran.

The cache of programs (``signature.programs``) and a constant argument's key
(``signature.constant_key``) found an object by ``==``, which a user's class defines
as it likes (two layers or configs equal by their name): a second, equal object reused
the first one's program. And the guard (``signature.Captured``) was taken after f ran
while recorded, so a name f reads and then binds anew itself was guarded at its new
value. Oracles: closed forms (the functions are x * s, sin(s x)) and eager runs.
"""

import numpy as np
import pytest

import minigraph as mg
from minigraph.autodiff import signature


class Scaler:
    """A callable "named layer": equal to another of the same name, as a dict key."""

    def __init__(self, name, s):
        self.name, self.s = name, s

    def __eq__(self, other):
        return isinstance(other, Scaler) and other.name == self.name

    def __hash__(self):
        return hash(self.name)

    def __call__(self, x):
        return x * self.s


class SinScaler(Scaler):
    def __call__(self, x):
        return mg.sin(x * self.s)


class NamedLayer(mg.nn.Module):
    """``x * weight * s``: a module equal to another of the same name, whatever its
    weight (a parameter) and its scale s (an attribute) are."""

    def __init__(self, name, s):
        super().__init__()
        self.layer_name, self.s = name, s
        self.weight = mg.tensor(1.0, requires_grad=True)

    def forward(self, x):
        return x * self.weight * self.s

    def __eq__(self, other):
        return isinstance(other, NamedLayer) and other.layer_name == self.layer_name

    def __hash__(self):
        return hash(self.layer_name)


class Cfg:
    """A config equal to another of the same name, whatever its scale."""

    def __init__(self, name, s):
        self.name, self.s = name, s

    def __eq__(self, other):
        return isinstance(other, Cfg) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


def scaled_by(x, cfg):
    return x * cfg.s


WARM = True


def warm_up(x):
    """Scaled by 0.1 on its first call only (a warm-up flag it clears itself)."""
    global WARM
    s = 0.1 if WARM else 1.0
    WARM = False
    return x * s


class State:
    warm = True


STATE = State()


def warm_up_attribute(x):
    s = 0.1 if STATE.warm else 1.0
    STATE.warm = False
    return x * s


class AnswersEveryName:
    """A callable whose __getattr__ answers every missing name (an AttrDict): None."""

    def __init__(self):
        self.__dict__["_d"] = {"scale": 3.0}

    def __getattr__(self, name):
        return self._d.get(name)

    def __call__(self, x):
        return x * self._d["scale"]


def test_equal_callables_have_programs_of_their_own():
    """mg.trace(b) and mg.grad(b, mode="graph") replayed the program of a, an equal
    object (the cache found b by ==): b(2.0) gave 2.0, its gradient 1.0."""
    a, b = Scaler("lin", 1.0), Scaler("lin", 5.0)
    assert float(mg.trace(a)(2.0).data) == 2.0
    assert float(mg.trace(b)(2.0).data) == 10.0
    assert float(mg.grad(a, mode="graph")(2.0).data) == 1.0
    assert float(mg.grad(b, mode="graph")(2.0).data) == 5.0


def test_equal_callables_have_checkpoint_backward_programs_of_their_own():
    """mg.checkpoint(d) pulled back with the backward program of c, an equal object:
    the gradient of sin(s x) was c's, cos(0.3), not 5 cos(1.5)."""
    for f in (SinScaler("sin", 1.0), SinScaler("sin", 5.0)):
        x = mg.tensor(0.3, requires_grad=True)
        mg.checkpoint(f)(x).backward()
        np.testing.assert_allclose(float(x.grad.data), f.s * np.cos(0.3 * f.s), rtol=1e-12)


def test_equal_modules_are_checkpointed_each_with_its_own_parameters():
    """mg.checkpoint(module) found the call of an equal module (its table was keyed by
    ==), and ran that module, with its own parameters but the other's scale."""
    modules = [NamedLayer("layer", 1.0), NamedLayer("layer", 5.0)]  # (both alive)
    for module in modules:
        assert float(mg.checkpoint(module)(mg.tensor(2.0)).data) == 2.0 * module.s


@pytest.mark.parametrize("mode", ["graph", "source"])
def test_an_equal_constant_argument_gets_a_program_of_its_own(mode):
    """A config equal to the first (the same name), with another scale, reused the
    program built for the first: grad of x * cfg.s was 1.0 for cfg.s = 5.0."""
    G = mg.grad(scaled_by, mode=mode)
    assert float(G(2.0, Cfg("c", 1.0)).data) == 1.0
    assert float(G(2.0, Cfg("c", 5.0)).data) == 5.0
    T = mg.trace(scaled_by)
    assert float(T(2.0, Cfg("c", 1.0)).data) == 2.0
    assert float(T(2.0, Cfg("c", 5.0)).data) == 10.0


def test_a_new_equal_constant_per_call_is_right_and_the_programs_are_bounded():
    """Keyed by identity, a new config per call is a new program per call: each right,
    and the cache keeps at most _MOST_PROGRAMS of them, not every one it was called
    with (before: one program, the first config's, for all)."""
    def f(x, cfg):
        return x * cfg.s

    G = mg.grad(f, mode="graph")
    for k in range(70):
        assert float(G(2.0, Cfg("c", float(k))).data) == float(k)
    most = signature._MOST_PROGRAMS
    assert most < 70
    assert len(signature.programs(f, "graph", ((0,), "gradients only"))) == most


@pytest.mark.parametrize("f, reset", [
    (warm_up, lambda: globals().__setitem__("WARM", True)),
    (warm_up_attribute, lambda: setattr(STATE, "warm", True))])
@pytest.mark.parametrize("mode", ["trace", "graph"])
def test_a_name_f_reads_then_binds_itself_makes_its_program_stale(f, reset, mode):
    """f reads a warm-up flag and clears it: eager mode scales by 0.1 on the first call
    and by 1.0 after. The guard was taken after f ran, at the flag's new value, while
    the program held 0.1: every later call gave 0.1 x too."""
    reset()
    F = mg.trace(f) if mode == "trace" else mg.grad(f, mode="graph")
    got = [float(F(2.0).data) for _ in range(3)]
    want = [0.2, 2.0, 2.0] if mode == "trace" else [0.1, 1.0, 1.0]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_trace_of_a_callable_whose_getattr_answers_every_name():
    """mg.trace(m) took m.__name__, None from m's __getattr__, as its graph's name and
    failed: "Graph: the name must be a str, got None"."""
    m = AnswersEveryName()
    T = mg.trace(m)
    assert float(T(2.0).data) == 6.0
    assert T.name == "AnswersEveryName"


# -- the bound of the cache: least recently used first; equal configs share a program --

def _scaled(x, c):
    return mg.sum(x * c.scale)


class _ByValue:
    """A config hashable by all it holds, as a user's value class is."""

    def __init__(self, scale):
        self.scale = scale

    def __eq__(self, other):
        return type(other) is _ByValue and other.scale == self.scale

    def __hash__(self):
        return hash(self.scale)


def test_a_new_equal_config_per_call_shares_one_program():
    """Keyed by identity, a config built anew at each call (equal by ==, holding the
    same numbers) recorded a program at every call (30 calls: 30 recordings); the key is
    its == and all it holds, so one program serves them, and one holding another scale
    gets its own. Oracle: the closed form d/dx sum(x * s) = s."""
    g = mg.grad(_scaled, mode="graph")
    for _ in range(5):
        assert g(mg.tensor([1.0, 2.0]), _ByValue(2.0)).tolist() == [2.0, 2.0]
    assert g(mg.tensor([1.0, 2.0]), _ByValue(3.0)).tolist() == [3.0, 3.0]
    programs = signature.programs(_scaled, "graph", ((0,), "gradients only"))
    assert len(programs) == 2


def _shaped(x):
    return mg.sum(x * 2.0)


def test_a_program_used_often_is_kept_however_many_others_come():
    """The oldest program was dropped first beyond 64, however often it was used: a
    training shape used at every other call was recorded again and again."""
    traced = mg.trace(_shaped)
    hot = mg.tensor(np.ones(3))
    traced(hot)
    first = traced.recordings
    for n in range(4, 4 + 80):
        traced(mg.tensor(np.ones(n)))
        traced(hot)
    assert traced.recordings == first + 80  # (each new shape once; the hot one never again)


class _Scales(list):
    """A list of the user's with an attribute."""


def _scaled_items(x, c):
    return mg.sum(mg.sin(x * c.scale) * c[0])


def test_a_list_of_yours_is_keyed_by_its_attributes_too():
    """A list (or tuple) subclass was keyed by its items only: after ``cfg.scale = 3``,
    or for a new one with scale 5, the program built for scale 1 was reused. Oracle:
    the closed form d/dx sum(sin(x s) c0) = cos(x s) s c0."""
    x = np.array([0.5, 1.0])
    g = mg.grad(_scaled_items, mode="graph")
    for scale in (1.0, 3.0, 5.0):
        cfg = _Scales([2.0])
        cfg.scale = scale
        np.testing.assert_allclose(g(mg.tensor(x), cfg).numpy(),
                                   np.cos(x * scale) * scale * 2.0)


def _scaled_by_dict(x, cfg):
    return mg.sum(mg.sin(x) * cfg["scale"])


@pytest.mark.timeout(60)
def test_a_container_that_holds_itself_is_looked_into_once():
    """``cfg["self"] = cfg`` as an argument hung graph mode, source mode and checkpoint
    (the search for arrays inside arguments walked the cycle forever). Graph mode refuses
    a dict argument, and a checkpoint runs; oracle: the closed form 2 cos(x)."""
    cfg = {"scale": 2.0}
    cfg["self"] = cfg
    x = mg.tensor([0.5, 1.0])
    with pytest.raises(TypeError, match="neither data"):
        mg.grad(_scaled_by_dict, mode="graph")(x, cfg)
    xr = mg.tensor([0.5, 1.0], requires_grad=True)
    mg.checkpoint(_scaled_by_dict)(xr, cfg).backward()
    np.testing.assert_allclose(xr.grad.numpy(), 2 * np.cos([0.5, 1.0]))
