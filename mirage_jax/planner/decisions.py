"""Persistent cache of region decisions: which μGraph replaced a region, or why XLA kept it.

An entry is keyed by everything its answer depends on: the region's canonical text (shapes and
dtypes included), the backend, the CPU ISA, the search configuration and the mirage_jax
version. A second process start then skips search, verification and timing. Entries are JSON
files ``<key>.json`` in the store's ``decisions`` namespace, published atomically (see
``mirage_jax.store``), so concurrent processes never see half an entry; each carries a sha256
of its payload, and an entry that fails to parse or to check is reported, deleted and rebuilt,
never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirage_jax.ir import KernelGraph, parse
from mirage_jax.store import CACHE_ENV, Namespace, StoreStats, namespace
from mirage_jax.version import __version__

FORMAT = 1
_DECISIONS = namespace("decisions")
log = logging.getLogger("mirage_jax")


@dataclass(frozen=True)
class Decision:
    """A cached outcome for one region: ``graph`` is None when the region stays with XLA."""

    graph: KernelGraph | None
    reason: str = ""
    mirage_s: float | None = None
    xla_s: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)


def cache_stats() -> StoreStats:
    """A snapshot of this process's decision-cache hits, misses, corrupt entries and writes."""
    return _DECISIONS.stats()


def decision_dir() -> Path:
    return _DECISIONS.directory


def _space(root: Path | None) -> Namespace:
    return _DECISIONS if root is None else _DECISIONS.at(root)


def decision_key(target: KernelGraph, **context: Any) -> str:
    """sha256 over the region text and every piece of context the decision depends on."""
    fields = {"region": target.fingerprint(), "version": __version__, **context}
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _payload_hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def load(key: str, root: Path | None = None) -> Decision | None:
    """The decision cached under ``key``, or None (missing, or corrupt and now deleted; or the
    cache cannot be used, which is logged)."""
    space = _space(root)
    try:
        return space.load(space.entry(f"{key}.json"), lambda path: _decode(path.read_text()))
    except OSError as err:  # e.g. a corrupt entry in a read-only cache: cannot be replaced
        _unusable(space, err)
        return None


def _decode(text: str) -> Decision:
    entry = json.loads(text)
    if entry.get("format") != FORMAT:
        raise ValueError(f"format {entry.get('format')!r}, expected {FORMAT}")
    payload = entry["payload"]
    if _payload_hash(payload) != entry["sha256"]:
        raise ValueError("checksum mismatch")
    graph = parse(payload["graph"]) if payload["graph"] is not None else None
    return Decision(graph, payload["reason"], payload["mirage_s"], payload["xla_s"],
                    payload.get("summary", {}))  # fmt: skip


def store(key: str, decision: Decision, root: Path | None = None) -> Path:
    """Record ``decision`` under ``key``; returns the entry's path (not written, with a
    warning, when the cache cannot be written)."""
    payload = {
        "graph": str(decision.graph) if decision.graph is not None else None,
        "reason": decision.reason,
        "mirage_s": decision.mirage_s,
        "xla_s": decision.xla_s,
        "summary": decision.summary,
    }
    entry = {"format": FORMAT, "payload": payload, "sha256": _payload_hash(payload)}
    space = _space(root)
    path = space.entry(f"{key}.json")
    try:
        space.publish_text(path, json.dumps(entry, sort_keys=True))
    except OSError as err:  # the plan stands; it is only not remembered
        _unusable(space, err)
    return path


def _unusable(space: Namespace, err: OSError) -> None:
    log.warning("the decision cache at %s cannot be used (%s: %s); this region is planned "
                "again by the next process. remedy: make it writable, or set %s to a "
                "writable directory", space.directory, err.strerror or err, err.filename,
                CACHE_ENV)  # fmt: skip
