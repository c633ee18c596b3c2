"""ToolCache: LRU order, counters, keys, SQLite persistence, modes, and two real processes sharing a file."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import sqlite3
from pathlib import Path

import pytest

from agent_envs.remote import ToolCache
from agent_envs.retrieval import BM25Backend, SearchBackend
from agent_envs.tools import SearchTool


def test_lru_evicts_least_recently_used_and_counts() -> None:
    cache = ToolCache(max_entries=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)  # evicts b
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["puts"], stats["memory_entries"]) == (3, 1, 3, 2)
    assert stats["hit_rate"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="cannot store None"):
        cache.put("x", None)


def test_keys_depend_on_tool_backend_argument_and_params() -> None:
    k = ToolCache.key("search", "bm25:1", "q", topk=3)
    assert k == ToolCache.key("search", "bm25:1", "q", topk=3) and k.startswith("search:")
    others = [
        ToolCache.key("browse", "bm25:1", "q", topk=3),
        ToolCache.key("search", "bm25:2", "q", topk=3),
        ToolCache.key("search", "bm25:1", "Q", topk=3),
        ToolCache.key("search", "bm25:1", "q", topk=5),
    ]
    assert len({k, *others}) == 5


def test_sqlite_persists_across_instances_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "tools.sqlite"
    first = ToolCache(path, max_entries=1)
    first.put("k1", [{"id": "d1", "score": 1.5}])
    first.put("k2", {"text": "page"})  # pushes k1 out of memory, not off disk
    assert first.get("k1") == [{"id": "d1", "score": 1.5}] and first.stats()["disk_hits"] == 1
    first.close()
    second = ToolCache(path)
    assert second.get("k2") == {"text": "page"} and second.stats()["disk_entries"] == 2
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_read_only_and_offline_modes_never_write(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    ToolCache(path).put("k", 1)
    ro = ToolCache(path, mode="ro")
    ro.put("new", 2)
    assert ro.get("k") == 1 and ro.get("new") is None and ro.stats()["disk_entries"] == 1
    with pytest.raises(FileNotFoundError, match="never creates it"):
        ToolCache(tmp_path / "absent.sqlite", mode="offline")
    with pytest.raises(ValueError, match="mode must be"):
        ToolCache(mode="append")  # type: ignore[arg-type]


def test_a_file_that_is_not_sqlite_gets_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "notes.sqlite"
    bad.write_text("this is not a database" * 100)
    with pytest.raises(sqlite3.DatabaseError, match="notes.sqlite is not a usable SQLite cache"):
        ToolCache(bad)


class _Broken(SearchBackend):
    backend_id = "broken"

    async def search(self, queries, topk=3):  # type: ignore[no-untyped-def]
        raise ConnectionError("index offline")


def test_errors_are_never_cached(tmp_path: Path) -> None:
    cache = ToolCache(tmp_path / "c.sqlite")
    res = SearchTool(_Broken(), cache=cache).run("q")
    assert not res.ok and cache.stats()["puts"] == 0 and cache.stats()["disk_entries"] == 0
    ok = SearchTool(BM25Backend([{"id": "a", "text": "river"}]), cache=cache)
    assert ok.run("nothing here").error == "no_results"  # a successful empty answer is cached
    assert ok.run("nothing here").cached and cache.stats()["disk_entries"] == 1


def _writer(path: str, worker: int, n: int, barrier) -> dict:  # runs in a child process
    cache = ToolCache(path)
    barrier.wait()  # both processes write at the same time
    for i in range(n):
        cache.put(f"own-{worker}-{i}", {"worker": worker, "i": i})
        cache.put(f"shared-{i}", {"i": i})  # both write the same keys: last writer wins, no error
    barrier.wait()  # now read what the other process wrote
    other = 1 - worker
    seen = sum(cache.get(f"own-{other}-{i}") == {"worker": other, "i": i} for i in range(n))
    return {"seen_other": seen, **cache.stats()}


@pytest.mark.slow
def test_two_processes_share_one_sqlite_file(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.sqlite")
    ToolCache(path).close()  # create the schema once, as a launcher would
    ctx = mp.get_context("spawn")
    n = 150
    with ctx.Manager() as manager:
        barrier = manager.Barrier(2)
        with ctx.Pool(2) as pool:
            results = pool.starmap(_writer, [(path, 0, n, barrier), (path, 1, n, barrier)])
    for r in results:
        assert r["seen_other"] == n and r["disk_hits"] == n and r["puts"] == 2 * n
    parent = ToolCache(path)
    assert parent.stats()["disk_entries"] == 3 * n
    assert all(parent.get(f"own-{w}-{i}") == {"worker": w, "i": i} for w in (0, 1) for i in range(n))
    assert parent.get("shared-7") == {"i": 7}


def test_cache_pickles_for_worker_processes(tmp_path: Path) -> None:
    cache = ToolCache(tmp_path / "c.sqlite")
    cache.put("k", "v")
    clone = pickle.loads(pickle.dumps(cache))
    clone.clear_memory()
    assert clone.get("k") == "v" and clone.stats()["disk_hits"] == 1
