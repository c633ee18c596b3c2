"""Start and stop an aiohttp app: the one way every server of the package does it.

The retrieval server, the env server, the sandbox server, the gateway and the run viewer are
`AppServer`s (or, for the viewer, call `start_app`): `start()` serves in the running loop and
returns the base URL with the port actually bound, so port 0 picks a free one and says which;
`stop()` closes the connections and runs the app's cleanup. On the command line the port is taken
first with `bind` (a port in use is the command's one error line before an index is built, a model
loaded or a file written), then `serve_until_signal` serves on it until SIGINT or SIGTERM and stops
gracefully. `InThread` serves from a background thread, for a caller that blocks.

    >>> import asyncio, urllib.request
    >>> from aiohttp import web
    >>> async def hello(request):
    ...     return web.Response(text="hello")
    >>> class Hello(AppServer):
    ...     def app(self) -> web.Application:
    ...         app = web.Application()
    ...         app.router.add_get("/", hello)
    ...         return app
    >>> async def main():
    ...     server = Hello()
    ...     url = await server.start(port=0)
    ...     body = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read())
    ...     await server.stop()
    ...     return body
    >>> asyncio.run(main())
    b'hello'
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")

DEFAULT_BACKLOG = 128  # the kernel's queue of connections not yet accepted (Python's own default)


def port_number(text: str) -> int:
    """The argparse type of every `--port`: a bad one is a one-line usage error before anything
    starts or is written.

    >>> port_number("8000")
    8000
    """
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535; 0: any free port)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1-65535; 0: any free port)")
    return port


def bind(host: str, port: int, backlog: int = DEFAULT_BACKLOG) -> socket.socket:
    """A listening socket on `host:port` (port 0: a free one). A port in use raises the OSError
    (EADDRINUSE) that `agent-envs` turns into one line naming the port and `--port`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


async def start_app(app: web.Application, host: str = "127.0.0.1", port: int = 0, *,
                    sock: socket.socket | None = None,
                    backlog: int = DEFAULT_BACKLOG) -> tuple[web.AppRunner, str]:
    """Serve `app` in the running loop on `sock`, or on `host:port`; returns the runner
    (`cleanup()` stops it) and the base URL with the port bound."""
    sock = sock or bind(host, port, backlog)  # before the app's startup: a port in use starts nothing
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # the site listens again on the socket it is given: with its own default (128) it would
    # shrink the queue that bind() set
    await web.SockSite(runner, sock, backlog=backlog).start()
    return runner, f"http://{host}:{sock.getsockname()[1]}"


class AppServer:
    """A server that builds its aiohttp app in `app()`; start and stop are here."""

    backlog = DEFAULT_BACKLOG
    url: str | None = None
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        raise NotImplementedError

    async def start(self, host: str = "127.0.0.1", port: int = 0, *, sock: socket.socket | None = None) -> str:
        """Serve in the running loop on `sock`, or on `host:port`; returns the base URL (port 0
        picks a free port, and the URL names it)."""
        self._runner, self.url = await start_app(self.app(), host, port, sock=sock, backlog=self.backlog)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class InThread:
    """`server` served from its own event loop on a daemon thread, for a synchronous caller whose
    blocking calls must not stall the server's loop (a training process holding the gateway, a
    test's client). `close()` (or leaving the `with`) stops it gracefully."""

    def __init__(self, server: AppServer, host: str = "127.0.0.1", port: int = 0, name: str = "agent-envs-server"):
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        try:
            self.url = self.call(server.start(host, port))
        except BaseException:
            self._end()
            raise

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = 60) -> T:
        """Run `coro` on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        try:
            self.call(self.server.stop())
        finally:
            self._end()

    def _end(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    def __enter__(self) -> InThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_until_signal(server: AppServer, host: str, sock: socket.socket, announce: Callable[[str], str],
                       on_signal: dict[int, Callable[[], None]] | None = None) -> None:
    """Serve on `sock` until SIGINT or SIGTERM, then stop gracefully. `announce(url)` is the line
    printed once serving (its URL names the port bound, the real one under `--port 0`);
    `on_signal` handles further signals (the sandbox server restarts its workers on SIGHUP)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopped.set)
        for sig, handler in (on_signal or {}).items():
            loop.add_signal_handler(sig, handler)
        try:
            print(announce(await server.start(host, sock=sock)), flush=True)
            await stopped.wait()
        finally:
            await server.stop()

    asyncio.run(main())


__all__ = ["DEFAULT_BACKLOG", "AppServer", "InThread", "bind", "serve_until_signal", "start_app"]
