"""Servers for the fault and load tests: the real ones, and one test double that misbehaves.

- `ServerProcess`: a real server as a subprocess (`retriever_process`: `agent-envs
  serve-retriever` over the shared multi-hop corpus; `site_process`: a static web site), which a
  test can SIGKILL and start again on the same port.
- `FaultProxy`: a TEST DOUBLE of a misbehaving server. It forwards requests to a real upstream
  (the retrieval server, or a local site) except those its schedule says to break: an HTTP
  500, an answer slower than the client's timeout, a body cut short, a connection reset
  mid-response or before it, a connection closed without an answer, a body that is not JSON or
  not the protocol, bytes that are not HTTP. Real servers fail like this under load or during
  deploys; they cannot be made to on demand, hence the double. It counts every request it gets,
  so tests can bound retries by what the server saw.
- `start_app`: serve an aiohttp app on a free port of 127.0.0.1.
- `run_load`: many concurrent `/retrieve` clients, with latencies and failures counted.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from tests.servers import free_port

REPO = Path(__file__).resolve().parents[2]
CORPUS = "corpus/wiki_multihop_mini.jsonl"
HOTPOT = "hotpotqa/dev_500_ircot_with_contexts.jsonl"

# Every fault the proxy can inject: (kind the client must report, text its message must contain,
# whether the client should retry it).
FAULTS: dict[str, tuple[str, str, bool]] = {
    "http_500": ("http_500", "HTTP 500 from", True),
    "slow": ("timeout", "timeout after", True),
    "truncate": ("truncated", "response cut off before its end (received", True),
    "reset": ("reset", "connection reset mid-response (received", True),
    "reset_before": ("reset", "connection reset before an answer", True),
    "close_before": ("disconnected", "server closed the connection without answering", True),
    "garbage": ("bad_response", "invalid JSON from", False),
    "wrong_shape": ("bad_response", "no 'result' list", False),
    "not_http": ("bad_response", "malformed HTTP response", False),
}


async def start_app(app: web.Application, port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `app` on 127.0.0.1; returns the runner (to `cleanup()`) and the base URL."""
    # a short shutdown: a handler still sleeping in a "slow" fault must not hold up teardown
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)  # no dropped SYNs in a burst (see the server)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{bound}"


def questions(shared_data: Path) -> list[str]:
    with (shared_data / HOTPOT).open(encoding="utf-8") as f:
        return [json.loads(line)["question"] for line in f if line.strip()]


class ServerProcess:
    """A server as a subprocess on a fixed port: `start()` waits until it listens, `kill()` is
    SIGKILL (no cleanup, as when a machine or container dies), `start()` again reuses the port."""

    def __init__(self, args: list[str], port: int, open_files: int | None = None) -> None:
        self.args, self.port = args, port
        self.open_files = open_files  # a soft limit on open files for the child (as on many hosts)
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> str:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, *self.args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, preexec_fn=self._limit if self.open_files else None,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read() if self.proc.stdout else ""
                raise RuntimeError(f"{self.args[:3]} exited with {self.proc.returncode}:\n{out}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self.url
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.args[:3]} did not listen on port {self.port} within {timeout_s} s") from None
                time.sleep(0.05)

    def _limit(self) -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, hard))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.communicate(timeout=20)


def retriever_process(corpus: Path, cache_dir: Path, *extra: str, open_files: int | None = None) -> ServerProcess:
    """The real `agent-envs serve-retriever` (index loaded from `cache_dir` when built there before)."""
    port = free_port()
    args = ["-m", "agent_envs.cli", "serve-retriever", "--corpus", str(corpus), "--port", str(port),
            "--cache-dir", str(cache_dir), *extra]  # fmt: skip
    return ServerProcess(args, port, open_files)


def site_process(root: Path) -> ServerProcess:
    """A real static web site: Python's own HTTP server over the files under `root`."""
    port = free_port()
    return ServerProcess(["-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root)], port)


class FaultProxy:
    """TEST DOUBLE of a misbehaving server (see the module docstring): real HTTP on 127.0.0.1.

    `schedule(*faults)` breaks the next requests, one fault each, in order; `always(fault)`
    breaks every request after those; `always("pass")` heals it. `hits` counts requests seen.
    """

    def __init__(self, upstream: str, slow_s: float = 5.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.slow_s = slow_s
        self.hits = 0
        self.seen: Counter = Counter()
        self._queue: list[str] = []
        self._default = "pass"
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    def schedule(self, *faults: str) -> None:
        unknown = [f for f in faults if f != "pass" and f not in FAULTS]
        assert not unknown, f"unknown faults {unknown}; known: {sorted(FAULTS)}"
        self._queue.extend(faults)

    def always(self, fault: str) -> None:
        self.schedule(fault)
        self._queue.pop()
        self._default = fault

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._session = aiohttp.ClientSession()
        self._runner, self.url = await start_app(app)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        fault = self._queue.pop(0) if self._queue else self._default
        self.seen[fault] += 1
        body = await request.read()
        if fault == "http_500":
            return web.Response(status=500, text="injected fault: internal server error")
        if fault == "garbage":
            return web.Response(body=b"\x8b\x00<html>502 upstream exploded", content_type="application/json")
        if fault == "wrong_shape":
            return web.json_response({"hits": "none today"})
        if fault in ("reset_before", "close_before", "not_http"):
            if fault == "not_http":
                request.transport.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")  # type: ignore[union-attr]
            return self._drop(request, reset=fault == "reset_before")
        if fault == "slow":
            await asyncio.sleep(self.slow_s)
        status, ctype, payload = await self._forward(request, body)
        if fault in ("truncate", "reset"):
            # the promised length, half the bytes, then a FIN (truncate) or an RST (reset)
            resp = web.StreamResponse(status=status)
            resp.content_type, resp.content_length = ctype, len(payload)
            await resp.prepare(request)
            await resp.write(payload[: len(payload) // 2])
            return self._drop(request, reset=fault == "reset", prepared=resp)
        return web.Response(status=status, body=payload, content_type=ctype)

    async def _forward(self, request: web.Request, body: bytes) -> tuple[int, str, bytes]:
        assert self._session is not None
        async with self._session.request(
            request.method, self.upstream + request.rel_url.path_qs, data=body or None,
            headers={"Content-Type": request.headers.get("Content-Type", "application/octet-stream")},
        ) as up:  # fmt: skip
            return up.status, up.content_type, await up.read()

    @staticmethod
    def _drop(request: web.Request, reset: bool, prepared: web.StreamResponse | None = None) -> web.StreamResponse:
        transport = request.transport
        assert transport is not None
        if reset:  # linger 0: close() sends an RST instead of a FIN
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        else:
            transport.close()
        return prepared or web.Response()


@dataclass
class LoadReport:
    """Latencies (seconds, failed requests included) and failures by kind of one `run_load`."""

    clients: int
    per_client: int
    latencies: list[float] = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)
    wall_s: float = 0.0

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)]

    def over(self, seconds: float) -> int:
        return sum(t > seconds for t in self.latencies)

    def line(self) -> str:
        n = len(self.latencies)
        return (
            f"{self.clients} clients x {self.per_client}: {n} requests, {sum(self.failures.values())} failed "
            f"{dict(self.failures)}; p50 {self.quantile(0.5) * 1000:.0f} ms, p99 {self.quantile(0.99) * 1000:.0f} ms, "
            f"max {max(self.latencies) * 1000:.0f} ms, {self.over(1.0)} over 1 s; {n / self.wall_s:.0f} requests/s; "
            f"load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)"
        )


async def run_load(
    url: str, asked: list[str], expected: dict[str, list[str]], clients: int, per_client: int, timeout_s: float = 60.0
) -> LoadReport:
    """`clients` sessions, released together, each sending `per_client` requests one after another."""
    report = LoadReport(clients, per_client)
    go = asyncio.Event()

    async def client(i: int) -> None:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=1)) as session:
            await go.wait()
            for j in range(per_client):
                question = asked[(i * per_client + j) % len(asked)]
                start = time.perf_counter()
                try:
                    async with session.post(f"{url}/retrieve", json={"queries": [question], "topk": 3}) as resp:
                        body = await resp.json() if resp.status == 200 else None
                        status = resp.status
                except Exception as exc:  # every failure is counted by its kind, never raised
                    report.failures[type(exc).__name__] += 1
                    continue
                finally:
                    report.latencies.append(time.perf_counter() - start)
                if status != 200:
                    report.failures[f"HTTP {status}"] += 1
                elif [d["id"] for d in body["result"][0]] != expected[question]:
                    report.failures["wrong passages"] += 1

    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    await asyncio.sleep(0.2)  # every session is open and waiting
    start = time.perf_counter()
    go.set()
    await asyncio.gather(*tasks)
    report.wall_s = time.perf_counter() - start
    return report


async def sharp_burst(port: int, asked: list[str], expected: dict[str, list[str]], clients: int) -> LoadReport:
    """`clients` connections started in one tight loop (under 0.1 s for 1,000 on a quiet machine),
    each sending one `/retrieve` request: the burst many rollout processes make when they start
    together. aiohttp spends too long per connection to make a burst this sharp, so the
    connections are plain sockets and each client writes its HTTP/1.1 request itself and reads
    the answer until the server closes the connection."""
    loop = asyncio.get_running_loop()
    report = LoadReport(clients, 1)

    async def client(sock: socket.socket, question: str, start: float) -> None:
        body = json.dumps({"queries": [question], "topk": 3}).encode()
        request = (
            f"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        try:
            connected = loop.create_future()
            loop.add_writer(sock, lambda: connected.done() or connected.set_result(None))
            try:
                await asyncio.wait_for(connected, 60)
            finally:
                loop.remove_writer(sock)
            if err := sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                raise OSError(err, os.strerror(err))
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(request)
            answer = await asyncio.wait_for(reader.read(), 60)
            writer.close()
        except Exception as exc:  # every failure is counted by its kind, never raised
            report.failures[type(exc).__name__] += 1
            sock.close()
            return
        finally:
            report.latencies.append(time.perf_counter() - start)
        head, _, payload = answer.partition(b"\r\n\r\n")
        status = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/1.1 ") else "no status line"
        if status != "200":
            report.failures[f"HTTP {status}"] += 1
        elif [d["id"] for d in json.loads(payload)["result"][0]] != expected[question]:
            report.failures["wrong passages"] += 1

    started = []
    first = time.perf_counter()
    for i in range(clients):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))  # EINPROGRESS: the SYN is on its way
        started.append((sock, asked[i % len(asked)], time.perf_counter()))
    tasks = [asyncio.create_task(client(*c)) for c in started]
    await asyncio.gather(*tasks)
    report.wall_s = time.perf_counter() - first
    return report


def listen_overflows() -> int:
    """The kernel's count of connections dropped because an accept queue was full (this network
    namespace, all processes): their clients resend the SYN only after 1 s, then 3 s."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True))["ListenOverflows"])
    return 0
