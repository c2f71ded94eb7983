"""Hand-written C ABI kernels run through the generic dispatcher inside jax.jit."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mirage_jax.backend.cpu import build
from mirage_jax.backend.cpu.build import compile_shared_library
from mirage_jax.errors import RuntimeLoadError
from mirage_jax.runtime import DISPATCH_TARGET, kernel_call, kernel_name, load_kernel
from mirage_jax.runtime.native import native

N = 4096
CHUNK = 256

# out0 = a*2 + b and out1 = a - b over float32[N], one parallel_for task per CHUNK elements;
# out2 = [num_threads, tasks run, indices visited more or less than once (must be 0), whether
# tasks ran on more than one thread]. With ``spread`` set, a task waits (half a second at most)
# until a second thread has run a task, so a pool that has threads must show them.
# The nested kernel runs a parallel_for inside every task of another one.
KERNELS = textwrap.dedent(f"""
    #include <pthread.h>
    #include <stdint.h>
    #include <time.h>
    #include "cpu/abi.h"

    enum {{ N = {N}, CHUNK = {CHUNK}, TASKS = N / CHUNK }};

    typedef struct {{
      const float* a; const float* b; float* y; float* z; int32_t visits[TASKS]; int32_t runs;
      int32_t spread; unsigned long first; int32_t many; int32_t gave_up;
    }} Job;

    static double now(void) {{
      struct timespec t;
      clock_gettime(CLOCK_MONOTONIC, &t);
      return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
    }}

    static void note_thread(Job* job) {{
      unsigned long me = (unsigned long)pthread_self(), seen = 0;
      if (!__atomic_compare_exchange_n(&job->first, &seen, me, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE) && seen != me)
        __atomic_store_n(&job->many, 1, __ATOMIC_RELEASE);
      if (!job->spread) return;
      double until = now() + 0.5;
      while (!__atomic_load_n(&job->many, __ATOMIC_ACQUIRE) &&
             !__atomic_load_n(&job->gave_up, __ATOMIC_ACQUIRE) && now() < until) {{}}
      if (!__atomic_load_n(&job->many, __ATOMIC_ACQUIRE))
        __atomic_store_n(&job->gave_up, 1, __ATOMIC_RELEASE);
    }}

    static void task(void* arg, int64_t i) {{
      Job* job = (Job*)arg;
      note_thread(job);
      __atomic_fetch_add(&job->visits[i], 1, __ATOMIC_RELAXED);
      __atomic_fetch_add(&job->runs, 1, __ATOMIC_RELAXED);
      for (int64_t j = i * CHUNK; j < (i + 1) * CHUNK; ++j) {{
        job->y[j] = job->a[j] * 2.0f + job->b[j];
        if (job->z) job->z[j] = job->a[j] - job->b[j];
      }}
    }}

    static int32_t bad_visits(const Job* job) {{
      int32_t bad = 0;
      for (int t = 0; t < TASKS; ++t) bad += job->visits[t] != 1;
      return bad;
    }}

    MJ_EXPORT int axpb(const void* const* in, void* const* out, const mj_pool* pool) {{
      Job job = {{(const float*)in[0], (const float*)in[1], (float*)out[0], 0, {{0}}, 0}};
      pool->parallel_for(pool->ctx, TASKS, task, &job);
      return bad_visits(&job);
    }}

    MJ_EXPORT int two_outputs(const void* const* in, void* const* out, const mj_pool* pool) {{
      Job job = {{(const float*)in[0], (const float*)in[1], (float*)out[0], (float*)out[1],
                 {{0}}, 0, 1, 0, 0, 0}};
      pool->parallel_for(pool->ctx, TASKS, task, &job);
      int32_t* info = (int32_t*)out[2];
      info[0] = pool->num_threads;
      info[1] = job.runs;
      info[2] = bad_visits(&job);
      info[3] = job.many;
      return 0;
    }}

    typedef struct {{ const mj_pool* pool; Job* jobs; }} Outer;

    static void outer_task(void* arg, int64_t i) {{
      Outer* o = (Outer*)arg;
      o->pool->parallel_for(o->pool->ctx, TASKS, task, &o->jobs[i]);
    }}

    /* Four independent rows of N, each row's tasks run by a nested parallel_for. */
    MJ_EXPORT int nested(const void* const* in, void* const* out, const mj_pool* pool) {{
      Job jobs[4];
      for (int r = 0; r < 4; ++r) {{
        Job j = {{(const float*)in[0] + r * N, (const float*)in[1] + r * N,
                 (float*)out[0] + r * N, 0, {{0}}, 0}};
        jobs[r] = j;
      }}
      Outer o = {{pool, jobs}};
      pool->parallel_for(pool->ctx, 4, outer_task, &o);
      int32_t bad = 0;
      for (int r = 0; r < 4; ++r) bad += bad_visits(&jobs[r]);
      return bad;
    }}

    MJ_EXPORT int fails(const void* const* in, void* const* out, const mj_pool* pool) {{
      (void)in; (void)out; (void)pool;
      return 7;
    }}
    """)

F32 = jax.ShapeDtypeStruct((N,), jnp.float32)


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> build.CompiledLibrary:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(build.CACHE_ENV, str(tmp_path_factory.mktemp("cache")))
        return compile_shared_library(KERNELS, name_hint="test_runtime_ffi")


def _inputs(shape: tuple[int, ...] = (N,)) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal(shape).astype(np.float32),
        rng.standard_normal(shape).astype(np.float32),
    )


def test_kernel_runs_inside_jit_and_matches_numpy(lib: build.CompiledLibrary) -> None:
    name = load_kernel(lib, "axpb")
    a, b = _inputs()

    @jax.jit
    def f(a: jax.Array, b: jax.Array) -> jax.Array:
        (y,) = kernel_call(name, [F32], a, b)
        return y + 1.0  # XLA ops around the custom call

    np.testing.assert_allclose(np.asarray(f(a, b)), a * 2 + b + 1, rtol=1e-6)
    # Also eagerly, outside jit.
    (y,) = kernel_call(name, [F32], a, b)
    np.testing.assert_allclose(np.asarray(y), a * 2 + b, rtol=1e-6)


def test_multiple_outputs_and_pool_visits_each_index_once(lib: build.CompiledLibrary) -> None:
    name = load_kernel(lib, "two_outputs")
    a, b = _inputs()
    info_aval = jax.ShapeDtypeStruct((4,), jnp.int32)
    y, z, info = jax.jit(lambda a, b: kernel_call(name, [F32, F32, info_aval], a, b))(a, b)
    np.testing.assert_allclose(np.asarray(y), a * 2 + b, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(z), a - b, rtol=1e-6)
    num_threads, runs, bad, many = (int(v) for v in np.asarray(info))
    # XLA's intra-op pool has a thread per schedulable core, and the tasks run on them
    assert num_threads == len(os.sched_getaffinity(0))
    assert many == (num_threads > 1), "the pool's other threads ran no task"
    assert runs == N // CHUNK and bad == 0


def test_nested_parallel_for_completes(lib: build.CompiledLibrary) -> None:
    name = load_kernel(lib, "nested")
    a, b = _inputs((4, N))
    aval = jax.ShapeDtypeStruct((4, N), jnp.float32)
    (y,) = jax.jit(lambda a, b: kernel_call(name, [aval], a, b))(a, b)
    np.testing.assert_allclose(np.asarray(y), a * 2 + b, rtol=1e-6)


def test_vmap_runs_sequentially_per_batch_element(lib: build.CompiledLibrary) -> None:
    name = load_kernel(lib, "axpb")
    a, b = _inputs((3, N))
    f = jax.jit(jax.vmap(lambda a, b: kernel_call(name, [F32], a, b)[0]))
    np.testing.assert_allclose(np.asarray(f(a, b)), a * 2 + b, rtol=1e-6)


def test_lowering_names_the_kernel_not_an_address(lib: build.CompiledLibrary) -> None:
    name = load_kernel(lib, "axpb")
    assert name == kernel_name(lib.key, "axpb")
    assert lib.key[:32] in name  # content-derived: the same in every process
    a, b = _inputs()
    text = jax.jit(lambda a, b: kernel_call(name, [F32], a, b)).lower(a, b).as_text()
    assert DISPATCH_TARGET in text and name in text


def test_load_kernel_is_idempotent(lib: build.CompiledLibrary) -> None:
    first = load_kernel(lib, "axpb")
    assert load_kernel(lib, "axpb") == first
    assert native().has_kernel(first)
    assert first in native().registered_kernels()


def test_nonzero_return_fails_the_call_naming_the_kernel(lib: build.CompiledLibrary) -> None:
    name = load_kernel(lib, "fails")
    a, b = _inputs()
    with pytest.raises(Exception, match=rf"(?s){name}.*code 7"):
        jax.block_until_ready(jax.jit(lambda a, b: kernel_call(name, [F32], a, b))(a, b))


def test_unknown_kernel_fails_at_trace_time() -> None:
    a, b = _inputs()
    with pytest.raises(RuntimeLoadError, match="(?s)mj_does_not_exist.*load_kernel"):
        jax.jit(lambda a, b: kernel_call("mj_does_not_exist", [F32], a, b))(a, b)


def test_unknown_kernel_fails_at_run_time_with_a_clear_error() -> None:
    """What a program from a persistent cache sees when its kernel was never loaded."""
    a, b = _inputs()
    f = jax.jit(lambda a, b: kernel_call("mj_never_loaded", [F32], a, b, check_loaded=False))
    with pytest.raises(Exception, match="(?s)mj_never_loaded.*not registered"):
        jax.block_until_ready(f(a, b))


def test_missing_symbol_raises_runtime_load_error(lib: build.CompiledLibrary) -> None:
    with pytest.raises(RuntimeLoadError, match="no symbol 'nope'"):
        load_kernel(lib, "nope")
    with pytest.raises(RuntimeLoadError, match="not a C symbol"):
        load_kernel(lib, "not a symbol")


def test_unloadable_library_raises_runtime_load_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(RuntimeLoadError, match="could not load"):
        load_kernel(build.CompiledLibrary(junk, "0" * 64), "axpb")


def test_native_registry_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        native().register_kernel("", 1234)
    with pytest.raises(ValueError):
        native().register_kernel("mj_null", 0)
    assert native().cpu_isa() in ("avx512bf16", "avx512", "avx2", "generic")
