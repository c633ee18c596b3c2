"""`agent-envs serve-mcp`: our tools (Python sandbox, search, browse) as an MCP server.

Any MCP client (an IDE, another agent framework, `McpToolset` in this package) can then call the
sandboxed `python` tool, BM25 `search` and `browse` with the same limits and output format an
env gives a model. Each tool takes one string argument, named as in the JSON tool-call protocol
(`code`, `query`, `url`), and says so in its input schema. A failed call (timeout, a crashed
sandbox, an HTTP error) comes back as an MCP error result carrying our observation text.

    agent-envs serve-mcp --tools python                          # stdio, for a client to spawn
    agent-envs serve-mcp --tools python,search --transport http --port 8765   # http://127.0.0.1:8765/mcp

In Python (needs the `mcp` extra, `pip install agent-envs[mcp]`):

    >>> from agent_envs.tools.python import PythonTool
    >>> server = build_mcp_server([PythonTool(timeout_s=5)])     # doctest: +SKIP
    >>> server.run("stdio")                                      # doctest: +SKIP

With `--tools python_session` the server also keeps state across calls the way MCP 2026-07-28
asks: `python_session_open` mints a handle, and `python_session_run` / `_fork` / `_close` take it
(`agent_envs.server.mcp_sessions`). Clients of either protocol version are served: the 2025-era
`initialize` handshake and 2026-07-28's handshake-free requests, on stdio and on HTTP alike.

Search serves a BM25 index over `--corpus` (a JSONL of passages), or without it the synthetic
knowledge base of the embedded QA world; browse fetches web pages, or with `--web-world` serves
the synthetic linked web of the deep-search world, offline. See docs/interop.md.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Sequence
from typing import Annotated, Any

from agent_envs.base.tool import Tool
from agent_envs.server.mcp_sessions import SESSION_TOOLS, PythonSessionHandles, add_session_tools

TOOL_NAMES = ("python", "search", "browse", "python_session")


def build_mcp_server(tools: Sequence[Tool], name: str = "agent-envs",
                     sessions: PythonSessionHandles | None = None) -> Any:
    """An `mcp.server.mcpserver.MCPServer` offering `tools`, each with a one-string input schema,
    and with `sessions` the python_session_* tools (a Python interpreter behind each handle).

    The SDK's server serves both MCP protocol versions on one transport, the client's first
    request deciding: the `initialize` handshake (2025-11-25 and older) or 2026-07-28 requests.
    """
    try:
        from mcp.server.mcpserver import MCPServer
    except ImportError as exc:
        raise ImportError(
            f"serving tools over MCP needs the official SDK, mcp>=2.3 ({exc}); install it with "
            "`pip install 'agent-envs[mcp]'`"
        ) from None
    # WARNING: the SDK logs every request at INFO, to the stderr a stdio client shows its user
    names = [t.name for t in tools] + (list(SESSION_TOOLS) if sessions is not None else [])
    server = MCPServer(name, instructions="Tools of agent-envs: " + ", ".join(names), log_level="WARNING")
    for tool in tools:
        server.add_tool(_handler(tool), name=tool.name, description=tool.description or tool.name,
                        structured_output=False)
    if sessions is not None:
        add_session_tools(server, sessions)
    return server


def _handler(tool: Tool) -> Any:
    """A function the SDK can introspect: one keyword argument named `tool.argument`.

    The SDK builds a tool's input schema from its handler's signature, and our tools name their
    argument per class (`code`, `query`, `url`), so the signature is written for each tool.
    """
    from mcp.server.mcpserver.exceptions import ToolError
    from pydantic import Field

    async def handler(**arguments: str) -> str:
        result = await tool(arguments[tool.argument])
        if not result.ok:
            # an error result, so a client's model sees the call failed; the text is our observation
            raise ToolError(result.text)
        return result.text

    param = inspect.Parameter(
        tool.argument, inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[str, Field(description=f"the {tool.argument} for {tool.name}")],
    )
    handler.__signature__ = inspect.Signature([param], return_annotation=str)  # type: ignore[attr-defined]
    handler.__name__ = tool.name
    return handler


def make_tools(names: Sequence[str], args: argparse.Namespace | None = None) -> list[Tool]:
    """Our tools by name, configured from the command line's options (defaults when `args` is None);
    `python_session` is served by `make_sessions`, not as one tool."""
    unknown = [n for n in names if n not in TOOL_NAMES]
    if unknown or not names:
        raise ValueError(f"--tools: unknown tool(s) {unknown or names}; choose from {', '.join(TOOL_NAMES)}")
    opts = vars(args) if args is not None else {}
    tools: list[Tool] = []
    for name in names:
        if name == "python_session":
            continue
        if name == "python":
            from agent_envs.tools.python import PythonTool

            tools.append(PythonTool(timeout_s=opts.get("python_timeout_s", 10.0), preamble=("math",)))
        elif name == "search":
            tools.append(_search_tool(opts.get("corpus")))
        else:
            tools.append(_browse_tool(bool(opts.get("web_world"))))
    return tools


def make_sessions(args: argparse.Namespace | None = None) -> PythonSessionHandles:
    """The handle store behind the python_session_* tools, configured from the command line."""
    from agent_envs.tools.python import PythonTool

    opts = vars(args) if args is not None else {}
    tool = PythonTool(timeout_s=opts.get("python_timeout_s", 10.0), preamble=("math",), session=True)
    return PythonSessionHandles(tool, max_sessions=opts.get("python_sessions", 16),
                                idle_timeout_s=opts.get("python_session_idle_s", 600.0))


def _search_tool(corpus: str | None) -> Tool:
    from agent_envs.tools.search import SearchTool

    if corpus:
        return SearchTool.from_corpus(corpus)
    from agent_envs.worlds import KnowledgeConfig, KnowledgeWorld

    return KnowledgeWorld(KnowledgeConfig()).make_tools()[0]


def _browse_tool(web_world: bool) -> Tool:
    from agent_envs.tools.browse import BrowseTool

    if not web_world:
        return BrowseTool()
    from agent_envs.worlds import WebConfig, WebWorld

    return next(t for t in WebWorld(WebConfig()).make_tools() if t.name == "browse")


HTTP_PORT = 8765  # where --transport http listens without --port


def serve(args: argparse.Namespace) -> int:
    if args.transport == "stdio" and (args.port is not None or args.host is not None):
        given = [f for f, v in (("--host", args.host), ("--port", args.port)) if v is not None]
        raise SystemExit(f"serve-mcp: {' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to "
                         "--transport http only; stdio talks over stdin and stdout (add --transport http "
                         "to listen on a port)")
    host, port = args.host or "127.0.0.1", HTTP_PORT if args.port is None else args.port
    names = [n.strip() for n in args.tools.split(",") if n.strip()]
    sessions = None
    try:
        tools = make_tools(names, args)
        sessions = make_sessions(args) if "python_session" in names else None
        server = build_mcp_server(tools, sessions=sessions)
    except (ValueError, ImportError, FileNotFoundError) as exc:
        print(f"agent-envs serve-mcp: {exc}", file=sys.stderr)
        return 2
    try:
        if args.transport == "stdio":
            server.run("stdio")
        else:
            print(f"serving {', '.join(names)} over MCP at http://{host}:{port}/mcp", file=sys.stderr)
            server.run("streamable-http", host=host, port=port)
    finally:
        if sessions is not None:
            sessions.close_all()  # no interpreter outlives the server
    return 0


def add_cli(subparsers: Any) -> None:
    """Register `serve-mcp` on the package CLI."""
    from agent_envs.server.serving import port_number

    p = subparsers.add_parser(
        "serve-mcp", help="serve our tools (python, search, browse) as an MCP server",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--tools", default="python", help=f"comma-separated, from {','.join(TOOL_NAMES)} (default: "
                   "python; python_session: a Python interpreter behind each handle, see docs/interop.md)")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                   help="stdio (a client spawns this command) or streamable HTTP at /mcp")
    p.add_argument("--host", default=None, help="http only (default: 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=None, help=f"http only (default: {HTTP_PORT})")
    p.add_argument("--python-timeout-s", type=float, default=10.0, help="wall-clock limit of one python call")
    p.add_argument("--python-sessions", type=int, default=16,
                   help="python_session: the most sessions (handles) open at once (default: 16)")
    p.add_argument("--python-session-idle-s", type=float, default=600.0,
                   help="python_session: a session unused this long ends (default: 600)")
    p.add_argument("--corpus", default=None,
                   help="search: a corpus JSONL (id, title, text); default: the embedded knowledge world")
    p.add_argument("--web-world", action="store_true",
                   help="browse: serve the synthetic linked web of AgentSearch-v0 instead of fetching pages")
    p.set_defaults(func=serve)


__all__ = ["TOOL_NAMES", "add_cli", "build_mcp_server", "make_sessions", "make_tools"]
