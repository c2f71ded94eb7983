"""The search's worker side: module-level, picklable task functions with per-process
caches, and the executors they run on (``LocalPool``: here first, then a process pool that
never re-runs the user's ``__main__``; or inline)."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import io
import os
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import popen_spawn_posix, reduction, resource_tracker, spawn, util
from multiprocessing.context import SpawnContext, SpawnProcess, set_spawning_popen
from typing import Any

from mirage_jax.errors import MirageError
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
    """The executor of a search on this machine: a ``LocalPool`` of ``workers`` processes,
    but no more than the CPUs this process may run on, or the inline executor for one.

    Results do not depend on the executor; a second process on the same CPU would only add
    its start-up, its own e-graph and memory to the time the enumeration's clock sees."""
    workers = min(workers, usable_cpus())
    if workers <= 1:
        return InlineExecutor()
    return LocalPool(workers, pool_after_s())


def pool_after_s() -> float:
    """Seconds of block tasks run here before a ``LocalPool`` starts its processes
    (``MIRAGE_JAX_POOL_AFTER_S``; 0 starts them with the first block task)."""
    raw = os.environ.get("MIRAGE_JAX_POOL_AFTER_S", "")
    try:
        return max(0.0, float(raw)) if raw else LocalPool.AFTER_S
    except ValueError:
        raise MirageError(f"MIRAGE_JAX_POOL_AFTER_S={raw!r} is not a number of seconds",
                          remedy="set it to e.g. 0 (start the pool at once) or 2") from None


class LocalPool(cf.Executor):
    """Block tasks run here until they have taken ``after_s`` seconds, then on a process pool
    of ``workers`` started then; verification tasks run where the block tasks ended up.

    A pool's process costs 1.5-2.5 s before its first task: a fresh interpreter, imports (jax
    alone ~0.8 s) and its own e-graph. Most searches enumerate for less than that (lora bs=1:
    1.5 s in all here, 3.2 s on two fresh workers), so the pool starts only once the
    enumeration has shown it is long; a long one pays ``AFTER_S`` here on top of the start-up
    (1 s rather than the start-up's 2: the suite's long enumerations run 3-20 s). Without a
    pool, verification stays here too: a pool started for it alone would evaluate the target
    at full shape again in each process (float64 reference and field inputs, seconds and
    hundreds of MB), while numpy's BLAS already spreads the large contractions over the cores
    (gated_mlp bs=1: verification 4.1 s here, 10.7 s on two fresh workers). Where a task runs
    does not change the search's result."""

    AFTER_S = 1.0

    def __init__(self, workers: int, after_s: float = AFTER_S) -> None:
        self.workers, self.after_s = workers, after_s
        self.spent = 0.0  # seconds of block tasks run here
        self.pool: cf.ProcessPoolExecutor | None = None
        self.ran_here: collections.Counter[str] = collections.Counter()  # tasks run here, by name
        self._pending: list[_Deferred] = []
        self._lock = threading.Lock()

    @property
    def processes(self) -> int:
        """The processes that have run block tasks: this one, or the pool's."""
        return 1 if self.pool is None else self.workers

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        if fn is not block_worker:
            # sent when a result is first asked for: the search sends the target's fingerprints
            # before its enumeration, to run beside it on a pool, not ahead of it here
            deferred = _Deferred(self, fn, args, kwargs)
            with self._lock:
                self._pending.append(deferred)
            return deferred
        with self._lock:
            started = self.pool is None and self.spent >= self.after_s
            if started:
                self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=_MAINLESS)
            pool = self.pool
        if started:
            self._flush()  # the target's fingerprints go first, to run beside the enumeration
        if pool is not None:
            return pool.submit(fn, *args, **kwargs)
        start = time.perf_counter()
        fut = self._here(fn, args, kwargs)
        with self._lock:
            self.spent += time.perf_counter() - start
        return fut

    def _flush(self) -> None:
        """Send every deferred task: to the pool at once when it has started (the search's
        enumeration was long), else run them here one after another."""
        with self._lock:
            pending, self._pending = self._pending, []
            pool = self.pool
        for deferred in pending:
            fn, args, kwargs = deferred.call
            try:
                inner = pool.submit(fn, *args, **kwargs) if pool else self._here(fn, args, kwargs)
            except cf.BrokenExecutor as err:  # lost: the search sends it again
                deferred.set_exception(err)
                continue
            inner.add_done_callback(deferred.take)

    def _here(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> cf.Future:
        self.ran_here[fn.__name__] += 1
        return InlineExecutor().submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait, cancel_futures=cancel_futures)


class _Deferred(cf.Future):
    """A ``LocalPool`` task sent when a result is first asked for (``result`` or
    ``exception``; ``concurrent.futures.wait`` alone would wait for it forever)."""

    def __init__(self, owner: LocalPool, fn: Callable[..., Any], args: tuple,
                 kwargs: dict) -> None:  # fmt: skip
        super().__init__()
        self.owner, self.call = owner, (fn, args, kwargs)

    def result(self, timeout: float | None = None) -> Any:
        self.owner._flush()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.owner._flush()
        return super().exception(timeout)

    def take(self, inner: cf.Future) -> None:
        if inner.cancelled():  # by a shutdown: lost, as a pool's own future would be
            self.set_exception(cf.CancelledError())
            return
        err = inner.exception()
        if err is None:
            self.set_result(inner.result())
        else:
            self.set_exception(err)


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


class TaskChunker:
    """How many block tasks to send in one call: enough that a chunk takes about ``CHUNK_S``
    (by the median of the tasks run recently), one until some have run, and never more than a
    share of the tasks left that keeps every worker busy to the end; one at a time when they
    run here (no round trip to save, and the state budget is checked between calls). The
    chunking changes only how the tasks travel: results are merged in task order."""

    CHUNK_S = 0.05
    MAX = 256
    RECENT = 64  # tasks whose seconds make the median: the task mix changes along the list

    def __init__(self, workers: int, inline: bool) -> None:
        self.workers, self.inline = workers, inline
        self.recent: list[float] = []

    def size(self, left: int) -> int:
        if self.inline or not self.recent:
            return 1
        per = max(sorted(self.recent)[len(self.recent) // 2], 1e-6)
        fair = -(-left // (2 * self.workers))
        return max(1, min(int(self.CHUNK_S / per), self.MAX, fair))

    def observe(self, chunk: Sequence[en.BlockResult]) -> None:
        self.recent = (self.recent + [res.seconds for res in chunk])[-self.RECENT:]


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
    "InlineExecutor", "LocalPool", "TaskChunker", "TaskLost", "block_worker", "default_executor",
    "make_oracle", "pool_after_s", "prime", "target_digest_worker", "verify_worker",
]  # fmt: skip
