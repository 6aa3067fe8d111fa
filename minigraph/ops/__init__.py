"""The primitive table and the functions that bind its entries.

One module per family of operations; ``PRIMITIVES`` maps every primitive's name to its
single definition (kernel, shape rule, JVP and VJP rules, cost class).
"""

from .copy import astype, identity, ones_like, stop_gradient, to_device, zeros_like
from .elementwise import (abs, add, add_n, cos, div, equal, exp, floor_divide, greater,
                          greater_equal, less, less_equal, log, log_sigmoid, maximum,
                          minimum, mul, neg, not_equal, pow, relu, relu_grad, remainder,
                          sigmoid, sin, sqrt, sub, tanh, where)
from .linalg import matmul
from .nn import (binary_cross_entropy_with_logits, cross_entropy, log_softmax, log_softmax_grad,
                 nll_loss, nll_loss_grad, one_hot, softmax)
from .primitive import PRIMITIVES, Primitive, bind
from .reduce import max, mean, min, sum, sum_to
from .shape import (broadcast_to, concatenate, getitem, matrix_transpose, reshape,
                    scatter_add, stack, transpose)

__all__ = [
    "PRIMITIVES", "Primitive", "bind",
    "abs", "add", "add_n", "sub", "mul", "div", "floor_divide", "remainder", "neg", "pow",
    "maximum", "minimum", "exp", "log", "sin", "cos",
    "tanh", "sigmoid", "log_sigmoid", "binary_cross_entropy_with_logits", "relu", "relu_grad", "sqrt", "where", "less", "less_equal", "greater",
    "greater_equal", "equal", "not_equal", "sum", "mean", "max", "min", "sum_to", "matmul",
    "reshape", "transpose", "matrix_transpose", "broadcast_to", "getitem", "scatter_add",
    "concatenate", "stack", "softmax", "log_softmax", "log_softmax_grad", "one_hot", "nll_loss",
    "nll_loss_grad", "cross_entropy", "identity",
    "stop_gradient", "astype", "to_device", "zeros_like", "ones_like",
]
