"""The CPU backend: C++ emission, the host compiler, the calibrated CPU cost model."""
