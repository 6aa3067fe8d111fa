"""Graded tests of chapter 01 (tensors and devices).

Each test compares a function of exercises.py with minigraph's own implementation (or
NumPy's, which minigraph follows) on random inputs drawn from fixed seeds.
"""

import gc
import itertools

import math

import numpy as np
import pytest

import minigraph as mg
from minigraph.grading import assert_same_array, exercises_fixture
from minigraph.ops import shape_rules

exercises = exercises_fixture()

DTYPES = ["bool", "int32", "int64", "float32", "float64"]


def random_shape_pair(rng):
    """Two shapes that broadcast: a common shape with some sizes replaced by 1 or cut."""
    ndim = int(rng.integers(0, 5))
    common = [int(n) for n in rng.integers(0, 5, size=ndim)]
    shapes = []
    for _ in range(2):
        s = [1 if rng.random() < 0.4 else n for n in common]
        cut = int(rng.integers(0, ndim + 1)) if rng.random() < 0.5 else 0
        shapes.append(tuple(s[cut:]))
    return shapes


def minigraph_broadcast(a, b):
    return shape_rules.broadcast_shapes("add", a, b)


# ---------------------------------------------------------------------------------------
# broadcast_shape
# ---------------------------------------------------------------------------------------

@pytest.mark.points(2)
@pytest.mark.forbid("numpy.broadcast_shapes", "numpy.broadcast", "numpy.broadcast_to", "numpy.broadcast_arrays", "minigraph.ops.shape_rules.broadcast_shapes", why="apply the broadcasting rule yourself")
def test_broadcast_shape_matches_minigraph(exercises):
    # 200 random pairs of shapes that broadcast; the result is minigraph's (and NumPy's)
    rng = np.random.default_rng(101)
    for _ in range(200):
        a, b = random_shape_pair(rng)
        expected = minigraph_broadcast(a, b)
        assert expected == np.broadcast_shapes(a, b)
        got = exercises.broadcast_shape(a, b)
        assert tuple(got) == expected, f"broadcast_shape({a}, {b}) gave {got}, not {expected}"
    # Shapes only: no array of these sizes fits in memory (the shape of np.empty(a) +
    # np.empty(b) is not an answer: it allocates terabytes)
    for a, b in [((10**6, 1), (1, 10**6)), ((2**40,), (1,)), ((3, 1, 10**7), (10**7, 1))]:
        expected = minigraph_broadcast(a, b)
        got = exercises.broadcast_shape(a, b)
        assert tuple(got) == expected, f"broadcast_shape({a}, {b}) gave {got}, not {expected}"


@pytest.mark.points(1)
@pytest.mark.forbid("numpy.broadcast_shapes", "numpy.broadcast", "numpy.broadcast_to", "numpy.broadcast_arrays", "minigraph.ops.shape_rules.broadcast_shapes", why="apply the broadcasting rule yourself")
def test_broadcast_shape_rejects_mismatches(exercises):
    # shapes whose sizes clash on some axis raise ValueError, as minigraph does; and the
    # pairs the clashes are made from do broadcast (a function that refuses everything
    # must not pass)
    rng = np.random.default_rng(102)
    cases = [((3,), (4,)), ((2, 1), (8, 4, 3)), ((0,), (3,)), ((3,), (0,)), ((2, 0), (2, 5)),
             ((5, 2), (2, 5)),
             ((2**40, 3), (4,)), ((5, 2**40), (5, 1, 3))]  # shapes only: no such array fits
    for _ in range(30):
        a, b = random_shape_pair(rng)
        if not a:
            continue
        assert tuple(exercises.broadcast_shape(a, b)) == minigraph_broadcast(a, b), \
            f"broadcast_shape({a}, {b})"
        axis = int(rng.integers(len(a)))
        bad = list(a)
        bad[axis] = max(a[axis], 1) + int(rng.integers(1, 4))  # neither 1 nor a's size
        full = np.broadcast_shapes(a, b)
        clash = list(full)
        clash[len(full) - len(a) + axis] = bad[axis] + 1
        cases.append((tuple(bad), tuple(clash)))
    for a, b in cases:
        with pytest.raises(ValueError):
            minigraph_broadcast(a, b)
        with pytest.raises(ValueError):
            exercises.broadcast_shape(a, b)


# ---------------------------------------------------------------------------------------
# sum_to
# ---------------------------------------------------------------------------------------

def random_broadcast(rng):
    """A small shape and a larger shape it broadcasts to."""
    small = tuple(int(n) for n in rng.integers(1, 4, size=int(rng.integers(0, 4))))
    lead = tuple(int(n) for n in rng.integers(1, 4, size=int(rng.integers(0, 3))))
    big = lead + tuple(int(rng.integers(2, 5)) if n == 1 and rng.random() < 0.7 else n
                       for n in small)
    return small, big


@pytest.mark.points(3)
@pytest.mark.forbid("minigraph.sum_to", "minigraph.grad", "minigraph.vjp", why="sum the broadcast axes yourself")
def test_sum_to_matches_minigraph(exercises):
    # mg.sum_to on 100 random (gradient, target shape) pairs
    rng = np.random.default_rng(103)
    for _ in range(100):
        small, big = random_broadcast(rng)
        g = rng.normal(size=big)
        expected = mg.sum_to(mg.tensor(g), small).numpy()
        got = np.asarray(exercises.sum_to(g.copy(), small))
        assert_same_array(got, expected, f"sum_to(g of shape {big}, {small})", rtol=1e-12,
                          atol=1e-12)


@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.sum_to", "minigraph.grad", "minigraph.vjp", why="sum the broadcast axes yourself")
def test_sum_to_is_the_gradient_of_broadcast_to(exercises):
    # d/dx sum(broadcast_to(x, big) * w) is sum_to(w, x.shape): minigraph's VJP of broadcast_to
    rng = np.random.default_rng(104)
    for _ in range(20):
        small, big = random_broadcast(rng)
        x, w = rng.normal(size=small), rng.normal(size=big)
        gx = mg.grad(lambda x: (mg.broadcast_to(x, big) * mg.tensor(w)).sum())(x)
        assert_same_array(exercises.sum_to(w, small), gx.numpy(), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------
# result_dtype
# ---------------------------------------------------------------------------------------

def minigraph_dtype(a, b):
    """The dtype of a + b computed by minigraph on real tensors."""
    def make(v):
        return mg.tensor(np.zeros(3, dtype=v)) if isinstance(v, str) else v
    return (make(a) + make(b)).dtype


@pytest.mark.points(2)
@pytest.mark.forbid("numpy.result_type", "numpy.promote_types", "minigraph.ops.shape_rules.promote", "numpy.zeros", "numpy.ones", "numpy.empty", "numpy.full", "minigraph.zeros", "minigraph.ones", "minigraph.tensor", why="apply the promotion rules yourself")
def test_result_dtype_of_two_tensors(exercises):
    for a, b in itertools.product(DTYPES, DTYPES):
        expected = minigraph_dtype(a, b)
        got = exercises.result_dtype(a, b)
        assert got == expected, f"result_dtype({a!r}, {b!r}) gave {got!r}, not {expected!r}"


@pytest.mark.points(2)
@pytest.mark.forbid("numpy.result_type", "numpy.promote_types", "minigraph.ops.shape_rules.promote", "numpy.zeros", "numpy.ones", "numpy.empty", "numpy.full", "minigraph.zeros", "minigraph.ones", "minigraph.tensor", why="apply the promotion rules yourself")
def test_result_dtype_with_weak_python_numbers(exercises):
    for dtype, number in itertools.product(DTYPES, [True, False, 3, -1, 2.5, 0.0]):
        for a, b in [(dtype, number), (number, dtype)]:
            expected = minigraph_dtype(a, b)
            assert expected == shape_rules.promote(mg.zeros(1, dtype=dtype), number)
            got = exercises.result_dtype(a, b)
            assert got == expected, f"result_dtype({a!r}, {b!r}) gave {got!r}, not {expected!r}"
    # A number's kind counts, never its value (NEP 50): the rule gives int32 for an int32
    # tensor and 2**40 though the sum itself cannot be computed (NumPy and minigraph raise
    # OverflowError), so the dtype is not to be read off an addition
    for dtype, number in itertools.product(DTYPES, [2**40, 2**70]):
        for a, b in [(dtype, number), (number, dtype)]:
            expected = shape_rules.promote(mg.zeros(1, dtype=dtype), number)
            got = exercises.result_dtype(a, b)
            assert got == expected, f"result_dtype({a!r}, {b!r}) gave {got!r}, not {expected!r}"


# ---------------------------------------------------------------------------------------
# memory per device
# ---------------------------------------------------------------------------------------

def live_bytes():
    return {name: mg.device(name).live_bytes for name in mg.devices() if name.startswith("cpu")}


@pytest.fixture
def quiet_gc():
    """No garbage collection while a test watches live_bytes: a tensor freed by the
    collector in the middle of a measurement would change the count."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.points(1)
@pytest.mark.forbid("numpy.zeros", "numpy.ones", "numpy.empty", "numpy.full", "minigraph.zeros", "minigraph.ones", "minigraph.tensor", "minigraph.runtime.memory.nbytes", why="multiply the element count by the item size yourself")
def test_tensor_nbytes_matches_device_accounting(exercises, quiet_gc):
    # what a new tensor adds to its device's live_bytes
    rng = np.random.default_rng(105)
    device = mg.device("cpu:1")
    for _ in range(40):
        shape = tuple(int(n) for n in rng.integers(0, 6, size=int(rng.integers(0, 4))))
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        before = device.live_bytes
        t = mg.zeros(shape, dtype=dtype, device="cpu:1")
        expected = device.live_bytes - before
        got = exercises.tensor_nbytes(shape, dtype)
        assert got == expected, f"tensor_nbytes({shape}, {dtype!r}) gave {got}, expected {expected}"
        del t


@pytest.mark.points(2)
@pytest.mark.forbid("minigraph.runtime.memory.nbytes", why="add up each device's bytes yourself")
def test_bytes_per_device_matches_live_bytes(exercises, quiet_gc):
    rng = np.random.default_rng(106)
    names = [n for n in mg.devices() if n.startswith("cpu")]
    for _ in range(5):
        before = live_bytes()
        tensors = []
        for _ in range(int(rng.integers(1, 8))):
            shape = tuple(int(n) for n in rng.integers(1, 5, size=int(rng.integers(0, 3))))
            dtype = DTYPES[int(rng.integers(len(DTYPES)))]
            data = rng.normal(size=shape).astype(dtype)
            tensors.append(mg.tensor(data, device=names[int(rng.integers(len(names)))]))
        after = live_bytes()
        # exactly the devices that hold a tensor: one listed with 0 bytes holds none
        expected = {n: after[n] - before[n] for n in {t.device.name for t in tensors}}
        got = exercises.bytes_per_device(tensors)
        assert dict(got) == expected, f"bytes per device {dict(got)}, expected {expected}"
        del tensors


# ---------------------------------------------------------------------------------------
# gpu_time
# ---------------------------------------------------------------------------------------

class FakeGPU:
    """One queue of kernels on a virtual clock: launches return at once, kernels run later."""

    LAUNCH = 5e-6

    def __init__(self):
        self.host = 0.0
        self.device_free = 0.0
        self.syncs = 0

    def clock(self):
        return self.host

    def launch(self, seconds):
        self.host += self.LAUNCH
        self.device_free = max(self.device_free, self.host) + seconds

    def synchronize(self):
        self.syncs += 1
        self.host = max(self.host, self.device_free)


@pytest.mark.points(2)
@pytest.mark.forbid("timeit.timeit", "timeit.repeat", why="time with the clock you are given")
def test_gpu_time_waits_for_the_queue(exercises):
    rng = np.random.default_rng(107)
    for _ in range(10):
        gpu = FakeGPU()
        gpu.launch(float(rng.uniform(1e-3, 5e-3)))  # earlier work, still running: not ours
        durations = rng.uniform(1e-4, 2e-3, size=int(rng.integers(1, 20)))
        calls = []

        def work():
            calls.append(1)
            for d in durations:
                gpu.launch(float(d))

        measured = exercises.gpu_time(work, gpu.synchronize, gpu.clock)
        assert len(calls) == 1, f"work() was called {len(calls)} times, not once"
        # the device time of our kernels, plus the first launch before they can start
        expected = FakeGPU.LAUNCH + float(durations.sum())
        # (a number, first: pytest.approx takes an empty array for equal to any number)
        assert np.ndim(measured) == 0, f"gpu_time returns a number of seconds, got {measured!r}"
        assert math.isclose(float(measured), expected, rel_tol=1e-9), (
            f"measured {measured:.6g} s; the kernels take {expected:.6g} s "
            f"(launching them alone takes {len(durations) * FakeGPU.LAUNCH:.6g} s)")
