"""Chapter 03 exercises: automatic differentiation on dataflow graphs.

Write the body of each function below (the parts that say ``NotImplementedError`` in
your copy), then grade your work with::

    minigraph grade chapters/03-ad-on-dataflow-graphs

The tests compare your functions with minigraph's own implementation
(``mg.sum_to``, ``mg.vjp``, ``mg.jacrev``, ``mg.jacfwd``, ``mg.gradients`` run by
``mg.Session``) on random inputs drawn with fixed seeds.

Toy graphs
----------
Exercises 5-7 work on a *toy graph* written as plain Python data: a list of nodes
``(name, op, inputs)`` in a topological order (every input of a node is defined by an
earlier node). The textbook's example z = x*y + sin(x), equations (a.1)-(a.5), is::

    TEXTBOOK = [
        ("x", "input", ()),
        ("y", "input", ()),
        ("a", "mul", ("x", "y")),
        ("b", "sin", ("x",)),
        ("z", "add", ("a", "b")),
    ]

The ops, all elementwise on NumPy arrays of one shape (or scalars), are those of
``OPS`` below; ``input`` nodes are fed. ``ones_like(a)`` is an array of ones shaped
like ``a``: the seed of a gradient graph. It does not depend on the *value* of ``a``,
so no gradient flows through it. ``evaluate(nodes, feeds)`` runs a toy graph; you may
use it.
"""

from __future__ import annotations

import numpy as np

import minigraph as mg

# -- given: the toy graphs' ops and an evaluator ------------------------------------------

OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "neg": lambda a: -a,
    "sin": np.sin,
    "cos": np.cos,
    "exp": np.exp,
    "ones_like": np.ones_like,
}

TEXTBOOK = [
    ("x", "input", ()),
    ("y", "input", ()),
    ("a", "mul", ("x", "y")),
    ("b", "sin", ("x",)),
    ("z", "add", ("a", "b")),
]


def evaluate(nodes, feeds):
    """The value of every node of a toy graph: ``{name: array}``.

    ``feeds`` maps each input's name to its value.
    """
    values = {}
    for name, op, inputs in nodes:
        if op == "input":
            values[name] = np.asarray(feeds[name], dtype=np.float64)
        else:
            values[name] = np.asarray(OPS[op](*(values[i] for i in inputs)), dtype=np.float64)
    return values


# -- 1. undoing a broadcast -------------------------------------------------------------------

def sum_to(g, shape):
    """Sum the NumPy array ``g`` down to ``shape``.

    ``shape`` is a shape that NumPy broadcasts to ``g.shape`` (for example ``(3,)`` or
    ``(1, 3)`` for ``g`` of shape ``(4, 3)``). Broadcasting copies a value to several
    places; the adjoint of a copy is the sum of the adjoints of the places, so the
    gradient of a broadcast argument is ``g`` summed over the axes that broadcasting
    added (the leading ones) or stretched (size 1 in ``shape``). Return an array of
    exactly ``shape``, as ``mg.sum_to`` does.
    """
    g = np.asarray(g)
    shape = tuple(shape)
    ### BEGIN SOLUTION
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape) if axes else g.reshape(shape)
    ### END SOLUTION


# -- 2. a vector-Jacobian product with broadcasting --------------------------------------

def vjp_mul(g, x, y):
    """The VJP of ``out = x * y`` (NumPy broadcasting): ``(gx, gy)``.

    ``g`` is the adjoint of ``out`` (shape ``np.broadcast_shapes(x.shape, y.shape)``);
    return the adjoints of ``x`` and of ``y`` as NumPy arrays of the shapes of ``x`` and
    ``y``: the textbook's (f.4) ``gy = ga * x`` and the first term of (f.5)
    ``gx = ga * y``, each summed back to its argument's shape.
    """
    g, x, y = np.asarray(g), np.asarray(x), np.asarray(y)
    ### BEGIN SOLUTION
    return sum_to(g * y, x.shape), sum_to(g * x, y.shape)
    ### END SOLUTION


# -- 3 and 4. the Jacobian by rows (VJPs) and by columns (JVPs) ---------------------------

def jacobian_by_rows(f, x):
    """The Jacobian of ``f`` at ``x`` built from vector-Jacobian products.

    ``f`` maps a 1-D array of n elements to a 1-D tensor of m elements (it is written
    with minigraph functions). Row i of the Jacobian J (m x n) is ``e_i J``, the VJP of
    the i-th unit vector. Use ``mg.vjp`` once: one forward pass, then m reverse sweeps.
    Return J as a NumPy array of shape (m, n).
    """
    x = np.asarray(x, dtype=np.float64)
    ### BEGIN SOLUTION
    out, vjp_fn = mg.vjp(f, x)
    m = out.shape[0]
    rows = [vjp_fn(np.eye(m)[i])[0].numpy() for i in range(m)]
    return np.stack(rows)
    ### END SOLUTION


def jacobian_by_columns(f, x):
    """The Jacobian of ``f`` at ``x`` built from Jacobian-vector products.

    Column j of J is ``J e_j``, the JVP of the j-th unit vector (``mg.jvp``): one
    forward pass per input element, like (c.*) and (d.*) in the textbook. Return J as
    a NumPy array of shape (m, n).
    """
    x = np.asarray(x, dtype=np.float64)
    ### BEGIN SOLUTION
    n = x.shape[0]
    columns = [mg.jvp(f, (x,), (np.eye(n)[j],))[1].numpy() for j in range(n)]
    return np.stack(columns, axis=1)
    ### END SOLUTION


# -- 5. the reverse sweep on a toy graph --------------------------------------------------

def reverse_sweep(nodes, feeds, y):
    """The gradients of ``sum(y)`` with respect to every input of a toy graph, as values.

    Evaluate the graph, seed the adjoint of node ``y`` with ones, and visit the nodes in
    reverse order, handing each node's adjoint to its inputs with the op's VJP (the
    textbook's (f.1)-(f.5); an input used twice receives two contributions, which add
    up). Return ``{input name: gradient array}`` with one entry per ``input`` node;
    the value is ``None`` for an input that ``y`` does not depend on (as
    ``mg.gradients`` gives ``None``).
    """
    ### BEGIN SOLUTION
    values = evaluate(nodes, feeds)
    adjoint = {y: np.ones_like(values[y])}
    for name, op, inputs in reversed(nodes):
        if name not in adjoint or op == "input":
            continue
        g = adjoint[name]
        v = [values[i] for i in inputs]
        if op == "add":
            shares = [g, g]
        elif op == "sub":
            shares = [g, -g]
        elif op == "mul":
            shares = [g * v[1], g * v[0]]
        elif op == "neg":
            shares = [-g]
        elif op == "sin":
            shares = [g * np.cos(v[0])]
        elif op == "cos":
            shares = [-(g * np.sin(v[0]))]
        elif op == "exp":
            shares = [g * values[name]]
        elif op == "ones_like":
            shares = [None]
        else:
            raise ValueError(f"unknown op {op!r}")
        for i, share in zip(inputs, shares):
            if share is not None:
                # a copy where a share is stored first: add hands its one array g to both
                # inputs, and two gradients must not be one array (scaling one in place,
                # an optimizer step, would scale the other)
                adjoint[i] = adjoint[i] + share if i in adjoint else share.copy()
    return {name: adjoint.get(name) for name, op, _ in nodes if op == "input"}
    ### END SOLUTION


# -- 6. the reverse-graph generation pass on a toy graph ----------------------------------

def gradient_graph(nodes, y, xs):
    """Add to a toy graph the nodes that compute d(sum of y)/dx for each x in ``xs``.

    This is ``mg.gradients`` for toy graphs: no value is computed. Return
    ``(new_nodes, grads)``:

    * ``new_nodes``: a list of new toy nodes ``(name, op, inputs)``, in a topological
      order, that may read the nodes of ``nodes`` and each other. Their ops are those
      of ``OPS`` (no ``input``); their names are new (none is a name of ``nodes``) and
      distinct. The seed is a node ``ones_like(y)``.
    * ``grads``: for each x in ``xs``, the name of the node whose value is the gradient
      of ``sum(y)`` with respect to x, or ``None`` if ``y`` does not depend on x.

    ``evaluate(nodes + new_nodes, feeds)`` then gives the gradients for any feeds, and
    since the result is again a toy graph, running this function on it once more gives
    gradients of gradients.
    """
    ### BEGIN SOLUTION
    taken = {name for name, _, _ in nodes}
    new_nodes = []

    def emit(op, *inputs):
        k = len(new_nodes)
        name = f"grad_{op}_{k}"
        while name in taken:
            k += 1
            name = f"grad_{op}_{k}"
        taken.add(name)
        new_nodes.append((name, op, tuple(inputs)))
        return name

    def total(parts):
        g = parts[0]
        for p in parts[1:]:
            g = emit("add", g, p)
        return g

    contributions = {y: [emit("ones_like", y)]}
    for name, op, inputs in reversed(nodes):
        if name not in contributions or op == "input":
            continue
        parts = contributions[name]
        g = total(parts)
        contributions[name] = [g]
        if op == "add":
            shares = [g, g]
        elif op == "sub":
            shares = [g, emit("neg", g)]
        elif op == "mul":
            shares = [emit("mul", g, inputs[1]), emit("mul", g, inputs[0])]
        elif op == "neg":
            shares = [emit("neg", g)]
        elif op == "sin":
            shares = [emit("mul", g, emit("cos", inputs[0]))]
        elif op == "cos":
            shares = [emit("neg", emit("mul", g, emit("sin", inputs[0])))]
        elif op == "exp":
            shares = [emit("mul", g, name)]
        elif op == "ones_like":
            shares = [None]
        else:
            raise ValueError(f"unknown op {op!r}")
        for i, share in zip(inputs, shares):
            if share is not None:
                contributions.setdefault(i, []).append(share)
    grads = [total(contributions[x]) if contributions.get(x) else None for x in xs]
    return new_nodes, grads
    ### END SOLUTION


# -- 7. gradients of gradients ----------------------------------------------------------------

def second_derivative(nodes, y, x):
    """The nodes computing the second derivative of ``sum(y)`` with respect to ``x``.

    Run the reverse-graph pass (exercise 6) twice: first on ``nodes`` for dy/dx, then on
    the extended graph for the derivative of ``sum(dy/dx)``. Return ``(new_nodes,
    name)``: all the nodes added by both passes, and the name of the node holding the
    second derivative (elementwise, the diagonal of the Hessian for elementwise graphs),
    or ``None`` where a pass finds no dependence on ``x``.
    """
    ### BEGIN SOLUTION
    first, (gx,) = gradient_graph(nodes, y, [x])
    if gx is None:
        return first, None
    second, (gxx,) = gradient_graph(list(nodes) + first, gx, [x])
    return first + second, gxx
    ### END SOLUTION
