"""`agent-envs serve-env` as a person runs it: a subprocess that writes openenv.yaml, serves the
env with typed key=value settings, and, once killed, leaves the client with one clear line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from env_server_helpers import call

from agent_envs.remote.env_client import EnvServerError, RemoteEnv
from tests.servers import REPO, free_port


def _wait_healthy(proc: subprocess.Popen, url: str, log) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"serve-env exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"serve-env did not answer in 120 s:\n{log.read_text()[-3000:]}")


def test_serve_env_writes_openenv_yaml_and_a_killed_server_is_one_clear_line(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve-env.log"
    cmd = [sys.executable, "-m", "agent_envs.cli", "serve-env", "AgentMath-v0", "max_tool_calls=2",
           "world.difficulty=2", "--port", str(port), "--out", str(tmp_path / "spec")]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        _wait_healthy(proc, url, log)
        spec = yaml.safe_load((tmp_path / "spec" / "openenv.yaml").read_text())
        assert spec["spec_version"] == 1 and spec["name"] == "agentmath_v0" and spec["port"] == port
        assert spec["app"] == "agent_envs.server.env_server:main"
        status, info, _ = call("GET", url + "/info")
        assert status == 200 and info["env_kwargs"] == {"max_tool_calls": 2, "world": {"difficulty": 2}}
        env = RemoteEnv(url, "AgentMath-v0")
        env.reset(seed=0)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        with pytest.raises(EnvServerError) as err:
            env.step("<answer> \\boxed{1} </answer>")
        message = str(err.value)
        assert "\n" not in message and url in message, message
        assert "connection refused" in message and "agent-envs serve-env" in message, message
        assert err.value.__cause__ is None and err.value.__suppress_context__, "no aiohttp traceback below it"
        with pytest.raises(EnvServerError, match=r"connection refused .*serve-env"):
            RemoteEnv(url)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_serve_env_names_a_bad_id_or_setting_in_one_line(tmp_path):
    for args, words in [(["AgentMaths-v0"], "'AgentMaths-v0' is not a registered env id"),
                        (["AgentMath-v0", "max_tool_calz=1"], "max_tool_calz")]:
        done = subprocess.run([sys.executable, "-m", "agent_envs.cli", "serve-env", *args, "--out", str(tmp_path)],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
        assert done.returncode == 2 and words in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and not (tmp_path / "openenv.yaml").exists()
