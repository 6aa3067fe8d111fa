"""Chapter 09 exercises: composing transformations.

Write the body of each function below (replace the ``raise NotImplementedError`` line),
then grade your work from the repository root::

    minigraph grade chapters/09-composing-transformations

The graded tests check your functions against closed forms, finite differences and, where
PyTorch is installed, ``torch.func``; some of them count how many times your code runs
the function it is given, because what these exercises are about is *how many passes*
a derivative takes. The reading is ``README.md`` in this folder; the notebook is
``notebooks/09-composing-transformations.ipynb``.

Exercises
---------
1. ``mixed_partial(f, x, y)``: the mixed partial d2f/dydx by nesting ``mg.grad`` in
   ``mg.grad`` (for z = x*y + sin(x) it is 1).
2. ``hvp(f, x, v)``: a Hessian-vector product by forward-over-reverse, ``mg.jvp`` of
   ``mg.grad``: one pass of f, and no Hessian.
3. ``per_example_gradients(loss, w, X, Y)``: the gradient of the loss of every example
   of a batch, with ``mg.vmap`` over ``mg.grad``: one pass of the loss for the batch.
4. ``jacobian_batched(f, x)``: a whole Jacobian from the JVPs of all n basis vectors,
   run as one batched pass with ``mg.vmap``.
5. ``mul_batch(dims, x, y)``: the batching rule of ``x * y``, the piece of the primitive
   table that ``mg.vmap`` reads.
"""

from __future__ import annotations

import numpy as np

import minigraph as mg


# ---------------------------------------------------------------------------------------
# 1. Levels: a mixed partial by nesting
# ---------------------------------------------------------------------------------------

def mixed_partial(f, x: float, y: float):
    """The mixed partial d2f/dydx of the scalar function ``f(x, y)`` at ``(x, y)``.

    Differentiate ``f`` with respect to x with ``mg.grad``, which gives a function of
    (x, y); differentiate *that* with respect to y with a second ``mg.grad`` around it.
    The inner ``grad`` starts later, so it takes the higher level: its boxes hold the
    outer one's, and the two derivatives never mix. For the textbook's
    z = x*y + sin(x), dz/dx = y + cos(x) and d2z/dydx = 1.

    ``f`` must run once: nesting costs one run of f, not one per derivative. Return a
    minigraph tensor of shape () (what ``mg.grad`` returns).
    """
    ### BEGIN SOLUTION
    dfdx = mg.grad(f, argnums=0)
    return mg.grad(lambda yy: dfdx(x, yy))(y)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# 2. Hessian-vector products, forward over reverse
# ---------------------------------------------------------------------------------------

def hvp(f, x, v):
    """The Hessian-vector product H(x) v of the scalar function ``f`` of one tensor ``x``.

    ``mg.grad(f)`` is a function of x written with minigraph's operations, so ``mg.jvp``
    can push a tangent through it: the tangent of grad f at x along v is H(x) v. That is
    forward mode (one pass) over reverse mode (one sweep): a few times the cost of f,
    whatever the size of x. Do not build the Hessian (``mg.hessian``, ``mg.jacfwd`` and
    ``mg.jacrev`` are refused here); run f once.

    ``x`` and ``v`` are minigraph tensors of one shape; return a tensor of that shape.
    """
    ### BEGIN SOLUTION
    _, Hv = mg.jvp(mg.grad(f), (x,), (v,))
    return Hv
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# 3. Per-example gradients
# ---------------------------------------------------------------------------------------

def per_example_gradients(loss, w, X, Y):
    """The gradient with respect to ``w`` of ``loss(w, x, y)`` for every example of a batch.

    ``loss(w, x, y)`` is written for *one* example: ``w`` of shape (d,), ``x`` of shape
    (d,), ``y`` of shape (); it returns a scalar. ``X`` has shape (B, d), ``Y`` shape (B,).
    Return a tensor of shape (B, d) whose row i is d loss(w, X[i], Y[i]) / d w.

    Write it with ``mg.vmap`` around ``mg.grad``: ``w`` is shared by every example
    (``in_axes`` None), ``X`` and ``Y`` are batched along axis 0. The loss must run
    *once* for the whole batch, not once per example.
    """
    ### BEGIN SOLUTION
    return mg.vmap(mg.grad(loss, argnums=0), in_axes=(None, 0, 0))(w, X, Y)
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# 4. A Jacobian in one batched pass
# ---------------------------------------------------------------------------------------

def jacobian_batched(f, x):
    """The Jacobian of ``f`` at ``x``, shape (m, n), from n JVPs run as one batched pass.

    ``f`` maps a tensor of shape (n,) to one of shape (m,). Column k of the Jacobian is
    the tangent ``mg.jvp(f, (x,), (e_k,))`` gives for the k-th unit vector e_k (chapter
    02 ran these n passes one by one). Here, write the JVP for one tangent as a function
    of that tangent and ``mg.vmap`` it over the n rows of the n x n identity: f runs
    *once*, on a batch of n tangents. vmap puts the batch axis first, so mind which axis
    is which. ``mg.jacfwd``, ``mg.jacrev`` and ``mg.hessian`` are refused here.

    Return a minigraph tensor of shape (m, n) and x's dtype.
    """
    ### BEGIN SOLUTION
    n = x.shape[0]
    eye = mg.tensor(np.eye(n), dtype=x.dtype)
    columns = mg.vmap(lambda t: mg.jvp(f, (x,), (t,))[1])(eye)  # (n, m): row k is column k
    return columns.T
    ### END SOLUTION


# ---------------------------------------------------------------------------------------
# 5. A batching rule
# ---------------------------------------------------------------------------------------

def mul_batch(dims, x, y):
    """The batching rule of ``x * y`` (``minigraph/ops/batch_rules.py`` states the contract).

    ``dims`` is a pair: ``dims[i]`` is ``0`` when argument i carries a batch axis in
    front (its shape is (B,) + the shape of one example) and ``None`` when it is the same
    for every example (its shape is that of one example). At least one is batched.
    Return ``x * y`` for every example at once, with the batch axis in front: result[b]
    must equal ``x_b * y_b`` with NumPy's broadcasting *between the examples' shapes*.

    The trap: NumPy broadcasts from the right. A batch of scalars (shape (B,)) times an
    unbatched vector (shape (3,)) would meet B against 3. Give a batched argument whose
    example has a lower rank than the other argument's example enough axes of length 1
    after its batch axis (``mg.reshape``) before multiplying. Use minigraph functions
    only (``mg.reshape``, ``*``, ``x.shape``): the rule must run on any value kind, as
    the library's rules do (the tests run it under ``mg.jvp`` and ``mg.grad``).
    ``minigraph.ops.batch_rules.align`` is refused here: that is the part you write.
    """
    ### BEGIN SOLUTION
    def example_rank(a, d):
        return len(a.shape) - (d is not None)

    top = max(example_rank(x, dims[0]), example_rank(y, dims[1]))
    out = []
    for a, d in zip((x, y), dims):
        r = example_rank(a, d)
        if d is not None and r < top:
            shape = tuple(a.shape)
            a = mg.reshape(a, shape[:1] + (1,) * (top - r) + shape[1:])
        out.append(a)
    return out[0] * out[1]
    ### END SOLUTION
