"""``mg.checkpoint``: recomputation instead of keeping intermediates.

Gradients through a checkpoint equal PyTorch's (``torch.utils.checkpoint``, plain
autograd, ``torch.func``) and finite differences, on the tape, in every ``mg.grad`` mode,
nested in jacfwd/jacrev/vmap/hessian and in itself; never one minigraph mode against
another. The memory tests measure bytes (the device's counters, the runtime's, and
NumPy's allocations through tracemalloc), never time. Combinations that are not
supported raise an error that names them.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigraph as mg
from minigraph import nn
from minigraph.autodiff.checkpoint import CheckpointError
from minigraph.errors import GradientError
from minigraph.parallel import pipeline as pp

torch = pytest.importorskip("torch")
tf = pytest.importorskip("torch.func")
from torch.utils.checkpoint import checkpoint as torch_checkpoint  # noqa: E402

RNG = np.random.default_rng(8)


# -- the functions: a tanh MLP cut into segments, in minigraph and in PyTorch ------------------

def layers(h, *params):
    """tanh(h @ w + b) for each (w, b) in params."""
    for w, b in zip(params[0::2], params[1::2]):
        h = mg.tanh(h @ w + b)
    return h


def layers_torch(h, *params):
    for w, b in zip(params[0::2], params[1::2]):
        h = torch.tanh(h @ w + b)
    return h


segment = mg.checkpoint(layers)


def mlp_params(depth, width, rng=RNG):
    out = []
    for _ in range(depth):
        out += [rng.normal(size=(width, width)) / np.sqrt(width), rng.normal(size=width) * 0.1]
    return out


def cuts(depth, segments):
    """The layer indices of each segment: contiguous, as even as can be."""
    return [list(c) for c in np.array_split(np.arange(depth), segments) if len(c)]


def chain(x, params, segments, run):
    """The MLP with each segment given to ``run(fn, h, *its params)``."""
    h = x
    for c in cuts(len(params) // 2, segments):
        h = run(h, *[params[2 * i + j] for i in c for j in (0, 1)])
    return h


def loss_mg(x, *params, segments=2):
    h = chain(x, params, segments, segment)
    return (h * h).mean()


def loss_plain_torch(x, *params):
    h = layers_torch(x, *params)
    return (h * h).mean()


def as_torch(values, requires_grad=False):
    return [torch.tensor(np.asarray(v), dtype=torch.float64, requires_grad=requires_grad)
            for v in values]


def close(got, want, rtol=1e-11, atol=1e-13):
    got = got.numpy() if hasattr(got, "numpy") and not isinstance(got, torch.Tensor) else got
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol)


# -- the tape: backward() -------------------------------------------------------------------------

@pytest.mark.parametrize("segments", [1, 2, 3, 5])
def test_backward_equals_torch_utils_checkpoint(segments, backend):
    depth, x0 = 5, RNG.normal(size=(7, 4))
    p0 = mlp_params(depth, 4)
    x = mg.tensor(x0, requires_grad=True)
    params = [mg.tensor(p, requires_grad=True) for p in p0]
    loss = loss_mg(x, *params, segments=segments)
    loss.backward()

    xt, *pt = as_torch([x0] + p0, requires_grad=True)
    h = chain(xt, pt, segments, lambda h, *p: torch_checkpoint(layers_torch, h, *p,
                                                                use_reentrant=False))
    expected = (h * h).mean()
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-13)
    for mine, theirs in zip([x] + params, [xt] + pt):
        close(mine.grad, theirs.grad)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_second_derivatives_on_the_tape_with_create_graph():
    x0, p0 = RNG.normal(size=(3, 3)), mlp_params(2, 3)
    x = mg.tensor(x0, requires_grad=True)
    params = [mg.tensor(p, requires_grad=True) for p in p0]
    loss_mg(x, *params, segments=1).backward(create_graph=True)
    (x.grad * x.grad).sum().backward()  # d/dparams of |d loss / dx|^2, through recomputation

    xt, *pt = as_torch([x0] + p0, requires_grad=True)
    loss_plain_torch(xt, *pt).backward(create_graph=True)  # both add up first and second
    (xt.grad * xt.grad).sum().backward()
    for mine, theirs in zip(params, pt):
        close(mine.grad, theirs.grad)


def test_intermediates_are_not_kept_and_the_peak_falls():
    """After the forward pass only the segment boundaries are alive; the backward's peak
    is one segment's insides more, far below keeping every layer's activations."""
    depth, width, batch, segments = 8, 32, 256, 4
    x = mg.tensor(RNG.normal(size=(batch, width)))
    params = [mg.tensor(p, requires_grad=True) for p in mlp_params(depth, width)]
    activation = batch * width * 8
    cpu = mg.device("cpu")
    measured = {}
    for name, run in (("plain", layers), ("checkpoint", segment)):
        gc.collect()
        base = cpu.live_bytes
        cpu.reset_peak()
        h = chain(x, params, segments, run)
        after_forward = cpu.live_bytes - base
        loss = (h * h).mean()
        del h
        loss.backward()
        del loss
        measured[name] = (after_forward, cpu.peak_bytes - base, cpu.live_bytes - base)
        for p in params:
            p.grad = None
    plain, ckpt = measured["plain"], measured["checkpoint"]
    assert ckpt[0] == segments * activation  # the boundaries: each segment's output
    assert plain[0] >= 2 * depth * activation  # each layer's pre-activation and tanh
    assert ckpt[1] <= 0.6 * plain[1]
    params_bytes = sum(p.data.nbytes for p in params)
    assert ckpt[2] <= params_bytes and plain[2] <= params_bytes  # nothing left behind


def test_the_backward_recomputes_only_what_the_rules_read():
    """On plain tensors the pullback is f's recorded graph, replayed with f's saved result
    given: the last layer's tanh, whose rule reads its result, and its matmul and add,
    which no rule reads, are not run again (JAX's remat with dead code elimination)."""
    from minigraph.autodiff.signature import programs, signature
    from minigraph.graph.topo import fifo_order, needed

    x = mg.tensor(RNG.normal(size=(5, 4)))
    params = [mg.tensor(p, requires_grad=True) for p in mlp_params(4, 4)]
    loss = (segment(x, *params) ** 2).sum()
    loss.backward()
    program = programs(layers, "checkpoint backward", ())[signature((x, *params))]
    fed = {id(n) for n in program.inputs}
    ops = [n.op for n in fifo_order(program.inputs[0].graph.nodes,
                                    needed(program.outputs, fed), fed) if id(n) not in fed]
    # 3 of the 4 layers recomputed; each layer's backward has its two matmuls
    assert ops.count("tanh") == 3 and ops.count("matmul") == 3 + 2 * 4
    xt, *pt = as_torch([x.numpy()] + [p.numpy() for p in params], requires_grad=True)
    (torch_checkpoint(layers_torch, xt, *pt, use_reentrant=False) ** 2).sum().backward()
    for mine, theirs in zip(params, pt):
        close(mine.grad, theirs.grad)


def _reads_a_global(h, w):
    return mg.tanh(h @ w) * SCALE


SCALE = mg.tensor(np.array([1.0, 2.0, 3.0]))


def _branches_on_a_value(h, w):
    y = h @ w
    if y.sum() > 0:  # Python control flow on a value: no graph can record it
        return mg.tanh(y)
    return mg.sin(y)


def _no_grad_inside(h, w):
    with mg.no_grad():
        s = mg.exp(w).sum()  # a constant for the gradient, as on the tape
    return mg.tanh(h @ w) * s


@pytest.mark.parametrize("fn, torch_fn", [
    (_reads_a_global, lambda h, w: torch.tanh(h @ w) * torch.tensor([1.0, 2.0, 3.0],
                                                                      dtype=torch.float64)),
    (_branches_on_a_value, lambda h, w: torch.tanh(h @ w) if (h @ w).sum() > 0
     else torch.sin(h @ w)),
    (_no_grad_inside, lambda h, w: torch.tanh(h @ w) * torch.exp(w).sum().detach()),
])
def test_the_replayed_pullback_gives_torchs_gradients_or_leaves_it_to_the_tape(fn, torch_fn):
    """A global read (a constant of the recorded graph), an if on a value (no graph: the
    tape recomputes), a no_grad block (a stop_gradient node): each as torch computes it,
    twice, with the global written in between (the recorded graph is then stale)."""
    for scale in (None, 5.0):
        if scale is not None:
            with mg.no_grad():
                SCALE[0] = scale
        h0, w0 = RNG.normal(size=(4, 3)), RNG.normal(size=(3, 3))
        h, w = mg.tensor(h0, requires_grad=True), mg.tensor(w0, requires_grad=True)
        (mg.checkpoint(fn)(h, w) ** 2).sum().backward()
        ht, wt = as_torch([h0, w0], requires_grad=True)
        if fn is _reads_a_global:
            torch_fn = (lambda c: lambda a, b: torch.tanh(a @ b) * torch.from_numpy(c))(
                SCALE.numpy().copy())
        (torch_checkpoint(torch_fn, ht, wt, use_reentrant=False) ** 2).sum().backward()
        close(h.grad, ht.grad)
        close(w.grad, wt.grad)
    with mg.no_grad():
        SCALE[0] = 1.0


def _scaled(h, w, s):
    return mg.tanh(h * w) * s


def test_the_replayed_pullback_keys_static_arguments_by_type_and_value():
    """0.0 == -0.0 and 1 == 1.0 == True in Python, but each records its own graph: the
    gradient for s = -0.0 has torch's signs after one for s = 0.0."""
    h0, w0 = np.abs(RNG.normal(size=(3, 2))), RNG.normal(size=(3, 2))
    for s in (0.0, -0.0, 1, 1.0, True):
        w = mg.tensor(w0, requires_grad=True)
        mg.checkpoint(_scaled)(mg.tensor(h0), w, s).sum().backward()
        wt = torch.tensor(w0, requires_grad=True)
        torch_checkpoint(lambda h, w: torch.tanh(h * w) * s, torch.tensor(h0), wt,
                         use_reentrant=False).sum().backward()
        close(w.grad, wt.grad)
        assert np.array_equal(np.signbit(w.grad.numpy()), np.signbit(wt.grad.numpy()))


def test_the_peak_falls_inside_mg_grad_too():
    depth, width, batch = 12, 32, 256
    x = mg.tensor(RNG.normal(size=(batch, width)))
    params = [mg.tensor(p) for p in mlp_params(depth, width)]
    cpu = mg.device("cpu")
    peaks = {}
    for name, run in (("plain", layers), ("checkpoint", segment)):
        def loss(*ps):
            h = chain(x, ps, 4, run)
            return (h * h).mean()
        gc.collect()
        base = cpu.live_bytes
        cpu.reset_peak()
        grads = mg.grad(loss, argnums=tuple(range(len(params))))(*params)
        peaks[name] = cpu.peak_bytes - base
        del grads
    assert peaks["checkpoint"] <= 0.6 * peaks["plain"]


def test_an_input_changed_in_place_after_the_forward_is_refused():
    """Recomputation reads the inputs again: one written in between would silently give
    another gradient, so the tape's write check refuses the backward."""
    x = mg.tensor(RNG.normal(size=(3, 3)))
    w = mg.tensor(RNG.normal(size=(3, 3)), requires_grad=True)
    y = mg.checkpoint(lambda x, w: mg.tanh(x @ w))(x, w).sum()
    with mg.no_grad():
        x -= 1.0
    with pytest.raises(GradientError, match="changed in place"):
        y.backward()


def test_under_no_grad_it_is_a_plain_call():
    x = mg.tensor(RNG.normal(size=(4, 3)), requires_grad=True)
    w = mg.tensor(RNG.normal(size=(3, 3)), requires_grad=True)
    with mg.no_grad():
        y = segment(x, w, mg.zeros(3))
    assert not y.requires_grad
    close(y, np.tanh(x.numpy() @ w.numpy()), rtol=1e-14)


def test_arguments_that_are_not_tensors_are_passed_through():
    """As torch.utils.checkpoint: numbers, strings and None reach f as they are."""
    def f(x, scale, kind, nothing):
        assert kind == "tanh" and nothing is None
        return mg.tanh(x * scale) if kind == "tanh" else x

    x0 = RNG.normal(size=(5,))
    for mode in ("tape", "graph"):
        g = mg.grad(lambda x: mg.checkpoint(f)(x, 3.0, "tanh", None).sum(), mode=mode)(x0)
        expected = tf.grad(lambda x: torch.tanh(x * 3.0).sum())(torch.tensor(x0))
        close(g, expected)


def test_a_module_checkpointed_gives_its_parameters_their_gradients():
    block = nn.Sequential(nn.Linear(4, 6, seed=1), nn.Tanh(), nn.Linear(6, 3, seed=2))
    x0 = RNG.normal(size=(5, 4))
    loss = (mg.checkpoint(block)(mg.tensor(x0)) ** 2).sum()
    loss.backward()
    torch_block = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(),
                                      torch.nn.Linear(6, 3)).double()
    with torch.no_grad():
        for theirs, mine in zip(torch_block.parameters(), block.parameters()):
            theirs.copy_(torch.tensor(mine.numpy()))
    out = torch_checkpoint(torch_block, torch.tensor(x0), use_reentrant=False)
    (out ** 2).sum().backward()
    for mine, theirs in zip(block.parameters(), torch_block.parameters()):
        close(mine.grad, theirs.grad)


# -- mg.grad in every mode; nested transformations -------------------------------------------------

def two_segments(x, w1, b1, w2, b2, w3, b3):
    h = segment(x, w1, b1, w2, b2)
    h = segment(h, w3, b3)
    return (h * h).mean()


@pytest.mark.parametrize("mode", mg.MODES)
def test_grad_in_every_mode_equals_torch_func(mode):
    args = [RNG.normal(size=(4, 3))] + mlp_params(3, 3)
    nums = tuple(range(len(args)))
    grads = mg.grad(two_segments, argnums=nums, mode=mode)(*args)
    expected = tf.grad(loss_plain_torch, argnums=nums)(*as_torch(args))
    for mine, theirs in zip(grads, expected):
        close(mine, theirs)


def test_source_transformation_writes_the_recomputation_into_the_reverse_sweep():
    args = [RNG.normal(size=(4, 3))] + mlp_params(3, 3)
    sg = mg.source_grad(two_segments, argnums=(1,))
    sg(*args)
    forward, reverse = sg.source.split("# reverse sweep")
    assert forward.count("mg.checkpoint(") == 2 and "mg.tanh" not in forward
    assert reverse.count("mg.tanh(") == 3  # the three layers, run again


def test_finite_differences():
    x, w = mg.tensor(RNG.normal(size=(3, 2))), mg.tensor(RNG.normal(size=(2, 2)))
    f = mg.checkpoint(lambda x, w: mg.sin(x @ w) * x.sum())
    assert mg.gradcheck(f, (x, w))
    assert mg.gradcheck(f, (x, w), mode="forward")


def test_nested_transformations_equal_torch_func():
    x0, w0 = RNG.normal(size=(3,)), RNG.normal(size=(3, 3)) / 2

    def f(x, w):
        return mg.tanh(w @ mg.sin(w @ x))

    def f_torch(x, w):
        return torch.tanh(w @ torch.sin(w @ x))

    g = mg.checkpoint(f)
    x, w, xt, wt = mg.tensor(x0), mg.tensor(w0), torch.tensor(x0), torch.tensor(w0)
    close(mg.jacfwd(g)(x, w), tf.jacfwd(f_torch)(xt, wt))
    close(mg.jacrev(g, argnums=1)(x, w), tf.jacrev(f_torch, argnums=1)(xt, wt))
    close(mg.hessian(lambda x: g(x, w).sum())(x), tf.hessian(lambda x: f_torch(x, wt).sum())(xt))
    v = RNG.normal(size=3)
    close(mg.jvp(mg.grad(lambda x: g(x, w).sum()), (x,), (mg.tensor(v),))[1],
          tf.jvp(tf.grad(lambda x: f_torch(x, wt).sum()), (xt,), (torch.tensor(v),))[1])
    close(mg.jvp(g, (x, w), (mg.tensor(v), mg.tensor(w0)))[1],
          tf.jvp(f_torch, (xt, wt), (torch.tensor(v), wt))[1])
    # gradients of gradients, the inner one through the checkpoint, tape and graph
    for mode in ("tape", "graph"):
        mixed = mg.grad(lambda w: mg.grad(lambda x, w: g(x, w).sum(), mode=mode)(x, w).sum(),
                        mode=mode)(w)
        close(mixed, tf.grad(lambda w: tf.grad(lambda x: f_torch(x, w).sum())(xt).sum())(wt))
    # the checkpoint inside a checkpoint
    outer = mg.checkpoint(lambda x, w: g(g(x, w), w))
    close(mg.grad(lambda w: outer(x, w).sum())(w),
          tf.grad(lambda w: f_torch(f_torch(xt, w), w).sum())(wt))


def test_vmap_of_a_checkpoint_and_per_example_gradients():
    xs, w0 = RNG.normal(size=(6, 3)), RNG.normal(size=(3, 3))
    g = mg.checkpoint(lambda x, w: mg.tanh(w @ x) * x)
    close(mg.vmap(g, in_axes=(0, None))(mg.tensor(xs), mg.tensor(w0)),
          np.tanh(xs @ w0.T) * xs, rtol=1e-14)
    per_example = mg.vmap(mg.grad(lambda w, x: g(x, w).sum()), in_axes=(None, 0))
    expected = tf.vmap(tf.grad(lambda w, x: (torch.tanh(w @ x) * x).sum()), in_dims=(None, 0))
    close(per_example(mg.tensor(w0), mg.tensor(xs)), expected(torch.tensor(w0), torch.tensor(xs)))
    # vmap outside, the gradient's recomputation batched with it; and vmap of vmap
    batched_twice = mg.vmap(mg.vmap(g, in_axes=(0, None)), in_axes=(0, None))
    xss = RNG.normal(size=(2, 6, 3))
    close(batched_twice(mg.tensor(xss), mg.tensor(w0)), np.tanh(xss @ w0.T) * xss, rtol=1e-14)


@settings(max_examples=12, deadline=None)
@given(depth=st.integers(1, 6), width=st.integers(1, 4), batch=st.integers(1, 3),
       data=st.data())
def test_any_cut_gives_torchs_gradients(depth, width, batch, data):
    segments = data.draw(st.integers(1, depth), label="segments")
    mode = data.draw(st.sampled_from(["tape", "graph"]), label="mode")
    rng = np.random.default_rng(depth * 100 + width * 10 + batch)
    args = [rng.normal(size=(batch, width))] + mlp_params(depth, width, rng)
    nums = tuple(range(len(args)))

    def loss(x, *params):
        h = chain(x, params, segments, segment)
        return (h * h).mean()

    grads = mg.grad(loss, argnums=nums, mode=mode)(*args)
    expected = tf.grad(loss_plain_torch, argnums=nums)(*as_torch(args))
    for mine, theirs in zip(grads, expected):
        close(mine, theirs)


# -- graphs: one node forward, one node backward -------------------------------------------------

def test_in_a_graph_a_checkpoint_is_one_node_and_its_gradient_one_more():
    x0, w0 = RNG.normal(size=(5, 3)), RNG.normal(size=(3, 3))
    with mg.Graph() as g:
        x = mg.placeholder((5, 3), name="x")
        w = mg.placeholder((3, 3), name="w")
        y = mg.checkpoint(lambda x, w: mg.tanh(mg.tanh(x @ w) @ w))(x, w)
        loss = (y * y).sum()
        gx, gw = mg.gradients(loss, [x, w])
    ops = [n.op for n in g.nodes]
    assert ops.count("checkpoint") == 2 and "tanh" not in ops and "matmul" not in ops
    got = mg.Session(g, workers=2).run([loss, gx, gw], {x: x0, w: w0})
    xt, wt = as_torch([x0, w0], requires_grad=True)
    expected = (torch.tanh(torch.tanh(xt @ wt) @ wt) ** 2).sum()
    expected.backward()
    close(got[0], expected)
    close(got[1], xt.grad)
    close(got[2], wt.grad)


def test_a_traced_function_replays_its_checkpoint_node_for_the_tape():
    """mg.trace compiles the checkpoint node; a tape gradient through the traced function
    replays it through bind, and the tape records the checkpoint as one entry."""
    x0, w0 = RNG.normal(size=(4, 3)), RNG.normal(size=(3, 3))
    f = mg.trace(lambda x, w: (mg.checkpoint(lambda x, w: mg.tanh(x @ w))(x, w) ** 2).sum())
    assert [n.op for n in f.graph(mg.tensor(x0), mg.tensor(w0)).nodes].count("checkpoint") == 1
    w = mg.tensor(w0, requires_grad=True)
    f(mg.tensor(x0), w).backward()
    wt = torch.tensor(w0, requires_grad=True)
    (torch.tanh(torch.tensor(x0) @ wt) ** 2).sum().backward()
    close(w.grad, wt.grad)


def test_compiled_graph_mode_allocates_less():
    """NumPy's own allocations (tracemalloc) during one compiled graph-mode gradient:
    the segments' insides live only while their nodes run. (A compiled graph already
    writes many results in place, so it takes a deeper net than the tape to show it.)"""
    depth, width, batch = 32, 32, 256
    x = RNG.normal(size=(batch, width))
    params = [mg.tensor(p) for p in mlp_params(depth, width)]
    nums = tuple(range(len(params)))
    peaks = {}
    for name, run in (("plain", layers), ("checkpoint", segment)):
        def loss(*ps):
            h = chain(mg.tensor(x), ps, 8, run)
            return (h * h).mean()
        loss.__name__ = f"loss_{name}"
        step = mg.grad(loss, argnums=nums, mode="graph")
        step(*params)  # build and compile once
        gc.collect()
        tracemalloc.start()
        try:
            step(*params)
            peaks[name] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks["checkpoint"] <= 0.6 * peaks["plain"]


# -- what is refused, by name ---------------------------------------------------------------------

def test_errors_name_what_is_not_supported():
    x = mg.tensor(RNG.normal(size=(3,)))
    w = mg.tensor(RNG.normal(size=(3,)), requires_grad=True)
    with pytest.raises(CheckpointError, match="returns one tensor"):
        mg.checkpoint(lambda x: (x, x))(x)
    # a closure over a tensor that needs a gradient would silently get none
    with pytest.raises(CheckpointError, match="requires a gradient.*Pass it as an argument"):
        mg.checkpoint(lambda x: x * w)(x)
    # ... or over a value of an enclosing transformation
    with pytest.raises(CheckpointError, match="value of a transformation"):
        mg.grad(lambda v: mg.checkpoint(lambda x: x * v)(x).sum())(w.detach())
    with mg.Graph():
        a, b = mg.placeholder((3,)), mg.placeholder((3,))
        with pytest.raises(CheckpointError, match="node of the graph"):
            mg.checkpoint(lambda a: a * b)(a)
    with pytest.raises(CheckpointError, match="by position"):
        mg.checkpoint(lambda x: x)(x=x)
    assert isinstance(CheckpointError("x"), TypeError)  # except TypeError still catches it


def test_on_a_virtual_device_the_memory_is_counted_there():
    with mg.device("cpu:1"):
        x = mg.tensor(RNG.normal(size=(64, 16)))
        params = [mg.tensor(p, requires_grad=True) for p in mlp_params(4, 16)]
    dev = mg.device("cpu:1")
    base = dev.live_bytes
    h = chain(x, params, 2, segment)
    assert h.device is dev and dev.live_bytes - base == 2 * 64 * 16 * 8
    (h * h).mean().backward()
    xt, *pt = as_torch([x.numpy()] + [p.numpy() for p in params], requires_grad=True)
    loss_plain_torch(xt, *pt).backward()
    for mine, theirs in zip(params, pt):
        close(mine.grad, theirs.grad)


# -- the pipeline recomputes each stage's activations ---------------------------------------------

def deep_model():
    mods = []
    for k in range(6):
        mods += [nn.Linear(8, 8, seed=k), nn.Tanh()]
    return nn.Sequential(*mods, nn.Linear(8, 3, seed=9))


def torch_grads(model, x, labels):
    params = [torch.tensor(p.numpy(), requires_grad=True) for p in model.parameters()]
    h, it = torch.tensor(x), iter(params)
    for layer in model:
        if isinstance(layer, nn.Linear):
            w, b = next(it), next(it)
            h = h @ w.T + b
        else:
            h = torch.tanh(h)
    loss = torch.nn.functional.cross_entropy(h, torch.tensor(labels))
    loss.backward()
    return loss.item(), [p.grad for p in params]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_pipeline_recompute_gives_torchs_gradients_and_keeps_less(kind):
    model = deep_model()
    x, labels = RNG.normal(size=(64, 8)), RNG.integers(0, 3, size=64)
    stages = [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11, 12]]
    runs = {r: pp.Pipeline(model, nn.CrossEntropyLoss(), stages, schedule=kind,
                           microbatches=4, recompute=r).run(x, labels) for r in (False, True)}
    loss, expected = torch_grads(model, x, labels)
    run = runs[True]
    assert run.loss == pytest.approx(loss, rel=1e-12)
    for mine, theirs in zip(run.grads, expected):
        close(mine, theirs)
    assert run.order == list(pp.schedule(kind, 2, 4))
    # stage 0 keeps its input per microbatch, not its six layers' activations
    assert run.peak_bytes[0] < runs[False].peak_bytes[0]


# -- the numbers chapter 08 quotes, derived again ---------------------------------------------

def test_the_bytes_chapter_08_quotes():
    """Bytes do not depend on the machine: the chapter's figures are recomputed here (its
    section 6, the code blocks and DESIGN.md's 16-layer MLP of bench_checkpoint.py)."""
    text = (Path(__file__).resolve().parent.parent / "chapters" / "08-pipeline-parallelism"
            / "README.md").read_text(encoding="utf-8")
    cpu = mg.device("cpu")

    def peak_in_activations(x, params, per, run):
        for p in params:
            p.grad = None
        gc.collect()
        base = cpu.live_bytes
        cpu.reset_peak()
        h = chain(x, params, len(params) // (2 * per), run)
        (h * h).mean().backward()
        for p in params:
            p.grad = None
        return cpu.peak_bytes - base

    rng = np.random.default_rng(1)  # the chapter's block: 16 layers, 64 wide, 512 rows
    h0 = mg.tensor(rng.normal(size=(512, 64)))
    weights = [mg.tensor(v, requires_grad=True) for _ in range(16)
               for v in (rng.normal(size=(64, 64)) / 8, np.zeros(64))]
    for run, quoted in ((layers, "54.0"), (segment, "14.0")):
        got = peak_in_activations(h0, weights, 4, run) / (512 * 64 * 8)
        assert f"{got:.1f}" == quoted and f"# {quoted}:" in text
    sweep = [f"{peak_in_activations(h0, weights, 16 // k, segment) / (512 * 64 * 8):.1f}"
             for k in (1, 2, 4, 8, 16)]  # (the notebook's U, which the text quotes)
    assert f"({', '.join(sweep[:-1])} and {sweep[-1]} activations;" in " ".join(text.split())

    rng = np.random.default_rng(0)  # DESIGN.md's: 16 layers, 128 wide, batch 2048
    x = mg.tensor(rng.normal(size=(2048, 128)))
    params = [mg.tensor(v, requires_grad=True) for _ in range(16)
              for v in (rng.normal(size=(128, 128)) / np.sqrt(128), rng.normal(size=128) * 0.1)]
    plain, ckpt = (peak_in_activations(x, params, 4, run) for run in (layers, segment))
    assert f"from {plain / 1e6:.1f} MB to {ckpt / 1e6:.1f} MB ({ckpt / plain:.2f}×" in text

    model = nn.Sequential(*[layer for k, (a, b) in enumerate(zip([32, 64, 256, 256, 64],
                                                                  [64, 256, 256, 64, 10]))
                            for layer in [nn.Linear(a, b, seed=k)] + ([nn.Tanh()] if k < 4
                                                                      else [])])
    xs, labels = rng_section5()
    for recompute, quoted in ((False, "# False [899, 2551]"), (True, "# True [456, 2470]")):
        run = pp.Pipeline(model, nn.CrossEntropyLoss(), [[0, 1, 2, 3], [4, 5, 6, 7, 8]],
                          ["cpu", "cpu:1"], schedule="gpipe", microbatches=8,
                          recompute=recompute).run(xs, labels)
        assert f"# {recompute} {[round(b / 2**10) for b in run.peak_bytes]}" == quoted
        assert quoted in text


def rng_section5():
    """Section 5's minibatch: 256 rows of 32 features, 10 classes."""
    rng = np.random.default_rng(0)
    return rng.normal(size=(256, 32)), rng.integers(0, 10, size=256)


def _halves_its_argument(x, y):
    y *= 0.5    # a write into the argument y, which the recomputation would read again
    return mg.sum(x * y)


@pytest.mark.parametrize("how", ["backward", "tape", "forward"])
def test_a_function_that_writes_into_its_argument_is_refused(how):
    """The backward pass ran f again on the written y: the gradient came out y/4, not
    y/2 (torch's for the same function without checkpoint), without a word."""
    x, y = mg.tensor([1.0, 2.0], requires_grad=(how == "backward")), mg.tensor([3.0, 4.0])
    # (in forward mode y is read-only for all of f's runs: forward mode names the update)
    error = GradientError if how == "forward" else mg.autodiff.checkpoint.CheckpointError
    with pytest.raises(error, match=r"f wrote into its argument 1 \((numpy array|a tensor) of "
                                    r"shape \(2,\) float64\), in place|the tensor passed to "
                                    r"checkpoint as argument 1 and y hold the same value"):
        if how == "backward":
            mg.checkpoint(_halves_its_argument)(x, y).backward()
        else:
            mg.grad(mg.checkpoint(_halves_its_argument), mode=how)(x, y)
    assert y.tolist() == [3.0, 4.0]  # (refused before the write)


CK_SCALE = 2.0


def _scaled_sin(x):
    return mg.sin(x) * CK_SCALE


def test_a_global_bound_anew_before_the_backward_pass_is_refused(monkeypatch):
    """The backward pass recomputes f: with CK_SCALE bound to 3.0 after the forward pass
    it read 3.0, and the gradient came out 3 cos x for the forward's 2 sin x, silently
    (torch.utils.checkpoint's documented hazard). Refused, naming the global; nothing
    is accumulated, and a new forward pass gives 3 cos x (the closed form)."""
    x = mg.tensor([0.5, 1.0], requires_grad=True)
    y = mg.checkpoint(_scaled_sin)(x).sum()
    monkeypatch.setitem(globals(), "CK_SCALE", 3.0)
    with pytest.raises(CheckpointError, match="f reads CK_SCALE, which holds another value "
                                              "since the forward pass"):
        y.backward()
    assert x.grad is None
    mg.checkpoint(_scaled_sin)(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3.0 * np.cos([0.5, 1.0]), rtol=1e-15)


CK_TENSOR = mg.tensor([1.0, 2.0, 3.0])
CK_ARRAY = np.array([1.0, 2.0, 3.0])


def _reads_a_global_tensor(x):
    return mg.sin(x * CK_TENSOR).sum()


def _reads_a_global_array(x):
    return mg.sin(x * CK_ARRAY).sum()


def _write_the_globals():
    with mg.no_grad():
        CK_TENSOR[...] = CK_TENSOR + 1.0  # (through minigraph: a write the tape counts)
    CK_ARRAY[...] += 1.0                  # (NumPy's own: only the values can tell)


@pytest.mark.parametrize("f", [_reads_a_global_tensor, _reads_a_global_array])
@pytest.mark.parametrize("how", ["backward", "tape", "graph", "source"])
def test_a_global_written_in_place_before_the_backward_pass_is_refused(f, how):
    """CK_TENSOR[...] = CK_TENSOR + 1 (or the NumPy array's += 1) after the forward pass:
    the recomputation read the new values, and the gradient came out cos(x C') C' for
    the forward's cos(x C) C, silently, where f without checkpoint refuses (a tensor) or
    uses the value it recorded (an array). Refused in backward() and in every vjp_fn
    (graph and source mode's vjp_fn did not look at arrays, with or without checkpoint);
    unchanged, the gradient is the closed form."""
    x0 = np.array([0.3, -0.4, 0.5])
    CK_TENSOR.data[...] = CK_ARRAY[...] = [1.0, 2.0, 3.0]
    try:
        for write in (False, True):
            x = mg.tensor(x0, requires_grad=True)
            if how == "backward":
                out = mg.checkpoint(f)(x)
            else:
                _, vjp_fn = mg.vjp(mg.checkpoint(f), x, mode=how)
            if write:
                _write_the_globals()
                with pytest.raises((CheckpointError, GradientError),
                                   match="in place"):
                    out.backward() if how == "backward" else vjp_fn(1.0)
            else:
                g = out.backward() or x.grad if how == "backward" else vjp_fn(1.0)[0]
                np.testing.assert_allclose(g.numpy(), np.cos(x0 * [1, 2, 3]) * [1, 2, 3],
                                           rtol=1e-14)
    finally:
        CK_TENSOR.data[...] = CK_ARRAY[...] = [1.0, 2.0, 3.0]


@pytest.mark.parametrize("mode", ["tape", "graph", "source"])
def test_vjp_fn_of_a_function_reading_a_global_array_written_since_is_right_or_refused(mode):
    """Without checkpoint: mg.vjp in tape mode kept the NumPy array itself among its
    entries' arguments, so vjp_fn gave cos(x C) C' (the old cosine, the new factor: no
    function's derivative); graph and source mode built their program again from the new
    array. The tape now records a copy, as eager mode does (closed form), and the
    compiled modes refuse, as they refuse a tensor written since."""
    x0 = np.array([0.3, -0.4, 0.5])
    CK_ARRAY[...] = [1.0, 2.0, 3.0]
    try:
        _, vjp_fn = mg.vjp(_reads_a_global_array, mg.tensor(x0), mode=mode)
        CK_ARRAY[...] += 1.0
        if mode == "tape":
            np.testing.assert_allclose(vjp_fn(1.0)[0].numpy(),
                                       np.cos(x0 * [1, 2, 3]) * [1, 2, 3], rtol=1e-14)
        else:
            with pytest.raises(GradientError, match=r"an array that f reads from outside "
                                                    r"its arguments \(shape \(3,\)\)"):
                vjp_fn(1.0)
    finally:
        CK_ARRAY[...] = [1.0, 2.0, 3.0]


def _writes_into_its_argument(x, y):
    y += 1.0
    return mg.sum(x * y)


def _assigns_into_its_argument(x, y):
    y[0] = 5.0
    return mg.sum(x * y)


@pytest.mark.parametrize("f", [_writes_into_its_argument, _assigns_into_its_argument])
def test_a_write_into_an_argument_is_refused_before_it_is_made(f):
    """A checkpoint refuses f's write into its argument (the backward pass recomputes f
    from it), but it found the write after f ran: the caller's y was left written by a
    call that raised. Its arrays are read-only while f runs now: the write raises at the
    user's line, naming the argument, and y is as it was."""
    x, y = mg.tensor([1.0, 2.0], requires_grad=True), mg.tensor([3.0, 4.0])
    with pytest.raises(CheckpointError, match=r"f wrote into its argument 1 \(numpy array "
                                              r"of shape \(2,\) float64\), in place, at "
                                              r".*test_checkpoint.py"):
        mg.checkpoint(f)(x, y)
    assert y.tolist() == [3.0, 4.0] and y.data.flags.writeable and x.data.flags.writeable
