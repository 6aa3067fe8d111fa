"""The shared oracle suite: functions whose gradients are known in closed form.

Each case gives a function written with minigraph, its arguments, and its gradient
computed *by hand* with NumPy (no minigraph involved). ``test_oracle.py`` checks every
differentiation mode in ``mg.MODES`` against these closed forms and against finite
differences; a mode added later (graph, source) is checked by the same cases.
"""

from __future__ import annotations

import math

import numpy as np

import minigraph as mg

rng = np.random.default_rng(42)
X = rng.normal(size=(6, 4))
Y = np.array([1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
LABELS = np.array([0, 2, 1, 2, 0, 1])
A = rng.normal(size=(4, 4))
W1, W2 = rng.normal(size=(4, 5)) * 0.5, rng.normal(size=(5, 3)) * 0.5


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def textbook(x, y):
    return x * y + mg.sin(x)


def logistic_loss(w):
    return mg.mean(mg.log(1.0 + mg.exp(-mg.tensor(Y) * (mg.tensor(X) @ w))))


def logistic_grad(w):
    z = X @ w
    return X.T @ (-Y * sigmoid(-Y * z)) / len(Y)


def softmax_regression(w):
    return mg.cross_entropy(mg.tensor(X) @ w, mg.tensor(LABELS))


def softmax_regression_grad(w):
    return X.T @ (softmax(X @ w) - np.eye(3)[LABELS]) / len(LABELS)


def quadratic(x):
    return 0.5 * (x * (mg.tensor(A) @ x)).sum()


def norm(x):
    return mg.sqrt((x * x).sum())


def mlp(w1, w2):
    hidden = mg.tanh(mg.tensor(X) @ w1)
    return mg.cross_entropy(hidden @ w2, mg.tensor(LABELS))


def mlp_grads(w1, w2):
    """Backpropagation written out by hand, as a student would on paper."""
    h = np.tanh(X @ w1)
    dlogits = (softmax(h @ w2) - np.eye(3)[LABELS]) / len(LABELS)
    dw2 = h.T @ dlogits
    dh = dlogits @ w2.T
    dw1 = X.T @ (dh * (1 - h * h))
    return dw1, dw2


# name -> (function, arguments, argnums, closed-form gradients)
CASES = {
    "textbook x*y+sin(x)": (textbook, (2.0, 3.0), (0, 1), (3 + math.cos(2.0), 2.0)),
    "logistic regression": (logistic_loss, (W1[:, 0],), 0, logistic_grad(W1[:, 0])),
    "softmax regression": (softmax_regression, (W1[:, :3],), 0,
                           softmax_regression_grad(W1[:, :3])),
    "quadratic form": (quadratic, (X[0],), 0, 0.5 * (A + A.T) @ X[0]),
    "euclidean norm": (norm, (X[1],), 0, X[1] / np.linalg.norm(X[1])),
    "two-layer MLP": (mlp, (W1, W2), (0, 1), mlp_grads(W1, W2)),
}
