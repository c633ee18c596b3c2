"""The Docker sandbox: a pool of warm, network-less containers, one fresh process per call.

Each container runs the local backend's fork server (`worker.py serve`) as its only program,
started by the `docker` command line (`docker run -i --init`) and spoken to over its stdin and
stdout, exactly like a local worker. The container is the boundary: no network
(`--network none`), a read-only root file system with a tmpfs `/tmp`, memory, CPU and pid limits,
all capabilities dropped, `no-new-privileges`, an unprivileged uid and only the sandbox's own
environment. Inside it every call runs in a freshly forked child with the per-call rlimits. After
each call the worker kills every process the call left behind and empties `/tmp` and `/dev/shm`,
so nothing passes from one call to the next. Starting a container costs about half a second, once
per worker; a call then costs milliseconds (docs/benchmarks.md).

Images cannot always be pulled; one builds without a registry (Debian's debootstrap):

    debootstrap --variant=minbase --include=python3 bookworm ROOT
    ln -s python3 ROOT/usr/bin/python && tar -C ROOT -c . | docker import - agent-envs-sandbox

The example needs a running Docker daemon, which no offline stand-in can replace, so it is not
run as a doctest (tests/tools/test_sandbox_docker.py runs this backend when a daemon is present):

    >>> sandbox = DockerSandbox(SandboxConfig(timeout_s=10, docker_image="agent-envs-sandbox"))  # doctest: +SKIP
    >>> sandbox.execute("print(1 + 1)").stdout  # doctest: +SKIP
    '2\\n'
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import uuid
from typing import Any

from . import SandboxConfig, SandboxResult
from .local import WORKER_SCRIPT, LocalSandbox
from .worker import clean_env

CONTAINER_PREFIX = "agent-envs-sandbox-"


class DockerSandbox(LocalSandbox):
    """Warm containers, started on first use, at most `config.pool_size` at a time."""

    native_sessions = False  # a container's worker resets it after each call: sessions are replayed

    def __init__(self, config: SandboxConfig | None = None) -> None:
        super().__init__(config)
        self._engine_error: str | None = None
        self._engine_checked = False
        self._names: set[str] = set()
        self._names_lock = threading.Lock()
        self._worker_source = WORKER_SCRIPT.read_text()

    @property
    def isolation(self) -> dict[str, Any]:
        return {"user": "container", "net": True, "mount": True, "pid": True, "warnings": []}

    def check_engine(self) -> str | None:
        """None when a Docker engine answers; otherwise what is wrong and what to do."""
        if not self._engine_checked:
            self._engine_checked = True
            docker = shutil.which("docker")
            if docker is None:
                self._engine_error = "the docker backend needs the `docker` command (e.g. apt install docker.io)"
            else:
                done = subprocess.run([docker, "version", "--format", "{{.Server.Version}}"],
                                      capture_output=True, text=True, timeout=30, check=False)
                if done.returncode != 0:
                    self._engine_error = (
                        f"no Docker engine reachable ({done.stderr.strip()[:200]}); start Docker or set "
                        "DOCKER_HOST, or use backend='local'"
                    )
        return self._engine_error

    def container_options(self) -> list[str]:
        """The `docker run` options of a worker container (exposed so the limits can be checked)."""
        cfg = self.config
        options = [
            "--network", "none",
            "--read-only",
            "--tmpfs", f"/tmp:size={cfg.fsize_mb}m,mode=1777",
            "--workdir", "/tmp",
            "--user", f"{cfg.uid}:{cfg.gid}",
            "--memory", f"{cfg.memory_mb}m",
            "--memory-swap", f"{cfg.memory_mb}m",
            "--cpus", f"{cfg.docker_cpus:g}",
            "--pids-limit", str(cfg.nproc),
            "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges",
            "--ulimit", f"fsize={cfg.fsize_mb * 1024 * 1024}",
            "--ulimit", f"nofile={cfg.nofile}",
        ]
        for key, value in clean_env("/tmp").items():
            options += ["--env", f"{key}={value}"]
        return options

    def worker_command(self) -> tuple[list[str], dict[str, str]]:
        name = f"{CONTAINER_PREFIX}{uuid.uuid4().hex[:12]}"
        with self._names_lock:
            self._names.add(name)
        config = {"preamble": list(self.config.preamble), "container": True}
        argv = [shutil.which("docker") or "docker", "run", "-i", "--rm", "--init", "--name", name,
                *self.container_options(), self.config.docker_image,
                "python", "-I", "-c", self._worker_source, "serve", json.dumps(config)]
        # the docker client itself needs the caller's environment (DOCKER_HOST, HOME, PATH);
        # the code inside sees only the scrubbed one passed with --env
        return argv, dict(os.environ)

    def execute(self, code: str, timeout_s: float | None = None) -> SandboxResult:
        error = self.check_engine()
        if error is not None:
            return SandboxResult(exit_code=None, error=error)
        return super().execute(code, timeout_s)

    def close(self) -> None:
        """Stop the workers, then remove any container a killed worker client left running."""
        super().close()
        with self._names_lock:
            names, self._names = sorted(self._names), set()
        docker = shutil.which("docker")
        if names and docker:
            with contextlib.suppress(Exception):
                subprocess.run([docker, "rm", "-f", *names], capture_output=True, timeout=60, check=False)


__all__ = ["CONTAINER_PREFIX", "DockerSandbox"]
