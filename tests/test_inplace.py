"""In-place updates (``x -= y``) and the tape's write guard (autodiff/tape.py).

Oracles: NumPy's own in-place operators, closed-form derivatives, the other AD modes
(which never write in place), and the identity of the array object for "in place".
"""

from __future__ import annotations

import gc
import operator
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigraph as mg
from minigraph.autodiff import tape
from minigraph.errors import DeviceError, DTypeError, GradientError, ShapeError
from minigraph.ops import operators

rng = np.random.default_rng(7)


def test_update_writes_into_the_same_array(backend):
    p0, g0 = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    p, g = mg.tensor(p0), mg.tensor(g0)
    before = p.data
    with mg.no_grad():
        p -= 0.1 * g
    assert p.data is before
    np.testing.assert_allclose(p.numpy(), p0 - 0.1 * g0, rtol=1e-15)


def test_the_plain_training_loop_updates_the_model_parameters():
    """The loop of d2l's ``sgd`` and of PyTorch tutorials: the loop variable is the
    parameter itself, so it must be written, not rebound."""
    model = mg.nn.Linear(4, 2, seed=0)
    x, labels = mg.tensor(rng.normal(size=(8, 4))), mg.tensor(rng.integers(0, 2, 8))
    params = list(model.parameters())
    arrays = [p.data for p in params]
    losses = []
    for _ in range(20):
        loss = mg.cross_entropy(model(x), labels)
        for p in params:
            p.grad = None
        loss.backward()
        with mg.no_grad():
            for p in params:
                p -= 0.5 * p.grad
        losses.append(loss.item())
    assert all(p.data is a for p, a in zip(model.parameters(), arrays))
    assert losses[-1] < 0.7 * losses[0]


def test_a_written_view_writes_its_base():
    x = mg.tensor(np.zeros(6))
    row = x.reshape(2, 3)[1]
    with mg.no_grad():
        row += 1.0
    np.testing.assert_array_equal(x.numpy(), [0, 0, 0, 1, 1, 1])


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["+=", "-=", "*=", "/="]),
                              st.booleans(), st.floats(0.5, 2.0)), min_size=1, max_size=6))
def test_a_sequence_of_updates_matches_numpy(ops):
    write = {"+=": operator.iadd, "-=": operator.isub, "*=": operator.imul,
             "/=": operator.itruediv}
    start, other = rng.normal(size=(2, 3)), rng.uniform(0.5, 2.0, size=(3,))
    want, t, o = start.copy(), mg.tensor(start), mg.tensor(other)
    array = t.data
    for op, with_tensor, number in ops:
        want = write[op](want, other if with_tensor else number)
        t = write[op](t, o if with_tensor else number)
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-14)
    assert t.data is array


# -- while recording: a new tensor, so every mode agrees ------------------------------------------

def augmented(x):
    y = x * x
    y += x          # y = x^2 + x
    y *= 2.0        # y = 2x^2 + 2x
    return y.sum()


def updates_its_argument(x):
    x *= 3.0        # the argument itself: recorded too, in the tape mode
    x += 1.0
    return (x * x).sum()  # sum((3x + 1)^2)


@pytest.mark.parametrize("mode", mg.MODES)
def test_augmented_assignment_differentiates_alike_in_every_mode(mode):
    x = rng.normal(size=4)
    np.testing.assert_allclose(mg.grad(augmented, mode=mode)(x).numpy(), 4 * x + 2,
                               rtol=1e-13)
    np.testing.assert_allclose(mg.grad(updates_its_argument, mode=mode)(x).numpy(),
                               6 * (3 * x + 1), rtol=1e-13)


def widens(x, y):
    v = x * 0.5
    v *= y          # float32 *= float64: NumPy would cast down, minigraph refuses
    return v.sum()


def grows(x, y):
    v = x * 0.5
    v += y          # (3,) += (2, 3): the result would not fit v
    return v.sum()


def scales_a_constant(x, y):
    v = mg.tensor(np.ones(3))  # not recorded: its array takes x's values only if it can
    v *= y          # a recorded y: v is rebound to v * y, as in every transformation
    return (v * x).sum()


@pytest.mark.parametrize("mode", mg.MODES)
@pytest.mark.parametrize("argnums", [0, 1, (0, 1)])
def test_an_update_keeps_shape_and_dtype_in_every_mode_as_without_recording(mode, argnums):
    """Without recording, ``v32 *= y64`` and ``v += wider`` are refused (an update in
    place keeps the tensor's shape and dtype). Recorded, the update binds ``v * y`` to the
    name, and used to give float64 and (2, 3) in tape, forward and graph mode and source
    mode alike, whichever argument was recorded; the tape crashed with "dtype object" on a
    plain tensor updated with a recorded value."""
    x32, y64 = np.array([1.0, 2.0, 3.0], dtype=np.float32), np.array([1.0, 2.0, 3.0])
    with pytest.raises(DTypeError, match="float64; an in-place update keeps the tensor's "
                                         "dtype float32"):
        widens(mg.tensor(x32), mg.tensor(y64))
    with pytest.raises(DTypeError, match="mul in place .*float32.*keeps the tensor's dtype"):
        mg.grad(widens, argnums=argnums, mode=mode)(mg.tensor(x32), mg.tensor(y64))
    with pytest.raises(ShapeError, match=r"has shape \(2, 3\); an in-place update keeps "):
        mg.grad(grows, argnums=argnums, mode=mode)(mg.tensor(np.ones(3)),
                                                   mg.tensor(np.ones((2, 3))))
    x, y = np.array([1.0, -2.0, 0.5]), np.array([3.0, 0.25, -1.0])
    g = mg.grad(scales_a_constant, argnums=(0, 1), mode=mode)(x, y)
    np.testing.assert_allclose([g[0].numpy(), g[1].numpy()], [y, x], rtol=1e-15)


def test_a_graph_node_of_unknown_shape_is_updated_as_its_rules_allow():
    """A placeholder of any shape: the check waits for the run, as every shape rule does
    on such a node; a known float32 node updated with a float64 one is refused at once."""
    with mg.Graph() as g:
        x = mg.placeholder(shape=None)
        y = x * 2.0
        y += x
        z = mg.placeholder(shape=(3,), dtype="float32")
        w = z * 1.0
        with pytest.raises(DTypeError, match=r"add in place \(a graph node of shape \(3,\) "
                                             r"float32, and a value of shape \(3,\) float64"):
            w += mg.placeholder(shape=(3,))
    np.testing.assert_array_equal(mg.Session(g).run(y, {x: np.ones(2)}), [3.0, 3.0])


def test_updating_a_parameter_while_recording_is_refused():
    """Rebinding would leave the parameter as it was: the loop would silently not train."""
    p = mg.tensor(np.array([1.0, 2.0]), requires_grad=True)
    (p * p).sum().backward()
    with pytest.raises(GradientError, match=r"sub in place .*leaf .*mg\.no_grad\(\).*"
                                            r"write p = p - \(0\.1 \* p\.grad\)"):
        p -= 0.1 * p.grad
    np.testing.assert_array_equal(p.numpy(), [1.0, 2.0])
    with mg.no_grad():
        p -= 0.1 * p.grad
    np.testing.assert_allclose(p.numpy(), [0.8, 1.6])


def test_while_recording_an_update_of_a_recorded_tensor_makes_a_new_tensor():
    x = mg.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x * 3.0
    before = id(y)  # (the old tensor stays alive: the new one's tape entry reads it)
    y += 1.0
    assert id(y) != before and y.numpy().tolist() == [4.0, 7.0]
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def aliased(x):
    a = x * 1.0
    b = a       # one tensor, two names: without recording, b *= 2.0 doubles a too
    b *= 2.0
    return (a + b).sum()


def aliased_argument(x):
    h = x       # the caller's tensor: without recording, h += 1.0 writes into it
    h += 1.0
    return (h * x).sum()


def two_targets(x):
    a = b = x * 2.0
    a += 1.0
    return (a * b).sum()


def copied_first(x):
    a = x * 1.0
    b = a * 1.0  # a new tensor (source mode writes it as a, one variable: still apart)
    b *= 2.0
    return (a + b).sum()


def updates_a_view(x):
    y = x * 1.0
    v = y[:1]   # a view: without recording, v *= 3.0 writes into y
    v *= 3.0
    return (y * y).sum()


def updates_what_a_view_shows(x):
    y = x * 1.0
    v = mg.reshape(y, (2, 1))  # a view: without recording, y += 1.0 shows through v
    y += 1.0
    return (v * v).sum()


@pytest.mark.parametrize("mode", mg.MODES)
@pytest.mark.parametrize("f", [aliased, aliased_argument, two_targets, updates_a_view,
                               updates_what_a_view_shows])
def test_an_update_that_another_name_would_miss_is_refused_in_every_mode(mode, f):
    """An update while recording, or on a transformation's value, binds a new value to
    one name; where the function names the old value twice, the other name would keep
    it, while without recording the write shows through both: eager mode's (a + b) is
    4x, a recorded one would be 3x. Refused, naming the two names, in every mode."""
    x = np.array([1.0, 2.0])
    error = mg.SourceTransformError if mode == "source" else GradientError
    with pytest.raises(error, match=r"(hold the same value|holds? too)"):
        mg.grad(f, mode=mode)(x)
    if f is aliased:
        assert f(mg.tensor(x)).item() == 12.0  # without recording: a and b both doubled
        with pytest.raises(GradientError, match="a and b hold the same value"):
            f(mg.tensor(x, requires_grad=True))


def held_by_a_list(x):
    hs = [x * 2.0]
    h = hs[0]
    h += 1.0
    return (hs[0] * h).sum()


def appended_to_a_list(x):
    hs = []
    h = x * 2.0
    hs.append(h)
    h += 1.0
    return (hs[0] * h).sum()


def held_by_a_dict(x):
    h = x * 2.0
    d = {"h": h}
    h += 1.0
    return (d["h"] * h).sum()


class Holder:
    pass


def held_by_an_attribute(x):
    o = Holder()
    h = x * 2.0
    o.h = h
    h += 1.0
    return (o.h * h).sum()


def a_loop_over_a_list(x):
    hs = [x * 2.0, x * 3.0]
    for h in hs:
        h += 1.0
    return (hs[0] * hs[1]).sum()


def a_view_in_a_list(x):
    y = x * 1.0
    vs = [y[:1]]
    y += 1.0
    return (vs[0] * y[:1]).sum()


def appends_copies(x):
    hs = []
    h = x * 2.0
    for _ in range(3):
        hs.append(h + 0.0)  # a new value each time: h's updates are its own
        h += 1.0
    return (hs[0] * hs[2] * h).sum()


def add_one(h):
    h += 1.0  # without recording: a write into the caller's value
    return h


def updated_by_a_callee(x):
    h = x * 2.0
    h2 = add_one(h)
    return (h * h2).sum()


def a_list_item_updated_by_a_callee(x):
    hs = [x * 2.0]
    h2 = add_one(hs[0])
    return (hs[0] * h2).sum()


def read_again_after_a_callee_updated_it(x):
    h = x * 2.0
    h = add_one(h) + h  # h is read again after the update: eager mode reads the write
    return (h * h).sum()


def updates_through_a_helper(h):
    add_one(h)  # writes into h, which this function then returns
    return h


def rebound_to_what_a_helper_returns(x):
    h = x * 2.0
    h = updates_through_a_helper(h)  # (this h is rebound; the helper's is not)
    return (h * h).sum()


def a_new_value_updated_by_a_callee(x):
    h2 = add_one(x * 2.0)  # nobody else holds it: the update is the callee's own
    return (h2 * h2).sum()


HELD = {held_by_a_list: ("h and hs[0]", 20.0), appended_to_a_list: ("h and hs[0]", 20.0),
        held_by_a_dict: ("d['h'] and h", 20.0), held_by_an_attribute: ("h and o.h", 20.0),
        a_loop_over_a_list: ("h and hs[0]", 27.0), a_view_in_a_list: ("vs[0] and y", 2.25),
        updated_by_a_callee: ("h and h (in updated_by_a_callee, a caller)", 20.0),
        a_list_item_updated_by_a_callee:
            ("h and hs[0] (in a_list_item_updated_by_a_callee, a caller)", 20.0),
        read_again_after_a_callee_updated_it:
            ("h and h (in read_again_after_a_callee_updated_it, a caller)", 80.0),
        rebound_to_what_a_helper_returns:
            ("h and h (in updates_through_a_helper, a caller)", 20.0)}


@pytest.mark.parametrize("mode", [*mg.MODES, "recorded", "vmap"])
@pytest.mark.parametrize("f", list(HELD), ids=lambda f: f.__name__)
def test_an_update_that_a_list_dict_or_attribute_would_miss_is_refused(f, mode):
    """The value is held one level down: by a list, a dict or an attribute, or a list's
    item is the loop variable; or the caller holds it (a function that updates its
    argument). Without recording the write shows through (the oracle: eager mode, NumPy's
    semantics); a recorded update would leave the held value as it was, and gave 14.0
    for 20.0 in every mode. Refused, naming both places; source mode refuses the lists'
    and the callers' cases by origin, and the others by what it cannot read (a dict
    display, an attribute assignment, list.append, a loop over a list)."""
    places, eager = HELD[f]
    assert f(mg.tensor(np.array([0.5, 1.5]))).item() == pytest.approx(eager)
    x = np.array([0.5, 1.5])
    if mode == "source":
        by_origin = f in (held_by_a_list, a_view_in_a_list, updated_by_a_callee,
                          a_list_item_updated_by_a_callee, read_again_after_a_callee_updated_it,
                          rebound_to_what_a_helper_returns)
        with pytest.raises(mg.SourceTransformError, match=r"holds? too" if by_origin else None):
            mg.grad(f, mode=mode)(x)
        return
    with pytest.raises(GradientError, match=re.escape(places) + " hold the same value"):
        if mode == "recorded":
            f(mg.tensor(x, requires_grad=True))
        elif mode == "vmap":
            mg.vmap(f)(np.stack([x, x]))
        else:
            mg.grad(f, mode=mode)(x)


def add_both(h, c):
    h += c
    c *= 0.5
    return h, c


def rebound_to_its_callees_updates(x):
    h, c = x * 2.0, x * 3.0
    for _ in range(3):
        h = add_one(h)  # h holds the result next: nobody sees the value add_one wrote
    h, c = add_both(h, c)
    return (h * c).sum()


@pytest.mark.parametrize("mode", [*mg.MODES, "recorded", "vmap"])
def test_a_name_rebound_to_the_result_of_the_call_that_updates_it_is_not_a_holder(mode):
    """``h = add_one(h)``, where add_one writes into its argument: the caller's h was
    counted as a second holder of the value and the update refused in every mode,
    though h holds the call's result once it returns, in eager mode as here. (Read again
    in the same statement, or returned by a helper that does not rebind it, it still
    counts: HELD above.) The oracle: PyTorch, on h = 2x + 3 + 3x and c = 1.5x."""
    torch = pytest.importorskip("torch")
    xt = torch.tensor([0.5, 1.5], dtype=torch.float64, requires_grad=True)
    ((xt * 2.0 + 3.0 + xt * 3.0) * (xt * 1.5)).sum().backward()
    x = np.array([0.5, 1.5])
    assert rebound_to_its_callees_updates(mg.tensor(x)).item() == pytest.approx(
        ((5 * x + 3) * 1.5 * x).sum(), rel=1e-15)  # eager mode, no recording
    if mode == "recorded":
        t = mg.tensor(x, requires_grad=True)
        rebound_to_its_callees_updates(t).backward()
        got = t.grad
    elif mode == "vmap":
        got = mg.vmap(mg.grad(rebound_to_its_callees_updates))(np.stack([x, x]))[0]
    else:
        got = mg.grad(rebound_to_its_callees_updates, mode=mode)(x)
    np.testing.assert_allclose(got.numpy(), xt.grad.numpy(), rtol=1e-15)


def test_ipythons_record_of_results_is_not_an_alias():
    """At a notebook's top level, ``_`` and ``Out[3]`` hold what a cell displayed; the
    user does not read them back, so they do not make an update refused. A list of the
    user's own does."""
    h = mg.tensor([1.0], requires_grad=True) * 2.0
    scope = {"mg": mg, "h": h, "_": h, "_3": h, "Out": {3: h}}
    exec("h += 1.0", scope)  # noqa: S102 - a module's top level, as a notebook cell runs
    assert scope["h"].numpy().tolist() == [3.0] and scope["_"] is h
    scope.update(h=h, kept=[h])
    with pytest.raises(GradientError, match=r"h and kept\[0\] hold the same value"):
        exec("h += 1.0", scope)  # noqa: S102


def chosen_by_a_static_if(x):
    a = x * 2.0
    b = a * 3.0 if False else a  # b is a itself
    a += 1.0
    return (a * b).sum()


def passes_it_through(v):
    return v


def returned_by_a_callee(x):
    a = x * 2.0
    b = passes_it_through(a)  # b is a itself
    a += 1.0
    return (a * b).sum()


def given_back_by_a_method(x):
    a = x * 2.0
    b = a.astype("float64", copy=False)  # the same dtype: b is a itself
    a += 1.0
    return (a * b).sum()


def made_one_by_a_loop(x):
    a = x * 2.0
    b = x * 3.0
    for _ in range(2):
        b *= 0.5  # from the second iteration on, b is a
        b = a
    return (a * b).sum()


def one_on_a_run_time_path(x):
    a = x * 2.0
    if mg.sum(x) > 0.0:
        b = a  # on this path b is a; source mode writes both paths
    else:
        b = a * 0.5
    b += 1.0
    return (a * b).sum()


@pytest.mark.parametrize("f", [chosen_by_a_static_if, returned_by_a_callee, given_back_by_a_method,
                               made_one_by_a_loop, one_on_a_run_time_path],
                         ids=lambda f: f.__name__)
def test_source_mode_follows_the_objects_a_name_may_hold(f):
    """Source mode writes ``b = a if False else a``, ``b = passes_it_through(a)``,
    ``b = a.astype(same dtype, copy=False)``, a loop's ``b = a`` and an if's join as
    variables of their own, so whether b is a's object is tracked apart (origins: the
    set of objects each name may hold). In each case b is a in eager mode, so a += 1
    shows through b; source mode gave another value, silently. Now it refuses, as the
    other modes do (the run-time if: on the path that makes b a)."""
    x = np.array([0.5, 1.5])
    with pytest.raises(mg.SourceTransformError, match=r"holds? too"):
        mg.grad(f, mode="source")(x)
    with pytest.raises(GradientError, match="hold the same value"):
        mg.grad(f)(x)


def two_calls_of_one_helper(x):
    a = passes_it_through(x * 2.0)
    b = passes_it_through(x * 3.0)  # another object, from the same lines
    a += 1.0
    for _ in range(2):
        b = b * 0.5  # a new object each time: never a
        a += 0.5
    return (a * b).sum()


@pytest.mark.parametrize("mode", mg.MODES)
def test_objects_made_apart_stay_apart(mode):
    """(No refusal where no object is shared: d/dx of (2x + 2)(0.75x) = 3x + 1.5.)"""
    x = np.array([0.5, 1.5])
    got = mg.grad(two_calls_of_one_helper, mode=mode)(x).numpy()
    np.testing.assert_allclose(got, 3 * x + 1.5, rtol=1e-13)


@pytest.mark.parametrize("mode", mg.MODES)
def test_a_callee_updating_a_value_nobody_else_holds_is_fine(mode):
    """(d/dx of (2x + 1)^2 = 4(2x + 1))"""
    x = np.array([0.5, 1.5])
    got = mg.grad(a_new_value_updated_by_a_callee, mode=mode)(x).numpy()
    np.testing.assert_allclose(got, 4 * (2 * x + 1), rtol=1e-13)


class Cell:
    def __init__(self):
        self.hidden = []

    def step(self, h):
        self.hidden.append(h)
        h += 1.0  # without recording: self.hidden[-1] sees the write
        return h


def kept_by_a_cell(x):
    cell = Cell()
    h = cell.step(x * 2.0)
    return (cell.hidden[0] * h).sum()


def test_a_list_an_object_keeps_is_read_too():
    """Two levels down where the first is an object's attribute (or a dict's value):
    ``self.hidden.append(h)``, a module that keeps its states."""
    assert kept_by_a_cell(mg.tensor(np.array([0.5, 1.5]))).item() == pytest.approx(20.0)
    for mode in ("tape", "forward", "graph"):
        with pytest.raises(GradientError, match=r"h and self\.hidden\[0\] hold"):
            mg.grad(kept_by_a_cell, mode=mode)(np.array([0.5, 1.5]))


def scaled_twice(x):
    h = x * 2.0
    hs = [h]
    h *= x - 0.5  # the error suggests h = h * (x - 0.5)
    return (hs[0] * h).sum()


def test_the_refusal_writes_the_users_update_as_a_new_value():
    with pytest.raises(GradientError, match=re.escape("Write h = h * (x - 0.5) for a new")):
        mg.grad(scaled_twice)(np.array([0.5, 1.5]))
    with pytest.raises(GradientError, match=re.escape("Write h = h + 1.0 for a new")):
        mg.grad(held_by_a_list)(np.array([0.5, 1.5]))
    with pytest.raises(mg.SourceTransformError,
                       match=re.escape("Write h = h * (x - 0.5) for a new")):
        mg.grad(scaled_twice, mode="source")(np.array([0.5, 1.5]))


KEPT: list = []  # a module's list, which a function appends to


def kept_by_a_global_list(x):
    h = x * 2.0
    KEPT.append(h)
    h += 1.0  # without recording: KEPT[-1] sees the write
    return (KEPT[-1] * h).sum()


@pytest.mark.parametrize("mode", ["tape", "forward", "graph", "recorded"])
def test_a_global_the_function_reads_is_read_too(mode):
    """The module's names that the function's code reads: here a list it appends to
    (14.0 for eager mode's 20.0, silently, before)."""
    x = np.array([0.5, 1.5])
    try:
        assert kept_by_a_global_list(mg.tensor(x)).item() == pytest.approx(20.0)
        KEPT.clear()
        with pytest.raises(GradientError, match=r"KEPT\[0\] \(a global\) and h hold"):
            if mode == "recorded":
                kept_by_a_global_list(mg.tensor(x, requires_grad=True))
            else:
                mg.grad(kept_by_a_global_list, mode=mode)(x)
    finally:
        KEPT.clear()


SCALE = mg.tensor(np.array([1.0, 2.0]))  # a module's tensor, which a function reads


def writes_into_a_global(x):
    h = SCALE  # the module's tensor itself
    h += x  # without recording: SCALE changes
    return (h * SCALE).sum()


def passes_a_global_on(x):
    return (add_x(SCALE, x) * SCALE).sum()


def add_x(h, x):
    h += x
    return h


@pytest.mark.parametrize("f", [writes_into_a_global, passes_a_global_on],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("mode", mg.MODES)
def test_an_update_of_a_global_tensor_is_refused_in_every_mode(mode, f):
    """Source mode reads a global as a constant, so the update made a new value and left
    SCALE as it was: 8.5 for eager mode's 14.5, silently. It now asks the globals and
    closure variables the functions being run read, as the other modes ask theirs."""
    global SCALE
    x = np.array([0.5, 1.5])
    before = SCALE.numpy().copy()  # (numpy() is the tensor's own array, as in PyTorch)
    assert f(mg.tensor(x)).item() == pytest.approx(14.5)  # (eager mode writes into SCALE)
    SCALE = mg.tensor(before)
    error = mg.SourceTransformError if mode == "source" else GradientError
    with pytest.raises(error, match=r"SCALE \((a global|outside the function)\)"):
        mg.grad(f, mode=mode)(x)
    assert SCALE.numpy().tolist() == before.tolist()


HALVED_ONCE = mg.tensor(np.array([0.7, -0.4]))  # a module's tensor


def halves_a_module_tensor(x):
    w = HALVED_ONCE
    w *= 0.5  # a constant tensor and a number: a write into the module's tensor
    return (x * w).sum() + HALVED_ONCE.sum()


@pytest.mark.parametrize("mode", ["graph", "source", "trace"])
def test_a_compiled_program_refuses_a_write_into_a_tensor_read_from_outside(mode):
    """The write happens while the program is built, and the program, which runs no
    Python, would not make it again: a second call gave eager mode's first value, and
    source mode wrote into a copy (W * 0.5 for w, W itself for the sum: eager mode's
    2.3 read 2.45), silently."""
    global HALVED_ONCE
    x = np.array([0.5, 1.5])
    HALVED_ONCE = mg.tensor(np.array([0.7, -0.4]))
    assert mg.grad(halves_a_module_tensor)(x).numpy().tolist() == [0.35, -0.2]  # (tape)
    HALVED_ONCE = mg.tensor(np.array([0.7, -0.4]))
    with pytest.raises(GradientError, match=r"f wrote into HALVED_ONCE, which it reads "
                                            r"from outside its arguments \(a tensor of shape "
                                            r"\(2,\) float64\), in place, .*line \d+.*, while "
                                            r"its program was built"):
        if mode == "trace":
            mg.trace(halves_a_module_tensor)(mg.tensor(x))
        else:
            mg.grad(halves_a_module_tensor, mode=mode)(x)
    # (refused before the write: its array is read-only while f is recorded)
    assert HALVED_ONCE.numpy().tolist() == [0.7, -0.4]


def run_once(f, mode):
    """f transformed by a transformation that runs it to build a program (graph, source,
    trace) or runs it more than once (forward mode, checkpoint)."""
    if mode == "trace":
        return mg.trace(f)
    if mode == "checkpoint":
        return mg.grad(mg.checkpoint(f))
    return mg.grad(f, mode=mode)


@pytest.mark.parametrize("mode", ["graph", "source", "trace", "forward", "checkpoint"])
def test_a_tensor_without_a_read_only_flag_refuses_the_write_before_it_is_made(
        mode, strict_devices):
    """The same on a device whose arrays have no read-only flag (array-api-strict here,
    CuPy on a GPU): the write was logged and refused after f returned, and the tensor
    kept the halved values, where a refusal must leave things as they were. Every write
    into a tensor goes through the tape, which now refuses it before it is made, at the
    user's line, as NumPy's flag does."""
    global HALVED_ONCE
    HALVED_ONCE = mg.tensor([0.7, -0.4])
    assert type(HALVED_ONCE.data) is not np.ndarray  # (the fixture's device)
    x = mg.tensor([0.5, 1.5])
    error = mg.autodiff.checkpoint.CheckpointError if mode == "checkpoint" else GradientError
    with pytest.raises(error, match=r"f wrote into HALVED_ONCE, which it reads from outside "
                                    r"its arguments \(a tensor of shape \(2,\) float64\), in "
                                    r"place, .*line \d+"):
        run_once(halves_a_module_tensor, mode)(x)
    assert [float(v) for v in HALVED_ONCE.data] == [0.7, -0.4]
    HALVED_ONCE *= 1.0  # (writable again once f returned)


TOTAL = mg.sum(mg.tensor([1.0, 1.0]))  # a module's tensor holding a NumPy scalar, 2.0
WEIGHTS = mg.tensor([1.0, 2.0])


def halves_a_module_total(x):
    s = TOTAL
    s *= 0.5  # x.data = x.data * 0.5: a NumPy scalar is replaced, not written into
    return mg.sum(x * s)


class _Holder:
    pass


HOLDER = _Holder()
HOLDER.weight = mg.tensor([1.0, 2.0])
ATTRIBUTE = "weight"


def halves_an_attribute_named_at_run_time(x):
    w = getattr(HOLDER, ATTRIBUTE)  # (the code's text names no attribute)
    w *= 0.5
    return mg.sum(x * w)


def halves_a_module_tensor_through_a_view(x):
    v = WEIGHTS[0:1]
    v *= 0.5  # writes into WEIGHTS's memory
    return mg.sum(x * WEIGHTS)


@pytest.mark.parametrize("mode", ["graph", "source", "trace", "forward", "checkpoint"])
@pytest.mark.parametrize("f", [halves_a_module_total, halves_a_module_tensor_through_a_view,
                               halves_an_attribute_named_at_run_time],
                         ids=lambda f: f.__name__)
def test_a_write_into_a_scalar_tensor_or_through_a_view_is_refused_naming_it(f, mode):
    """A tensor holding a NumPy scalar (the 0-d result of mg.sum) has no read-only flag,
    and a write replaces its scalar: graph and source mode gave 1.0 on every call where
    eager mode halves TOTAL each time (1.0, then 0.5), and TOTAL kept one halving. A
    write through a view of a read-only tensor raised NumPy's bare "output array is
    read-only", naming neither the tensor nor the reason. An attribute that getattr
    names at run time was not guarded at all: graph and source mode gave [0.5, 1.0] on
    every call, forward mode [0.5, 0.5] (eager mode: [0.5, 1.0], then [0.25, 0.5])."""
    global TOTAL, WEIGHTS
    x = mg.tensor([3.0, 1.0])
    TOTAL, WEIGHTS = mg.sum(mg.tensor([1.0, 1.0])), mg.tensor([1.0, 2.0])
    HOLDER.weight = mg.tensor([1.0, 2.0])
    assert isinstance(TOTAL.data, np.generic)
    eager = mg.grad(f)  # the tape: f's write happens on each call, as in PyTorch
    first, second = eager(x).numpy().tolist(), eager(x).numpy().tolist()
    assert first != second  # (each call halves what the next reads)
    TOTAL, WEIGHTS = mg.sum(mg.tensor([1.0, 1.0])), mg.tensor([1.0, 2.0])
    HOLDER.weight = mg.tensor([1.0, 2.0])
    name = {halves_a_module_total: "TOTAL", halves_a_module_tensor_through_a_view: "WEIGHTS",
            halves_an_attribute_named_at_run_time: "weight"}[f]
    error = mg.autodiff.checkpoint.CheckpointError if mode == "checkpoint" else GradientError
    with pytest.raises(error, match=rf"f wrote into {name}, which it reads from outside its "
                                    rf"arguments \(a tensor of shape .*\), in place, .*line \d+"):
        run_once(f, mode)(x)
    assert TOTAL.item() == 2.0 and WEIGHTS.tolist() == HOLDER.weight.tolist() == [1.0, 2.0]


def doubles_after_use(x, y):
    z = x * y
    y *= 2.0  # a plain tensor and a number: a write, after mul read y
    return z.sum()


def doubles_before_use(x, y):
    y *= 2.0
    return (x * y).sum()


def test_the_tapes_grad_refuses_a_write_after_a_read():
    """mg.grad's record read y through mul's rule after f had doubled it: [6, 8] where the
    derivative is y as mul read it, [3, 4], silently (backward() refused it already, as
    PyTorch's version counters do). A write before the read is fine."""
    x = np.array([1.0, 2.0])
    with pytest.raises(GradientError, match=r"f changed a tensor \(shape \(2,\) float64\) "
                                            r"in place, at .*test_inplace.py, line \d+, "
                                            r"after mul had read it"):
        mg.grad(doubles_after_use)(x, mg.tensor([3.0, 4.0]))
    with pytest.raises(GradientError, match="mul recorded an argument"):
        doubles_after_use(mg.tensor(x, requires_grad=True), mg.tensor([3.0, 4.0])).backward()
    assert mg.grad(doubles_before_use)(x, mg.tensor([3.0, 4.0])).numpy().tolist() == [6, 8]
    for mode in ("graph", "source"):  # (the program would not double the caller's y)
        with pytest.raises((GradientError, mg.SourceTransformError),
                           match="the tensor passed to grad as argument 1"):
            mg.grad(doubles_after_use, mode=mode)(x, mg.tensor([3.0, 4.0]))
    with pytest.raises(GradientError, match="f wrote into its argument 1"):  # (2 runs)
        mg.grad(doubles_after_use, mode="forward")(x, mg.tensor([3.0, 4.0]))


def halves_a_global_in_a_loop(x):
    v = HALVED_ONCE  # the module's tensor, then the loop's variable
    for _ in range(2):
        v *= 0.5  # without recording: HALVED_ONCE is halved twice
        y = v * x
    return (y + HALVED_ONCE).sum()


def test_source_mode_refuses_a_loop_variable_that_is_a_global_tensor():
    """Source mode made v a variable of the loop and the update a new value, leaving the
    module's tensor as it was: 0.44 for eager mode's 0.22, silently."""
    global HALVED_ONCE
    HALVED_ONCE = mg.tensor(np.array([0.7, -0.4]))
    with pytest.raises(mg.SourceTransformError,
                       match=r"HALVED_ONCE \(outside the function\) holds too"):
        mg.grad(halves_a_global_in_a_loop, mode="source")(np.array([0.5, 1.5]))


def test_a_long_list_is_read_by_identity():
    """A list longer than the views' limit is still searched for the value itself (at
    C's speed: a loop that appends and updates reads the whole list each time)."""
    h = mg.tensor(np.ones(2), requires_grad=True) * 2.0
    kept = [mg.tensor(np.zeros(2)) for _ in range(operators._VIEWS_READ * 2)] + [h]
    with pytest.raises(GradientError, match=rf"h and kept\[{len(kept) - 1}\] hold"):
        h += 1.0


@pytest.mark.parametrize("mode", mg.MODES)
def test_a_list_of_copies_is_not_an_alias(mode):
    """(The loop keeps 2x, 2x+1, 2x+2 and ends with h = 2x+3: d/dx of (2x)(2x+2)(2x+3) is
    2[(2x+2)(2x+3) + 2x(2x+3) + 2x(2x+2)]; source mode cannot read list.append and says
    so.)"""
    x = np.array([0.5, 1.5])
    if mode == "source":
        with pytest.raises(mg.SourceTransformError, match="list.append"):
            mg.grad(appends_copies, mode=mode)(x)
        return
    got = mg.grad(appends_copies, mode=mode)(x).numpy()
    a, b, c = 2 * x, 2 * x + 2, 2 * x + 3
    np.testing.assert_allclose(got, 2 * (b * c + a * c + a * b), rtol=1e-13)


@pytest.mark.parametrize("mode", mg.MODES)
def test_an_update_of_a_copy_is_not_an_alias(mode):
    np.testing.assert_allclose(mg.grad(copied_first, mode=mode)(np.array([1.0, 2.0])).numpy(),
                               [3.0, 3.0])


# -- the write guard ------------------------------------------------------------------------------

def recorded_loss():
    w = mg.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    x = mg.tensor(np.array([4.0, 5.0, 6.0]))
    return w, x, (w * x).sum()


def test_backward_refuses_a_value_written_after_it_was_recorded():
    w, x, loss = recorded_loss()
    with mg.no_grad():
        x += 1.0
    with pytest.raises(GradientError,
                       match=r"mul recorded an argument \(shape \(3,\) float64 on cpu\).*in place"):
        loss.backward()
    assert w.grad is None  # nothing half-done


def test_backward_refuses_a_write_through_a_view():
    w, x, loss = recorded_loss()
    with mg.no_grad():
        view = x.reshape(3, 1)
        view *= 2.0
    with pytest.raises(GradientError, match="in place"):
        loss.backward()


def test_backward_refuses_a_written_result():
    w = mg.tensor(np.array([0.5, -1.0]), requires_grad=True)
    h = mg.exp(w)  # exp's rule reads its result
    with mg.no_grad():
        h -= 1.0
    with pytest.raises(GradientError, match="exp recorded its result"):
        h.backward(np.ones(2))


def test_backward_refuses_a_written_scalar_from_a_reduction_or_an_index():
    """``x.sum()`` and ``t[0]`` hold a NumPy scalar, which ``s *= 10`` replaces instead of
    writing into; such writes were not counted, so backward() read the new value and
    gave [60, 60] for d(s^2)/dx = [6, 6]. PyTorch refuses both; so does minigraph now,
    and a vjp_fn too."""
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    s = x.sum()
    y = s * s
    with mg.no_grad():
        s *= 10.0
    with pytest.raises(GradientError, match="sum recorded its result .*changed in place"):
        y.backward()
    x = mg.tensor(2.0, requires_grad=True)
    w = mg.tensor([3.0, 5.0])[0]
    y = x * w
    w += 1.0
    with pytest.raises(GradientError, match="changed in place"):
        y.backward()
    w2 = mg.tensor([3.0, 5.0])[0]
    _, vjp_fn = mg.vjp(lambda x: x * w2, mg.tensor(1.0))
    w2 += 1.0
    with pytest.raises(GradientError, match="changed in place"):
        vjp_fn()


def test_an_index_written_after_it_was_used_leaves_the_gradient_of_what_was_computed():
    """``y = x[idx]``, then ``idx[0] = 2``: the tape kept the index array itself as the
    getitem's parameter (a tensor's own memory, or the caller's NumPy array), so the
    gradient went to the new positions: [0, 20, 10] for [10, 20, 0]. The index is
    copied when the operation is made. Closed form: d/dx sum(x[[0, 1]] * [10, 20])."""
    for make in (np.array, mg.tensor, lambda v: np.array([True, True, False])):
        x = mg.tensor([1.0, 2.0, 3.0], requires_grad=True)
        idx = make([0, 1])
        y = x[idx]
        idx[0] = 2 if idx.dtype != bool else False
        (y * mg.tensor([10.0, 20.0])).sum().backward()
        assert x.grad.tolist() == [10.0, 20.0, 0.0]


def test_writes_before_recording_are_fine():
    w, x, _ = recorded_loss()
    with mg.no_grad():
        x += 1.0
        w -= 0.5
    (w * x).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [5.0, 6.0, 7.0])


def test_stamps_are_forgotten_with_their_arrays():
    x = mg.tensor(np.ones(3))
    x += 1.0
    key = id(x.data)
    assert key in tape._written
    del x
    gc.collect()
    assert key not in tape._written


# -- bad updates leave the tensor as it was ------------------------------------------------------

@pytest.mark.parametrize("dtype, other, error, message", [
    ("float64", lambda: mg.tensor(np.ones((2, 3))), ShapeError,
     "has shape \\(2, 3\\); an in-place update keeps the tensor's shape \\(3,\\)"),
    ("float32", lambda: mg.tensor(np.ones(3)), DTypeError,
     "has dtype float64; an in-place update keeps the tensor's dtype float32"),
    ("float64", lambda: mg.tensor(np.ones(3), device="cpu:1"), DeviceError, "cpu and cpu:1"),
])
def test_a_bad_update_raises_and_changes_nothing(dtype, other, error, message):
    x = mg.tensor(np.arange(3.0), dtype=dtype)
    with pytest.raises(error, match=message):
        x -= other()
    np.testing.assert_array_equal(x.numpy(), [0.0, 1.0, 2.0])


def test_an_update_cannot_turn_integers_into_floats():
    counts = mg.tensor(np.array([1, 2, 3]))
    with pytest.raises(DTypeError, match="mul in place.*float64.*keeps the tensor's dtype int64"):
        counts *= 0.5
    np.testing.assert_array_equal(counts.numpy(), [1, 2, 3])


def test_a_read_only_array_refuses_the_update_and_is_not_stamped():
    x = mg.tensor(np.zeros(3))
    x.data = np.frombuffer(np.arange(3.0).tobytes())  # read-only memory (a bytes object)
    before = tape._last_write
    with pytest.raises(ValueError, match="sub.*read-only"):
        x -= 1.0
    assert tape._last_write == before and id(x.data.base) not in tape._written
    np.testing.assert_array_equal(x.numpy(), [0.0, 1.0, 2.0])


# -- views and item assignment while recording ----------------------------------------------------
# Unrecorded, a write into a view shows through in the tensor it views (NumPy's rule, the
# oracle below); recorded, ``v += y`` would rebind v and leave that tensor as it was, and
# ``x[i] = y`` can only write: both refuse instead of giving another value.

VIEWS = {
    "slice": lambda h: h[0:2],
    "row": lambda h: h.reshape(2, 2)[1],
    "reshape": lambda h: h.reshape(4, 1),
    "transpose": lambda h: h.reshape(2, 2).T,
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_an_update_of_a_view_writes_through_unrecorded_and_refuses_recorded(view):
    start = np.array([1.0, 2.0, 3.0, 4.0])
    want = start.copy()
    part = VIEWS[view](want)
    part += 10.0  # NumPy: the write shows through
    h = mg.tensor(start.copy())
    v = VIEWS[view](h)
    v += 10.0
    np.testing.assert_array_equal(h.numpy(), want)

    x = mg.tensor(start.copy(), requires_grad=True)
    h = x * 1.0
    v = VIEWS[view](h)
    with pytest.raises(GradientError, match=r"add in place .*view \(made by (getitem|"
                                            r"reshape|transpose)\) of another tensor"):
        v += 10.0
    np.testing.assert_array_equal(h.numpy(), start)  # nothing changed
    h.sum().backward()  # and the tape is as it was
    np.testing.assert_array_equal(x.grad.numpy(), np.ones(4))


def test_an_unrecorded_view_updated_with_a_recorded_value_is_refused():
    w = mg.zeros(3)
    p = mg.tensor(np.array([1.0, 2.0]), requires_grad=True)
    v = w[1:]
    with pytest.raises(GradientError, match="view of another tensor"):
        v += p
    np.testing.assert_array_equal(w.numpy(), np.zeros(3))


def test_a_recorded_tensor_that_owns_its_memory_is_still_rebound():
    x = mg.tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x * 2.0
    h += x[::-1] * 1.0  # a view on the right-hand side is only read
    h.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


INDICES = st.one_of(
    st.integers(-4, 3),
    st.builds(slice, st.one_of(st.none(), st.integers(-4, 4)), st.one_of(st.none(), st.integers(-4, 4)),
              st.sampled_from([None, 1, 2, -1])),
    st.lists(st.integers(-4, 3), min_size=1, max_size=3).map(np.array),
    st.lists(st.booleans(), min_size=4, max_size=4).map(np.array),
)


@settings(max_examples=80, deadline=None)
@given(index=INDICES, column=st.one_of(st.none(), st.integers(0, 2)),
       as_tensors=st.booleans(), number=st.floats(-5, 5))
def test_item_assignment_matches_numpy(index, column, as_tensors, number):
    """A number, then an array of values, into rows picked by an int, a slice, an integer
    array or a mask (as an array or a tensor), and a column or all."""
    key = index if column is None else (index, column)
    ours = (mg.tensor(index) if as_tensors and isinstance(index, np.ndarray) else index,) + \
        (() if column is None else (column,))
    want = rng.normal(size=(4, 3))
    t = mg.tensor(want.copy())
    want[key] = number
    t[ours] = number
    np.testing.assert_array_equal(t.numpy(), want)
    values = rng.normal(size=want[key].shape)
    want[key] = values
    t[ours] = mg.tensor(values) if as_tensors else values
    np.testing.assert_array_equal(t.numpy(), want)


@pytest.mark.parametrize("key, value, error, message", [
    (7, 1.0, IndexError, "index 7 is out of bounds"),
    (np.s_[:2], np.ones(3), ShapeError, "could not broadcast"),
    (np.s_[0], lambda: mg.tensor(np.ones(3), device="cpu:1"), DeviceError, "cpu:1"),
])
def test_a_bad_item_assignment_raises_and_changes_nothing(key, value, error, message):
    x = mg.tensor(np.arange(3.0))
    with pytest.raises(error, match=message):
        x[key] = value() if callable(value) else value
    np.testing.assert_array_equal(x.numpy(), [0.0, 1.0, 2.0])


def test_item_assignment_keeps_the_dtype_as_an_update_in_place_does():
    """NumPy casts on item assignment (2.5 into an int64 array is 2); minigraph's x -= y
    refuses a result of another dtype, and x[i] = y follows it."""
    counts = mg.tensor(np.array([1, 2, 3]))
    with pytest.raises(DTypeError, match=r"x\[\.\.\.\] = value .*dtype float64 would be "
                                         r"cast to the tensor's int64"):
        counts[0] = 2.5
    x32 = mg.tensor(np.zeros(3, dtype=np.float32))
    with pytest.raises(DTypeError, match="float64 would be cast to the tensor's float32"):
        x32[:2] = np.array([1.0, 2.0])
    np.testing.assert_array_equal(counts.numpy(), [1, 2, 3])
    np.testing.assert_array_equal(x32.numpy(), [0, 0, 0])
    with pytest.raises(DTypeError, match="float64 would be cast to the tensor's int64"):
        counts[:2] = [2.5, 1]  # a list of Python numbers: a float among ints refuses
    counts[0] = 7          # an int into ints, and weak numbers into float32, as NumPy does
    x32[1] = 0.1
    x32[2] = 3
    assert counts.numpy().tolist() == [7, 2, 3] and x32.numpy().dtype == np.float32
    np.testing.assert_array_equal(x32.numpy(), np.array([0, 0.1, 3], dtype=np.float32))
    x32[:2] = [0.25, 1]    # ... and a list of them, as PyTorch takes it
    counts[1:] = [[5, 6]]
    np.testing.assert_array_equal(x32.numpy(), np.array([0.25, 1, 3], dtype=np.float32))
    assert counts.numpy().tolist() == [7, 5, 6]


def test_item_assignment_while_recording_is_refused_and_allowed_under_no_grad():
    """PyTorch's rule for parameters: ``with torch.no_grad(): w[0] = 0``."""
    w = mg.tensor(np.array([1.0, 2.0]), requires_grad=True)
    with pytest.raises(GradientError, match=r"x\[\.\.\.\] = value .*while gradients are being "
                                            r"recorded.*mg\.where"):
        w[0] = 0.0
    h = w * 3.0
    with pytest.raises(GradientError, match="while gradients are being recorded"):
        h[1] = 0.0
    buffer = mg.zeros(2)
    with pytest.raises(GradientError, match="while gradients are being recorded"):
        buffer[0] = w[0]
    np.testing.assert_array_equal(buffer.numpy(), [0.0, 0.0])
    np.testing.assert_array_equal(h.numpy(), [3.0, 6.0])
    with mg.no_grad():
        w[0] = 0.0
    np.testing.assert_array_equal(w.numpy(), [0.0, 2.0])
    (w * w).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [0.0, 4.0])


def test_item_assignment_is_a_write_that_backward_sees():
    w = mg.tensor(np.array([0.5, -1.0]), requires_grad=True)
    h = mg.exp(w)  # exp's rule reads its result
    with mg.no_grad():
        h[0] = 1.0
    with pytest.raises(GradientError, match=r"exp recorded its result.*x\[i\] = "):
        h.backward(np.ones(2))


def test_item_assignment_into_a_scalar_result():
    z = mg.tensor(np.array([1.0, 2.0])).sum()  # a NumPy scalar inside
    z[...] = 5.0
    assert z.item() == 5.0


def _assigns(x):
    x[0] = 1.0
    return x.sum()


@pytest.mark.parametrize("how", ["tape", "forward", "graph", "vmap"])
def test_a_value_of_a_transformation_cannot_be_assigned_into(how):
    x = mg.tensor(np.array([[1.0, 2.0], [3.0, 4.0]]))
    call = (lambda: mg.vmap(_assigns)(x)) if how == "vmap" else \
        (lambda: mg.grad(_assigns, mode=how)(x))
    kind = {"graph": "graph node", "vmap": "vmap example"}.get(how, "inside a transformation")
    with pytest.raises(TypeError, match=rf"x\[\.\.\.\] = value: x is a .*{kind}.*mg\.where"):
        call()


def test_a_value_of_a_transformation_cannot_be_written_into_a_tensor():
    buffer = mg.zeros(2)

    def leaks(x):
        buffer[0] = x
        return x * 2.0

    with pytest.raises(TypeError, match="belongs to a transformation"):
        mg.grad(leaks)(1.0)
    np.testing.assert_array_equal(buffer.numpy(), [0.0, 0.0])


def _reads_a_global(x):
    return (x * CAPTURED).sum()


CAPTURED = mg.tensor(np.array([1.0, 2.0]))


@pytest.mark.parametrize("mode", ["graph", "source"])
def test_item_assignment_into_a_captured_tensor_rebuilds_the_program(mode):
    """A compiled program holds the tensors it read as constants; a write makes it stale
    (``signature.Captured``), an item assignment as much as ``-=``."""
    g = mg.grad(_reads_a_global, mode=mode)
    ones = np.ones(2)
    np.testing.assert_array_equal(g(ones).numpy(), [1.0, 2.0])
    try:
        CAPTURED[0] = 5.0
        np.testing.assert_array_equal(g(ones).numpy(), [5.0, 2.0])
    finally:
        CAPTURED[0] = 1.0


def test_numpy_of_a_tensor_that_requires_a_gradient_is_a_read_only_view():
    """A write through NumPy would pass the write guard unseen and change backward()'s
    gradient silently (PyTorch refuses .numpy() there); reading, and seeing later
    updates, stay as they were. detach().numpy() is the writable array, as in PyTorch."""
    w = mg.tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = w * 3.0
    loss = (h * h).sum()
    for t in (w, h):
        with mg.no_grad():  # (recording on, NumPy may not read it at all: see below)
            views = (t.numpy(), np.asarray(t))
        for view in views:
            assert np.shares_memory(view, t.data) and not view.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                view[0] = 100.0
    seen = w.numpy()
    with mg.no_grad():
        copy = np.array(w)
    copy[0] = 7.0  # a copy is the caller's own
    loss.backward()
    np.testing.assert_array_equal(w.grad.numpy(), 18.0 * np.array([1.0, 2.0]))
    with mg.no_grad():
        w -= 1.0
    np.testing.assert_array_equal(seen, [0.0, 1.0])  # the view shows the update
    plain = mg.tensor(np.array([1.0, 2.0]))
    assert plain.numpy() is plain.data and plain.numpy().flags.writeable
    detached = w.detach().numpy()
    assert detached.flags.writeable and np.shares_memory(detached, w.data)


def halves_its_data(x, y):
    y *= 0.5    # y, a plain tensor: without recording this writes into the caller's y
    return (x * y).sum()


def test_forward_mode_refuses_a_run_that_wrote_into_an_argument():
    """Forward mode runs f once per input element (jacfwd once per argument); each run
    halved y in place, so the second run saw y / 4 and the gradient came out [0.75, 1.0]
    where eager mode and torch.func give [1.5, 2.0]. A differentiated argument is each
    run's own copy now (as the tape's boxes are its own values); a write into another
    argument is refused after the run that made it; with one run there is nothing to
    refuse, and the write happens once, as in eager mode."""
    x, y = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    for gx, gy in (mg.jacfwd(halves_its_data, argnums=(0, 1))(x, y),
                   mg.grad(halves_its_data, argnums=(0, 1), mode="forward")(x, y)):
        assert gx.numpy().tolist() == [1.5, 2.0]  # y / 2 and x / 2: d sum(x * y/2)
        assert gy.numpy().tolist() == [0.5, 1.0]
    calls = {
        "grad": lambda: mg.grad(halves_its_data, mode="forward")(x, mg.tensor(y)),
        "jacfwd, one pass per element": lambda: mg.jacfwd(
            halves_its_data, vectorize=False)(x, mg.tensor(y))}
    for name, call in calls.items():
        with pytest.raises(GradientError, match=r"f wrote into its argument 1 .*runs f 2 "
                                                r"times"):
            call()
    y1 = mg.tensor([3.0])
    assert mg.grad(halves_its_data, mode="forward")(np.array([1.0]), y1).item() == 1.5
    assert y1.item() == 1.5  # (written once, as eager mode's call writes it)


HALVED = [mg.tensor(np.array([3.0, 4.0]))]  # a module's list holding a tensor


def halves_a_global(x):
    w = HALVED[0]
    w *= 0.5  # a plain tensor, a plain number: a write into the module's tensor
    return (x * w).sum()


@pytest.mark.parametrize("call", ["grad", "jacfwd", "checkpoint"])
def test_a_run_that_wrote_into_a_tensor_read_from_outside_is_refused(call):
    """The same for a tensor f reads from outside its arguments (here an item of a
    module's list): forward mode's second run saw it halved twice, [0.75, 1.0] where
    eager mode gives [1.5, 2.0], without a word; a checkpoint's recomputation too."""
    x = np.array([1.0, 2.0])
    HALVED[0] = mg.tensor(np.array([3.0, 4.0]))
    assert mg.grad(halves_a_global)(x).numpy().tolist() == [1.5, 2.0]  # (one run: right)
    HALVED[0] = mg.tensor(np.array([3.0, 4.0]))
    error = mg.autodiff.checkpoint.CheckpointError if call == "checkpoint" else GradientError
    with pytest.raises(error, match=r"f wrote into an item of HALVED, which it reads from "
                                    r"outside its arguments \(a tensor"):
        if call == "grad":
            mg.grad(halves_a_global, mode="forward")(x)
        elif call == "jacfwd":
            mg.jacfwd(halves_a_global, vectorize=False)(x)
        else:
            mg.grad(mg.checkpoint(halves_a_global))(mg.tensor(x))
    assert HALVED[0].numpy().tolist() == [3.0, 4.0]  # (refused before the write)


# -- a tensor the caller handed a transformation as it is ------------------------------------

def adds_into_the_callers(x, y):
    y += x          # y is not differentiated: eager mode writes x into the caller's y
    return (x * y).sum()


def adds_a_number_into_the_callers(x, y):
    y += 1.0
    return (x * y).sum()


def _torch_grad_and_written(f_torch, x, y):
    """The oracle: torch.func.grad, which writes into the y it was handed (as eager
    PyTorch does), and that y afterwards."""
    torch = pytest.importorskip("torch")
    from torch.func import grad
    tx, ty = torch.tensor(x), torch.tensor(y)
    return grad(f_torch)(tx, ty).numpy(), ty.numpy()


REFUSED = {  # call(f, x, y) -> the refusal's words
    "tape grad": (lambda f, x, y: mg.grad(f)(x, y), "passed to grad as argument 1"),
    "forward grad": (lambda f, x, y: mg.grad(f, mode="forward")(x, y),
                     "passed to grad as argument 1"),
    "graph grad": (lambda f, x, y: mg.grad(f, mode="graph")(x, y),
                   "passed to grad as argument 1"),
    "source grad": (lambda f, x, y: mg.grad(f, mode="source")(x, y),
                    "passed to grad as argument 1"),
    "graph jacrev": (lambda f, x, y: mg.jacrev(f, mode="graph")(x, y),
                     "passed to jacrev as argument 1"),  # (not the vjp jacrev runs)
    "source jacrev": (lambda f, x, y: mg.jacrev(f, mode="source")(x, y),
                      "passed to jacrev as argument 1"),
    "tape jacrev": (lambda f, x, y: mg.jacrev(f)(x, y), "passed to jacrev as argument 1"),
    "jacfwd": (lambda f, x, y: mg.jacfwd(f)(x, y), "passed to jacfwd as argument 1"),
    "mg.trace": (lambda f, x, y: mg.trace(f)(x, y), "passed to mg.trace as argument 1"),
    "vmap": (lambda f, x, y: mg.vmap(f, in_axes=(0, None))(mg.stack([x, x]), y),
             "passed to vmap as argument 1"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_an_update_the_transformation_cannot_make_in_the_callers_tensor_is_refused(name):
    """``y += x`` on a tensor the caller passed and the transformation does not
    differentiate: eager mode (and torch.func.grad, the oracle) writes x into the
    caller's y; every transformation here made a new value and left the caller's y as
    it was, silently (its later calls read the old y; eager mode's read the new one).
    Refused, naming the argument; the caller's y is untouched by the refused call."""
    x, y0 = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    want, written = _torch_grad_and_written(lambda a, b: (a * b.add_(a)).sum(), x, y0)
    assert want.tolist() == [5.0, 8.0] and written.tolist() == [4.0, 6.0]  # y + 2x; y + x
    call, words = REFUSED[name]
    y = mg.tensor(y0)
    error = mg.SourceTransformError if name.startswith("source") else GradientError
    with pytest.raises(error, match=words):
        call(adds_into_the_callers, mg.tensor(x), y)
    assert y.numpy().tolist() == [3.0, 4.0]


def test_an_update_the_tape_can_make_writes_into_the_callers_tensor():
    """``y += 1.0``, a number: the tape writes it into the caller's y, once, as eager mode
    and torch.func.grad do; the gradient is torch's."""
    x, y0 = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    want, written = _torch_grad_and_written(lambda a, b: (a * b.add_(1.0)).sum(), x, y0)
    for y in (mg.tensor(y0), y0.copy()):  # a tensor, and a NumPy array
        got = mg.grad(adds_a_number_into_the_callers)(mg.tensor(x), y)
        np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_array_equal(np.asarray(y.numpy() if isinstance(y, mg.Tensor)
                                                 else y), written)


@pytest.mark.parametrize("mode", ["graph", "source"])
def test_a_compiled_mode_refuses_a_number_added_into_the_callers_tensor(mode):
    """The same update in graph and source mode: the program would add 1.0 to a value
    of its own, and the caller's y (a tensor or a NumPy array) would stay as it was."""
    error = mg.SourceTransformError if mode == "source" else GradientError
    for y in (mg.tensor([3.0, 4.0]), np.array([3.0, 4.0])):
        with pytest.raises(error, match="passed to grad as argument 1"):
            mg.grad(adds_a_number_into_the_callers, mode=mode)(mg.tensor([1.0, 2.0]), y)


def test_forward_mode_refuses_a_numpy_array_written_before_its_next_run():
    """A NumPy array is written by NumPy, which minigraph's log of writes does not see:
    forward mode's second run read y + 1 and the gradient came out [4, 6] (y + 1 is
    [4, 5]), and y was written twice. The array is read-only during the runs now: the
    first write raises, and y is as it was."""
    y = np.array([3.0, 4.0])
    for call in (lambda: mg.grad(adds_a_number_into_the_callers, mode="forward"),
                 lambda: mg.jacfwd(adds_a_number_into_the_callers, vectorize=False)):
        with pytest.raises(GradientError, match=r"f wrote into its argument 1 \(numpy array "
                                                r"of shape \(2,\) float64\), in place, at .*"
                                                r"test_inplace.py, line \d+: y \+= 1.0"):
            call()(mg.tensor([1.0, 2.0]), y)
        assert y.tolist() == [3.0, 4.0] and y.flags.writeable
    # one run (a scalar x), as eager mode: written once
    assert mg.grad(adds_a_number_into_the_callers, mode="forward")(
        mg.tensor(1.0), y).item() == 4.0 + 5.0
    assert y.tolist() == [4.0, 5.0]


@pytest.mark.parametrize("library", ["array_api_strict", "torch"])
def test_forward_mode_refuses_an_array_without_a_read_only_flag_written_in_place(library):
    """The same write into an array that cannot be made read-only (array-api-strict's
    and PyTorch's here; CuPy's on a GPU, tests/test_gpu.py): forward mode's second run
    read y + 1, and grad came out [4, 6] with y written twice, where eager mode and
    torch.func.grad give [4, 5] and write y once. The array is compared with a copy after
    the runs now: a change raises, and y holds its old values again."""
    lib = pytest.importorskip(library)
    y = lib.asarray([3.0, 4.0], dtype=lib.float64)
    for call in (lambda: mg.grad(adds_a_number_into_the_callers, mode="forward"),
                 lambda: mg.jacfwd(adds_a_number_into_the_callers, vectorize=False)):
        with pytest.raises(GradientError, match=rf"f wrote into its argument 1 \({library} "
                                                rf"array of shape \(2,\) .*float64\), in place"):
            call()(mg.tensor([1.0, 2.0]), y)
        assert [float(v) for v in y] == [3.0, 4.0]
    # a NaN the runs leave alone is no change (NaN == NaN is false)
    y = lib.asarray([3.0, float("nan")], dtype=lib.float64)
    got = mg.grad(lambda x, y: (x * x).sum(), mode="forward")(mg.tensor([1.0, 2.0]), y)
    assert got.numpy().tolist() == [2.0, 4.0]


def test_vmap_writes_into_the_callers_numpy_array_once_as_eager_mode_does():
    """An argument vmap does not batch (in_axes None) is the caller's: f's one run writes
    y + 1 into it, as eager mode and torch.func.vmap do. vmap wrapped a NumPy array as a
    tensor of its own (a copy), so the caller's y kept its old values."""
    y, xs = np.array([3.0, 4.0]), np.array([[1.0, 2.0], [5.0, 6.0]])
    got = mg.vmap(adds_a_number_into_the_callers, in_axes=(0, None))(mg.tensor(xs), y)
    np.testing.assert_array_equal(got.numpy(), xs @ np.array([4.0, 5.0]))
    assert y.tolist() == [4.0, 5.0]
    # returned unbatched (out_axes None): a tensor of its own, as every output of vmap
    back = mg.vmap(lambda x, y: y, in_axes=(0, None), out_axes=None)(mg.tensor(xs), y)
    assert isinstance(back, mg.Tensor) and back.tolist() == [4.0, 5.0]
    back[0] = 9.0
    assert y.tolist() == [4.0, 5.0]


def test_a_differentiated_argument_updated_in_place_is_rebound_in_every_mode():
    """The differentiated arguments are the transformation's own values (a box, a dual
    number, a placeholder): ``x *= 3.0`` binds 3x to the name in every mode, as JAX does,
    and the caller's x stays as it was (the rule the refusals above leave alone). The
    closed form: d/dx sum((3x + 1)^2) = 6(3x + 1)."""
    x = mg.tensor([1.0, 2.0])
    for mode in mg.MODES:
        got = mg.grad(updates_its_argument, mode=mode)(x)
        np.testing.assert_allclose(got.numpy(), [24.0, 42.0], rtol=1e-15)
        assert x.numpy().tolist() == [1.0, 2.0]


def test_a_transformation_ending_in_another_thread_leaves_this_ones_refusal():
    """Thread A's mg.grad starts, then thread B's, and A's ends while B's f still runs:
    with one list of registered arguments for the process, A's exit dropped B's entry
    too, and B's ``y += x`` then made a new value silently. Each thread keeps its own."""
    import threading

    a_started, b_started, a_done = threading.Event(), threading.Event(), threading.Event()
    outcome = {}

    def a_f(x, y):
        a_started.set()
        b_started.wait(5)  # B's transformation has begun: its entry is after A's
        return (x * y).sum()

    def b_f(x, y):
        b_started.set()
        a_done.wait(5)     # A's transformation has ended
        y += x             # the caller's y: refused
        return (x * y).sum()

    def run_b():
        a_started.wait(5)
        try:
            mg.grad(b_f)(mg.tensor([1.0, 2.0]), mg.tensor([3.0, 4.0]))
            outcome["b"] = "no error"
        except GradientError as exc:
            outcome["b"] = str(exc)

    b = threading.Thread(target=run_b)
    b.start()
    mg.grad(a_f)(mg.tensor([1.0, 2.0]), mg.tensor([3.0, 4.0]))
    a_done.set()
    b.join(10)
    assert "the tensor passed to grad as argument 1" in outcome["b"]


# -- a NumPy array f reads from outside, written in place -------------------------------------

HALVED_NP = [np.array([3.0, 4.0])]  # a module's list holding a NumPy array


def halves_a_numpy_global(x):
    w = HALVED_NP[0]
    w *= 0.5  # NumPy's own write, which minigraph's log of writes does not see
    return (x * w).sum()


NUMPY_OUTSIDE = {
    "forward grad": lambda x: mg.grad(halves_a_numpy_global, mode="forward")(x),
    "jacfwd": lambda x: mg.jacfwd(halves_a_numpy_global, vectorize=False)(x),
    "checkpoint": lambda x: mg.grad(mg.checkpoint(halves_a_numpy_global))(mg.tensor(x)),
    "graph grad": lambda x: mg.grad(halves_a_numpy_global, mode="graph")(x),
    "source grad": lambda x: mg.grad(halves_a_numpy_global, mode="source")(x),
    "mg.trace": lambda x: mg.trace(halves_a_numpy_global)(x),
}


@pytest.mark.parametrize("call", NUMPY_OUTSIDE)
def test_a_write_into_a_numpy_array_read_from_outside_is_refused(call):
    """Eager mode halves HALVED_NP[0] once per call, and its gradient is the halved
    array, [1.5, 2.0]. Forward mode (a run per input element) and a checkpoint (f again
    in the backward pass) halved it twice and gave [1.5, 1.0] and [0.75, 1.0]; graph
    mode, mg.trace and source mode halved it once while recording and never again (the
    program runs no Python; source mode made a new value and never wrote it). NumPy
    writes without minigraph seeing it, so the array is read-only while f runs there:
    refused, naming it, and the array is as it was (and writeable again)."""
    x = np.array([1.0, 2.0])
    HALVED_NP[0] = np.array([3.0, 4.0])
    assert mg.grad(halves_a_numpy_global)(x).numpy().tolist() == [1.5, 2.0]  # the oracle
    assert HALVED_NP[0].tolist() == [1.5, 2.0]  # (eager mode: written once)
    HALVED_NP[0] = np.array([3.0, 4.0])
    error = mg.autodiff.checkpoint.CheckpointError if call == "checkpoint" else GradientError
    with pytest.raises(error, match=r"an item of HALVED_NP.* in place.*w \*= 0.5|"
                                    r"an item of HALVED_NP.* in place, in halves_a_numpy"):
        NUMPY_OUTSIDE[call](x)
    assert HALVED_NP[0].tolist() == [3.0, 4.0] and HALVED_NP[0].flags.writeable


def aliases_a_numpy_local(x):
    a = np.zeros(2)
    b = a
    a += 1.0  # NumPy writes into the one array: b sees it
    return mg.sum(x * b)


def test_source_mode_writes_into_a_numpy_array_as_numpy_does():
    """Source mode made a new array for ``a += 1.0`` on a NumPy array of f's own, so b
    kept the zeros and the gradient came out [0, 0]; eager mode (NumPy's semantics)
    gives b = [1, 1]. It writes into the array now, as eager mode does."""
    x = np.array([2.0, 3.0])
    assert mg.grad(aliases_a_numpy_local)(x).numpy().tolist() == [1.0, 1.0]  # the oracle
    assert mg.grad(aliases_a_numpy_local, mode="source")(x).numpy().tolist() == [1.0, 1.0]


def adds_into_its_argument(x, y):
    y += 1.0
    return mg.sum(x * y)


@pytest.mark.parametrize("y", [np.array([3.0, 4.0]), mg.tensor([3.0, 4.0])],
                         ids=["numpy", "tensor"])
def test_a_checkpoint_inside_graph_mode_refuses_a_write_into_its_argument(y):
    """On the tape a checkpoint refuses f's write into its argument (its backward pass
    recomputes f from it). Inside graph mode, f ran on a placeholder, and ``y += 1.0``
    made a new node: the caller's y was never written, where eager mode writes it. The
    placeholders are the caller's too now, and the update is refused there as well."""
    with pytest.raises(GradientError, match="the tensor passed to checkpoint as argument 1"):
        mg.grad(lambda x: mg.checkpoint(adds_into_its_argument)(x, y), mode="graph")(
            mg.tensor([1.0, 2.0]))
    with pytest.raises(mg.autodiff.checkpoint.CheckpointError,
                       match=r"its argument 1 \(numpy array of shape \(2,\) float64\), "
                             r"in place"):
        mg.grad(lambda x: mg.checkpoint(adds_into_its_argument)(x, y))(mg.tensor([1.0, 2.0]))
    assert np.asarray(y.numpy() if isinstance(y, mg.Tensor) else y).tolist() == [3.0, 4.0]


LOOP_HELD = {"w": mg.tensor([0.2, 0.9])}  # a module's dict holding a tensor


def halves_an_item_in_a_loop(x):
    w = LOOP_HELD["w"]
    for i in range(2):
        w *= 0.5  # eager mode: written into LOOP_HELD["w"], twice
        x = w * 0.9
    return mg.sum(x) + mg.sum(w)


def test_source_mode_refuses_a_loops_update_of_an_item_read_from_outside():
    """Source mode writes a loop once, so ``w`` in the loop is a loop variable, and the
    update made a new value: LOOP_HELD["w"] was never written, silently (the random
    aliasing programs found it, with v5 = W["w"] a second name for it). The item's object
    now has an origin of its own (one per key), which the loop's update finds held."""
    with pytest.raises(mg.SourceTransformError, match=r"update in place of w, whose value "
                                                      r".*LOOP_HELD\['w'\] \(outside"):
        mg.grad(halves_an_item_in_a_loop, mode="source")(np.array([1.0, 2.0]))
    assert LOOP_HELD["w"].numpy().tolist() == [0.2, 0.9]


HALVED_OTHER = []  # a module's list holding an array of another library (set by the test)


def halves_another_librarys_global(x):
    w = HALVED_OTHER[0]
    w *= 0.5  # that library's own write: no read-only flag to refuse it
    return (x * mg.tensor([float(v) for v in w])).sum()


@pytest.mark.parametrize("call", ["forward grad", "checkpoint", "graph grad", "mg.trace"])
def test_a_write_into_another_librarys_array_read_from_outside_is_refused(call):
    """The same with an array-api-strict array (CuPy's on a GPU: tests/test_gpu.py),
    which has no read-only flag: it is kept as a copy, compared after f returned, put
    back, and the write refused. Forward mode's result was [1.5, 1.0], eager mode's is
    [1.5, 2.0]."""
    xps = pytest.importorskip("array_api_strict")
    calls = {"forward grad": lambda x: mg.grad(halves_another_librarys_global,
                                               mode="forward")(x),
             "checkpoint": lambda x: mg.grad(mg.checkpoint(halves_another_librarys_global))(
                 mg.tensor(x)),
             "graph grad": lambda x: mg.grad(halves_another_librarys_global, mode="graph")(x),
             "mg.trace": lambda x: mg.trace(halves_another_librarys_global)(x)}
    x = np.array([1.0, 2.0])
    HALVED_OTHER[:] = [xps.asarray([3.0, 4.0], dtype=xps.float64)]
    assert mg.grad(halves_another_librarys_global)(x).numpy().tolist() == [1.5, 2.0]
    HALVED_OTHER[:] = [xps.asarray([3.0, 4.0], dtype=xps.float64)]
    error = mg.autodiff.checkpoint.CheckpointError if call == "checkpoint" else GradientError
    with pytest.raises(error, match=r"an item of HALVED_OTHER, which it reads from outside "
                                    r"its arguments \(array_api_strict array"):
        calls[call](x)
    assert [float(v) for v in HALVED_OTHER[0]] == [3.0, 4.0]


def _step_on_one_line(h):
    h += 1.0; return h  # noqa: E702 - several statements on one line, as a student may write


def _rebinds_on_one_line(x):
    h = x * 2.0; h = _step_on_one_line(h); return h  # noqa: E702


def _keeps_the_old_h_on_one_line(x):
    h = x * 2.0; y = _step_on_one_line(h) + h; return y  # noqa: E702


def test_statements_on_one_line_are_read_one_by_one():
    """The search for other holders of an updated value read the caller's line as one
    statement: `h = x * 2.0; h = step(h); return h` was refused (valid in eager mode, as
    in PyTorch: d/dx (2x + 1) = 2), and the refusal's advice, read from the line by a
    regular expression, was `h = h + (1.0; return h)`. The frame's column picks the
    statement now."""
    for mode in ("tape", "forward", "graph"):
        assert mg.grad(_rebinds_on_one_line, mode=mode)(2.0).item() == 2.0
    with pytest.raises(GradientError, match=r"Write h = h \+ 1\.0 for a new value"):
        mg.grad(_keeps_the_old_h_on_one_line)(2.0)


def test_numpy_functions_refuse_a_tensor_that_requires_a_gradient_while_recording():
    """np.dot(a, x) read x through __array__ and gave a NumPy number: added to a loss, its
    share of x's gradient was lost without a word (x.grad [2, 4] for the closed form
    [5, 8]); np.linalg.norm(w) likewise. PyTorch refuses to hand such a tensor to NumPy."""
    x = mg.tensor([1.0, 2.0], requires_grad=True)
    a = np.array([3.0, 4.0])
    for call in (lambda: np.dot(a, x), lambda: np.linalg.norm(x), lambda: np.asarray(x)):
        with pytest.raises(GradientError, match="NumPy read a tensor that requires a gradient"):
            call()
    loss = (x * x).sum() + mg.sum(mg.tensor(a) * x)  # the mg. way: recorded
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * np.array([1.0, 2.0]) + a)
    with mg.no_grad():  # nothing is recorded there: NumPy may read the values
        assert np.dot(a, x) == 11.0
    assert np.dot(a, x.detach()) == 11.0


def test_holders_in_dict_subclasses_deques_and_namedtuples_are_found():
    """A recorded h += 1 is refused when another name holds h (that one would keep the old
    value); a defaultdict, an OrderedDict, a deque or a namedtuple holding h was not
    looked into, and kept [2, 4] where the update without recording (and PyTorch) gives
    [3, 5]."""
    import collections

    Pair = collections.namedtuple("Pair", "first second")
    makers = {"defaultdict": lambda h: collections.defaultdict(list, h=h),
              "OrderedDict": lambda h: collections.OrderedDict(h=h),
              "deque": lambda h: collections.deque([h]), "namedtuple": lambda h: Pair(h, None)}
    for name, make in makers.items():
        def f(x):
            h = x * 2.0
            holder = make(h)  # noqa: F841 - the other holder, read by the search
            h += 1.0
            return h.sum()
        with pytest.raises(GradientError, match=r"h and holder\S* hold the same value"):
            mg.grad(f)(mg.tensor([1.0, 2.0]))
