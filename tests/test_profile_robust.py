"""``pp.profile`` on a loaded machine: noise must not invert the order of the layers' work.

No test here asserts on time. Each one runs the profile with its clock swapped for a
*noisy clock*: the real clock plus a deterministic noise model (seeded random spikes,
a slow first or second half of the run, a periodic spike), which only ever adds time,
as a busy machine does. A Linear(256, 256) does four times the multiply-adds of a
Linear(64, 256) on the same batch; the profile must rank it above, whatever the noise.
The noise models are strong enough to matter: the profile as it was (each layer timed
alone, one after the other, median of 5) ranks the layers the wrong way round under
them, which ``test_the_noise_inverts_a_sequential_median`` checks.

The machine's own load comes on top of the injected noise. BLAS runs with one thread
here, as in the notebooks: a two-thread matrix product on two busy cores waits for its
second thread to be scheduled on every call, and then no timing of a whole profile is
undisturbed.
"""

from __future__ import annotations

import ctypes
import glob
import os
import time

import numpy as np
import pytest

import minigraph as mg
from minigraph import nn
from minigraph.parallel import pipeline as pp
from minigraph.parallel.pipeline import profiling

BATCH = 128
SPIKE = 1.0  # seconds: far above what the machine's own load adds to a layer's timing


def _openblas(name):
    """NumPy's bundled OpenBLAS function ``name`` (get/set_num_threads), or None."""
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in (f"scipy_openblas_{name}64_", f"scipy_openblas_{name}",
                       f"openblas_{name}64_", f"openblas_{name}"):
            if hasattr(lib, symbol):
                return getattr(lib, symbol)
    return None


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread():
    get, put = _openblas("get_num_threads"), _openblas("set_num_threads")
    if get is None or put is None:
        yield
        return
    get.restype = ctypes.c_int
    put.argtypes = [ctypes.c_int]
    before = int(get())
    put(1)
    yield
    put(before)


class NoisyClock:
    """``time.perf_counter()`` plus ``noise(k)`` seconds added at the k-th reading (and
    kept: the clock never goes back). An interval measured between two readings gets
    the noise of its second reading."""

    def __init__(self, noise):
        self.noise, self.reads, self.offset = noise, 0, 0.0

    def __call__(self) -> float:
        self.offset += self.noise(self.reads)
        self.reads += 1
        return time.perf_counter() + self.offset


def noise_models(reads: int) -> dict:
    """Noise models for a profile that reads the clock ``reads`` times."""
    rng = np.random.default_rng(0)
    spikes = rng.uniform(0.5, 1.5, size=reads) * SPIKE * (rng.random(reads) < 0.4)
    return {
        "random spikes on 40% of the readings": lambda k: float(spikes[k % reads]),
        "slow first half": lambda k: SPIKE if k < reads // 2 else 0.0,
        "slow second half": lambda k: SPIKE if k >= reads // 2 else 0.0,
        "a spike every 7th reading": lambda k: SPIKE if k % 7 == 3 else 0.0,
    }


def models():
    """(model, input, index of the small layer, index of the big one), both orders."""
    rng = np.random.default_rng(1)
    small_first = nn.Sequential(nn.Linear(64, 256, seed=0), nn.Linear(256, 256, seed=1))
    big_first = nn.Sequential(nn.Linear(256, 256, seed=2), nn.Linear(256, 64, seed=3))
    return [(small_first, rng.normal(size=(BATCH, 64)), 0, 1),
            (big_first, rng.normal(size=(BATCH, 256)), 1, 0)]


def readings(model, x, **kw) -> int:
    clock = NoisyClock(lambda k: 0.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(profiling, "_clock", clock)
        pp.profile(model, x, **kw)
    return clock.reads


def noisy_profile(model, x, noise, **kw) -> pp.Profile:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(profiling, "_clock", NoisyClock(noise))
        return pp.profile(model, x, **kw)


@pytest.mark.parametrize("case", [0, 1], ids=["small layer first", "big layer first"])
def test_noise_does_not_invert_the_order_of_the_layers(case):
    model, x, small, big = models()[case]
    for name, noise in noise_models(readings(model, x)).items():
        prof = noisy_profile(model, x, noise)
        assert prof[big].forward_time > prof[small].forward_time, name
        assert prof[big].backward_time > prof[small].backward_time, name
        assert prof[big].compute_time > prof[small].compute_time, name
        assert [c.activation_bytes for c in prof] == [BATCH * 256 * 8,
                                                      BATCH * model[1].out_features * 8]


def sequential_median(model, x, clock, repeat=5):
    """The profile as it was: each layer alone, one warm-up, the median of ``repeat``."""
    times, h = [], x
    for layer in model:
        inp = h.detach()
        runs = []
        for run in range(repeat + 1):
            leaf = inp.detach().requires_grad_()
            t0 = clock()
            out = layer(leaf)
            t1 = clock()
            seed = mg.tensor(np.ones(out.shape))
            t2 = clock()
            out.backward(seed)
            t3 = clock()
            if run:
                runs.append((t1 - t0) + (t3 - t2))
        times.append(float(np.median(runs)))
        h = out
    return times


def test_the_noise_inverts_a_sequential_median():
    """The noise models are not toothless: one of them turns the old profile upside down
    (so the test above could fail), and without noise the old profile ranks right."""
    model, x, small, big = models()[0]
    x = mg.tensor(x)
    reads = 4 * len(model) * 6
    clean = sequential_median(model, x, NoisyClock(lambda k: 0.0))
    assert clean[big] > clean[small]
    noisy = sequential_median(model, x, NoisyClock(noise_models(reads)["slow first half"]))
    assert noisy[big] < noisy[small]


class SlowStart(nn.Module):
    """A Linear(64, 256) whose first two calls also pay one second of set-up (on the
    noisy clock), as a first call pays for allocations and caches."""

    def __init__(self, clock):
        super().__init__()
        self.inner = nn.Linear(64, 256, seed=0)
        self.calls, self.clock = 0, clock

    def forward(self, x):
        self.calls += 1
        if self.calls <= 2:
            self.clock.offset += 1.0
        return self.inner(x)


def test_warm_up_calls_are_not_timed():
    x = np.random.default_rng(3).normal(size=(BATCH, 64))
    for warmup, slowed in ((2, False), (0, True)):
        clock = NoisyClock(lambda k: 0.0)
        model = nn.Sequential(SlowStart(clock), nn.Linear(256, 256, seed=1))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(profiling, "_clock", clock)
            prof = pp.profile(model, x, repeat=2, warmup=warmup, quantile=1.0)  # the slowest
        assert (prof[0].forward_time > 0.5) == slowed, warmup
        assert prof[1].forward_time < 0.5


def test_profile_checks_its_arguments_and_leaves_no_gradients():
    model, x, _, _ = models()[0]
    with pytest.raises(ValueError, match="repeat"):
        pp.profile(model, x, repeat=0)
    with pytest.raises(ValueError, match="warmup"):
        pp.profile(model, x, warmup=-1)
    with pytest.raises(ValueError, match="quantile"):
        pp.profile(model, x, quantile=1.5)
    model[0].weight.grad = g = mg.tensor(np.ones((256, 64)))
    pp.profile(model, x, repeat=2)
    assert model[0].weight.grad is g and model[1].weight.grad is None


def test_fastest_runs_keeps_each_ones_least_disturbed_call():
    calls = []

    def run(name, durations):
        it = iter(durations)

        def call():
            calls.append(name)
            return name, next(it)
        return call

    # a slow phase hits "b" in its first three calls; "a" is slowed in its last two
    runs = {"a": run("a", [5.0, 5.1, 5.0, 9.0, 9.5]), "b": run("b", [30.0, 31.0, 29.0, 6.0, 6.2])}
    best = profiling.fastest_runs(runs, rounds=5, duration=lambda result: result[1])
    assert best == {"a": ("a", 5.0), "b": ("b", 6.0)}
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]  # interleaved, rotating
    with pytest.raises(ValueError, match="rounds"):
        profiling.fastest_runs(runs, rounds=0)


def test_fastest_runs_times_the_calls_on_the_profile_clock():
    clock = NoisyClock(lambda k: 1.0 if k in (1, 5) else 0.0)  # readings 1 and 5: +1 s
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(profiling, "_clock", clock)
        seen = iter(range(100))
        best = profiling.fastest_runs({"x": lambda: next(seen), "y": lambda: next(seen)},
                                      rounds=2)
    # calls: x (0), y (1), y (2), x (3); intervals end at readings 1, 3, 5, 7
    assert best == {"x": 3, "y": 1}
