"""Persistent cache of region decisions: which μGraph replaced a region, or why XLA kept it.

An entry is keyed by everything its answer depends on: the region's canonical text (shapes and
dtypes included), the backend, the CPU ISA, the search configuration and the mirage_jax
version. A second process start then skips search, verification and timing. Entries are JSON
written atomically (temporary file + ``os.replace``), so concurrent processes never see half an
entry; each carries a sha256 of its payload, and an entry that fails to parse or to check is
reported, deleted and rebuilt, never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirage_jax.ir import KernelGraph, parse

log = logging.getLogger("mirage_jax.cache")

FORMAT = 1


@dataclass(frozen=True)
class Decision:
    """A cached outcome for one region: ``graph`` is None when the region stays with XLA."""

    graph: KernelGraph | None
    reason: str = ""
    mirage_s: float | None = None
    xla_s: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    writes: int = 0


_STATS = CacheStats()


def cache_stats() -> CacheStats:
    return _STATS


def decision_dir() -> Path:
    from mirage_jax.codegen.build import cache_root

    return cache_root() / "decisions"


def decision_key(target: KernelGraph, **context: Any) -> str:
    """sha256 over the region text and every piece of context the decision depends on."""
    from mirage_jax import __version__

    fields = {"region": target.fingerprint(), "version": __version__, **context}
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _payload_hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def load(key: str, root: Path | None = None) -> Decision | None:
    path = (root or decision_dir()) / f"{key}.json"
    try:
        text = path.read_text()
    except FileNotFoundError:
        _STATS.misses += 1
        return None
    try:
        decision = _decode(text)
    except Exception as err:  # any failure to decode means the entry cannot be trusted
        _STATS.corrupt += 1
        log.warning("cache entry %s is corrupt (%s); it is deleted and will be rebuilt", path, err)
        path.unlink(missing_ok=True)
        return None
    _STATS.hits += 1
    return decision


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
    root = root or decision_dir()
    root.mkdir(parents=True, exist_ok=True)
    payload = {
        "graph": str(decision.graph) if decision.graph is not None else None,
        "reason": decision.reason,
        "mirage_s": decision.mirage_s,
        "xla_s": decision.xla_s,
        "summary": decision.summary,
    }
    entry = {"format": FORMAT, "payload": payload, "sha256": _payload_hash(payload)}
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f, sort_keys=True)
    path = root / f"{key}.json"
    os.replace(tmp, path)
    _STATS.writes += 1
    return path
