"""Tools of any MCP server, offered to a model like our own tools.

`McpToolset` connects to one MCP server, over stdio (a command line it starts) or streamable HTTP
(a URL), lists its tools and gives one `McpTool` per MCP tool: its name is the tag / function
name, its JSON Schema goes into the tools list of the JSON protocol, and the text the model writes
is the call's JSON arguments (`<calculate>{"expression": "6*7"}</calculate>` with `ArpoTags`).

    >>> toolset = McpToolset(["mcp-server-calculator"], timeout_s=10)    # doctest: +SKIP
    >>> env = ToolEnv(tasks, toolset.tools())                              # doctest: +SKIP
    >>> toolset.close()                                                    # doctest: +SKIP

What a call can go wrong with becomes a failed `ToolResult` the model reads, never an exception
out of `step`: arguments that are not the tool's (`bad_arguments`), a tool the server does not
have (`unknown_tool`), a server that cannot start (`server_unavailable`) or exits mid-call
(`server_died`; it is started again on the next call), a call over its time budget (`timeout`;
the connection is dropped so a stuck server cannot hold later calls), and the tool's own errors
(`tool_error`). A server runs in its own process (stdio) or elsewhere (HTTP), so it may pin any
`mcp` version; this client needs `mcp>=2.3` (the `mcp` extra).

Calls are recorded and replayed by `ToolRecording` like any tool's; with the tool listing saved
(`save_listing`) and given back (`listing=`), a replayed evaluation starts no server at all.
`TaskToolFilter` offers each episode only the MCP tools its task allows. docs/interop.md shows both
directions: these tools in an env, and our tools served with `agent-envs serve-mcp`.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import re
import shlex
import tempfile
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from agent_envs.base.tool import Tool, ToolResult
from agent_envs.tools.python import truncate_middle

# Names that are safe as a tag and a stop string (`</name>`), and as a function name.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,127}")
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


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
    """

    def __init__(
        self,
        server: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        connect_timeout_s: float = 60.0,
    ) -> None:
        if isinstance(server, str) and server.startswith(("http://", "https://")):
            self.url: str | None = server
            self.argv: list[str] = []
        else:
            self.url = None
            self.argv = shlex.split(server) if isinstance(server, str) else [str(a) for a in server]
            if not self.argv:
                raise ValueError("McpConnection needs a server: a URL (http://...) or a command line, got nothing")
        # short enough for an observation: the program's name, not its whole path
        self.label = self.url or " ".join([Path(self.argv[0]).name, *self.argv[1:]])[:80]
        self.env = dict(env or {})
        self.cwd = cwd
        self.connect_timeout_s = connect_timeout_s
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
            raise McpCallError("server_unavailable", f"the MCP server {self.label} could not be reached: "
                               f"{_describe(exc)}{self._stderr_tail()}") from None

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
                client = Client(self.url)
            else:
                params = StdioServerParameters(command=self.argv[0], args=self.argv[1:], env=self.env or None,
                                               cwd=self.cwd)
                # the server's stderr kept aside: its last lines explain a failed start or a crash
                self._errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
                client = Client(stdio_client(params, errlog=self._errlog))
            async with client:
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
        client = await self._client()
        try:
            return await asyncio.wait_for(client.call_tool(name, arguments), timeout_s)
        except TimeoutError:
            self._drop()
            raise McpCallError("timeout", f"{name} timed out after {timeout_s:g} seconds: the MCP server "
                               f"{self.label} did not answer in time (it is restarted on the next call)") from None
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


_TAGGED: dict[str, type] = {}


class McpTool(Tool):
    """One tool of an MCP server. The text the model writes is its arguments as a JSON object.

    For a tool with exactly one argument the bare value works too, when it is not a JSON object
    (`<python>print(1)</python>`, or the JSON protocol's single-argument call), so gold traces of
    our own tools replay through their MCP form. `name` is the tag / function name (default: the
    MCP tool's name, which `mcp_name` keeps), `timeout_s` the time budget of one call.
    """

    argument = "arguments"
    dedupe_repeats = False  # an MCP tool may act on the world: a repeated call is a new call

    @property  # type: ignore[override]
    def timeout_s(self) -> float:
        """The deadline the env sets around a call: the call's budget, plus the server's start
        budget when it is not running yet (a first call, or the one after a crash), which the
        call's own budget (`call_timeout_s`, enforced here) does not count."""
        start = 0.0 if self.connection.connected else self.connection.connect_timeout_s
        return self.call_timeout_s + start

    def __new__(cls, connection: McpConnection, mcp_name: str, *args: Any, name: str | None = None,
                **kwargs: Any) -> McpTool:
        # Protocols learn tool tags from Tool subclasses (`known_tool_tags`): the format check
        # counts calls of known tags, and a disabled tool's tag is flagged only when known. One
        # subclass per name makes each MCP tool's tag known like a built-in tool's.
        tag = name or mcp_name
        if not _TOOL_NAME.fullmatch(tag):
            raise ValueError(f"MCP tool name {tag!r} cannot be a tag: use letters, digits and _ . - / "
                             "(pass name= to rename it)")
        sub = _TAGGED.get(tag)
        if sub is None:
            sub = _TAGGED[tag] = type(f"McpTool[{tag}]", (McpTool,), {"name": tag, "__module__": __name__})
        return super().__new__(sub)

    def __init__(
        self,
        connection: McpConnection,
        mcp_name: str,
        *,
        name: str | None = None,
        description: str = "",
        input_schema: Mapping[str, Any] | None = None,
        timeout_s: float = 30.0,
        max_output_chars: int = 8000,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"McpTool timeout_s must be positive, got {timeout_s}")
        self.connection = connection
        self.mcp_name = mcp_name
        self.input_schema: dict[str, Any] = dict(input_schema or {"type": "object", "properties": {}})
        self.call_timeout_s = float(timeout_s)
        self.max_output_chars = max_output_chars
        self.full_description = description.strip()
        props = self.input_schema.get("properties") or {}
        self.properties: dict[str, Any] = dict(props) if isinstance(props, Mapping) else {}
        self.required: list[str] = [r for r in self.input_schema.get("required") or [] if isinstance(r, str)]
        # what the inline protocol's system prompt shows: "write <name> {argument} </name>"
        self.argument = json.dumps({k: f"<{_type_name(v)}>" for k, v in self.properties.items()})
        first = re.sub(r"\s+", " ", self.full_description.split("\n\n")[0]).strip().rstrip(".")
        self.description = (first[:300] + "; " if first else "") + "its input is a JSON object of its arguments"

    def spec(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.full_description or self.description,
            "parameters": self.input_schema}}

    def argument_text(self, arguments: dict[str, Any]) -> str:
        # the whole object, even with one value or none: `arguments` reads it back
        return json.dumps(arguments, ensure_ascii=False)

    def clean_argument(self, text: str) -> str:
        text = text.strip()
        # a tool with no required argument may be called with an empty body
        return text if text or self.required else "{}"

    def normalize(self, arg: str) -> str:
        """The arguments as canonical JSON (so `{"a":1, "b":2}` and `{"b": 2, "a": 1}` are one call)."""
        try:
            return json.dumps(self.arguments(arg), sort_keys=True, ensure_ascii=False)
        except McpCallError:
            return arg.strip()

    def arguments(self, text: str) -> dict[str, Any]:
        """The JSON arguments object of a call, from the text the model wrote; checked against the
        schema's required names and top-level types. Raises `McpCallError("bad_arguments")`."""
        text = text.strip()
        single = next(iter(self.properties)) if len(self.properties) == 1 else None
        value: Any = None
        try:
            value = json.loads(text) if text.startswith("{") else None
        except (ValueError, RecursionError) as exc:
            if single is None:
                raise McpCallError("bad_arguments", f"{self.name}: the arguments are not valid JSON ({exc}); "
                                   f"write one JSON object like {self.argument}") from None
        if isinstance(value, dict):  # even for one argument: wrong names are a mistake to report
            args = value
        elif single is not None:
            args = {single: _coerce(text, self.properties[single])}
        else:
            raise McpCallError("bad_arguments", f"{self.name} takes a JSON object of arguments like "
                               f"{self.argument}, got {text[:80]!r}")
        missing = [r for r in self.required if r not in args]
        if missing:
            raise McpCallError("bad_arguments", f"{self.name}: missing required argument(s) {', '.join(missing)}; "
                               f"write one JSON object like {self.argument}")
        extra = sorted(set(args) - set(self.properties))
        if extra and self.input_schema.get("additionalProperties") is False:
            raise McpCallError("bad_arguments", f"{self.name}: unknown argument(s) {', '.join(extra)}; "
                               f"it takes {', '.join(self.properties) or 'none'}")
        for key, val in args.items():
            expected = self.properties.get(key, {}).get("type") if isinstance(self.properties.get(key), Mapping) else None
            if not _type_ok(val, expected):
                raise McpCallError("bad_arguments", f"{self.name}: argument {key} must be {expected}, "
                                   f"got {type(val).__name__} {json.dumps(val)[:60]}")
        return args

    async def call(self, arg: str) -> ToolResult:
        meta = {"server": self.connection.label}
        try:
            args = self.arguments(arg)
            result = await self.connection.call_tool(self.mcp_name, args, self.call_timeout_s)
        except McpCallError as exc:
            return ToolResult(str(exc), ok=False, error=exc.kind, metadata=meta)
        text = _result_text(result)
        if getattr(result, "is_error", False):
            return ToolResult(truncate_middle(text or f"{self.name} failed", self.max_output_chars), ok=False,
                              error=_error_kind(text, self.mcp_name), metadata=meta)
        return ToolResult(truncate_middle(text, self.max_output_chars) if text else "(no output)", metadata=meta)


def _type_name(schema: Any) -> str:
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    return "|".join(kind) if isinstance(kind, list) else (kind or "value")


def _type_ok(value: Any, expected: Any) -> bool:
    kinds = expected if isinstance(expected, list) else [expected] if isinstance(expected, str) else []
    if not kinds or any(k not in _JSON_TYPES for k in kinds):
        return True  # no simple type to check: the server validates
    if isinstance(value, bool) and "boolean" not in kinds:
        return False  # JSON true is not a number
    return any(isinstance(value, _JSON_TYPES[k]) for k in kinds)


def _coerce(text: str, schema: Any) -> Any:
    """The bare value of a one-argument call, as its schema's type: JSON, or the Python form the
    JSON protocol writes a lone non-string argument in (`str({'a': 1})`)."""
    if _type_name(schema) in ("string", "value") or "string" in _type_name(schema).split("|"):
        return text
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(text)
            return list(value) if isinstance(value, tuple) else value
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            continue
    return text  # the type check names the mismatch


def _result_text(result: Any) -> str:
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and getattr(block.resource, "text", None) is not None:
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind or 'content'}: {getattr(block, 'mime_type', None) or 'not text'}]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts).strip("\n")


def _error_kind(text: str, name: str) -> str:
    """The kind of an error result, from the wording SDK servers use (the text itself goes to the model)."""
    lowered = text.lower()
    if f"unknown tool: {name.lower()}" in lowered or "tool not found" in lowered:
        return "unknown_tool"
    if "validation error" in lowered or "invalid arguments" in lowered:
        return "bad_arguments"
    return "tool_error"


class McpToolset:
    """The tools of one MCP server, as `McpTool`s.

    Args:
        server: a URL (streamable HTTP) or a command line (stdio), see `McpConnection`.
        allow: the MCP tools to offer (names); None offers all. A name the server lacks is an error.
        prefix: put before every tool's name (`calc_` makes `calculate` the tag `calc_calculate`),
            to keep two servers' tools apart or clear of our own tools' names.
        timeout_s: the time budget of one call (the env adds a second of grace on top).
        listing: a JSON file of the tools (`save_listing`): the tools come from it and the server is
            started only when a tool is called, so a replayed evaluation starts none.
        env / cwd / connect_timeout_s: for starting a stdio server.
    """

    def __init__(
        self,
        server: str | Sequence[str],
        *,
        allow: Iterable[str] | None = None,
        prefix: str = "",
        timeout_s: float = 30.0,
        max_output_chars: int = 8000,
        listing: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        connect_timeout_s: float = 60.0,
    ) -> None:
        self.connection = McpConnection(server, env=env, cwd=cwd, connect_timeout_s=connect_timeout_s)
        self.allow = None if allow is None else list(allow)
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.listing = Path(listing) if listing is not None else None
        self._tools: list[McpTool] | None = None

    def tools(self) -> list[McpTool]:
        """The offered tools (the server is asked once, unless a `listing` file was given)."""
        if self._tools is None:
            specs = self._read_listing() if self.listing is not None else self._ask_server()
            self._tools = self._build(specs)
        return list(self._tools)

    def save_listing(self, path: str | Path) -> Path:
        """Write the server's tool listing (all tools, before `allow`) for `listing=` to read back."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"server": self.connection.label, "tools": self._ask_server()}, indent=1))
        return path

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> McpToolset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask_server(self) -> list[dict[str, Any]]:
        try:
            return self.connection.list_tools()
        except McpCallError as exc:
            raise RuntimeError(f"McpToolset: {exc}") from None

    def _read_listing(self) -> list[dict[str, Any]]:
        try:
            specs = json.loads(self.listing.read_text(encoding="utf-8"))["tools"]  # type: ignore[union-attr]
            if not all(isinstance(s, dict) and isinstance(s.get("name"), str) for s in specs):
                raise TypeError("every tool needs a name")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{self.listing}: not an MCP tool listing ({exc}); write one with "
                             "McpToolset(...).save_listing(path)") from None
        return specs

    def _build(self, specs: list[dict[str, Any]]) -> list[McpTool]:
        names = [s["name"] for s in specs]
        if self.allow is not None and (unknown := [n for n in self.allow if n not in names]):
            raise ValueError(f"McpToolset allow: the MCP server {self.connection.label} has no tool "
                             f"{', '.join(map(repr, unknown))}; it offers {', '.join(names) or 'none'}")
        return [
            McpTool(self.connection, s["name"], name=self.prefix + s["name"], description=s.get("description") or "",
                    input_schema=s.get("inputSchema"), timeout_s=self.timeout_s,
                    max_output_chars=self.max_output_chars)
            for s in specs if self.allow is None or s["name"] in self.allow
        ]


class TaskToolFilter(gym.Wrapper):
    """Offer each episode only the MCP tools its task allows: `task.metadata[key]`, a list of MCP
    tool names (or tag names). Other tools, and tasks without the key, are left as they are.

        >>> env = TaskToolFilter(ToolEnv(tasks, [*toolset.tools(), python]))   # doctest: +SKIP

    A call of a tool the task does not allow is answered like a call of any tool the env does not
    enable (the JSON protocol names the available tools).
    """

    def __init__(self, env: gym.Env, key: str = "mcp_tools") -> None:
        super().__init__(env)
        self.key = key
        self._all = dict(env.unwrapped.tools)
        self._offered = env.unwrapped.tools  # the dict this wrapper last saw or set on the env

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        base = self.env.unwrapped
        if base.tools is not self._offered:  # replaced from outside (a recording wraps them): the new full set
            self._all, self._offered = dict(base.tools), base.tools
        obs, info = self.env.reset(seed=seed, options=options)
        task = base.task
        allowed = task.metadata.get(self.key)
        if allowed is None:
            tools = self._all
        else:
            mcp = {n: t for n, t in self._all.items() if getattr(t, "mcp_name", None) is not None}
            if not isinstance(allowed, list | tuple) or not all(isinstance(a, str) for a in allowed):
                raise ValueError(f"task {task.id!r}: metadata field {self.key!r} must be a list of tool names, "
                                 f"got {allowed!r}")
            if unknown := [a for a in allowed if a not in set(mcp) | {t.mcp_name for t in mcp.values()}]:
                raise ValueError(f"task {task.id!r}: metadata field {self.key!r} names {unknown}, which no MCP tool "
                                 f"of this env is; it has {sorted(mcp) or 'none'}")
            tools = {n: t for n, t in self._all.items()
                     if n not in mcp or n in allowed or mcp[n].mcp_name in allowed}
        if list(tools) != list(base.tools):
            # the prompt lists the enabled tools: render it again with this task's tools
            base.tools = self._offered = tools
            again = {"task": task} if info.get("index", -1) < 0 else {"index": info["index"]}
            obs, info = self.env.reset(seed=seed, options={**(options or {}), **again})
        return obs, info


__all__ = ["McpCallError", "McpConnection", "McpTool", "McpToolset", "TaskToolFilter"]
