"""A compiled program (graph mode, source mode, mg.trace, mg.checkpoint) is not reused
once what it computed from has changed: each test changes one thing f reads from
outside its arguments after the first call, and the next call must give the new answer
(or a clear error). Oracles: closed forms (for f = s * x the gradient is s)."""

from __future__ import annotations

import array
import collections
import functools

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import MinigraphError

X = 1.5
COMPILED = ("graph", "source", "trace")


def _after(f, mode, change, x=X):
    """f's gradient (or, for mg.trace, its value) by a program built before ``change()``,
    called after it."""
    if mode == "checkpoint":
        c = mg.checkpoint(f)

        def grad():
            xx = mg.tensor(x, requires_grad=True)
            c(xx).backward()
            return float(xx.grad.item())
        grad()
        change()
        return grad()
    g = mg.trace(f) if mode == "trace" else mg.grad(f, mode=mode)
    g(x)
    change()
    return float(g(x).item()) if mode == "trace" else float(g(x))


def _expected(mode, s, x=X):
    """The closed form for f(x) = s * x: its value under mg.trace, else its gradient."""
    return s * x if mode == "trace" else s


# -- 1. a captured tensor's array written in place ---------------------------------------

W = mg.tensor([2.0, -1.0])


def reads_w(x):
    return (x * W).sum()


@pytest.mark.parametrize("mode", COMPILED)
def test_a_tensor_written_through_its_data_is_seen(mode):
    """``W.data -= 3.0`` (PyTorch's ``p.data -= lr * g``) keeps W's array object and
    passes no write stamp: the program went on with the old W."""
    W.data[...] = [2.0, -1.0]
    x = np.array([1.5, 0.5])
    g = mg.trace(reads_w) if mode == "trace" else mg.grad(reads_w, mode=mode)
    g(mg.tensor(x))
    W.data -= 3.0
    expected = (x * W.data).sum() if mode == "trace" else W.data
    np.testing.assert_allclose(g(mg.tensor(x)).numpy(), expected)


def test_a_layer_weight_written_through_its_data_is_seen_under_no_grad():
    """The classic update ``layer.weight.data -= ...`` between evaluation calls of a
    graph-mode gradient (under no_grad the program runs, not the tape)."""
    layer = mg.nn.Linear(2, 1)

    def loss(inputs):
        return (layer(inputs) ** 2).sum()
    g = mg.grad(loss, mode="graph")
    inputs = mg.tensor([[1.0, 2.0]])
    with mg.no_grad():
        g(inputs)
        layer.weight.data -= 1.0
        got = g(inputs).numpy()
    w, b = layer.weight.data, layer.bias.data
    out = inputs.numpy() @ w.T + b
    np.testing.assert_allclose(got, 2 * out @ w)  # d/dX sum((X W^T + b)^2)


# -- 2. a global bound again to an equal value -------------------------------------------

SCALE = 2.0


def scaled(x):
    return mg.sin(x) * SCALE


def test_an_equal_float_bound_again_does_not_rebuild_the_program():
    """``SCALE = float(cfg["scale"])`` on every step made a new float object, and the
    identity test recompiled on every call (21 recordings for 21 calls)."""
    global SCALE
    t, g = mg.trace(scaled), mg.grad(scaled, mode="source")
    t(0.5), g(0.5)
    for _ in range(5):
        SCALE = float("2.0")
        assert float(t(0.5).item()) == pytest.approx(2.0 * np.sin(0.5))
    g(0.5)
    assert t.recordings == 1 and g.transforms == 1
    SCALE = -0.0  # (another constant, as the signature keys floats: by their bits)
    assert np.signbit(float(t(0.5).item())) and t.recordings == 2
    SCALE = 2.0


# -- 3. the code replaced ----------------------------------------------------------------

def squared(x):
    return x * x


def cubed(x):
    return x * x * x


@pytest.mark.parametrize("mode", COMPILED + ("checkpoint",))
def test_a_function_whose_code_is_replaced_is_compiled_again(mode):
    """``f.__code__ = g.__code__`` (a notebook's cell run again, a reload): the cache,
    keyed by the function object, replayed the old code's program."""
    def f(x):
        return x * x
    f.__code__ = squared.__code__
    got = _after(f, mode, lambda: setattr(f, "__code__", cubed.__code__))
    assert got == pytest.approx(X ** 3 if mode == "trace" else 3 * X * X)


# -- 4. a decorator's wrapper ------------------------------------------------------------

FACTOR = 2.0


def times_factor(fn):
    @functools.wraps(fn)
    def wrapper(x):
        return fn(x) * FACTOR
    return wrapper


@times_factor
def decorated(x):
    return x * 1.0


def _set_factor():
    global FACTOR
    FACTOR = 5.0


@pytest.mark.parametrize("mode", ("graph", "trace", "checkpoint"))
def test_a_wrapper_s_own_globals_are_watched(mode):
    """``functools.wraps`` wrappers: only the wrapped function's reads were watched, not
    the wrapper's own global FACTOR."""
    global FACTOR
    FACTOR = 2.0
    assert _after(decorated, mode, _set_factor) == pytest.approx(_expected(mode, 5.0))


# -- 5. static and class methods, callable objects, partials, transformed objects ---------

K = 2.0


class Helper:
    factor = 2.0

    @staticmethod
    def static(x):
        return x * K

    @classmethod
    def scaled(cls, x):
        return x * cls.factor


HELPER = Helper()


class Scaler:
    def __init__(self, s):
        self.s = s

    def __call__(self, x):
        return x * self.s


MODEL = Scaler(2.0)


def times_k(x, p):
    return x * K * p


TIMES_K = functools.partial(times_k, p=1.0)


def via_static(x):
    return Helper.static(x) * 1.0


def via_instance_static(x):
    return HELPER.static(x) * 1.0


def via_classmethod(x):
    return Helper.scaled(x) * 1.0


def via_object(x):
    return MODEL(x) * 1.0


def via_partial(x):
    return TIMES_K(x) * 1.0


def _set_k():
    global K
    K = 5.0


@pytest.mark.parametrize("mode", COMPILED)
@pytest.mark.parametrize("f, change", [
    (via_static, _set_k), (via_instance_static, _set_k), (via_partial, _set_k),
    (via_classmethod, lambda: setattr(Helper, "factor", 5.0)),
    (via_object, lambda: setattr(MODEL, "s", 5.0))])
def test_what_a_called_object_reads_is_watched(f, change, mode):
    """A static or class method, a callable object and a global partial were not
    followed: what they read (K, cls.factor, self.s) was not watched."""
    global K
    K, Helper.factor, MODEL.s = 2.0, 2.0, 2.0
    if mode == "source" and f in (via_object, via_partial):
        pytest.skip("source mode refuses to call an object or a partial")
    assert _after(f, mode, change) == pytest.approx(_expected(mode, 5.0))


S = 2.0
INNER = None


def calls_inner(x):
    return INNER(x) * 3.0


def s_sin(x):
    return mg.sin(x) * S


@pytest.mark.parametrize("outer", ("graph", "source", "trace"))
@pytest.mark.parametrize("inner", ("source", "trace"))
def test_a_transformed_function_called_inside_is_followed(inner, outer):
    """f calls ``mg.grad(g, mode="source")`` or ``mg.trace(g)`` (objects, not
    functions): what g reads (S) was not watched by f's program."""
    global S, INNER
    S = 2.0
    INNER = mg.grad(s_sin, mode="source") if inner == "source" else mg.trace(s_sin)

    def change():
        global S
        S = 5.0
    got = _after(calls_inner, outer, change, x=0.5)
    if inner == "source":  # INNER = S cos x
        expected = 3 * 5.0 * np.cos(0.5) if outer == "trace" else -3 * 5.0 * np.sin(0.5)
    else:  # INNER = S sin x
        expected = 3 * 5.0 * np.sin(0.5) if outer == "trace" else 3 * 5.0 * np.cos(0.5)
    assert got == pytest.approx(expected)


# -- 6. a builtin shadowed later ---------------------------------------------------------

def triple(v):
    return v * 3.0


def uses_abs(x):
    return abs(x) * x


@pytest.mark.parametrize("mode", COMPILED + ("checkpoint",))
def test_a_builtin_shadowed_by_a_later_global_is_seen(mode):
    """``abs = triple`` defined after the program was built: a name absent from the
    globals (a builtin) was not watched."""
    def change():
        globals()["abs"] = triple
    try:
        got = _after(uses_abs, mode, change, x=2.0)
    finally:
        globals().pop("abs", None)
    assert got == pytest.approx(3 * 2.0 * 2.0 if mode == "trace" else 6 * 2.0)


# -- 7. the grad mode --------------------------------------------------------------------

def mode_dependent(x):
    return x * 2.0 if mg.is_grad_enabled() else x * 3.0


def test_mg_trace_runs_f_in_its_caller_s_grad_mode():
    """mg.trace recorded f with grad enabled and replayed that program under no_grad,
    where eager f takes the other branch."""
    t = mg.trace(mode_dependent)
    assert float(t(1.0).item()) == 2.0
    with mg.no_grad():
        assert float(t(1.0).item()) == 3.0
        # (an outer no_grad does not stop a transformation: its values still differentiate)
        assert float(mg.grad(mg.trace(squared))(3.0)) == 6.0
    assert float(t(1.0).item()) == 2.0


# -- 8. where the value f reads lives ----------------------------------------------------

class Base:
    k = 2.0


class Sub(Base):
    pass


SUB = Sub()


def reads_sub_class(x):
    return x * Sub.k


def reads_sub_object(x):
    return x * SUB.k


class Dynamic:
    def __init__(self):
        self._s = 2.0

    def __getattr__(self, name):
        if name == "scale":
            return self._s
        raise AttributeError(name)


DYNAMIC = Dynamic()


def reads_dynamic(x):
    return x * DYNAMIC.scale


AS_SET = {2.0}
AS_DEQUE = collections.deque([2.0])
AS_ARRAY = array.array("d", [2.0])


def reads_set(x):
    return x * sum(AS_SET)


def reads_deque(x):
    return x * AS_DEQUE[0]


def reads_array(x):
    return x * AS_ARRAY[0]


def _reset_places():
    if "k" in Sub.__dict__:
        del Sub.k
    DYNAMIC._s = 2.0
    AS_SET.clear()
    AS_SET.add(2.0)
    AS_DEQUE[0] = AS_ARRAY[0] = 2.0


@pytest.mark.parametrize("mode", COMPILED)
@pytest.mark.parametrize("f, change", [
    (reads_sub_class, lambda: setattr(Sub, "k", 5.0)),
    (reads_sub_object, lambda: setattr(Sub, "k", 5.0)),
    (reads_dynamic, lambda: setattr(DYNAMIC, "_s", 5.0)),
    (reads_set, lambda: AS_SET.add(3.0)),
    (reads_deque, lambda: AS_DEQUE.__setitem__(0, 5.0)),
    (reads_array, lambda: AS_ARRAY.__setitem__(0, 5.0))])
def test_a_value_set_where_python_now_finds_it_is_seen(f, change, mode):
    """``Sub.k = 5.0`` over ``Base.k``; an attribute ``__getattr__`` computes; the items
    of a set, a deque, an array.array: none of them was watched."""
    _reset_places()
    try:
        assert _after(f, mode, change) == pytest.approx(_expected(mode, 5.0))
    finally:
        _reset_places()


BIG = [[2.0] for _ in range(20_000)]


def reads_big(x):
    return x * BIG[15_000][0]


@pytest.mark.parametrize("mode", COMPILED)
def test_a_structure_too_large_to_watch_is_refused(mode):
    """Past 10,000 objects the rest of a structure went unwatched: a write into
    BIG[15000] was not seen. Now the program is refused, naming what f reads."""
    g = mg.trace(reads_big) if mode == "trace" else mg.grad(reads_big, mode=mode)
    with pytest.raises(MinigraphError, match="reads BIG from outside its arguments"):
        g(X)


STATE = {"calls": 0, "scale": 2.0}


def counts_its_calls(x):
    STATE["calls"] += 1  # (f's own record of its runs: not watched)
    return x * STATE["scale"]


@pytest.mark.parametrize("mode", ("graph", "trace", "checkpoint"))
def test_a_container_f_writes_is_still_watched_where_f_does_not_write(mode):
    """A dict f both writes (a counter) and reads (a setting) was not watched at all:
    ``STATE["scale"] = 5.0`` was not seen."""
    STATE["scale"] = 2.0
    got = _after(counts_its_calls, mode, lambda: STATE.__setitem__("scale", 5.0))
    assert got == pytest.approx(_expected(mode, 5.0))


# -- 9. static arguments and a partial's arguments ---------------------------------------

class Config:
    pass


class Slotted:
    __slots__ = ("scale",)


def scales_0(x, c):
    return x * c.scales[0]


def weight_0(x, c):
    return x * c.w[0]


def slot_scale(x, c):
    return x * c.scale


def inner_scale(x, c):
    return x * c.inner.scale


def _with(**attributes):
    c = Config()
    c.__dict__.update(attributes)
    return c


def _slotted():
    c = Slotted()
    c.scale = 2.0
    return c


def _replace_inner(c):
    c.inner = None  # (the old object freed: its id may be the new one's)
    c.inner = _with(scale=5.0)


@pytest.mark.parametrize("mode", COMPILED)
@pytest.mark.parametrize("f, make, change", [
    (scales_0, lambda: _with(scales=[2.0]), lambda c: c.scales.__setitem__(0, 5.0)),
    (weight_0, lambda: _with(w=np.array([2.0])), lambda c: c.w.__setitem__(0, 5.0)),
    (slot_scale, _slotted, lambda c: setattr(c, "scale", 5.0)),
    (inner_scale, lambda: _with(inner=_with(scale=2.0)), _replace_inner)])
def test_what_a_static_argument_holds_is_part_of_its_key(f, make, change, mode):
    """An object argument was keyed by the ids of what it holds (not held: an id may be
    reused) and a __slots__ object by identity alone: contents written in place were not
    seen."""
    c = make()
    g = mg.trace(f) if mode == "trace" else mg.grad(f, mode=mode)
    g(X, c)
    change(c)
    got = float(g(X, c).item()) if mode == "trace" else float(g(X, c))
    assert got == pytest.approx(_expected(mode, 5.0))


def times_first(x, s):
    return x * s[0]


def times_k_of(x, s):
    return x * s.k


@pytest.mark.parametrize("mode", ("graph", "trace", "checkpoint"))
@pytest.mark.parametrize("kind", ("list", "object", "object passed on"))
def test_what_a_partial_s_arguments_hold_is_watched(kind, mode):
    """``functools.partial(f, s=[2.0])``: the argument was watched for rebinding only,
    not what it holds."""
    if kind == "list":
        held = [2.0]
        p = functools.partial(times_first, s=held)
        change = lambda: held.__setitem__(0, 5.0)  # noqa: E731
    elif kind == "object":
        held = _with(k=2.0)
        p = functools.partial(times_k_of, s=held)
        change = lambda: setattr(held, "k", 5.0)  # noqa: E731
    else:  # (passed on to code that names its attribute: not the partial's function)
        held = _with(k=2.0)
        p = functools.partial(lambda s, x: times_k_of(x, s), held)
        change = lambda: setattr(held, "k", 5.0)  # noqa: E731
    assert _after(p, mode, change) == pytest.approx(_expected(mode, 5.0))


# -- containers of other kinds, and a large structure of numbers -----------------------------

import array as _array  # noqa: E402
import collections as _collections  # noqa: E402

USER_DICT = _collections.UserDict(scale=2.0)
CHAIN = _collections.ChainMap({"scale": 2.0})
USER_LIST = _collections.UserList([2.0])


def _reads_a_user_dict(x):
    return x * USER_DICT["scale"]


def _reads_a_chain_map(x):
    return x * CHAIN["scale"]


def _reads_a_user_list(x):
    return x * USER_LIST[0]


@pytest.mark.parametrize("f, change", [
    (_reads_a_user_dict, lambda: USER_DICT.__setitem__("scale", 5.0)),
    (_reads_a_chain_map, lambda: CHAIN.__setitem__("scale", 5.0)),
    (_reads_a_user_list, lambda: USER_LIST.__setitem__(0, 5.0))])
def test_a_global_mapping_or_sequence_of_any_kind_changed_in_place_is_seen(f, change):
    """Only list, tuple, dict, set, deque and array.array were watched: a UserDict,
    ChainMap or UserList changed in place kept the old program (d(s x)/dx = s)."""
    g, t = mg.grad(f, mode="graph"), mg.trace(f)
    assert g(3.0).item() == 2.0 and t(3.0).item() == 6.0
    change()
    try:
        assert g(3.0).item() == 5.0 and t(3.0).item() == 15.0
    finally:
        USER_DICT["scale"] = CHAIN["scale"] = 2.0
        USER_LIST[0] = 2.0


class _Config:
    def __init__(self, ks):
        self.ks = ks


def _scaled_by_a_static_argument(x, cfg):
    return mg.sum(x * cfg.ks[0])


@pytest.mark.parametrize("make", [lambda: _array.array("d", [2.0]),
                                  lambda: _collections.UserList([2.0]),
                                  lambda: bytearray([2])])
def test_a_static_argument_holding_another_sequence_is_keyed_by_its_items(make):
    """A constant argument holding an array.array, a bytearray or a UserList was keyed
    by identity: cfg.ks[0] = 5 reused the program built for 2."""
    cfg = _Config(make())
    g = mg.grad(_scaled_by_a_static_argument, mode="graph")
    x = mg.tensor([1.0, 1.0])
    np.testing.assert_array_equal(g(x, cfg).numpy(), [2.0, 2.0])
    cfg.ks[0] = 5
    np.testing.assert_array_equal(g(x, cfg).numpy(), [5.0, 5.0])


PAIRS = [(i, float(i)) for i in range(20_000)]


def _reads_pairs(x):
    return x * PAIRS[3][1]


def test_a_large_structure_of_tuples_of_numbers_is_watched_not_refused():
    """20,000 tuples of numbers counted towards the 10,000 objects looked inside, and f
    was refused; a tuple of numbers cannot change, its list's items see it replaced."""
    g = mg.grad(_reads_pairs, mode="graph")
    assert g(2.0).item() == 3.0
    PAIRS[3] = (3, 5.0)
    try:
        assert g(2.0).item() == 5.0
    finally:
        PAIRS[3] = (3, 3.0)


class _LazyRows(_collections.abc.Sequence):
    """A dataset whose rows load on demand, and raise until they are there."""
    scale = 3.0

    def __len__(self):
        return 1_000_000

    def __getitem__(self, k):
        raise RuntimeError(f"row {k} is not loaded yet")


ROWS = _LazyRows()


def _reads_a_lazy_sequence(x):
    return x * ROWS.scale


def test_a_users_lazy_sequence_is_not_read_item_by_item():
    """Every Sequence and Mapping was watched item by item for a while: a lazy dataset's
    rows were loaded (or raised) on every call. Only containers that store their items
    are; d(3x)/dx = 3."""
    assert mg.grad(_reads_a_lazy_sequence, mode="graph")(2.0).item() == 3.0
    assert mg.trace(_reads_a_lazy_sequence)(2.0).item() == 6.0
