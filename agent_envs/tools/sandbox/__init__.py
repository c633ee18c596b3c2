"""Sandboxes that run untrusted Python code: the configuration, the result, and the backends.

`local` (default) keeps warm fork-server workers and isolates every call with Linux namespaces and
rlimits (see `local.py` and docs/tools-and-sandbox.md); `docker` runs each call in a throwaway
container; `service` sends the code to a shared pool of local workers (`agent-envs serve-sandbox`,
see `service.py`). All take the same `SandboxConfig` and return a `SandboxResult`; `PythonTool`
turns that into what the model reads.

    >>> sandbox = make_sandbox("local", SandboxConfig(timeout_s=5, pool_size=1))
    >>> sandbox.execute("x = 6*7\\nx").stdout
    '42\\n'
    >>> sandbox.close()
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

REPLY_GRACE_S = 5.0  # beyond a call's own deadline, before a worker itself is presumed stuck


class WorkerError(RuntimeError):
    """A sandbox worker process died, hung or answered nonsense."""

BACKENDS = ("local", "docker", "service")


@dataclass
class SandboxConfig:
    """Limits and options of a sandbox; per-call limits apply to each execution separately."""

    timeout_s: float = 10.0  # wall clock; the whole call (its pid namespace / process group) is killed
    memory_mb: int = (
        2048  # RLIMIT_AS (local; includes the preamble already in memory) / memory limit (docker)
    )
    fsize_mb: int = 16  # largest file the code may write (RLIMIT_FSIZE), and the working tmpfs size
    nproc: int = 64  # processes of the sandbox user (RLIMIT_NPROC) / docker pids limit
    nofile: int = 256  # open files (RLIMIT_NOFILE)
    preamble: tuple[str, ...] = ()  # modules imported before each call: "math", "numpy as np"
    pool_size: int = field(default_factory=lambda: min(8, os.cpu_count() or 2))  # warm workers (local)
    namespaces: bool = True  # local: False keeps only rlimits, env scrubbing and a temp dir (weaker)
    uid: int = 65534  # local, when run as root: the unprivileged uid/gid the code runs as
    gid: int = 65534
    max_capture_bytes: int = 256 * 1024  # per stream, head and tail each; the rest is counted, not kept
    docker_image: str = "python:3.11-slim"
    docker_cpus: float = 1.0
    service_url: str = ""  # service: where `agent-envs serve-sandbox` listens, e.g. http://127.0.0.1:8100

    def validate(self) -> SandboxConfig:
        for name in (
            "timeout_s",
            "memory_mb",
            "fsize_mb",
            "nproc",
            "nofile",
            "pool_size",
            "max_capture_bytes",
            "docker_cpus",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"SandboxConfig.{name} must be a positive number, got {value!r}")
        self.preamble = tuple(self.preamble)
        for entry in self.preamble:
            parts = entry.split() if isinstance(entry, str) else []
            if not (len(parts) == 1 or (len(parts) == 3 and parts[1] == "as")):
                raise ValueError(
                    f"SandboxConfig.preamble entry {entry!r}: expected 'module' or 'module as alias'"
                )
        return self


@dataclass
class SandboxResult:
    """What one execution produced.

    `exit_code` is None on timeout and negative when the code was killed by a signal. `error` is set
    when the sandbox itself failed (the code's own exceptions are in `stderr`, not here).
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = 0
    timed_out: bool = False
    elapsed_s: float = 0.0
    dropped_bytes: int = 0  # output bytes dropped from the middle by the capture limit
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_reply(cls, reply: dict[str, Any], **extra: Any) -> SandboxResult:
        """The result a worker's reply to a call or a session cell reports (`extra`: error, metadata)."""
        return cls(stdout=reply["stdout"], stderr=reply["stderr"], exit_code=reply["exit_code"],
                   timed_out=reply["timed_out"], elapsed_s=reply["elapsed_s"],
                   dropped_bytes=reply["stdout_dropped"] + reply["stderr_dropped"], **extra)


class Sandbox(ABC):
    """A backend. `execute` is blocking and thread-safe; callers run it in threads for concurrency.

    `native_sessions`: the backend keeps live interpreters that fork (`sessions`, a `SessionPool`);
    elsewhere a session is replayed from its cell log (see `agent_envs.tools.python`).
    """

    native_sessions = False

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config.validate()

    @abstractmethod
    def execute(self, code: str, timeout_s: float | None = None) -> SandboxResult: ...

    @abstractmethod
    def close(self) -> None:
        """Stop warm workers / containers; the sandbox restarts them lazily if used again."""

    @property
    def isolation(self) -> dict[str, Any]:
        """Which guarantees hold (as far as known yet)."""
        return {}


def make_sandbox(backend: str, config: SandboxConfig) -> Sandbox:
    """The sandbox named `backend` ("local", "docker" or "service")."""
    if backend == "local":
        from .local import LocalSandbox

        return LocalSandbox(config)
    if backend == "docker":
        from .docker import DockerSandbox

        return DockerSandbox(config)
    if backend == "service":
        from .service import ServiceSandbox

        return ServiceSandbox(config)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Sandbox", "SandboxConfig", "SandboxResult", "make_sandbox"]
