"""The shape-generic skeleton cache: block skeletons a search found, stored under its target's
shape-erased form, and offered back as block tasks to a search of the same program at other
shapes (another batch size or sequence length).

A stored skeleton is its kernel site (the prefix's ops and the chosen operands, shapes
erased), its loop structure (the dims the for-loop splits) and its block ops in canonical
order. Replayed, each becomes a seeded block task at the new site whose seed is the whole
skeleton and whose op bound is its size: the ops pass every check of the enumeration again
(shapes, phases, abstract terms against the new target's e-graph, the index analysis) and
the savers must produce the new target's outputs, so a skeleton that does not fit the new
shapes simply yields nothing. The survivors are instantiated at every tiling of the new
shapes, verified and timed like any other; only the enumeration is skipped, and the report
says so (it is not a search of the bounds at these shapes).

Entries live in the store's ``skeletons`` namespace, one JSON file per shape class.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from typing import Any

from mirage_jax.ir.graph import KernelGraph
from mirage_jax.ir.ops import Op
from mirage_jax.ir.text import to_text
from mirage_jax.search.config import SearchConfig
from mirage_jax.search.enumeration import Site, Skeleton
from mirage_jax.search.enumeration.macros import Macro
from mirage_jax.store import namespace

FORMAT = 1
_SKELETONS = namespace("skeletons")
log = logging.getLogger("mirage_jax.search")

# what changes with the shapes: a type's dims (its rank stays), reshape shapes, slice bounds
_TYPE = re.compile(r"\[([0-9,]*)\]")
_SHAPE_ATTR = re.compile(r"shape=\(([0-9, ]*)\)")
_BOUNDS = re.compile(r"\b(start|size)=[0-9]+")
_SHAPED_ATTRS = ("shape", "start", "size")
# the config fields that shape the enumeration's space (the rest are budgets and knobs)
_SPACE_FIELDS = ("max_kernel_ops", "max_block_ops", "max_graph_defs", "max_graph_def_inputs",
                 "fmaps", "kernel_ops", "block_ops", "prune")  # fmt: skip


def _rank(match: re.Match[str]) -> str:
    dims = match.group(1)
    return f"[rank {len(dims.split(',')) if dims else 0}]"


def erase_shapes(text: str) -> str:
    """``text`` (a μGraph's) with every extent erased and every rank kept."""
    text = _SHAPE_ATTR.sub(lambda m: "shape=" + _rank(m), text)
    return _BOUNDS.sub(lambda m: f"{m.group(1)}=?", _TYPE.sub(_rank, text))


def shape_class(target: KernelGraph, config: SearchConfig) -> str:
    """The key of the skeletons of every target that differs from ``target`` in extents only,
    searched with the same space bounds."""
    space = {name: repr(getattr(config, name)) for name in _SPACE_FIELDS}
    blob = json.dumps({"format": FORMAT, "target": erase_shapes(to_text(target)),
                       "space": space}, sort_keys=True)  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()


def site_signature(site: Site) -> str:
    """A site with its extents erased: its prefix ops (shaped attributes by rank) and operands."""
    nodes = [(op.value, list(ins), [(k, len(v) if k == "shape" else "?") if k in _SHAPED_ATTRS
                                    else (k, v) for k, v in attrs])
             for op, ins, attrs in site.prefix.nodes]  # fmt: skip
    return json.dumps([nodes, list(site.operands)], default=repr)


def _entry(site: Site, skel: Skeleton) -> dict[str, Any]:
    ref: dict[int, list[Any]] = {}
    nodes = []
    for n in skel.block.nodes:
        if n.op is Op.INPUT_ITER:
            ref[n.outs[0]] = ["arg", n.attr("arg")]
        elif n.op is not Op.OUTPUT_SAVER:
            nodes.append([n.op.value, [ref[i] for i in n.ins], [list(a) for a in n.attrs]])
            ref[n.outs[0]] = ["node", len(nodes) - 1]
    return {"site": site_signature(site), "fdims": list(skel.fdims), "nodes": nodes}


def _macro(entry: dict[str, Any]) -> Macro:
    return Macro(tuple((Op(op), tuple((kind, int(r)) for kind, r in refs),
                        tuple((str(k), _value(v)) for k, v in attrs))
                       for op, refs, attrs in entry["nodes"]))  # fmt: skip


def _value(v: Any) -> Any:
    return tuple(_value(x) for x in v) if isinstance(v, list) else v


def store(key: str, target: KernelGraph, found: Sequence[tuple[Site, Skeleton]],
          stop_reason: str) -> None:  # fmt: skip
    """Remember the skeletons a search of ``target`` found (not written when the cache cannot
    be: the search stands, it is only not remembered)."""
    payload = {"format": FORMAT, "target": target.fingerprint(), "stop_reason": stop_reason,
               "skeletons": [_entry(site, skel) for site, skel in found]}  # fmt: skip
    try:
        _SKELETONS.publish_text(_SKELETONS.entry(f"{key}.json"), json.dumps(payload))
    except OSError as err:
        log.debug("the skeleton cache cannot be written: %s", err)


def load(key: str, target: KernelGraph) -> tuple[dict[str, list[tuple[tuple[int, ...], Macro]]],
                                                 str] | None:  # fmt: skip
    """Skeletons stored for ``key`` by a search of *another* target of the shape class, by site
    signature: (loop structure, skeleton as a macro); and that search's stop reason. None
    when there are none (or they are this very target's: its search is not shape-generic)."""
    path = _SKELETONS.entry(f"{key}.json")
    try:
        payload = _SKELETONS.load(path, lambda p: json.loads(p.read_text()))
    except OSError:
        return None
    if not payload or payload.get("format") != FORMAT or payload["target"] == target.fingerprint():
        return None
    by_site: dict[str, list[tuple[tuple[int, ...], Macro]]] = {}
    for entry in payload["skeletons"]:
        by_site.setdefault(entry["site"], []).append((tuple(entry["fdims"]), _macro(entry)))
    return by_site, payload["stop_reason"]


__all__ = ["erase_shapes", "load", "shape_class", "site_signature", "store"]
