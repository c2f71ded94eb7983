"""Searching on a Dask cluster (``mirage_jax.planner.cluster``): a ``LocalCluster`` of two
worker processes finds what the local process pool finds, refuses a worker of another version,
and a worker killed mid-search leaves the search correct and its report honest; lost tasks
are sent again, or run on the client (verification), or reported as not run (enumeration)."""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time

import numpy as np
import programs
import pytest

from mirage_jax import superoptimize, trace
from mirage_jax.errors import MirageError
from mirage_jax.interpret import evaluate
from mirage_jax.planner.cluster import DaskExecutor, as_executor, refusal, worker_facts
from mirage_jax.search import InlineExecutor, SearchConfig
from mirage_jax.search.runner import INCOMPLETE
from mirage_jax.search.workers import TaskLost, block_worker, verify_worker

distributed = pytest.importorskip("distributed")  # a test dependency ([test] extra): never absent in CI

FNS = {p.name: p.fn for p in programs.programs(1)}
SMALL = {
    "lora": [(8, 32), (32, 64), (32, 4), (4, 64)],
    "gqa_decode": [(2, 8, 16), (2, 16, 64), (2, 64, 16)],
}
# a deterministic search (bounded by tasks, not time) that is short on two cores
CONFIG = SearchConfig(workers=2, time_candidates=False, progress=False, max_tasks=4, max_verify=3,
                      time_budget_s=300)  # fmt: skip


def target_of(name: str):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in SMALL[name]]
    return trace(FNS[name], *args).regions[0].graph


_LOCAL: dict[str, object] = {}


def local_result(name: str):
    """The search with the default executor (a local process pool of ``CONFIG.workers``)."""
    if name not in _LOCAL:
        _LOCAL[name] = superoptimize(target_of(name), CONFIG, timer=lambda g: None)
    return _LOCAL[name]


def assert_same_search(got, want) -> None:
    assert str(got.best) == str(want.best), f"{got.report}\n---\n{want.report}"
    assert [str(c.graph) for c in got.verified] == [str(c.graph) for c in want.verified]
    for field in ("tasks", "tasks_run", "skeletons", "candidates", "ff_checked", "verified",
                  "states", "stop_reason"):  # fmt: skip
        assert getattr(got.report, field) == getattr(want.report, field), field


def assert_computes_target(graph, target) -> None:
    rng = np.random.default_rng(5)
    fresh = [rng.standard_normal(t.shape).astype(np.float32) for t in target.input_types]
    want = evaluate(target, fresh, precision="float64")[0]
    got = np.asarray(evaluate(graph, fresh)[0], np.float64)
    assert np.max(np.abs(got - want)) <= 1e-4 * max(1.0, np.max(np.abs(want)))


@pytest.fixture(scope="module")
def client():
    with (distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                   dashboard_address=":0") as cluster,
          distributed.Client(cluster) as c):  # fmt: skip
        yield c


# ---------------------------------------------------------------------------------------------
# no cluster: the handshake's rules and the search's handling of lost tasks


def test_refusal_names_the_mismatch_and_the_remedy():
    mine = worker_facts()
    assert refusal(dict(mine), mine) is None
    other = refusal({**mine, "mirage_jax": "0.0.0"}, mine)
    assert other is not None and "mirage_jax 0.0.0" in other and "install the same" in other
    assert "no C++ compiler" in refusal({**mine, "compiler": None}, mine)
    assert refusal({**mine, "compiler": None}, mine, require_compiler=False) is None
    assert "clock" in refusal(mine, mine, skew_s=30.0)
    assert as_executor(None) is None
    pool = InlineExecutor()
    assert as_executor(pool) is pool  # any other executor is used as it is


class LosingExecutor(InlineExecutor):
    """Inline, but the tasks ``lose(fn, attempt, args)`` picks are lost (as with a dead
    worker); ``attempt`` counts the submissions of the same call (1 for the first)."""

    def __init__(self, lose) -> None:
        self.lose, self.attempts = lose, {}

    def submit(self, fn, /, *args, **kwargs):
        key = (fn.__name__, tuple(id(a) for a in args))  # the search sends the same objects
        n = self.attempts[key] = self.attempts.get(key, 0) + 1
        if self.lose(fn, n, args):
            fut: cf.Future = cf.Future()
            fut.set_exception(TaskLost("worker tcp://10.0.0.9:1234 died"))
            return fut
        return super().submit(fn, *args, **kwargs)


def test_lost_tasks_are_sent_again_run_here_or_reported_as_not_run():
    target = target_of("lora")
    config = CONFIG.with_(workers=1)
    want = superoptimize(target, config, executor=InlineExecutor(), timer=lambda g: None)
    # each task lost once: sent again, the same search
    once = LosingExecutor(lambda fn, n, args: n == 1)
    got = superoptimize(target, config, executor=once, timer=lambda g: None)
    assert_same_search(got, want)
    assert any("lost with their workers" in n for n in got.report.notes)
    # verification lost for good: it runs on the client, the same candidates are verified
    never = LosingExecutor(lambda fn, n, args: fn is verify_worker)
    got = superoptimize(target, config, executor=never, timer=lambda g: None)
    assert_same_search(got, want)
    assert any("verify_worker task ran on the client" in n for n in got.report.notes)
    # one block task lost for good: the report says the search is incomplete, and which
    first = {}

    def lose_first_task(fn, n, args):
        if fn is block_worker:
            first.setdefault("task", args[2][0])  # a chunk of tasks: the first chunk, one
            return args[2][0] is first["task"]
        return False

    got = superoptimize(target, config, executor=LosingExecutor(lose_first_task),
                        timer=lambda g: None)  # fmt: skip
    r = got.report
    assert r.stop_reason.startswith(INCOMPLETE) and "1 of" in r.stop_reason, str(r)
    assert r.tasks_run == want.report.tasks_run - 1
    assert "block tasks not run: [0]" in str(r)
    assert_computes_target(got.best, target)  # what it found is still verified


# ---------------------------------------------------------------------------------------------
# a LocalCluster of two worker processes


@pytest.mark.parametrize("name", ["lora", pytest.param("gqa_decode", marks=pytest.mark.slow)])
def test_cluster_search_finds_what_the_local_pool_finds(client, name):
    executor = as_executor(client)
    assert isinstance(executor, DaskExecutor) and len(executor.workers) == 2
    assert as_executor(client) is executor  # one handshake per client
    assert as_executor(client.get_executor(pure=False)) is executor
    before = len(executor.records)
    got = superoptimize(target_of(name), CONFIG, executor=client, timer=lambda g: None)
    assert_same_search(got, local_result(name))
    assert got.verified, str(got.report)
    assert_computes_target(got.best, target_of(name))
    ran = executor.records[before:]
    assert {r.worker for r in ran} == set(executor.workers)  # both workers took tasks
    assert {r.name for r in ran} >= {"block_worker", "verify_worker"}


def test_a_worker_of_another_version_is_refused(client):
    from mirage_jax.version import __version__

    odd, good = sorted(client.nthreads())
    # a builtin, sent by name: the workers cannot import this test module
    client.run(exec, "import mirage_jax.version as v; v.__version__ = '0.0.0-other'",
               workers=[odd])  # fmt: skip
    try:
        executor = DaskExecutor(client)
        assert list(executor.refused) == [odd] and executor.workers == [good]
        assert f"mirage_jax 0.0.0-other, the client {__version__}" in executor.refused[odd]
        got = superoptimize(target_of("lora"), CONFIG, executor=executor, timer=lambda g: None)
        assert_same_search(got, local_result("lora"))
        assert {r.worker for r in executor.records} == {good}
        client.run(exec, "import mirage_jax.version as v; v.__version__ = '0.0.0-other'",
                   workers=[good])  # fmt: skip
        with pytest.raises(MirageError, match="no worker of the Dask cluster can run"):
            DaskExecutor(client)
    finally:
        client.run(exec, f"import mirage_jax.version as v; v.__version__ = {__version__!r}")


class KillingExecutor(DaskExecutor):
    """Once the search has sent ``at`` block tasks, kills a worker process (it exits; its
    nanny starts a new one) as soon as the scheduler has a task of ours on it."""

    def __init__(self, client, at: int) -> None:
        super().__init__(client, lost_after_s=3.0)
        self.at, self.sent, self.victim, self.killed_with = at, 0, None, []
        self.killer = threading.Thread(target=self._kill_when_busy, daemon=True)

    def submit(self, fn, /, *args, **kwargs):
        fut = super().submit(fn, *args, **kwargs)
        if fn is block_worker:
            self.sent += 1
            if self.sent == self.at:
                self.victim = self.workers[0]
                self.killer.start()
        return fut

    def _kill_when_busy(self) -> None:
        deadline = time.time() + 60
        while time.time() < deadline and not self.killed_with:
            self.killed_with = list(self.client.processing([self.victim]).get(self.victim, ()))
            time.sleep(0.005)
        self.client.run(os._exit, 1, workers=[self.victim], on_error="ignore")


@pytest.mark.slow
def test_a_worker_killed_mid_search_leaves_the_search_correct_and_honest(client):
    name = "gqa_decode"
    executor = KillingExecutor(client, at=2)
    got = superoptimize(target_of(name), CONFIG, executor=executor, timer=lambda g: None)
    executor.killer.join(60)
    assert executor.killed_with, "the worker was not killed while it held a task"
    # the scheduler sent the dead worker's tasks to the other one: the same, complete search
    assert not got.report.stop_reason.startswith(INCOMPLETE), str(got.report)
    assert_same_search(got, local_result(name))
    assert_computes_target(got.best, target_of(name))
    assert executor.victim not in client.nthreads()
    client.wait_for_workers(2, timeout=60)  # the nanny's new worker, for the tests after


@pytest.mark.slow
def test_optimize_on_the_cluster_searches_both_regions_and_stays_correct(client):
    """A function with two regions (``jnp.sort`` between them): both are searched at once on
    the cluster, then compiled, checked and timed here; the outputs match jax.jit."""
    import jax

    import mirage_jax as mj

    program = {p.name: p for p in programs.extra_programs()}["sort_between"]
    args = program.call_args(programs.make_inputs(program, seed=3))
    executor = as_executor(client)
    before = len(executor.records)
    fast = mj.optimize(program.fn, executor=client, config=CONFIG, cache=False,
                       require_speedup=False)  # fmt: skip
    plan = fast.plan(*args)
    searched = [r for r in plan.regions if r.search_report is not None]
    assert len(searched) == 2, plan.report()
    assert all(not r.search_report.stop_reason.startswith(INCOMPLETE) for r in searched)
    assert sum(r.name == "block_worker" for r in executor.records[before:]) >= 2
    want = np.asarray(jax.jit(program.fn)(*args))
    got = np.asarray(fast(*args))
    assert np.max(np.abs(got - want)) <= 1e-4 * max(1.0, np.max(np.abs(want)))


def test_cli_rejects_a_bad_dask_spec_before_searching(capsys):
    from mirage_jax.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["precompile", "programs:lora", "--shapes", "f32[2,2]", "-o", "unused",
              "--dask", "local:0"])  # fmt: skip
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "local:N with N >= 1" in err and "remedy" in err


def test_block_tasks_travel_in_chunks_and_the_search_is_the_same():
    from mirage_jax.search.workers import LocalPool

    target = target_of("lora")
    config = CONFIG.with_(workers=1, max_tasks=None)
    want = superoptimize(target, config, executor=InlineExecutor(), timer=lambda g: None)
    # a pool that never starts its processes: it runs every call here, and counts them
    counting = LocalPool(2, after_s=3600.0)
    got = superoptimize(target, config, executor=counting, timer=lambda g: None)
    assert_same_search(got, want)
    assert want.report.tasks > 100, str(want.report)
    # sub-millisecond tasks: tens to a call once a few have run, not one round trip each
    calls = counting.ran_here["block_worker"]
    assert calls < want.report.tasks / 10, (calls, want.report.tasks)


def test_the_local_pool_starts_its_processes_only_for_a_long_enumeration():
    from mirage_jax.search.workers import LocalPool

    target = target_of("lora")
    want = superoptimize(target, CONFIG, executor=InlineExecutor(), timer=lambda g: None)
    for after_s, processes in ((3600.0, 1), (0.0, 2)):
        pool = LocalPool(2, after_s)
        try:
            got = superoptimize(target, CONFIG, executor=pool, timer=lambda g: None)
        finally:
            pool.shutdown()
        assert_same_search(got, want)
        assert got.report.workers == pool.processes == processes
        # verification runs where the block tasks ended up: here, or on the started pool
        if processes == 1:
            assert {"block_worker", "verify_worker", "target_digest_worker"} == set(pool.ran_here)
        else:
            assert not pool.ran_here, pool.ran_here
