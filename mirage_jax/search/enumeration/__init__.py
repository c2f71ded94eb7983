"""Enumerating μGraphs: kernel graphs grown op by op, block graphs for graph-defined kernels.

The search space (bounds in ``SearchConfig``, concrete candidates in ``SearchSpace``):

**Kernel level.** Graphs are grown from the target's inputs one op at a time: pre-defined ops
from the target's vocabulary, and one graph-defined kernel whose operands the search chooses
among the existing tensors (any sorted subset, up to ``max_graph_def_inputs``). A graph is
complete when its outputs are the target's outputs and every other tensor is used.

**Block level** (one graph_def). An enumeration *task* fixes the operands and the loop
structure: which dim of each operand the for-loop splits (``fdim``, or none), and a
representative loop range. The DFS then adds block ops one at a time: compute ops on tiles and
for-loop accumulators, then epilogue ops, and completes when output savers can save exactly
the target's outputs. The DFS runs on a *representative tiling*: grid (1,1,1), so the
abstract terms (which do not depend on the grid, see ``abstract``) and the op skeleton are
found once; ``instantiate`` then derives every concrete (grid, imap, omap, forloop range)
for a found skeleton by propagating grid splits through its ops (a split must follow a
non-reduced dim from operands to every saved output), and rebuilds each one with the IR's
checking builders. Skeletons valid only at some concrete tiling but not at the representative
one (e.g. a broadcast that needs a tile dim of 1) are outside this space.

**Canonical order.** Each new op gets a key ``(stage, op, attrs, operands)`` where the stage is
0 for loop-invariant ops, 1 for loop-body ops, 2 for accumulators, 3 for epilogue ops. A new op
is accepted only if its key is greater than the previous op's key or it uses the previous op's
result, and it is not a copy of an existing op. Every dataflow graph has such an order (sort
any topological order by swapping adjacent independent ops whose keys are inverted: the
sequence of keys decreases lexicographically, so this ends), so nothing is lost; and most
graphs are generated once (duplicates that slip through are removed by fingerprint).

**Pruning** (each sound with respect to the space above):
- abstract expressions: a new tensor whose term is not a subexpression of the target modulo
  the axioms (``SubexprOracle.contains``) is dropped (``prune=False`` turns this off);
- dead code: a graph needs every tensor used; with ``d`` unused tensors, ``r`` ops left and
  ``m`` outputs, a branch with ``d - r > m`` cannot finish (an op uses at most one more unused
  tensor than it creates); loop-body tensors still unused when the epilogue begins are dead;
- phases: accumulators take loop-body values only; body and epilogue values never mix.

Modules, each importing only those above it::

    counters     what an enumeration did; the budget's stop signal
    rules        canonical-order keys, value phases, fast shape rules
    terms        value numbering of abstract terms, max-shifted exps
    index        the index analysis (a second, index-aware abstraction)
    macros       target fragments that seed a block task
    tasks        block tasks, skeletons, results; the loop structures of a site
    canonical    canonical forms of block graphs
    tilings      split patterns, concrete tilings, instantiation
    kernel       the kernel-level DFS, graph_def sites, ``build_kernel``
    block_moves  block-level op proposals
    values       the values of a partial block graph
    saving       completing a partial block graph into skeletons
    block        the block-level DFS (the reference)
    native       the same DFS with its hot loop in C++, ``run_block_task``
"""

from __future__ import annotations

from types import ModuleType

from mirage_jax.search import abstract
from mirage_jax.search.enumeration import index as _index
from mirage_jax.search.enumeration.block import SearchShare
from mirage_jax.search.enumeration.canonical import canonical_block
from mirage_jax.search.enumeration.counters import Counters
from mirage_jax.search.enumeration.index import IndexAnalysis
from mirage_jax.search.enumeration.kernel import (
    KernelDFS,
    KernelEnumeration,
    Site,
    build_kernel,
)
from mirage_jax.search.enumeration.macros import target_macros
from mirage_jax.search.enumeration.native import run_block_task
from mirage_jax.search.enumeration.tasks import (
    BlockResult,
    BlockTask,
    Skeleton,
    loop_structures,
    reduce_extents,
)
from mirage_jax.search.enumeration.terms import is_max_shifted, shifted_exps
from mirage_jax.search.enumeration.tilings import Tiling, instantiate, tilings

# private names the tests reach through the package, as they did through the old module
_Conflict = _index.Conflict
_labels_match = _index.labels_match


def _abstract() -> ModuleType:
    """The abstract-expression module (tests build terms through the enumeration's name)."""
    return abstract


__all__ = [
    "BlockResult", "BlockTask", "Counters", "IndexAnalysis", "KernelDFS", "KernelEnumeration",
    "SearchShare",
    "Site", "Skeleton", "Tiling", "build_kernel", "canonical_block", "instantiate",
    "is_max_shifted", "loop_structures", "reduce_extents", "run_block_task", "shifted_exps",
    "target_macros", "tilings",
]  # fmt: skip
