"""The search's worker side: module-level, picklable task functions with per-process
caches, and the executors they run on (a spawn-safe process pool, or inline)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import time
from collections.abc import Callable, Sequence
from typing import Any

from mirage_jax.ir.graph import KernelGraph
from mirage_jax.ir.text import parse
from mirage_jax.search import enumeration as en
from mirage_jax.search.config import SearchConfig
from mirage_jax.search.equivalence import (
    FFSpec,
    FFVerdict,
    FloatVerdict,
    ff_check_many,
    float_check,
    target_digest,
)


class InlineExecutor(cf.Executor):
    """Runs each task when submitted, in this thread (``workers=1``, or for tests)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as err:  # noqa: BLE001 - handed to the caller via the future
            fut.set_exception(err)
        return fut


def default_executor(workers: int) -> cf.Executor:
    if workers <= 1:
        return InlineExecutor()
    return cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


_STATE: dict[Any, Any] = {}


def prime(target_text: str, config: SearchConfig, target: KernelGraph, space: Any,
          oracle: Any) -> None:  # fmt: skip
    """Hand this process's own search context to the workers that run in it (the inline
    executor), so they do not saturate the target's e-graph a second time."""
    _STATE[(target_text, config)] = (target, space, oracle)


def _worker_context(target_text: str, config: SearchConfig) -> tuple[KernelGraph, Any, Any]:
    key = (target_text, config)
    hit = _STATE.get(key)
    if hit is None:
        target = parse(target_text)
        space = config.space(target)  # type: ignore[arg-type]
        oracle = make_oracle(target, config) if config.prune else None
        hit = _STATE[key] = (target, space, oracle)
    return hit


def make_oracle(target: KernelGraph, config: SearchConfig) -> Any:
    # deferred: the oracle loads egglog, which importing the search must not
    from mirage_jax.search.abstract import SaturationBudget, SubexprOracle

    budget = SaturationBudget(config.saturation_iterations, config.saturation_node_limit,
                              config.saturation_time_s)  # fmt: skip
    return SubexprOracle(target, budget=budget)


def block_worker(target_text: str, config: SearchConfig, task: en.BlockTask,
                 deadline: float) -> en.BlockResult:  # fmt: skip
    """Run one block task (in any process)."""
    _, space, oracle = _worker_context(target_text, config)
    if time.time() > deadline:
        res = en.BlockResult(task)
        res.counters.truncated = True
        return res
    return en.run_block_task(task, space, oracle, deadline)


def target_digest_worker(target_text: str, spec: FFSpec, trial: int) -> str:
    """The target's fingerprint on one trial (computed once per search, in any process)."""
    return target_digest(_parse_cached(target_text), spec, trial)  # type: ignore[arg-type]


def verify_worker(target_text: str, candidate_texts: Sequence[str], spec: FFSpec,
                  float_seed: int | None, target_digests: Sequence[str] | None = None,
                  ) -> list[tuple[FFVerdict, FloatVerdict | None]]:  # fmt: skip
    """Verify a batch: the float check (when ``float_seed`` is given; at real shapes it is
    the cheaper check, so it runs first), then finite-field fingerprints of the survivors,
    trial by trial. A candidate rejected by the float check has ``FFVerdict.trials == 0``."""
    target = _parse_cached(target_text)
    cands = [parse(t) for t in candidate_texts]
    floats = [float_check(target, c, float_seed) if float_seed is not None else None  # type: ignore[arg-type]
              for c in cands]  # fmt: skip
    alive = [k for k, f in enumerate(floats) if f is None or f.ok]
    ffs = ff_check_many(target, [cands[k] for k in alive], spec, target_digests)  # type: ignore[arg-type]
    out: list[tuple[FFVerdict, FloatVerdict | None]] = [
        (FFVerdict(False, 0, 0.0, "rejected by the float check"), f) for f in floats
    ]  # fmt: skip
    for k, ff in zip(alive, ffs):
        out[k] = (ff, floats[k])
    return out


def _parse_cached(text: str) -> KernelGraph:
    key = ("parsed", text)
    if key not in _STATE:
        _STATE[key] = parse(text)
    return _STATE[key]


__all__ = [
    "InlineExecutor", "block_worker", "default_executor", "make_oracle", "prime",
    "target_digest_worker", "verify_worker",
]  # fmt: skip
