"""Graph partitioning with Send/Recv insertion [3.1.4].

A graph whose nodes live on several devices is cut into one graph per device. Every
data edge from a node on device A to a node on device B is replaced by a pair of nodes:

    producer --> Send   (on A)   ~~~ rendezvous key "A;B;producer" ~~~>   Recv (on B) --> consumer

so that no node ever reads a value of another device directly: the only way between
devices is a Send and its Recv, and a Send makes a real copy into B's memory. A value
used by several nodes of B crosses once (one Send/Recv pair per tensor and destination
device). An explicit ``x.to(B)`` node is itself such an edge: it becomes the Recv.
A control edge across devices ("run after that node") becomes a Send/Recv of an empty
tensor: what crosses is only the news that the node has run (its key starts with ``^``,
so that it never meets a data edge's, whatever the nodes are called).

``mg.partition(g)`` returns ``{device name: Graph}``; the session runs each of those
graphs on its own device executor (``session.py``).
"""

from __future__ import annotations

from typing import AbstractSet, Any, Sequence

from ..device import Device
from ..graph.graph import Graph, Node, check_graph, check_nodes
from ..graph.topo import fifo_order, needed
from .rendezvous import make_key


class CommNode(Node):
    """A Send or a Recv: a node with a tensor name, two devices and a rendezvous key."""

    __slots__ = ()

    @property
    def tensor_name(self) -> str:
        return self.params["tensor_name"]

    @property
    def send_device(self) -> str:
        return self.params["send_device"]

    @property
    def recv_device(self) -> str:
        return self.params["recv_device"]

    @property
    def key(self) -> str:
        return make_key(self.send_device, self.recv_device, self.tensor_name,
                        self.params["control"])


class Partition(dict):
    """``{device name: Graph}`` plus the bookkeeping the session needs."""

    def __init__(self, graphs: dict[str, Graph], copies: dict[int, Node],
                 origins: dict[int, list[Node]]):
        super().__init__(graphs)
        self.copies = copies    # id(original node) -> its node in a partition
        # id(partition node) -> every original node it stands for: one, except for a Recv
        # that several transfers of the same value to the same device share (``recv``)
        self.origins = origins

    def sends(self) -> list[CommNode]:
        return [n for g in self.values() for n in g.nodes if n.op == "Send"]

    def recvs(self) -> list[CommNode]:
        return [n for g in self.values() for n in g.nodes if n.op == "Recv"]

    def to_dot(self) -> str:
        """DOT text: one cluster per device, Send -> Recv edges dashed."""
        from ..viz.dot import partition_to_dot

        return partition_to_dot(self)


def partition(graph: Graph, fetches: Sequence[Node] | None = None,
              fed: AbstractSet[int] = frozenset()) -> Partition:
    """Cut ``graph`` (or the part of it ``fetches`` need) into one graph per device."""
    check_graph(graph, "partition")
    keep = needed(check_nodes(graph, fetches, "partition"), set(fed)) if fetches is not None \
        else {id(n) for n in graph.nodes}
    return _Partitioner(graph).run(fifo_order(graph.nodes, keep, set(fed)), fed)


class _Partitioner:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.parts: dict[str, Graph] = {}
        self.copies: dict[int, Node] = {}
        self.origins: dict[int, list[Node]] = {}
        self.recvs: dict[tuple[int, str, bool], Node] = {}  # (node, device, control)

    def part(self, device: Device) -> Graph:
        if device.name not in self.parts:
            self.parts[device.name] = Graph(f"{self.graph.name}@{device.name}")
        return self.parts[device.name]

    def run(self, order: list[Node], fed: AbstractSet[int]) -> Partition:
        for n in order:
            copies = n.prim is not None and n.prim.transfer  # (to_device: a table flag)
            source = n.inputs[0] if copies and n.inputs else None
            if source is not None and id(n) not in fed and source.device is not n.device:
                recv = self.copies[id(n)] = self.recv(source, n.device)  # it is the Recv
                # (a.to(B) twice, or the gradients of two xs with one adjoint, share that
                # Recv: it stands for each of them, so that each gets its value)
                self.origins.setdefault(id(recv), []).append(n)
                continue
            args = () if id(n) in fed else tuple(self.edge(a, n.device) for a in n.args)
            control = () if id(n) in fed else tuple(
                self.copies[id(c)] if c.device is n.device else self.recv(c, n.device, True)
                for c in n.control_inputs)
            copy = Node(self.part(n.device), n.name, n.op, n.prim, args, n.params, n.shape,
                        n.dtype, n.device, n.location, n.value, control)
            self.part(n.device)._register(copy)
            self.copies[id(n)] = copy
            self.origins[id(copy)] = [n]
        return Partition(self.parts, self.copies, self.origins)

    def edge(self, a: Any, device: Device) -> Any:
        """The argument as the consumer on ``device`` reads it: direct, or via a Recv."""
        if not isinstance(a, Node):
            return a
        if a.device is device:
            return self.copies[id(a)]
        return self.recv(a, device)

    def recv(self, a: Node, device: Device, control: bool = False) -> Node:
        """The Recv on ``device`` of ``a``'s value (one Send/Recv pair per destination);
        for a control edge, of an empty tensor sent once ``a`` has run."""
        key = (id(a), device.name, control)
        if key not in self.recvs:
            name = a.name + ("/control" if control else "")
            params = {"tensor_name": name, "send_device": a.device.name,
                      "recv_device": device.name, "control": control}
            shape = (0,) if control else a.shape
            src, dst = self.part(a.device), self.part(device)
            send = CommNode(src, src.unique_name(f"{name}/Send"), "Send", None,
                            (self.copies[id(a)],), params, shape, a.dtype, a.device,
                            a.location)
            src._register(send)
            recv = CommNode(dst, dst.unique_name(f"{name}/Recv"), "Recv", None, (),
                            params, shape, a.dtype, device, a.location)
            dst._register(recv)
            self.recvs[key] = recv
        return self.recvs[key]
