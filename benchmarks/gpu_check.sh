#!/usr/bin/env bash
# GPU check for the CUDA backend: on a machine with an NVIDIA GPU, nvcc and jax's CUDA plugin,
# build every candidate μGraph of the six suite programs (bs 1 and 8), check each against
# jax.jit and print a speedup table. Runs in well under 8 minutes (the builds run in parallel;
# timing stops at --budget-s, default 420 s). Extra arguments go to benchmarks/gpu_check.py,
# e.g. `--bs 1`, `--programs gated_mlp`, `--search`, or `--dry-run` (no GPU: builds only).
#   GPU_TESTS=1 also runs the gpu-marked tests of tests/test_codegen_cuda.py first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -z "${MIRAGE_JAX_NVCC:-}" ]; then
  echo "gpu_check: nvcc not found (install the CUDA toolkit or set MIRAGE_JAX_NVCC)" >&2
  exit 2
fi
nvcc --version 2>/dev/null | tail -n 1 || true

if [ "${GPU_TESTS:-0}" = "1" ]; then
  timeout 300 "$PY" -m pytest tests/test_codegen_cuda.py -q -p no:cacheprovider -m gpu
fi
exec timeout 470 "$PY" benchmarks/gpu_check.py "$@"
