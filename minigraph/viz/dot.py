"""Graphviz DOT text for a graph. No Graphviz is needed to make it; to render it, paste
it into any Graphviz viewer, or use the ``graphviz`` package where ``dot`` exists:
``graphviz.Source(g.to_dot())``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..graph.graph import Graph, Node

SHAPES = {"Placeholder": "invhouse", "Const": "box", "Variable": "cylinder", "Assign": "cds"}


def quoted(text: str) -> str:
    """``text`` as a DOT quoted string, drawn as it is: a ``"`` would end the string, and
    a backslash start an escape (``\\N`` is Graphviz's node name, ``\\n`` a new line)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _label(node: "Node") -> str:
    from ..graph.graph import _type_text

    # (name and type on two lines: quoted writes the new line as DOT's \n)
    return quoted(f"{node.name}\n{node.op} {_type_text(node)}")


GRADIENT_SCOPE = re.compile(r"(^|/)gradients(_\d+)?/")


def is_gradient(node: "Node") -> bool:
    """Whether ``node`` was added by ``mg.gradients`` (scopes gradients/, gradients_1/...)."""
    return GRADIENT_SCOPE.search(node.name) is not None


def _color(node: "Node") -> str:
    if is_gradient(node):
        return "lightsalmon"  # the reverse graph, added by mg.gradients
    return "lightblue" if node.op not in SHAPES else "lightgrey"


def graph_to_dot(graph: "Graph") -> str:
    """One DOT node per graph node (forward blue, gradients salmon), one edge per input."""
    lines = [f"digraph {quoted(graph.name)} {{", "  rankdir=TB;",
             '  node [style=filled, fontname="Helvetica", fontsize=10];']
    index = {id(n): k for k, n in enumerate(graph.nodes)}
    for k, n in enumerate(graph.nodes):
        lines.append(f'  n{k} [label={_label(n)}, shape={SHAPES.get(n.op, "ellipse")}, '
                     f'fillcolor={_color(n)}];')
    for k, n in enumerate(graph.nodes):
        for i in n.inputs:
            lines.append(f"  n{index[id(i)]} -> n{k};")
        for c in n.control_inputs:
            lines.append(f"  n{index[id(c)]} -> n{k} [style=dotted];")
    lines.append("}")
    return "\n".join(lines)


def partition_to_dot(parts: dict) -> str:
    """DOT text of a partition: one cluster per device, each Send -> Recv edge dashed."""
    lines = ['digraph "partition" {', '  node [style=filled, fontname="Helvetica", fontsize=10];']
    ids: dict[int, str] = {}
    for c, (device, graph) in enumerate(parts.items()):
        lines.append(f"  subgraph cluster_{c} {{\n    label={quoted(device)};")
        for k, n in enumerate(graph.nodes):
            ids[id(n)] = f"d{c}n{k}"
            shape = "cds" if n.op in ("Send", "Recv") else SHAPES.get(n.op, "ellipse")
            lines.append(f'    {ids[id(n)]} [label={_label(n)}, shape={shape}, '
                         f'fillcolor={_color(n)}];')
        lines.append("  }")
    recvs = {n.key: n for g in parts.values() for n in g.nodes if n.op == "Recv"}
    for graph in parts.values():
        for n in graph.nodes:
            for i in n.inputs:
                lines.append(f"  {ids[id(i)]} -> {ids[id(n)]};")
            for c in n.control_inputs:
                lines.append(f"  {ids[id(c)]} -> {ids[id(n)]} [style=dotted];")
            if n.op == "Send":
                lines.append(f'  {ids[id(n)]} -> {ids[id(recvs[n.key])]} '
                             f'[style=dashed, label={quoted(n.tensor_name)}];')
    lines.append("}")
    return "\n".join(lines)
