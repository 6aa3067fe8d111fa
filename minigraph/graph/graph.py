"""Define-and-run: the program as a dataflow graph, built first and run later [3.1.2].

Inside ``with mg.Graph() as g:`` the same functions and operators that compute on
tensors *build nodes* instead: ``x * y`` on two graph nodes adds a ``mul`` node to the
graph and returns it. This is the graph interpreter of ``bind`` (priority 10, above
tensors): one function body serves eager and graph code.

A :class:`Node` is one operation in the graph: its primitive (or one of the special ops
below), its arguments (nodes, which are the graph's edges, and plain Python numbers),
its parameters, and what the primitive's shape rule says about its result (shape,
dtype), plus where it runs (``device``), how costly it is (``cost``), and the file and
line of the user's code that created it, which every error about it quotes.

Special ops, named as in TensorFlow:

==============  ===========================================================
``Placeholder``  an input, fed at run time (``mg.placeholder``)
``Const``        a value fixed when the graph is built (``mg.constant``)
``Variable``     state that lives with the graph across runs (``mg.variable``)
``Assign``       writes a new value into a variable when run (``var.assign``)
==============  ===========================================================

A variable's value is kept on its node, like a TensorFlow 2 resource variable or an
MXNet parameter, so every session of the graph sees the same state.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Any, Iterable, Iterator

import numpy as np  # host-side checks of fed values
from array_api_compat import array_namespace

from ..autodiff.tape import NO_PARAMS, is_grad_enabled
from ..device import Device, get_device, scoped_device
from ..errors import DTypeError, MinigraphError, ShapeError, mixed_devices
from .. import ops
from ..ops import copy as C
from ..ops.operators import ArrayOps, rebinding
from ..ops.primitive import Primitive, register_kind
from ..ops.shape_rules import sizes, supported_dtype
from ..ops.weak import _NUMPY_OPERATORS  # (NumPy's operator ufuncs: Node.__array_ufunc__)
from ..tensor import Tensor, host_values, tensor, unheld

# The package's folder with a trailing separator, so that a user's file beside it whose
# name merely begins alike (minigraph_homework.py) is not taken for minigraph's own (the
# same test as for Python's libraries: ops/operators.py, LIBRARIES)
_PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
_NUMBERS = (bool, int, float)


class GraphError(MinigraphError, ValueError):
    """A graph used wrongly: nodes of two graphs, a cycle, an unknown name, ..."""


class TracedValueError(MinigraphError, TypeError):
    """Python asked for the value of a node while the graph is still being built."""


# -- where the user created a node ---------------------------------------------------------

def user_location(skip: int = 0) -> tuple[str, int] | None:
    """The innermost stack frame outside minigraph: the user's file and line.

    The search starts at the caller, or ``skip`` frames further out where the caller
    knows that those are minigraph's: each frame looked at costs (Python makes an object
    for it), and graph mode asks once per node."""
    frame: FrameType | None = sys._getframe(1 + skip)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    location = frame.f_code.co_filename, frame.f_lineno
    return _LOCATIONS.setdefault(location, location)


# One (file, line) tuple per line of the user's code that made nodes, shared by all of
# them: a tuple per node would be one more object per node for the garbage collector,
# whose passes over a growing graph come more often the more objects it makes.
_LOCATIONS: dict[tuple[str, int], tuple[str, int]] = {}


def reads_across(node: "Node", a: "Node") -> bool:
    """Whether ``node`` reads its argument ``a`` from another device, so that someone must
    bring the value over: a Session's Send and Recv, the compiled code's copy, the
    replay's. A transfer (``x.to(d)``, its table entry says ``transfer``) copies it
    itself."""
    return a.device is not node.device and not (node.prim is not None and node.prim.transfer)


def describe_location(location: tuple[str, int] | None) -> str:
    """``file.py:12: z = x * y`` for error messages."""
    if location is None:
        return "an unknown place"
    filename, line = location
    code = linecache.getline(filename, line).strip()
    return f"{filename}:{line}" + (f": {code}" if code else "")


def at_user_line(exc: MinigraphError, location: tuple[str, int] | None) -> None:
    """Append ``at file.py:12: code`` to the message of ``exc``, raised while a graph is
    built, unless it names that line already (a shape rule's error names its node's line:
    Graph._infer; an op that calls another is checked by both)."""
    if location is not None and f"{location[0]}:{location[1]}" not in str(exc):
        exc.args = (f"{exc}\n  at {describe_location(location)}",)


# -- nodes ------------------------------------------------------------------------------------

def _value(a: Any, prim: Primitive | None, k: int) -> Tensor:
    """``tensor(a)`` for argument ``k`` of ``prim``, whose error names the op, the
    argument and the user's line, as eager mode's does (not ``tensor()``, which the user
    never called)."""
    try:
        return tensor(a)
    except (TypeError, ValueError) as exc:
        if prim is None:
            raise
        raise type(exc)(f"{prim.name}: argument {k} ({type(a).__name__}) is not a tensor, "
                        f"an array or a number: {exc}\n  at "
                        f"{describe_location(user_location())}") from None


class Node(ArrayOps):
    """One operation of a :class:`Graph`; operators on nodes add more nodes."""

    # (__weakref__: weakref.ref(node) in f recorded by graph mode, as on a tensor)
    __slots__ = ("graph", "name", "op", "prim", "args", "params", "shape",
                 "dtype", "device", "location", "value", "control_inputs", "_cost",
                 "__weakref__")
    _priority = 10  # above tensors: a node among the arguments makes bind build a node
    _noun = "graph node"

    def __init__(self, graph: "Graph", name: str, op: str, prim: Primitive | None,
                 args: tuple, params: dict, shape: tuple | None, dtype: str | None,
                 device: Device, location: tuple[str, int] | None, value: Any = None,
                 control_inputs: tuple = ()):
        self.graph = graph
        self.name = name
        self.op = op
        self.prim = prim
        self.args = args
        self.params = params
        # None while unknown (a placeholder of any shape, and what depends on it); ArrayOps
        # declares tuple[int, ...] for its methods, which only such nodes cannot run
        self.shape = shape  # type: ignore[assignment]
        self.dtype = dtype
        self.device = device
        self.location = location
        self.value = value  # the array of a Const, the current state of a Variable
        # Nodes that must run before this one although it reads none of their values
        # (``with g.control_dependencies([...])``, TensorFlow's control edges).
        self.control_inputs = control_inputs if type(control_inputs) is tuple else \
            tuple(control_inputs)
        self._cost: str | None = None  # computed on first use (the scheduler asks often)

    @property
    def inputs(self) -> tuple["Node", ...]:
        """The nodes among the arguments: the graph's edges into this node.

        Worked out when asked, not kept: when every argument is a node it is ``args``
        itself, and otherwise (``y * 1.0001``) a tuple kept per node would be one more
        object for the garbage collector to walk on each of its passes over a growing
        graph. (The passes that ask run once per plan or compilation, not per node
        built; the reverse-graph pass reads ``args``.)"""
        args = self.args
        for a in args:
            if not isinstance(a, Node):
                return tuple([a for a in args if isinstance(a, Node)])
        return args

    @property
    def predecessors(self) -> tuple["Node", ...]:
        """Every node that must run first: data inputs, then control inputs."""
        if not self.control_inputs:  # (most nodes: the scheduler asks for every node)
            return self.inputs
        return self.inputs + tuple(c for c in self.control_inputs
                                   if all(c is not i for i in self.inputs))

    def _bind(self, prim: Primitive, args: tuple, params: dict) -> "Node":
        # ``bind``, ``bind_one`` and ``bind_two`` (ops/primitive.py) are the only callers:
        # this frame and theirs are minigraph's, so the search for the user's line can
        # start above them (the user's own frame, at the nearest)
        graph = self.graph
        location = graph._location or user_location(skip=2)
        node = graph.add(prim, args, params, location=location)
        if graph.recording and not is_grad_enabled():  # (the tape records nothing here)
            return graph.add(C.NO_GRAD, (node,), NO_PARAMS, location=location)
        return node

    def _locate(self, exc: MinigraphError) -> None:
        """Add the user's line to ``exc``, raised by the checks of an op called on this
        node before its node was made (``names_user_line``, ops/primitive.py)."""
        at_user_line(exc, self.graph._location or user_location())

    @property
    def cost(self) -> str:
        """"cheap" or "expensive", the scheduler's static class (``runtime/cost.py``)."""
        if self._cost is None:
            from ..runtime.cost import static_cost  # runtime builds on graph, not back

            self._cost = static_cost(self)
        return self._cost

    def _refuse_update(self, where: str) -> None:
        # ``w -= lr * gw`` would bind the name to a new node, w - lr * gw, and leave the
        # variable as it was on every run, where the PyTorch habit means a change of the
        # state: in a graph, an Assign node (TF1 rebound, with a warning to use assign_sub)
        if self.op == "Variable":
            name, new = rebinding().split(" = ", 1)  # (the user's line: w = w - lr * gw)
            raise GraphError(
                f"{where}, at {describe_location(user_location())}: '{self.name}' is a "
                f"Variable, whose value changes only when an assign node runs; here the "
                f"update would make a new node and leave the variable as it was. Write "
                f"step = {name}.assign({new}) and run step (chapter 04), or new_{name} = "
                f"{new} for a value of its own")

    def assign(self, value: Any) -> "Node":
        """An ``Assign`` node that stores ``value`` in this variable when it is run."""
        if self.op != "Variable":
            raise GraphError(f"assign: '{self.name}' is a {self.op} node, not a Variable")
        if not isinstance(value, Node):  # a number or an array: a constant in the variable's
            try:                         # dtype, checked as a feed is (1.5 into an int: refused)
                array = fed_value(self, value)
            except MinigraphError as exc:
                raise type(exc)(str(exc).replace("feed for", "assign to", 1)) from None
            with self.device:
                value = self.graph.constant(array, name=f"{self.name}/value")
        return self.graph.add_special("Assign", (self, value), name=f"{self.name}/assign")

    def numpy(self) -> Any:
        """A Const's or a Variable's value, as a NumPy array of the caller's own (a copy:
        writing into it must not change the graph, nor a later assign change it)."""
        if self.op == "Variable" and self.device.remote:  # (its runs commit on its rank)
            raise GraphError(f"numpy(): variable '{self.name}' lives on {self.device.name}, "
                             f"another process, which keeps its value; fetch it with "
                             f"Session.run('{self.name}')")
        if self.op in ("Const", "Variable"):
            return np.array(self.device.to_numpy(self.value), copy=True)
        raise self._no_value("numpy()")

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        # (np.asarray(node) asks this first; without it, NumPy read a node as a sequence
        # and made an object array, which failed later without saying why)
        if self.op not in ("Const", "Variable"):  # (asked by np.asarray, mg.tensor, ...)
            raise self._no_value("an array (np.asarray, mg.tensor, a NumPy function)",
                                 "Compute on it with minigraph's functions, which add nodes "
                                 "to the graph, or run the graph with mg.Session and use the "
                                 "array it returns.")
        if copy is False:  # (NumPy 2's protocol: say so rather than copy anyway)
            raise ValueError(f"np.asarray(..., copy=False): graph node '{self.name}' hands "
                             f"out its value as a copy only (copy=None allows one)")
        return np.asarray(self.numpy(), dtype=dtype)

    def tolist(self) -> Any:
        if self.op in ("Const", "Variable"):
            return self.numpy().tolist()
        raise self._no_value("tolist()")

    def item(self) -> Any:
        raise self._no_value("item()")

    def __bool__(self) -> bool:
        raise self._no_value("bool() (an `if` or `while` on it?)")

    def __float__(self) -> float:
        raise self._no_value("float()")

    def __int__(self) -> int:
        raise self._no_value("int()")

    def __index__(self) -> int:
        raise self._no_value("an index")

    def __array_ufunc__(  # type: ignore[override]  # (ArrayOps: None, NumPy's "defer")
            self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """``ndarray * node``: NumPy's operator calls its ufunc (np.multiply), which asks
        this method, and the node's reflected operator answers, as Weak's does (ops/weak.py,
        whose table _REFLECTED reads). Any other call has the node where the user put it, in a
        NumPy function (``np.sin(node)``, ``np.add(node, 1.0)``), which would need a value
        the node has not got: refused, naming minigraph's function and the user's line.
        (Without this method NumPy said "operand 'Node' does not support ufuncs".)"""
        reflected = _REFLECTED.get(ufunc)
        if method == "__call__" and reflected is not None and len(inputs) == 2 \
                and inputs[1] is self and inputs[0] is not self and not kwargs:
            return getattr(self, reflected)(inputs[0])
        call = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        name = _MINIGRAPH_NAMES.get(ufunc.__name__, ufunc.__name__)
        instead = f"mg.{name}(...)" if name in ops.__all__ else "minigraph's functions"
        raise self._no_value(f"{call}() (at {describe_location(user_location())})",
                             f"NumPy's functions compute on values now: use {instead} "
                             f"to add the operation to the graph.")

    def _no_value(self, what: str, advice: str = "Python control flow on it cannot be "
                  "recorded in the graph: use mg.where(...) for a choice between values, "
                  "or run the graph with mg.Session.") -> TracedValueError:
        recorded = (" Graph mode (mg.grad(..., mode='graph'), mg.trace) records f with its "
                    "tensors and floats as the graph's inputs, so that one graph serves all "
                    "their values: to branch on a number, bind it into f "
                    "(functools.partial(f, s=0.5)), which makes it a constant of the graph, "
                    "as an int argument is already."
                    if self.graph.recording else "")
        return TracedValueError(
            f"{what} needs the value of graph node '{self.name}' ({self.op}), created at "
            f"{describe_location(self.location)}; a graph node has no value until the graph "
            f"runs. {advice}{recorded}")

    def __repr__(self) -> str:
        return f"<Node {self.name}: {self.op} {_type_text(self)} on {self.device.name}>"


register_kind(Node)

# The ufunc NumPy calls for ``ndarray OP node`` -> the node's reflected operator
_REFLECTED = {ufunc: names[1] for ufunc, names in _NUMPY_OPERATORS.items()}
_REFLECTED[np.divmod] = "__rdivmod__"  # (divmod(ndarray, node): Python's divmod calls it)

# NumPy's names of ufuncs whose minigraph function is named otherwise (np.subtract: mg.sub)
_MINIGRAPH_NAMES = {"subtract": "sub", "multiply": "mul", "divide": "div", "power": "pow",
                    "absolute": "abs", "negative": "neg"}


def _type_text(node: Node) -> str:
    """``f64[2,3]`` as in a jaxpr; ``?`` where the shape is not known before running."""
    short: dict[str | None, str] = {  # (node.dtype is None where it is not known yet)
        "float64": "f64", "float32": "f32", "int64": "i64", "int32": "i32", "bool": "bool"}
    dtype = short.get(node.dtype, node.dtype or "?")
    shape = "?" if node.shape is None else ",".join(map(str, node.shape))
    return f"{dtype}[{shape}]"


# -- graphs ----------------------------------------------------------------------------------

class _Defaults(threading.local):
    def __init__(self) -> None:
        self.graphs: list[Graph] = []


_defaults = _Defaults()


class Graph:
    """A dataflow graph: nodes in creation order, unique names, scopes for new nodes."""

    def __init__(self, name: str = "graph"):
        if not isinstance(name, str):  # (to_dot and the errors print it as text)
            raise TypeError(f"Graph: the name must be a str, got {name!r} (a "
                            f"{type(name).__name__})")
        self.name = name
        self.nodes: list[Node] = []
        self._by_name: dict[str, Node] = {}
        self._scopes: list[str] = []
        self._prefix = ""  # "/".join(self._scopes) + "/", kept with _scopes: asked per node
        self._consts: dict[int, tuple[Any, Node]] = {}  # id(value) -> (value, its Const)
        self._suffix: dict[str, int] = {}  # the next _k to try for a repeated name
        self._control: list[list[Node]] = []  # open control_dependencies blocks
        self._control_nodes: tuple[Node, ...] = ()  # their nodes, kept with _control
        # what the shape rules said, for nodes of this graph: see _infer
        self._rules_said: dict[tuple, tuple] = {}
        # where new nodes are said to be created, when the caller knows it better than
        # the stack does (mg.gradients: every gradient node comes from its call)
        self._location: tuple[str, int] | None = None
        # set while a function is recorded (mg.trace, mode="graph"): a value it computes
        # inside ``with mg.no_grad():`` is then a constant for derivatives, as on the tape
        self.recording = False
        # A function's graph (mg.trace, graph mode) places as eager mode does, not by
        # TensorFlow's rules: see _place. ``loose`` holds the ids of its nodes that stand
        # for values without a device of their own there (a Python float, a NumPy array
        # or scalar), which go to the device of the tensors they meet.
        self.eager_placement = False
        self.loose: set[int] = set()
        # the ids of the lists and dicts the function wrote while it was recorded (its
        # own log of its runs: reads.recording), which its program does not guard
        self.written_by_f: frozenset[int] = frozenset()
        self.constants: tuple = ()  # (position, value) of f's constant arguments
        # A pass's graph (graph/passes.py): id -> why, for the nodes a feed would not
        # stand in for as it did in the original graph (a constant folded into its
        # readers, a node merged with another); Session.run and compile_graph refuse it.
        self.unfeedable: dict[int, str] = {}

    # -- the default graph ---------------------------------------------------------------
    def __enter__(self) -> "Graph":
        _defaults.graphs.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _defaults.graphs.pop()

    def as_default(self) -> "Graph":
        """``with g.as_default():`` (the graph itself is the context manager)."""
        return self

    @contextmanager
    def name_scope(self, name: str) -> Iterator[str]:
        """Prefix the names of the nodes made inside with ``name/``; an empty ``name``
        goes back to the top level, as in TF1 (it made names like ``/x``, which no one
        fetches by)."""
        if not isinstance(name, str):  # (None.strip: an AttributeError naming nothing)
            raise TypeError(f"name_scope: the name must be a str, got {name!r} (a "
                            f"{type(name).__name__})")
        outer = self._scopes
        self._scopes = outer + [name.strip("/")] if name.strip("/") else []
        self._prefix = "/".join(self._scopes) + "/" if self._scopes else ""
        try:
            yield "/".join(self._scopes)
        finally:
            self._scopes = outer
            self._prefix = "/".join(self._scopes) + "/" if self._scopes else ""

    @contextmanager
    def control_dependencies(self, nodes: "list[Node]") -> Iterator[None]:
        """Nodes made inside run only after ``nodes`` (nodes of this graph, or their
        names) have run (control edges)."""
        if isinstance(nodes, (Node, str)) or not isinstance(nodes, Iterable):
            # (a node is iterable: its items would have become getitem nodes)
            raise GraphError(f"control_dependencies: expects a list of nodes, got "
                             f"{type(nodes).__name__} {getattr(nodes, 'name', nodes)!r}; "
                             f"write control_dependencies([...])")
        # names looked up, then each one checked: a tensor or a number has no run of its
        # own to wait for (it was taken for a constant, and the run failed on it later)
        nodes = check_nodes(self, [self[n] if isinstance(n, str) else n for n in nodes],
                            "control_dependencies", "control input")
        self._control.append(nodes)
        self._control_nodes = self._current_control()
        try:
            yield
        finally:
            self._control.pop()
            self._control_nodes = self._current_control()

    def _current_control(self) -> tuple:
        """The nodes of the open control_dependencies blocks, outermost first."""
        return tuple(n for block in self._control for n in block)

    @contextmanager
    def located(self, location: tuple[str, int] | None) -> Iterator[None]:
        """Nodes made inside say they were created at ``location`` (a file and line);
        a pass that adds many nodes for one user call finds the line once."""
        previous, self._location = self._location, location
        try:
            yield
        finally:
            self._location = previous

    # -- adding nodes ----------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        """``base`` under the current name scope, with _1, _2, ... if already taken."""
        try:
            name = self._prefix + base  # ("/".join(self._scopes + [base]), kept ready)
        except TypeError:  # (name=7: "can only concatenate str (not "int") to str")
            raise TypeError(f"a node's name must be a str, got {base!r} (a "
                            f"{type(base).__name__})") from None
        if name not in self._by_name:
            return name
        k = self._suffix.get(name, 1)  # remembered, so a long chain of "mul" stays O(1)
        candidate = f"{name}_{k}"
        while candidate in self._by_name:  # (a name the user gave, say)
            k += 1
            candidate = f"{name}_{k}"
        self._suffix[name] = k + 1
        return candidate

    def _register(self, node: Node) -> Node:
        self.nodes.append(node)
        self._by_name[node.name] = node
        return node

    def _drop(self, dead: set[int]) -> None:
        """Take the nodes whose ids are in ``dead`` out of this graph, which no node that
        stays reads: a pass's new graph, before anyone else holds it (graph/passes.py)."""
        self.nodes = [n for n in self.nodes if id(n) not in dead]
        self._by_name = {k: n for k, n in self._by_name.items() if id(n) not in dead}
        self._consts = {k: c for k, c in self._consts.items() if id(c[1]) not in dead}
        for key in dead:  # (their ids may be another node's once they are freed)
            self.unfeedable.pop(key, None)
            self.loose.discard(key)

    def _argument(self, a: Any, prim: Primitive | None = None, k: int = 0) -> Any:
        """An argument as a node stores it: nodes (of this graph) and Python numbers.
        (``prim`` and ``k``: the op and the position, which an error names.)"""
        if isinstance(a, Node):
            if a.graph is not self:
                inner = default_graph()  # (the graph f is being recorded into, if any)
                if inner.recording and (inner is self or inner is a.graph):
                    raise GraphError(
                        f"{inner.name}: the function being recorded reads a value of the "
                        f"function around it from outside its arguments (a variable it "
                        f"closes over), which its compiled program cannot read. Pass it "
                        f"as an argument, or use mode='tape', which runs the function "
                        f"itself (at {describe_location(user_location())})")
                raise GraphError(f"node '{a.name}' belongs to another graph ({a.graph.name!r}); "
                                 f"operations cannot mix nodes of two graphs (it was created "
                                 f"at {describe_location(a.location)})")
            return a
        if type(a) in _NUMBERS:
            return a
        # One Const per array or tensor object while its value stays the same. The cache
        # holds the object itself, so its id cannot be reused by another object while
        # the graph lives. An object written in place since (arr[0] = 100, t *= 3) gets
        # a new Const of its value now, as TF1's convert_to_tensor makes at every use:
        # the old one holds a copy of the value it had then.
        # (The check reads the object in place: a copy per use made each read of a large
        # array cost a copy of it, and a loop reading one weight many times crawled.)
        cached = self._consts.get(id(a))
        if cached is None or cached[0] is not a or not _holds(cached[1], a):
            const = self.constant(a if isinstance(a, Tensor) else _value(a, prim, k),
                                  name="const")
            if not isinstance(a, Tensor):
                self.loose.add(id(const))
            cached = (a, const)
            self._consts[id(a)] = cached
        return cached[1]

    def _arguments(self, args: tuple, prim: Primitive) -> tuple:
        """``tuple(self._argument(a) for a in args)``; the usual arguments (nodes of this
        graph, numbers) are looked at without a call, as this runs for every node."""
        for a in args:
            if type(a) not in _NUMBERS and not (type(a) is Node and a.graph is self):
                return tuple([self._argument(a, prim, k) for k, a in enumerate(args)])
        return args if type(args) is tuple else tuple(args)

    def add(self, prim: Primitive, args: tuple, params: dict, name: str | None = None, *,
            location: tuple[str, int] | None = None) -> Node:
        """Add a node applying ``prim``; its shape and dtype come from the shape rule.
        ``location``: where the user created it, if the caller has found it already."""
        location = location or self._location or user_location()
        args = self._arguments(args, prim)
        name = self.unique_name(name or prim.name)
        shape, dtype = self._infer(prim, args, params, name, location)
        # (most nodes have no parameters: they share the one empty dict the tape's entries
        # share, instead of keeping the ``{}`` each call made; see NO_PARAMS)
        if self.eager_placement:
            device, loose = self._place_eagerly(prim, args, params, name, location)
        else:
            device, loose = self._place(prim, args, params), False
        node = Node(self, name, prim.name, prim, args, params or NO_PARAMS, shape, dtype,
                    device, location, None, self._control_nodes)
        if loose:
            self.loose.add(id(node))
        self.nodes.append(node)  # (self._register(node), written out: it runs per node)
        self._by_name[name] = node
        return node

    def _infer(self, prim: Primitive, args: tuple, params: dict, name: str,
               location: tuple[str, int] | None) -> tuple:
        """``prim``'s shape rule on ``args``: the node's (shape, dtype).

        A shape rule reads only its arguments' shapes and dtypes and the Python numbers
        among them (``ops/shape_rules.py``), so what it said for one node holds for every
        node of the same primitive on arguments that look the same: a long chain asks
        the same question thousands of times, and a dict remembers the answer in a
        fraction of the time the rule takes. (Only for rules without parameters, the
        usual case; a rule that raises is asked again, so its error is raised again.)"""
        key: list = [prim]  # then two entries per argument: shape and dtype, or a number's
        for a in args:      # type and value (a zero by its text: -0.0 == 0.0 but differs;
            if type(a) in _NUMBERS:  # a NaN too: nan != nan, so it would never be found)
                key.append(type(a))
                key.append(a if a and a == a else str(a))
            elif a.shape is None:
                return None, None  # known only when the graph runs
            else:
                key.append(a.shape)
                key.append(a.dtype)
        said = None if params else self._rules_said.get(tuple(key))
        if said is None:
            try:
                said = prim.shape(*args, **params)
            except MinigraphError as exc:
                raise type(exc)(f"{exc}\n  in node '{name}' created at "
                                f"{describe_location(location)}") from None
            if not params:
                self._rules_said[tuple(key)] = said
        return said

    def _place(self, prim: Primitive, args: tuple, params: dict) -> Device:
        """Placement of a graph you build (TensorFlow's rule): an ``mg.device`` scope wins;
        else colocate with the first input. (A function's graph: :meth:`_place_eagerly`.)"""
        if prim.transfer:  # (its result lives where it copies to)
            return params["device"]
        scoped = scoped_device()
        if scoped is not None:
            return scoped
        for a in args:
            if isinstance(a, Node):
                return a.device
        return get_device(None)

    def _place_eagerly(self, prim: Primitive, args: tuple, params: dict, name: str,
                       location: tuple[str, int] | None) -> tuple[Device, bool]:
        """Placement in a function's graph, as in eager mode (and PyTorch): the device of
        the tensors an op reads, which must be one device; an ``mg.device`` scope places
        only what is made from nothing (``mg.ones(3)``). Values without a device of
        their own (``loose``) go with the others, and what is made from them alone stays
        loose (``2.0 * s`` for a float s): the second item says so."""
        if prim.transfer:
            return params["device"], False
        nodes = [a for a in args if isinstance(a, Node)]
        strong = [a for a in nodes if id(a) not in self.loose]
        if not strong:
            return self._place(prim, args, params), bool(nodes)
        device = strong[0].device
        for a in strong:
            if a.device is not device:
                names = sorted({b.device.name for b in strong})
                given = ", ".join(f"'{b.name}' on {b.device.name}" for b in strong)
                raise mixed_devices(prim.name, names, given, f"\n  in node '{name}' "
                                    f"created at {describe_location(location)}")
        return device, False

    def add_special(self, op: str, args: tuple, shape: tuple | None = None,
                    dtype: str | None = None, name: str | None = None,
                    value: Any = None, device: Device | None = None) -> Node:
        """Add a Placeholder, Const, Variable or Assign node."""
        args = tuple(self._argument(a) for a in args)
        if op == "Assign":
            var, new = args
            if new.shape is not None and new.shape != var.shape:
                raise ShapeError(f"assign: variable '{var.name}' has shape {var.shape}, the "
                                 f"new value '{new.name}' has shape {new.shape} "
                                 f"(at {describe_location(user_location())})")
            if new.dtype is not None and new.dtype != var.dtype:  # (it would store the other
                raise DTypeError(                                  # dtype, as TF1 refuses)
                    f"assign: variable '{var.name}' has dtype {var.dtype}, the new value "
                    f"'{new.name}' has dtype {new.dtype}; cast it: "
                    f"{var.name}.assign(mg.astype(..., {var.dtype!r})) "
                    f"(at {describe_location(user_location())})")
            shape, dtype, device = var.shape, var.dtype, var.device
        node = Node(self, self.unique_name(name or op), op, None, args, NO_PARAMS, shape, dtype,
                    device or scoped_device() or get_device(None), user_location(), value,
                    self._control_nodes)
        return self._register(node)

    def constant(self, value: Any, dtype: str | None = None, name: str | None = None) -> Node:
        t = value if isinstance(value, Tensor) and dtype is None else \
            _given(value, dtype, "constant", name)
        dev = scoped_device() or t.device
        return self.add_special("Const", (), t.shape, t.dtype, name or "Const",
                                value=dev.copy_from(t.data, t.device), device=dev)

    # -- looking at the graph -------------------------------------------------------------------
    def __getitem__(self, name: str) -> Node:
        try:
            return self._by_name[name]
        except KeyError:
            raise GraphError(f"no node named {name!r} in graph {self.name!r}") from None

    def __len__(self) -> int:
        return len(self.nodes)

    def __str__(self) -> str:
        """One node per line: ``name:type = op(inputs)  @device  cost  (file:line)``."""
        width = max((len(n.name) + len(_type_text(n)) for n in self.nodes), default=0) + 1
        lines = [f"graph {self.name} {{"]
        for n in self.nodes:
            args = ", ".join(a.name if isinstance(a, Node) else repr(a) for a in n.args)
            params = ", ".join(f"{k}={_short(v)}" for k, v in n.params.items())
            control = ", ".join("^" + c.name for c in n.control_inputs)
            call = f"{n.op}({', '.join(p for p in (args, params, control) if p)})"
            where = "" if n.location is None else \
                f"  {os.path.basename(n.location[0])}:{n.location[1]}"
            lines.append(f"  {n.name + ':' + _type_text(n):<{width}} = {call:<28}"
                         f" @{n.device.name} {n.cost}{where}")
        lines.append("}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {len(self.nodes)} nodes>"

    def to_dot(self) -> str:
        """Graphviz DOT text of the graph (see ``minigraph.viz.dot``)."""
        from ..viz.dot import graph_to_dot

        return graph_to_dot(self)


def _short(v: Any) -> str:
    if isinstance(v, Device):
        return v.name
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)}"
    return repr(v)


def _holds(const: Node, a: Any) -> bool:
    """Whether the Const ``const``, made of ``a`` (a tensor, an array, Python data),
    holds ``a``'s value now, bit for bit: dtype, shape and bits (``==`` would take -0.0
    for 0.0, and never a NaN for itself). A tensor or an array is read where it is, not
    copied; Python data is made into an array as the Const was."""
    if isinstance(a, Tensor):
        now = host_values(a)
    elif isinstance(a, (np.ndarray, np.generic)):
        now = a  # (tensor(a) keeps a NumPy array's dtype)
    else:
        now = host_values(tensor(a))
    old, now = np.asarray(const.device.to_numpy(const.value)), np.asarray(now)
    if old.dtype != now.dtype or old.shape != now.shape:
        return False
    # (the library's one test of "the same values", which the compiled programs' captured
    # arrays use too; imported here: autodiff imports this module)
    from ..autodiff.reads import differs

    return not differs(now, old)


def _given(value: Any, dtype: str | None, what: str, name: str | None) -> Tensor:
    """``tensor(value, dtype)`` for a constant or a variable, whose ``dtype``, if given,
    may not change a number of ``value``: mg.constant(1.5, dtype="int32") made 1, where a
    feed or an assign of 1.5 to an int32 node is refused (and TF1's constant refuses it).

    Unlike a feed's, the rule is about the numbers given, not their dtype: a float (or
    an int) that the dtype represents exactly is taken, as NumPy, JAX and TensorFlow take
    mg.constant(1.0, dtype="int64") or mg.variable(np.zeros(3), dtype="int32"). (A feed
    is the value of a run, whose numbers the graph does not see when it is built.)"""
    if dtype is not None:
        array = host_values(value) if isinstance(value, Tensor) else np.asarray(value)
        who = what if name is None else f"{what} '{name}'"
        location = user_location()
        # (an unknown dtype named here: NumPy's "data type 'foo' not understood" said
        # nothing of where)
        try:
            target = supported_dtype(who, dtype)
        except DTypeError as exc:
            at_user_line(exc, location)
            raise
        where = f"(at {describe_location(location)})"
        if array.dtype.kind in "biuf" and not np.can_cast(array.dtype, target, "same_kind"):
            # across kinds (a float to an int, a number to a bool): each value must come
            # back from the cast as it was (1.5 would be 1, 2**40 would wrap in an int32,
            # a NaN has no int, 2 as a bool is True, which is 1)
            changed = _changed_by_cast(array, np.dtype(target))
            if changed.size:
                example = changed.flat[0]
                with np.errstate(invalid="ignore", over="ignore"):
                    became = example.astype(target)
                raise DTypeError(f"{who}: a value of dtype {array.dtype} cannot be made a "
                                 f"{what} of dtype {target} where a number would change: "
                                 f"{example.item()!r} would become {became.item()!r} "
                                 f"({changed.size} of its {array.size} values would change) "
                                 f"{where}")
        else:
            _refuse_changing_cast(array, array.dtype, target, who, f"made a {what}", where,
                                  DTypeError)
    return tensor(value, dtype)


def check_graph(graph: Any, who: str) -> Graph:
    """``graph`` if it is a Graph; else a TypeError naming ``who`` (it was an
    AttributeError about ``.nodes`` from deep inside, or, for a Session, nothing until
    its first run)."""
    if not isinstance(graph, Graph):
        raise TypeError(f"{who}: expects a Graph (with mg.Graph() as g: ...), got "
                        f"{'None' if graph is None else 'a ' + type(graph).__name__}")
    return graph


def check_nodes(graph: Graph, nodes: Any, who: str, role: str = "fetch") -> list[Node]:
    """``nodes`` as a list, each a node of ``graph``; else an error naming ``who`` (a
    function or a tensor among them failed deep inside with an AttributeError, a node of
    another graph with a KeyError, after pruning the whole graph). One node is a list of
    that node, as ``Session.run(y)`` takes it."""
    if isinstance(nodes, Node):
        # (not list(nodes): a node is iterable, and its items are new getitem nodes
        # added to the user's graph; a 0-d node cannot be iterated at all)
        return check_nodes(graph, [nodes], who, role)
    if isinstance(nodes, (str, Tensor)) or not isinstance(nodes, Iterable):
        # (a name's letters, a tensor's rows, were each taken for one)
        raise GraphError(f"{who}: expects a node or a list of nodes as its {role}s, got "
                         f"a {type(nodes).__name__}; write [node, ...]")
    nodes = list(nodes)
    for k, n in enumerate(nodes):
        if not isinstance(n, Node):
            raise GraphError(f"{who}: {role} {k} is a {type(n).__name__}, not a node of "
                             f"graph {graph.name!r}")
        if n.graph is not graph:
            named = "also named" if n.graph.name == graph.name else "named"
            raise GraphError(f"{who}: {role} '{n.name}' is a node of another graph ({named} "
                             f"{n.graph.name!r}), not of {graph.name!r}; it was created "
                             f"at {describe_location(n.location)}")
    return nodes


def default_graph() -> Graph:
    """The graph of the innermost ``with Graph():`` block (or a global one outside)."""
    if _defaults.graphs:
        return _defaults.graphs[-1]
    return _GLOBAL


_GLOBAL = Graph("default")


@contextmanager
def name_scope(name: str) -> Iterator[str]:
    """``with mg.name_scope("layer1"):`` prefixes new nodes' names in the default graph."""
    with default_graph().name_scope(name) as scope:
        yield scope


@contextmanager
def control_dependencies(nodes: "list[Node]") -> Iterator[None]:
    """``with mg.control_dependencies([a]):`` nodes made inside run after ``a``."""
    with default_graph().control_dependencies(nodes):
        yield


class FeedError(MinigraphError, ValueError):
    """A missing or ill-fitting value in ``feed_dict``."""


def fed_value(node: Node, value: Any) -> Any:
    """A value given for ``node`` (a placeholder fed to ``Session.run``, an input of a
    function ``compile_graph`` made) as an array on the node's device, after checking
    that it fits the node's shape and dtype: a cast that could change a number (a float
    to an int, an int that does not fit) is refused, not made.

    A tensor of the node's device, or an array of its library (a CuPy array for
    ``cuda:0``), is taken as it is; anything else (Python data, NumPy arrays, tensors of
    other devices) goes through a NumPy array on the host.
    """
    if isinstance(value, Node):  # (np.asarray would ask it for a value it has not got)
        raise FeedError(f"feed for '{node.name}': a graph node is not a value: got node "
                        f"'{value.name}' ({value.op}, created at "
                        f"{describe_location(value.location)}). A feed gives a placeholder "
                        f"its value for one run: an array, a tensor or a number; to compute "
                        f"it from other nodes, build that into the graph in place of "
                        f"'{node.name}' (created at {describe_location(node.location)})")
    if isinstance(value, Tensor):
        value = value.data if value.device is node.device else host_values(value)
    if _native(value, node):
        array, dtype = value, np.dtype(node.device.dtype_name(value.dtype))
    else:
        array = np.asarray(value)
        dtype = array.dtype
    if node.dtype is not None and dtype != node.dtype:  # (the same dtype changes nothing:
        # the common feed pays no check, nor the words of an error it will not raise)
        _refuse_changing_cast(array, dtype, node.dtype, f"feed for '{node.name}'",
                              "fed to a node", f"(created at {describe_location(node.location)})")
    if node.shape is not None and tuple(array.shape) != node.shape:
        raise ShapeError(f"feed for '{node.name}': a value of shape {tuple(array.shape)} "
                         f"cannot be fed to a node of shape {node.shape} "
                         f"(created at {describe_location(node.location)})")
    if node.device.remote:  # another rank's placeholder: checked, but fed there
        return array
    return node.device.asarray(array, dtype=node.dtype)


def check_assigned(node: Node, value: Any) -> Any:
    """``value``, which the Assign ``node`` is about to store, if it has its variable's
    shape and dtype; else the error that says so. The value of an Assign is checked when
    it is built (add_special), unless its shape or dtype is known only when the graph
    runs (it depends on a placeholder of any shape): a variable that stored another shape
    or dtype would be read as its node says it is by every later run (TF1's Assign
    refuses it too, validate_shape=True). The run then fails before it stores anything."""
    var = node.args[0]
    shape, dtype = tuple(value.shape), node.device.dtype_name(value.dtype)
    if shape != var.shape or dtype != var.dtype:
        error = ShapeError if shape != var.shape else DTypeError
        raise error(f"assign: variable '{var.name}' has shape {var.shape} and dtype "
                    f"{var.dtype}; the value '{node.args[1].name}' has, in this run, shape "
                    f"{shape} and dtype {dtype} (the assign was created at "
                    f"{describe_location(node.location)}); the variable is left as it was")
    return value


def check_feedable(node: Node, who: str) -> None:
    """Refuse a feed of a node of a pass's graph that a feed would not stand in for as
    in the original graph (``Graph.unfeedable`` says why): fed, it would be ignored, or
    read where the original did not read it."""
    why = node.graph.unfeedable.get(id(node))
    if why is not None:
        raise FeedError(f"{who}: '{node.name}' cannot be fed in graph {node.graph.name!r}, "
                        f"which a pass rewrote (graph/passes.py): {why}. Feed it in the "
                        f"original graph, or make it a placeholder there before the pass")


def _refuse_changing_cast(array: Any, dtype: np.dtype, target: str, who: str, made: str,
                          where: str, error: type[MinigraphError] = FeedError) -> None:
    """Refuse to cast ``array`` (of ``dtype``) to ``target`` where the cast could change a
    number: across kinds (a float to an int), integers that ``target`` cannot hold, or
    finite floats that a narrower float cannot (1e300 would be inf in float32).
    A value fed (fed_value) or assigned follows this one rule, as TF1's do; a constant's
    or variable's given dtype too, except that it may cross kinds where the numbers
    given come through unchanged (_given). ``who``, ``made`` and ``where`` word the error:
    "feed for 'x': a value of dtype float64 cannot be fed to a node of dtype int32 (created
    at ...)"."""
    if not np.can_cast(dtype, target, "same_kind"):
        raise error(f"{who}: a value of dtype {dtype} cannot be {made} of dtype {target} "
                    f"{where}")
    if dtype.kind in "iu" and array.size and not _holds_every(dtype, np.dtype(target)):
        _check_integers_fit(np.asarray(array), np.dtype(target), who, where, error)
    elif dtype.kind == "f" and isinstance(array, (np.ndarray, np.generic)):
        # (a float64 to float32: a finite number beyond its range would be inf; the
        # values of another library's array, on its device, are not looked at here)
        why = unheld(array, target)
        if why is not None:
            raise error(f"{who}: {why} {where}")


def _holds_every(dtype: np.dtype, target: np.dtype) -> bool:
    """Whether ``target`` holds every integer of the integer dtype ``dtype`` exactly.
    NumPy's "safe" casts are not all exact: int64 -> float64 is safe to NumPy, yet a
    float64 has 53 bits of mantissa and rounds 2**53 + 1 to 2**53. A float holds every
    integer of up to its mantissa's bits and the implicit leading one (float32: 24)."""
    if target.kind == "f":
        return np.iinfo(dtype).bits - (dtype.kind == "i") <= np.finfo(target).nmant + 1
    return bool(np.can_cast(dtype, target, "safe"))


def _check_integers_fit(array: Any, target: np.dtype, who: str, where: str,
                        error: type[MinigraphError]) -> None:
    """Integers given to a node whose dtype may not hold them: the values must fit, as a
    Python int fed to TensorFlow's must. A narrowing integer cast (int64 -> int32) wraps
    a value that does not fit (2**31 becomes -2**31); a cast to a float rounds an integer
    beyond its mantissa (2**24 + 1 fed as float32 becomes 2**24)."""
    if target.kind in "iu":
        why = unheld(array, target.name)  # (tensor()'s check: wrapped around)
        if why is not None:
            raise error(f"{who}: {why} {where}")
        return
    changed = _changed_by_cast(array, target)
    if changed.size:
        raise error(f"{who}: {changed.size} of the {array.dtype} values (e.g. "
                    f"{int(changed.flat[0])}) have no exact {target}, which would round "
                    f"them; give floats{', or a wider dtype' if target.itemsize < 8 else ''} "
                    f"{where}")


def _changed_by_cast(array: Any, target: np.dtype) -> Any:
    """The values of the NumPy array ``array`` that a cast to ``target`` would change:
    those that do not come back from it as they were (a NaN, never equal to itself, is
    among them)."""
    with np.errstate(invalid="ignore", over="ignore"):  # (out of range: compared below)
        back = array.astype(target).astype(array.dtype)
    return array[back != array]


def _native(value: Any, node: Node) -> bool:
    """Whether ``value`` is an array of the node's device's own library (not NumPy's:
    NumPy arrays take the host path, which is no copy for a NumPy device)."""
    if isinstance(value, (np.ndarray, np.generic, list, tuple, int, float, bool)):
        return False
    try:
        return array_namespace(value) is node.device.xp
    except TypeError:  # not an array of any library array-api-compat knows
        return False


def placeholder(shape: tuple[int, ...] | None = None, dtype: str = "float64",
                name: str | None = None) -> Node:
    """An input of the graph, given a value at run time through ``feed_dict``.

    ``shape=None`` accepts any shape; the shapes that depend on it are then known only
    when the graph runs, and ``mg.gradients`` needs them known (give a shape).
    """
    try:
        if isinstance(shape, (tuple, list)) and None in shape:
            raise ShapeError(f"placeholder: shape {tuple(shape)} has a size None "
                             f"(TensorFlow's unknown size), which minigraph does not have: "
                             f"give every size, or shape=None for a placeholder of any shape")
        shape = None if shape is None else sizes("placeholder", shape)
        # ("float32", np.float32, np.dtype("float32")); an unknown or unsupported dtype
        # fails here, naming placeholder, not at run time
        dtype = supported_dtype("placeholder", dtype)
        get_device(None).dtype(dtype)  # (one the default device has no array type for)
    except MinigraphError as exc:  # (no node of the user's is among its arguments to say
        at_user_line(exc, user_location())  # where: see names_user_line)
        raise
    return default_graph().add_special("Placeholder", (), shape, dtype, name or "Placeholder")


def constant(value: Any, dtype: str | None = None, name: str | None = None) -> Node:
    """A value fixed when the graph is built."""
    return default_graph().constant(value, dtype, name)


def variable(value: Any, dtype: str | None = None, name: str | None = None) -> Node:
    """State kept with the graph across runs; change it with ``var.assign(new)``."""
    t = _given(value, dtype, "variable", name)
    dev = scoped_device() or t.device
    return default_graph().add_special("Variable", (), t.shape, t.dtype, name or "Variable",
                                       value=dev.copy_from(t.data, t.device), device=dev)
