"""The Python sandbox as a shared service: one pool of warm local workers that many rollout
processes call over HTTP on 127.0.0.1.

Every call runs in the same `LocalSandbox` as in-process use (same isolation, same limits, same
`SandboxResult`), so `PythonTool(backend="service", service_url=...)` reads exactly what
`backend="local"` would. The service bounds concurrency (`workers` calls run, at most
`max_queue` more wait, up to one call's time, the rest are answered 503 at once), reports itself on `/health`, restarts
its workers on SIGHUP (`restart()`) without dropping a call, and on SIGTERM/SIGINT stops accepting, finishes
the calls in flight and stops its workers.

    agent-envs serve-sandbox --port 8100 --workers 8 --preamble math sympy

Protocol: `POST /execute` with `{"code": str, "timeout_s": float (optional, capped at the
service's --timeout)}` answers 200 with the `SandboxResult` fields as JSON; 400 for a malformed
request, 503 when the queue is full or the service is stopping (the body's `error` says which).
`GET /health` answers `{"status": "ok" | "stopping", "workers", "in_flight", "queued", "calls",
"rejected", "generation", "worker_pids", "isolation"}`.

    >>> import asyncio
    >>> from agent_envs.tools.sandbox import SandboxConfig
    >>> from agent_envs.tools.sandbox.service import ServiceSandbox
    >>> async def main():
    ...     server = SandboxServer(SandboxConfig(timeout_s=5, pool_size=1))
    ...     url = await server.start(port=0)
    ...     client = ServiceSandbox(SandboxConfig(timeout_s=5, service_url=url))
    ...     result = await asyncio.to_thread(client.execute, "6*7")
    ...     await server.stop()
    ...     return result.stdout
    >>> asyncio.run(main())
    '42\\n'
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
from typing import Any

from aiohttp import web

from agent_envs.server.serving import AppServer, bind, serve_until_signal
from agent_envs.tools.sandbox import SandboxConfig
from agent_envs.tools.sandbox.local import LocalSandbox, WorkerError

log = logging.getLogger(__name__)

MAX_CODE_BYTES = 1024 * 1024


class SandboxServer(AppServer):
    """An aiohttp app around a `LocalSandbox` with `config.pool_size` workers.

    Args:
        config: the sandbox every call runs in (limits, preamble, workers = `pool_size`).
        max_queue: calls that may wait for a free worker (each at most `config.timeout_s`);
            beyond that the service answers 503 (default: 4 per worker).
        drain_s: how long a stop waits for the calls in flight.
    """

    def __init__(self, config: SandboxConfig, max_queue: int | None = None, drain_s: float = 30.0) -> None:
        self.config = config.validate()
        self.workers = int(self.config.pool_size)
        self.max_queue = 4 * self.workers if max_queue is None else max_queue
        self.drain_s = drain_s
        self.stats = {"calls": 0, "rejected": 0, "generation": 0}
        self._sandbox = LocalSandbox(self.config)
        self._executor = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox-svc")
        self._slots = asyncio.Semaphore(self.workers)
        self._in_flight = 0
        self._queued = 0
        self._stopping = False
        self._idle: asyncio.Event | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_CODE_BYTES + 4096)
        app.router.add_post("/execute", self._execute)
        app.router.add_get("/health", self._health)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        sandbox = self._sandbox
        return web.json_response(
            {
                "status": "stopping" if self._stopping else "ok",
                "workers": self.workers,
                "in_flight": self._in_flight,
                "queued": self._queued,
                **self.stats,
                "worker_pids": sandbox.worker_pids(),
                "isolation": sandbox.isolation,
            }
        )

    async def _execute(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict) or not isinstance(body.get("code"), str):
            return _error(400, "request body must be a JSON object with 'code' (string)")
        timeout = body.get("timeout_s", self.config.timeout_s)
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            return _error(400, f"'timeout_s' must be a positive number, got {timeout!r}")
        timeout = min(float(timeout), float(self.config.timeout_s))
        if self._stopping:
            return _error(503, "the sandbox service is stopping")
        if self._in_flight + self._queued >= self.workers + self.max_queue:
            self.stats["rejected"] += 1
            return _error(503, f"the sandbox service is busy ({self.workers} running, {self._queued} queued)")
        self._queued += 1
        try:
            # A call that cannot start within one call's time is refused rather than run late: its
            # client is about to give up on it.
            await asyncio.wait_for(self._slots.acquire(), self.config.timeout_s)
        except TimeoutError:
            self.stats["rejected"] += 1
            return _error(503, f"the sandbox service is busy (waited {self.config.timeout_s:g} s for a worker)")
        finally:
            self._queued -= 1
        self._in_flight += 1
        try:
            # The pool in use now: a restart while this call runs does not move it.
            sandbox, generation = self._sandbox, self.stats["generation"]
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._executor, sandbox.execute, body["code"], timeout)
            if sandbox is not self._sandbox:  # replaced meanwhile: its worker must not stay idle
                await loop.run_in_executor(None, sandbox.close)
        finally:
            self._in_flight -= 1
            self._slots.release()
            if self._idle is not None and self._in_flight == 0 and self._queued == 0:
                self._idle.set()
        self.stats["calls"] += 1
        payload = dataclasses.asdict(result)
        payload["metadata"] = {**payload["metadata"], "generation": generation}
        return web.json_response(payload)

    async def restart(self) -> None:
        """Start a new pool, then send the next calls to it; the old one stops as its calls return."""
        new = LocalSandbox(self.config)
        try:
            await asyncio.get_running_loop().run_in_executor(None, new.start)
        except WorkerError as exc:
            new.close()
            log.error("sandbox service: restart failed, the running workers stay: %s", exc)
            return
        old, self._sandbox = self._sandbox, new
        self.stats["generation"] += 1
        await asyncio.get_running_loop().run_in_executor(None, old.close)
        log.info("sandbox service: workers restarted (generation %d)", self.stats["generation"])

    async def drain(self) -> None:
        """Refuse new calls and wait (up to `drain_s`) for those in flight."""
        self._stopping = True
        self._idle = asyncio.Event()
        if self._in_flight or self._queued:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self.drain_s)

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.drain()
        await asyncio.get_running_loop().run_in_executor(None, self._sandbox.close)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def start(self, host: str = "127.0.0.1", port: int = 0, *, sock: socket.socket | None = None) -> str:
        """Start the workers, then serve in the running loop; returns the base URL (port 0 picks a
        free port)."""
        await asyncio.get_running_loop().run_in_executor(None, self._sandbox.start)
        return await super().start(host, port, sock=sock)

    async def stop(self) -> None:
        """Graceful: stop accepting, finish the calls in flight, stop the workers."""
        log.info("sandbox service: stopping (%d calls in flight)", self._in_flight + self._queued)
        await self.drain()
        await super().stop()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


# -- command line ----------------------------------------------------------------------------------


def _serve(server: SandboxServer, host: str, port: int) -> None:
    sock = bind(host, port)  # before the workers start: a port in use starts nothing
    restarts: set[asyncio.Task] = set()

    def restart() -> None:
        task = asyncio.ensure_future(server.restart())
        restarts.add(task)
        task.add_done_callback(restarts.discard)

    serve_until_signal(server, host, sock, lambda url: f"serve-sandbox: {server.workers} workers; listening on "
                       f"{url}/execute", on_signal={signal.SIGHUP: restart})


def serve(args: argparse.Namespace) -> int:
    """`agent-envs serve-sandbox`: serve a pool of sandbox workers until SIGTERM/SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = SandboxConfig(
            timeout_s=args.timeout,
            memory_mb=args.memory_mb,
            fsize_mb=args.fsize_mb,
            nproc=args.nproc,
            uid=args.uid,
            gid=args.uid if args.gid is None else args.gid,
            preamble=tuple(args.preamble),
            pool_size=args.workers,
        ).validate()
    except ValueError as exc:
        print(f"serve-sandbox: {exc}", file=sys.stderr)
        return 2
    try:
        _serve(SandboxServer(config, max_queue=args.max_queue), args.host, args.port)
    except WorkerError as exc:
        print(f"serve-sandbox: the workers did not start: {exc}", file=sys.stderr)
        return 2
    return 0


def add_cli(subparsers: Any) -> None:
    """Register `serve-sandbox` on the package CLI."""
    from agent_envs.server.serving import port_number

    p = subparsers.add_parser(
        "serve-sandbox",
        help="serve the Python sandbox over HTTP to many rollout workers (PythonTool backend='service')",
    )
    defaults = SandboxConfig()
    p.add_argument("--port", type=port_number, default=8100, help="0 picks a free port (printed on start)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 2), help="calls run at once")
    p.add_argument("--max-queue", type=int, default=None, help="calls that may wait (default 4 per worker)")
    p.add_argument("--timeout", type=float, default=defaults.timeout_s, help="longest call, seconds")
    p.add_argument("--memory-mb", type=int, default=defaults.memory_mb)
    p.add_argument("--fsize-mb", type=int, default=defaults.fsize_mb)
    p.add_argument("--nproc", type=int, default=defaults.nproc)
    # RLIMIT_NPROC counts every process of a uid on the machine: two services (or a service and
    # other sandboxes) that share a uid share one process budget.
    p.add_argument("--uid", type=int, default=defaults.uid, help="when run as root: the uid the code runs as")
    p.add_argument("--gid", type=int, default=None, help="when run as root: the gid the code runs as (default: --uid)")
    p.add_argument("--preamble", nargs="*", default=[], help="modules imported once per worker: math 'numpy as np'")
    p.set_defaults(func=serve)


__all__ = ["SandboxServer", "add_cli"]
