"""The native block DFS (csrc/search/block_dfs.cc) is the Python reference's search, faster.

For every block task of small versions of the suite programs and of masked attention, pruned
and unpruned, with and without the state bound cutting it: the same skeletons in the same
order and the same counters from ``engine="native"`` and ``engine="python"``, alone or
sharing identities and checks with the other tasks of the search (``SearchShare``). And the
default engine is the native one wherever the native module loads (CI installs it).
"""

from __future__ import annotations

import time

import pytest
from graphs import masked_attention_plain
from test_search import SMALL, target_of

from mirage_jax.search import enumeration as en
from mirage_jax.search.config import SearchConfig
from mirage_jax.search.enumeration import SearchShare
from mirage_jax.search.enumeration.native import native_core, run_block_task
from mirage_jax.search.runner import Exploration
from mirage_jax.search.workers import InlineExecutor, make_oracle

pytestmark = pytest.mark.skipif(native_core() is None, reason="the native module is not built")


def _tasks(target, config):
    config = config.with_(cores=2)
    space = config.space(target)
    oracle = make_oracle(target, config) if config.prune else None
    sites = en.KernelDFS(target, space, oracle).run().sites
    tasks = Exploration(target, config, InlineExecutor(), None)._tasks(space, oracle, sites)
    return space, oracle, [task for _, task in tasks]


def _same(task, space, oracle, deadline=None, shares=(None, None)) -> int:
    """The reference (alone) against the native engine and the reference, each sharing
    identities and checks with the other tasks it ran (``shares``): the same result."""
    ref = run_block_task(task, space, oracle, deadline, engine="python")
    for engine, share in zip(("native", "python"), shares):
        got = run_block_task(task, space, oracle, deadline, engine=engine, shared=share)
        assert got.counters == ref.counters, (engine, task.label)
        assert [str(s.block) for s in got.skeletons] == [str(s.block) for s in ref.skeletons]
        assert [s.fdims for s in got.skeletons] == [s.fdims for s in ref.skeletons]
    return len(ref.skeletons)


TARGETS = {
    **{name: (lambda name=name: target_of(name)) for name in SMALL},
    "masked_attention": lambda: masked_attention_plain(2, 8, 16, 32),
}


@pytest.mark.parametrize("prune", [True, False], ids=["pruned", "unpruned"])
@pytest.mark.parametrize("name", list(TARGETS))
def test_native_and_python_engines_find_the_same_skeletons(name, prune):
    # a sample of tasks from the whole priority order (the reference is slow); unpruned, each
    # runs to its bound, so a smaller one
    config = SearchConfig(max_states=2000 if prune else 200, prune=prune)
    space, oracle, tasks = _tasks(TARGETS[name](), config)
    n = 12 if prune else 4
    shares = (SearchShare(), SearchShare())
    found = sum(_same(task, space, oracle, shares=shares)
                for task in tasks[:: max(1, len(tasks) // n)][:n])  # fmt: skip
    assert len(shares[0]) > 0 and shares[0].memos
    if prune:
        assert found, "no task found a skeleton: the comparison would prove little"


def test_a_state_bound_cuts_both_engines_at_the_same_place():
    space, oracle, tasks = _tasks(target_of("qknorm_attn"), SearchConfig(max_states=97))
    truncated = 0
    for task in tasks[:20]:
        _same(task, space, oracle)
        truncated += run_block_task(task, space, oracle).counters.truncated
    assert truncated, "no task reached the bound"


def test_a_passed_deadline_stops_the_native_search():
    space, oracle, tasks = _tasks(target_of("qknorm_attn"), SearchConfig())
    big = next(t for t in tasks if run_block_task(t, space, oracle).counters.states > 300)
    res = run_block_task(big, space, oracle, deadline=time.time() - 1, engine="native")
    assert res.counters.truncated and res.counters.states == 256  # checked every 256 states


def test_the_default_engine_is_native_and_faster():
    space, oracle, tasks = _tasks(target_of("qknorm_attn"), SearchConfig(max_states=3000))
    # tasks that enumerate enough states to time the loop rather than the per-task setup
    big = [t for t in tasks[:80] if run_block_task(t, space, oracle).counters.states >= 1000]
    assert len(big) >= 4
    seconds = {}
    for engine in ("python", "native", "auto"):
        start = time.perf_counter()
        for task in big[:4]:
            run_block_task(task, space, oracle, engine=engine)
        seconds[engine] = time.perf_counter() - start
    assert seconds["native"] * 4 < seconds["python"], seconds
    assert seconds["auto"] * 4 < seconds["python"], seconds
    with pytest.raises(ValueError, match="engine"):
        run_block_task(tasks[0], space, oracle, engine="fast")


def test_tensors_above_the_cores_rank_take_the_reference():
    from mirage_jax.ir import KernelBuilder, Op, TensorType
    from mirage_jax.ir.types import F32

    kb = KernelBuilder()
    x = kb.input(TensorType((2,) * 9, F32))
    kb.output(kb.apply(Op.EXP, kb.apply(Op.MUL, x, x)))
    space, oracle, tasks = _tasks(kb.build(), SearchConfig(max_states=500))
    assert tasks
    with pytest.raises(ValueError, match="rank"):
        run_block_task(tasks[0], space, oracle, engine="native")
    for task in tasks[:4]:
        ref = run_block_task(task, space, oracle, engine="python")
        got = run_block_task(task, space, oracle)  # auto: the reference, not an error
        assert got.counters == ref.counters
