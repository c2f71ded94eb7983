"""Finite-field evaluation of μGraphs: probabilistic equivalence checking.

The same walker as the float reference (``walker``), with another number system. A number is
a pair ``(a mod p, b mod q)`` of int64 arrays, q prime, ``q | p - 1``. The default field is the
safe-prime pair p = 2q + 1 = 2147483579 (largest safe prime below 2^31), q = 1073741789, and
omega = 4, a square and not 1, hence of order exactly q in Z_p^*.

Semantics (every op reduces to these):

- Ring ops (add, sub, mul, neg, matmul, reduce_sum) componentwise, exact.
- Division / reciprocal: componentwise modular inverse, with inverse(0) := 0.
- Float constants (mul_scalar, add_scalar, gelu's constants, 1/n of means) map exactly:
  ``Fraction(c) = num/den`` -> ``num * den^-1`` in each field. Floats are dyadic rationals, so
  this is the ring homomorphism Z[1/2] -> Z_p; ``x * (1/4096)`` equals ``sum / 4096``.
- ``exp(x) = omega^(x.b) mod p``: the exponent lives mod q = ord(omega), so
  ``exp(a + b) = exp(a) * exp(b)`` holds exactly in the p-component. The q-component of an
  exp is not defined by the algebra (exp does not map Z_q to Z_q), so it is *unknown* and
  ``FFTensor.b`` is ``None``: ring ops with an unknown operand give an unknown q-part, max
  with one compares p-parts only, and the fingerprint hashes only what is known (so two
  equivalent graphs of which only one routes a value through exp, e.g. exp(x)*0 + y vs y,
  fingerprint differently: a false rejection, never a false acceptance). An exp of a value
  whose q-part is unknown (exp of an exp) uses an uninterpreted exponent: a hash of the
  p-part. (A hashed q-part for every exp would make the q-components of
  exp(s - m_i) * exp(m_i - M) and exp(s - M) differ, and online softmax could never verify.)
- sigmoid = 1/(1+exp(-x)), silu = x*sigmoid(x), tanh = (exp(2x)-1)/(exp(2x)+1), gelu by its
  tanh formula, square = x*x, pow_scalar: non-negative integer -> repeated multiplication,
  negative integer -> reciprocal of that, 0.5 -> sqrt, -0.5 -> rsqrt, others uninterpreted.
- sqrt, log, erf, erfc, erf_inv, sin, cos, sign, finite_or (one per fill; and pow_scalar by
  other exponents), and the trunc(x / y) of rem = x - y trunc(x / y): uninterpreted functions: a
  fixed pseudo-random function (splitmix64 with a per-op tag and ``Field.seed``)
  of the input pair, the same in every graph; rsqrt = 1/sqrt, reduce_rms / acc_rms =
  sqrt(mean(x^2)).
- max (binary, reduce_max, acc_max, relu = max(x, 0)): the lexicographic max of the *signed*
  representatives (a in (-p/2, p/2), then b): a total order, so associative, commutative and
  idempotent like real max (the max of tile maxima is the row max). Signed, because with
  representatives in [0, p) zero would be the least element and relu the identity.
- acc_rescale_sum by its definition sum_i exp(m_i - M) x_i (computed online; the
  homomorphism makes the rescalings telescope exactly).

Matmul is exact and fast (float64 BLAS, no int64 matmul): the smaller operand is split into
L limbs of b = ceil(31 / L) bits (L = 2 or 3) stacked along its free dim, the larger is
converted to float64 once, and BLAS multiplies chunks of at most 2^(53 - 31 - b) along k:
each term is < 2^b * 2^31, so a chunk sum is < 2^53 and exact. Chunk results are reduced
mod p (or q) in int64 and the limbs recombined with shifts. ``_limb_plan`` picks L per k.
Reductions are int64 sums of residues < 2^31 (exact up to 2^32 terms).

False-acceptance bound. Inputs are drawn uniformly and independently per component, the
same inputs for both graphs. Polynomial fragment (ring ops, exact constants; division as a
rational function, cleared of denominators): if two graphs' outputs differ as polynomials of
total degree <= d, one random input makes them agree with probability <= d/q (Schwartz–Zippel
in the smaller field). With exp, an output's p-part is sum_j c_j(x) * omega^(E_j(x)) with
polynomial coefficients c_j (mod p) and exponents E_j (mod q): two distinct exponents
coincide with probability <= deg(E)/q, and otherwise the p-polynomials are compared, so the
bound stays of the form d/q with d the ring degree plus the exponent degrees, times the
number of exponent pairs (a union bound). ``ff_fingerprint`` runs ``trials`` independent
input sets: a wrong graph survives with probability <= (d/q)^trials — for d = 10^4,
q ~ 2^30 and 3 trials, below 10^-15 (plus sha256 collisions, 2^-128).

What the uninterpreted parts do to this, honestly: sqrt/log/erf (and odd powers) are fixed
pseudo-random functions, so they are sound (graphs that compute equal arguments get equal
values) but identities of the real functions beyond those built in (sqrt(x)^2 = x,
log(xy) = log x + log y, ...) are not seen: such equivalent graphs are rejected, not
accepted. A wrong graph can additionally collide when two distinct argument pairs of one
function collide (~1/q per pair) — negligible. max is a total order on residues, not the real
order: it satisfies the lattice laws (associative, commutative, idempotent) but not
translation invariance (max(x,y)+z = max(x+z,y+z)), so equivalences that need it are
rejected; and because a comparison is a step function, not a polynomial, the bound above
holds for each fixed outcome of the comparisons rather than globally. The float check that
follows the search catches what the field cannot see (overflow, cancellation, rounding).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np

from mirage_jax.errors import GraphError
from mirage_jax.interpret.walker import (
    NumberSystem,
    batched_matmul,
    check_arity,
    evaluate_graph,
    graph_input_types,
    kernel_values,
)
from mirage_jax.ir.graph import Graph, KernelGraph
from mirage_jax.ir.types import DType, TensorType

_M64 = (1 << 64) - 1


def _is_prime(n: int) -> bool:
    """Deterministic Miller–Rabin for n < 3.3e24 (these bases suffice)."""
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    if n < 2 or any(n % b == 0 for b in bases):
        return n in bases
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for b in bases:
        x = pow(b, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class Field:
    """Z_p x Z_q with q prime, q | p - 1, p < 2^31, and omega of order q in Z_p^*.

    ``seed`` selects the uninterpreted functions (one fixed function per op per seed)."""

    p: int = 2147483579
    q: int = 1073741789
    omega: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        ok = (
            2 < self.q < self.p < (1 << 31)
            and _is_prime(self.p)
            and _is_prime(self.q)
            and (self.p - 1) % self.q == 0
            and pow(self.omega, self.q, self.p) == 1
            and self.omega % self.p != 1
        )
        if not ok:
            raise GraphError(
                f"Field(p={self.p}, q={self.q}, omega={self.omega}) is not a valid field pair",
                remedy="use primes q | p - 1 with p < 2^31 and omega of order q mod p",
            )

    def const(self, c: float | Fraction) -> tuple[int, int]:
        """The exact image of a rational constant in (Z_p, Z_q)."""
        try:
            f = Fraction(c)
        except (OverflowError, ValueError):
            raise GraphError(
                f"the constant {c!r} has no finite-field image",
                remedy="use finite constants in mul_scalar / add_scalar / pow_scalar",
            ) from None
        return (f.numerator * pow(f.denominator, -1, self.p) % self.p,
                f.numerator * pow(f.denominator, -1, self.q) % self.q)  # fmt: skip

    @cached_property
    def _exp_tables(self) -> tuple[np.ndarray, np.ndarray]:
        # omega^e = omega^(e_lo) * (omega^(2^15))^(e_hi), e < q < 2^30: two 2^15-entry tables
        lo = np.empty(1 << 15, np.int64)
        hi = np.empty(1 << 15, np.int64)
        w, w15 = 1, pow(self.omega, 1 << 15, self.p)
        v = 1
        for i in range(1 << 15):
            lo[i], hi[i] = w, v
            w, v = w * self.omega % self.p, v * w15 % self.p
        return lo, hi

    def omega_pow(self, e: np.ndarray) -> np.ndarray:
        lo, hi = self._exp_tables
        return lo[e & 0x7FFF] * hi[e >> 15] % self.p


DEFAULT_FIELD = Field()


@dataclass(frozen=True, eq=False)
class FFTensor:
    """A tensor of field elements: ``a`` mod p and ``b`` mod q (``None``: q-part unknown)."""

    a: np.ndarray
    b: np.ndarray | None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.a.shape

    def equals(self, other: FFTensor) -> bool:
        """Equal values: same shape, same p-part, same q-part where both are known."""
        if self.shape != other.shape or not np.array_equal(self.a, other.a):
            return False
        return self.b is None or other.b is None or np.array_equal(self.b, other.b)


# ---------------------------------------------------------------------------------------------
# modular helpers


def _powmod(x: np.ndarray, e: int, m: int) -> np.ndarray:
    result = np.ones_like(x)
    base = x % m
    while e:
        if e & 1:
            result = result * base % m
        base = base * base % m
        e >>= 1
    return result


def _inverse(x: np.ndarray, m: int) -> np.ndarray:
    return _powmod(x, m - 2, m)  # Fermat; 0 maps to 0


def _signed(x: np.ndarray, m: int) -> np.ndarray:
    return np.where(x > m // 2, x - m, x)


def _limb_plan(k: int) -> tuple[int, int, int]:
    """(limbs, bits per limb, k-chunk) for a length-k contraction of residues < 2^31.

    A limb times a residue is < 2^(bits + 31), so ``2^(53 - 31 - bits)`` of them sum exactly
    in float64. Three limbs cost more BLAS work; two cost more chunks (of 64), each reduced
    mod m in int64 (measured here at about 200 multiply-adds per element): pick the cheaper.
    Four or more limbs never win below k ~ 10^5."""
    plans = []
    for limbs in (2, 3):
        bits = -(-31 // limbs)
        chunk = 1 << (53 - 31 - bits)
        cost = limbs * k + 200 * (limbs * -(-k // chunk) + 1)
        plans.append((cost, limbs, bits, chunk))
    return min(plans)[1:]


def _matmul_mod(x: np.ndarray, y: np.ndarray, m: int) -> np.ndarray:
    """Exact batched (x @ y) mod m for int64 residues in [0, m), m < 2^31 (see module doc)."""
    k = x.shape[-1]
    limbs, bits, chunk = _limb_plan(k)
    split_left = x.size <= y.size
    small, big = (x, y) if split_left else (y, x)
    axis = -2 if split_left else -1
    mask = (1 << bits) - 1
    stacked = np.concatenate(
        [((small >> (bits * j)) & mask).astype(np.float64) for j in range(limbs)], axis
    )
    big = big.astype(np.float64)
    starts = range(0, k, chunk)
    acc = None
    for k0 in starts:
        k1 = min(k, k0 + chunk)
        if split_left:
            part = batched_matmul(stacked[..., k0:k1], big[..., k0:k1, :])
        else:
            part = batched_matmul(big[..., k0:k1], stacked[..., k0:k1, :])
        part = part.astype(np.int64)  # exact: < 2^53
        if len(starts) > 1:
            part %= m
            acc = part if acc is None else acc + part  # < (k / chunk) * 2^31: no overflow
        else:
            acc = part
    n = acc.shape[axis] // limbs
    pieces = np.split(acc, [n * j for j in range(1, limbs)], axis)
    # piece 0 < 2^53 and each reduced higher piece shifted is < 2^53: the sum fits int64
    out = pieces[0] % m if len(starts) > 1 else pieces[0]
    for j in range(1, limbs):
        out = out + ((pieces[j] % m) << (bits * j))
    return out % m


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _tag(name: str, seed: int) -> np.uint64:
    # a stable per-op constant (python's str hash is salted per process)
    t = (zlib.crc32(name.encode()) << 32 | (seed & 0xFFFFFFFF)) & _M64
    return _mix(np.array([t], np.uint64))[0]


# ---------------------------------------------------------------------------------------------
# the number system


def _opaque(tag: str) -> Any:
    """The operator of an uninterpreted function named ``tag`` (see ``_uninterpreted``)."""
    return lambda self, x: self._uninterpreted(x, tag)


class FieldSystem(NumberSystem):
    """(Z_p, Z_q) pairs; see the module docstring for every op's definition."""

    def __init__(self, field: Field) -> None:
        self.f = field

    # structure
    def layout(self, x, fn):
        return FFTensor(fn(x.a), None if x.b is None else fn(x.b))

    def shape(self, x):
        return x.shape

    def stack(self, xs, axis):
        return self._join(np.stack, xs, axis)

    def concat(self, xs, axis):
        return self._join(np.concatenate, xs, axis)

    @staticmethod
    def _join(fn, xs, axis) -> FFTensor:
        bs = [x.b for x in xs]
        return FFTensor(fn([x.a for x in xs], axis),
                        None if any(b is None for b in bs) else fn(bs, axis))  # fmt: skip

    def input(self, x: Any, type_: TensorType, what: str) -> FFTensor:
        if not isinstance(x, FFTensor):
            raise GraphError(f"{what} is a {type(x).__name__}, not an FFTensor",
                             remedy="draw inputs with random_inputs(graph.input_types, field)")  # fmt: skip
        if x.shape != type_.shape:
            raise GraphError(f"{what} has shape {x.shape} but the graph expects {type_}",
                             remedy="pass FFTensors whose shapes match the graph's inputs")  # fmt: skip
        return x

    # ring
    def _ring(self, x: FFTensor, y: FFTensor, fn) -> FFTensor:
        b = None if x.b is None or y.b is None else fn(x.b, y.b) % self.f.q
        return FFTensor(fn(x.a, y.a) % self.f.p, b)

    def add(self, x, y):
        return self._ring(x, y, np.add)

    def sub(self, x, y):
        return self._ring(x, y, np.subtract)

    def mul(self, x, y):
        return self._ring(x, y, np.multiply)  # residues < 2^31: products < 2^62

    def neg(self, x):
        return FFTensor(-x.a % self.f.p, None if x.b is None else -x.b % self.f.q)

    def reciprocal(self, x):
        return FFTensor(_inverse(x.a, self.f.p),
                        None if x.b is None else _inverse(x.b, self.f.q))  # fmt: skip

    def matmul(self, x, y):
        b = None if x.b is None or y.b is None else _matmul_mod(x.b, y.b, self.f.q)
        return FFTensor(_matmul_mod(x.a, y.a, self.f.p), b)

    def reduce_sum(self, x, axis):
        # int64 sums of residues < 2^31 stay exact for up to 2^32 terms
        b = None if x.b is None else np.sum(x.b, axis=axis, keepdims=True) % self.f.q
        return FFTensor(np.sum(x.a, axis=axis, keepdims=True) % self.f.p, b)

    def scale(self, x, c):
        cp, cq = self.f.const(c)
        return FFTensor(x.a * cp % self.f.p, None if x.b is None else x.b * cq % self.f.q)

    def shift(self, x, c):
        cp, cq = self.f.const(c)
        return FFTensor((x.a + cp) % self.f.p, None if x.b is None else (x.b + cq) % self.f.q)

    def pow_scalar(self, x, e):
        if float(e).is_integer():
            n = int(e)
            out = self._power(x, abs(n))
            return self.reciprocal(out) if n < 0 else out
        if e == 0.5:
            return self.sqrt(x)
        if e == -0.5:
            return self.rsqrt(x)
        return self._uninterpreted(x, f"pow:{float(e)!r}")

    def _power(self, x: FFTensor, n: int) -> FFTensor:
        return FFTensor(_powmod(x.a, n, self.f.p),
                        None if x.b is None else _powmod(x.b, n, self.f.q))  # fmt: skip

    def cast(self, x, dtype: DType):
        return x  # the field sees values, not roundings

    # exp and the uninterpreted functions
    def exp(self, x):
        e = x.b if x.b is not None else self._hash(x, "exp-exponent") % np.uint64(self.f.q)
        return FFTensor(self.f.omega_pow(e.astype(np.int64)), None)

    def _hash(self, x: FFTensor, tag: str) -> np.ndarray:
        # b < 2^30 or the marker 2^31 - 1 for "unknown": the key is injective in (a, b)
        b = x.b if x.b is not None else np.full_like(x.a, (1 << 31) - 1)
        key = x.a.astype(np.uint64) | (b.astype(np.uint64) << np.uint64(31))
        with np.errstate(over="ignore"):
            return _mix(key ^ _tag(tag, self.f.seed))

    def _uninterpreted(self, x: FFTensor, tag: str) -> FFTensor:
        h = self._hash(x, tag)
        with np.errstate(over="ignore"):
            h2 = _mix(h)
        return FFTensor((h % np.uint64(self.f.p)).astype(np.int64),
                        (h2 % np.uint64(self.f.q)).astype(np.int64))  # fmt: skip

    # the uninterpreted functions (module docstring), each a fixed function of its own
    sqrt, log, erf, erfc, erf_inv, sin, cos, sign = (_opaque(name) for name in (
        "sqrt", "log", "erf", "erfc", "erf_inv", "sin", "cos", "sign"))

    def rem(self, x, y):
        # trunc is the one uninterpreted part: the field checks the algebra around it
        return self.sub(x, self.mul(y, self._uninterpreted(self.div(x, y), "trunc")))

    def finite_or(self, x, fill):
        # every field element is "finite": as the identity, a candidate that dropped the guard
        # would verify; as a function of its own (one per fill), both graphs must keep it
        return self._uninterpreted(x, f"finite_or:{float(fill)!r}")

    def where(self, m, x, fill, keep):
        # masks are 0/1 in the field: m x + (1 - m) c, exact; a non-finite fill is a fixed
        # element of its own (no rational image)
        p, q = self.f.p, self.f.q
        sel = m if keep else FFTensor((1 - m.a) % p, None if m.b is None else (1 - m.b) % q)
        cp, cq = self._fill(fill)
        a = (sel.a * x.a + (1 - sel.a) % p * cp) % p
        b = None if sel.b is None or x.b is None else (sel.b * x.b + (1 - sel.b) % q * cq) % q
        return FFTensor(a, b)

    def _fill(self, fill: float) -> tuple[int, int]:
        if np.isfinite(fill):
            return self.f.const(fill)
        tag = _tag(f"fill:{fill!r}", self.f.seed)
        with np.errstate(over="ignore"):
            return int(tag) % self.f.p, int(_mix(tag)) % self.f.q

    # max: lexicographic on signed representatives
    def _key(self, x: FFTensor, with_q: bool) -> np.ndarray:
        key = _signed(x.a, self.f.p)
        if with_q:
            key = (key << 31) + _signed(x.b, self.f.q)  # |key| < 2^61
        return key

    def maximum(self, x, y):
        with_q = x.b is not None and y.b is not None
        pick = self._key(x, with_q) >= self._key(y, with_q)
        return FFTensor(np.where(pick, x.a, y.a), np.where(pick, x.b, y.b) if with_q else None)

    def reduce_max(self, x, axis):
        idx = np.argmax(self._key(x, x.b is not None), axis=axis, keepdims=True)
        b = None if x.b is None else np.take_along_axis(x.b, idx, axis)
        return FFTensor(np.take_along_axis(x.a, idx, axis), b)


# ---------------------------------------------------------------------------------------------
# public API


def random_inputs(
    types: Sequence[TensorType], field: Field = DEFAULT_FIELD,
    rng: np.random.Generator | None = None,
) -> list[FFTensor]:  # fmt: skip
    """Uniform random field tensors of the given types, drawn from ``rng`` in order."""
    rng = rng if rng is not None else np.random.default_rng()
    # uint32 draws are several times faster than int64 ones, and p < 2^31 fits; a mask is 0/1
    return [FFTensor(*(rng.integers(0, 2 if t.dtype is DType.BOOL else m, t.shape,
                                    dtype=np.uint32).astype(np.int64) for m in (field.p, field.q)))
            for t in types]  # fmt: skip


def ff_evaluate(
    graph: Graph, inputs: Sequence[FFTensor], field: Field = DEFAULT_FIELD
) -> list[FFTensor]:
    """The outputs of ``graph`` (any level) on field ``inputs``."""
    return evaluate_graph(graph, inputs, FieldSystem(field))


def ff_evaluate_values(
    graph: KernelGraph,
    inputs: Sequence[FFTensor],
    field: Field = DEFAULT_FIELD,
    known: Mapping[int, FFTensor] | None = None,
) -> dict[int, FFTensor]:
    """Every value id of a kernel graph -> its field tensor. ``known`` values (of a prefix of
    this graph) are reused rather than recomputed, so growing a graph op by op costs one op."""
    ns = FieldSystem(field)
    check_arity(graph, inputs)
    types = graph_input_types(graph)
    values = [ns.input(x, t, f"input {i}") for i, (x, t) in enumerate(zip(inputs, types))]
    return kernel_values(graph, values, ns, known)


def fingerprint_inputs(
    types: Sequence[TensorType], field: Field = DEFAULT_FIELD, seed: int = 0, trial: int = 0
) -> list[FFTensor]:
    """The inputs ``ff_fingerprint`` uses in one trial: a function of (types, seed, trial)."""
    return random_inputs(types, field, np.random.default_rng([seed, trial]))


def hash_outputs(outputs: Sequence[FFTensor], h: Any) -> None:
    """Feed output tensors into a hashlib object: shapes, p-parts, and q-parts where known."""
    for t in outputs:
        h.update(repr(t.shape).encode())
        h.update(np.ascontiguousarray(t.a, np.int64).tobytes())
        if t.b is None:
            h.update(b"q-unknown")
        else:
            h.update(np.ascontiguousarray(t.b, np.int64).tobytes())


def ff_fingerprint(
    graph: Graph, *, field: Field = DEFAULT_FIELD, seed: int = 0, trials: int = 3
) -> str:
    """sha256 of the outputs on ``trials`` independent random input sets. The inputs depend
    only on (input types, field, seed, trial), so graphs with equal input types see identical
    inputs and equal fingerprints mean equivalent with high probability (module docstring)."""
    h = hashlib.sha256(f"ff:{field.p}:{field.q}:{field.omega}:{field.seed}".encode())
    types = graph_input_types(graph)
    for trial in range(trials):
        hash_outputs(ff_evaluate(graph, fingerprint_inputs(types, field, seed, trial), field), h)
    return h.hexdigest()


__all__ = [
    "DEFAULT_FIELD", "FFTensor", "Field", "FieldSystem", "ff_evaluate", "ff_evaluate_values",
    "ff_fingerprint", "fingerprint_inputs", "hash_outputs", "random_inputs",
]  # fmt: skip
