"""What f reads through code that Python runs without the code naming it is watched.

A compiled program (``mg.trace``, graph and source mode, a checkpoint's backward
program, a Pipeline's graph) keeps what f read when it was built; ``reads.outside_reads``
lists those reads so that a change is seen. These tests change a value that f reaches
through a user class's special method (``CFG["k"]``: ``__getitem__``; ``float(NUM)``,
``SCALER * x``, a descriptor's ``__get__``, a metaclass's property, ``Cfg()``'s
``__init__``), through a container that was not watched (a ``MappingProxyType``, a
``UserDict`` subclass, a ``memoryview``, ``os.environ``), or through an object's class
(``obj.__class__ = Other``), and compare the program's answer with the closed form
of the function as it is now. Each failed before: the program gave the old value.
"""

import collections
import os
import types

import numpy as np
import pytest

import minigraph as mg
from minigraph import nn
from minigraph.errors import MinigraphError
import minigraph.parallel.pipeline as pp


def compiled(f):
    """f's compiled forms, each run once (built with the value f reads now)."""
    made = {"trace": mg.trace(f), "graph": mg.grad(f, mode="graph"),
            "source": mg.grad(f, mode="source")}
    for g in made.values():
        g(2.0)
    return made


def assert_scale(made, scale):
    """f(x) = x * scale: the value at 2 is 2 * scale, the derivative scale."""
    assert float(made["trace"](2.0).data) == 2.0 * scale
    assert float(made["graph"](2.0).data) == scale
    assert float(made["source"](2.0).data) == scale


# --- special methods of the user's classes (bug 1) ------------------------------------

class Table:
    def __init__(self):
        self._d = {"scale": 1.0}

    def __getitem__(self, k):
        return self._d[k]


class Num:
    def __init__(self):
        self.v = 1.0

    def __float__(self):
        return self.v


class Twice:  # a descriptor that is not a property
    def __get__(self, obj, kind):
        return obj._s * 2


class WithDescriptor:
    scale = Twice()

    def __init__(self):
        self._s = 0.5


class Dynamic:
    def __init__(self):
        self._v = 1.0

    def __getattribute__(self, name):
        return object.__getattribute__(self, "_v" if name == "scale" else name)


class ArrayLike:
    def __init__(self):
        self.v = 1.0

    def __array__(self, dtype=None, copy=None):
        return np.array(self.v)


G_SCALE = 1.0


class GlobalTable:
    def __getitem__(self, k):
        return G_SCALE


class Scaler:
    def __init__(self):
        self.s = 1.0

    def __mul__(self, x):
        return x * self.s


class Meta(type):
    @property
    def scale(cls):
        return cls._v


class Settings(metaclass=Meta):
    _v = 1.0


class Made:  # Made().scale: its __init__ reads a global
    def __init__(self):
        self.scale = G_MADE


G_MADE = 1.0

TABLE, NUM, DESC, DYN, ARR = Table(), Num(), WithDescriptor(), Dynamic(), ArrayLike()
GT, SCALER = GlobalTable(), Scaler()


def _set_global(name, value):
    globals()[name] = value


# (source mode reads a function's text: each is a def of its own)
def f_getitem(x): return x * TABLE["scale"]
def f_float(x): return x * float(NUM)
def f_descriptor(x): return x * DESC.scale
def f_getattribute(x): return x * DYN.scale
def f_array(x): return x * mg.tensor(np.asarray(ARR))
def f_getitem_global(x): return x * GT["k"]
def f_mul(x): return SCALER * x
def f_metaclass(x): return x * Settings.scale
def f_made(x): return x * Made().scale


SPECIAL = {
    "__getitem__": (f_getitem, lambda: TABLE._d.__setitem__("scale", 5.0)),
    "__float__": (f_float, lambda: setattr(NUM, "v", 5.0)),
    "descriptor __get__": (f_descriptor, lambda: setattr(DESC, "_s", 2.5)),
    "__getattribute__": (f_getattribute, lambda: setattr(DYN, "_v", 5.0)),
    "__array__": (f_array, lambda: setattr(ARR, "v", 5.0)),
    "__getitem__ reading a global": (f_getitem_global, lambda: _set_global("G_SCALE", 5.0)),
    "__mul__": (f_mul, lambda: setattr(SCALER, "s", 5.0)),
    "metaclass property": (f_metaclass, lambda: setattr(Settings, "_v", 5.0)),
    "a class's __init__": (f_made, lambda: _set_global("G_MADE", 5.0)),
}


@pytest.mark.parametrize("case", list(SPECIAL))
def test_special_methods_are_followed(case, monkeypatch):
    """Python calls a user class's special method without the code naming it (the
    subscript, float(), the operator, a descriptor's or a metaclass property's read, a
    class called): outside_reads did not follow it, so what it read was not watched and
    the programs went on with scale = 1 after it became 5."""
    for name in ("G_SCALE", "G_MADE"):  # (set back after the test)
        monkeypatch.setitem(globals(), name, 1.0)
    f, change = SPECIAL[case]
    made = compiled(f)
    assert_scale(made, 1.0)
    change()
    assert_scale(made, 5.0)


class Keys:
    def __init__(self):
        self._d = {"k": 1.0}

    def __getitem__(self, key):
        return self._d[key]


def test_checkpoint_backward_program_follows_getitem():
    """mg.checkpoint(f) recomputed the value with the new CFG["k"] but kept the backward
    program built with the old one: d/dx sin(k x) = k cos(k x) was 1 * cos(k x)."""
    cfg = Keys()
    ck = mg.checkpoint(lambda x: mg.sin(x * cfg["k"]))
    for k in (1.0, 5.0):
        cfg._d["k"] = k
        x = mg.tensor(0.3, requires_grad=True)
        ck(x).backward()
        assert np.isclose(float(x.grad.data), k * np.cos(k * 0.3))


class ScaleLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg

    def forward(self, x):
        return x * self.cfg["k"]


def test_pipeline_graph_follows_getitem():
    """A Pipeline's graph, built once per batch shape, kept CFG["k"] = 1 after it became 5:
    its loss was the old model's. Oracle: the closed form of the loss, mean((k X W^T + k b
    - Y)^2) over the outputs, computed with NumPy."""
    cfg = Keys()
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(8, 4)), rng.normal(size=(8, 2))
    lin = nn.Linear(4, 2, seed=1)
    model = nn.Sequential(lin, ScaleLayer(cfg))
    pipe = pp.Pipeline(model, nn.MSELoss(), [[0], [1]], schedule="gpipe", microbatches=2)
    pipe.run(X, Y)
    cfg._d["k"] = 5.0
    W, b = lin.weight.numpy(), lin.bias.numpy()
    expected = np.mean((5.0 * (X @ W.T + b) - Y) ** 2)
    assert np.isclose(pipe.run(X, Y).loss, expected)


# --- containers that were not watched (bug 2) -----------------------------------------

class Params(collections.UserDict):
    pass


class Scales(collections.UserList):
    pass


HIDDEN = {"scale": 1.0}
PROXY = types.MappingProxyType(HIDDEN)
PARAMS, SCALES = Params(scale=1.0), Scales([1.0])
VIEW = memoryview(bytearray(8)).cast("d")
VIEW[0] = 1.0


def f_proxy(x): return x * PROXY["scale"]
def f_userdict(x): return x * PARAMS["scale"]
def f_userlist(x): return x * SCALES[0]
def f_view(x): return x * VIEW[0]
def f_environ(x): return x * float(os.environ["MINIGRAPH_TEST_SCALE"])


CONTAINERS = {
    "MappingProxyType": (f_proxy, lambda: HIDDEN.__setitem__("scale", 5.0)),
    "UserDict subclass": (f_userdict, lambda: PARAMS.__setitem__("scale", 5.0)),
    "UserList subclass": (f_userlist, lambda: SCALES.__setitem__(0, 5.0)),
    "memoryview": (f_view, lambda: VIEW.__setitem__(0, 5.0)),
    "os.environ": (f_environ, lambda: os.environ.__setitem__("MINIGRAPH_TEST_SCALE", "5.0")),
}


@pytest.mark.parametrize("case", list(CONTAINERS))
def test_containers_are_watched(case, monkeypatch):
    """A dict's read-only view, a UserDict's or UserList's subclass, a memoryview and
    os.environ were not watched as containers: an item set anew was not seen."""
    monkeypatch.setenv("MINIGRAPH_TEST_SCALE", "1.0")  # (set back after the test)
    f, change = CONTAINERS[case]
    made = compiled(f)
    assert_scale(made, 1.0)
    change()
    assert_scale(made, 5.0)


def test_memoryview_of_two_dimensions_is_refused():
    """A memoryview of two dimensions cannot be listed item by item: it is refused, with
    what to do instead, where it was left unwatched."""
    grid = memoryview(bytearray(32)).cast("d", shape=[2, 2])
    with pytest.raises(MinigraphError, match="memoryview"):
        mg.grad(lambda x: x * grid[0, 0], mode="graph")(2.0)


# --- objects whose __getattr__ answers every name (bugs 3 and 4) ----------------------

class Model:
    def __init__(self):
        self.__dict__["_d"] = {"scale": 1.0}

    def __getattr__(self, name):  # a missing name: None
        return self._d.get(name)

    def __call__(self, x):
        return x * self._d["scale"]


def test_callable_with_permissive_getattr_is_read():
    """hasattr(m, "__wrapped__") was True (m's __getattr__ answers None), so m was taken
    for a wrapper of None and nothing it reads was watched."""
    m = Model()
    g = mg.grad(m, mode="graph")
    assert float(g(2.0).data) == 1.0
    m._d["scale"] = 5.0
    assert float(g(2.0).data) == 5.0


class Config:
    def __init__(self, **values):
        self._d = dict(values)

    def __getattr__(self, name):  # a missing name: None
        return self._d.get(name)


def test_config_with_permissive_getattr_is_not_an_array():
    """is_array_api_obj asks hasattr(CFG, "__array_namespace__"), which such a config
    answers (None): it was taken for an array, and recording raised a raw TypeError."""
    cfg = Config(scale=2.0)

    def f(x): return x * cfg.scale

    assert float(mg.trace(f)(3.0).data) == 6.0
    assert float(mg.grad(f, mode="graph")(3.0).data) == 2.0
    x = mg.tensor(3.0, requires_grad=True)
    mg.checkpoint(f)(x).backward()
    assert float(x.grad.data) == 2.0


# --- an object's class (bug 5) --------------------------------------------------------

class Slow:
    k = 1.0


class Fast:
    k = 5.0


class Base:
    k = 1.0


class Sub(Base):
    pass


class Other:
    k = 5.0


OBJ, SUB = Slow(), Sub()


def f_class(x): return x * OBJ.k
def f_bases(x): return x * SUB.k


@pytest.mark.parametrize("case", ["__class__", "__bases__"])
def test_class_swapped_is_seen(case):
    """obj.__class__ = Fast and Sub.__bases__ = (Other,) make another class's k the one
    read; the programs kept the old class's."""
    f, change = {"__class__": (f_class, lambda: setattr(OBJ, "__class__", Fast)),
                 "__bases__": (f_bases, lambda: setattr(Sub, "__bases__", (Other,)))}[case]
    made = compiled(f)
    assert_scale(made, 1.0)
    change()
    assert_scale(made, 5.0)


class _Config:
    lr = 2.0


_CFG = _Config()


def _by_getattr(x):
    return mg.sum(x * getattr(_CFG, "lr", 1.0))


def _by_hasattr(x):
    return mg.sum(x * (_CFG.lr if hasattr(_CFG, "lr") else 1.0))


@pytest.mark.parametrize("f", [_by_getattr, _by_hasattr])
def test_a_class_attribute_read_by_name_at_run_time_is_watched(f):
    """getattr(cfg, "lr") (and hasattr) made every attribute of cfg's own dict a read,
    but none of its class's: after ``Config.lr = 3.0`` the program kept 2.0. Oracle:
    the closed form d/dx sum(x * lr) = lr."""
    g = mg.grad(f, mode="graph")
    try:
        assert g(mg.tensor([1.0, 2.0])).tolist() == [2.0, 2.0]
        _Config.lr = 3.0
        assert g(mg.tensor([1.0, 2.0])).tolist() == [3.0, 3.0]
    finally:
        _Config.lr = 2.0
