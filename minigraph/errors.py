"""The errors minigraph raises.

Each one is also a subclass of the built-in exception a NumPy or PyTorch user would
expect (``ValueError`` for a shape mismatch, ``TypeError`` for a dtype problem, ...),
so ``except ValueError`` keeps working; the minigraph class says *which* rule failed.
"""


class MinigraphError(Exception):
    """Base class of every error minigraph raises on purpose."""


class ShapeError(MinigraphError, ValueError):
    """Shapes that do not fit an operation (broadcasting, matmul, reshape, ...)."""


class AxisError(ShapeError, IndexError):
    """An axis out of range for a tensor's rank (NumPy's ``AxisError`` is both too)."""


class DTypeError(MinigraphError, TypeError):
    """A dtype an operation cannot take (for example the gradient of an integer)."""


class DeviceError(MinigraphError, RuntimeError):
    """An unknown or unavailable device, or tensors of two devices in one eager op."""


def mixed_devices(who: str, names: "list[str]", given: str, where: str = "") -> DeviceError:
    """The one error for arguments of one operation on different devices, in every mode:
    ``who`` is the operation, ``names`` the devices (sorted), ``given`` the arguments as
    the mode can describe them (shapes on the tape, node names in a graph), ``where``
    the user's line where a graph has one."""
    return DeviceError(f"{who}: arguments live on different devices "
                       f"({' and '.join(names)}): {given}. minigraph never copies "
                       f"silently; move one with x.to('{names[0]}'){where}")


class GradientError(MinigraphError, RuntimeError):
    """A gradient that cannot be computed as asked (non-scalar output, no path, ...)."""


class GradcheckError(MinigraphError, AssertionError):
    """Analytic and numerical derivatives disagree (raised by ``mg.gradcheck``)."""


class NoArrayError(MinigraphError, AttributeError):
    """``x.data`` or a DLPack export of a value that has no array to hand out: a graph
    node, a value inside a transformation. (An AttributeError too, so that
    ``getattr(x, "data", None)`` and ``hasattr`` still answer None and False.)"""


class PytreeError(MinigraphError, TypeError):
    """A list, tuple or dict holding arrays where a transformation takes one array per
    argument: JAX's and torch.func's *pytrees*, which minigraph does not take."""
