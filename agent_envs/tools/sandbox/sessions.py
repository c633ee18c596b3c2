"""Stateful sessions of the local sandbox: the client side of `session_host.py`.

A session lives in one worker (its interpreter is a process of that worker's namespaces), so every
request of a session goes to that worker. Sessions get workers of their own, apart from the pool
that runs stateless calls: at most `pool_size` of them, each holding many sessions, a new session
going to the one holding the fewest. A session id names its worker and that worker's generation,
so a session whose worker died (and was replaced) is reported lost, never run elsewhere.

    >>> from agent_envs.tools.sandbox.local import LocalSandbox
    >>> sandbox = LocalSandbox(SandboxConfig(timeout_s=5, pool_size=1))
    >>> sid = sandbox.sessions.open()
    >>> _ = sandbox.sessions.run(sid, "x = 41", 5)
    >>> twin = sandbox.sessions.fork(sid, seed=1)
    >>> _ = sandbox.sessions.run(twin, "x += 1", 5)
    >>> sandbox.sessions.run(sid, "x", 5).stdout, sandbox.sessions.run(twin, "x", 5).stdout
    ('41\\n', '42\\n')
    >>> sandbox.close()
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from . import REPLY_GRACE_S, SandboxConfig, SandboxResult, WorkerError

OPEN_TIMEOUT_S = 60.0  # a family's set-up: a fork and a few mounts, on a loaded machine


class SessionLost(Exception):
    """The session's interpreter is gone (killed at a deadline, by a signal, or with its worker)."""


class _Slot:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.worker: Any = None  # the local backend's worker holding this slot's sessions
        self.generation = 0
        self.live: set[str] = set()
        self.opening = 0  # sessions being opened here (counted for the choice of a worker)


class SessionPool:
    """The sessions of one `LocalSandbox` (its `sessions` attribute)."""

    def __init__(self, sandbox: Any) -> None:  # the LocalSandbox that owns this pool
        self.sandbox = sandbox
        self._slots = [_Slot() for _ in range(sandbox.config.pool_size)]
        self._lock = threading.Lock()

    @property
    def config(self) -> SandboxConfig:
        return self.sandbox.config

    def _limits(self, timeout_s: float) -> dict[str, Any]:
        cfg = self.config
        return {"timeout_s": float(timeout_s), "memory_mb": int(cfg.memory_mb), "fsize_mb": int(cfg.fsize_mb),
                "nproc": int(cfg.nproc), "nofile": int(cfg.nofile), "uid": cfg.uid, "gid": cfg.gid,
                "max_capture_bytes": int(cfg.max_capture_bytes)}

    def _request(self, slot: _Slot, message: dict, timeout_s: float) -> dict:
        """One request to the slot's worker (started if needed); the caller holds `slot.lock`."""
        if slot.worker is None:
            slot.worker = self.sandbox._spawn()
        try:
            return slot.worker.request(message, time.monotonic() + timeout_s + REPLY_GRACE_S)
        except WorkerError:
            # Every session of this worker is gone with it; the ids of its generation say so.
            slot.worker.kill()
            slot.worker = None
            slot.generation += 1
            slot.live.clear()
            raise

    def _find(self, sid: str) -> tuple[_Slot, str]:
        index, generation, remote = sid.split(".")
        slot = self._slots[int(index)]
        if int(generation) != slot.generation:
            raise SessionLost("its sandbox worker died and was replaced")
        return slot, remote

    def open(self) -> str:
        """A new session (an empty interpreter with the preamble imported); raises WorkerError."""
        with self._lock:
            index = min(range(len(self._slots)), key=lambda i: len(self._slots[i].live) + self._slots[i].opening)
            slot = self._slots[index]
            slot.opening += 1
        try:
            with slot.lock:
                reply = self._request(slot, {"op": "session_open", **self._limits(self.config.timeout_s)},
                                      OPEN_TIMEOUT_S)
                if "sid" not in reply:
                    raise SessionLost(reply.get("lost", "the session could not start"))
                sid = f"{index}.{slot.generation}.{reply['sid']}"
                slot.live.add(sid)
                return sid
        finally:
            with self._lock:
                slot.opening -= 1

    def run(self, sid: str, code: str, timeout_s: float | None = None) -> SandboxResult:
        """Run one cell. A lost session answers with `metadata["session_lost"]` set (why), and
        `metadata["session_ran"]` False when the cell did not run at all (the session was gone)."""
        timeout = float(timeout_s if timeout_s is not None else self.config.timeout_s)
        try:
            slot, remote = self._find(sid)
            with slot.lock:
                if sid not in slot.live:
                    raise SessionLost("it was closed or its worker was replaced")
                reply = self._request(slot, {"op": "session_run", "sid": remote, "code": code,
                                             **self._limits(timeout)}, timeout)
        except (SessionLost, WorkerError) as exc:
            return SandboxResult(exit_code=None, metadata={"session_lost": str(exc), "session_ran": False})
        if "stdout" not in reply:
            lost = reply.get("lost", "unknown")
            return SandboxResult(exit_code=None, metadata={"session_lost": lost, "session_ran": False})
        return SandboxResult.from_reply(
            reply, metadata={"session_lost": reply["lost"], "session_ran": True} if reply["lost"] else {})

    def fork(self, sid: str, seed: int) -> str:
        """A copy-on-write fork of the session's interpreter; raises SessionLost or WorkerError."""
        slot, remote = self._find(sid)
        with slot.lock:
            if sid not in slot.live:
                raise SessionLost("it was closed or its worker was replaced")
            reply = self._request(slot, {"op": "session_fork", "sid": remote, "seed": int(seed)}, 30.0)
            if "sid" not in reply:
                raise SessionLost(reply.get("lost") or reply.get("refused") or "the fork failed")
            child = f"{sid.split('.')[0]}.{slot.generation}.{reply['sid']}"
            slot.live.add(child)
            return child

    def close(self, sid: str) -> None:
        """End the session (its interpreter and, with its last member, its family); idempotent."""
        try:
            slot, remote = self._find(sid)
        except SessionLost:
            return
        with slot.lock:
            if sid not in slot.live:
                return
            slot.live.discard(sid)
            if slot.worker is not None:
                with contextlib.suppress(WorkerError):
                    self._request(slot, {"op": "session_close", "sid": remote}, 10.0)

    def live(self) -> int:
        """How many sessions are open."""
        return sum(len(slot.live) for slot in self._slots)

    def worker_pids(self) -> list[int]:
        """Process ids of the workers holding sessions."""
        return [slot.worker.proc.pid for slot in self._slots if slot.worker is not None]

    def close_all(self) -> None:
        """Stop the session workers: every session ends with them."""
        for slot in self._slots:
            with slot.lock:
                if slot.worker is not None:
                    slot.worker.close()
                    slot.worker = None
                    slot.generation += 1
                slot.live.clear()
