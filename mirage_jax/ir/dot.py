"""μGraphs as Graphviz DOT: the kernel graph with each block graph drawn as a cluster.

``to_dot`` needs nothing installed; ``to_svg`` runs Graphviz's ``dot`` when it is on PATH.
"""

from __future__ import annotations

import shutil
import subprocess

from mirage_jax.ir.graph import BlockGraph, Graph, Node
from mirage_jax.ir.ops import Op

_SHAPES = {
    Op.INPUT: "invhouse", Op.OUTPUT: "house", Op.INPUT_ITER: "invhouse",
    Op.OUTPUT_SAVER: "house", Op.GRAPH_DEF: "box3d",
}  # fmt: skip


def _label(graph: Graph, node: Node) -> str:
    attrs = [f"{k}={v}" for k, v in node.attrs if k not in ("block", "graph")]
    head = node.op.value + (f"\\n{', '.join(attrs)}" if attrs else "")
    types = [str(graph.types[o]) for o in node.outs]
    return head + (f"\\n{', '.join(types)}" if types else "")


def _body(graph: Graph, prefix: str, lines: list[str]) -> None:
    for i, node in enumerate(graph.nodes):
        name = f"{prefix}n{i}"
        if node.op is Op.GRAPH_DEF:
            block: BlockGraph = node.attr("block")
            lines.append(f"  subgraph cluster_{name} {{")
            grid = "x".join(map(str, block.grid))
            lines.append(f'  label="graph_def grid={grid} forloop={block.forloop_range}";')
            _body(block, name + "_", lines)
            lines.append("  }")
        shape = _SHAPES.get(node.op, "box")
        lines.append(f'  {name} [shape={shape}, label="{_label(graph, node)}"];')
    producer = {v: i for i, n in enumerate(graph.nodes) for v in n.outs}
    for i, node in enumerate(graph.nodes):
        for v in node.ins:
            lines.append(f"  {prefix}n{producer[v]} -> {prefix}n{i};")


def to_dot(graph: Graph, title: str = "μGraph") -> str:
    lines = [f'digraph "{title}" {{', "  rankdir=TB;", '  node [fontname="monospace"];']
    _body(graph, "", lines)
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_svg(graph: Graph, title: str = "μGraph") -> str | None:
    """SVG text rendered by Graphviz, or None when ``dot`` is not installed."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    done = subprocess.run(
        [exe, "-Tsvg"], input=to_dot(graph, title), capture_output=True, text=True, timeout=60
    )
    return done.stdout if done.returncode == 0 else None
