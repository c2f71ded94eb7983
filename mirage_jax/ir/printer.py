"""The canonical text of μGraphs (the printer) and the fingerprint taken over it.

The format is documented, with an example, in ``ir.text``, whose parser reads it back
exactly. Attributes are printed in name order, all of them (defaults included), so equal
graphs print equal text. Every nested graph has its own value numbering.
"""

from __future__ import annotations

import hashlib
from typing import Any

from mirage_jax.ir.ops import Level, Op
from mirage_jax.ir.types import DType

_NESTED = {Op.GRAPH_DEF: "block", Op.THREAD: "graph"}


def to_text(graph: Any) -> str:
    """The canonical text of a kernel, block or thread graph."""
    return "\n".join(_graph_lines(graph, "")) + "\n"


def fingerprint(graph: Any) -> str:
    """sha256 of the canonical text: stable across processes and machines."""
    return hashlib.sha256(to_text(graph).encode()).hexdigest()


def _header(graph: Any) -> str:
    if graph.level is Level.BLOCK:
        args = ", ".join(map(str, graph.arg_types))
        grid = ",".join(map(str, graph.grid))
        return f"block grid=({grid}) forloop={graph.forloop_range} args=({args})"
    return graph.level.value


def _graph_lines(graph: Any, indent: str) -> list[str]:
    lines = [_header(graph) + " {"]
    for node in graph.nodes:
        lines.extend(_node_lines(graph, node, indent + "  "))
    lines.append(indent + "}")
    return lines


def _fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        raise TypeError("boolean attributes are not part of the IR")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, DType):
        return value.value
    if isinstance(value, tuple):
        return "(" + ",".join(_fmt_value(v) for v in value) + ")"
    raise TypeError(f"cannot print attribute value {value!r}")


def _node_lines(graph: Any, node: Any, indent: str) -> list[str]:
    nested_attr = _NESTED.get(node.op)
    attrs = [(k, v) for k, v in node.attrs if k != nested_attr]
    text = indent
    if node.outs:
        text += ", ".join(f"%{o}" for o in node.outs) + " = "
    text += node.op.value
    if attrs:
        text += "[" + ", ".join(f"{k}={_fmt_value(v)}" for k, v in attrs) + "]"
    if node.ins:
        text += "(" + ", ".join(f"%{i}" for i in node.ins) + ")"
    if node.outs:
        text += " : " + ", ".join(str(graph.types[o]) for o in node.outs)
    if nested_attr is None:
        return [text]
    inner = _graph_lines(node.attr(nested_attr), indent)
    return [text + " " + inner[0], *inner[1:]]


__all__ = ["fingerprint", "to_text"]
