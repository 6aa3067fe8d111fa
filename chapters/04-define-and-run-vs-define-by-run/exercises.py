"""Chapter 04 exercises: define-and-run vs define-by-run.

Write the body of each function below (the parts that say ``NotImplementedError`` in
your copy), then grade your work with::

    minigraph grade chapters/04-define-and-run-vs-define-by-run

The tests compare your functions with minigraph's own implementation
(``mg.compile_graph``, ``mg.trace`` and ``minigraph.graph.trace.signature``,
``mg.passes.cse``) on random inputs drawn with fixed seeds.

Toy graphs
----------
Exercises 1 and 5 work on a *toy graph* written as plain Python data: a list of nodes
``(name, op, inputs)`` in a topological order (every input of a node is defined by an
earlier node), with names that are Python identifiers. z = x*y + sin(x) is::

    TEXTBOOK = [
        ("x", "input", ()),
        ("y", "input", ()),
        ("a", "mul", ("x", "y")),
        ("b", "sin", ("x",)),
        ("z", "add", ("a", "b")),
    ]

The ops are the keys of ``OPS`` below, all elementwise on NumPy arrays; ``input``
nodes are the graph's arguments. ``evaluate(nodes, feeds)`` runs a toy graph node by
node, as an interpreter would; you may use it.
"""

from __future__ import annotations

import numpy as np

import minigraph as mg
from minigraph.ops.weak import Weak

# -- given: the toy graphs' ops, as Python expressions and as functions --------------------

# How each op is written in Python source, {0} and {1} standing for its inputs.
OPS = {
    "add": "{0} + {1}",
    "sub": "{0} - {1}",
    "mul": "{0} * {1}",
    "neg": "-{0}",
    "sin": "np.sin({0})",
    "cos": "np.cos({0})",
    "exp": "np.exp({0})",
    "tanh": "np.tanh({0})",
}

FUNCTIONS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "neg": lambda a: -a,
    "sin": np.sin,
    "cos": np.cos,
    "exp": np.exp,
    "tanh": np.tanh,
}

TEXTBOOK = [
    ("x", "input", ()),
    ("y", "input", ()),
    ("a", "mul", ("x", "y")),
    ("b", "sin", ("x",)),
    ("z", "add", ("a", "b")),
]


def evaluate(nodes, feeds):
    """The value of every node of a toy graph (an interpreter): ``{name: array}``."""
    values = {}
    for name, op, inputs in nodes:
        if op == "input":
            values[name] = np.asarray(feeds[name], dtype=np.float64)
        else:
            values[name] = FUNCTIONS[op](*(values[i] for i in inputs))
    return values


# -- 1. a graph as the text of a Python function ------------------------------------------

def graph_to_source(nodes, inputs, outputs, name="f"):
    """The source text of a straight-line Python function computing a toy graph.

    ``inputs`` are the names of the ``input`` nodes, in the order of the function's
    parameters; ``outputs`` the names of the nodes it returns, as a tuple. Write one
    assignment per node, in the order of ``nodes``, using the expressions of ``OPS``
    and the node names as variable names, and only for the nodes that the outputs
    need (like ``mg.compile_graph``, which prunes the rest). For TEXTBOOK, inputs
    ``["x", "y"]`` and outputs ``["z"]``::

        def f(x, y):
            a = x * y
            b = np.sin(x)
            z = a + b
            return (z,)

    An ``input`` node that the outputs need but that is not among ``inputs`` is an
    error: raise ``ValueError`` naming it.
    """
    ### BEGIN SOLUTION
    by_name = {n: (op, ins) for n, op, ins in nodes}
    needed, stack = set(), list(outputs)
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        if n not in inputs:
            stack.extend(by_name[n][1])
    lines = [f"def {name}({', '.join(inputs)}):"]
    for n, op, ins in nodes:
        if n not in needed or n in inputs:
            continue
        if op == "input":
            raise ValueError(f"input {n!r} is needed but is not among the inputs {inputs}")
        lines.append(f"    {n} = {OPS[op].format(*ins)}")
    lines.append(f"    return ({''.join(o + ', ' for o in outputs)})")
    return "\n".join(lines) + "\n"
    ### END SOLUTION


# -- 2. compile and exec ---------------------------------------------------------------------

def compile_source(source, name):
    """Turn the text of a Python function into a function, with ``compile`` and ``exec``.

    ``source`` defines a function called ``name`` that may use NumPy as ``np``. Compile
    the text to a code object (``compile(source, filename, "exec")``), execute it in a
    fresh namespace that holds ``np``, and return the function it defined.
    """
    ### BEGIN SOLUTION
    namespace = {"np": np}
    exec(compile(source, f"<toy {name}>", "exec"), namespace)
    return namespace[name]
    ### END SOLUTION


# -- 3. the input signature --------------------------------------------------------------------

def signature(args):
    """The key under which a recorded graph is cached, for the argument tuple ``args``.

    A graph recorded for some arguments can be replayed for others when nothing it
    was specialised for differs: for a tensor (``mg.Tensor``), a NumPy array, a NumPy
    float scalar (``np.float64(2.0)``, a 0-d array of its dtype) or a Python float, its
    shape, dtype and device (NumPy's values and a float live on ``"cpu"``; a Python
    float is a float64 of shape ``()``, but a *weak* one, which takes the dtype of the
    tensors it meets, so it never shares a signature with a 0-d float64 tensor or
    array); for any other argument (an int, a bool, a string, None, a tuple ...), which
    is baked into the graph, its type and value: ``True`` and ``1`` differ (``f(x, True)``
    may test ``flag is True``), a tuple counts item by item, and a float inside one by
    its bits (``0.0`` and ``-0.0`` differ: ``1 / c`` tells them apart). Return a hashable
    value of plain data (tuples of strings and numbers: a type by its name,
    ``type(a).__name__``); two argument tuples must get equal signatures exactly when
    ``minigraph.graph.trace.signature`` gives them equal signatures.
    """
    ### BEGIN SOLUTION
    def constant(a):  # by type and value: True, 1 and np.int64(1) are three constants
        kind = type(a).__name__
        if isinstance(a, (tuple, list)):
            return kind, tuple(constant(item) for item in a)
        if isinstance(a, (float, np.floating)):
            return kind, float(a).hex()  # by bits: 0.0 == -0.0 in Python
        return kind, a

    key = []
    for a in args:
        if isinstance(a, mg.Tensor):
            key.append(("tensor", tuple(a.shape), str(a.dtype), a.device.name))
        elif isinstance(a, (np.ndarray, np.floating)):  # (np.float64 is also a float)
            a = np.asarray(a)
            key.append(("tensor", a.shape, a.dtype.name, "cpu"))
        elif isinstance(a, float):
            key.append(("weak", (), "float64", "cpu"))
        else:
            key.append(("static", constant(a)))
    return tuple(key)
    ### END SOLUTION


# -- 4. hybridize: record once per signature, replay after --------------------------------

def _is_array_like(a):
    return isinstance(a, (mg.Tensor, np.ndarray, np.floating, float))


def _is_weak(a):
    """A Python float (not a NumPy one, though ``np.float64`` is a float subclass)."""
    return isinstance(a, float) and not isinstance(a, np.floating)


class Hybrid:
    """``Hybrid(f)``: ``mg.trace(f)`` written by you.

    ``f`` is written with minigraph functions. The first call with a new
    :func:`signature` *records* f: inside a new ``mg.Graph()``, it calls f with one
    ``mg.placeholder`` (shape, dtype) in place of each array-like argument (a tensor, a
    NumPy array or scalar, or a float) and the other arguments as they are, so that f's
    operations become graph nodes, then compiles the graph with ``mg.compile_graph`` and
    caches the compiled function under the signature. A Python float is weak: f gets
    ``Weak(node)`` around its float64 placeholder, which takes the dtype of the tensors
    it meets as the float does in eager mode (``x * s`` stays float32 for a float32
    ``x``). So f's Python body runs exactly once per new signature, on placeholders,
    never on the values themselves. Every call, the first included, then computes its
    result by running the cached compiled function on its array-like arguments; a later
    call with a signature already seen runs only the compiled function, *without running
    f's Python body*.

    Return NumPy arrays (``np.ndarray``, of the dtypes ``mg.trace`` gives): one array if
    f returns one value, a tuple if f returns a tuple or list. ``self.recordings`` counts
    how many times f's body ran.
    """

    def __init__(self, f):
        self.f = f
        self.cache = {}
        self.recordings = 0

    def __call__(self, *args):
        ### BEGIN SOLUTION
        key = signature(args)
        if key not in self.cache:
            graph, placeholders, call_args = mg.Graph(), [], []
            with graph:
                for k, a in enumerate(args):
                    if _is_array_like(a):
                        t = a if isinstance(a, mg.Tensor) else mg.tensor(a)
                        node = mg.placeholder(t.shape, t.dtype, name=f"arg{k}")
                        placeholders.append(node)
                        call_args.append(Weak(node) if _is_weak(a) else node)
                    else:
                        call_args.append(a)
                out = self.f(*call_args)
            self.recordings += 1
            single = not isinstance(out, (tuple, list))
            outputs = [out] if single else list(out)
            self.cache[key] = (mg.compile_graph(graph, placeholders, outputs), single)
        fn, single = self.cache[key]
        results = tuple(r.numpy() for r in fn(*[a for a in args if _is_array_like(a)]))
        return results[0] if single else results
        ### END SOLUTION


# -- 5. common-subexpression elimination -------------------------------------------------

def cse(nodes, outputs):
    """Common-subexpression elimination on a toy graph, as ``mg.passes.cse`` does it.

    Two nodes with the same op reading the same inputs compute the same value: keep the
    first and let every reader of the second read the first. ``input`` nodes are never
    merged, and the order of the inputs matters (``add(a, b)`` and ``add(b, a)`` stay
    two nodes, as in minigraph). Like minigraph's pass, keep only the nodes that the
    outputs need.

    Return ``(new_nodes, replaced)``: the rewritten toy graph (the kept nodes in their
    original order, their inputs renamed to the kept nodes), and a dict mapping every
    kept-or-merged node's name to the name of the node that now stands for it (itself
    when kept). The outputs' values are unchanged.
    """
    ### BEGIN SOLUTION
    by_name = {n: ins for n, _, ins in nodes}
    needed, stack = set(), list(outputs)
    while stack:
        n = stack.pop()
        if n not in needed:
            needed.add(n)
            stack.extend(by_name[n])
    replaced, seen, new_nodes = {}, {}, []
    for name, op, inputs in nodes:
        if name not in needed:
            continue
        ins = tuple(replaced[i] for i in inputs)
        key = (op, ins)
        if op != "input" and key in seen:
            replaced[name] = seen[key]
            continue
        if op != "input":
            seen[key] = name
        replaced[name] = name
        new_nodes.append((name, op, ins))
    return new_nodes, replaced
    ### END SOLUTION
