// The block-level DFS's hot loop in C++: move generation in canonical order, the canonical
// key test, the memo of op checks, duplicate and dead-end pruning, and the completion test.
// A graph's moves are its parent's accepted ones plus those on its newest value, so a move is
// generated and checked once, where it first appears, not again in every graph below.
//
// It is the same search as mirage_jax/search/enumeration/block.py (the reference): the same
// moves in the same order, the same counters.  Every check that needs abstract terms, the
// e-graph or the index analysis stays in Python and is reached through two callbacks whose
// answers depend only on the operands' identities (sids), so each is asked once per task:
//
//   evaluate(op, attr, sids, stage, shape) -> (0, sid, sig) for an accepted op, or
//                                             (counter, -1, -1) for a dropped one
//   fit(sid, output) -> the saver's fdim (-1: none needed), or -2 when the value cannot be
//                       that output
//
// Ops and attributes are small integer codes chosen by the Python side (see native.py).
#pragma once

#include <pybind11/pybind11.h>

namespace mirage_jax::search {

void BindBlockSearch(pybind11::module_& m);

}  // namespace mirage_jax::search
