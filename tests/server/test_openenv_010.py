"""OpenEnv's own code (PyPI `openenv` 0.10.0, the package that `openenv-core` became) against a
real `serve-env` on 127.0.0.1: its conformance check, `openenv validate --url`, passes every
criterion of the "openenv-http/1.x" profile, the `/mcp` JSON-RPC reply included; and its
`GenericEnvClient` plays a whole episode of each of the three worlds (the task's gold trace) to
reward 1, and its session is freed when the client closes.

`openenv` runs from a venv of its own, built on first use and cached under `.cache/mcp-venvs/`
like the MCP tests' third-party server (tests/tools/mcp_support.py); without PyPI the test skips."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from env_server_helpers import gold_episode, serving

from tests.tools.mcp_support import PyPIUnreachable, server_venv

OPENENV = "openenv==0.10.0"
# run by openenv's venv: OpenEnv's client, as its docs show it, playing the actions it is given
PLAY = """
import json, sys
from openenv.core.generic_client import GenericEnvClient
args = json.loads(sys.argv[1])
with GenericEnvClient(base_url=args["url"]).sync() as env:
    first = env.reset(seed=args["seed"])
    out = {"done": first.done, "task_id": first.observation["info"]["task_id"], "steps": []}
    for action in args["actions"]:
        result = env.step({"message": action})
        out["steps"].append([result.reward, result.done])
    out["metadata"] = result.metadata
    out["state"] = env.state()
print(json.dumps(out))
"""
CRITERIA = {"openapi_version_available", "health_endpoint", "metadata_endpoint", "schema_endpoint", "mcp_endpoint",
            "mode_endpoint_consistency"}


@pytest.fixture(scope="module")
def openenv() -> str:
    try:
        return str(server_venv(OPENENV) / "bin")
    except PyPIUnreachable as exc:
        pytest.skip(str(exc))


@pytest.mark.slow  # builds openenv's venv from PyPI on a machine's first run (about two minutes)
def test_openenv_validate_passes_against_serve_env(openenv):
    with serving("AgentMath-v0") as (url, _):
        proc = subprocess.run([f"{openenv}/openenv", "validate", "--url", url, "--json"], capture_output=True, text=True,
                              timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["standard_profile"] == "openenv-http/1.x" and report["passed"] is True, report["summary"]
    assert {c["id"] for c in report["criteria"] if c["passed"]} == CRITERIA, report["criteria"]
    mcp = next(c for c in report["criteria"] if c["id"] == "mcp_endpoint")
    assert mcp["actual"] == {"status_code": 200, "jsonrpc": "2.0"}


@pytest.mark.slow  # the venv, as above; then three servers and episodes (a few seconds each)
@pytest.mark.parametrize("env_id", ["AgentMath-v0", "AgentQA-v0", "AgentSearch-v0"])
def test_openenv_s_own_client_plays_a_whole_episode_of_each_world(openenv, env_id):
    task_id, gold = gold_episode(env_id, seed=3)
    with serving(env_id) as (url, server):
        proc = subprocess.run([f"{openenv}/python", "-c", PLAY, json.dumps({"url": url, "seed": 3, "actions": gold})],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        played = json.loads(proc.stdout)
        deadline = time.monotonic() + 10  # the close frame may still be on its way when the client exits
        while server.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.sessions == {}, "the client's close frees its session"
    assert played["task_id"] == task_id and played["done"] is False
    assert played["steps"][-1] == [1.0, True], played
    assert all(done is False for _, done in played["steps"][:-1]), played
    assert played["state"]["step_count"] == len(gold) and played["state"]["done"] is True
    assert played["metadata"] == played["state"], "StepResult.metadata: the episode's state after the step"
