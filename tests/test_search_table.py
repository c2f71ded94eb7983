"""benchmarks/search_table.py's re-ranking of timed candidates under cost-model variants."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import search_table  # benchmarks/search_table.py, importable through conftest.py

from mirage_jax.backend.cpu import calibrate
from mirage_jax.backend.cpu import cost as cost_model


def test_rerank_field_is_checked_against_the_cost_model():
    assert search_table.parse_rerank("overlap=0,0.5,1") == ("overlap", (0.0, 0.5, 1.0))
    with pytest.raises(argparse.ArgumentTypeError, match="overlap"):
        search_table.parse_rerank("overlaps=1")
    with pytest.raises(argparse.ArgumentTypeError, match="FIELD=V1"):
        search_table.parse_rerank("overlap")
    assert search_table.parse_rerank("cores=1,2") == ("cores", (1, 2))  # an int field's type
    with pytest.raises(argparse.ArgumentTypeError, match="int values"):
        search_table.parse_rerank("cores=1.5")
    with pytest.raises(argparse.ArgumentTypeError, match="FIELD=V1"):
        search_table.parse_rerank("matmul_rates=1")  # a tuple, not a scalar


def test_rerank_orders_the_same_measurements_under_each_model(monkeypatch):
    monkeypatch.setenv(calibrate.CALIBRATE_ENV, "0")  # the built-in model, no probe
    calibrate.host_model.cache_clear()
    # estimates: "sum" adds its memory (3) and compute (2) unless the model overlaps them
    parts = {"sum": (3.0, 2.0), "mid": (3.5, 0.0), "long": (4.5, 0.0)}

    def fake_estimate(graph, model):
        memory, compute = parts[graph]
        return SimpleNamespace(time_s=cost_model.combined(memory, compute, model))

    monkeypatch.setattr(cost_model, "estimate", fake_estimate)
    measured = {"sum": 5.0, "mid": 3.5, "long": 4.5}  # the host adds them up
    cands = [SimpleNamespace(graph=g, measured_s=t, summary=lambda g=g: g)
             for g, t in measured.items()]  # fmt: skip
    try:
        out = search_table.rerank(SimpleNamespace(verified=cands), "overlap", (0.0, 1.0))
    finally:
        calibrate.host_model.cache_clear()
    assert out[0.0] == (pytest.approx(1.0), 1.0)  # the same order, and the fastest picked
    assert out[1.0] == (pytest.approx(-0.5), 5.0 / 3.5)  # "sum" first at 3: 1.43x the best
