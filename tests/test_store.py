"""The artifact store: cache root, atomic publish, corruption checks, and the per-key lock."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import pytest
from racing import race

from mirage_jax import store
from mirage_jax.store import Namespace

PAYLOAD = b"\x7fELF" + bytes(range(256)) * 64


@pytest.fixture
def space(tmp_path: Path) -> Namespace:
    return Namespace("test", tmp_path / "space")


def _writer(data: bytes):
    def write(tmp: Path) -> None:
        tmp.write_bytes(data)

    return write


def _leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if ".tmp-" in p.name]


def test_cache_root_env_var_then_xdg_then_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(store.CACHE_ENV, str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store.cache_root() == tmp_path / "explicit"
    kernels = store.namespace("kernels-test")
    assert kernels is store.namespace("kernels-test")  # one per name and process
    assert kernels.directory == tmp_path / "explicit" / "kernels-test"
    monkeypatch.delenv(store.CACHE_ENV)
    assert store.cache_root() == tmp_path / "xdg" / "mirage_jax"
    assert kernels.directory == tmp_path / "xdg" / "mirage_jax" / "kernels-test"  # read per call
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert store.cache_root() == Path.home() / ".cache" / "mirage_jax"


def test_a_failing_writer_publishes_nothing_and_leaves_no_temporary(space: Namespace) -> None:
    path = space.entry("ab/entry.so")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_bytes(PAYLOAD[:100])
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        space.publish(path, half_then_fail, record={"key": "k"})
    assert not path.exists() and not store.record_path(path).exists()
    assert list(path.parent.iterdir()) == []
    assert space.stats().writes == 0


def test_published_artifact_carries_a_checked_digest_record(space: Namespace) -> None:
    path = space.entry("ab/entry.so")
    got, built = space.get_or_build(path, _writer(PAYLOAD), lambda: {"key": "k"})
    assert (got, built) == (path, True) and path.read_bytes() == PAYLOAD
    record = json.loads(store.record_path(path).read_text())
    assert record["key"] == "k" and record["size"] == len(PAYLOAD)
    assert record["sha256"] == store.file_digest(path)

    def no_build(tmp: Path) -> None:
        raise AssertionError("built again despite a valid entry")

    assert space.get_or_build(path, no_build, dict) == (path, False)
    stats = space.stats()
    assert (stats.hits, stats.misses, stats.corrupt, stats.writes) == (1, 1, 0, 1)
    assert _leftovers(path.parent) == []


@pytest.mark.parametrize("damage", ["truncate", "flip", "record"])
def test_damaged_artifact_is_detected_counted_and_rebuilt(
    space: Namespace, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = space.entry("ab/entry.so")
    space.get_or_build(path, _writer(PAYLOAD), dict)
    if damage == "truncate":
        path.write_bytes(PAYLOAD[: len(PAYLOAD) // 3])
    elif damage == "flip":
        path.write_bytes(PAYLOAD[:-1] + b"\0")
    else:
        record = store.record_path(path)
        record.write_text(record.read_text()[:20])
    with caplog.at_level(logging.WARNING, logger="mirage_jax.store"):
        got, built = space.get_or_build(path, _writer(PAYLOAD), dict)
    assert built and got.read_bytes() == PAYLOAD and store.verified(got) == got
    assert space.stats().corrupt == 1 and "corrupt" in caplog.text and str(path) in caplog.text


def test_artifact_without_digest_is_rebuilt_quietly(
    space: Namespace, caplog: pytest.LogCaptureFixture
) -> None:
    """A library whose metadata predates digests cannot be checked, so it is built again."""
    path = space.entry("ab/entry.so")
    path.parent.mkdir(parents=True)
    path.write_bytes(PAYLOAD[:10])
    store.record_path(path).write_text(json.dumps({"key": "k"}))
    got, built = space.get_or_build(path, _writer(PAYLOAD), dict)
    assert built and got.read_bytes() == PAYLOAD
    assert space.stats().corrupt == 0 and "corrupt" not in caplog.text


def test_truncated_json_entry_is_removed_and_counted(
    space: Namespace, caplog: pytest.LogCaptureFixture
) -> None:
    path = space.entry("key.json")
    space.publish_text(path, json.dumps({"answer": 42}))

    def read(p: Path) -> int:
        return json.loads(p.read_text())["answer"]

    assert space.load(path, read) == 42
    path.write_text(path.read_text()[:7])
    assert space.load(path, read) is None
    assert not path.exists() and "corrupt" in caplog.text
    assert space.load(path, read) is None  # now simply missing
    stats = space.stats()
    assert (stats.hits, stats.misses, stats.corrupt, stats.writes) == (1, 2, 1, 1)


def test_namespace_at_another_directory_shares_counters(space: Namespace, tmp_path: Path) -> None:
    other = space.at(tmp_path / "elsewhere")
    other.publish_text(other.entry("k.json"), "{}")
    assert (tmp_path / "elsewhere" / "k.json").read_text() == "{}"
    assert space.stats().writes == 1


_RACE = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from mirage_jax.store import Namespace
    root, log = Path(sys.argv[1]), Path(sys.argv[2])
    ready, go = Path(sys.argv[3]), Path(sys.argv[4])
    space = Namespace("race", root)
    payload = bytes(range(256)) * 4096

    def build(tmp):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\\n")
        with open(tmp, "wb") as f:  # slowly, so the other process arrives while it is written
            for i in range(0, len(payload), 65536):
                f.write(payload[i:i + 65536])
                time.sleep(0.02)

    ready.touch()
    while not go.exists():
        time.sleep(0.001)
    path, built = space.get_or_build(space.entry("k/entry.bin"), build, dict)
    ok = path.read_bytes() == payload
    print(json.dumps({"path": str(path), "built": built, "ok": ok}))
    """)


def test_two_processes_publishing_one_key_build_it_once(tmp_path: Path) -> None:
    root, log = tmp_path / "race", tmp_path / "builds.log"
    results = race(_RACE, lambda ready, go: [str(root), str(log), str(ready), str(go)], tmp_path)
    assert len(log.read_text().split()) == 1  # one build
    assert sorted(r["built"] for r in results) == [False, True]
    assert all(r["ok"] for r in results) and results[0]["path"] == results[1]["path"]
    path = Path(results[0]["path"])
    assert store.verified(path) == path
    assert _leftovers(path.parent) == []
