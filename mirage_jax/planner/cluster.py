"""Searching on a Dask cluster: a ``distributed`` client made into the executor the search runs
its enumeration and verification tasks on.

``DaskExecutor(client)`` shakes hands with every worker before it sends it a task: a worker
with another mirage_jax, Python, numpy or egglog version, without a C++ compiler, or whose
clock is off (block tasks carry the client's deadline) is refused with the reason, logged, and
the search goes on with the others. Tasks go only to accepted workers; a worker that joins later
(or comes back from a restart under a new address) is shaken hands with first. A task whose
worker is lost is retried by Dask's scheduler; when the scheduler gives up, or no accepted
worker is left, the future raises ``TaskLost`` and the search sends it again or reports it as
not run (``mirage_jax.search.runner``). Each task's run time on its worker is recorded
(``records``) for ``benchmarks/cluster.py``.

Where candidates are timed: in the client's process, never on a worker (the search's timing
stage and the planner's comparison with XLA run where the kernels will run), so no ranking
uses timings from another machine. The workers' ISA is reported by the handshake
(``DaskExecutor.same_isa``) and not otherwise used.

``as_executor`` turns what users pass as ``executor=`` (a ``distributed.Client``, its
``get_executor()``, or any ``concurrent.futures.Executor``) into one; ``dask_cluster(spec)``
connects to a scheduler address or starts a ``LocalCluster`` (``"local:N"``) for a run.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import importlib.metadata
import logging
import os
import platform
import shlex
import shutil
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mirage_jax import version
from mirage_jax.backend.cpu.build import CXX_ENV
from mirage_jax.backend.cpu.isa import host_isa
from mirage_jax.errors import MirageError
from mirage_jax.search.workers import TaskLost

log = logging.getLogger("mirage_jax.cluster")

# versions a worker must share with the client: the search's results depend on each
# (the oracle's saturation on egglog, the float check on numpy, pickles on Python)
_SAME = ("mirage_jax", "python", "numpy", "egglog")
INSTALL_REMEDY = "pip install 'mirage-jax[dask]'"


def worker_facts() -> dict[str, Any]:
    """What the handshake compares, as the process that runs it sees it (each worker, and the
    client for reference)."""
    # deferred: numpy is loaded by then on every worker; read here, not at import, so that
    # the facts are the running process's
    import numpy

    facts: dict[str, Any] = {
        "mirage_jax": version.__version__, "python": "{}.{}".format(*sys.version_info[:2]),
        "numpy": numpy.__version__, "machine": platform.machine(), "isa": host_isa(),
        "compiler": _compiler(), "time": time.time(),
    }  # fmt: skip
    try:
        facts["egglog"] = importlib.metadata.version("egglog")
    except importlib.metadata.PackageNotFoundError:
        facts["egglog"] = None
    return facts


def _compiler() -> str | None:
    """The C++ compiler the CPU backend would run here (``$CXX`` or g++), resolved, or None."""
    raw = os.environ.get(CXX_ENV, "").strip() or "g++"
    return shutil.which(shlex.split(raw)[0])


def refusal(theirs: dict[str, Any], mine: dict[str, Any], *, require_compiler: bool = True,
            skew_s: float = 0.0, max_skew_s: float = 5.0) -> str | None:  # fmt: skip
    """Why a worker with ``theirs`` facts cannot serve a client with ``mine`` (None: it can).
    ``skew_s``: its clock minus the client's."""
    for key in _SAME:
        if theirs.get(key) != mine.get(key):
            return (f"it has {key} {theirs.get(key)}, the client {mine.get(key)}: install the "
                    f"same {key} on every worker")  # fmt: skip
    if require_compiler and not theirs.get("compiler"):
        return (f"it has no C++ compiler ({CXX_ENV} or g++): install g++ there, or pass "
                "require_compiler=False")  # fmt: skip
    if abs(skew_s) > max_skew_s:
        return (f"its clock is {skew_s:+.1f}s off the client's (search tasks carry the client's "
                "deadline): synchronise the clocks (NTP)")  # fmt: skip
    return None


@dataclass(frozen=True)
class TaskRecord:
    """One task as it ran on a worker: what, where, when it started (worker clock), how long,
    and its place in the order the executor was sent tasks (``seq``)."""

    name: str
    worker: str
    started: float
    seconds: float
    seq: int = -1


def _timed_call(fn: Callable[..., Any], *args: Any) -> tuple[Any, TaskRecord]:
    """Run ``fn(*args)`` on a worker and say where and for how long."""
    # deferred: runs only on a Dask worker, where distributed is loaded already
    from distributed import get_worker

    started, t = time.time(), time.perf_counter()
    out = fn(*args)
    return out, TaskRecord(fn.__name__, get_worker().address, started, time.perf_counter() - t)


def _distributed() -> Any:
    try:
        # deferred: distributed is an optional extra (mirage-jax[dask]), and a second to import
        import distributed
    except ImportError as err:
        raise MirageError(f"searching on a Dask cluster needs the distributed package ({err})",
                          remedy=INSTALL_REMEDY) from None  # fmt: skip
    return distributed


class DaskExecutor(cf.Executor):
    """A ``concurrent.futures.Executor`` on a Dask cluster's handshaken workers (see the module
    docstring). ``resources``: Dask worker resources every task needs (e.g. ``{"avx512": 1}``);
    ``lost_after_s``: how long a task may wait with none of its workers alive before it is lost."""

    def __init__(self, client: Any, *, require_compiler: bool = True,
                 resources: dict[str, float] | None = None, max_skew_s: float = 5.0,
                 lost_after_s: float = 10.0, poll_s: float = 0.5) -> None:  # fmt: skip
        dist = _distributed()
        self._loss_types = (cf.CancelledError, dist.scheduler.KilledWorker,
                            dist.comm.CommClosedError)  # fmt: skip
        self.client, self.resources = client, resources
        self.require_compiler, self.max_skew_s = require_compiler, max_skew_s
        self.lost_after_s, self.poll_s = lost_after_s, poll_s
        self.mine = worker_facts()
        self.accepted: dict[str, dict[str, Any]] = {}
        self.refused: dict[str, str] = {}
        self.records: list[TaskRecord] = []
        self._lock = threading.RLock()
        self._pending: dict[cf.Future, list[Any]] = {}  # outer -> [inner, workers, orphaned at]
        self._sent = 0
        self._alive: dict[str, int] = {}
        self._checked_at = 0.0
        self._closed = False
        self._watchdog: threading.Thread | None = None
        self._refresh(force=True)
        if not self.accepted:
            why = "; ".join(f"{w}: {r}" for w, r in self.refused.items()) or "it has no workers"
            raise MirageError(f"no worker of the Dask cluster can run the search ({why})",
                              remedy="start workers with the client's mirage_jax environment "
                              f"({INSTALL_REMEDY} of the same version)")  # fmt: skip

    # -- workers ---------------------------------------------------------------------------
    @property
    def workers(self) -> list[str]:
        """The accepted workers that are alive, in address order."""
        return sorted(w for w in self.accepted if w in self._alive)

    @property
    def nthreads(self) -> int:
        """Threads of the accepted workers alive: the parallelism to ask of the search."""
        return sum(self._alive[w] for w in self.workers)

    @property
    def same_isa(self) -> list[str]:
        """Accepted workers whose CPU has the client's ISA and machine type."""
        key = (self.mine["machine"], self.mine["isa"])
        return [w for w in self.workers
                if (self.accepted[w]["machine"], self.accepted[w]["isa"]) == key]  # fmt: skip

    def _refresh(self, force: bool = False) -> None:
        """Learn which workers are alive (at most every ``poll_s``); shake hands with new ones."""
        now = time.time()
        if not force and now - self._checked_at < self.poll_s:
            return
        self._checked_at = now
        self._alive = dict(self.client.nthreads())
        new = [w for w in self._alive if w not in self.accepted and w not in self.refused]
        if new:
            self._handshake(new)

    def _handshake(self, workers: list[str]) -> None:
        before = time.time()
        answers = self.client.run(worker_facts, workers=workers, on_error="return")
        mid, half = (before + time.time()) / 2, (time.time() - before) / 2
        for w in workers:
            facts = answers.get(w)
            if isinstance(facts, BaseException) or facts is None:
                why = (f"the handshake failed there ({type(facts).__name__}: {facts}): is "
                       "mirage_jax installed on it?")  # fmt: skip
            else:
                skew = facts["time"] - mid
                skew = 0.0 if abs(skew) <= half else skew  # within the round trip: no skew seen
                why = refusal(facts, self.mine, require_compiler=self.require_compiler,
                              skew_s=skew, max_skew_s=self.max_skew_s)  # fmt: skip
            if why is None:
                self.accepted[w] = facts
            else:
                self.refused[w] = why
                log.warning("Dask worker %s refused: %s", w, why)

    # -- tasks -----------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        if kwargs:
            raise TypeError("DaskExecutor.submit takes positional arguments only")
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._refresh()
            workers = self.workers
            if not workers:
                raise TaskLost("no accepted Dask worker is alive")
            inner = self.client.submit(_timed_call, fn, *args, pure=False, workers=workers,
                                       allow_other_workers=False, resources=self.resources)  # fmt: skip
            outer: cf.Future = cf.Future()
            self._pending[outer] = [inner, frozenset(workers), None]
            self._sent += 1
            seq = self._sent
            self._start_watchdog()
        inner.add_done_callback(lambda f: self._settle(outer, f, seq))
        return outer

    def _settle(self, outer: cf.Future, inner: Any, seq: int) -> None:
        """Hand the Dask future's outcome to ``outer`` (called on the client's event loop)."""
        with self._lock:
            if self._pending.pop(outer, None) is None:
                return  # already failed as lost by the watchdog
        status = inner.status
        try:
            if status == "finished":
                value, record = inner.result()
                self.records.append(dataclasses.replace(record, seq=seq))
                outer.set_result(value)
            elif status in ("cancelled", "lost"):
                outer.set_exception(TaskLost(f"the task was {status} on the cluster"))
            else:
                err = inner.exception()
                lost = isinstance(err, self._loss_types)
                outer.set_exception(TaskLost(f"{type(err).__name__}: {err}") if lost else err)
        except cf.InvalidStateError:
            pass  # the caller cancelled it

    def _start_watchdog(self) -> None:
        if self._watchdog is None:  # (under the lock) the watchdog clears it as it stops
            self._watchdog = threading.Thread(target=self._watch, name="mirage-dask-watchdog",
                                              daemon=True)  # fmt: skip
            self._watchdog.start()

    def _watch(self) -> None:
        """While tasks are pending: a task none of whose workers is alive for ``lost_after_s``
        is lost (the scheduler would hold it forever); new workers are shaken hands with."""
        while True:
            time.sleep(self.poll_s)
            with self._lock:
                if not self._pending:
                    self._watchdog = None
                    return
                try:
                    self._refresh()
                except Exception as err:  # noqa: BLE001 - the client is gone: nothing will finish
                    self._fail_all(f"the Dask client failed: {type(err).__name__}: {err}")
                    self._watchdog = None
                    return
                now = time.time()
                for outer, entry in list(self._pending.items()):
                    inner, workers, orphaned = entry
                    if workers & self._alive.keys():
                        entry[2] = None
                    elif orphaned is None:
                        entry[2] = now
                    elif now - orphaned > self.lost_after_s:
                        self._lose(outer, inner, "none of its workers is alive")

    def _lose(self, outer: cf.Future, inner: Any, why: str) -> None:
        self._pending.pop(outer, None)
        with contextlib.suppress(Exception):
            inner.cancel()
        with contextlib.suppress(cf.InvalidStateError):
            outer.set_exception(TaskLost(why))

    def _fail_all(self, why: str) -> None:
        for outer, (inner, _, _) in list(self._pending.items()):
            self._lose(outer, inner, why)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking tasks; the client and its cluster stay up (``dask_cluster`` closes
        what it started)."""
        with self._lock:
            self._closed = True
            if cancel_futures:
                self._fail_all("the executor was shut down")
            pending = [entry[0] for entry in self._pending.values()]
        if wait and pending:
            _distributed().wait(pending)


_EXECUTORS: weakref.WeakKeyDictionary[Any, DaskExecutor] = weakref.WeakKeyDictionary()


def as_executor(executor: Any) -> cf.Executor | None:
    """What ``executor=`` names, as an executor for the search: a ``distributed.Client`` or
    its ``get_executor(...)`` becomes a ``DaskExecutor`` (one per client, shaken hands with
    once); any other ``concurrent.futures.Executor`` (or None) is used as it is."""
    client = _dask_client(executor)
    if client is None:
        return executor
    resources = getattr(executor, "_kwargs", {}).get("resources") if client is not executor else None
    have = _EXECUTORS.get(client)
    if have is None or have._closed or have.resources != resources:
        have = _EXECUTORS[client] = DaskExecutor(client, resources=resources)
    return have


def _dask_client(obj: Any) -> Any:
    if obj is None or not type(obj).__module__.startswith("distributed"):
        return None
    if hasattr(obj, "get_executor") and hasattr(obj, "nthreads"):
        return obj  # a Client
    return getattr(obj, "_client", None)  # its ClientExecutor


@contextlib.contextmanager
def dask_cluster(spec: str, **options: Any) -> Iterator[DaskExecutor]:
    """A ``DaskExecutor`` for the run: ``"local:N"`` starts a ``LocalCluster`` of N
    single-threaded worker processes and shuts it down after; anything else is a scheduler
    address (``tcp://host:8786``) to connect to. ``options`` go to ``DaskExecutor``."""
    dist = _distributed()
    cluster = None
    if spec.startswith("local:"):
        try:
            n = int(spec.removeprefix("local:"))
        except ValueError:
            n = 0
        if n < 1:
            raise MirageError(f"--dask {spec!r}: expected local:N with N >= 1 workers",
                              remedy="e.g. --dask local:4, or a scheduler address")  # fmt: skip
        cluster = dist.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                    dashboard_address=":0")  # fmt: skip
        client = dist.Client(cluster)
    else:
        try:
            client = dist.Client(spec, timeout="30s")
        except OSError as err:
            raise MirageError(f"could not reach the Dask scheduler at {spec}: {err}",
                              remedy="start one (dask scheduler) or check the address") from None  # fmt: skip
    executor = None
    try:
        executor = DaskExecutor(client, **options)
        yield executor
    finally:
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        # closing the comms of a cluster being shut down logs tracebacks that mean nothing
        quiet = logging.getLogger("distributed")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            client.close()
            if cluster is not None:
                cluster.close()
        finally:
            quiet.setLevel(level)


__all__ = ["DaskExecutor", "TaskRecord", "as_executor", "dask_cluster", "refusal", "worker_facts"]
