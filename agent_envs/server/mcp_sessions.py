"""Stateful Python over MCP: one sandboxed interpreter behind each server-minted handle.

MCP 2026-07-28 has no protocol session (no handshake, no `Mcp-Session-Id`): state that spans
calls lives in a handle the server mints and the client passes back as an ordinary tool argument.
`agent-envs serve-mcp --tools python_session` serves four tools that work that way, for clients
of either protocol version alike:

- `python_session_open()` mints a handle: `{"session": "pys-..."}`;
- `python_session_run(session, code)` runs code in that interpreter (variables, imports and files
  persist from call to call, as in an env's stateful `python`);
- `python_session_fork(session)` mints a handle to a copy of it as it stands;
- `python_session_close(session)` ends it.

Handles are unguessable, and a server keeps at most `max_sessions` of them; one unused for
`idle_timeout_s` ends by itself. A handle that is unknown, closed or expired is an error result
that says so and what to do, never a crash.

    >>> from agent_envs.tools.python import PythonTool
    >>> handles = PythonSessionHandles(PythonTool(timeout_s=5, session=True, pool_size=1))  # doctest: +SKIP
    >>> server = build_mcp_server([], sessions=handles)                                    # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

if TYPE_CHECKING:  # the sandbox loads only when sessions are served
    from agent_envs.tools.python import PythonSession, PythonTool

HANDLE_PREFIX = "pys-"


class SessionHandleError(Exception):
    """A handle that names no live session, or no room for another; the text is what a client reads."""


@dataclass
class _Entry:
    session: PythonSession
    last_used: float


class PythonSessionHandles:
    """The live Python sessions of one server, by handle.

    Args:
        tool: a `PythonTool(session=True)`; its limits apply to every call, and `close()` stops it.
        max_sessions: the most handles open at once; opening another is refused until one closes.
        idle_timeout_s: a session unused this long ends (checked whenever any handle is used).
    """

    def __init__(self, tool: PythonTool, max_sessions: int = 16, idle_timeout_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not tool.session:
            raise ValueError("PythonSessionHandles needs a PythonTool(session=True)")
        if max_sessions < 1:
            raise ValueError(f"PythonSessionHandles max_sessions must be at least 1, got {max_sessions}")
        if not idle_timeout_s > 0:
            raise ValueError(f"PythonSessionHandles idle_timeout_s must be positive, got {idle_timeout_s}")
        self.tool = tool
        self.max_sessions = max_sessions
        self.idle_timeout_s = float(idle_timeout_s)
        self._clock = clock
        self._live: dict[str, _Entry] = {}

    def __len__(self) -> int:
        self._expire()
        return len(self._live)

    def open(self) -> str:
        """A handle to a new, empty interpreter."""
        return self._mint(self.tool.open_session())

    def fork(self, handle: str) -> str:
        """A handle to a copy of `handle`'s interpreter as it stands now."""
        return self._mint(self._take(handle).fork())

    async def run(self, handle: str, code: str) -> tuple[str, bool]:
        """What `code` printed in `handle`'s interpreter, and whether the call worked (code that
        raises did: its traceback is the output; a timeout or a lost sandbox did not)."""
        entry = self._entry(handle)
        try:
            result = await entry.session(code)
        finally:
            entry.last_used = self._clock()  # a long call is use: the sweep must not end it meanwhile
        return result.text, result.ok

    def close(self, handle: str) -> None:
        self._take(handle)  # named for its error: closing what is not open is a client's mistake
        self._live.pop(handle).session.close()

    def close_all(self) -> None:
        """End every session and the tool's sandbox (blocking)."""
        live, self._live = self._live, {}
        for entry in live.values():
            entry.session.close()
        self.tool.close()

    def _mint(self, session: PythonSession) -> str:
        self._expire()
        if len(self._live) >= self.max_sessions:
            session.close()
            raise SessionHandleError(
                f"{self.max_sessions} python sessions are open, the most this server keeps: close one with "
                f"python_session_close (a session unused for {self.idle_timeout_s:g} seconds ends by itself)")
        handle = HANDLE_PREFIX + secrets.token_urlsafe(16)
        self._live[handle] = _Entry(session, self._clock())
        return handle

    def _entry(self, handle: str) -> _Entry:
        self._expire()
        entry = self._live.get(handle) if isinstance(handle, str) else None
        if entry is None:
            shown = handle if isinstance(handle, str) and len(handle) <= 60 else f"{str(handle)[:60]}..."
            raise SessionHandleError(
                f"no python session {shown!r}: it was closed, ended after {self.idle_timeout_s:g} seconds "
                "unused, or never opened; open one with python_session_open and pass the handle it returns")
        entry.last_used = self._clock()
        return entry

    def _take(self, handle: str) -> PythonSession:
        return self._entry(handle).session

    def _expire(self) -> None:
        cutoff = self._clock() - self.idle_timeout_s
        for handle in [h for h, e in self._live.items() if e.last_used < cutoff]:
            self._live.pop(handle).session.close()


SESSION_TOOLS = ("python_session_open", "python_session_run", "python_session_fork", "python_session_close")


def add_session_tools(server: Any, handles: PythonSessionHandles) -> None:
    """Register the four handle tools on an `mcp.server.mcpserver.MCPServer`."""
    from mcp.server.mcpserver.exceptions import ToolError
    from pydantic import Field

    def handle_arg(what: str) -> inspect.Parameter:
        return inspect.Parameter("session", inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[str, Field(
            description=f"the handle python_session_open returned, of the session {what}")])

    def guarded(call: Callable[..., Any]) -> Callable[..., Any]:
        async def handler(**arguments: str) -> str:
            try:
                return await call(**arguments)
            except SessionHandleError as exc:
                raise ToolError(str(exc)) from None
        return handler

    async def open_() -> str:
        return json.dumps({"session": handles.open()})

    async def run(session: str, code: str) -> str:
        text, ok = await handles.run(session, code)
        if not ok:
            raise ToolError(text)  # an error result carrying our observation (a timeout, a lost sandbox)
        return text

    async def fork(session: str) -> str:
        return json.dumps({"session": handles.fork(session)})

    async def close(session: str) -> str:
        handles.close(session)
        return f"closed {session}"

    code = inspect.Parameter("code", inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[str, Field(
        description="Python code; what it prints (and a trailing expression) comes back")])
    idle = f"; it ends after {handles.idle_timeout_s:g} seconds unused"
    specs = [
        ("python_session_open", open_, [], "opens a Python interpreter that keeps variables, imports and files "
         f'from call to call and returns its handle as {{"session": "pys-..."}}{idle}'),
        ("python_session_run", run, [handle_arg("to run in"), code],
         "runs Python code in the session the handle names and returns what it prints"),
        ("python_session_fork", fork, [handle_arg("to copy")],
         'copies a session as it stands into a new one and returns the new handle as {"session": "pys-..."}'),
        ("python_session_close", close, [handle_arg("to end")], "ends a session; its handle stops working"),
    ]
    for name, call, params, description in specs:
        handler = guarded(call)
        handler.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
        handler.__name__ = name
        server.add_tool(handler, name=name, description=description, structured_output=False)


__all__ = ["HANDLE_PREFIX", "SESSION_TOOLS", "PythonSessionHandles", "SessionHandleError", "add_session_tools"]
