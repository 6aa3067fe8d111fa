"""Checks of a graph that spans two devices, shared by the tests on virtual CPU devices
(test_cost_model.py, test_multidevice.py) and on a GPU (test_gpu.py): the same graph,
the same closed forms, another second device."""

from __future__ import annotations

import numpy as np

import minigraph as mg


def check_adjoints_come_back(second: str) -> None:
    """tanh(x) on cpu is sent to ``second``, which sums exp of it; the gradient comes
    back. Its value is the closed form exp(tanh x)(1 - tanh(x)^2), and the counters say
    what crossed: the activation out and its adjoint back, and only the activation when
    the forward alone runs."""
    with mg.Graph() as g:
        with mg.device("cpu"):
            x = mg.placeholder((40, 5), name="x")
            a = mg.tanh(x)
        with mg.device(second):
            y = mg.sum(mg.exp(a.to(second)))
        (gx,) = mg.gradients(y, [x])
    X = np.linspace(-1, 1, 200).reshape(40, 5)
    sess = mg.Session(g)
    got = sess.run(gx, {x: X})
    np.testing.assert_allclose(got, np.exp(np.tanh(X)) * (1 - np.tanh(X) ** 2), rtol=1e-12)
    assert sess.last_run.bytes_moved == {("cpu", second): X.nbytes, (second, "cpu"): X.nbytes}
    sess.run(y, {x: X})
    assert sess.last_run.bytes_moved == {("cpu", second): X.nbytes}


def check_auto_place_keeps_copies(devices: list[str], destination: str) -> None:
    """x.to(destination) in a graph given to auto_place over ``devices``: every copy
    (a primitive whose table entry says transfer) must stay on the device it copies to,
    and the run must equal NumPy's (sin(x) + x) @ x + tanh(x)."""
    with mg.Graph() as g:
        x = mg.placeholder((8, 8), name="x")
        a = x.to(destination)
        b = mg.sin(a) + x  # (a value of the destination beside one of the host)
        c = (b @ a).to("cpu") + mg.tanh(x)
    placed = mg.auto_place(g, devices)
    for n in placed.graph.nodes:
        if n.prim is not None and n.prim.transfer:
            assert n.device is mg.get_device(n.params["device"]), n.name
    feed = np.arange(64.0).reshape(8, 8) / 64
    np.testing.assert_allclose(mg.Session(placed.graph).run(placed[c], {placed[x]: feed}),
                               (np.sin(feed) + feed) @ feed + np.tanh(feed), rtol=1e-12)
