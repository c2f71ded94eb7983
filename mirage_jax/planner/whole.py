"""The plan judged on the whole program: regions that win alone can lose together.

Each region is timed against XLA's fusion of that region alone (per call in a loop, over
copies of its inputs as large as the program: ``planner.region``). In the program, XLA fuses
across the region's edges, every custom call pays its dispatch and a kernel that splits over
XLA's pool waits for a helper thread the loop kept awake, so a plan of regions that each win
can run slower than ``jax.jit`` of the whole (a two-layer Llama decode step: six custom calls,
each 1.2-1.3x per call in a loop, 0.84x together). ``keep_winning``
times the program with the plan's custom calls against the program with none; when the plan is
not faster by the planner's margin, it times the program with each kernel alone (the identical
regions of a model's layers share one) and keeps those that win there by that margin, together
if they win together, else the best one alone, or none. The choice is cached per program.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from mirage_jax.planner.decisions import Decision, load, store
from mirage_jax.planner.region import WIN_MARGIN, confirmed

log = logging.getLogger("mirage_jax")

# (seconds with the custom calls of these regions, seconds of jax.jit) in this process
Measure = Callable[[frozenset[int]], tuple[float, float]]


def keep_winning(plans: Sequence[Any], measure: Measure, key: str | None,
                 alone: bool = False) -> str:  # fmt: skip
    """Drop (``impl = None``, with the reason) the custom calls of ``plans`` that do not pay
    for themselves in the whole program; ``key``: the program's cache key (None: not cached);
    ``alone``: the program is its one region (no cut, nothing else for XLA to fuse it with),
    so the region's own comparison was the program's. Returns what was measured, for explain
    ("" when nothing was)."""
    custom = [p for p in plans if p.impl is not None]
    if not custom or (alone and len(plans) == 1):
        return ""
    cached = load(key) if key is not None else None
    if cached is not None and "keep" in cached.summary:
        keep, note = set(cached.summary["keep"]), cached.reason
    else:
        keep, note = _choose(custom, measure)
        if key is not None:
            store(key, Decision(None, note, summary={"keep": sorted(keep)}))
    for p in custom:
        if p.index not in keep:
            p.impl = None
            p.reason = f"dropped from the program: {note}"
    if len(keep) < len(custom):
        log.info("mirage_jax: %s", note)
    return note


def program_key(region_keys: Sequence[str], program_text: str) -> str:
    """The cache key of the whole-program choice: every region's decision and the program."""
    blob = json.dumps({"regions": list(region_keys), "program": program_text})
    return "program-" + hashlib.sha256(blob.encode()).hexdigest()


def _choose(custom: list[Any], measure: Measure) -> tuple[set[int], str]:
    everything = frozenset(p.index for p in custom)
    all_ratio = _ratio(measure, everything)
    if all_ratio >= WIN_MARGIN:
        return set(everything), (f"the program with all its custom calls ran {all_ratio:.2f}x "
                                 "of jax.jit")
    # each kernel (identical regions share one) alone in the program: its worth in context
    groups: dict[str, list[int]] = {}
    for p in custom:
        groups.setdefault(p.key or str(p.index), []).append(p.index)
    alone = sorted(((_ratio(measure, frozenset(g)), g) for g in groups.values()), reverse=True)
    winners = [g for ratio, g in alone if ratio >= WIN_MARGIN]
    keep, ratio = set(), 1.0
    if len(winners) > 1:
        together = frozenset(i for g in winners for i in g)
        ratio = _ratio(measure, together)
        keep = set(together) if ratio >= WIN_MARGIN else set()
    if not keep and winners:
        keep, ratio = set(winners[0]), alone[0][0]
    readings = ", ".join(f"regions {','.join(map(str, g))} {r:.2f}x" for r, g in alone)
    kept = (f"kept regions {', '.join(map(str, sorted(keep)))} ({ratio:.2f}x)" if keep
            else "kept none")  # fmt: skip
    return keep, (f"with all {len(custom)} custom calls the program ran {all_ratio:.2f}x of "
                  f"jax.jit (XLA fuses across the regions' edges; each call costs its "
                  f"dispatch); each kernel alone in the program: {readings}; {kept}")  # fmt: skip


def _ratio(measure: Measure, keep: frozenset[int]) -> float:
    """The program's speedup over jax.jit with ``keep``'s custom calls, a close win confirmed
    as a region's is."""
    mirage_s, xla_s = confirmed(lambda: measure(keep))
    return xla_s / mirage_s
