"""Neural-network layers for the examples, with PyTorch's names (``mg.nn``).

``Module`` and ``Sequential`` (module.py), ``Linear``, ``ReLU``, ``Tanh`` (layers.py),
``CrossEntropyLoss`` and ``MSELoss`` (loss.py), ``SGD`` (optim.py), and
``functional_call`` / ``parameter_placeholders`` for graphs whose parameters are inputs
(stateless.py). Just enough for the chapters, and small enough to read in one sitting.
"""

from .layers import Linear, ReLU, Tanh, manual_seed
from .loss import CrossEntropyLoss, MSELoss
from .module import IncompatibleKeys, Module, Sequential, StateDictError
from .optim import SGD
from .stateless import functional_call, parameter_placeholders

__all__ = ["Module", "Sequential", "Linear", "ReLU", "Tanh", "manual_seed",
           "CrossEntropyLoss", "MSELoss", "SGD", "functional_call", "parameter_placeholders",
           "StateDictError", "IncompatibleKeys"]
