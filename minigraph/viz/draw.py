"""Matplotlib drawings of graphs: a forward graph beside its gradient graph.

Nodes are laid out in layers by depth (the longest path from an input), left to right
in creation order within a layer; forward nodes are blue, the nodes the reverse-graph
pass added (under ``gradients/``) are salmon, inputs and constants grey.
"""

from __future__ import annotations

from typing import Any

from ..graph.graph import Graph, Node
from .dot import SHAPES, is_gradient as _is_gradient


def layout(nodes: list[Node]) -> dict[int, tuple[float, float]]:
    """(x, y) per node id: y = -depth, x = position within its layer (iterative)."""
    depth: dict[int, int] = {}
    for n in nodes:  # creation order is a topological order
        depth[id(n)] = 1 + max((depth.get(id(i), -1) for i in n.inputs), default=-1)
    layers: dict[int, list[Node]] = {}
    for n in nodes:
        layers.setdefault(depth[id(n)], []).append(n)
    pos = {}
    for d, layer in layers.items():
        for k, n in enumerate(layer):
            pos[id(n)] = (k - (len(layer) - 1) / 2, -d)
    return pos


def _color(node: Node) -> str:  # the same colours as the DOT text
    if _is_gradient(node):
        return "lightsalmon"
    return "lightgrey" if node.op in SHAPES else "lightblue"


def draw_nodes(ax: Any, nodes: list[Node], title: str) -> None:
    """Draw ``nodes`` and the edges among them on a matplotlib Axes."""
    pos = layout(nodes)
    members = {id(n) for n in nodes}
    for n in nodes:
        for i in n.inputs:
            if id(i) in members:
                (x0, y0), (x1, y1) = pos[id(i)], pos[id(n)]
                ax.annotate("", xy=(x1, y1 + 0.12), xytext=(x0, y0 - 0.12),
                            arrowprops=dict(arrowstyle="->", color="grey", lw=1))
    for n in nodes:
        x, y = pos[id(n)]
        label = n.name.rsplit("/", 1)[-1] if n.op in SHAPES else f"{n.name.rsplit('/', 1)[-1]}"
        ax.text(x, y, label, ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round,pad=0.3", fc=_color(n), ec="black", lw=0.5))
    xs = [p[0] for p in pos.values()] or [0]
    ys = [p[1] for p in pos.values()] or [0]
    ax.set_xlim(min(xs) - 1, max(xs) + 1)
    ax.set_ylim(min(ys) - 0.7, max(ys) + 0.7)
    ax.set_title(title)
    ax.axis("off")


def draw_forward_and_gradient(graph: Graph, figsize: tuple[float, float] = (10, 5)) -> Any:
    """A figure: the forward graph on the left, the whole graph with its gradient
    nodes (in another colour) on the right. Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt

    forward = [n for n in graph.nodes if not _is_gradient(n)]
    fig, (left, right) = plt.subplots(1, 2, figsize=figsize)
    draw_nodes(left, forward, "forward graph")
    draw_nodes(right, graph.nodes, "with the reverse graph (gradients/)")
    fig.tight_layout()
    return fig
