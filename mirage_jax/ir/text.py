"""Canonical text form of μGraphs: the parser (an exact round trip of ``ir.printer``).

Example::

    kernel {
      %0 = input : f32[16,64]
      %1 = input : f32[64,32]
      %2 = graph_def(%0, %1) : f32[16,32] block grid=(2,1,1) forloop=4 args=(f32[16,64], f32[64,32]) {
        %0 = input_iter[arg=0, fdim=1, imap=(-1,-1,-1)] : f32[16,16]
        %1 = input_iter[arg=1, fdim=0, imap=(1,-1,-1)] : f32[16,16]
        %2 = matmul(%0, %1) : f32[16,16]
        %3 = acc_sum[dim=-1](%2) : f32[16,16]
        output_saver[fdim=-1, omap=(1,-1,-1)](%3)
      }
      output(%2)
    }

The printer (``to_text``) and the fingerprint live in ``ir.printer`` and are re-exported here.
"""

from __future__ import annotations

import re
from typing import Any

from mirage_jax.errors import ParseError
from mirage_jax.ir.graph import (
    BlockBuilder,
    Graph,
    KernelBuilder,
    ThreadBuilder,
    ThreadGraph,
    Value,
)
from mirage_jax.ir.ops import OP_BY_NAME, Level, Op
from mirage_jax.ir.printer import fingerprint, to_text
from mirage_jax.ir.types import DType, TensorType

_NESTED = {Op.GRAPH_DEF: "block", Op.THREAD: "graph"}

# ------------------------------------------------------------------------------------- parsing

_TOKEN = re.compile(
    r"\s*(?:(?P<val>%\d+)|(?P<num>[-+]?(?:\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+|\d+|inf|nan))"
    r"|(?P<id>[a-z_][a-z0-9_]*)|(?P<punct>[{}()\[\]=,:]))"
)


class _Tokens:
    def __init__(self, text: str) -> None:
        self.toks: list[tuple[str, str, int]] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise ParseError(f"unexpected character {text[pos]!r} at offset {pos}")
            kind = m.lastgroup
            self.toks.append((kind, m.group(kind), m.start(kind)))  # type: ignore[arg-type]
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str]:
        if self.i >= len(self.toks):
            return ("eof", "")
        kind, text, _ = self.toks[self.i]
        return kind, text

    def next(self) -> tuple[str, str]:
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        kind, got = self.next()
        if got != text:
            where = self.toks[self.i - 1][2] if self.i - 1 < len(self.toks) else "end"
            raise ParseError(f"expected {text!r} but found {got!r} (offset {where})")

    def accept(self, text: str) -> bool:
        if self.peek()[1] == text:
            self.i += 1
            return True
        return False


def parse(text: str) -> Graph:
    """Parse canonical text back to a graph; every shape/dtype rule is re-checked."""
    toks = _Tokens(text)
    graph = _parse_graph(toks)
    if toks.peek()[0] != "eof":
        raise ParseError(f"trailing text after the graph: {toks.peek()[1]!r}")
    return graph


def _parse_number(tok: str) -> int | float:
    if re.fullmatch(r"[-+]?\d+", tok):
        return int(tok)
    return float(tok)


def _parse_value(toks: _Tokens) -> Any:
    kind, tok = toks.next()
    if tok == "(":
        items: list[Any] = []
        while not toks.accept(")"):
            items.append(_parse_value(toks))
            toks.accept(",")
        return tuple(items)
    if kind == "num":
        return _parse_number(tok)
    if kind == "id":
        if tok in ("inf", "nan"):
            return float(tok)
        try:
            return DType(tok)
        except ValueError:
            raise ParseError(f"unknown attribute value {tok!r}") from None
    raise ParseError(f"unexpected {tok!r} in an attribute value")


def _parse_type(toks: _Tokens) -> TensorType:
    kind, name = toks.next()
    try:
        dtype = DType(name)
    except ValueError:
        raise ParseError(f"unknown dtype {name!r}") from None
    toks.expect("[")
    dims: list[int] = []
    while not toks.accept("]"):
        dims.append(int(toks.next()[1]))
        toks.accept(",")
    return TensorType(tuple(dims), dtype)


def _parse_graph(toks: _Tokens) -> Graph:
    kind, level = toks.next()
    builder: KernelBuilder | BlockBuilder | ThreadBuilder
    if level == Level.KERNEL.value:
        builder = KernelBuilder()
    elif level == Level.THREAD.value:
        builder = ThreadBuilder()
    elif level == Level.BLOCK.value:
        builder = _parse_block_header(toks)
    else:
        raise ParseError(f"expected 'kernel', 'block' or 'thread', found {level!r}")
    toks.expect("{")
    names: dict[str, Value] = {}
    while not toks.accept("}"):
        _parse_node(toks, builder, names)
    return builder.build()


def _parse_block_header(toks: _Tokens) -> BlockBuilder:
    fields: dict[str, Any] = {}
    for key in ("grid", "forloop", "args"):
        toks.expect(key)
        toks.expect("=")
        if key == "args":
            toks.expect("(")
            types = []
            while not toks.accept(")"):
                types.append(_parse_type(toks))
                toks.accept(",")
            fields[key] = tuple(types)
        else:
            fields[key] = _parse_value(toks)
    return BlockBuilder(fields["grid"], fields["forloop"], fields["args"])


def _parse_node(toks: _Tokens, builder: Any, names: dict[str, Value]) -> None:
    outs: list[str] = []
    if toks.peek()[0] == "val":
        outs.append(toks.next()[1])
        while toks.accept(","):
            outs.append(toks.next()[1])
        toks.expect("=")
    kind, opname = toks.next()
    if opname not in OP_BY_NAME:
        raise ParseError(f"unknown op {opname!r}")
    op = OP_BY_NAME[opname]
    attrs: dict[str, Any] = {}
    if toks.accept("["):
        while not toks.accept("]"):
            key = toks.next()[1]
            toks.expect("=")
            attrs[key] = _parse_value(toks)
            toks.accept(",")
    ins: list[Value] = []
    if toks.accept("("):
        while not toks.accept(")"):
            name = toks.next()[1]
            if name not in names:
                raise ParseError(f"{opname}: operand {name} is used before it is defined")
            ins.append(names[name])
            toks.accept(",")
    declared: list[TensorType] = []
    if toks.accept(":"):
        declared.append(_parse_type(toks))
        while toks.accept(","):
            declared.append(_parse_type(toks))
    if op in _NESTED:
        attrs[_NESTED[op]] = _parse_graph(toks)
    if len(declared) != len(outs):
        raise ParseError(f"{opname}: {len(outs)} result name(s) but {len(declared)} type(s)")
    values = builder.add_node(op, tuple(ins), attrs, tuple(declared) if outs else None)
    for name, value in zip(outs, values):
        if name in names:
            raise ParseError(f"{name} is defined twice")
        names[name] = value


def rebuild(graph: Graph) -> Graph:
    """Re-run every check on an existing graph (e.g. one constructed by hand)."""
    return parse(to_text(graph))


__all__ = ["ThreadGraph", "fingerprint", "parse", "rebuild", "to_text"]
