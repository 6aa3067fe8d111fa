"""Matplotlib drawings of graphs: a forward graph beside its gradient graph.

Nodes are laid out in layers by depth (the longest path from an input), left to right
in creation order within a layer; forward nodes are blue, the nodes the reverse-graph
pass added (under ``gradients/``) are salmon, those of a second pass (``gradients_1/``,
gradients of gradients) plum, inputs and constants grey. Each node shows its full name,
scope included, so a forward ``mul`` and a ``gradients/mul`` cannot be confused, and a
legend names the colours.
"""

from __future__ import annotations

from typing import Any

from ..graph.graph import Graph, Node
from .dot import GRADIENT_SCOPE, SHAPES, is_gradient as _is_gradient


def layout(nodes: list[Node]) -> dict[int, tuple[float, float]]:
    """(x, y) per node id: y = -depth, x = position within its layer (iterative)."""
    depth: dict[int, int] = {}
    for n in nodes:  # creation order is a topological order
        depth[id(n)] = 1 + max((depth.get(id(i), -1) for i in n.inputs), default=-1)
    layers: dict[int, list[Node]] = {}
    for n in nodes:
        layers.setdefault(depth[id(n)], []).append(n)
    pos: dict[int, tuple[float, float]] = {}
    for d, layer in layers.items():
        for k, n in enumerate(layer):
            pos[id(n)] = (k - (len(layer) - 1) / 2, -d)
    return pos


COLORS = {"input or constant": "lightgrey", "forward": "lightblue",
          "reverse graph (gradients/)": "lightsalmon",
          "second pass (gradients_1/, ...)": "plum"}


def _kind(node: Node) -> str:
    """Which colour's kind ``node`` is. A gradient node's pass is its innermost
    gradients scope, which may be inside the user's own scopes: model/gradients/mul is
    of the first pass, model/gradients_1/mul of the second."""
    if _is_gradient(node):
        scope = next(s for s in reversed(node.name.split("/")[:-1])
                     if GRADIENT_SCOPE.fullmatch(s + "/"))
        return "reverse graph (gradients/)" if scope == "gradients" else \
            "second pass (gradients_1/, ...)"
    return "input or constant" if node.op in SHAPES else "forward"


def _color(node: Node) -> str:  # the DOT text's colours, plus one for later passes
    return COLORS[_kind(node)]


def legend(ax: Any, nodes: list[Node]) -> None:
    """A legend of the node colours that occur in ``nodes``."""
    from matplotlib.patches import Patch

    kinds = [k for k in COLORS if any(_kind(n) == k for n in nodes)]
    ax.legend(handles=[Patch(facecolor=COLORS[k], edgecolor="black", label=k) for k in kinds],
              loc="upper left", bbox_to_anchor=(0.0, 0.0), ncol=2, fontsize=8, frameon=False)


def draw_nodes(ax: Any, nodes: list[Node], title: str) -> None:
    """Draw ``nodes`` and the edges among them on a matplotlib Axes."""
    # full names are long (gradients_1/mul_2): spread the layers so that labels do not overlap
    widest = max((len(n.name) for n in nodes), default=1)
    spread = max(1.0, widest / 9)
    pos = {k: (x * spread, y) for k, (x, y) in layout(nodes).items()}
    members = {id(n) for n in nodes}
    for n in nodes:
        for i in n.inputs:
            if id(i) in members:
                (x0, y0), (x1, y1) = pos[id(i)], pos[id(n)]
                ax.annotate("", xy=(x1, y1 + 0.12), xytext=(x0, y0 - 0.12),
                            arrowprops=dict(arrowstyle="->", color="grey", lw=1))
    for n in nodes:
        x, y = pos[id(n)]
        # parse_math=False: a name is drawn as it is, never read as mathtext ($x_1$)
        ax.text(x, y, n.name, ha="center", va="center", fontsize=8, parse_math=False,
                bbox=dict(boxstyle="round,pad=0.3", fc=_color(n), ec="black", lw=0.5))
    xs = [p[0] for p in pos.values()] or [0]
    ys = [p[1] for p in pos.values()] or [0]
    ax.set_xlim(min(xs) - 1, max(xs) + 1)
    ax.set_ylim(min(ys) - 0.7, max(ys) + 0.7)
    ax.set_title(title)
    ax.axis("off")


def draw_forward_and_gradient(graph: Graph, figsize: tuple[float, float] = (10, 5),
                              before: int | None = None) -> Any:
    """A figure of two panels with a colour legend. By default: the forward graph on the
    left, the whole graph with its gradient nodes on the right. With ``before`` (the
    number of nodes the graph had before a later pass, e.g. a second ``mg.gradients``):
    the graph as it was on the left, the whole graph on the right, so that the figure
    shows what that pass added. Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt

    if before is None:
        first, titles = [n for n in graph.nodes if not _is_gradient(n)], (
            "forward graph", "with the reverse graph (gradients/)")
    else:
        first, titles = graph.nodes[:before], (
            f"before: {before} nodes", f"after the pass: {len(graph.nodes)} nodes")
    fig, (left, right) = plt.subplots(1, 2, figsize=figsize)
    draw_nodes(left, first, titles[0])
    draw_nodes(right, graph.nodes, titles[1])
    legend(right, graph.nodes)
    fig.tight_layout()
    return fig
