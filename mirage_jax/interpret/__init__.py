"""Interpreters: the float reference and the finite-field evaluator, one walker for both.

``evaluate`` / ``evaluate_values`` run a μGraph in numpy floats (the living definition of
every op); ``ff_evaluate`` / ``ff_evaluate_values`` / ``ff_fingerprint`` run the same graphs
in Z_p x Z_q for probabilistic equivalence checking (see ``finite_field`` for the algebra and
the false-acceptance bound).
"""

from __future__ import annotations

from mirage_jax.interpret.finite_field import (
    DEFAULT_FIELD,
    FFTensor,
    Field,
    ff_evaluate,
    ff_evaluate_values,
    ff_fingerprint,
    random_inputs,
)
from mirage_jax.interpret.reference import evaluate, evaluate_values

__all__ = [
    "DEFAULT_FIELD", "FFTensor", "Field", "evaluate", "evaluate_values", "ff_evaluate",
    "ff_evaluate_values", "ff_fingerprint", "random_inputs",
]  # fmt: skip
