"""One MCP server and the client session to it, in either protocol version, for `McpToolset`.

MCP has two protocol eras. Up to 2025-11-25 a client opens with the `initialize` handshake and
holds a session (`Mcp-Session-Id` over HTTP). Since 2026-07-28 there is neither: every request
carries its protocol version and capabilities in `_meta`, a client learns the server through
`server/discover`, and state that spans calls lives in handles the server mints and the model
passes back as ordinary tool arguments. Servers in the wild speak one or the other (or both).

`protocol` picks how a connection finds out, through the official SDK's `Client(mode=...)`:

- `"auto"` (the default): probe `server/discover` at 2026-07-28; a server that does not answer it
  as a 2026-07-28 server gets the `initialize` handshake instead. Either kind of server works.
- `"legacy"`: the handshake only (2025-11-25 and older), no probe.
- `"2026-07-28"`: that version only: a `server/discover` at it, never the handshake.

`McpConnection.protocol_version` says what was agreed once connected, and every call's
`ToolResult.metadata["protocol"]` records it.

    >>> connection = McpConnection(["mcp-server-calculator"], protocol="auto")   # doctest: +SKIP
    >>> connection.list_tools(); connection.protocol_version                     # doctest: +SKIP
    '2025-11-25'
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# what `protocol=` takes; the SDK knows the versions, this list only catches a typo early
PROTOCOLS = ("auto", "legacy", "2026-07-28")
_UNSUPPORTED_PROTOCOL_VERSION = -32022  # the JSON-RPC error a server answers a version it does not speak


class McpCallError(Exception):
    """A call that failed for a reason the model should read; `kind` is `ToolResult.error`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class McpConnection:
    """One MCP server and the session to it, opened on first use and reopened after a failure.

    The SDK's session lives in anyio task groups that must be entered and left by one task on one
    event loop, while env steps come from any loop (the env's background loop, a caller's
    `astep`, `Tool.run`). So the session is held by a task on a loop of its own, in a daemon
    thread, and calls cross over to it.

    `server`: a URL (`http://host:port/mcp`, streamable HTTP) or a command line (a string, split
    like a shell would, or a list) that starts a stdio server. `env` adds environment variables.
    `protocol`: "auto", "legacy" or "2026-07-28" (see the module's docstring).
    """

    def __init__(
        self,
        server: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        connect_timeout_s: float = 60.0,
        protocol: str = "auto",
    ) -> None:
        if isinstance(server, str) and server.startswith(("http://", "https://")):
            self.url: str | None = server
            self.argv: list[str] = []
        else:
            self.url = None
            self.argv = shlex.split(server) if isinstance(server, str) else [str(a) for a in server]
            if not self.argv:
                raise ValueError("McpConnection needs a server: a URL (http://...) or a command line, got nothing")
        if protocol not in PROTOCOLS:
            raise ValueError(f"McpConnection protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r} "
                             "('auto' talks to servers of either version)")
        # short enough for an observation: the program's name, not its whole path
        self.label = self.url or " ".join([Path(self.argv[0]).name, *self.argv[1:]])[:80]
        self.env = dict(env or {})
        self.cwd = cwd
        self.connect_timeout_s = connect_timeout_s
        self.protocol = protocol
        self.protocol_version: str | None = None  # what the server agreed to, once connected
        self._bad_output: str | None = None  # the last line the server wrote that is not MCP
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: asyncio.Future | None = None  # resolves to the connected client
        self._stop: asyncio.Event | None = None
        self._errlog: Any = None
        self._finalizer = weakref.finalize(self, _stop_loop, self.__dict__)

    def __repr__(self) -> str:
        return f"McpConnection({self.label!r})"

    # -- what tools call (from any loop or thread) ------------------------------------------

    async def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        """The server's `CallToolResult`; raises `McpCallError` for a failed connection or a timeout."""
        return await self._run(self._call(name, arguments, timeout_s))

    def list_tools(self) -> list[dict[str, Any]]:
        """The server's tools as `{"name", "description", "inputSchema"}` dicts (blocking)."""
        return asyncio.run_coroutine_threadsafe(self._list(), self._own_loop()).result()

    def close(self) -> None:
        """End the session (a stdio server is stopped) and the connection's thread; reopened if used again."""
        _stop_loop(self.__dict__)

    # -- on the connection's own loop ----------------------------------------------------------

    async def _run(self, coro: Any) -> Any:
        # cancelling the caller's await (the env's deadline) cancels the call on our loop too
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._own_loop()))

    def _own_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=_run_loop, args=(loop,), name=f"mcp:{self.label[:40]}", daemon=True).start()
                self._loop = loop
            return self._loop

    @property
    def connected(self) -> bool:
        """Is a session open (no server start to wait for on the next call)?"""
        session = self._session
        return session is not None and session.done() and not session.cancelled() and session.exception() is None

    async def _client(self) -> Any:
        if self._session is None:
            self._session = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            asyncio.get_running_loop().create_task(self._hold(self._session, self._stop))
        try:
            return await asyncio.wait_for(asyncio.shield(self._session), self.connect_timeout_s)
        except TimeoutError:
            self._drop()
            raise McpCallError("server_unavailable", f"the MCP server {self.label} did not answer within "
                               f"{self.connect_timeout_s:g} seconds of starting") from None
        except McpCallError:
            raise
        except Exception as exc:
            self._drop()
            if (refused := self._refused_protocol(exc)) is not None:
                raise McpCallError("unsupported_protocol", refused) from None
            raise McpCallError("server_unavailable", f"the MCP server {self.label} could not be reached: "
                               f"{_describe(exc)}{self._stderr_tail()}") from None

    def _refused_protocol(self, exc: BaseException) -> str | None:
        """Why the server refused our protocol version, if that is what `exc` (from connecting) says.

        A 2026-07-28-only server answers the handshake with UNSUPPORTED_PROTOCOL_VERSION; a legacy
        server answers a request that skipped the handshake with some other protocol error.
        """
        from mcp import MCPError

        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if not isinstance(exc, MCPError):
            return None
        if exc.code != _UNSUPPORTED_PROTOCOL_VERSION and self.protocol == "auto":
            return None  # auto already fell back to the handshake: the server failed otherwise
        data = exc.error.data if isinstance(exc.error.data, Mapping) else {}
        offered = data.get("supported")
        speaks = f" (it speaks {', '.join(map(str, offered))})" if isinstance(offered, list) and offered else ""
        asked = {"auto": "either protocol version", "legacy": "the initialize handshake (2025-11-25 and older)"}
        hint = "" if self.protocol == "auto" else "; protocol='auto' talks to servers of either version"
        return (f"the MCP server {self.label} refused {asked.get(self.protocol, 'protocol ' + self.protocol)}"
                f"{speaks}: error {exc.code}: {exc.message}{hint}")

    async def _hold(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        """Enter the SDK client, publish it, and keep it open until `stop` (same task throughout)."""
        try:
            from mcp import Client, StdioServerParameters
            from mcp.client.stdio import stdio_client
        except ImportError as exc:
            ready.set_exception(McpCallError(
                "server_unavailable", f"MCP tools need the official SDK, mcp>=2.3 ({exc}); "
                "install it with `pip install 'agent-envs[mcp]'`"))
            return
        try:
            if self.url is not None:
                transport: Any = self.url
            else:
                params = StdioServerParameters(command=self.argv[0], args=self.argv[1:], env=self.env or None,
                                               cwd=self.cwd)
                # the server's stderr kept aside: its last lines explain a failed start or a crash
                self._errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
                transport = stdio_client(params, errlog=self._errlog)
            client = Client(transport, mode=self.protocol, message_handler=self._on_message)
            async with client:
                if self.protocol not in ("auto", "legacy"):
                    await self._confirm_pinned(client)
                self.protocol_version = client.protocol_version
                if not ready.done():
                    ready.set_result(client)
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 (anyio wraps failures in groups; all mean "no session")
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if self._session is ready:  # the session ended on its own (the server went away): reconnect next time
                self._session, self._stop = None, None

    async def _confirm_pinned(self, client: Any) -> None:
        """Ask `server/discover` at the pinned version. The SDK adopts a pinned version unasked;
        every 2026-07-28 server answers discover, so one that does not speak it says so here,
        rather than failing each call with a puzzling error."""
        import mcp_types

        result = mcp_types.DiscoverResult.model_validate(await client.session.send_discover(self.protocol))
        if self.protocol not in result.supported_versions:
            raise McpCallError("unsupported_protocol", f"the MCP server {self.label} does not speak "
                               f"{self.protocol} (it speaks {', '.join(result.supported_versions) or 'nothing'}); "
                               "protocol='auto' talks to servers of either version")
        client.session.adopt(result)

    async def _on_message(self, message: Any) -> None:
        """Keep what the server wrote that is not MCP (the SDK hands it over as an exception), so a
        call that then gets no answer can say why."""
        if isinstance(message, Exception):
            errors = getattr(message, "errors", None)
            try:
                shown = errors()[0].get("input") if callable(errors) else None
            except (IndexError, TypeError, AttributeError):
                shown = None
            self._bad_output = repr(shown)[:200] if isinstance(shown, str) else _describe(message)[:200]

    def _drop(self) -> None:
        """Forget the session; its holder closes it (a stdio server is stopped). The next call reconnects."""
        if self._stop is not None:
            self._stop.set()
        self._session, self._stop = None, None

    async def _list(self) -> list[dict[str, Any]]:
        client = await self._client()
        tools: list[dict[str, Any]] = []
        cursor = None
        try:
            while True:
                page = await asyncio.wait_for(client.list_tools(cursor=cursor), self.connect_timeout_s)
                tools += [{"name": t.name, "description": t.description or "", "inputSchema": t.input_schema}
                          for t in page.tools]
                cursor = page.next_cursor
                if cursor is None:
                    return tools
        except Exception as exc:
            self._drop()
            raise McpCallError("server_died", f"the MCP server {self.label} failed while listing its tools: "
                               f"{_describe(exc)}{self._stderr_tail()}") from None

    async def _call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        from pydantic import ValidationError

        client = await self._client()
        self._bad_output = None
        try:
            return await asyncio.wait_for(client.call_tool(name, arguments), timeout_s)
        except TimeoutError:
            self._drop()
            if self._bad_output is not None:
                raise McpCallError("bad_output", f"{name} failed: the MCP server {self.label} wrote output that "
                                   f"is not MCP ({self._bad_output}) and no answer within {timeout_s:g} "
                                   "seconds; it is restarted on the next call") from None
            raise McpCallError("timeout", f"{name} timed out after {timeout_s:g} seconds: the MCP server "
                               f"{self.label} did not answer in time (it is restarted on the next call)") from None
        except ValidationError as exc:
            # an answer, but not a tool result: the session itself is fine
            raise McpCallError("bad_output", f"{name} failed: the MCP server {self.label} answered with something "
                               f"that is not a valid tool result ({_describe(exc)})") from None
        except Exception as exc:
            from mcp import MCPError
            from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS

            if isinstance(exc, MCPError) and exc.code != CONNECTION_CLOSED:
                # the server answered with a protocol error: the session is fine
                kind = "bad_arguments" if exc.code == INVALID_PARAMS else "mcp_error"
                raise McpCallError(kind, f"{name} failed: the MCP server answered error {exc.code}: "
                                   f"{exc.message}") from None
            self._drop()
            raise McpCallError("server_died", f"{name} failed: the MCP server {self.label} exited or closed "
                               f"the connection ({_describe(exc)}){self._stderr_tail()}; it is restarted "
                               "on the next call") from None

    def _stderr_tail(self) -> str:
        log = self._errlog
        if log is None or self.url is not None:
            return ""
        try:
            log.flush()
            size = log.seek(0, 2)
            log.seek(max(0, size - 2000))
            lines = [line for line in log.read().splitlines() if line.strip()]
        except (OSError, ValueError):
            return ""
        return f"; its last stderr line: {lines[-1].strip()[:300]}" if lines else ""


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking inside anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_forever()
    loop.close()


def _stop_loop(state: dict[str, Any]) -> None:
    """Close the session and stop the loop thread (also at exit, so no stdio server outlives us)."""
    loop, stop = state.get("_loop"), state.get("_stop")
    if loop is None or loop.is_closed() or not loop.is_running():
        return

    async def shut_down() -> None:
        if stop is not None:
            stop.set()
        if pending := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            await asyncio.wait(pending, timeout=10)

    with contextlib.suppress(Exception):  # a wedged server must not hang close or exit
        asyncio.run_coroutine_threadsafe(shut_down(), loop).result(timeout=15)
    state["_session"] = state["_stop"] = state["_loop"] = None
    loop.call_soon_threadsafe(loop.stop)


__all__ = ["PROTOCOLS", "McpCallError", "McpConnection"]
