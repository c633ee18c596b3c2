"""`ToolCache`: results of idempotent tool calls, in an in-memory LRU with an optional SQLite file.

Keys are hashes of (tool, backend id, normalised argument, parameters, format version), so a
change of backend or `topk` never serves a stale answer. Values are JSON (search tools store the
structured hits, formatted on read). Only successful results are stored: errors and timeouts
never are. The SQLite file runs in WAL mode, so several processes (rollout workers, evaluation
shards) can share one cache file safely.

Modes: `rw` (default), `ro` (read; misses go to the backend, nothing is written), `offline`
(a miss is an error observation: reproducible evaluation and CI with no backend).

    >>> cache = ToolCache()
    >>> key = ToolCache.key("search", "bm25:abc", "who founded X", topk=3)
    >>> cache.get(key) is None
    True
    >>> cache.put(key, [{"id": "d1"}])
    >>> cache.get(key), cache.stats()["hits"], cache.stats()["misses"]
    ([{'id': 'd1'}], 1, 1)
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

CACHE_FORMAT_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL
)
"""


class ToolCache:
    """In-memory LRU in front of an optional SQLite store shared by processes.

    Args:
        path: SQLite file; None keeps the cache in memory only.
        max_entries: size of the in-memory LRU (the SQLite file is not bounded).
        mode: `rw`, `ro` or `offline` (see the module docstring).
        busy_timeout_s: how long a writer waits for another process's lock.
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        max_entries: int = 10000,
        mode: Literal["rw", "ro", "offline"] = "rw",
        busy_timeout_s: float = 10.0,
    ) -> None:
        if mode not in ("rw", "ro", "offline"):
            raise ValueError(f"ToolCache mode must be 'rw', 'ro' or 'offline', got {mode!r}")
        if max_entries < 0:
            raise ValueError(f"ToolCache max_entries must be >= 0, got {max_entries}")
        self.path = Path(path) if path is not None else None
        self.max_entries = max_entries
        self.mode = mode
        self.busy_timeout_s = busy_timeout_s
        self._lru: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._conn_pid: int | None = None
        self._counts = {"hits": 0, "misses": 0, "memory_hits": 0, "disk_hits": 0, "puts": 0}
        if self.path is not None:
            if mode != "rw" and not self.path.exists():
                raise FileNotFoundError(
                    f"ToolCache file {self.path} does not exist (mode={mode!r} never creates it)"
                )
            self._connect()

    # -- keys -------------------------------------------------------------------------------------

    @staticmethod
    def key(tool: str, backend: str, arg: str, **params: Any) -> str:
        """Stable key of one call; `arg` should already be normalised by the tool."""
        payload = json.dumps(
            [CACHE_FORMAT_VERSION, tool, backend, arg, sorted(params.items())],
            ensure_ascii=False,
            default=str,
        )
        return f"{tool}:" + hashlib.sha256(payload.encode()).hexdigest()[:40]

    # -- access -----------------------------------------------------------------------------------

    def get(self, key: str) -> Any | None:
        """The cached value, or None on a miss (None itself is never stored)."""
        with self._lock:
            if key in self._lru:
                self._lru.move_to_end(key)
                self._counts["hits"] += 1
                self._counts["memory_hits"] += 1
                return self._lru[key]
            value = self._disk_get(key)
            if value is None:
                self._counts["misses"] += 1
                return None
            self._counts["hits"] += 1
            self._counts["disk_hits"] += 1
            self._remember(key, value)
            return value

    def put(self, key: str, value: Any) -> None:
        """Store a successful result (callers never pass errors). No-op in `ro`/`offline` mode."""
        if value is None:
            raise ValueError("ToolCache cannot store None (it means 'miss')")
        if self.mode != "rw":
            return
        text = json.dumps(value, ensure_ascii=False)
        with self._lock:
            self._counts["puts"] += 1
            # Keep what the reader will get: the JSON round trip (tuples become lists).
            self._remember(key, json.loads(text))
            if self.path is not None:
                conn = self._connect()
                tool = key.split(":", 1)[0]
                with conn:
                    conn.execute(
                        "INSERT OR REPLACE INTO entries (key, tool, value, created) VALUES (?, ?, ?, ?)",
                        (key, tool, text, time.time()),
                    )

    def stats(self) -> dict[str, Any]:
        """Counters since creation: hits, misses, hit_rate, memory/disk hits, puts, sizes."""
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            lookups = out["hits"] + out["misses"]
            out["hit_rate"] = out["hits"] / lookups if lookups else 0.0
            out["memory_entries"] = len(self._lru)
            if self.path is not None:
                out["disk_entries"] = self._connect().execute("SELECT COUNT(*) FROM entries").fetchone()[0]
            return out

    def clear_memory(self) -> None:
        """Forget the in-memory LRU (the SQLite file is untouched)."""
        with self._lock:
            self._lru.clear()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._conn_pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __len__(self) -> int:
        return len(self._lru)

    def __getstate__(self) -> dict[str, Any]:
        # Picklable for worker processes: each process opens its own SQLite connection.
        state = self.__dict__.copy()
        state["_conn"] = None
        state["_conn_pid"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- internals --------------------------------------------------------------------------------

    def _remember(self, key: str, value: Any) -> None:
        if self.max_entries == 0:
            return
        self._lru[key] = value
        self._lru.move_to_end(key)
        while len(self._lru) > self.max_entries:
            self._lru.popitem(last=False)

    def _connect(self) -> sqlite3.Connection:
        # A connection must not cross fork(): reopen in a child process.
        if self._conn is not None and self._conn_pid == os.getpid():
            return self._conn
        assert self.path is not None
        if self.mode == "rw":
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, check_same_thread=False)
        else:
            conn = sqlite3.connect(
                f"file:{self.path}?mode=ro", uri=True, timeout=self.busy_timeout_s, check_same_thread=False
            )
        try:
            if self.mode == "rw":
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute(_SCHEMA)
                conn.commit()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise sqlite3.DatabaseError(
                f"ToolCache file {self.path} is not a usable SQLite cache: {exc}"
            ) from exc
        self._conn, self._conn_pid = conn, os.getpid()
        return conn

    def _disk_get(self, key: str) -> Any | None:
        if self.path is None:
            return None
        row = self._connect().execute("SELECT value FROM entries WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])
