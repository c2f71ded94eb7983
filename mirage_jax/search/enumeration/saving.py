"""Completing a partial block graph (``Savers``): which values output savers can turn into the
target's outputs, and the skeletons that result when every dangling value is saved."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from mirage_jax.ir.graph import BlockBuilder
from mirage_jax.ir.types import TensorType
from mirage_jax.search.enumeration.index import labels_match
from mirage_jax.search.enumeration.rules import BODY, N
from mirage_jax.search.enumeration.tasks import BlockTask, Skeleton
from mirage_jax.search.enumeration.values import BlockValues


class Savers:
    """The completion test of one block task over its DFS's values.

    A value fits target output i when its dtype and shape match (a loop-body value: the
    output's shape with one dim R times smaller, saved along that dim), its index classes
    match the output's, and - when pruning - the oracle puts its term in the output's e-class.
    """

    def __init__(self, task: BlockTask, values: BlockValues, oracle: Any | None, prune: bool,
                 use_index: bool) -> None:  # fmt: skip
        self.task, self.values, self.oracle = task, values, oracle
        self.prune, self.use_index = prune, use_index
        self.loops = task.forloop
        self.m = len(task.out_types)
        self._eq_cache: dict[tuple[Any, int], bool] = {}
        self._fits: dict[tuple[int, int], int | None] = {}

    def complete(self, nodes: Sequence[tuple]) -> Iterator[Skeleton]:
        """A skeleton per choice of one fitting value for each output that saves every
        dangling value."""
        dangling = self.values.dangling()
        if len(dangling) > self.m:
            return
        options = []
        for i in range(self.m):
            opts = [(v, f) for v in range(len(self.values)) if (f := self.fit(v, i)) is not None]
            if not opts:
                return
            options.append(opts)
        for choice in itertools.product(*options):
            saved = {v for v, _ in choice}
            if all(v in saved for v in dangling):
                yield self._skeleton(nodes, choice)

    def fit(self, v: int, i: int) -> int | None:
        """The saver fdim with which value v becomes target output i (N: none needed), or
        None if it cannot."""
        return self.fit_sid(self.values.sid[v], i)

    def fit_sid(self, sid: int, i: int) -> int | None:
        """``fit`` by the value's identity (what it depends on); abstract equality is part of
        the test when pruning."""
        key = (sid, i)
        if key in self._fits:
            return self._fits[key]
        t, term, phase, labels = self.values.ident[sid]
        result = self._saver_fdim(t, self.task.out_types[i], phase)
        if result is not None and self.use_index and not labels_match(
            labels, self.task.out_index[i]
        ):
            result = None
        if result is not None and self.prune and not self._equals(term, i):
            result = None
        self._fits[key] = result
        return result

    def _saver_fdim(self, t: TensorType, want: TensorType, phase: int) -> int | None:
        if t.dtype != want.dtype or len(t.shape) != len(want.shape):
            return None
        if phase != BODY or self.loops == 1:
            return N if t.shape == want.shape else None
        for f, (a, b) in enumerate(zip(t.shape, want.shape)):
            rest = all(x == y for j, (x, y) in enumerate(zip(t.shape, want.shape)) if j != f)
            if a * self.loops == b and rest:
                return f
        return None

    def _equals(self, term: Any, i: int) -> bool:
        key = (term, i)
        if key not in self._eq_cache:
            self._eq_cache[key] = self.oracle.equals_output(term, i)
        return self._eq_cache[key]

    def _skeleton(self, nodes: Sequence[tuple], savers: Sequence[tuple[int, int]]) -> Skeleton:
        bb = BlockBuilder((1, 1, 1), self.loops, self.task.arg_types)
        vals = []
        for op, ins, attrs, _ in nodes:
            (out,) = bb.add_node(op, tuple(vals[i] for i in ins), dict(attrs))
            vals.append(out)
        for v, f in savers:
            bb.output_saver(vals[v], (N, N, N), f)
        return Skeleton(bb.build(), self.task.fdims)
