"""The op table (``mirage_jax.ir.ops``): every Op has a complete OpInfo, and every table that
spells or prices ops covers exactly the ops its OpInfo facts say, and agrees with them.

A new op without its facts fails here with the op and the missing fact named: its functor
(both runtimes), its abstract formula, its degree rule, an emitter template, an interpreter
entry.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.special import erfinv

from mirage_jax.backend.cpu import cost as cpu_cost
from mirage_jax.backend.cpu.emit import TABLE as CPU_TABLE
from mirage_jax.backend.cuda import cost as cuda_cost
from mirage_jax.backend.cuda.emit import TABLE as CUDA_TABLE
from mirage_jax.interpret import evaluate, ff_evaluate, random_inputs
from mirage_jax.interpret.walker import OP_TABLE
from mirage_jax.ir import F32, DType, KernelBuilder, KernelGraph, Op, TensorType
from mirage_jax.ir.ops import (
    ACCUMULATORS,
    BINARY,
    COMPUTE,
    ELEMENTWISE,
    LAYOUT,
    MASKED,
    OP_INFO,
    REQUIRED,
    SCALAR_UNARY,
    STRUCTURE,
    UNARY,
    Group,
    missing_facts,
)
from mirage_jax.search import abstract as ab
from mirage_jax.search.config import SearchConfig, derive_space
from mirage_jax.search.equivalence import DEGREE_RULES

_RUNTIME = Path(__file__).resolve().parents[1] / "csrc" / "runtime"
# a scalar for each scalar op: pow's is not an integer so the generic functor is exercised
_SCALAR = {Op.MUL_SCALAR: 0.75, Op.ADD_SCALAR: 0.5, Op.POW_SCALAR: 1.5, Op.WHERE: -1.5,
           Op.WHERE_NOT: 2.5, Op.FINITE_OR: -2.0}  # fmt: skip


def _one_op(op: Op, shape: tuple[int, ...] = (8, 16)) -> KernelGraph:
    """A kernel graph applying elementwise ``op`` to its inputs (one, or two for a binary)."""
    kb = KernelBuilder()
    dtypes = (DType.BOOL, F32) if op in MASKED else (F32,) * (op.info.arity or 0)
    ins = [kb.input(TensorType(shape, dt)) for dt in dtypes]
    attrs = {op.info.scalar_attr: _SCALAR[op]} if op.info.scalar_attr else {}
    kb.output(kb.apply(op, *ins, **attrs))
    return kb.build()


def _named(ops) -> list[str]:
    return sorted(op.value for op in ops)


# ------------------------------------------------------------------------------ the table


def test_every_op_has_a_complete_opinfo() -> None:
    missing = {op.value: missing_facts(op) for op in Op if missing_facts(op)}
    assert not missing, f"ops without these OpInfo facts: {missing}"


def test_facts_fit_the_group() -> None:
    for op, info in OP_INFO.items():
        where = f"{op.value} ({info.group.value})"
        if info.group is Group.UNARY:
            assert info.arity == 1, where
        if info.group is Group.BINARY:
            assert info.arity == 2, where
        if op not in ELEMENTWISE:
            assert not info.functor, f"{where}: only elementwise ops have a shared functor"
        if info.scalar_attr:
            assert op in UNARY | MASKED and info.attrs.get(info.scalar_attr) is REQUIRED, where
        if info.commutative or info.trivial_on_itself:
            assert op in BINARY, where
        for acc in info.carried_by:
            assert acc in ACCUMULATORS and op in COMPUTE, f"{where}: carried by {acc.value}"
        assert info.element_flops >= 1.0, where
        # both cost models agree on which ops cost more than a multiply
        assert info.transcendental == (info.element_flops > 1.0), where


def test_groups_partition_the_ops() -> None:
    for op in Op:
        homes = [name for name, ops in (("structure", STRUCTURE), ("layout", LAYOUT),
                                        ("compute", COMPUTE), ("accumulator", ACCUMULATORS))
                 if op in ops]  # fmt: skip
        assert len(homes) == 1, f"{op.value} is in {homes or 'no group'}"


# -------------------------------------------------------------------- tables that read it


def _runtime_functors(path: Path) -> set[str]:
    text = path.read_text()
    return set(re.findall(r"MJ_(?:UNARY|BINARY)\((\w+),", text)) | set(
        re.findall(r"^struct (\w+)", text, re.MULTILINE))  # fmt: skip


@pytest.mark.parametrize("header", ["cpu/math.h", "cuda/ops.cuh"])
def test_both_runtimes_define_every_functor(header: str) -> None:
    defined = _runtime_functors(_RUNTIME / header)
    undefined = _named(op for op in ELEMENTWISE if op.info.functor not in defined)
    assert not undefined, f"{header} lacks the OpInfo.functor of {undefined}"


@pytest.mark.parametrize("name, table", [("CPU", CPU_TABLE), ("CUDA", CUDA_TABLE)])
def test_emitters_cover_every_op_and_spell_the_shared_functor(name: str, table) -> None:
    assert set(table) == set(Op), f"{name} templates missing for {_named(set(Op) - set(table))}"
    wrong = _named(op for op in ELEMENTWISE if table[op].functor != f"mj::op::{op.info.functor}")
    assert not wrong, f"{name} templates not spelling OpInfo.functor: {wrong}"


def test_abstract_lowering_covers_exactly_the_ops_with_a_formula() -> None:
    with_formula = {op for op in Op if op.info.abstract}
    assert set(ab.LOWERING) == with_formula
    assert set(Op) - STRUCTURE <= with_formula


def test_degree_rules_cover_every_op_and_none_is_unused() -> None:
    used = {op.info.degree for op in Op if op not in STRUCTURE}
    unknown = {op.value: op.info.degree for op in Op if op.info.degree not in DEGREE_RULES
               and op not in STRUCTURE}  # fmt: skip
    assert not unknown, f"degree rules search.equivalence does not define: {unknown}"
    assert set(DEGREE_RULES) == used


def test_interpreters_cover_every_computing_op() -> None:
    assert set(OP_TABLE) == set(Op) - STRUCTURE - ACCUMULATORS
    rng = np.random.default_rng(0)
    for op in sorted(ELEMENTWISE, key=lambda o: o.value):
        g = _one_op(op)
        (out,) = ff_evaluate(g, random_inputs(g.input_types, rng=rng))
        assert out.a.shape == (8, 16), op.value


# ----------------------------------------------------------- facts behave as they claim


def _numeric(term: ab.Term, env: list[np.ndarray]) -> np.ndarray:
    """A term of elementwise ops evaluated in float64 (``fn`` by its name)."""
    args = [_numeric(t, env) for t in term.args]
    head, p = term.head, term.param
    if head == "var":
        return env[p]
    if head == "const":
        return np.float64(p)
    if head in ("add", "mul"):
        combine = np.sum if head == "add" else np.prod
        return combine(np.stack(np.broadcast_arrays(*args)), axis=0)
    unary = {"inv": lambda x: 1.0 / x, "exp": np.exp, "sqrt": np.sqrt}
    if head in unary:
        return unary[head](args[0])
    if head == "max":
        return np.maximum(*args)
    assert head == "fn", f"no numeric meaning for {head}"
    if p.startswith("pow:"):
        return args[0] ** float(p[4:])
    fns = {"tanh": np.tanh, "log": np.log, "erf": math.erf, "erfc": math.erfc, "sin": np.sin,
           "cos": np.cos, "sign": np.sign, "finite_or": lambda x: x,  # x finite here
           "erf_inv": erfinv, "trunc": np.trunc}  # fmt: skip
    return np.vectorize(fns[p])(args[0])


# masks are opaque to the abstraction (where(m, x) is a new value of x), so not computed here
@pytest.mark.parametrize("op", sorted(ELEMENTWISE - MASKED, key=lambda o: o.value),
                         ids=lambda o: o.value)  # fmt: skip
def test_abstract_formula_computes_the_op(op: Op) -> None:
    """Each elementwise op's formula, evaluated in float64, is what the reference interpreter
    computes for the op (positive inputs: log, sqrt and pow are defined there). Abstract
    constants are rounded to float32, hence the tolerance."""
    g = _one_op(op)
    rng = np.random.default_rng([ord(c) for c in op.value])
    low, high = (-0.99, 0.99) if op is Op.ERF_INV else (0.25, 3.0)  # erf_inv's domain
    xs = [rng.uniform(low, high, (8, 16)) for _ in g.input_types]
    (term,) = ab.output_terms(g)
    (want,) = evaluate(g, xs, precision="float64")
    np.testing.assert_allclose(_numeric(term, xs), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op", sorted(ELEMENTWISE, key=lambda o: o.value), ids=lambda o: o.value)
def test_cost_models_price_each_op_by_its_facts(op: Op) -> None:
    g = _one_op(op, (64, 256))
    size = 64 * 256
    assert cpu_cost.estimate(g).flops == size * op.info.element_flops
    assert cuda_cost.estimate(g).flops == size * (8 if op.info.transcendental else 1)


def test_search_space_takes_scalars_and_carrying_accumulators_from_the_facts() -> None:
    for op in SCALAR_UNARY:
        space = derive_space(SearchConfig(), _one_op(op))
        assert space.scalars == {op: (_SCALAR[op],)}, op.value
    for op in (o for o in Op if o.info.carried_by):
        kb = KernelBuilder()
        x = kb.input(TensorType((8, 16), F32))
        y = kb.matmul(x, kb.input(TensorType((16, 8), F32))) if op is Op.MATMUL else kb.apply(
            op, x, dim=1)  # fmt: skip
        kb.output(y)
        space = derive_space(SearchConfig(), kb.build())
        assert set(op.info.carried_by) <= set(space.block_ops), op.value
        assert not set(space.block_ops) & (ACCUMULATORS - set(op.info.carried_by)), op.value
