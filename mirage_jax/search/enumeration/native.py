"""The block-level DFS on the native core: ``block.BlockDFS``'s search with its hot loop in C++
(``mirage_jax._C.BlockSearch``, csrc/search/block_dfs.cc).

C++ generates the moves in canonical order, keeps the partial graph and applies the cheap
checks (canonical keys, applied ops, duplicates by signature, dead ends, completion); every
check on abstract terms, the e-graph and the index analysis stays here, reached through two
callbacks that depend only on the operands' identities (``BlockValues`` sids), so each is
asked once per task and memoized there. The same moves in the same order: the skeletons and
the counters are the Python DFS's, which ``engine="python"`` runs (the reference, and the
fallback when the native module cannot be loaded).
"""

from __future__ import annotations

from typing import Any

from mirage_jax.ir.ops import Op
from mirage_jax.search.enumeration.block import BlockDFS, SearchShare
from mirage_jax.search.enumeration.counters import Counters
from mirage_jax.search.enumeration.rules import (
    COMMUTATIVE,
    OP_RANK,
    TRIVIAL_ON_ITSELF,
    N,
    attr_key,
)
from mirage_jax.search.enumeration.tasks import BlockResult, BlockTask

_OPS = list(Op)  # op codes are OP_RANK values
_DIMS = range(-1, 8)  # the dims a dim attribute names (N, then 0..7: the core's max rank)
# the counters an evaluate() drop names, by the core's codes (0 is "accepted")
_DROPS = {"pruned_abstract": 1, "pruned_index": 2, "pruned_duplicate": 3, "pruned_numeric": 4}
_FIELDS = ("states", "proposed", "pruned_abstract", "pruned_index", "pruned_duplicate",
           "pruned_numeric", "pruned_dead", "truncated", "timed_out")  # fmt: skip


def native_core() -> Any | None:
    """``_C.BlockSearch``, or None when the native module is not loadable here."""
    # deferred: the runtime layer imports the native module lazily, and so does the search
    from mirage_jax.runtime.native import try_native

    mod = try_native()
    return getattr(mod, "BlockSearch", None) if mod is not None else None


class _Attrs:
    """Attribute sets as the core's small integer codes."""

    def __init__(self) -> None:
        self.sets: list[tuple] = []
        self._code: dict[tuple, int] = {}

    def code(self, attrs: tuple) -> int:
        got = self._code.get(attrs)
        if got is None:
            got = self._code[attrs] = len(self.sets)
            self.sets.append(attrs)
        return got

    def dims(self) -> list[int]:
        return [self.code((("dim", d),)) for d in _DIMS]


class NativeBlockDFS(BlockDFS):
    """``BlockDFS`` with its op-by-op search run by the native core."""

    def _search(self, stage: int) -> None:
        attrs = _Attrs()
        for op, _, a, _ in self.nodes:  # seeds' attributes first: the rank table's size
            attrs.code(a)
        spec = self._spec(attrs)
        core = _core()(spec, self._evaluate_cb(attrs), self.savers.fit_sid)
        vals = self.values
        for sid in sorted(set(vals.sid)):
            t, _, phase, _ = vals.ident[sid]
            core.add_sid(sid, list(t.shape), phase, vals.sig_id[sid])
        for v, (op, ins, a, key) in enumerate(self.nodes):
            core.push(vals.sid[v], OP_RANK[op], attrs.code(a), list(ins), _key(key),
                      v in self.sealed)  # fmt: skip
        core.run(stage)
        got = core.counters()
        self.counters = Counters(**{f: got[f] for f in _FIELDS})
        for new, savers in core.found():
            nodes = self.nodes + [(_OPS[op], tuple(ins), attrs.sets[a], None)
                                  for op, a, ins in new]  # fmt: skip
            self.found.append(self.savers._skeleton(nodes, savers))

    def _evaluate_cb(self, attrs: _Attrs) -> Any:
        values = self.values

        def evaluate(op: int, attr: int, sids: tuple, st: int, shape: tuple) -> tuple:
            hit = self.evaluate(_OPS[op], attrs.sets[attr], sids, shape, st)
            if isinstance(hit, str):
                return _DROPS[hit], -1, -1
            t, term, phase, lab, _ = hit
            sid = values.intern(t, term, phase, lab)
            return 0, sid, values.sig_id[sid]

        return evaluate

    def _spec(self, attrs: _Attrs) -> dict[str, Any]:
        """The vocabulary and bounds as codes (see csrc/search/block_dfs.h)."""
        ops = self._ops
        dims = attrs.dims()
        empty = attrs.code(())
        per_op: dict[int, list[int]] = {}  # op code -> the attribute codes it may take
        unary = [(OP_RANK[op], [attrs.code(a) for a in sets]) for op, sets in ops["unary"]]
        binary = [(OP_RANK[op], [attrs.code(a) for a in sets], op in COMMUTATIVE,
                   op in TRIVIAL_ON_ITSELF) for op, sets in ops["binary"]]  # fmt: skip
        for op, codes in unary:
            per_op[op] = codes
        for op, codes, _, _ in binary:
            per_op[op] = codes
        reduce = [OP_RANK[op] for op in ops["reduce"]]
        for op in reduce:
            per_op[op] = dims[1:]
        matmul = OP_RANK[Op.MATMUL] if ops["matmul"] else -1
        concat = OP_RANK[Op.CONCAT] if ops["concat"] else -1
        if matmul >= 0:
            per_op[matmul] = [empty]
        if concat >= 0:
            per_op[concat] = dims[1:]
        acc = [(OP_RANK[op], op is Op.ACC_RESCALE_SUM) for op in ops["acc"]]
        for op, rescale in acc:
            per_op[op] = [empty] if rescale else dims
        ranks = []
        for op, codes in per_op.items():
            order = sorted(codes, key=lambda c: attr_key(attrs.sets[c]))
            ranks += [(op, c, r) for r, c in enumerate(order)]
        return {
            "unary": unary, "reduce": reduce, "binary": binary, "matmul": matmul,
            "concat": concat, "acc": acc, "dim_attr": dims, "empty_attr": empty,
            "n_attrs": len(attrs.sets), "attr_rank": ranks, "max_ops": self.task.max_ops,
            "outputs": self.m, "loops": self.R, "max_states": self.task.max_states,
            "deadline": self.deadline or 0.0, "prune": self.prune,
        }  # fmt: skip


def _key(key: tuple) -> list[int]:
    """A node's canonical key for the core: only the last initial node's is compared, and
    that is an iterator's (-1,) or a macro's (stage, -1)."""
    return [int(k) for k in key[:2]] if len(key) <= 2 else [int(key[0]), N]


def _core() -> Any:
    core = native_core()
    if core is None:
        raise RuntimeError("the native block search is not available")
    return core


def run_block_task(
    task: BlockTask, space: Any, oracle: Any | None, deadline: float | None = None,
    engine: str = "auto", shared: SearchShare | None = None,
) -> BlockResult:
    """Enumerate one block task (the unit of work the runner hands to executors).

    ``engine``: "native" (C++), "python" (the reference) or "auto" (native when the native
    module loads here; both give the same skeletons and counters). ``shared``: what the tasks
    of one search share in this process (``SearchShare``); it changes no result."""
    if engine not in ("auto", "native", "python"):
        raise ValueError(f"engine must be 'auto', 'native' or 'python', got {engine!r}")
    # the core's tensors have rank <= 8 (_DIMS); higher ranks take the reference
    fits = all(t.rank < len(_DIMS) for t in task.arg_types)
    if engine == "python" or (engine == "auto" and (native_core() is None or not fits)):
        return BlockDFS(task, space, oracle, deadline, shared).run()
    return NativeBlockDFS(task, space, oracle, deadline, shared).run()
