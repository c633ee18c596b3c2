"""MCP both ways, with real servers over real transports: nothing here is mocked.

- a third-party server from PyPI (`mcp-server-calculator`, which pins mcp<2) in a venv of its
  own, driven over stdio by `McpToolset` (mcp 2.x);
- our `agent-envs serve-mcp` as a subprocess, reached with the official SDK client over stdio and
  streamable HTTP, and used as the python tool of an AgentMath-v0 world episode;
- the failures a model meets (unknown tool, bad arguments, a server killed mid-call, a call over
  its budget), each an observation naming its cause, with the episode going on after it;
- record, then replay with no server at all; per-task allow-lists; the docs' examples.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mcp_support import PyPIUnreachable, calculator_command

from agent_envs.base.task import Task
from agent_envs.core.env import ToolEnv
from agent_envs.tools.mcp import McpCallError, McpConnection, McpTool, McpToolset, TaskToolFilter
from agent_envs.tools.recording import ToolRecording
from agent_envs.worlds import ArithmeticConfig, ArithmeticWorld
from tests.servers import free_port

pytest.importorskip("mcp", reason="the MCP tests need the `mcp` extra (pip install -e '.[mcp]')")

REPO = Path(__file__).resolve().parents[2]
SERVE = [sys.executable, "-m", "agent_envs.cli", "serve-mcp"]
SIX_BY_SEVEN = Task(id="six-by-seven", question="What is 6*7?", answers=["42"], reward="math")


def answer(value: str) -> str:
    return f"<think>done</think><answer>\\boxed{{{value}}}</answer>"


@pytest.fixture(scope="module")
def ours():
    """Our server over stdio with python and search, shared by the tests that do not break it."""
    with McpToolset([*SERVE, "--tools", "python,search"], timeout_s=20) as toolset:
        yield toolset


@pytest.fixture(scope="module")
def calculator():
    try:
        command = calculator_command()
    except PyPIUnreachable as exc:
        pytest.skip(str(exc))
    with McpToolset(command, timeout_s=20) as toolset:
        yield toolset


# -- a third-party server pinned to another mcp ------------------------------------------------


@pytest.mark.slow  # builds the server's venv from PyPI on a machine's first run (about a minute)
def test_calculator_from_pypi_runs_from_its_own_venv(calculator):
    venv_mcp = subprocess.run([str(Path(calculator.connection.argv[0]).parent / "python"), "-c",
                               "import importlib.metadata as m; print(m.version('mcp'))"],
                              capture_output=True, text=True, check=True).stdout.strip()
    assert int(venv_mcp.split(".")[0]) < 2  # the server speaks through mcp 1.x, we through 2.x
    (tool,) = calculator.tools()
    assert (tool.name, tool.input_schema["required"]) == ("calculate", ["expression"])
    assert tool.run('{"expression": "6*7"}').text == "42"
    assert tool.run("2**10").text == "1024"  # one argument: the bare value is accepted too
    failed = tool.run('{"expression": "1/0"}')
    assert (failed.ok, failed.error) == (False, "tool_error") and "division by zero" in failed.text


@pytest.mark.slow
def test_calculator_solves_a_task_with_json_tool_calls(calculator):
    env = ToolEnv([SIX_BY_SEVEN], calculator.tools(), protocol="json")
    prompt, _ = env.reset(seed=0)
    schema = json.dumps(calculator.tools()[0].input_schema)
    assert schema in prompt  # the tool's JSON Schema is in the tools list the model reads
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "6*7"}}</tool_call>'
    obs, reward, terminated, truncated, info = env.step(call)
    assert "42" in obs and info["tool_result"]["ok"] and not terminated
    _, reward, terminated, _, info = env.step("The product is \\boxed{42}.")
    assert (reward, terminated, info["tool_calls"]) == (1.0, True, 1)


# -- our server, through the official client ----------------------------------------------------


async def test_our_server_round_trip_with_the_official_client():
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=SERVE[0], args=[*SERVE[1:], "--tools", "python"], cwd=str(REPO))
    async with Client(params) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert list(listed) == ["python"]
        assert listed["python"].input_schema["required"] == ["code"]
        assert listed["python"].input_schema["properties"]["code"]["type"] == "string"
        result = await client.call_tool("python", {"code": "print(6*7)"})
        assert (result.content[0].text, result.is_error) == ("42", False)
        failed = await client.call_tool("python", {"code": "1/0"})
        assert "ZeroDivisionError" in failed.content[0].text  # code that raises is output, as in an env
        broken = await client.call_tool("python", {"source": "print(1)"})
        assert broken.is_error and "code" in broken.content[0].text  # the schema is enforced


async def test_our_search_and_browse_in_process_with_the_official_client():
    """The offline defaults of serve-mcp's search (knowledge world) and browse (`--web-world`)."""
    import argparse

    from mcp import Client

    from agent_envs.server.mcp import build_mcp_server, make_tools

    tools = make_tools(["search", "browse"], argparse.Namespace(web_world=True))
    async with Client(build_mcp_server(tools)) as client:
        schemas = {t.name: t.input_schema for t in (await client.list_tools()).tools}
        assert (schemas["search"]["required"], schemas["browse"]["required"]) == (["query"], ["url"])
        page = await client.call_tool("browse", {"url": "https://atlas.web/teapo"})
        assert not page.is_error and "URL: https://atlas.web/teapo" in page.content[0].text
        hits = await client.call_tool("search", {"query": "capital"})
        assert not hits.is_error and hits.content[0].text.strip()
    with pytest.raises(ValueError, match="unknown tool\\(s\\) \\['shell'\\]; choose from python, search, browse"):
        make_tools(["python", "shell"])


def test_serve_mcp_names_a_bad_tool_list():
    run = subprocess.run([*SERVE, "--tools", "python,shell"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown tool(s) ['shell']" in run.stderr


async def test_astep_on_the_callers_loop(ours):
    env = ToolEnv([SIX_BY_SEVEN], ours.tools())
    env.reset(seed=0)
    obs, *_ = await env.astep('<python>{"code": "print(6*7)"}</python>')
    assert "42" in obs
    _, reward, *_ = await env.astep(answer("42"))
    assert reward == 1.0


def test_our_server_over_streamable_http():
    port = free_port()
    proc = subprocess.Popen([*SERVE, "--tools", "python", "--transport", "http", "--port", str(port)],
                            cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the port answers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.2)
        with McpToolset(url, timeout_s=20) as toolset:
            (python,) = toolset.tools()
            assert python.run('{"code": "print(6*7)"}').text == "42"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


# -- a world task through an MCP tool ----------------------------------------------------------


def _world_task():
    return ArithmeticWorld(ArithmeticConfig(seed=3))[0]


def _json_call(step: str) -> str:
    """A gold-trace step with its python code rewritten as the MCP call's JSON arguments."""
    return re.sub(r"<python>(.*?)</python>", lambda m: "<python>" + json.dumps({"code": m.group(1)}) + "</python>",
                  step, flags=re.DOTALL)


def test_world_task_solved_through_our_served_python(ours):
    tools = ours.tools()
    assert [t.name for t in tools] == ["python", "search"] and all(isinstance(t, McpTool) for t in tools)
    task = _world_task()
    env = ToolEnv([task], [tools[0]], max_tool_calls=3)
    prompt, _ = env.reset(seed=0)
    assert 'write <python> {"code": "<string>"} </python>' in prompt and "JSON object of its arguments" in prompt
    actions = [_json_call(step) for step in task.gold_trace]
    assert any('{"code": ' in a for a in actions)
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        if "tool_result" in info:
            assert info["tool_result"]["ok"], obs
    assert (reward, terminated, truncated, info["format_ok"]) == (1.0, True, False, True)


# -- failures become observations, and the episode goes on --------------------------------------


def _continues(env: ToolEnv, tool: str = "python") -> None:
    obs, _, terminated, _, info = env.step(f'<{tool}>{{"code": "print(6*7)"}}</{tool}>')
    assert obs.strip().endswith("42\n</result>") and not terminated, obs
    _, reward, terminated, _, _ = env.step(answer("42"))
    assert (reward, terminated) == (1.0, True)


def test_unknown_tool_is_an_observation(ours):
    ghost = McpTool(ours.connection, "no_such_tool", input_schema={"type": "object", "properties": {}})
    env = ToolEnv([SIX_BY_SEVEN], [ghost, ours.tools()[0]])
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step("<no_such_tool></no_such_tool>")
    assert "Unknown tool: no_such_tool" in obs and info["tool_result"]["error"] == "unknown_tool"
    assert not terminated
    _continues(env)
    # with JSON calls the model can name any function: the protocol answers, naming what exists
    env = ToolEnv([SIX_BY_SEVEN], ours.tools(), protocol="json")
    env.reset(seed=0)
    obs, *_ = env.step('<tool_call>{"name": "calculator", "arguments": {"x": 1}}</tool_call>')
    assert "unknown tool 'calculator'; available: python, search" in obs


def test_bad_arguments_are_an_observation(ours):
    env = ToolEnv([SIX_BY_SEVEN], ours.tools())
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step('<python>{"source": "print(1)"}</python>')
    assert "missing required argument(s) code" in obs and info["tool_result"]["error"] == "bad_arguments"
    obs, _, _, _, info = env.step('<python>{"code": 7}</python>')
    assert "argument code must be string, got int" in obs
    assert not terminated
    _continues(env)


# A third-party server's tools need not take one string: none at all, or optional ones.
CLOCK_SERVER = """
from mcp.server.mcpserver import MCPServer
server = MCPServer("clock", log_level="WARNING")

@server.tool()
def tick() -> str:
    return "tock"

@server.tool()
def greet(name: str, punctuation: str = "!") -> str:
    return "hello " + name + punctuation

server.run()
"""


def test_json_calls_of_tools_without_one_string_argument(tmp_path):
    script = tmp_path / "clock_server.py"
    script.write_text(CLOCK_SERVER)
    with McpToolset([sys.executable, str(script)], timeout_s=20) as clock:
        for protocol, calls in [
            ("json", ['<tool_call>{"name": "tick", "arguments": {}}</tool_call>',
                      '<tool_call>{"name": "greet", "arguments": {"name": "Ada"}}</tool_call>',
                      '<tool_call>{"name": "greet", "arguments": {"name": "Ada", "punctuation": "?"}}</tool_call>']),
            ("arpo", ["<tick></tick>", '<greet>{"name": "Ada"}</greet>',
                      '<greet>{"name": "Ada", "punctuation": "?"}</greet>']),
        ]:
            env = ToolEnv([SIX_BY_SEVEN], clock.tools(), protocol=protocol)
            env.reset(seed=0)
            observations = [env.step(call)[0] for call in calls]
            for obs, expected in zip(observations, ["tock", "hello Ada!", "hello Ada?"], strict=True):
                assert expected in obs, (protocol, obs)


NAP_SERVER = """
import time
from mcp.server.mcpserver import MCPServer
server = MCPServer("nap", log_level="WARNING")

@server.tool()
def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "awake"

server.run()
"""


def test_a_call_over_a_short_budget_is_an_observation(tmp_path):
    """The fast twin of the slow test below: a small server of our own, one call (the restart
    after it is the slow test's)."""
    script = tmp_path / "nap_server.py"
    script.write_text(NAP_SERVER)
    with McpToolset([sys.executable, str(script)], timeout_s=0.5) as toolset:
        env = ToolEnv([SIX_BY_SEVEN], toolset.tools(), max_tool_calls=5)
        env.reset(seed=0)
        start = time.monotonic()
        obs, _, terminated, _, info = env.step('<nap>{"seconds": 30}</nap>')
        assert time.monotonic() - start < 15  # the budget, not the nap, ended it (room for a busy machine)
        assert "nap timed out after 0.5 seconds" in obs and "restarted on the next call" in obs, obs
        assert info["tool_result"]["error"] == "timeout" and not terminated


@pytest.mark.slow
def test_server_killed_mid_call_is_an_observation_and_restarts(tmp_path):
    pid_file = tmp_path / "server.pid"
    # a shell that records its pid and becomes the server, so the test knows what to kill
    command = ["sh", "-c", f'echo $$ > {pid_file}; exec "$@"', "sh", *SERVE, "--tools", "python"]
    with McpToolset(command, timeout_s=30, cwd=str(REPO)) as toolset:
        env = ToolEnv([SIX_BY_SEVEN], toolset.tools(), max_tool_calls=5)
        env.reset(seed=0)
        first_pid = int(pid_file.read_text())
        threading.Timer(2.0, os.kill, (first_pid, signal.SIGKILL)).start()  # while the code sleeps
        start = time.monotonic()
        obs, _, terminated, _, info = env.step('<python>{"code": "import time; time.sleep(20)"}</python>')
        assert time.monotonic() - start < 15
        assert "exited or closed the connection" in obs and "restarted on the next call" in obs
        assert info["tool_result"]["error"] == "server_died" and not terminated
        _continues(env)  # a new server answers
        assert int(pid_file.read_text()) != first_pid


@pytest.mark.slow
def test_call_over_its_budget_is_an_observation(tmp_path):
    with McpToolset([*SERVE, "--tools", "python", "--python-timeout-s", "30"], timeout_s=1.5) as toolset:
        env = ToolEnv([SIX_BY_SEVEN], toolset.tools(), max_tool_calls=5)
        env.reset(seed=0)
        start = time.monotonic()
        obs, _, terminated, _, info = env.step('<python>{"code": "import time; time.sleep(30)"}</python>')
        assert time.monotonic() - start < 10
        assert "python timed out after 1.5 seconds" in obs and info["tool_result"]["error"] == "timeout"
        assert not terminated
        _continues(env)


def test_server_that_cannot_start_is_an_observation():
    toolset = McpToolset(["/nonexistent/mcp-server"], listing=None)
    tool = McpTool(toolset.connection, "calculate", input_schema={"type": "object", "properties": {}})
    env = ToolEnv([SIX_BY_SEVEN], [tool])
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step("<calculate>{}</calculate>")
    assert "could not be reached" in obs and "mcp-server" in obs and not terminated
    assert info["tool_result"]["error"] == "server_unavailable"
    with pytest.raises(RuntimeError, match="could not be reached"):
        toolset.tools()
    toolset.close()


# -- record, replay without a server; per-task tools --------------------------------------------


def test_replay_needs_no_server(ours, tmp_path):
    task = _world_task()
    actions = [_json_call(step) for step in task.gold_trace]
    listing = ours.save_listing(tmp_path / "listing.json")
    with ToolRecording(tmp_path / "tools.jsonl", "record") as rec:
        env = ToolEnv([task], [rec.wrap(ours.tools()[0])])
        env.reset(seed=0)
        recorded = [env.step(a) for a in actions]
    assert recorded[-1][1] == 1.0

    offline = McpToolset(["/nonexistent/mcp-server"], listing=listing, allow=["python"])
    replay = ToolRecording(tmp_path / "tools.jsonl", "replay")
    env = ToolEnv([task], [replay.wrap(t) for t in offline.tools()])
    env.reset(seed=0)
    replayed = [env.step(a) for a in actions]
    assert [r[:4] for r in replayed] == [r[:4] for r in recorded]
    assert replay.stats()["missing"] == 0 and offline.connection._loop is None  # nothing was started
    with pytest.raises(ValueError, match="has no tool 'browse'; it offers python, search"):
        McpToolset(["/nonexistent/mcp-server"], listing=listing, allow=["browse"]).tools()


def test_each_task_gets_only_the_mcp_tools_it_allows(ours):
    tasks = [
        Task(id="py-only", question="What is 6*7?", answers=["42"], reward="math", metadata={"mcp_tools": ["python"]}),
        Task(id="any", question="What is 6*7?", answers=["42"], reward="math"),
        Task(id="typo", question="What is 6*7?", answers=["42"], reward="math", metadata={"mcp_tools": ["pyton"]}),
    ]
    env = TaskToolFilter(ToolEnv(tasks, ours.tools(), protocol="json"))
    prompt, _ = env.reset(seed=0, options={"index": 0})
    assert '"name": "python"' in prompt and '"name": "search"' not in prompt
    obs, *_ = env.step('<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>')
    assert "unknown tool 'search'; available: python" in obs
    prompt, _ = env.reset(seed=0, options={"index": 1})
    assert '"name": "search"' in prompt
    with pytest.raises(ValueError, match="task 'typo': metadata field 'mcp_tools' names \\['pyton'\\]"):
        env.reset(seed=0, options={"index": 2})


def test_task_filter_over_recorded_tools(ours, tmp_path):
    """An evaluation with --record wraps the env's tools; the filter offers the wrapped ones, so
    every call is still recorded, and a task allowing more gets them back."""
    tasks = [Task(id="py-only", question="What is 6*7?", answers=["42"], reward="math",
                  metadata={"mcp_tools": ["python"]}),
             Task(id="any", question="What is 6*7?", answers=["42"], reward="math")]
    with ToolRecording(tmp_path / "tools.jsonl", "record") as rec:
        env = TaskToolFilter(ToolEnv(tasks, [rec.wrap(t) for t in ours.tools()]))
        prompt, _ = env.reset(seed=0, options={"index": 0})
        assert "<python>" in prompt and "<search>" not in prompt
        obs, *_ = env.step('<python>{"code": "print(6*7)"}</python>')
        assert "42" in obs and rec.stats()["recorded"] == 1
        prompt, _ = env.reset(seed=0, options={"index": 1})
        assert "<python>" in prompt and "<search>" in prompt


def test_bare_and_json_forms_are_one_call(ours):
    python = ours.tools()[0]
    assert python.normalize('{"code": "print(1)"}') == python.normalize("print(1)") == '{"code": "print(1)"}'
    assert McpConnection("http://127.0.0.1:1/mcp").label == "http://127.0.0.1:1/mcp"
    # a lone non-string argument written bare (as JSON, or as Python's str() of it)
    mean = McpTool(ours.connection, "mean", input_schema={
        "type": "object", "properties": {"values": {"type": "array"}}, "required": ["values"]})
    assert mean.arguments("[1, 2]") == mean.arguments(str({"values": [1, 2]}["values"])) == {"values": [1, 2]}
    assert mean.arguments('{"values": [3]}') == {"values": [3]}
    with pytest.raises(McpCallError, match="argument values must be array, got str"):
        mean.arguments("one two")
    with pytest.raises(ValueError, match="cannot be a tag"):
        McpTool(ours.connection, "bad name>")


# -- the docs run --------------------------------------------------------------------------------


@pytest.mark.slow
def test_docs_examples_run(tmp_path):
    """docs/interop.md's MCP examples, run as written, in order, in one fresh interpreter."""
    text = (REPO / "docs" / "interop.md").read_text()
    section = text.split("## MCP tools", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) >= 2
    script = tmp_path / "examples.py"
    script.write_text("\n".join(blocks))
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(REPO),  # `agent-envs` is the venv's script
                              "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout.splitlines()
    # the values the examples' comments state
    assert out[0].startswith("To use the python tool") and 'write <python> {"code": "<string>"} </python>' in out[0]
    assert out[1:5] == [" <result>", "42", "</result>", "1.0"]
    assert out[5] == "42 {'recorded': 0, 'replayed': 1, 'missing': 0, 'ambiguous': 0}"
    assert out[6:] == ["['python']", "42", "2026-07-28", "42"]
