"""The one start/stop of every server (agent_envs/server/serving.py): a real app on a free port that
answers and stops, a port in use refused with the line `agent-envs` prints, and each server's
command under `--port 0` printing the port it bound, answering there and stopping on SIGTERM."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web

from agent_envs.cli import describe_mistake
from agent_envs.server.serving import AppServer, InThread, bind
from tests.servers import REPO


class _Hello(AppServer):
    started = 0
    cleaned = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._hello)
        app.on_startup.append(self._count_start)
        app.on_cleanup.append(self._count_cleanup)
        return app

    async def _hello(self, request: web.Request) -> web.Response:
        return web.Response(text="hello")

    async def _count_start(self, app: web.Application) -> None:
        self.started += 1

    async def _count_cleanup(self, app: web.Application) -> None:
        self.cleaned += 1


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


async def test_a_server_on_port_0_answers_on_the_port_it_names_and_stops():
    server = _Hello()
    url = await server.start(port=0)
    port = int(url.rsplit(":", 1)[1])
    assert url == f"http://127.0.0.1:{port}" and port > 0 and server.url == url
    assert await asyncio.to_thread(_get, url + "/") == b"hello"
    await server.stop()
    assert (server.started, server.cleaned) == (1, 1)  # the app's startup and cleanup both ran
    with pytest.raises(OSError):  # nothing listens there any more
        await asyncio.to_thread(_get, url + "/")
    await server.stop()  # a second stop is harmless


async def test_a_port_in_use_is_refused_before_the_app_starts_with_the_cli_line():
    taken = bind("127.0.0.1", 0)
    port = taken.getsockname()[1]
    server = _Hello()
    try:
        with pytest.raises(OSError) as caught:
            await server.start(port=port)
    finally:
        taken.close()
    assert caught.value.errno == errno.EADDRINUSE
    assert server.started == 0  # the port is taken before the app's startup runs
    line = describe_mistake(caught.value, port)
    assert line.startswith(f"port {port} is in use") and "pick another with --port" in line


async def test_a_socket_bound_first_is_the_one_served():
    sock = bind("127.0.0.1", 0)
    server = _Hello()
    url = await server.start("127.0.0.1", sock=sock)
    try:
        assert url.endswith(f":{sock.getsockname()[1]}")
        assert await asyncio.to_thread(_get, url + "/") == b"hello"
    finally:
        await server.stop()


def test_a_server_in_a_thread_answers_blocking_calls_and_stops():
    with InThread(_Hello()) as served:
        assert _get(served.url + "/") == b"hello"  # a blocking call from this thread
        assert served.server.started == 1
    assert served.server.cleaned == 1 and served.loop.is_closed()
    with pytest.raises(OSError):
        _get(served.url + "/")


def _folder(tmp: Path) -> Path:
    (tmp / "a_run").mkdir()  # a learner run as the viewer finds it
    (tmp / "a_run" / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    (tmp / "corpus.jsonl").write_text(json.dumps({"id": "1", "contents": "Paris is in France."}) + "\n")
    return tmp


# (argv, the path that answers 200 once serving); {tmp} is a fresh folder
_SERVERS = [
    pytest.param(["serve-env", "AgentMath-v0", "--out", "{tmp}"], "/health", id="serve-env"),
    pytest.param(["serve-sandbox", "--workers", "1"], "/health", id="serve-sandbox"),
    pytest.param(["serve-retriever", "--corpus", "{tmp}/corpus.jsonl", "--cache-dir", "{tmp}/cache"], "/health",
                 id="serve-retriever"),
    pytest.param(["view", "{tmp}/a_run"], "/api/runs", id="view"),
    pytest.param(["gateway", "--model", "tiny"], "/health", id="gateway", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("argv", "path"), _SERVERS)
def test_each_server_under_port_0_prints_the_port_it_bound(argv, path, tmp_path):
    tmp = _folder(tmp_path)
    cmd = [sys.executable, "-m", "agent_envs.cli", *(a.replace("{tmp}", str(tmp)) for a in argv), "--port", "0"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
    watchdog = threading.Timer(120, proc.kill)  # a server that never prints fails the test, not hangs it
    watchdog.start()
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if match := re.search(r"http://127\.0\.0\.1:(\d+)", line):
                break
        assert match, f"{argv[0]} printed no URL: {lines}\n{proc.stderr.read()[-3000:]}"
        port = int(match.group(1))
        assert port != 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            assert response.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0  # SIGTERM is a graceful stop, not a kill
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
