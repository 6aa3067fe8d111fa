"""minigraph: automatic differentiation and dataflow graphs, small enough to read.

The public API (see DESIGN.md): tensors and devices, the primitive functions, forward
mode (``jvp``, ``jacfwd``), reverse mode with a tape (``backward``, ``vjp``, ``jacrev``),
``grad`` / ``value_and_grad`` in every available mode, and ``gradcheck``.
"""

from . import errors
from .autodiff.api import MODES, REVERSE_MODES, grad, hessian, jacrev, value_and_grad, vjp
from .autodiff.batching import vmap
from .autodiff.check import gradcheck
from .autodiff.source import SourceTransformError, source_grad
from .autodiff.forward import Dual, jacfwd, jvp
from .autodiff.tape import enable_grad, is_grad_enabled, no_grad
from .autodiff.checkpoint import checkpoint
from .device import (Device, cuda_available, device, devices, get_device, register_device,
                     set_virtual_cpus)
from .ops import (PRIMITIVES, abs, add, astype, binary_cross_entropy_with_logits,
                  broadcast_to, concatenate, cos, cross_entropy, div, equal, exp,
                  floor_divide, getitem, greater, greater_equal, identity, less, less_equal,
                  log, log_sigmoid, log_softmax, log_softmax_grad, matmul, matrix_transpose,
                  max, maximum, mean, min, minimum, mul, neg, nll_loss, nll_loss_grad,
                  not_equal, one_hot, ones_like, pow, relu, relu_grad, remainder, reshape,
                  scatter_add, sigmoid, sin, softmax, sqrt, stack, stop_gradient, sub, sum,
                  sum_to, tanh, to_device, transpose, where, zeros_like)
from .tensor import Tensor, ones, tensor, zeros
from .interchange import from_dlpack, load, save
from .graph.compile import compile_graph
from .graph.gradients import gradients
from .ops import add_n
from .graph.graph import (Graph, Node, constant, control_dependencies, name_scope, placeholder,
                          variable)
from .graph.trace import trace
from .graph import passes
from . import distributed, nn, parallel
from .runtime.partition import partition
from .runtime.placement import auto_place
from .runtime.session import Session

float32, float64, int64, int32, bool_ = "float32", "float64", "int64", "int32", "bool"

__version__ = "0.1.0"

__all__ = [
    "errors", "MODES", "REVERSE_MODES", "grad", "source_grad", "SourceTransformError",
    "value_and_grad", "gradcheck",
    "Dual", "jacfwd", "jvp", "enable_grad", "is_grad_enabled", "cuda_available", "jacrev",
    "no_grad", "vjp", "Device", "device", "devices", "get_device", "register_device",
    "set_virtual_cpus", "PRIMITIVES", "abs", "add", "astype", "broadcast_to", "concatenate", "getitem",
    "cos",
    "cross_entropy", "div", "equal", "exp", "floor_divide", "remainder", "greater", "greater_equal", "identity", "less",
    "less_equal", "log", "log_softmax", "log_softmax_grad", "nll_loss_grad", "matmul",
    "matrix_transpose", "max", "maximum", "mean", "min", "minimum", "mul", "neg", "not_equal",
    "nll_loss", "one_hot",
    "pow", "relu", "relu_grad", "reshape", "scatter_add", "sigmoid", "sin", "softmax", "sqrt",
    "stop_gradient", "sub", "sum", "sum_to", "tanh", "to_device", "transpose", "where",
    "zeros_like",
    "ones_like", "Tensor", "vmap", "stack", "hessian", "log_sigmoid",
    "binary_cross_entropy_with_logits",
    "ones", "tensor", "zeros", "compile_graph", "add_n", "gradients", "Graph", "Node", "constant",
    "control_dependencies", "name_scope", "placeholder", "variable", "trace", "passes", "Session",
    "partition", "parallel", "nn", "auto_place", "float32", "float64", "int64", "int32", "bool_",
    "from_dlpack", "save", "load", "checkpoint",
]
