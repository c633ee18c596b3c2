"""The Docker sandbox: each call runs in a fresh, throwaway container (needs the `docker` SDK).

The container has no network (`network_mode="none"`), a read-only root file system with a tmpfs
working directory, memory, CPU and pid limits, all capabilities dropped, `no-new-privileges`, an
unprivileged user and only the sandbox's own environment. The code runs through the same runner
as the local backend (`worker.py once`), so echo and error output are identical. A container
costs hundreds of milliseconds, so this backend suits hostile or multi-tenant use, not speed.

The example needs a running Docker daemon, which no offline stand-in can replace, so it is
not run as a test (tests/tools runs this backend when a daemon is present):

    >>> sandbox = DockerSandbox(SandboxConfig(timeout_s=10))  # doctest: +SKIP
    >>> sandbox.execute("print(1 + 1)").stdout  # doctest: +SKIP
    '2\\n'
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from . import Sandbox, SandboxConfig, SandboxResult
from .worker import clean_env

WORKER_SOURCE_PATH = Path(__file__).with_name("worker.py")


class DockerSandbox(Sandbox):
    """One container per call; the client is created on first use."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        super().__init__(config or SandboxConfig())
        self._client: Any = None
        self._lock = threading.Lock()
        self._runner = WORKER_SOURCE_PATH.read_text()

    @property
    def isolation(self) -> dict[str, Any]:
        return {"user": "container", "net": True, "mount": True, "pid": True, "warnings": []}

    def client(self) -> Any:
        """The Docker client; raises RuntimeError with what to do when no engine is reachable."""
        with self._lock:
            if self._client is None:
                try:
                    import docker
                except ImportError as exc:
                    raise RuntimeError(
                        "the docker backend needs the docker SDK: pip install 'agent-envs[docker]'"
                    ) from exc
                try:
                    client = docker.from_env()
                    client.ping()
                except Exception as exc:
                    raise RuntimeError(
                        f"no Docker engine reachable ({type(exc).__name__}: {exc}); start Docker or set DOCKER_HOST, "
                        "or use backend='local'"
                    ) from exc
                self._client = client
            return self._client

    def container_options(self, code: str) -> dict[str, Any]:
        """Arguments of `containers.run` for one call (exposed so the limits can be checked)."""
        cfg = self.config
        command = ["python", "-I", "-c", self._runner, "once", code, json.dumps(list(cfg.preamble))]
        return {
            "image": cfg.docker_image,
            "command": command,
            "detach": True,
            "network_mode": "none",
            "read_only": True,
            "tmpfs": {"/tmp": f"size={cfg.fsize_mb}m,mode=1777"},
            "working_dir": "/tmp",
            "environment": clean_env("/tmp"),
            "user": f"{cfg.uid}:{cfg.gid}",
            "mem_limit": f"{cfg.memory_mb}m",
            "memswap_limit": f"{cfg.memory_mb}m",
            "nano_cpus": int(cfg.docker_cpus * 1e9),
            "pids_limit": cfg.nproc,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "ulimits": [_ulimit("fsize", cfg.fsize_mb * 1024 * 1024), _ulimit("nofile", cfg.nofile)],
            "stdin_open": False,
        }

    def execute(self, code: str, timeout_s: float | None = None) -> SandboxResult:
        timeout = float(timeout_s if timeout_s is not None else self.config.timeout_s)
        try:
            client = self.client()
        except RuntimeError as exc:
            return SandboxResult(exit_code=None, error=str(exc))
        start = time.monotonic()
        container = None
        try:
            container = client.containers.run(**self.container_options(code))
            timed_out = False
            try:
                status = container.wait(timeout=timeout)
                exit_code = int(status.get("StatusCode", 1))
            except Exception:  # requests' ReadTimeout/ConnectionError: the deadline passed
                timed_out = True
                exit_code = None
                container.kill()
            elapsed = time.monotonic() - start
            stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
        except Exception as exc:
            return SandboxResult(exit_code=None, error=f"docker run failed: {type(exc).__name__}: {exc}")
        finally:
            if container is not None:
                with contextlib.suppress(Exception):
                    container.remove(force=True)
        if exit_code == 137 and not timed_out:
            exit_code = -9  # killed by the OOM killer: report it as the signal, like the local backend
        return SandboxResult(
            stdout=stdout, stderr=stderr, exit_code=exit_code, timed_out=timed_out, elapsed_s=elapsed
        )

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def _ulimit(name: str, value: int) -> Any:
    from docker.types import Ulimit

    return Ulimit(name=name, soft=value, hard=value)


__all__ = ["DockerSandbox"]
