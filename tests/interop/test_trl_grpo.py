"""TRL's GRPOTrainer trains 2 steps on AgentMath-v0 through `agent_envs.interop.trl`, in a venv
with TRL pinned: once on local envs, once on sessions of a live `agent-envs serve-env`.

The venv is built once and cached beside the MCP test's (`tests/tools/mcp_support.py`); it sees
our own venv's packages (torch, transformers, agent_envs) through a `.pth` file, so pip installs
only what the pin needs beyond them (nothing where our venv's dev extra already has that TRL),
with torch held at the installed version (never a CUDA wheel).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from algorithms.models.tiny import build_tiny_model
from tests.servers import free_port, running_server
from tests.tools.mcp_support import PyPIUnreachable, server_venv

TRL = "trl==1.16.0"  # docs/interop.md names the same pin
HERE = Path(__file__).parent


def trl_venv() -> Path:
    """The venv with `TRL` on top of this interpreter's packages, built on first use and reused."""

    def see_our_packages(folder: Path) -> list[str]:
        site = subprocess.run([folder / "bin" / "python", "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        # after the venv's own site-packages: what pip installs there wins over ours
        ours = sysconfig.get_paths()["purelib"]
        Path(site, "agent_envs_base.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
        constraint = folder / "constraints.txt"  # never a CUDA build of torch
        constraint.write_text(f"torch=={torch.__version__}\n")
        return ["-c", str(constraint)]

    try:
        return server_venv(TRL, python=sys.executable, prepare=see_our_packages)
    except PyPIUnreachable as exc:
        pytest.skip(str(exc))


def grpo(python: Path, model: Path, out: Path, url: str | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONPATH": str(HERE.parents[1])}
    proc = subprocess.run([str(python), str(HERE / "trl_grpo.py"), json.dumps({"model": str(model), "url": url,
                                                                               "out": str(out)})],
                          capture_output=True, text=True, timeout=900, env=env, cwd=out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def setup() -> tuple[Path, Path]:
    return trl_venv() / "bin" / "python", build_tiny_model(seed=0)


def check(run: dict) -> None:
    assert run["trl"] == TRL.split("==")[1]
    assert run["steps"] == 2, run
    # 2 steps x 2 rollouts, each graded by our env; the fitted model calls python, which prints 4
    assert len(run["rewards"]) == 4 and run["tool_calls"]["graded"] == 4, run
    assert run["tool_calls"]["python"] >= 1 and run["tool_calls"]["printed_4"] == run["tool_calls"]["python"], run
    assert [entry["step"] for entry in run["log"]] == [1, 2]
    assert run["log"][0]["tools/call_frequency"] > 0, run["log"][0]


@pytest.mark.slow  # the venv on a machine's first run, then about a minute per run on the tiny model
def test_grpo_trainer_runs_2_steps_on_local_envs(setup, tmp_path):
    python, model = setup
    check(grpo(python, model, tmp_path, None))


@pytest.mark.slow  # as above, against a live serve-env
def test_grpo_trainer_runs_2_steps_on_serve_env_sessions(setup, tmp_path):
    python, model = setup
    port = free_port()
    cmd = [str(Path(sys.executable).parent / "agent-envs"), "serve-env", "AgentMath-v0", "--port", str(port),
           "--out", str(tmp_path)]  # its openenv.yaml goes with the test, not into the checkout
    with running_server(cmd, port, tmp_path / "serve-env.log") as url:
        run = grpo(python, model, tmp_path, url)
    check(run)
    log = (tmp_path / "serve-env.log").read_text()
    assert "Traceback" not in log, log[-3000:]
