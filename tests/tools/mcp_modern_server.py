"""An MCP server that speaks only protocol 2026-07-28, built with the official SDK 2.x.

Run from its own venv (`mcp_support.modern_server_command()`); it imports nothing of ours. The
SDK's servers answer both eras by default; a middleware refuses the `initialize` handshake (and
any request not enveloped at a 2026-07-28 version) with UNSUPPORTED_PROTOCOL_VERSION, as a server
that implements only the new revision does.

Its state across calls lives in handles, as the new revision asks: `open_register` mints one and
`register_apply` takes it, so a model must carry the handle from one call to the next.

    python tests/tools/mcp_modern_server.py            # stdio
    python tests/tools/mcp_modern_server.py 8766       # streamable HTTP at http://127.0.0.1:8766/mcp
"""

import secrets
import sys
from typing import Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import MODERN_PROTOCOL_VERSIONS


async def modern_only(ctx, call_next):
    if ctx.method == "initialize" or ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        raise MCPError(code=UNSUPPORTED_PROTOCOL_VERSION,
                       message="this server speaks MCP 2026-07-28 only; the initialize handshake is not accepted",
                       data={"supported": list(MODERN_PROTOCOL_VERSIONS), "requested": ctx.protocol_version})
    return await call_next(ctx)


server = MCPServer("registers", log_level="WARNING", middleware=[modern_only])
registers: dict[str, int] = {}


@server.tool()
def open_register() -> str:
    """Open a register holding 0; returns its handle, which register_apply takes."""
    handle = "reg-" + secrets.token_hex(8)
    registers[handle] = 0
    return handle


@server.tool()
def register_apply(register: str, op: Literal["set", "add", "mul"], value: int) -> str:
    """Set the register to value, or add or multiply it in; returns the register's new value."""
    if register not in registers:
        raise ToolError(f"no register {register!r}: open one with open_register")
    current = registers[register]
    registers[register] = value if op == "set" else current + value if op == "add" else current * value
    return str(registers[register])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        server.run("streamable-http", port=int(sys.argv[1]))
    else:
        server.run()
