"""Shape primitives: reshape, transpose, broadcast_to, indexing, concatenate; stack.

They move or select elements without arithmetic, so their derivative rules move the
adjoint back the other way: a reshape's VJP reshapes back, a transpose's applies the
inverse permutation, ``broadcast_to``'s sums the copies (``sum_to``), indexing's adds
the adjoint into zeros at the indexed places (``scatter_add``), and ``concatenate``'s
cuts the adjoint into the pieces that were joined.

Their batching rules (``mg.vmap``) put the batch axis in front of the shape or index
they were given and shift every axis they name by one.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np  # host-side shape arithmetic, and NumPy's own reshape/transpose
from array_api_compat import device as array_device

from ..errors import AxisError, MinigraphError, ShapeError, mixed_devices
from . import batch_rules as B
from . import copy as C
from . import reduce as R
from . import shape_rules as S
from .primitive import KINDS, Each, always_a_view, bind, names_user_line, primitive


# -- reshape, transpose, broadcast_to ----------------------------------------------------

def _reshape_shape(x: Any, shape: tuple[int, ...]) -> tuple:
    if int(np.prod(S.shape_of(x))) != int(np.prod(shape)):
        raise ShapeError(f"reshape: cannot reshape a tensor of shape {S.shape_of(x)} "
                         f"({int(np.prod(S.shape_of(x)))} elements) into shape {shape}")
    return tuple(shape), S.dtype_of(x)


def _reshape_kernel(xp: Any, x: Any, shape: tuple[int, ...]) -> Any:
    # NumPy's own method: array-api-compat's function wraps the same call in Python
    # (about 1 µs, paid by every line of a compiled graph that reshapes).
    return x.reshape(shape) if type(x) is np.ndarray else xp.reshape(x, shape)


RESHAPE = primitive(
    "reshape", _reshape_kernel, _reshape_shape,
    jvp=[lambda t, out, x, shape: reshape(t, shape)],
    vjp=[lambda g, out, x, shape: reshape(g, S.shape_of(x))], view=True,
    returns_view=always_a_view,  # (unless it has to copy: the memory plan checks)
    batch=lambda dims, x, shape: reshape(x, S.shape_of(x)[:1] + shape),
    public="reshape", positional=("shape",), cost="free")


def _transpose_shape(x: Any, axes: tuple[int, ...]) -> tuple:
    shape = S.shape_of(x)
    if sorted(axes) != list(range(len(shape))):
        raise ShapeError(f"transpose: axes {axes} are not a permutation of the "
                         f"{len(shape)} axes of shape {shape}")
    return tuple(shape[a] for a in axes), S.dtype_of(x)


def _inverse(axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(range(len(axes)), key=axes.__getitem__))


def _transpose_kernel(xp: Any, x: Any, axes: tuple[int, ...]) -> Any:
    # (as _reshape_kernel: the Array API has only the function, NumPy also the method)
    return x.transpose(axes) if type(x) is np.ndarray else xp.permute_dims(x, axes)


TRANSPOSE = primitive(
    "transpose", _transpose_kernel, _transpose_shape,
    jvp=[lambda t, out, x, axes: transpose(t, axes)],
    vjp=[lambda g, out, x, axes: transpose(g, _inverse(axes))], view=True,
    returns_view=always_a_view,
    batch=lambda dims, x, axes: transpose(x, (0,) + tuple(a + 1 for a in axes)),
    public="transpose", positional=("axes",), cost="free")


def _broadcast_shape(x: Any, shape: tuple[int, ...]) -> tuple:
    if S.broadcast_shapes("broadcast_to", S.shape_of(x), shape) != tuple(shape):
        raise ShapeError(f"broadcast_to: cannot broadcast shape {S.shape_of(x)} to {shape}")
    return tuple(shape), S.dtype_of(x)


BROADCAST_TO = primitive(
    "broadcast_to", lambda xp, x, shape: xp.broadcast_to(x, shape), _broadcast_shape,
    jvp=[lambda t, out, x, shape: broadcast_to(t, shape)],
    vjp=[lambda g, out, x, shape: R.sum_to(g, S.shape_of(x))], view=True,
    returns_view=always_a_view,
    batch=lambda dims, x, shape: _broadcast_batched(x, shape),
    public="broadcast_to", positional=("shape",), cost="free")


def _broadcast_batched(x: Any, shape: tuple[int, ...]) -> Any:
    """broadcast_to's batching rule: new axes go after the batch axis, not before it."""
    own = S.shape_of(x)  # (B,) + the shape of one example
    x = reshape(x, own[:1] + (1,) * (len(shape) - len(own) + 1) + own[1:])
    return bind(BROADCAST_TO, x, shape=own[:1] + tuple(shape))


# -- indexing ------------------------------------------------------------------------------

def _is_basic(index: tuple) -> bool:
    """Basic indexing (ints, slices, None, ...) selects each element at most once. A bool
    is no int here, though Python's bool subclasses int: NumPy reads ``x[0, True]`` as a
    0-d boolean mask, which is advanced indexing (it adds an axis of size 1, or 0)."""
    return all(i is None or i is Ellipsis or (isinstance(i, (int, slice)) and type(i) is not bool)
               for i in index)


def on_device(xp: Any, x: Any, index: tuple) -> tuple:
    """Move the array parts of an index to the device of ``x`` (``x[index]`` reads
    them, ``x[index] = v`` writes; array-api-strict takes no host array there)."""
    return tuple(i if i is None or i is Ellipsis or isinstance(i, (int, slice))
                 else xp.asarray(i, device=array_device(x)) for i in index)


def set_items(device: Any, array: Any, index: tuple, value: Any) -> None:
    """``array[index] = value`` (``tape.assign_item``: ``index`` from :func:`host_index`,
    ``value`` a number or an array of ``device``), the index's arrays on the array's
    device, as getitem's kernel reads them. The Array API assigns through a boolean mask
    alone and no integer arrays (array-api-strict refuses both otherwise): a namespace
    without NumPy's ``add.at`` (as the scatter's kernel asks) writes a host copy then."""
    xp = device.xp
    if _is_basic(index) or hasattr(xp, "add") and hasattr(xp.add, "at"):
        array[on_device(xp, array, index)] = value
        return
    host = device.to_numpy(array).copy()  # (to_numpy may share the array's memory)
    host[index] = value if isinstance(value, (bool, int, float)) else device.to_numpy(value)
    array[...] = device.asarray(host)


def _indexed(shape: tuple, index: tuple) -> tuple:
    """The shape of ``x[index]`` for an ``x`` of ``shape``; a bad index (out of bounds,
    too many, floats) raises an error naming getitem, the shape and the index.

    It indexes a zero-strided host array of the same shape: NumPy works out the shape
    without touching any data. NumPy's errors become minigraph's of the same built-in
    class, so graph mode can name the node: an IndexError (out of bounds, floats) an
    AxisError, which is also one; a ValueError (a slice step of 0, which NumPy and
    PyTorch refuse too) a ShapeError, which is also one."""
    probe = np.broadcast_to(np.empty((), dtype=np.int8), shape)
    try:
        return probe[index].shape
    except MinigraphError:  # (an index's own refusal, a vmap batch's: said as it is)
        raise
    except (IndexError, ValueError) as exc:
        error = AxisError if isinstance(exc, IndexError) else ShapeError
        raise error(f"getitem: cannot index a tensor of shape {tuple(shape)} with "
                    f"index {index!r}: {exc}") from None


def _index_shape(x: Any, index: tuple) -> tuple:
    return _indexed(S.shape_of(x), index), S.dtype_of(x)


def _check_scatter(g_shape: tuple, index: tuple, shape: tuple) -> None:
    """``g`` must broadcast to the places it is added at, ``x[index]`` for an ``x`` of
    ``shape``, as NumPy's ``np.add.at`` asks; the batching and VJP rules rely on it.
    (NumPy's plain assignment, the basic-index kernel, would also drop leading 1s.)"""
    places = _indexed(shape, index)
    if len(g_shape) > len(places) or any(
            n not in (1, m) for n, m in zip(g_shape[::-1], places[::-1])):
        raise ShapeError(f"scatter_add: g of shape {tuple(g_shape)} does not broadcast to "
                         f"the places it is added at, x[index] of shape {places} (x of "
                         f"shape {tuple(shape)}, index {index!r})")


def _scatter_add_shape(g: Any, index: tuple, shape: tuple) -> tuple:
    _check_scatter(S.shape_of(g), index, tuple(shape))
    return tuple(shape), S.dtype_of(g)


def _scatter_add_kernel(xp: Any, g: Any, index: tuple, shape: tuple) -> Any:
    _check_scatter(g.shape, index, shape)  # (eager mode asks the rule only on failure)
    out = xp.zeros(shape, dtype=g.dtype, device=array_device(g))
    if _is_basic(index):
        out[index] = g
    elif hasattr(xp, "add") and hasattr(xp.add, "at"):  # NumPy, CuPy: repeated indices add up
        xp.add.at(out, on_device(xp, out, index), g)
    else:
        raise NotImplementedError(
            f"the gradient of integer-array indexing needs a scatter-add, which the array "
            f"namespace {xp.__name__} does not offer; use slices or another device")
    return out


def _batched_index(index: tuple) -> tuple[tuple, int]:
    """The index of one example, for a batch: ``(slice(None),) + index``, and the axis at
    which NumPy puts the batch axis in the result.

    That axis is 0, except when the index has integer arrays (or ints alongside them)
    that are not next to each other: NumPy then puts the axes those indices make first
    ("combining advanced and basic indexing" in NumPy's manual), before the batch axis.
    """
    batched = (slice(None),) + index
    arrays = [np.asarray(i) for i in index if not _is_basic((i,))]
    if not arrays:
        return batched, 0
    advanced = [k for k, i in enumerate(batched) if not _is_basic((i,)) or isinstance(i, int)]
    if advanced == list(range(advanced[0], advanced[-1] + 1)):
        return batched, 0  # next to each other: their axes stay where they were
    # (a boolean mask counts as one axis of its number of Trues; a 0-d one, a bool
    # scalar, too: True is an axis of size 1, False of size 0)
    shapes = [(np.count_nonzero(a),) if a.dtype == bool else a.shape for a in arrays]
    return batched, len(np.broadcast_shapes(*shapes))


def _getitem_batched(dims: tuple, x: Any, index: tuple) -> Any:
    _index_shape(B.example(x, dims[0]), index)  # a bad index named as the user wrote it
    batched, at = _batched_index(index)
    return B.moveaxis(bind(GETITEM, x, index=batched), at, 0)


def _scatter_add_batched(dims: tuple, g: Any, index: tuple, shape: tuple) -> Any:
    """g broadcasts to one example's ``x[index]``: given the rank of ``x[index]`` first
    (1s after the batch axis, as ``B.align`` does), so that moving the batch axis to
    where NumPy puts it (``at``) leaves every other axis against its own."""
    for i in index:  # (scatter_add lets source mode's loop index through, not a batch's)
        if type(i) in KINDS:
            host_index(i, "scatter_add")  # (which refuses it, saying why)
    _scatter_add_shape(B.example(g, dims[0]), index, shape)  # its checks, on one example
    batched, at = _batched_index(index)
    own = S.shape_of(g)  # (B,) + the shape of one example's g
    g = reshape(g, own[:1] + (1,) * (len(_indexed(tuple(shape), index)) - len(own) + 1)
                + own[1:])
    return bind(SCATTER_ADD, B.moveaxis(g, 0, at), index=batched,
                shape=own[:1] + tuple(shape))


def _basic_index_view(out_shape: tuple, params: dict) -> bool:
    """NumPy's basic indexing (ints, slices, None, ...) returns a view, unless ints take
    every axis (then a NumPy scalar); an integer-array index copies."""
    index = params["index"]
    return out_shape != () and isinstance(index, tuple) and all(
        i is None or i is Ellipsis or type(i) is int or isinstance(i, slice) for i in index)


GETITEM = primitive(
    "getitem", lambda xp, x, index: x[on_device(xp, x, index)], _index_shape,
    jvp=[lambda t, out, x, index: getitem(t, index)],
    vjp=[lambda g, out, x, index: scatter_add(g, index, S.shape_of(x))], view=True,
    returns_view=_basic_index_view,
    batch=_getitem_batched,
    symbol="[]", public="getitem", positional=("index",), cost="free")

SCATTER_ADD = primitive(  # the adjoint of getitem: add g into zeros of ``shape`` at ``index``
    "scatter_add", _scatter_add_kernel, _scatter_add_shape,
    jvp=[lambda t, out, g, index, shape: scatter_add(t, index, shape)],
    # (g may have broadcast to x[index]: its share is summed back to g's shape)
    vjp=[lambda gg, out, g, index, shape: R.sum_to(getitem(gg, index), S.shape_of(g))],
    cost="expensive", batch=_scatter_add_batched,
    public="scatter_add", positional=("index", "shape"))


# -- concatenate ------------------------------------------------------------------------------

def _concat_shape(*xs: Any, axis: int) -> tuple:
    shapes = [S.shape_of(x) for x in xs]
    rest = {s[:axis] + s[axis + 1:] for s in shapes}
    if len(rest) > 1 or any(len(s) != len(shapes[0]) for s in shapes):
        raise ShapeError(f"concatenate: shapes {shapes} differ outside axis {axis}")
    total = sum(s[axis] for s in shapes)
    return shapes[0][:axis] + (total,) + shapes[0][axis + 1:], S.promote(*xs)


def _piece(i: int):
    """The VJP rule of argument ``i`` of concatenate: its slice of the adjoint."""
    def rule(g: Any, out: Any, *xs: Any, axis: int) -> Any:
        return _pieces(g, out, *xs, axis=axis)[i]
    return rule


def _pieces(g: Any, out: Any, *xs: Any, axis: int) -> list:
    """Every argument's slice of the adjoint, in one pass over the arguments."""
    slices, start = [], 0
    for x in xs:
        stop = start + S.shape_of(x)[axis]
        slices.append(getitem(g, (slice(None),) * axis + (slice(start, stop),)))
        start = stop
    return slices


def _joined_tangents(tangents: list, out: Any, *xs: Any, axis: int) -> Any:
    """The tangent of a concatenation: its arguments' tangents, concatenated (zeros for
    those that have none); None if none has one."""
    if all(t is None for t in tangents):
        return None
    return concatenate([t if t is not None else C.zeros_like(x) for t, x in zip(tangents, xs)],
                       axis)


def _write_concatenate(prim: Any, args: list[str], params: dict, literal: Any) -> str:
    return f"mg.concatenate([{', '.join(args)}], axis={literal(params['axis'])})"


CONCATENATE = primitive(
    "concatenate", lambda xp, *xs, axis: xp.concat(list(xs), axis=axis), _concat_shape,
    jvp=Each(lambda i: lambda t, out, *xs, axis: _joined_tangents(
        [t if k == i else None for k in range(len(xs))], out, *xs, axis=axis),
        together=_joined_tangents),
    vjp=Each(_piece, together=_pieces),
    batch=lambda dims, *xs, axis: B.all_batched("concatenate")(dims, *xs, axis=axis + 1),
    public="concatenate", write=_write_concatenate)


# -- the public functions -----------------------------------------------------------------------

def reshape(x: Any, shape: "tuple[int, ...] | int") -> Any:
    """The same elements in a new shape; one size may be -1 (inferred)."""
    if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):
        shape = S.sizes("reshape", shape, infer=True)  # (the common case checks once)
    if -1 in shape:
        S.rank("reshape to a shape with -1", x)  # (the size to divide must be known)
        known = int(np.prod([n for n in shape if n != -1]))
        size = int(np.prod(S.shape_of(x)))
        if known == 0 or size % known:
            raise ShapeError(f"reshape: cannot reshape shape {S.shape_of(x)} into {shape}")
        shape = tuple(size // known if n == -1 else n for n in shape)
    return bind(RESHAPE, x, shape=shape)


def transpose(x: Any, axes: "tuple[int, ...] | None" = None) -> Any:
    """Permute the axes (reverse them by default, like ``numpy.transpose``). ``axes``,
    as NumPy takes it: None, a sequence of ints (a tuple, a list, an integer array), or
    one int (``x.transpose(0)`` of a vector: a permutation of one)."""
    ndim = S.rank("transpose", x)
    if axes is None:
        axes = tuple(reversed(range(ndim)))
    else:
        if isinstance(axes, (int, np.integer)) or isinstance(axes, np.ndarray) and axes.ndim == 0:
            axes = (axes,)
        elif not (isinstance(axes, (tuple, list)) or
                  isinstance(axes, np.ndarray) and axes.ndim == 1):
            raise TypeError(f"transpose: axes must be None, an int or a sequence of ints (a "
                            f"permutation of the axes of shape {S.shape_of(x)}), got "
                            f"{type(axes).__name__} {axes!r}")
        axes = tuple(S.check_axis("transpose", a, x) for a in axes)  # (each an integer)
        if sorted(axes) != list(range(ndim)):
            raise ShapeError(f"transpose: axes {axes} are not a permutation of the "
                             f"{ndim} axes of a tensor of shape {S.shape_of(x)}")
    return bind(TRANSPOSE, x, axes=axes)


def matrix_transpose(x: Any) -> Any:
    """Swap the last two axes (``x.mT``); a value of fewer than two axes has no matrix
    to transpose, and is refused, as NumPy refuses it."""
    ndim = S.rank("matrix_transpose", x)
    if ndim < 2:
        raise ShapeError(f"matrix_transpose (x.mT): a matrix transpose with ndim < 2 is "
                         f"undefined, as in NumPy; got a tensor of shape {S.shape_of(x)} "
                         f"(rank {ndim}). Give it two axes first (x[None] for a row)")
    return transpose(x, tuple(range(ndim - 2)) + (ndim - 1, ndim - 2))


def broadcast_to(x: Any, shape: tuple[int, ...]) -> Any:
    """Repeat ``x`` along new or size-1 axes to ``shape``, like ``numpy.broadcast_to``."""
    if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):
        shape = S.sizes("broadcast_to", shape)  # (the common case checks once)
    if S.shape_of(x) == shape:
        return x
    return bind(BROADCAST_TO, x, shape=shape)


def same_device(who: str, values: "list[Any] | tuple[Any, ...]") -> None:
    """Refuse tensors among ``values`` that live on different devices, naming ``who``,
    the function the user called, and the values as given. A function made of
    primitives (``stack``, ``matmul`` of a vector, indexing by a tensor) asks before
    its first step: the check of the eager interpreter would name an inner primitive
    (concatenate) and shapes the user never wrote (a vector made a matrix). Mixing
    devices is an error, never a silent copy."""
    devices = {id(d) for v in values if (d := getattr(v, "device", None)) is not None}
    if len(devices) < 2:
        return  # (the common case, without the import below)
    from ..tensor import Tensor  # (tensor.py imports the ops)

    tensors = [v for v in values if isinstance(v, Tensor)]
    names = sorted({t.device.name for t in tensors})
    if len(names) > 1:
        given = ", ".join(f"shape {t.shape} {t.dtype} on {t.device.name}" for t in tensors)
        raise mixed_devices(who, names, given)


def host_index(i: Any, who: str = "getitem", x: Any = None) -> Any:
    """Index parts as the kernel takes them: integer tensors and arrays become host
    arrays of their own, copies. The index is a parameter of the operation, which the
    tape keeps for the backward pass: a later ``idx[0] = 2`` must not change which
    elements the recorded gradient goes to (PyTorch keeps the index tensor and refuses
    the sweep after such a write; a copy gives the gradient of what was computed).
    ``who``: what an error calls the operation (``x[...] = value`` for an assignment);
    ``x``: the value indexed, whose device an index tensor must live on (a copy from
    another device would be a silent one)."""
    if i is None or i is Ellipsis or isinstance(i, (int, slice)):
        return i
    if type(i) in KINDS:  # an index is a parameter, fixed when the op is made: not a value
        raise ShapeError(f"{who}: an index must be ints, slices or integer arrays/tensors, "
                         f"not a {type(i).__name__}: an index is fixed when the operation is "
                         f"made, and this one is known only later (a graph node when its "
                         f"graph runs; under vmap, one index per example); use mg.one_hot or "
                         f"mg.where to select")
    if hasattr(i, "numpy"):  # (a tensor: its values, not its memory)
        same_device(who, (x, i))
        return np.array(i.device.to_numpy(i.data))
    index = np.array(i)
    if isinstance(i, (list, tuple)) and index.size == 0:  # ([] is float64 to NumPy, which
        return index.astype(np.intp)  # reads x[[]] as an empty list of positions)
    return index


def getitem(x: Any, index: Any) -> Any:
    """``x[index]``: ints, slices, ``None``, ``...`` and integer arrays; differentiable."""
    index = _spelled_out(index, lambda: S.rank("getitem", x))
    return bind(GETITEM, x, index=tuple(host_index(i, "getitem", x) for i in index))


def scatter_add(g: Any, index: Any, shape: tuple[int, ...]) -> Any:
    """Zeros of ``shape`` with ``g`` added at ``index`` (repeated indices add up), the
    index read as ``x[index]`` reads it: getitem's VJP. (The index getitem's rule passes
    may hold a loop index that source mode knows only when its program runs.)"""
    shape = S.sizes("scatter_add", shape)
    index = tuple(i if type(i) in KINDS else host_index(i, "scatter_add", g)
                  for i in _spelled_out(index, lambda: len(shape)))
    return bind(SCATTER_ADD, g, index=index, shape=shape)


def _spelled_out(index: Any, rank: Callable[[], int]) -> tuple:
    """``index`` as NumPy reads ``x[index]``: a tuple (one int or array indexes axis 0),
    with NumPy's implicit trailing ``:``s spelled out as ``...``. (x's ``rank()`` is asked
    only then: an index with ``...`` fits a graph value of unknown shape.)"""
    index = index if isinstance(index, tuple) else (index,)
    if not any(i is Ellipsis for i in index) and sum(i is not None for i in index) < rank():
        index = index + (Ellipsis,)
    return index


@names_user_line
def concatenate(xs: "list[Any] | tuple[Any, ...]", axis: int = 0) -> Any:
    """Join tensors along an existing axis, like ``numpy.concatenate``."""
    xs = S.operands("concatenate", xs)
    if not xs:
        raise ShapeError("concatenate: needs at least one tensor")
    ndim = S.rank("concatenate", xs[0])
    if ndim == 0:
        raise ShapeError("concatenate: zero-dimensional tensors cannot be concatenated; "
                         "use mg.stack to give them an axis")
    return bind(CONCATENATE, *xs, axis=S.check_axis("concatenate", axis, xs[0]))


@names_user_line
def stack(xs: "list[Any] | tuple[Any, ...]", axis: int = 0) -> Any:
    """Join tensors of one shape along a new axis, like ``numpy.stack``.

    Not a primitive: each tensor gets a size-1 axis at ``axis`` (``reshape``) and the
    pieces are concatenated, so its derivatives in every mode and its batching rule are
    those of ``reshape`` and ``concatenate``, and the tape records those two steps.
    """
    xs = S.operands("stack", xs)
    if not xs:
        raise ShapeError("stack: needs at least one tensor")
    same_device("stack", xs)  # (before the reshapes: see same_device)
    shapes = [S.shape_of(x) for x in xs]
    if any(s != shapes[0] for s in shapes):
        raise ShapeError(f"stack: all tensors must have the same shape, got {shapes}")
    axis = S.check_axis("stack", axis, xs[0], new=1)  # (a new axis: one more than x has)
    shape = tuple(shapes[0])
    new = shape[:axis] + (1,) + shape[axis:]
    # (host data stays host data, which concatenate puts where the tensors live: a
    # reshape would make it a tensor on the default device, another than theirs)
    return concatenate([np.reshape(np.asarray(x), new) if isinstance(x, _HOST) else
                        reshape(x, new) for x in xs], axis)


_HOST = (np.ndarray, np.generic, list, tuple, int, float, bool)  # (data of no device)
