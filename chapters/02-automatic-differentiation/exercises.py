"""Chapter 02 exercises: automatic differentiation, forward and reverse.

Write the body of each function below (replace the ``raise NotImplementedError`` line),
then grade your work from the repository root::

    minigraph grade chapters/02-automatic-differentiation

The graded tests compare your code with minigraph's ``mg.jvp``, ``mg.grad``,
``mg.jacfwd`` and ``mg.jacrev`` on random programs (fixed seeds). The reading is
``README.md`` in this folder; the notebook is
``notebooks/02-automatic-differentiation.ipynb``.

Exercises
---------
1. ``Dual`` and ``sin``/``cos``/``exp``: dual numbers, the textbook's (b.*) rules.
2. ``forward_gradient(f, xs)``: a gradient by forward mode, one pass per input
   ((c.*) then (d.*) for z = x*y + sin(x)).
3. ``reverse_sweep(tape, values, output)``: the adjoints of every variable of a
   recorded tape in one backward sweep ((f.*)/(g.*)).
4. ``jacobian_fwd(f, x)`` and ``jacobian_rev(f, x)``: Jacobians with ``mg.jvp``
   (n passes) and ``mg.vjp`` (one forward pass, m sweeps).
"""

from __future__ import annotations

import math

import numpy as np

import minigraph as mg


# ---------------------------------------------------------------------------------------
# 1. Dual numbers
# ---------------------------------------------------------------------------------------

class Dual:
    """A dual number ``value + tangent * eps`` with ``eps**2 == 0``.

    ``value`` is a variable's value and ``tangent`` its derivative with respect to the
    chosen direction ``t`` (the textbook writes it ``dxx``). Arithmetic on dual numbers
    carries the tangent along by the chain rule; a plain number mixed in (``2.0 * d``)
    is a constant, whose tangent is 0.
    """

    def __init__(self, value: float, tangent: float = 0.0):
        self.value = value
        self.tangent = tangent

    def __add__(self, other: "Dual | float") -> "Dual":
        """(u + u' eps) + (v + v' eps) = (u + v) + (u' + v') eps; (b.5)."""
        ### BEGIN SOLUTION
        other = lift(other)
        return Dual(self.value + other.value, self.tangent + other.tangent)
        ### END SOLUTION

    def __mul__(self, other: "Dual | float") -> "Dual":
        """(u + u' eps) (v + v' eps) = u v + (u' v + u v') eps, since eps**2 = 0; (b.3)."""
        ### BEGIN SOLUTION
        other = lift(other)
        return Dual(self.value * other.value,
                    self.tangent * other.value + self.value * other.tangent)
        ### END SOLUTION

    # The rest is given: it is written with + and * above.
    def __radd__(self, other: float) -> "Dual":
        return self + other

    def __rmul__(self, other: float) -> "Dual":
        return self * other

    def __neg__(self) -> "Dual":
        return self * -1.0

    def __sub__(self, other: "Dual | float") -> "Dual":
        return self + (-lift(other))

    def __rsub__(self, other: float) -> "Dual":
        return lift(other) - self

    def __repr__(self) -> str:
        return f"Dual({self.value!r}, {self.tangent!r})"


def lift(v: "Dual | float") -> Dual:
    """``v`` as a dual number: a plain number is a constant (tangent 0)."""
    return v if isinstance(v, Dual) else Dual(float(v), 0.0)


def sin(x: "Dual | float") -> "Dual | float":
    """sin of a dual number (tangent: cos(u) u', the textbook's (b.4)), or of a float."""
    ### BEGIN SOLUTION
    if isinstance(x, Dual):
        return Dual(math.sin(x.value), math.cos(x.value) * x.tangent)
    return math.sin(x)
    ### END SOLUTION


def cos(x: "Dual | float") -> "Dual | float":
    """cos of a dual number (tangent: -sin(u) u'), or of a float."""
    ### BEGIN SOLUTION
    if isinstance(x, Dual):
        return Dual(math.cos(x.value), -math.sin(x.value) * x.tangent)
    return math.cos(x)
    ### END SOLUTION


def exp(x: "Dual | float") -> "Dual | float":
    """exp of a dual number (tangent: exp(u) u'), or of a float."""
    ### BEGIN SOLUTION
    if isinstance(x, Dual):
        e = math.exp(x.value)
        return Dual(e, e * x.tangent)
    return math.exp(x)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# 2. Forward mode: one pass per input
# ---------------------------------------------------------------------------------------

def forward_gradient(f, xs: list[float]) -> list[float]:
    """The gradient of the scalar function ``f`` at the point ``xs``, by forward mode.

    ``f`` takes ``len(xs)`` arguments and is written with ``+ - *`` and the ``sin``,
    ``cos`` and ``exp`` above, so it runs on ``Dual`` numbers. One pass of ``f`` gives
    the derivative along one direction: to get d f / d xs[i], give input ``i`` the
    tangent 1 and every other input the tangent 0 (for z = x*y + sin(x) at (2, 3): the
    pass (c.*) for x, the pass (d.*) for y). Call ``f`` exactly once per input and
    return the list of the n partial derivatives.
    """
    ### BEGIN SOLUTION
    grads = []
    for i in range(len(xs)):
        duals = [Dual(float(x), 1.0 if j == i else 0.0) for j, x in enumerate(xs)]
        out = f(*duals)
        grads.append(lift(out).tangent)
    return grads
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# 3. Reverse mode: one sweep over a tape
# ---------------------------------------------------------------------------------------

# The tape of z = x*y + sin(x), in evaluation order (a.3)-(a.5): each record is
# (operation, names of its inputs, name of its output). The values are those of the
# forward pass at x = 2, y = 3.
TEXTBOOK_TAPE = [
    ("mul", ("x", "y"), "a"),
    ("sin", ("x",), "b"),
    ("add", ("a", "b"), "z"),
]
TEXTBOOK_VALUES = {"x": 2.0, "y": 3.0, "a": 6.0, "b": math.sin(2.0), "z": 6.0 + math.sin(2.0)}


def reverse_sweep(tape: list[tuple[str, tuple[str, ...], str]], values: dict[str, float],
                  output: str) -> dict[str, float]:
    """The adjoint ``g[v] = d output / d v`` of every variable ``v`` behind ``output``.

    ``tape`` lists the records ``(op, inputs, out)`` in the order they were evaluated;
    ``op`` is one of ``"add"``, ``"sub"``, ``"mul"`` (two inputs) and ``"sin"``,
    ``"cos"``, ``"exp"`` (one input); an input may appear twice (``x * x``).
    ``values`` holds the value of every variable from the forward pass.

    Start from ``g[output] = 1`` (g.1) and walk the tape *backwards*: each record hands
    its output's adjoint to its inputs, each input *adding* its share (a variable used
    twice gets two shares, as x in (f.5): gx = ga * y + gb * cos(x)). One sweep gives
    the adjoints of all inputs at once. Return a dict with (at least) every variable
    that ``output`` depends on, ``output`` itself included.

    >>> g = reverse_sweep(TEXTBOOK_TAPE, TEXTBOOK_VALUES, "z")
    >>> g["z"], g["a"], g["b"], g["y"], round(g["x"], 6)  # (g.1)-(g.5)
    (1.0, 1.0, 1.0, 2.0, 2.583853)
    """
    ### BEGIN SOLUTION
    g = {output: 1.0}
    for op, inputs, out in reversed(tape):
        if out not in g:
            continue  # the output does not depend on this record
        gout = g[out]
        if op == "add":
            shares = [gout, gout]
        elif op == "sub":
            shares = [gout, -gout]
        elif op == "mul":
            a, b = inputs
            shares = [gout * values[b], gout * values[a]]
        elif op == "sin":
            shares = [gout * math.cos(values[inputs[0]])]
        elif op == "cos":
            shares = [-gout * math.sin(values[inputs[0]])]
        elif op == "exp":
            shares = [gout * values[out]]
        else:
            raise ValueError(f"reverse_sweep: unknown operation {op!r}")
        for name, share in zip(inputs, shares):
            g[name] = g.get(name, 0.0) + share
    return g
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# 4. Jacobians: columns by forward mode, rows by reverse mode
# ---------------------------------------------------------------------------------------

def jacobian_fwd(f, x: np.ndarray) -> np.ndarray:
    """The Jacobian (shape (m, n)) of ``f`` at the vector ``x`` (shape (n,)), by columns.

    ``f`` maps a minigraph tensor of shape (n,) to one of shape (m,). Column k is
    d f / d x[k]: the tangent ``mg.jvp`` returns for the tangent e_k, the k-th unit
    vector. Use ``mg.jvp(f, (x,), (e_k,))`` once per input, n passes in all (this is
    what ``mg.jacfwd(f, vectorize=False)`` does; by default it batches the n tangents
    into one pass), and return a NumPy array.
    """
    ### BEGIN SOLUTION
    x = np.asarray(x, dtype=float)
    columns = []
    for k in range(x.size):
        e = np.zeros_like(x)
        e[k] = 1.0
        _, tangent = mg.jvp(f, (mg.tensor(x),), (mg.tensor(e),))
        columns.append(tangent.numpy())
    return np.stack(columns, axis=1)
    ### END SOLUTION


def jacobian_rev(f, x: np.ndarray) -> np.ndarray:
    """The same Jacobian, by rows: one forward pass, then one reverse sweep per output.

    ``out, vjp_fn = mg.vjp(f, x)`` runs ``f`` once and keeps its tape; row i is
    d out[i] / d x, which ``vjp_fn(e_i)`` gives for the i-th unit vector e_i of the
    output's shape (``vjp_fn`` returns a tuple, one entry per input). Call ``f`` once
    only, sweep m times (this is what ``mg.jacrev(f, vectorize=False)`` does; by default
    it batches the m sweeps into one), and return a NumPy array.
    """
    ### BEGIN SOLUTION
    out, vjp_fn = mg.vjp(f, mg.tensor(np.asarray(x, dtype=float)))
    rows = []
    for i in range(out.size):
        e = np.zeros(out.shape)
        e[i] = 1.0
        (row,) = vjp_fn(mg.tensor(e))
        rows.append(row.numpy())
    return np.stack(rows, axis=0).reshape(out.size, -1)
    ### END SOLUTION
