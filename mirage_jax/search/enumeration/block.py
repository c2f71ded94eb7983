"""The block-level DFS: one ``BlockTask`` enumerated op by op into complete skeletons.

The DFS adds block ops in canonical order (the package docstring), checking each against the
operands' phases, the abstract-expression oracle, the index analysis and the values already
computed; ``block_moves`` proposes the ops, ``values`` holds the partial graph's values and
``saving`` completes it. ``native`` runs the same search with its hot loop in C++.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from mirage_jax.errors import GraphError, SearchError
from mirage_jax.ir.ops import ACCUMULATORS, Op
from mirage_jax.ir.shapes import BlockContext, infer, masked_dtype
from mirage_jax.ir.types import TensorType
from mirage_jax.search import abstract
from mirage_jax.search.enumeration.block_moves import (
    block_vocabulary,
    group_moves,
    stage_groups,
)
from mirage_jax.search.enumeration.counters import Counters, Stop
from mirage_jax.search.enumeration.index import Conflict, IndexChecker
from mirage_jax.search.enumeration.macros import Macro
from mirage_jax.search.enumeration.rules import BODY, EPI, INV, OP_RANK, N, attr_key
from mirage_jax.search.enumeration.saving import Savers
from mirage_jax.search.enumeration.tasks import BlockResult, BlockTask, Skeleton
from mirage_jax.search.enumeration.terms import is_max_shifted
from mirage_jax.search.enumeration.values import BlockValues, Identities

# the phase of a value made by an op of each stage (accumulators end the loop: epilogue)
_PHASE_OF_STAGE = {0: INV, 1: BODY, 2: EPI, 3: EPI}

Pushed = list[tuple[int, tuple[int, ...]]]  # (value id, operands) of the ops a macro applied


class SearchShare:
    """What the block tasks of one search share in one process: the value identities (a sid
    is the same value in every task) and the memo of op checks per task context, so that a
    check one task made is not made again by the next."""

    def __init__(self) -> None:
        self.ids = Identities()
        self.memos: dict[Any, dict[Any, Any]] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def memo(self, context: Any) -> dict[Any, Any]:
        return self.memos.setdefault(context, {})

    def clear(self) -> None:
        self.ids = Identities()
        self.memos = {}


class BlockDFS:
    """Depth-first enumeration of one ``BlockTask`` (see the package docstring)."""

    def __init__(
        self, task: BlockTask, space: Any, oracle: Any | None, deadline: float | None = None,
        shared: SearchShare | None = None,
    ) -> None:
        self.task, self.space, self.oracle = task, space, oracle
        self.prune = task.prune and oracle is not None
        self.deadline = deadline
        self.ctx = BlockContext((1, 1, 1), task.forloop, task.arg_types)
        self.R = task.forloop
        self.counters = Counters()
        self.found: list[Skeleton] = []
        self.m = len(task.out_types)
        self._ops = block_vocabulary(space)
        self.values = BlockValues(shared.ids if shared is not None else None)
        self.use_index = self.prune and task.arg_index is not None
        self.checker = IndexChecker(task.events, task.loop_class)
        self.savers = Savers(task, self.values, oracle, self.prune, self.use_index)
        # per node: (op, ins, attrs, key); sigs/sig_vid: the applied (op, attrs, ins) triples
        self.nodes: list[tuple[Op, tuple[int, ...], tuple[tuple[str, Any], ...], tuple]] = []
        self.sigs: set[tuple[Any, ...]] = set()
        self.sig_vid: dict[tuple[Any, ...], int] = {}
        self.n_ops = 0
        self.sealed: set[int] = set()
        # the op checks read the operands' identities and these facts of the task (the
        # oracle, index events and pruning switch are the search's own)
        context = (self.R, task.loop_class, task.shifted_exp, self.prune, self.use_index)
        self._memo: dict[Any, Any] = shared.memo(context) if shared is not None else {}
        self._tt: dict[Any, TensorType] = {}

    # -- driver ----------------------------------------------------------------------------
    def run(self) -> BlockResult:
        start = time.perf_counter()
        self._init_iterators()
        stage = self._apply_seeds()
        if stage >= 0 or not self.task.replay:  # a replay whose seed failed has no search
            self._search(stage)
        self.counters.complete = len(self.found)
        return BlockResult(self.task, self.found, self.counters, time.perf_counter() - start)

    def _search(self, stage: int) -> None:
        """The op-by-op search from the seeded graph (the native DFS overrides it)."""
        try:
            self._dfs(stage, first=True)
        except Stop:
            self.counters.truncated = True

    def _init_iterators(self) -> None:
        for arg, (t, term, f) in enumerate(
            zip(self.task.arg_types, self.task.arg_terms, self.task.fdims)
        ):
            shape = list(t.shape)
            if f != N:
                if shape[f] % self.R:
                    raise SearchError(f"loop range {self.R} does not divide {t} along dim {f}")
                shape[f] //= self.R
            lab = self.task.arg_index[arg] if self.use_index else None
            self.values.push(t.with_shape(tuple(shape)), term, BODY if f != N else INV, lab)
            attrs = (("arg", arg), ("fdim", f), ("imap", (N, N, N)))
            self.nodes.append((Op.INPUT_ITER, (), attrs, (-1,)))

    def _apply_seeds(self) -> int:
        """Apply the task's seeds; the stage the search continues from (-1: no seed applied)."""
        stage = -1
        for seed in self.task.seeds:
            pushed = self._push_macro(seed)
            if pushed:
                stage = max([stage] + [self.nodes[-1 - k][3][0] for k in range(len(pushed))])
                # the search continues from the seed's result only: its inner values
                # and the tiles it read are sealed (the unseeded task covers the rest)
                self.sealed.update(vid for vid, _ in pushed[:-1])
                self.sealed.update(i for _, ins in pushed for i in ins
                                   if i < len(self.task.arg_types))  # fmt: skip
        return stage

    def _tick(self) -> None:
        c = self.counters
        c.states += 1
        if c.states > self.task.max_states:
            raise Stop
        if self.deadline is not None and c.states % 256 == 0 and time.time() > self.deadline:
            c.timed_out = True
            raise Stop

    def _dfs(self, stage: int, first: bool = False) -> None:
        """Extend the graph op by op. A move's checks are counted where it is first proposed:
        in the first graph, or in the graph whose newest value it reads (below that graph it
        is the same move, its answer memoized); all of a graph's before any is applied. The
        native DFS evaluates each move only there, so its counters are these."""
        self._tick()
        if self.n_ops != 0:
            self.found.extend(self.savers.complete(self.nodes))
        if self.n_ops >= self.task.max_ops:
            return
        newest = len(self.values) - 1
        moves = [(op, ins, attrs, key, self._evaluate(op, ins, attrs, shape, st,
                                                      count=first or newest in ins))
                 for op, ins, attrs, key, shape, st in self._moves(stage)]  # fmt: skip
        for op, ins, attrs, key, res in moves:
            if res is None:
                continue
            t, term, phase, lab, sig = res
            if self.prune and self.values.computed(sig):
                self.counters.pruned_duplicate += 1
                continue
            vid = self._apply(op, ins, attrs, key, t, term, phase, lab)
            if self._can_finish(key[0]):
                self._dfs(key[0])
            else:
                self.counters.pruned_dead += 1
            self._undo(vid, ins)

    def _can_finish(self, stage: int) -> bool:
        dangling = self.values.dangling()
        left = self.task.max_ops - self.n_ops
        if len(dangling) - left > self.m:
            return False
        if stage >= 3:  # body values unused once the epilogue begins can only be saved
            dead = [v for v in dangling if self.values.phase[v] == BODY]
            if len(dead) > self.m:
                return False
        return True

    # -- applying ops ----------------------------------------------------------------------
    def _apply(self, op, ins, attrs, key, t, term, phase, lab) -> int:
        vid = self.values.push(t, term, phase, lab)
        for i in ins:
            self.values.uses[i] += 1
        self.nodes.append((op, ins, attrs, key))
        self.sigs.add((op, attrs, ins))
        self.sig_vid[(op, attrs, ins)] = vid
        self.n_ops += 1
        return vid

    def _undo(self, vid: int, ins: tuple[int, ...]) -> None:
        op, _, attrs, _ = self.nodes.pop()
        self.sigs.discard((op, attrs, ins))
        self.sig_vid.pop((op, attrs, ins), None)
        for i in ins:
            self.values.uses[i] -= 1
        self.values.pop()
        self.n_ops -= 1

    # -- macros ----------------------------------------------------------------------------
    def _push_macro(self, macro: Macro) -> Pushed | None:
        """Apply a macro's new ops (None, with nothing applied, if one of them fails)."""
        local: list[int] = []
        pushed: Pushed = []
        for op, refs, attrs in macro.nodes:
            ins = tuple(r if kind == "arg" else local[r] for kind, r in refs)
            existing = self.sig_vid.get((op, attrs, ins))
            if existing is not None:
                local.append(existing)
                continue
            result = self._macro_node(op, ins, attrs) if self.n_ops < self.task.max_ops else None
            if result is None:
                self._rollback(pushed)
                return None
            key, t, term, phase, lab = result
            vid = self._apply(op, ins, attrs, key, t, term, phase, lab)
            local.append(vid)
            pushed.append((vid, ins))
        if not pushed:
            return None
        # after a macro any op of a later-or-equal stage may follow (see Macro)
        op, ins, attrs, key = self.nodes[-1]
        self.nodes[-1] = (op, ins, attrs, (key[0], -1))
        return pushed

    def _rollback(self, pushed: Pushed) -> None:
        for vid, vins in reversed(pushed):
            self._undo(vid, vins)

    def _macro_node(self, op, ins, attrs) -> tuple | None:
        """(key, type, term, phase, index info) of one macro op, or None if a check fails."""
        phases = {self.values.phase[i] for i in ins}
        if op in ACCUMULATORS:  # a replayed skeleton's (target fragments have none)
            if phases != {BODY} or self.R == 1:
                return None
            st = 2
        elif BODY in phases and EPI in phases:
            return None
        else:
            st = 3 if EPI in phases else 1 if BODY in phases else 0
        idents = [self.values.ident[self.values.sid[i]] for i in ins]
        try:
            (t,) = infer(op, tuple(x[0] for x in idents), dict(attrs), self.ctx)
        except GraphError:
            return None
        try:
            lab = self._index_step(op, attrs, idents, t.shape, body=st in (1, 2))
        except Conflict:
            return None
        phase = _PHASE_OF_STAGE[st]
        term = self._term(op, attrs, idents, t)
        if term is None or (self.prune and self.values.redundant(t, term, phase, lab)):
            return None
        key = (st, OP_RANK[op], attr_key(attrs), ins)
        return key, t, term, phase, lab

    # -- checks ----------------------------------------------------------------------------
    def _term(self, op: Op, attrs, idents, t: TensorType, count: bool = True) -> Any | None:
        """The term of an op's result on operands of these identities (see ``BlockValues``),
        or None if the oracle prunes it (counted if ``count``)."""
        term = abstract.abstract_op(
            op, dict(attrs), [x[1] for x in idents], [x[0] for x in idents], [t], self.ctx,
        )[0]  # fmt: skip
        if self.prune and not self.oracle.contains(term):
            if count:
                self.counters.pruned_abstract += 1
            return None
        return term

    def _index_step(self, op, attrs, idents, shape, body: bool) -> Any:
        """The index info of an op's result (None with the analysis off); raises Conflict."""
        if not self.use_index:
            return None
        return self.checker.step(op, attrs, [x[3] for x in idents],
                                 [x[0].shape for x in idents], shape, body=body)  # fmt: skip

    # -- moves -----------------------------------------------------------------------------
    def _moves(self, stage: int) -> Iterator[tuple]:
        """Candidate ops in canonical order whose stage is >= ``stage``."""
        last = self.nodes[-1]
        last_key = last[3] if last[0] is not Op.INPUT_ITER else (-1,)
        last_out = len(self.values) - 1 if last[0] is not Op.INPUT_ITER else -1
        for group in stage_groups(self.values.phase, self.sealed, stage, self.R):
            st = group[0]
            for op, ins, attrs, shape in group_moves(self._ops, self.values.types, group):
                key = (st, OP_RANK[op], attr_key(attrs), ins)
                if not (key > last_key or last_out in ins):
                    continue
                if (op, attrs, ins) in self.sigs:
                    continue
                yield op, ins, attrs, key, shape, st

    def _evaluate(self, op, ins, attrs, shape, st, count: bool) -> tuple | None:
        """(type, term, phase, index info, signature) of a proposed op, or None if a check
        drops it (counted if ``count``)."""
        sid = self.values.sid
        hit = self.evaluate(op, attrs, tuple(sid[i] for i in ins), shape, st)
        if isinstance(hit, str):
            if count:
                c = self.counters
                setattr(c, hit, getattr(c, hit) + 1)
            return None
        self.counters.proposed += count
        return hit

    def evaluate(self, op, attrs, sids, shape, st) -> tuple | str:
        """``_evaluate`` on operands given by their sids, uncounted: the result, or the name of
        the counter of the check that drops it. Memoized: every check is a function of the
        operands' identities (``BlockValues``), which is what lets the native DFS call it."""
        mkey = (op, attrs, sids, st)
        hit = self._memo.get(mkey)
        if hit is None:
            hit = self._memo[mkey] = self._evaluate_fresh(op, attrs, sids, shape, st)
        return hit

    def _evaluate_fresh(self, op, attrs, sids, shape, st) -> tuple | str:
        vals = self.values
        idents = [vals.ident[s] for s in sids]
        dtype = masked_dtype(op, tuple(x[0].dtype for x in idents))
        if dtype is None:
            return "pruned_index"
        try:
            lab = self._index_step(op, attrs, idents, shape, body=st in (1, 2))
        except Conflict:
            return "pruned_index"
        dropped = self._operand_check(op, [x[1] for x in idents])
        if dropped is not None:
            return dropped
        t = self._tt.get((shape, dtype))
        if t is None:
            t = self._tt[(shape, dtype)] = TensorType(shape, dtype)
        phase = _PHASE_OF_STAGE[st]
        term = self._term(op, attrs, idents, t, count=False)
        if term is None:
            return "pruned_abstract"
        if self.prune and vals.is_constant(term):
            return "pruned_duplicate"
        return (t, term, phase, lab, vals.sig(t, term, phase, lab))

    def _operand_check(self, op: Op, terms: list[Any]) -> str | None:
        """The counter of a check on the operands' terms that drops the op (None: it passes)."""
        if op is Op.EXP and self.task.shifted_exp and not is_max_shifted(terms[0]):
            return "pruned_numeric"
        if op is Op.ACC_RESCALE_SUM and self.prune and terms[1].head != "rmax":
            return "pruned_index"  # the rescale operand must be a max (online softmax)
        return None
