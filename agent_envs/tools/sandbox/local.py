"""The local sandbox: a bounded pool of warm fork-server workers, one isolated child per call.

Each worker (`worker.py`, started lazily with a scrubbed environment) imports the preamble once and
enters its own network, mount, pid, IPC and UTS namespaces (plus a user namespace when not root),
behind a read-only root made of bind mounts of the system and Python directories. Every call runs
in a child that is pid 1 of a fresh pid namespace, with a fresh /proc and a fresh tmpfs working
directory, rlimits (address space, CPU, processes, file size, open files), no capabilities (or an
unprivileged uid when run as root) and no inherited file descriptors; the worker forks and isolates
it before the request arrives, so a call costs about as much as the code itself. The deadline kills
the call's pid namespace; everything is reaped. Where the kernel refuses a namespace the worker falls back to
what remains and this module logs, once, which guarantee is weaker.

    >>> sandbox = LocalSandbox(SandboxConfig(timeout_s=2, pool_size=1, preamble=("math",)))
    >>> sandbox.execute("math.factorial(5)").stdout
    '120\\n'
    >>> sandbox.close()
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from . import REPLY_GRACE_S, Sandbox, SandboxConfig, SandboxResult, WorkerError
from .sessions import SessionPool
from .worker import clean_env

log = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
STARTUP_TIMEOUT_S = 120.0  # importing a heavy preamble (sympy, numpy) on a loaded machine
_warned: set[str] = set()
_warned_lock = threading.Lock()
_live: weakref.WeakSet[LocalSandbox] = weakref.WeakSet()


def _warn_once(message: str) -> None:
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    log.warning("python sandbox: %s", message)


def worker_env() -> dict[str, str]:
    """The whole environment of a worker (and so of the code): nothing is inherited."""
    return clean_env("/tmp")


class _Worker:
    """One fork-server process and its pipes. Not thread-safe: the pool lends it to one caller."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in _close_pipes)
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            cwd="/",
            close_fds=True,
            start_new_session=True,  # its own process group, killed as a whole
        )
        self.calls = 0
        self.scratch: str | None = None  # the calls' directories when there is no mount namespace
        try:
            hello = self._recv(time.monotonic() + STARTUP_TIMEOUT_S)
        except WorkerError:
            self.kill()
            raise
        if not hello.get("ready"):
            self.kill()
            raise WorkerError(hello.get("error", "worker failed to start"))
        self.isolation: dict[str, Any] = hello["isolation"]
        self.scratch = hello.get("scratch")

    def _stderr_tail(self) -> str:
        with contextlib.suppress(Exception):
            self._stderr.seek(0)
            return self._stderr.read()[-2000:].decode("utf-8", "replace").strip()
        return ""

    def _recv(self, deadline: float) -> dict:
        fd = self.proc.stdout.fileno()
        buf = bytearray()
        need = 4
        header_done = False
        while len(buf) < need:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise WorkerError("worker did not answer in time")
            chunk = os.read(fd, need - len(buf))
            if not chunk:
                self.proc.wait(timeout=5)
                raise WorkerError(f"{self.exit_reason()}: {self._stderr_tail()}".rstrip(": "))
            buf += chunk
            if not header_done and len(buf) == 4:
                need = 4 + struct.unpack(">I", buf)[0]
                header_done = True
        return json.loads(bytes(buf[4:]))

    def exit_reason(self) -> str:
        """How the worker ended, for the error the caller reads (e.g. killed by the OOM killer)."""
        code = self.proc.returncode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"the worker process was killed by {name}"
        return f"the worker process exited with status {code}"

    def request(self, message: dict, deadline: float) -> dict:
        data = json.dumps(message).encode()
        try:
            self.proc.stdin.write(struct.pack(">I", len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            raise WorkerError(f"{self.exit_reason()} ({exc}): {self._stderr_tail()}".rstrip(": ")) from exc
        reply = self._recv(deadline)
        self.calls += 1
        if "error" in reply:
            raise WorkerError(reply["error"])
        return reply

    def kill(self) -> None:
        """Kill the worker's whole process group (its pid namespace goes with it) and reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        self._close_pipes()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def close(self) -> None:
        """Ask politely (EOF on its channel), then kill."""
        with contextlib.suppress(Exception):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        self.kill()

    def _close_pipes(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self._stderr):
            with contextlib.suppress(Exception):
                stream.close()


class LocalSandbox(Sandbox):
    """Warm workers, started on first use, at most `config.pool_size` at a time."""

    native_sessions = True

    def __init__(self, config: SandboxConfig | None = None) -> None:
        super().__init__(config or SandboxConfig())
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._slots = threading.BoundedSemaphore(self.config.pool_size)
        self._env: dict[str, str] | None = None
        self._isolation: dict[str, Any] = {}
        self._closed = False
        self.sessions = SessionPool(self)  # stateful interpreters, on workers of their own
        _live.add(self)

    @property
    def isolation(self) -> dict[str, Any]:
        return dict(self._isolation)

    def start(self) -> None:
        """Start every worker now rather than on first use (a service does, before it listens)."""
        with self._lock:
            self._closed = False
            missing = self.config.pool_size - len(self._idle)
        started = []
        try:
            for _ in range(missing):
                started.append(self._spawn())
        finally:
            with self._lock:
                self._idle.extend(started)

    def worker_pids(self) -> list[int]:
        """Process ids of the idle workers (busy ones are lent out)."""
        with self._lock:
            return [worker.proc.pid for worker in self._idle]

    def worker_command(self) -> tuple[list[str], dict[str, str]]:
        """How a worker starts: its command line and its whole environment (nothing inherited)."""
        if self._env is None:
            self._env = worker_env()
        config = {"preamble": list(self.config.preamble), "namespaces": self.config.namespaces}
        return [sys.executable, "-I", str(WORKER_SCRIPT), "serve", json.dumps(config)], self._env

    def _spawn(self) -> _Worker:
        worker = _Worker(*self.worker_command())
        self._isolation = worker.isolation
        for message in worker.isolation.get("warnings", []):
            _warn_once(message)
        return worker

    def execute(self, code: str, timeout_s: float | None = None) -> SandboxResult:
        timeout = float(timeout_s if timeout_s is not None else self.config.timeout_s)
        request = {
            "code": code,
            "timeout_s": timeout,
            "memory_mb": int(self.config.memory_mb),
            "fsize_mb": int(self.config.fsize_mb),
            "nproc": int(self.config.nproc),
            "nofile": int(self.config.nofile),
            "max_capture_bytes": int(self.config.max_capture_bytes),
            "uid": self.config.uid,
            "gid": self.config.gid,
        }
        with self._slots:
            with self._lock:
                self._closed = False
                worker = self._idle.pop() if self._idle else None
            try:
                if worker is None:
                    worker = self._spawn()
                reply = worker.request(request, time.monotonic() + timeout + REPLY_GRACE_S)
            except WorkerError as exc:
                if worker is not None:
                    worker.kill()
                return SandboxResult(exit_code=None, error=f"sandbox worker failed: {exc}")
            with self._lock:
                if self._closed:
                    worker.close()
                else:
                    self._idle.append(worker)
        return SandboxResult.from_reply(
            reply,
            error="sandbox setup failed: " + reply["stderr"].strip() if reply["setup_failed"] else None,
            metadata={"worker_calls": worker.calls},
        )

    def close(self) -> None:
        """Stop idle workers now; busy ones are stopped when their call returns."""
        with self._lock:
            self._closed = True
            workers, self._idle = self._idle, []
        for worker in workers:
            worker.close()
        self.sessions.close_all()


@atexit.register
def _close_all() -> None:
    for sandbox in list(_live):
        with contextlib.suppress(Exception):
            sandbox.close()


__all__ = ["LocalSandbox", "WorkerError", "worker_env"]
