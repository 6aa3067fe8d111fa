"""Graded tests of chapter 07: each exercise against minigraph's own implementation.

Random arrays (fixed seeds) are handed to the exercises as NumPy arrays and, with the
same values, to ``mg.parallel`` on the virtual CPU devices ``cpu``, ``cpu:1``, ...
"""

import numpy as np
import pytest

import minigraph as mg
from minigraph.grading import assert_same_array, exercises_fixture, in_sandbox

exercises = exercises_fixture()

# what the exercises may not call: minigraph's collectives, and (for the cross-entropy)
# anything that joins the shards into the N x C matrix the exercise must never build
NO_COLLECTIVES = ("minigraph.parallel.allreduce", "minigraph.parallel.allreduce_with_stats",
                  "minigraph.parallel.data_parallel._naive", "minigraph.parallel.data_parallel._ring",
                  "minigraph.parallel.data_parallel._parameter_server",
                  "minigraph.parallel.cost_model.bytes_sent")
NO_FULL_LOGITS = ("minigraph.parallel.parallel_cross_entropy", "minigraph.cross_entropy",
                  "numpy.concatenate", "numpy.hstack", "numpy.column_stack", "numpy.block",
                  "numpy.append", "numpy.stack", "numpy.dstack")

SEEDS = range(12)


def device_names(n):
    """``["cpu", "cpu:1", ..., "cpu:<n-1>"]``, adding virtual CPU devices if needed."""
    names = ["cpu"] + [f"cpu:{k}" for k in range(1, n)]
    if any(name not in mg.devices() for name in names):
        mg.set_virtual_cpus(n - 1)
    return names


def random_arrays(rng, n, dtype="float64"):
    """n arrays of one random shape, one per device."""
    shape = [(), (1,), (5,), (2, 3), (7,), (3, 4), (11,)][int(rng.integers(7))]
    return [rng.normal(size=shape).astype(dtype) for _ in range(n)]


def on_devices(arrays):
    return [mg.tensor(a, device=d) for a, d in zip(arrays, device_names(len(arrays)))]


def chunk_sizes(size, n, itemsize):
    cuts = [size * c // n for c in range(n + 1)]
    return [(b - a) * itemsize for a, b in zip(cuts, cuts[1:])]


def run_and_inspect(function, inputs):
    """Runs in the sandbox (in_sandbox), where the arrays live: ``function(inputs)``'s
    answer, whether the call changed the input arrays, and whether two arrays of the
    answer's first item are one array. Neither can be seen in the grader: every array
    that crosses between the two arrives as a fresh copy, so there such checks always
    passed."""
    def arrays_of(x):
        return [a for item in x for a in arrays_of(item)] if isinstance(x, (list, tuple)) else [x]
    before = [np.array(a, copy=True) for a in arrays_of(inputs)]
    answer = function(inputs)
    changed = not all(np.array_equal(a, b) for a, b in zip(arrays_of(inputs), before))
    out = arrays_of(answer[0])
    shared = any(np.shares_memory(a, b) for i, a in enumerate(out) for b in out[i + 1:])
    return answer, changed, shared


# -- 1. scatter ----------------------------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid("minigraph.parallel.scatter", "minigraph.parallel.data_parallel.shard", "numpy.array_split", "numpy.linspace", why="compute the boundaries yourself")
def test_scatter_bounds_match_scatter(exercises):
    rng = np.random.default_rng(0)
    for _ in range(20):
        parts, n = int(rng.integers(1, 5)), int(rng.integers(1, 30))
        x = np.arange(2 * n, dtype=float).reshape(n, 2)
        pieces = mg.parallel.scatter(x, device_names(parts))
        bounds = exercises.scatter_bounds(n, parts)
        assert list(bounds) == list(np.cumsum([0] + [p.shape[0] for p in pieces])), \
            f"scatter_bounds({n}, {parts})"
        for k, piece in enumerate(pieces):
            assert np.array_equal(x[bounds[k]:bounds[k + 1]], piece.numpy()), (
                f"scatter_bounds({n}, {parts}): device {k} gets rows {bounds[k]}.."
                f"{bounds[k + 1] - 1}, expected {piece.shape[0]} rows")


# -- 2. allreduce --------------------------------------------------------------------------

@pytest.mark.points(1)
@pytest.mark.forbid(*NO_COLLECTIVES, why="add the arrays up on device 0 yourself")
def test_naive_allreduce_matches_minigraph(exercises):
    run = in_sandbox(exercises, run_and_inspect)
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 5))
        # float32 too: a sum (and its bytes) keeps the arrays' dtype, as in NumPy
        arrays = random_arrays(rng, n, "float32" if seed % 3 == 1 else "float64")
        out, stats = mg.parallel.allreduce_with_stats(on_devices(arrays), "naive")
        (sums, sent), changed, shared = run(exercises.naive_allreduce, arrays)
        assert len(sums) == n and len(sent) == n, (
            f"{len(sums)} sums and {len(sent)} byte counts for {n} devices, expected {n} each")
        for mine, theirs in zip(sums, out):
            assert_same_array(mine, theirs.numpy(), f"{arrays[0].dtype} arrays (n = {n})",
                              rtol=1e-5, atol=1e-8)
        assert not shared, "two devices share one array"
        expected = [(n - 1) * arrays[0].nbytes] + [arrays[0].nbytes] * (n - 1)
        assert list(sent) == expected, (
            f"bytes sent {list(sent)}, expected {expected} ({arrays[0].dtype} arrays of "
            f"{arrays[0].nbytes} bytes, n = {n})")
        assert sum(sent) == stats.bytes_total, (
            f"{sum(sent)} bytes sent in all, minigraph counts {stats.bytes_total}")
        assert not changed, "inputs changed"


def random_chunks(rng, n, dtype):
    size = int(rng.integers(0, 3 * n + 4))
    cuts = [size * c // n for c in range(n + 1)]
    flat = [rng.normal(size=size).astype(dtype) for _ in range(n)]
    return flat, [[f[cuts[c]:cuts[c + 1]] for c in range(n)] for f in flat]


@pytest.mark.points(2)
@pytest.mark.forbid(*NO_COLLECTIVES, why="pass the chunks around the ring yourself")
def test_ring_reduce_scatter_leaves_one_complete_chunk_per_device(exercises):
    run = in_sandbox(exercises, run_and_inspect)
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        n = int(rng.integers(2, 6))
        dtype = "float32" if seed % 3 == 0 else "float64"
        flat, chunks = random_chunks(rng, n, dtype)
        total = mg.parallel.allreduce(on_devices(flat), "ring")[0].numpy()
        (done, sent), changed, _ = run(exercises.ring_reduce_scatter, chunks)
        cuts = [flat[0].size * c // n for c in range(n + 1)]
        for i in range(n):
            c = (i + 1) % n
            assert_same_array(done[i][c], total[cuts[c]:cuts[c + 1]],
                              f"device {i} should hold the complete chunk {c} (n = {n})",
                              rtol=1e-5, atol=1e-8)
        sizes = chunk_sizes(flat[0].size, n, flat[0].itemsize)
        expected = [sum(sizes) - sizes[(i + 1) % n] for i in range(n)]
        assert list(sent) == expected, (
            f"bytes sent per device {list(sent)}, expected {expected} (n = {n}, chunk bytes "
            f"{sizes})")
        # The other chunks, by hand: chunk c leaves device c in step 0 and moves one
        # device along the ring per step, so device i holds the sum of devices
        # c, c + 1, ..., i (mod n) of it; one that sends straight to the owner does not
        for i in range(n):
            for c in range(n):
                partial = sum(chunks[(c + d) % n][c] for d in range((i - c) % n + 1))
                assert_same_array(done[i][c], partial,
                                  f"device {i}, chunk {c} (n = {n}): the ring's partial sum "
                                  f"of devices {c}..{i} (each sends only to the next)",
                                  rtol=1e-5, atol=1e-8)
        assert not changed, "ring_reduce_scatter changed its input arrays"


@pytest.mark.points(1)
@pytest.mark.forbid(*NO_COLLECTIVES, why="pass the chunks around the ring yourself")
def test_ring_all_gather_spreads_the_complete_chunks(exercises):
    run = in_sandbox(exercises, run_and_inspect)
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        n = int(rng.integers(2, 6))
        flat, truth = random_chunks(rng, n, "float64")
        chunks = [[truth[0][c] if c == (i + 1) % n else rng.normal(size=truth[0][c].shape)
                   for c in range(n)] for i in range(n)]
        (done, sent), changed, _ = run(exercises.ring_all_gather, chunks)
        for i in range(n):
            for c in range(n):
                assert np.array_equal(done[i][c], truth[0][c]), (
                    f"device {i}, chunk {c} (n = {n}): {done[i][c]}, expected the complete "
                    f"chunk {truth[0][c]}")
        sizes = chunk_sizes(flat[0].size, n, 8)
        expected = [sum(sizes) - sizes[(i + 2) % n] for i in range(n)]
        assert list(sent) == expected, (
            f"bytes sent per device {list(sent)}, expected {expected} (n = {n}, chunk bytes "
            f"{sizes})")
        assert not changed, "ring_all_gather changed its input arrays"


@pytest.mark.points(2)
@pytest.mark.forbid(*NO_COLLECTIVES, why="use your reduce-scatter and all-gather")
def test_ring_allreduce_matches_allreduce_with_stats(exercises):
    run = in_sandbox(exercises, run_and_inspect)
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 6))
        arrays = random_arrays(rng, n, "float32" if seed % 4 == 1 else "float64")
        out, stats = mg.parallel.allreduce_with_stats(on_devices(arrays), "ring")
        (sums, sent), changed, shared = run(exercises.ring_allreduce, arrays)
        assert len(sums) == n, f"{len(sums)} sums for {n} devices"
        for mine, theirs in zip(sums, out):
            assert_same_array(mine, theirs.numpy(), f"{arrays[0].dtype} arrays (n = {n})",
                              rtol=1e-5, atol=1e-8)
        assert not shared, "two devices share one array"
        # Per device, not only the sum and the maximum (bytes counted on the receiver
        # permute the list and keep both): device i sends every chunk but (i + 1) % n in
        # the reduce-scatter, every chunk but (i + 2) % n in the all-gather
        sizes = chunk_sizes(arrays[0].size, n, arrays[0].itemsize)
        expected = [2 * sum(sizes) - sizes[(i + 1) % n] - sizes[(i + 2) % n] for i in range(n)]
        assert list(sent) == expected, (
            f"bytes sent per device {list(sent)}, expected {expected} (n = {n}, chunk bytes "
            f"{sizes})")
        assert sum(sent) == stats.bytes_total, (
            f"{sum(sent)} bytes sent in all, minigraph counts {stats.bytes_total}")
        assert not changed, "inputs changed"


# -- 3. a data-parallel gradient -----------------------------------------------------------

def softmax_regression_loss(params, x, y):
    return mg.cross_entropy(x @ params[0] + params[1], y)


def numpy_grad_fn(params, xk, yk):
    grads = mg.grad(lambda w, b: softmax_regression_loss([w, b], mg.tensor(xk), mg.tensor(yk)),
                    argnums=(0, 1))(mg.tensor(params[0]), mg.tensor(params[1]))
    return [g.numpy() for g in grads]


def run_and_inspect_grads(function, grad_fn, params, x, y, parts):
    """Runs in the sandbox (in_sandbox), as run_and_inspect: ``function``'s gradients
    and whether two devices share one array (a change to device 0's copy, an optimizer
    step, would change the other's), which the grader cannot see."""
    grads = function(grad_fn, params, x, y, parts)
    shared = any(np.shares_memory(a, b) for k, mine in enumerate(grads)
                 for other in grads[k + 1:] for a in mine for b in other)
    return grads, shared


@pytest.mark.points(2)
@pytest.mark.forbid(*NO_COLLECTIVES, "minigraph.parallel.data_parallel_grads", why="cut the batch and weight the slices yourself")
def test_data_parallel_gradient_matches_data_parallel_grads(exercises):
    run = in_sandbox(exercises, run_and_inspect_grads)
    for seed in range(4):
        rng = np.random.default_rng(seed)
        parts = int(rng.integers(2, 5))
        n = parts * int(rng.integers(1, 4)) + int(rng.integers(1, parts))  # uneven slices
        features, classes = 4, 3
        w, b = rng.normal(size=(features, classes)), rng.normal(size=classes)
        x, y = rng.normal(size=(n, features)), rng.integers(0, classes, size=n)
        expected = mg.parallel.data_parallel_grads(
            softmax_regression_loss, [mg.tensor(w), mg.tensor(b)], x, y, device_names(parts))
        slices = []   # the rows each call of grad_fn saw: one slice per device

        def grad_fn(params, xk, yk):
            slices.append(np.array(xk, copy=True))
            return numpy_grad_fn(params, xk, yk)

        got, shared = run(exercises.data_parallel_gradient, grad_fn, [w, b], x, y, parts)
        assert len(got) == parts, f"{len(got)} gradient lists for {parts} devices"
        assert not shared, "two devices share one gradient array: each needs its own copy"
        pieces = [p.numpy() for p in mg.parallel.scatter(x, device_names(parts))]
        assert [s.shape for s in slices] == [p.shape for p in pieces], (
            f"grad_fn saw batches of shapes {[s.shape for s in slices]}; each of the {parts} "
            f"devices computes the gradient of its own slice, of shapes {[p.shape for p in pieces]}")
        assert all(np.array_equal(s, p) for s, p in zip(slices, pieces)), \
            "grad_fn saw other rows than the slices scatter gives each device"
        single = numpy_grad_fn([w, b], x, y)  # one device, the whole batch
        for k in range(parts):
            assert len(got[k]) == 2, f"device {k}: {len(got[k])} gradients for 2 parameters"
            for j in range(2):
                assert_same_array(got[k][j], expected[k][j].numpy(),
                                  f"device {k}, parameter {j} (batch {n} over {parts} devices)",
                                  rtol=1e-5, atol=1e-8, dtype=False)
                assert_same_array(got[k][j], single[j], rtol=1e-5, atol=1e-8, dtype=False)


# -- 4. the parallel softmax cross-entropy -------------------------------------------------

def random_shards(seed, scale=3.0, shift=0.0):
    rng = np.random.default_rng(seed)
    parts = int(rng.integers(1, 5))
    widths = [int(w) for w in rng.integers(1, 7, size=parts)]
    n = int(rng.integers(1, 9))
    shards = [shift + scale * rng.normal(size=(n, w)) for w in widths]
    labels = rng.integers(0, sum(widths), size=n)
    return shards, labels


def watched(function, shards, labels):
    """Runs in the sandbox (in_sandbox), where the student's code runs: ``function(shards,
    labels)`` with NumPy's overflow, invalid and divide errors raised, not warned (an
    np.errstate in the grader's process does not reach the sandbox's), and the bytes of
    the largest NumPy array alive at any line of exercises.py it runs.

    The N x C matrix is caught by what it takes, not by the names that make it
    (np.zeros and slice assignment build it as well as np.concatenate): tracemalloc sees
    every array's data, and sys.settrace stops at each line. An array made and dropped
    within one line escapes, but not one that is kept to be used."""
    import sys
    import tracemalloc
    arrays = [tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)]
    largest = 0

    def line(frame, event, arg):
        nonlocal largest
        if event == "line":
            traces = tracemalloc.take_snapshot().filter_traces(arrays).traces
            largest = max([largest] + [t.size for t in traces])
        return line

    def call(frame, event, arg):
        return line if frame.f_code.co_filename.endswith("exercises.py") else None

    outer = sys.gettrace()
    tracemalloc.start()
    sys.settrace(call)
    try:
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            answer = function(shards, labels)
    finally:
        sys.settrace(outer)
        tracemalloc.stop()
    return answer, largest


def assert_no_full_logits(largest, shards):
    """The largest array ``watched`` saw is smaller than the N x C matrix, where that is
    larger than any array a right answer may hold: a shard (N x C_k), one number per row
    from each device (devices x N), one per class (C), a table of a shard's classes
    (C_k x C_k, np.eye(C_k) for one-hot labels), a shard's index table (2 x N x C_k:
    np.indices(shard.shape), whose int64 numbers take as many bytes as the shard's)."""
    n, widths = shards[0].shape[0], [s.shape[1] for s in shards]
    right = max(2 * n * max(widths), n * len(widths), sum(widths), max(widths) ** 2)
    full = n * sum(widths) * shards[0].itemsize
    if n * sum(widths) > right:
        assert largest < full, (
            f"shards of widths {widths}, {n} rows: an array of {largest} bytes was alive, "
            f"and the whole N x C matrix takes {full}: never build it; only vectors of N "
            f"numbers may cross between devices")


def minigraph_loss_and_grads(shards, labels):
    tensors = [mg.tensor(s, device=d, requires_grad=True)
               for s, d in zip(shards, device_names(len(shards)))]
    loss = mg.parallel.parallel_cross_entropy(tensors, mg.tensor(labels))
    loss.backward()
    return loss.item(), [t.grad.numpy() for t in tensors]


@pytest.mark.points(2)
@pytest.mark.forbid(*NO_FULL_LOGITS, why="only vectors of N numbers may cross between devices")
def test_parallel_cross_entropy_loss(exercises):
    run = in_sandbox(exercises, watched)
    for seed in SEEDS:
        shards, labels = random_shards(seed)
        expected, _ = minigraph_loss_and_grads(shards, labels)
        single = mg.cross_entropy(mg.tensor(np.concatenate(shards, axis=1)),
                                  mg.tensor(labels)).item()
        (loss, _), largest = run(exercises.parallel_cross_entropy, shards, labels)
        assert_no_full_logits(largest, shards)
        widths = [s.shape[1] for s in shards]
        assert np.isclose(float(loss), expected), (
            f"shards of widths {widths}: loss {float(loss)}, expected {expected}")
        assert np.isclose(float(loss), single), (
            f"shards of widths {widths}: loss {float(loss)}, expected {single} (one device)")


@pytest.mark.points(2)
@pytest.mark.forbid(*NO_FULL_LOGITS, why="only vectors of N numbers may cross between devices")
def test_parallel_cross_entropy_gradients(exercises):
    run = in_sandbox(exercises, watched)
    for seed in SEEDS:
        shards, labels = random_shards(seed)
        _, expected = minigraph_loss_and_grads(shards, labels)
        (_, grads), largest = run(exercises.parallel_cross_entropy, shards, labels)
        assert_no_full_logits(largest, shards)
        assert len(grads) == len(shards), f"{len(grads)} gradients for {len(shards)} shards"
        for k, (mine, theirs) in enumerate(zip(grads, expected)):
            assert_same_array(mine, theirs, f"gradient of shard {k}", rtol=1e-5, atol=1e-8,
                              dtype=False)


@pytest.mark.points(1)
@pytest.mark.forbid(*NO_FULL_LOGITS, why="only vectors of N numbers may cross between devices")
def test_parallel_cross_entropy_is_stable_for_large_logits(exercises):
    strict = in_sandbox(exercises, watched)
    for seed in SEEDS:
        shards, labels = random_shards(seed, scale=50.0, shift=1000.0)
        if seed % 2:  # rows 2000 apart: one maximum for all rows underflows the lower ones
            apart = 2000.0 * np.arange(len(labels))[:, None]
            shards = [s + apart for s in shards]
        expected, grads_expected = minigraph_loss_and_grads(shards, labels)
        (loss, grads), largest = strict(exercises.parallel_cross_entropy, shards, labels)
        assert_no_full_logits(largest, shards)
        assert np.isfinite(loss) and np.isclose(float(loss), expected), (
            f"shards of widths {[s.shape[1] for s in shards]}, logits near 1000: loss "
            f"{float(loss)}, expected {expected}")
        # (zip would stop at the shorter list: no gradients at all would pass)
        assert len(grads) == len(shards), "one gradient per shard"
        for k, (mine, theirs) in enumerate(zip(grads, grads_expected)):
            assert_same_array(mine, theirs, f"gradient of shard {k}", rtol=1e-5, atol=1e-8,
                              dtype=False)
    # A confident row: its loss, log(1 + 3 e^-30) = 2.8e-13, is about float64's step at
    # M = 1030 (2.3e-13): log(sumexp) + M - z_label rounds it to a multiple of that step
    # (19% off here), the label's logit shifted by M first, z_label - M = 0, keeps it to
    # the 1e-4 of log(sumexp) near 1 (closed form: log1p; PyTorch's cross_entropy agrees).
    shards = [np.array([[1030.0, 1000.0]]), np.array([[1000.0, 1000.0]])]
    loss, _ = exercises.parallel_cross_entropy(shards, np.array([0]))
    expected = np.log1p(3 * np.exp(-30.0))
    assert np.isclose(float(loss), expected, rtol=1e-2, atol=0), \
        f"loss {float(loss):.6g} of a confident row, expected log(1 + 3 e^-30) = {expected:.6g}"
    # Rows of different scales: each row needs its own M (closed form: the rows'
    # log-sum-exp, each shifted by its own maximum, minus the label's logit)
    shards = [np.array([[0.0, 1.0], [1000.0, 1001.0]]), np.array([[2.0], [1002.0]])]
    (loss, _), _ = strict(exercises.parallel_cross_entropy, shards, np.array([0, 2]))
    lse = np.log(np.exp(-2.0) + np.exp(-1.0) + 1.0)  # log sum exp(z - max z), both rows
    expected = np.mean([2.0 + lse - 0.0, 1002.0 + lse - 1002.0])  # max + lse - z_label
    assert np.isclose(float(loss), expected), (
        f"loss {float(loss):.6g} of rows [0, 1, 2] (label 0) and [1000, 1001, 1002] (label 2), "
        f"expected {expected:.6g}: subtract each row's own maximum")
