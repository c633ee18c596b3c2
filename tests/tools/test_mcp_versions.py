"""MCP's two protocol eras, both ways, with real servers and clients: nothing here is mocked.

- our client (`McpToolset`) and a server built with the SDK 2.x that speaks only 2026-07-28
  (its own venv), whose handle-carrying tool is used inside an AgentMath-v0 world episode; the
  old-era third-party calculator (mcp 1.x) still negotiated by the same default, and each era
  detected over HTTP too;
- `serve-mcp` answering the SDK 2.x client pinned to 2026-07-28 and the SDK 1.x client (the
  handshake only), each in its own venv, over stdio and HTTP, through the python_session handles;
- a protocol a server refuses, and output that is not MCP, each an observation with the episode
  going on; the handle store's limits.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp_support import (
    LEGACY_SDK,
    MODERN_SDK,
    PyPIUnreachable,
    calculator_command,
    modern_server_command,
    sdk_python,
)

from agent_envs.base.task import Task
from agent_envs.core.env import ToolEnv
from agent_envs.tools.mcp import McpConnection, McpTool, McpToolset
from agent_envs.worlds import ArithmeticConfig, ArithmeticWorld
from tests.servers import free_port

pytest.importorskip("mcp", reason="the MCP tests need the `mcp` extra (pip install -e '.[mcp]')")

REPO = Path(__file__).resolve().parents[2]
SERVE = [sys.executable, "-m", "agent_envs.cli", "serve-mcp"]
SIX_BY_SEVEN = Task(id="six-by-seven", question="What is 6*7?", answers=["42"], reward="math")


def _venv(make):
    try:
        return make()
    except PyPIUnreachable as exc:
        pytest.skip(str(exc))


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def modern():
    with McpToolset(_venv(modern_server_command), timeout_s=20) as toolset:
        yield toolset


# -- our client and a server that speaks only 2026-07-28 ---------------------------------------


@pytest.mark.slow  # builds the SDK 2.x venv from PyPI on a machine's first run (about a minute)
def test_new_version_server_tool_solves_a_world_task_through_a_handle(modern):
    task = ArithmeticWorld(ArithmeticConfig(seed=3))[0]
    a, b = map(int, re.fullmatch(r"What is (\d+) \* (\d+)\?", task.question).groups())
    env = ToolEnv([task], modern.tools(), protocol="json")
    env.reset(seed=0)
    assert modern.connection.protocol_version == "2026-07-28"  # no handshake: server/discover, then _meta

    obs, _, terminated, _, info = env.step(call("open_register"))
    handle = re.search(r"reg-[0-9a-f]{16}", obs).group(0)  # what a model copies into its next calls
    assert info["tool_result"]["ok"] and not terminated
    env.step(call("register_apply", register=handle, op="set", value=a))
    obs, *_ = env.step(call("register_apply", register=handle, op="mul", value=b))
    assert str(a * b) in obs and task.answers == [str(a * b)]
    obs, _, _, _, info = env.step(call("register_apply", register="reg-0000000000000000", op="add", value=1))
    assert "no register 'reg-0000000000000000'" in obs and info["tool_result"]["error"] == "tool_error"
    _, reward, terminated, _, info = env.step(f"The product is \\boxed{{{a * b}}}.")
    assert (reward, terminated, info["tool_calls"]) == (1.0, True, 4)


@pytest.mark.slow
def test_new_version_server_refuses_the_handshake_as_an_observation(modern):
    legacy = McpToolset(modern.connection.argv, protocol="legacy", connect_timeout_s=30)
    with pytest.raises(RuntimeError, match="refused the initialize handshake .*it speaks 2026-07-28.* -32022"):
        legacy.tools()
    opener = McpTool(legacy.connection, "open_register", input_schema={"type": "object", "properties": {}})
    apply = next(t for t in modern.tools() if t.name == "register_apply")
    env = ToolEnv([SIX_BY_SEVEN], [opener, apply], protocol="json")
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step(call("open_register"))
    assert info["tool_result"]["error"] == "unsupported_protocol" and "protocol='auto'" in obs and not terminated
    _, reward, terminated, _, _ = env.step("The product is \\boxed{42}.")
    assert (reward, terminated) == (1.0, True)  # the episode went on
    legacy.close()


@pytest.mark.slow  # the calculator's venv (mcp 1.x) from PyPI on a machine's first run
def test_old_version_server_is_reached_by_the_handshake():
    command = _venv(calculator_command)
    with McpToolset(command, timeout_s=20) as auto:
        assert auto.tools()[0].run('{"expression": "6*7"}').text == "42"
        assert auto.connection.protocol_version == "2025-11-25"  # discover refused: the handshake
    pinned = McpToolset(command, timeout_s=20, protocol="2026-07-28", connect_timeout_s=30)
    tool = McpTool(pinned.connection, "calculate", input_schema={"type": "object", "properties": {}})
    result = tool.run('{"expression": "6*7"}')
    assert (result.ok, result.error) == (False, "unsupported_protocol")
    assert "refused protocol 2026-07-28" in result.text and "protocol='auto'" in result.text
    pinned.close()


# A 2025-era server over HTTP, from the SDK 1.x venv (which knows only the handshake).
OLD_HTTP_SERVER = """
import sys
from mcp.server.fastmcp import FastMCP
server = FastMCP("old", port=int(sys.argv[1]), log_level="WARNING")

@server.tool()
def add(a: int, b: int) -> int:
    return a + b

server.run("streamable-http")
"""


def _wait_for_port(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
    raise AssertionError(f"nothing listens on port {port} after 60 seconds")


@pytest.mark.slow  # the SDK venvs from PyPI on a machine's first run
@pytest.mark.parametrize("era", ["2025-11-25", "2026-07-28"])
def test_auto_detects_each_version_over_http(era, tmp_path):
    """Over HTTP the probe meets a legacy server's HTTP-level refusal, not a JSON-RPC one."""
    port = free_port()
    if era == "2026-07-28":
        argv, tool, arguments = [*_venv(modern_server_command), str(port)], "open_register", "{}"
    else:
        (tmp_path / "old_server.py").write_text(OLD_HTTP_SERVER)
        argv = [_venv(lambda: sdk_python(LEGACY_SDK)), str(tmp_path / "old_server.py"), str(port)]
        tool, arguments = "add", '{"a": 2, "b": 40}'
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_port(proc, port)
        url = f"http://127.0.0.1:{port}/mcp"
        with McpToolset(url, timeout_s=20) as toolset:
            result = next(t for t in toolset.tools() if t.name == tool).run(arguments)
            assert result.ok and (result.text.startswith("reg-") if era == "2026-07-28" else result.text == "42")
            assert toolset.connection.protocol_version == era
        other = "legacy" if era == "2026-07-28" else "2026-07-28"
        with McpToolset(url, timeout_s=20, protocol=other) as refused, pytest.raises(RuntimeError) as failure:
            refused.tools()
        assert "refused" in str(failure.value) and "protocol='auto'" in str(failure.value)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.parametrize("protocol", ["legacy", "2026-07-28"])
def test_our_client_pinned_to_each_version_against_serve_mcp(protocol):
    with McpToolset([*SERVE, "--tools", "python"], timeout_s=20, protocol=protocol, cwd=str(REPO)) as toolset:
        result = toolset.tools()[0].run('{"code": "print(6*7)"}')
        assert result.text == "42" and result.metadata["protocol"] == toolset.connection.protocol_version
        assert toolset.connection.protocol_version == ("2025-11-25" if protocol == "legacy" else "2026-07-28")


def test_protocol_must_be_a_known_one():
    with pytest.raises(ValueError, match="protocol must be one of auto, legacy, 2026-07-28, got '2025-11-25'"):
        McpConnection(["some-server"], protocol="2025-11-25")


# -- output that is not MCP --------------------------------------------------------------------

# A server written by hand (no SDK): it discovers and lists as a 2026-07-28 server should, then
# answers `echo` well, with a result of the wrong shape, or with a line that is not JSON-RPC.
RAW_SERVER = """
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, text = msg["method"], (msg.get("params") or {}).get("arguments", {}).get("text")
    listing = {"resultType": "complete", "ttlMs": 0, "cacheScope": "public"}
    if method == "server/discover":
        result = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, **listing}
    elif method == "tools/list":
        schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        result = {"tools": [{"name": "echo", "inputSchema": schema}], **listing}
    elif text == "shape":
        result = {"content": "not a list", "resultType": "complete"}
    elif text == "garbage":
        print("this is not json", flush=True)
        continue
    else:
        result = {"content": [{"type": "text", "text": text}], "resultType": "complete"}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


def test_output_that_is_not_mcp_is_an_observation(tmp_path):
    script = tmp_path / "raw_server.py"
    script.write_text(RAW_SERVER)
    with McpToolset([sys.executable, str(script)], timeout_s=1.5) as toolset:
        env = ToolEnv([SIX_BY_SEVEN], toolset.tools(), max_tool_calls=6)
        env.reset(seed=0)
        obs, _, terminated, _, info = env.step('<echo>{"text": "shape"}</echo>')
        assert "is not a valid tool result" in obs and info["tool_result"]["error"] == "bad_output"
        obs, *_ = env.step('<echo>{"text": "fine"}</echo>')
        assert "fine" in obs  # the same session goes on
        obs, _, terminated, _, info = env.step('<echo>{"text": "garbage"}</echo>')
        assert "wrote output that is not MCP ('this is not json')" in obs, obs
        assert info["tool_result"]["error"] == "bad_output" and not terminated
        obs, *_ = env.step('<echo>{"text": "again"}</echo>')
        assert "again" in obs  # a new server process answers
        _, reward, terminated, _, _ = env.step("<think>done</think><answer>\\boxed{42}</answer>")
        assert (reward, terminated) == (1.0, True)


# -- serve-mcp answering clients of both versions ----------------------------------------------

CLIENT_2X = """
import asyncio, json, sys
from mcp import Client, StdioServerParameters

async def main(target, repo):
    server = target if target.startswith("http") else StdioServerParameters(
        command=target, args=["-m", "agent_envs.cli", "serve-mcp", "--tools", "python,python_session"], cwd=repo)
    async with Client(server, mode="2026-07-28") as client:
        names = [t.name for t in (await client.list_tools()).tools]
        opened = await client.call_tool("python_session_open", {})
        handle = json.loads(opened.content[0].text)["session"]
        await client.call_tool("python_session_run", {"session": handle, "code": "x = 41"})
        ran = await client.call_tool("python_session_run", {"session": handle, "code": "x + 1"})
        await client.call_tool("python_session_close", {"session": handle})
        gone = await client.call_tool("python_session_run", {"session": handle, "code": "x"})
        print(json.dumps({"version": client.protocol_version, "tools": names, "handle": handle,
                          "ran": ran.content[0].text, "gone": [gone.is_error, gone.content[0].text]}))

asyncio.run(main(*sys.argv[1:]))
"""

CLIENT_1X = """
import asyncio, json, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

async def main(target, repo):
    if target.startswith("http"):
        opened = streamablehttp_client(target)
    else:
        opened = stdio_client(StdioServerParameters(
            command=target, args=["-m", "agent_envs.cli", "serve-mcp", "--tools", "python,python_session"], cwd=repo))
    async with opened as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            version = (await session.initialize()).protocolVersion
            names = [t.name for t in (await session.list_tools()).tools]
            opened = await session.call_tool("python_session_open", {})
            handle = json.loads(opened.content[0].text)["session"]
            await session.call_tool("python_session_run", {"session": handle, "code": "x = 41"})
            ran = await session.call_tool("python_session_run", {"session": handle, "code": "x + 1"})
            await session.call_tool("python_session_close", {"session": handle})
            gone = await session.call_tool("python_session_run", {"session": handle, "code": "x"})
            print(json.dumps({"version": version, "tools": names, "handle": handle,
                              "ran": ran.content[0].text, "gone": [gone.isError, gone.content[0].text]}))

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def served_http():
    """`serve-mcp` over HTTP with python and the session handles; its URL."""
    port = free_port()
    proc = subprocess.Popen([*SERVE, "--tools", "python,python_session", "--transport", "http", "--port", str(port)],
                            cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_port(proc, port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.slow  # builds each SDK's venv from PyPI on a machine's first run
@pytest.mark.parametrize("sdk", [MODERN_SDK, LEGACY_SDK])
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_serve_mcp_answers_clients_of_both_versions(sdk, transport, served_http, tmp_path):
    python = _venv(lambda: sdk_python(sdk))
    script = tmp_path / "client.py"
    script.write_text(CLIENT_2X if sdk == MODERN_SDK else CLIENT_1X)
    target = served_http if transport == "http" else sys.executable
    run = subprocess.run([python, str(script), target, str(REPO)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["version"] == ("2026-07-28" if sdk == MODERN_SDK else "2025-11-25")
    assert seen["tools"] == ["python", "python_session_open", "python_session_run", "python_session_fork",
                             "python_session_close"]
    assert seen["handle"].startswith("pys-") and seen["ran"] == "42"  # state reached through the handle
    assert seen["gone"][0] and "no python session" in seen["gone"][1] and "python_session_open" in seen["gone"][1]


def test_new_version_requests_over_http_carry_no_session(served_http):
    """2026-07-28 on the wire: a bare enveloped POST is answered, and no Mcp-Session-Id is minted;
    the handshake still gets its session id."""
    import httpx

    envelope = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}}
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "python", "arguments": {"code": "print(6*7)"}, "_meta": envelope}}
    reply = httpx.post(served_http, json=body, headers={**headers, "Mcp-Method": "tools/call", "Mcp-Name": "python"},
                       timeout=60)
    assert reply.status_code == 200 and "mcp-session-id" not in reply.headers
    assert reply.json()["result"]["content"][0]["text"] == "42"
    discover = httpx.post(served_http, headers={**headers, "Mcp-Method": "server/discover"}, timeout=30, json={
        "jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {"_meta": envelope}})
    assert "2026-07-28" in discover.json()["result"]["supportedVersions"]
    handshake = httpx.post(served_http, headers={"Accept": "application/json, text/event-stream"}, timeout=30, json={
        "jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    assert handshake.status_code == 200 and handshake.headers.get("mcp-session-id")


# -- the handle store --------------------------------------------------------------------------


async def test_session_handles_limits_expiry_and_forks():
    from agent_envs.server.mcp_sessions import PythonSessionHandles, SessionHandleError
    from agent_envs.tools.python import PythonTool

    now = [0.0]
    handles = PythonSessionHandles(PythonTool(timeout_s=10, session=True, pool_size=1), max_sessions=2,
                                   idle_timeout_s=60, clock=lambda: now[0])
    try:
        first = handles.open()
        assert (await handles.run(first, "x = 41")) == ("Code ran successfully with no output.", True)
        twin = handles.fork(first)
        assert first != twin and len(handles) == 2
        assert (await handles.run(twin, "x += 1; x"))[0] == "42" and (await handles.run(first, "x"))[0] == "41"
        with pytest.raises(SessionHandleError, match="2 python sessions are open.*python_session_close"):
            handles.open()
        handles.close(twin)
        with pytest.raises(SessionHandleError, match="no python session 'pys-"):
            handles.close(twin)
        now[0] = 61.0  # first was last used at 0: it has ended
        with pytest.raises(SessionHandleError, match="ended after 60 seconds unused"):
            await handles.run(first, "x")
        assert len(handles) == 0
        third = handles.open()
        assert (await handles.run(third, "x"))[0].splitlines()[-1] == "NameError: name 'x' is not defined"
        with pytest.raises(SessionHandleError, match="never opened"):
            await handles.run("x" * 500, "1")  # a long handle is cut in the message, not echoed whole
    finally:
        handles.close_all()
    with pytest.raises(ValueError, match="needs a PythonTool\\(session=True\\)"):
        PythonSessionHandles(PythonTool())


def test_serve_mcp_names_python_session_among_its_tools():
    from agent_envs.server.mcp import make_tools

    assert make_tools(["python_session"], argparse.Namespace()) == []  # served as handles, not one tool
    with pytest.raises(ValueError, match="choose from python, search, browse, python_session"):
        make_tools(["sessions"])
