"""Chapter 01 exercises: tensors and devices.

Write the body of each function below (replace the ``raise NotImplementedError`` line),
then grade your work from the repository root::

    minigraph grade chapters/01-tensors-and-devices

The graded tests compare your functions with minigraph's own implementation on random
inputs (fixed seeds), so a function that agrees with the library everywhere gets full
marks. The reading is ``README.md`` in this folder; the notebook is
``notebooks/01-tensors-and-devices.ipynb``.

Exercises
---------
1. ``broadcast_shape(a, b)``: NumPy's broadcasting rule for two shapes.
2. ``sum_to(g, shape)``: undo a broadcast by summing, the adjoint of broadcasting.
3. ``result_dtype(a, b)``: the dtype of ``a + b`` under NumPy 2's promotion rules,
   Python numbers being "weak".
4. ``tensor_nbytes(shape, dtype)`` and ``bytes_per_device(tensors)``: per-device memory.
5. ``gpu_time(work, synchronize, clock)``: timing asynchronous work correctly.
"""

from __future__ import annotations

import math
import time

import numpy as np

# The dtypes minigraph supports and the size of one element of each, in bytes.
ITEMSIZE = {"bool": 1, "int32": 4, "int64": 8, "float32": 4, "float64": 8}


# ---------------------------------------------------------------------------------------
# Exercises 1 and 2. Broadcasting, and its adjoint
# ---------------------------------------------------------------------------------------

def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the result when arrays of shapes ``a`` and ``b`` meet in ``x + y``.

    NumPy's rule: line the two shapes up on the *right*; a missing leading axis counts
    as size 1; on each axis the sizes must be equal, or one of them must be 1 (and then
    the other one wins). Anything else raises ``ValueError``.

    >>> broadcast_shape((8, 1, 6, 1), (7, 1, 5))
    (8, 7, 6, 5)
    >>> broadcast_shape((3,), (4,))
    Traceback (most recent call last):
    ValueError: ...

    Note that a size of 0 is an ordinary size: (0,) meets (1,) as (0,), and (0,) does
    not broadcast with (3,).
    """
    ### BEGIN SOLUTION
    a, b = tuple(a), tuple(b)
    ndim = max(len(a), len(b))
    a = (1,) * (ndim - len(a)) + a
    b = (1,) * (ndim - len(b)) + b
    out = []
    for axis, (m, n) in enumerate(zip(a, b)):
        if m == n or n == 1:
            out.append(m)
        elif m == 1:
            out.append(n)
        else:
            raise ValueError(f"shapes {a} and {b} do not broadcast: axis {axis} has "
                             f"sizes {m} and {n}")
    return tuple(out)
    ### END SOLUTION


def sum_to(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum the array ``g`` down to ``shape``: undo broadcasting ``shape`` to ``g.shape``.

    If ``x`` of shape ``shape`` was broadcast to ``g.shape`` in the forward computation,
    each element of ``x`` was used several times; its gradient is the *sum* of the
    gradients of all its copies. So: sum over the leading axes that broadcasting added,
    then (keeping the axis) over every axis where ``shape`` has size 1 and ``g`` does
    not. Return a NumPy array of exactly ``shape``.

    >>> sum_to(np.ones((2, 3, 4)), (3, 1)).tolist()
    [[8.0], [8.0], [8.0]]

    You may assume that ``shape`` broadcasts to ``g.shape``.
    """
    ### BEGIN SOLUTION
    g = np.asarray(g)
    shape = tuple(shape)
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# Exercise 3. Dtypes
# ---------------------------------------------------------------------------------------

def result_dtype(a: "str | bool | int | float", b: "str | bool | int | float") -> str:
    """The dtype name of ``x + y``, where each operand is described by ``a`` or ``b``.

    An operand is either a dtype *name* (``"bool"``, ``"int32"``, ``"int64"``,
    ``"float32"``, ``"float64"``), standing for a tensor of that dtype, or a Python
    number (``True``, ``2``, ``0.5``), which is *weak* (NumPy 2, NEP 50):

    * two tensors: the smallest dtype that holds both kinds of value; bool < integers <
      floats, a wider type wins within a kind, and ``float32`` with any integer tensor
      gives ``float64`` (float32 cannot hold every int32 exactly);
    * a tensor and a Python number: the tensor's dtype wins *unless* the number is of a
      higher kind: an ``int`` meeting a ``bool`` tensor gives ``"int64"``, a ``float``
      meeting a bool or integer tensor gives ``"float64"``;
    * at least one of ``a`` and ``b`` is a dtype name.

    >>> result_dtype("float32", 2.0), result_dtype("int32", "float32"), result_dtype("bool", 1)
    ('float32', 'float64', 'int64')
    """
    ### BEGIN SOLUTION
    kind = {"bool": 0, "int32": 1, "int64": 1, "float32": 2, "float64": 2}
    strong = [v for v in (a, b) if isinstance(v, str)]
    weak = [v for v in (a, b) if not isinstance(v, str)]
    if len(strong) == 2:
        s, t = strong
        if s == t:
            return s
        if kind[s] == kind[t]:  # same kind: the wider one
            return max(s, t, key=lambda d: ITEMSIZE[d])
        lo, hi = sorted(strong, key=kind.__getitem__)
        if lo == "bool" or hi == "float64":
            return hi
        return "float64"  # float32 with an integer tensor
    (s,), (w,) = strong, weak
    weak_kind = 2 if isinstance(w, float) else 0 if isinstance(w, bool) else 1
    if weak_kind <= kind[s]:
        return s
    return "int64" if weak_kind == 1 else "float64"
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# Exercise 4. Memory per device
# ---------------------------------------------------------------------------------------

def tensor_nbytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of memory a dense tensor of ``shape`` and ``dtype`` occupies.

    One element of each dtype takes ``ITEMSIZE[dtype]`` bytes; a shape ``()`` holds
    one element and a shape with a 0 in it none.

    >>> tensor_nbytes((224, 224, 3), "float32")
    602112
    """
    ### BEGIN SOLUTION
    return math.prod(shape) * ITEMSIZE[dtype]
    ### END SOLUTION


def bytes_per_device(tensors: list) -> dict[str, int]:
    """Total bytes of ``tensors`` (minigraph tensors) on each device, by device name.

    Only devices that hold at least one of the tensors appear in the result, e.g.
    ``{"cpu": 800, "cpu:2": 24}``. Every tensor in the list owns its memory (none is a
    view of another), so this is what ``mg.device(name).live_bytes`` grows by when the
    tensors are made.
    """
    ### BEGIN SOLUTION
    total: dict[str, int] = {}
    for t in tensors:
        name = t.device.name
        total[name] = total.get(name, 0) + tensor_nbytes(t.shape, t.dtype)
    return total
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# Exercise 5. Asynchronous execution
# ---------------------------------------------------------------------------------------

def gpu_time(work, synchronize, clock=time.perf_counter) -> float:
    """Seconds the device needs for ``work()``, measured on the host's ``clock``.

    On a GPU, ``work()`` only *queues* kernels and returns long before they have run;
    ``synchronize()`` blocks until everything queued so far has finished (with CuPy:
    ``cupy.cuda.Device().synchronize``). A correct measurement

    * first waits for work queued *before* (so that it is not counted),
    * reads the clock, calls ``work()`` exactly once,
    * waits until the device has finished it, and reads the clock again.

    Return the difference of the two clock readings.
    """
    ### BEGIN SOLUTION
    synchronize()
    start = clock()
    work()
    synchronize()
    return clock() - start
    ### END SOLUTION


class SimulatedGPU:
    """A pretend GPU with one queue and a virtual clock, to try ``gpu_time`` without one.

    ``launch(seconds)`` costs the host ``launch_overhead`` seconds and queues a kernel
    that runs ``seconds`` on the device once the kernels before it are done;
    ``synchronize()`` makes the host wait for the queue to drain; ``clock()`` is the
    host's time. For example::

        gpu = SimulatedGPU()
        gpu_time(lambda: [gpu.launch(1e-3) for _ in range(10)], gpu.synchronize, gpu.clock)
        # about 0.010005: ten kernels of a millisecond, plus the first launch
    """

    def __init__(self, launch_overhead: float = 5e-6):
        self.launch_overhead = launch_overhead
        self.host = 0.0          # the host's clock
        self.device_free = 0.0   # when the device finishes what is queued

    def clock(self) -> float:
        return self.host

    def launch(self, seconds: float) -> None:
        self.host += self.launch_overhead
        self.device_free = max(self.device_free, self.host) + seconds

    def synchronize(self) -> None:
        self.host = max(self.host, self.device_free)
