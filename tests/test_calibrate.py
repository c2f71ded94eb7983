"""The host calibration of the CPU cost model: measured once, cached, and used by the search."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import pytest

from mirage_jax.errors import CompileError
from mirage_jax.search import calibrate
from mirage_jax.search import cost as cost_model


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """An empty cache and no memoised model, restored for the tests after this one."""
    monkeypatch.setenv("MIRAGE_JAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(calibrate.CALIBRATE_ENV, raising=False)
    calibrate.host_model.cache_clear()
    yield tmp_path / "cache"
    calibrate.host_model.cache_clear()


def test_probe_measures_this_host_once_and_caches_the_figures(fresh, monkeypatch):
    figures = calibrate.measurements()
    assert set(figures) == set(calibrate._FIELDS)
    assert figures["cores"] == os.cpu_count()
    for m in (1, 2, 4, 8):
        assert 1e9 < figures[f"matmul{m}"] < 1e13, figures  # flop/s of one core
    # more rows per register block reuse each load of B more (matmul.h's premise)
    assert figures["matmul8"] > 1.2 * figures["matmul1"], figures
    assert 1e9 < figures["vector"] < 1e12, figures
    assert 1e8 < figures["core_stream"] < 1e12 and 1e8 < figures["all_stream"] < 1e12, figures
    (cached,) = (fresh / "calibration").glob("*.json")
    assert json.loads(cached.read_text()) == figures

    def no_probe(path):
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(calibrate, "_run_probe", no_probe)
    assert calibrate.measurements() == figures
    model = calibrate.host_model()
    assert model.matmul_rates == tuple(figures[f"matmul{m}"] for m in (1, 2, 4, 8))
    assert model.mem_bytes_per_s == figures["all_stream"]
    assert model.core_mem_bytes_per_s == figures["core_stream"]
    assert model.vector_elems == figures["vector"] and model.cores == os.cpu_count()


def test_calibration_can_be_turned_off(fresh, monkeypatch):
    monkeypatch.setenv(calibrate.CALIBRATE_ENV, "0")
    assert calibrate.host_model() is cost_model.DEFAULT_MODEL
    assert not (fresh / "calibration").exists()


def test_a_probe_that_cannot_build_falls_back_to_the_defaults_and_says_so(fresh, monkeypatch,
                                                                          caplog):  # fmt: skip
    def broken(*args, **kwargs):
        raise CompileError("no C++ compiler found", remedy="install g++")

    monkeypatch.setattr(calibrate, "compile_shared_library", broken)
    with caplog.at_level(logging.WARNING, logger="mirage_jax.search"):
        assert calibrate.host_model() is cost_model.DEFAULT_MODEL
    assert "calibration failed" in caplog.text and "no C++ compiler" in caplog.text


def test_matmul_rate_follows_the_measured_register_block_rates():
    model = dataclasses.replace(cost_model.DEFAULT_MODEL, matmul_rates=(10e9, 20e9, 40e9, 80e9))
    rate = cost_model._matmul_rate
    assert rate(8, 4096, model) == pytest.approx(80e9)
    assert rate(64, 4096, model) == pytest.approx(80e9)  # 8-row blocks
    assert rate(1, 4096, model) == pytest.approx(10e9)
    assert rate(3, 4096, model) == pytest.approx(30e9)  # between the 2- and 4-row figures
    # two rows over one vector of columns: half the k step of the measured 8-vector panel
    assert rate(2, 16, model) == pytest.approx(10e9)
    # 12 rows (not a multiple of 8) run two 6-row blocks, between the 4- and 8-row figures
    assert rate(12, 4096, model) == pytest.approx(60e9)
    slow = dataclasses.replace(model, matmul_rates=(5e9, 10e9, 20e9, 40e9))
    assert rate(8, 4096, slow) == pytest.approx(rate(8, 4096, model) / 2)
