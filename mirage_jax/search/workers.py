"""The search's worker side: module-level, picklable task functions with per-process
caches, and the executors they run on (a process pool that never re-runs the user's
``__main__``, or inline)."""

from __future__ import annotations

import concurrent.futures as cf
import io
import os
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import popen_spawn_posix, reduction, resource_tracker, spawn, util
from multiprocessing.context import SpawnContext, SpawnProcess, set_spawning_popen
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
    """``workers`` fresh interpreters that import only ``mirage_jax`` (see ``_MainlessPopen``),
    but no more than the CPUs this process may run on, or the inline executor for one.

    Results do not depend on the executor; a second process on the same CPU would only add
    its start-up, its own e-graph and memory to the time the enumeration's clock sees."""
    workers = min(workers, usable_cpus())
    if workers <= 1:
        return InlineExecutor()
    return cf.ProcessPoolExecutor(workers, mp_context=_MAINLESS)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. under ``taskset``)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


# The pool's processes must start clean and must not run the user's program again.
#
# Clean: the parent has jax (and its thread pools) loaded, so a plain fork could copy a lock
# held by another thread; every worker is a fresh interpreter instead.
#
# Not the user's program: with the "spawn" start method, ``spawn.get_preparation_data`` tells
# the child where the parent's ``__main__`` came from (``init_main_from_path`` for a script,
# ``init_main_from_name`` for ``python -m``) and the child's ``spawn.prepare`` runs it again as
# ``__mp_main__`` before it takes a task. A script without an ``if __name__ == "__main__":``
# guard then calls the optimized function again inside the worker, which starts a pool of its
# own during its bootstrapping phase and dies with multiprocessing's bootstrapping error; code
# on standard input is sent as the path ``<cwd>/<stdin>`` and every worker dies with
# FileNotFoundError (BrokenProcessPool in the parent). "forkserver" does not avoid it (CPython
# 3.11-3.13): its children are handed the same preparation data and run the same
# ``spawn.prepare``, and the server's default preload, ``["__main__"]``, runs the script once
# more in the server itself; ``set_forkserver_preload`` only changes where it runs, and it is
# process-wide state the user's own multiprocessing shares.
#
# So the pool's processes are spawned by a launcher of our own that sends the same
# preparation data less those two keys. Nothing a worker runs needs the user's module: the task
# functions live here and what they receive is text, configs and tuples. The child side is
# multiprocessing's own ``spawn_main``, so everything else (sys.path, cwd, authkey, the
# resource tracker, the queues' pickling) is what "spawn" does.
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")


class _MainlessPopen(popen_spawn_posix.Popen):
    """The "spawn" launcher with the parent's ``__main__`` left out of the child's
    preparation data."""

    def _launch(self, process_obj: Any) -> None:
        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
        data = spawn.get_preparation_data(process_obj._name)
        for key in _MAIN_KEYS:
            data.pop(key, None)
        payload = io.BytesIO()
        # the queues in the process's arguments pickle their fds through the spawning popen
        set_spawning_popen(self)
        try:
            reduction.dump(data, payload)
            reduction.dump(process_obj, payload)
        finally:
            set_spawning_popen(None)
        # two pipes: the child reads its payload from one; the other's read end, kept here,
        # is the process's sentinel (readable once the child exits)
        sentinel_r, sentinel_w = os.pipe()
        payload_r, payload_w = os.pipe()
        try:
            self._fds += [payload_r, sentinel_w]
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=payload_r)
            self.pid = util.spawnv_passfds(spawn.get_executable(), cmd, self._fds)
            self.sentinel = sentinel_r
            with open(payload_w, "wb", closefd=False) as pipe:
                pipe.write(payload.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, util.close_fds, (sentinel_r, payload_w))
            os.close(payload_r)
            os.close(sentinel_w)


class _MainlessProcess(SpawnProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _MainlessPopen:
        return _MainlessPopen(process_obj)


class _MainlessContext(SpawnContext):
    Process = _MainlessProcess


_MAINLESS = _MainlessContext()


class TaskLost(Exception):
    """A task that did not run to completion because its worker (or the pool) was lost.

    The contract between the search and any executor: a future raises ``TaskLost``,
    ``concurrent.futures.CancelledError`` or ``BrokenExecutor`` only when the task did not run;
    an error of the task itself is raised as it is. The search sends a lost task again, then
    runs it here or reports it as not run (``runner.TASK_RETRIES``)."""


# Per thread: an egglog e-graph may only be dropped on the thread that made it, and this
# process may explore several regions at once on threads of its own.
_LOCAL = threading.local()
# a long-lived worker (a Dask cluster's) serves search after search: keep the contexts of the
# most recent few searches, not every e-graph it ever saturated
_MAX_STATE = 16
# value identities one search's block tasks share here (``SearchShare``) before it is emptied
_MAX_IDENTITIES = 400_000


def _state() -> dict[Any, Any]:
    if not hasattr(_LOCAL, "state"):
        _LOCAL.state = {}
    return _LOCAL.state


def _remember(key: Any, value: Any) -> Any:
    state = _state()
    state.pop(key, None)
    state[key] = value
    while len(state) > _MAX_STATE:
        state.pop(next(iter(state)), None)
    return value


def prime(target_text: str, config: SearchConfig, target: KernelGraph, space: Any,
          oracle: Any) -> None:  # fmt: skip
    """Hand this process's own search context to the workers that run in it (the inline
    executor), so they do not saturate the target's e-graph a second time."""
    _remember((target_text, config), (target, space, oracle, en.SearchShare()))


def _worker_context(target_text: str, config: SearchConfig
                    ) -> tuple[KernelGraph, Any, Any, en.SearchShare]:  # fmt: skip
    """(target, space, oracle, what its block tasks share here) of one search."""
    key = (target_text, config)
    hit = _state().get(key)
    if hit is None:
        target = parse(target_text)
        space = config.space(target)  # type: ignore[arg-type]
        oracle = make_oracle(target, config) if config.prune else None
        hit = _remember(key, (target, space, oracle, en.SearchShare()))
    return hit


def make_oracle(target: KernelGraph, config: SearchConfig) -> Any:
    # deferred: the oracle loads egglog, which importing the search must not
    from mirage_jax.search.abstract import SaturationBudget, SubexprOracle

    budget = SaturationBudget(config.saturation_iterations, config.saturation_node_limit,
                              config.saturation_time_s)  # fmt: skip
    return SubexprOracle(target, budget=budget)


def block_worker(target_text: str, config: SearchConfig, tasks: Sequence[en.BlockTask],
                 deadline: float) -> list[en.BlockResult]:  # fmt: skip
    """Run a chunk of block tasks, in order (in any process): most tasks take well under a
    millisecond, a round trip to a pool's process about as long as several of them."""
    _, space, oracle, share = _worker_context(target_text, config)
    out = []
    for task in tasks:
        if time.time() > deadline:
            res = en.BlockResult(task)
            res.counters.truncated = res.counters.timed_out = True
        else:
            if len(share) > _MAX_IDENTITIES:
                share.clear()
            start = time.perf_counter()
            res = en.run_block_task(task, space, oracle, deadline, shared=share)
            res.seconds = time.perf_counter() - start
        out.append(res)
    return out


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
    hit = _state().get(key)
    return hit if hit is not None else _remember(key, parse(text))


__all__ = [
    "InlineExecutor", "TaskLost", "block_worker", "default_executor", "make_oracle", "prime",
    "target_digest_worker", "verify_worker",
]  # fmt: skip
