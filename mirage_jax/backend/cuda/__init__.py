"""The CUDA backend: CUDA C++ emission, nvcc builds, the GPU cost model."""
