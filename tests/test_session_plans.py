"""A Session keeps what each run's fetches and feeds need (its plan: the nodes in FIFO
order, their dependency counts, its memory plan), and a partition across devices with
its parts' plans. It kept every one it ever made: ``for y in ys: sess.run(y)`` over 150
fetches of a 1,201-node graph grew from 53 to 242 MB, and a graph that grows between
runs made a new key at each size. At most ``_MOST_PLANS`` are kept now, the oldest
dropped first, and a dropped plan is made again when its fetches come back. Oracles:
the NumPy values of the same chains."""

import numpy as np
import pytest

import minigraph as mg


def _chain(n, device=None):
    """x, and the nodes y_k = y_(k-1) * 1.01 + 1 for k = 1..n, on ``device`` for odd k
    (a partition across devices) when given."""
    x = mg.placeholder((), name="x")
    ys, y = [], x
    for k in range(n):
        if device is not None and k % 2:
            with mg.device(device):
                y = y * 1.01 + 1.0
        else:
            y = y * 1.01 + 1.0
        ys.append(y)
    return x, ys


def _expected(x, k):
    y = x
    for _ in range(k + 1):
        y = y * 1.01 + 1.0
    return y


def test_many_fetches_keep_a_bounded_number_of_plans():
    with mg.Graph().as_default():
        x, ys = _chain(150)
        sess = mg.Session()
        for k, y in enumerate(ys):
            assert sess.run(y, {x: 2.0}) == pytest.approx(_expected(2.0, k))
        assert len(sess._plans) <= 64  # (session._MOST_PLANS)
        # (the first fetch's plan was dropped: made again, with the same value)
        assert sess.run(ys[0], {x: 3.0}) == pytest.approx(_expected(3.0, 0))


def test_a_graph_that_grows_between_runs_keeps_a_bounded_number_of_plans():
    with mg.Graph().as_default():
        x = mg.placeholder((), name="x")
        sess, y = mg.Session(), x
        for k in range(100):
            y = y * 1.01 + 1.0
            assert sess.run(y, {x: 1.0}) == pytest.approx(_expected(1.0, k))
        assert len(sess._plans) <= 64  # (session._MOST_PLANS)


def test_partitions_across_devices_are_bounded_and_stay_right():
    with mg.Graph().as_default():
        x, ys = _chain(90, device="cpu:1")
        sess = mg.Session()
        for k in range(1, 90, 1):
            assert sess.run(ys[k], {x: 0.5}) == pytest.approx(_expected(0.5, k))
        assert len(sess._plans) <= 64  # (session._MOST_PLANS)
        for k in (1, 2, 89):  # (dropped, made again; kept, run again)
            assert sess.run(ys[k], {x: 0.5}) == pytest.approx(_expected(0.5, k))


def test_a_plan_used_often_is_kept_however_many_others_come():
    """The oldest plan was dropped first, however often it was used: a fetch run at every
    step of a loop over 65 others was planned again every 63 steps (a 3,000-node chain:
    15 times slower). The least recently used goes first now."""
    with mg.Graph().as_default():
        x, ys = _chain(100)
        sess = mg.Session()
        assert sess.run(ys[-1], {x: 1.0}) == pytest.approx(_expected(1.0, 99))
        hot = [p for p in sess._plans.values()]
        for k, y in enumerate(ys[:-1]):
            assert sess.run(y, {x: 1.0}) == pytest.approx(_expected(1.0, k))
            assert sess.run(ys[-1], {x: 1.0}) == pytest.approx(_expected(1.0, 99))
        assert any(p is hot[0] for p in sess._plans.values())  # (never planned again)


def test_the_plans_of_dropped_partitions_go_with_them():
    """A partition's parts' plans were kept in a table keyed weakly by each part's graph,
    which its plan's nodes hold: never freed (299 runs: 598 part plans, 153 MB)."""
    with mg.Graph().as_default():
        x, ys = _chain(200, device="cpu:1")
        sess = mg.Session()
        for k in range(1, 200):
            assert sess.run(ys[k], {x: 0.5}) == pytest.approx(_expected(0.5, k))
        parts = sum(len(list(p)) for p in sess._plans.values()
                    if isinstance(p, mg.runtime.partition.Partition))
        assert len(sess._part_plans) <= parts
