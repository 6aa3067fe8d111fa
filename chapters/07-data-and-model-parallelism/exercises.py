"""Chapter 07, data and model parallelism: the exercises.

Write each function below where it says ``raise NotImplementedError``; then run

    minigraph grade chapters/07-data-and-model-parallelism

Everything here works on plain NumPy arrays, so that you write the algorithms without
minigraph's classes. A "device" is a position in a list: ``arrays[i]`` is the array that
device i holds. Moving an array from device i to device j is simply handing it over;
what matters is *what* moves and *how many bytes* (``array.nbytes``).

The tests draw random inputs (fixed seeds), put the same values on minigraph's virtual
devices ``cpu``, ``cpu:1``, ... and compare what you return with
``mg.parallel.scatter``, ``mg.parallel.allreduce_with_stats``,
``mg.parallel.data_parallel_grads`` and ``mg.parallel.parallel_cross_entropy``
(``minigraph/parallel/data_parallel.py`` and ``minigraph/parallel/model_parallel.py``).
"""

import numpy as np


# -- 1. scatter ----------------------------------------------------------------------------

def scatter_bounds(n, parts):
    """Where a batch of ``n`` rows is cut into ``parts`` slices, one per device.

    Returns the ``parts + 1`` boundaries ``[b_0 = 0, b_1, ..., b_parts = n]``; device k
    gets rows ``b_k .. b_{k+1} - 1``. The slices differ in size by at most one row, and
    the larger ones come last (``b_k = floor(n * k / parts)``). Slices may be empty when
    ``n < parts``.

    >>> scatter_bounds(10, 3)
    [0, 3, 6, 10]
    """
    ### BEGIN SOLUTION
    return [n * k // parts for k in range(parts + 1)]
    ### END SOLUTION


# -- 2. allreduce --------------------------------------------------------------------------

def naive_allreduce(arrays):
    """Every device gets the sum of ``arrays`` (one array per device, same shape).

    The naive way (d2l's ``allreduce``): every other device sends its array to device
    0, device 0 adds them up, and sends the sum back to every other device.

    Returns ``(sums, sent)``: ``sums[i]`` is device i's copy of the sum (a new array of
    the input's shape; no two devices share one array object), and ``sent[i]`` is the
    number of bytes device i sent: count them as the arrays are handed over, as
    minigraph's counters do, rather than from a formula. With S bytes per array and n
    devices, device 0 sends (n - 1) S and each other device S.
    """
    ### BEGIN SOLUTION
    n = len(arrays)
    sent = [0] * n
    total = np.array(arrays[0], copy=True)
    for i in range(1, n):  # device i hands its array to device 0
        arriving = np.array(arrays[i], copy=True)
        sent[i] += arriving.nbytes
        total = total + arriving
    sums = [np.array(total, copy=True)]
    for i in range(1, n):  # device 0 hands a copy of the sum to device i
        copy = np.array(total, copy=True)
        sent[0] += copy.nbytes
        sums.append(copy)
    return sums, sent
    ### END SOLUTION


def chunk_bounds(size, n):
    """Where the ring cuts a flat array of ``size`` elements into ``n`` chunks:
    chunk c is elements ``bounds[c] .. bounds[c + 1] - 1`` (the same rule as scatter)."""
    return [size * c // n for c in range(n + 1)]


def ring_reduce_scatter(chunks):
    """The first half of the ring allreduce: n - 1 steps of reduce-scatter.

    ``chunks[i][c]`` is device i's chunk c (a 1-D array); there are n devices and n
    chunks. The devices form a ring: device i sends only to device (i + 1) % n.

    In step t = 0, 1, ..., n - 2, *every* device i at the same time sends its current
    version of chunk (i - t) % n to device (i + 1) % n, which adds it to its own version
    of that chunk. (All sends of a step carry the values from before the step.)

    After the n - 1 steps, device i holds the complete sum of chunk (i + 1) % n; its other
    chunks hold partial sums.

    Returns ``(chunks, sent)``: the chunks after the last step, in the same layout (new
    lists; do not change the input arrays), and ``sent[i]``, the bytes device i sent.
    """
    ### BEGIN SOLUTION
    n = len(chunks)
    chunks = [[np.array(c, copy=True) for c in device] for device in chunks]
    sent = [0] * n
    for t in range(n - 1):
        moves = [(i, (i - t) % n) for i in range(n)]
        pieces = [chunks[i][c].copy() for i, c in moves]  # what leaves, before anyone adds
        for (i, c), piece in zip(moves, pieces):
            j = (i + 1) % n
            chunks[j][c] = chunks[j][c] + piece
            sent[i] += piece.nbytes
    return chunks, sent
    ### END SOLUTION


def ring_all_gather(chunks):
    """The second half of the ring allreduce: n - 1 steps of all-gather.

    On entry device i holds the complete chunk (i + 1) % n (what ``ring_reduce_scatter``
    leaves); its other chunks may hold anything. In step t = 0, 1, ..., n - 2, every
    device i sends its chunk (i + 1 - t) % n to device (i + 1) % n, which *replaces* its
    own version of that chunk with it. After n - 1 steps every device holds every
    complete chunk.

    Returns ``(chunks, sent)`` as ``ring_reduce_scatter`` does.
    """
    ### BEGIN SOLUTION
    n = len(chunks)
    chunks = [[np.array(c, copy=True) for c in device] for device in chunks]
    sent = [0] * n
    for t in range(n - 1):
        moves = [(i, (i + 1 - t) % n) for i in range(n)]
        pieces = [chunks[i][c].copy() for i, c in moves]
        for (i, c), piece in zip(moves, pieces):
            chunks[(i + 1) % n][c] = piece
            sent[i] += piece.nbytes
    return chunks, sent
    ### END SOLUTION


def ring_allreduce(arrays):
    """Every device gets the sum of ``arrays``, by the ring algorithm.

    Flatten each device's array, cut it into n chunks with ``chunk_bounds``, run
    ``ring_reduce_scatter`` then ``ring_all_gather``, and put each device's chunks back
    together in the input's shape.

    Returns ``(sums, sent)`` as ``naive_allreduce`` does; here ``sent[i]`` is the bytes
    device i sent in both halves, about 2 (n - 1) / n S for every device.
    """
    ### BEGIN SOLUTION
    n = len(arrays)
    shape = np.shape(arrays[0])
    flat = [np.asarray(a).reshape(-1) for a in arrays]
    cuts = chunk_bounds(flat[0].size, n)
    chunks = [[f[cuts[c]:cuts[c + 1]] for c in range(n)] for f in flat]
    chunks, sent1 = ring_reduce_scatter(chunks)
    chunks, sent2 = ring_all_gather(chunks)
    sums = [np.concatenate(device).reshape(shape) for device in chunks]
    return sums, [a + b for a, b in zip(sent1, sent2)]
    ### END SOLUTION


# -- 3. a data-parallel gradient -----------------------------------------------------------

def data_parallel_gradient(grad_fn, params, x, y, parts):
    """The gradient of a batch-mean loss, computed as ``parts`` devices would.

    ``grad_fn(params, xk, yk)`` returns the list of gradients (NumPy arrays, one per
    parameter) of the *mean* loss over the rows ``xk, yk``. Cut the batch with
    ``scatter_bounds``; let each device compute the gradient of its own slice; since
    each slice's loss is a mean over its n_k rows, weight it by n_k / N before adding
    (the mean of the slices' means is not the batch's mean when the slices differ in
    size); then add the weighted gradients across devices (with your ``ring_allreduce``,
    or simply with ``sum``). The batch has at least ``parts`` rows.

    Returns ``grads[k][j]``: device k's copy of the gradient of parameter j (equal on
    every device), the layout of ``mg.parallel.data_parallel_grads``.
    """
    ### BEGIN SOLUTION
    n = len(x)
    bounds = scatter_bounds(n, parts)
    local = []
    for k in range(parts):
        a, b = bounds[k], bounds[k + 1]
        local.append([g * ((b - a) / n) for g in grad_fn(params, x[a:b], y[a:b])])
    summed = [ring_allreduce([local[k][j] for k in range(parts)])[0]
              for j in range(len(params))]
    return [[summed[j][k] for j in range(len(params))] for k in range(parts)]
    ### END SOLUTION


# -- 4. model parallelism: the memory-balanced cross-entropy -------------------------------

def parallel_cross_entropy(shards, labels):
    """Mean softmax cross-entropy over class-sharded logits, and its gradients.

    ``shards[k]`` (shape (N, C_k)) holds the logits of classes ``offset_k .. offset_k +
    C_k - 1`` on device k, where ``offset_k = C_0 + ... + C_{k-1}``; ``labels`` (shape
    (N,)) are global class indices. Never build the (N, C) matrix: only vectors of N
    numbers may cross between devices.

    1. each device: the maximum of each row of its shard; the maxima meet, and the
       global row maximum M (N numbers) goes back to every device;
    2. each device: the row sums of exp(z - M) over its classes; the sums meet:
       ``sumexp`` (N numbers);
    3. the logit of each row's label comes from the device that holds that class;
    4. the loss is the mean over rows of ``log(sumexp) - (z_label - M)`` (the label's
       logit shifted as the others: ``log(sumexp) + M - z_label`` subtracts two nearly
       equal numbers where the loss is small, and loses it to rounding);
    5. each device's gradient is ``(p - y) / N`` for its own classes, where
       ``p = exp(z - M) / sumexp`` and y is the one-hot label (1 where the row's label
       is one of the shard's classes).

    Returns ``(loss, grads)``: the loss as a Python float, ``grads[k]`` of shape (N, C_k).
    Subtracting M keeps every exp() finite even for logits in the thousands.
    """
    ### BEGIN SOLUTION
    labels = np.asarray(labels)
    n = labels.shape[0]
    rows = np.arange(n)
    offsets = np.cumsum([0] + [s.shape[1] for s in shards[:-1]])
    m = np.max([s.max(axis=1) for s in shards], axis=0)           # N numbers per device
    exps = [np.exp(s - m[:, None]) for s in shards]
    sumexp = np.sum([e.sum(axis=1) for e in exps], axis=0)        # N numbers per device
    picked = np.zeros(n)
    for s, offset in zip(shards, offsets):
        local = labels - offset
        mine = (local >= 0) & (local < s.shape[1])
        picked[mine] += s[rows[mine], local[mine]] - m[mine]      # N numbers per device
    loss = float(np.mean(np.log(sumexp) - picked))
    grads = []
    for e, s, offset in zip(exps, shards, offsets):
        g = e / sumexp[:, None]
        local = labels - offset
        mine = (local >= 0) & (local < s.shape[1])
        g[rows[mine], local[mine]] -= 1.0
        grads.append(g / n)
    return loss, grads
    ### END SOLUTION
