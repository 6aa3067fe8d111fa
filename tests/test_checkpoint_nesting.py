"""``mg.checkpoint`` under other transformations, nested in itself, and the compiled
programs' guards next to it.

Each test names what was wrong. The oracles are independent of minigraph: torch.func
on the same function with the random mask f drew in its forward pass, closed forms,
and NumPy."""

import itertools
import math
import sys

import numpy as np
import pytest
import torch

import minigraph as mg
from minigraph.autodiff.checkpoint import CheckpointError
from minigraph.errors import MinigraphError

X = np.array([0.3, -1.2, 0.8, 1.5, -0.4])


def _dropout(seed: int):
    """A dropout-like segment, checkpointed: f draws a mask at each run (logged), and
    the generator it draws from."""
    rng = np.random.default_rng(seed)
    masks: list = []

    def f(x):
        m = (rng.random(x.shape) > 0.5).astype(np.float64)
        masks.append(m)
        return mg.sin(x) * mg.tensor(m) * x

    return mg.checkpoint(f), masks, rng


def _torch_f(m):
    return lambda x: torch.sin(x) * torch.tensor(m) * x


CASES = {  # name: (minigraph on the checkpoint g, torch.func on the mask's function tf)
    "grad(grad)": (
        lambda g: mg.grad(lambda x: mg.grad(lambda z: g(z).sum())(x).sum())(mg.tensor(X)),
        lambda tf: torch.func.grad(lambda x: torch.func.grad(lambda z: tf(z).sum())(x).sum())(
            torch.tensor(X))),
    "hessian": (
        lambda g: mg.hessian(lambda x: g(x).sum())(mg.tensor(X)),
        lambda tf: torch.func.hessian(lambda x: tf(x).sum())(torch.tensor(X))),
    "vmap(grad)": (
        lambda g: mg.vmap(mg.grad(lambda x: g(x).sum()))(mg.tensor(np.stack([X, 2 * X]))),
        lambda tf: torch.func.vmap(torch.func.grad(lambda x: tf(x).sum()))(
            torch.tensor(np.stack([X, 2 * X])))),
    "jvp(vmap)": (
        lambda g: mg.jvp(mg.vmap(g), (mg.tensor(np.stack([X, -X])),),
                         (mg.tensor(np.ones((2, 5))),))[1],
        lambda tf: torch.func.jvp(torch.func.vmap(tf), (torch.tensor(np.stack([X, -X])),),
                                  (torch.ones(2, 5, dtype=torch.float64),))[1]),
    "jacfwd(jacfwd)": (
        lambda g: mg.jacfwd(mg.jacfwd(lambda x: g(x).sum()))(mg.tensor(X)),
        lambda tf: torch.func.jacfwd(torch.func.jacfwd(lambda x: tf(x).sum()))(
            torch.tensor(X))),
    "jvp(grad)": (
        lambda g: mg.jvp(mg.grad(lambda x: g(x).sum()), (mg.tensor(X),),
                         (mg.tensor(np.ones(5)),))[1],
        lambda tf: torch.func.jvp(torch.func.grad(lambda x: tf(x).sum()), (torch.tensor(X),),
                                  (torch.ones(5, dtype=torch.float64),))[1]),
    "jacrev(jacfwd)": (
        lambda g: mg.jacrev(mg.jacfwd(g))(mg.tensor(X)),
        lambda tf: torch.func.jacrev(torch.func.jacfwd(tf))(torch.tensor(X))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_random_numbers_drawn_again_at_every_nesting(name):
    """Under a second transformation, the recomputation (the backward pass's, a
    tangent's) drew a new mask: the VJP rule looked the forward pass up by its own
    ``out`` (a box, a batch) and missed it, and the JVP rule replayed only where its f
    was the user's (under vmap it is the batching rule's). Every run of f in one call of
    the checkpoint now draws the first run's numbers, and the generator is left where
    one run of f leaves it."""
    mine, theirs = CASES[name]
    g, masks, rng = _dropout(3)
    got = mine(g).numpy()
    assert all((m == masks[0]).all() for m in masks), f"f drew {len(masks)} masks"
    np.testing.assert_allclose(got, theirs(_torch_f(masks[0])).numpy(), atol=1e-12)
    plain = np.random.default_rng(3)
    plain.random(X.shape)  # (f's one draw)
    assert rng.random() == plain.random()


def test_random_numbers_in_source_mode_refused():
    """Source mode ran f four times (its shape, the forward line, the recomputation
    written at transformation time, the program's run), each with a new mask, and gave
    the gradient of another mask than its value's. A source program cannot draw the
    forward pass's numbers again at each run: refused, as graph mode refuses it."""
    rng = np.random.default_rng(3)

    def drop(x):
        return mg.sin(x) * mg.tensor(rng.random(x.shape) > 0.5) * x

    seg = mg.checkpoint(drop)

    def loss(x):
        return seg(x).sum()

    with pytest.raises(CheckpointError, match="random numbers"):
        mg.value_and_grad(loss, mode="source")(mg.tensor(X))


C = np.array([1.0, 2.0, 3.0])
_ck = mg.checkpoint(lambda x: mg.sin(x) * C)


def _inner(z):
    out = (_ck(z) * z).sum()
    C[:] = [10.0, 20.0, 30.0]  # written after the checkpoint's forward pass
    return out


@pytest.mark.parametrize("call", [
    lambda x: mg.vmap(mg.grad(_inner))(mg.tensor(x[None])),
    lambda x: mg.jvp(mg.grad(_inner), (mg.tensor(x),), (mg.tensor(np.ones(3)),)),
], ids=["vmap(grad)", "jvp(grad)"])
def test_write_since_forward_refused_under_nesting(call):
    """An array f reads from outside, written between the checkpoint's forward pass
    and its recomputation, was refused under mg.grad alone; under vmap(grad),
    and jvp(grad) the guard was skipped and the gradient silently used
    the new values ((cos x * x + sin x) * 10 C, not * C)."""
    C[:] = [1.0, 2.0, 3.0]
    with pytest.raises(CheckpointError, match="changed in place since the forward pass"):
        call(np.array([0.3, 0.6, 0.9]))
    C[:] = [1.0, 2.0, 3.0]


def _nested(d: int):
    f = lambda x: mg.sin(x) * 0.5 + x * 0.5  # noqa: E731
    g = f
    for _ in range(d):
        g = (lambda h: mg.checkpoint(lambda x: f(h(x))))(g)
    return g


def _chain_rule(d: int, x: float) -> float:
    """The derivative of d + 1 applications of sin(x) / 2 + x / 2, in closed form."""
    grad = 1.0
    for _ in range(d + 1):
        grad *= 0.5 * math.cos(x) + 0.5
        x = 0.5 * math.sin(x) + 0.5 * x
    return grad


def test_nested_checkpoints_traced_a_bounded_number_of_times():
    """d nested checkpoints: each level's backward program traced the checkpoints
    nested in it on placeholders again, and each of those the ones in it (their shapes,
    their backward nodes'), so f ran about d**3 / 6 times (d = 40: 16 s). A nested
    checkpoint's shape is traced once per signature now, and a backward node's is its
    arguments' sizes: f runs about d**2 / 2 times, as in torch's recomputation."""
    d, runs = 10, itertools.count()  # (next(runs) counts f's runs, binding nothing)
    f = lambda x: mg.sin(x) * 0.5 + x * 0.5  # noqa: E731

    def counted(h):
        def level(x):
            next(runs)
            return f(h(x))
        return mg.checkpoint(level)

    g = f
    for _ in range(d):
        g = counted(g)
    x = mg.tensor(1.5, requires_grad=True)
    y = g(x)
    before = next(runs)
    y.backward()
    assert x.grad.item() == pytest.approx(_chain_rule(d, 1.5), rel=1e-12)
    assert next(runs) - before <= d * d  # (65 runs; 176 when traced again at each level)


def _frames() -> int:
    """How many frames deep the caller runs."""
    frame, n = sys._getframe(1), 0
    while frame is not None:
        frame, n = frame.f_back, n + 1
    return n


def test_nested_checkpoints_traced_with_a_bounded_stack():
    """A checkpoint nested in another was traced within the trace of the one around it
    (its node's shape), about 12 frames a level: 100 nested checkpoints raised a bare
    RecursionError in backward(). The traces go at most 16 deep now, the deeper ones
    traced first; here 24 of them in graph mode, with 260 frames to spare."""
    g = _nested(24)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_frames() + 260)
    try:
        got = mg.grad(g, mode="graph")(1.5)
    finally:
        sys.setrecursionlimit(limit)
    assert got.item() == pytest.approx(_chain_rule(24, 1.5), rel=1e-12)


@pytest.mark.parametrize("mode", ["grad graph", "trace"])
def test_deep_static_argument_refused_clearly(mode):
    """A static argument nested 1000 deep (((1,),),) raised a bare RecursionError from
    the signature's key (one recursion per level); it is refused by name now, as an
    object holding values nested too deep already was."""
    c: object = 1
    for _ in range(1000):
        c = (c,)
    f = lambda x, cfg: mg.sin(x)  # noqa: E731
    made = mg.grad(f, mode="graph") if mode == "grad graph" else mg.trace(f)
    with pytest.raises(TypeError, match="nested more than 100 levels deep"):
        made(1.5, c)
    assert made(1.5, ((1,),)).item() == pytest.approx(
        math.cos(1.5) if mode == "grad graph" else math.sin(1.5))


@pytest.mark.parametrize("mode", ["graph", "source"])
def test_compiled_vjp_after_a_parameter_update(mode):
    """f reads a layer's parameters (requires_grad) from outside; after an SGD step
    under no_grad, before the call, every jacrev/vjp in a compiled mode refused with
    "written in place since mg.vjp ran f": its vjp_fn compared the parameters with the
    program's copies from when it was built (a program on the tape is not rebuilt for a
    write). It compares with the values of its own call now; a write after it is still
    refused."""
    lin = mg.nn.Linear(3, 2)
    x = np.array([0.1, -0.4, 0.7])

    def f(v, layer):
        return mg.tanh(layer(v))

    def oracle():
        w, b = torch.tensor(lin.weight.numpy()), torch.tensor(lin.bias.numpy())
        return torch.func.jacrev(lambda v: torch.tanh(w @ v + b))(torch.tensor(x)).numpy()

    jac = mg.jacrev(f, mode=mode)
    for _ in range(2):
        np.testing.assert_allclose(jac(mg.tensor(x), lin).numpy(), oracle(), atol=1e-6)
        with mg.no_grad():
            lin.weight -= 0.1
            lin.bias *= 2.0
    _, vjp_fn = mg.vjp(lambda v: f(v, lin), mg.tensor(x), mode="graph")
    with mg.no_grad():
        lin.weight -= 0.1
    with pytest.raises(MinigraphError, match="since mg.vjp ran f|changed"):
        vjp_fn(mg.tensor([1.0, 1.0]))


MASK = np.array([True, True, False, False, True, False])


def _masked(x):
    return mg.tanh(x[MASK]) * 2.0


def _masked_mean(x, w):
    y = mg.checkpoint(_masked)(x)
    return w * mg.sum(y) / y.shape[0]


def test_a_traced_shape_follows_the_values_of_an_array_f_reads():
    """A checkpoint's traced shape was kept while the arrays f reads kept their shapes:
    a global mask written in place (4 rows selected, not 3) left the node's shape (3,),
    and graph mode's gradient divided by 3 (0.7130 where torch gives 0.5347). Oracle:
    torch.autograd on the same mask."""
    x = np.arange(6.0) / 6
    gw = mg.grad(_masked_mean, argnums=1, mode="graph")
    gx = mg.grad(_masked_mean, argnums=0, mode="graph")
    gw(mg.tensor(x), 2.0), gx(mg.tensor(x), 2.0)
    try:
        MASK[2] = True
        xt = torch.tensor(x, requires_grad=True)
        wt = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
        loss = wt * (torch.tanh(xt[torch.tensor(MASK)]) * 2).mean()
        ex, ew = torch.autograd.grad(loss, [xt, wt])
        np.testing.assert_allclose(float(gw(mg.tensor(x), 2.0)), float(ew))
        np.testing.assert_allclose(gx(mg.tensor(x), 2.0).numpy(), ex.numpy())
    finally:
        MASK[2] = False


W_BUILT = np.array([1.0, 2.0])


def _sin_scaled(x):
    return mg.sin(x * W_BUILT)


def test_a_graph_node_refuses_an_array_written_since_the_graph_was_built():
    """In an mg.Graph, the checkpoint's node ran f at each Session.run on the global's
    new values (W[:] = ... after the build) while the graph's other nodes held the old:
    checkpoint(f) and f gave different values in one graph. Refused, as a name bound
    anew is. Oracle: the closed form sin(x * W) with W as built."""
    with mg.Graph() as g:
        p = mg.placeholder(shape=(2,), name="x")
        y = mg.checkpoint(_sin_scaled)(p)
    x = np.array([0.3, 0.5])
    np.testing.assert_allclose(mg.Session(g).run(y, {p: x}), np.sin(x * W_BUILT))
    try:
        W_BUILT[:] = [3.0, 4.0]
        with pytest.raises(Exception, match="W_BUILT, a tensor or array written in place"):
            mg.Session(g).run(y, {p: x})
    finally:
        W_BUILT[:] = [1.0, 2.0]
