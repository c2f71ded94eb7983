"""Block-level op proposals: the block vocabulary, the stage groups a partial block graph may
extend, and the (op, ins, attrs, result shape) candidates of each group, in canonical order.

Stages: 0 loop-invariant ops, 1 loop-body ops, 2 for-loop accumulators, 3 epilogue ops (see the
package docstring). Proposals are shape-checked only; the DFS applies every other check.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Container, Iterator, Sequence
from typing import Any

from mirage_jax.ir.ops import ACCUMULATORS, REDUCTIONS, Op
from mirage_jax.ir.types import TensorType
from mirage_jax.search.enumeration.rules import (
    BODY,
    COMMUTATIVE,
    EPI,
    INV,
    TRIVIAL_ON_ITSELF,
    N,
    bcast,
    binary_vocabulary,
    concat_shape,
    matmul_shape,
    reduced,
    unary_vocabulary,
)

Group = tuple[int, list[int], list[int]]  # (stage, operand pool, values one operand must be)


def block_vocabulary(space: Any) -> dict[str, Any]:
    ops = space.block_ops
    return {
        "unary": unary_vocabulary(ops, space.scalars),
        "reduce": [op for op in ops if op in REDUCTIONS],
        "binary": binary_vocabulary(ops, space.scalars),
        "matmul": Op.MATMUL in ops,
        "concat": Op.CONCAT in ops,
        "acc": [op for op in ops if op in ACCUMULATORS],
    }


def stage_groups(phases: Sequence[int], sealed: Container[int], stage: int, loops: int
                 ) -> list[Group]:  # fmt: skip
    """The stages a graph whose last op has stage ``stage`` may continue with, each with its
    operand pool and the values one operand must be (an op of a stage uses a value of it).

    Accumulators need a loop (``loops`` > 1); sealed values (a seed's inner values and the
    tiles it read) are no operands."""
    inv = [v for v, p in enumerate(phases) if p == INV and v not in sealed]
    body = [v for v, p in enumerate(phases) if p == BODY and v not in sealed]
    epi = [v for v, p in enumerate(phases) if p == EPI]
    groups = []
    if stage <= 0:
        groups.append((0, inv, inv))
    if stage <= 1 and body:
        groups.append((1, inv + body, body))
    if stage <= 2 and body and loops > 1:
        groups.append((2, body, body))
    if epi:
        groups.append((3, inv + epi, epi))
    return groups


def group_moves(ops: dict[str, Any], types: Sequence[TensorType], group: Group
                ) -> Iterator[tuple]:  # fmt: skip
    """The candidates of one stage group."""
    st, pool, must = group
    if st == 2:
        return acc_moves(ops, types, pool)
    return compute_moves(ops, types, pool, must)


def compute_moves(ops: dict[str, Any], types: Sequence[TensorType], pool: list[int],
                  must: list[int]) -> Iterator[tuple]:  # fmt: skip
    """Compute ops (unary, reductions, binary, matmul, concat) using a value of ``must``
    (ascending: the order is the native DFS's too)."""
    member = set(must)
    # chained in C rather than delegated with ``yield from``: this is the DFS's hottest loop
    return itertools.chain(
        _unary_moves(ops, types, must),
        _binary_moves(ops, types, pool, member),
        _matmul_moves(ops, types, pool, member),
        _concat_moves(ops, types, pool, member),
    )


def _unary_moves(ops: dict[str, Any], types: Sequence[TensorType], must: Collection[int]
                 ) -> Iterator[tuple]:  # fmt: skip
    for op, attr_sets in ops["unary"]:
        for v in must:
            for attrs in attr_sets:
                yield op, (v,), attrs, types[v].shape
    for op in ops["reduce"]:
        for v in must:
            s = types[v].shape
            for d, size in enumerate(s):
                if size > 1:
                    yield op, (v,), (("dim", d),), reduced(s, d)


def _binary_moves(ops: dict[str, Any], types: Sequence[TensorType], pool: list[int],
                  must: Collection[int]) -> Iterator[tuple]:  # fmt: skip
    for op, attr_sets in ops["binary"]:
        comm = op in COMMUTATIVE
        for u in pool:
            for v in pool:
                if (comm and u > v) or (u == v and op in TRIVIAL_ON_ITSELF):
                    continue
                if u not in must and v not in must:
                    continue
                s = bcast(types[u].shape, types[v].shape)
                if s is not None:
                    for attrs in attr_sets:
                        yield op, (u, v), attrs, s


def _matmul_moves(ops: dict[str, Any], types: Sequence[TensorType], pool: list[int],
                  must: Collection[int]) -> Iterator[tuple]:  # fmt: skip
    if not ops["matmul"]:
        return
    for u in pool:
        for v in pool:
            if u not in must and v not in must:
                continue
            s = matmul_shape(types[u].shape, types[v].shape)
            if s is not None:
                yield Op.MATMUL, (u, v), (), s


def _concat_moves(ops: dict[str, Any], types: Sequence[TensorType], pool: list[int],
                  must: Collection[int]) -> Iterator[tuple]:  # fmt: skip
    if not ops["concat"]:
        return
    for u in pool:
        for v in pool:
            if u == v or (u not in must and v not in must):
                continue
            for d in range(len(types[u].shape)):
                s = concat_shape(types[u].shape, types[v].shape, d)
                if s is not None:
                    yield Op.CONCAT, (u, v), (("dim", d),), s


def acc_moves(ops: dict[str, Any], types: Sequence[TensorType], body: list[int]
              ) -> Iterator[tuple]:  # fmt: skip
    """For-loop accumulators over loop-body values: whole, or reducing one dim; the online
    softmax's rescaling sum pairs a value with a max it broadcasts against."""
    for op in ops["acc"]:
        if op is Op.ACC_RESCALE_SUM:
            for x in body:
                for mv in body:
                    if x != mv and bcast(types[x].shape, types[mv].shape) == types[x].shape:
                        yield op, (x, mv), (), types[x].shape
            continue
        for v in body:
            s = types[v].shape
            yield op, (v,), (("dim", N),), s
            for d, size in enumerate(s):
                if size > 1:
                    yield op, (v,), (("dim", d),), reduced(s, d)
