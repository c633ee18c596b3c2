"""Real servers the tests start on 127.0.0.1: free ports, and a vLLM OpenAI-compatible server.

Imported as `tests.servers` (the repository root is on the test path)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port on 127.0.0.1 that is free when checked, drawn below the kernel's ephemeral range.

    A port from `bind(("127.0.0.1", 0))` comes from that range, and so does the local port of every
    outgoing connection on the machine: between this check and the server's own bind, another
    test worker's client (a load test opens thousands) can take it, and the server fails with
    EADDRINUSE. Below the range only another `free_port` can collide."""
    low = _ephemeral_low()
    draw = random.Random()  # not the global one, which tests seed
    for _ in range(200):
        port = draw.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # all taken: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def vllm_command(model: str | Path, name: str, port: int, *extra: str) -> list[str]:
    """vLLM's own server for a tiny model on CPU (float32, no compilation)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager", *extra]


@contextlib.contextmanager
def running_server(cmd: Sequence[str], port: int, log: Path, env: dict[str, str] | None = None,
                   ready_path: str = "/health", timeout_s: float = 300) -> Iterator[str]:
    """Start `cmd`, wait until `ready_path` answers 200, yield `http://127.0.0.1:PORT`, then stop it
    (SIGTERM to its process group, SIGKILL after 30 s). A server that exits or never answers fails
    the test with the end of its log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    with open(log, "w") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{cmd[2]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + ready_path, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{cmd[2]} did not answer in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
