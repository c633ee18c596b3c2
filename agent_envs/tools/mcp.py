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
the connection is dropped so a stuck server cannot hold later calls), a server that refuses our
protocol version (`unsupported_protocol`) or answers with what is not MCP (`bad_output`), and the
tool's own errors (`tool_error`). A server runs in its own process (stdio) or elsewhere (HTTP), so
it may pin any `mcp` version and speak either MCP protocol version (the 2026-07-28 one, or the
handshake of 2025-11-25 and older: `protocol=` in `McpConnection`); this client needs `mcp>=2.3`
(the `mcp` extra).

Calls are recorded and replayed by `ToolRecording` like any tool's; with the tool listing saved
(`save_listing`) and given back (`listing=`), a replayed evaluation starts no server at all.
`TaskToolFilter` offers each episode only the MCP tools its task allows. docs/interop.md shows both
directions: these tools in an env, and our tools served with `agent-envs serve-mcp`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from agent_envs.base.tool import Tool, ToolResult
from agent_envs.tools.mcp_connection import McpCallError, McpConnection
from agent_envs.tools.python import truncate_middle

# Names that are safe as a tag and a stop string (`</name>`), and as a function name.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,127}")
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


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
        meta: dict[str, Any] = {"server": self.connection.label}
        try:
            args = self.arguments(arg)
            result = await self.connection.call_tool(self.mcp_name, args, self.call_timeout_s)
        except McpCallError as exc:
            return ToolResult(str(exc), ok=False, error=exc.kind, metadata=meta)
        meta["protocol"] = self.connection.protocol_version
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
        protocol: "auto" (default: either MCP version, found by probing `server/discover`),
            "legacy" (the initialize handshake) or "2026-07-28"; see `agent_envs.tools.mcp_connection`.
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
        protocol: str = "auto",
    ) -> None:
        self.connection = McpConnection(server, env=env, cwd=cwd, connect_timeout_s=connect_timeout_s,
                                        protocol=protocol)
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
