"""The symbolic stage of math grading, run in worker processes with a hard wall-clock timeout.

sympy can take minutes on an adversarial expression, and signal-based timeouts only work on the
main thread. Each check therefore goes to a worker process (`_symbolic_worker.py`, a plain
script speaking JSON lines over pipes); when a reply does not arrive in time the worker is
terminated and reaped, and a fresh one starts on the next call. This works from any thread and
from code running inside asyncio (call it through `asyncio.to_thread` to keep the loop free).
POSIX only (uses `select` on pipes).

    >>> from agent_envs.rewards.symbolic import symbolic_equal
    >>> symbolic_equal("\\\\sqrt{8}", ["2\\\\sqrt{2}"], timeout=5.0)[:2]
    ('2\\\\sqrt{2}', 'math_verify')
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

WORKER = Path(__file__).with_name("_symbolic_worker.py")
STARTUP_TIMEOUT_S = 60.0


class _Worker:
    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-P", str(WORKER)],  # -P: this folder holds a math.py
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            bufsize=0,
        )
        self._buf = b""
        self._ids = itertools.count()
        if json.loads(self._readline(time.monotonic() + STARTUP_TIMEOUT_S)).get("ready") is not True:
            raise RuntimeError("symbolic worker did not start")

    def _readline(self, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("symbolic worker exited")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def check(self, pred: str, golds: list[str], timeout: float) -> dict:
        rid = next(self._ids)
        self.proc.stdin.write((json.dumps({"id": rid, "pred": pred, "golds": golds}) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self._readline(deadline))
            if reply.get("id") == rid or reply.get("id") is None:
                return reply

    def kill(self) -> None:
        """Terminate and reap, so no zombie is left behind."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()


class SymbolicPool:
    """Up to `max_workers` worker processes, started on demand and reused."""

    def __init__(self, max_workers: int = 2) -> None:
        self.max_workers = max_workers
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._lock = threading.Lock()
        self._count = 0
        self._pid = os.getpid()
        self.timeouts = 0

    def _acquire(self) -> _Worker:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            start = self._count < self.max_workers
            if start:
                self._count += 1
        if not start:
            return self._idle.get()
        try:
            return _Worker()
        except BaseException:
            with self._lock:
                self._count -= 1
            raise

    def _discard(self, w: _Worker) -> None:
        w.kill()
        with self._lock:
            self._count -= 1

    def check(self, pred: str, golds: list[str], timeout: float) -> tuple[str | None, str, str | None]:
        """(matching gold or None, method, error or None)."""
        w = self._acquire()
        try:
            reply = w.check(pred, golds, timeout)
        except TimeoutError:
            self.timeouts += 1
            self._discard(w)
            return None, "timeout", f"symbolic check took longer than {timeout:g}s; worker killed"
        except (EOFError, OSError, ValueError) as e:
            self._discard(w)
            return None, "symbolic", f"symbolic worker failed: {type(e).__name__}: {e}"
        except BaseException:
            self._discard(w)
            raise
        self._idle.put(w)
        return reply.get("match"), reply.get("method", "symbolic"), reply.get("error")

    def warmup(self) -> None:
        """Start one worker now (about a second), so the first grading call pays no start-up."""
        self._idle.put(self._acquire())

    def close(self) -> None:
        while True:
            try:
                w = self._idle.get_nowait()
            except queue.Empty:
                return
            self._discard(w)


_POOL: SymbolicPool | None = None
_POOL_LOCK = threading.Lock()


def default_pool() -> SymbolicPool:
    """The process-wide pool (a forked child gets its own, never its parent's pipes)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._pid != os.getpid():
            _POOL = SymbolicPool(max_workers=int(os.environ.get("AGENT_ENVS_MATH_WORKERS", "2")))
        return _POOL


def symbolic_equal(pred: str, golds: list[str], timeout: float = 1.0) -> tuple[str | None, str, str | None]:
    """(first gold that math-verify or sympy finds equivalent to `pred`, or None; method; error)."""
    return default_pool().check(pred, golds, timeout)


def warmup() -> None:
    default_pool().warmup()


@atexit.register
def _close_default_pool() -> None:
    if _POOL is not None and _POOL._pid == os.getpid():
        _POOL.close()
