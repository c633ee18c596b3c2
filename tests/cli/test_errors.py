"""Every user mistake on the `agent-envs` command line is one line on stderr and exit status 2,
without a traceback, and writes nothing: unknown ids, missing files and folders, bad overrides and
sampling settings, damaged recordings, bad ports and ports in use, a missing extra. Each row runs
the real command in a fresh process from an empty folder, as a user does; the line starts with
`agent-envs COMMAND: `, whichever module wrote it.

The port cases hold a real listening socket on 127.0.0.1 and start the real servers against it.
The missing-extra case hides the learner packages from the process (they are installed here) with
an import hook, as tests/packaging/test_envs_only.py does.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# log records a server writes while it starts (time, level): not the error line
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")

# (argv, words the one stderr line holds); {tmp} is a fresh folder, {port} a port in use
CASES = [
    (["play", "AgentMaths-v0"], ["'AgentMaths-v0' is not a registered env id", "did you mean 'AgentMath-v0'"]),
    (["play"], ["play needs an env id", "agent-envs list"]),
    (["play", "AgentMath-v0", "max_tool_calls=x"], ["'env_kwargs.max_tool_calls' must be an integer, got 'x'"]),
    (["play", "AgentMath-v0", "max_tool_cals=1"], ["max_tool_cals", "did you mean 'max_tool_calls'"]),
    (["play", "AgentMath-v0", "world.difficulty=9"], ["'ArithmeticConfig.difficulty' must be in [1, 3], got 9"]),
    (["play", "AgentMath-v0", "--seed", "x"], ["'seed' must be an integer, got 'x'"]),
    (["play", "AgentMath-v0", "sede=1"], ["sede", "did you mean 'seed'"]),
    (["train", "--algo", "grpo", "model=tiny", "env=AgentMaths-v0"], ["'AgentMaths-v0' is not a registered env id"]),
    (["train", "--algo", "grpo", "--config", "{tmp}/nope.yaml"], ["config file {tmp}/nope.yaml not found"]),
    (["train", "--algo", "grpo", "model=tiny", "lrr=1"], ["train: override 'lrr=1': unknown config key 'lrr'",
                                                         "did you mean 'lr'"]),
    (["train", "--algo", "grpo", "model={tmp}/no_model"], ["{tmp}/no_model does not exist"]),
    (["train", "--algo", "grpo", "model=tiny", "--resume-from", "{tmp}/no_run"], ["--resume-from {tmp}/no_run",
                                                                                   "neither a checkpoint"]),
    (["train", "--algo", "grpx"], ["invalid choice: 'grpx'"]),
    (["sft", "env=AgentMaths-v0"], ["'AgentMaths-v0' is not a registered env id"]),
    (["sft", "model=tiny", "data={tmp}/nope.jsonl"], ["SFT data file", "{tmp}/nope.jsonl not found"]),
    (["evaluate", "--env", "AgentMaths-v0", "--model", "tiny"], ["'AgentMaths-v0' is not a registered env id"]),
    (["evaluate", "--env", "AgentMath-v0", "--model", "{tmp}/no_model"], ["{tmp}/no_model does not exist"]),
    (["evaluate", "--model", "tiny"], ["evaluate needs --env", "not a run's model"]),
    (["evaluate", "--env", "AgentMath-v0", "--model", "tiny", "temprature=0"], ["did you mean 'temperature'"]),
    (["evaluate", "--env", "AgentMath-v0", "--model", "tiny", "--n", "two"], ["'n' must be an integer"]),
    (["evaluate", "--bogus"], ["unrecognized arguments: --bogus"]),
    (["evaluate", "--replay", "{tmp}/no_recording"], ["--replay {tmp}/no_recording: no such folder"]),
    (["evaluate", "--replay", "{tmp}/broken_summary"], ["{tmp}/broken_summary/summary.json: not valid JSON"]),
    (["evaluate", "--replay", "{tmp}/broken_samples"], ["{tmp}/broken_samples/samples.jsonl, line 2: not valid JSON"]),
    (["evaluate", "--replay", "{tmp}/no_samples"], ["not a recorded evaluation (samples.jsonl missing)"]),
    (["evaluate", "--replay", "{tmp}/no_config"], ["summary.json: no config and metrics"]),
    (["compare", "--report-only", "{tmp}/empty"], ["--report-only {tmp}/empty: no run results"]),
    (["compare", "--algos", "grpo,dapx"], ["unknown algorithm 'dapx'", "did you mean 'dapo'"]),
    (["quickstart", "algo=grpx"], ["'algo' must be one of", "did you mean 'grpo'"]),
    (["analyze", "{tmp}/no_run"], ["{tmp}/no_run: no such folder"]),
    (["view", "{tmp}/no_run"], ["{tmp}/no_run is not a folder"]),
    (["serve-retriever", "--corpus", "{tmp}/nope.jsonl"], ["corpus file {tmp}/nope.jsonl not found"]),
    (["serve-retriever", "--corpus", "{tmp}/corpus.jsonl", "--port", "{port}"], ["{port}", "in use", "--port"]),
    (["serve-sandbox", "--port", "{port}"], ["{port}", "in use", "--port"]),
    (["view", "{tmp}/a_run", "--port", "{port}"], ["{port}", "in use", "--port"]),
    (["view", "{tmp}/empty"], ["{tmp}/empty: no learner run", "or evaluate output"]),
    (["serve-rollout", "{tmp}/empty", "--port", "{port}"], ["port {port} is in use", "--port"]),
    (["serve-env", "AgentMath-v0", "--port", "{port}"], ["port {port} is in use", "--port"]),
    (["serve-env", "AgentMath-v0", "--port", "70000"], ["argument --port: 70000 is not a port number"]),
    (["serve-sandbox", "--port", "70000"], ["argument --port: 70000 is not a port number"]),
    (["serve-retriever", "--corpus", "{tmp}/corpus.jsonl", "--port", "x"], ["'x' is not a port number"]),
    (["gateway", "--model", "tiny", "--port", "-1"], ["argument --port: -1 is not a port number"]),
    (["gateway", "--model", "tiny", "--port", "{port}"], ["port {port} is in use", "--port"]),
    (["view", "{tmp}/a_run", "--port", "65536"], ["argument --port: 65536 is not a port number"]),
    (["serve-mcp", "--port", "9000"], ["--port applies to --transport http only", "add --transport http"]),
    (["evaluate", "--env", "AgentMath-v0", "--model", "tiny", "--temperature", "-1"],
     ["config field 'temperature' must be >= 0", "got -1.0"]),
    (["evaluate", "--env", "AgentMath-v0", "--model", "tiny", "--n", "0"], ["config field 'n' must be >= 1", "got 0"]),
    (["evaluate", "--env", "AgentMath-v0", "--model", "tiny", "top_p=1.5"], ["'top_p' must be in (0, 1]"]),
    (["play", "AgentMath-v0", "max_tool_calls=-1"], ["env setting max_tool_calls must be >= 0, got -1"]),
    (["data", "download"], ["agent-envs data download: name benchmark ids"]),
    (["data", "download", "hotpotqx"], ["agent-envs data download: no download for 'hotpotqx'"]),
    (["--import", "no_such_module", "list"], ["--import no_such_module: cannot import module 'no_such_module'"]),
    (["play", "--import", "no_such_module", "AgentMath-v0"], ["cannot import module 'no_such_module'"]),
    (["play", "no_such_module:Mine-v0"], ["'no_such_module:Mine-v0': cannot import module 'no_such_module'"]),
    (["play", "agent_envs.envs:Mine-v0"], ["'Mine-v0' is not a registered env id",
                                           "importing agent_envs.envs registered no such id"]),
]  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Damaged recordings and an empty folder, as a user's disk may hold them."""
    tmp = tmp_path_factory.mktemp("cli_errors")
    (tmp / "empty").mkdir()
    (tmp / "a_run").mkdir()  # a learner run as the viewer finds it
    (tmp / "a_run" / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    (tmp / "corpus.jsonl").write_text(json.dumps({"id": "1", "contents": "Paris is in France."}) + "\n")
    good = json.dumps({"config": {"env": "AgentMath-v0", "model": "tiny"}, "metrics": {"pass@1": 0.0}})
    for name, summary, samples in [("broken_summary", '{"config": ', "{}\n"),
                                   ("broken_samples", good, '{"task_id": "a"}\n{"task_id": \n'),
                                   ("no_samples", good, None), ("no_config", '{"metrics": {}}', "")]:
        (tmp / name).mkdir()
        (tmp / name / "summary.json").write_text(summary)
        if samples is not None:
            (tmp / name / "samples.jsonl").write_text(samples)
    return tmp


@pytest.fixture(scope="module")
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


# `train` starts a fresh process that imports the learner stack: 5-6.5 s a case on a busy 2-core
# machine, so those cases are `slow` (make test runs them, make test-fast not)
@pytest.mark.parametrize("argv, words", [pytest.param(a, w, marks=[pytest.mark.slow] if a[0] == "train" else [])
                                         for a, w in CASES], ids=[" ".join(a)[:60] for a, _ in CASES])
def test_a_user_mistake_is_one_line_and_exit_status_2(argv, words, folder, busy_port, tmp_path):
    fill = {"tmp": str(folder), "port": str(busy_port)}
    _fails_in_one_line([a.format(**fill) for a in argv], [w.format(**fill) for w in words], folder, tmp_path)


# hides the learner-side packages, as an install without the `train` extra lacks them
WITHOUT_TRAIN = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "accelerate", "peft", "vllm"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NotInstalled())
from agent_envs.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("argv", [["train", "--algo", "grpo"], ["sft"], ["quickstart"], ["gateway", "--model", "tiny"]],
                         ids=lambda argv: argv[0])
def test_a_learner_command_without_the_train_extra_names_the_extra(argv, folder, tmp_path):
    _fails_in_one_line(argv, ["No module named 'torch'", "pip install 'agent-envs[train]'"], folder, tmp_path,
                       python=["-c", WITHOUT_TRAIN])


def _fails_in_one_line(argv: list[str], words: list[str], folder: Path, cwd: Path,
                       python: tuple[str, ...] | list[str] = ("-m", "agent_envs.cli")) -> None:
    """Run `agent-envs ARGV` in a fresh process from the empty folder `cwd`: exit status 2, one
    line `agent-envs COMMAND: ...` holding every word, and nothing written there or in `folder`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    env.pop("AGENT_ENVS_TRACEBACK", None)
    before = _listing(folder)
    proc = subprocess.run([sys.executable, *python, *argv], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300, stdin=subprocess.DEVNULL)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not LOG_RECORD.match(line)]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1, proc.stderr[-3000:]
    command = [a for a in argv if not a.startswith("-") and a != "no_such_module"][:2]
    prefix = f"agent-envs {' '.join(command if command[0] == 'data' else command[:1])}: "
    assert lines[0].startswith(prefix), (prefix, lines[0])
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert list(cwd.iterdir()) == [], f"written into the working folder: {list(cwd.iterdir())}"
    assert _listing(folder) == before, "the command changed the files it was given"


def _listing(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime for p in folder.rglob("*")}


def test_analyze_writes_beside_the_run_without_out(tmp_path):
    from agent_envs.cli import main
    from algorithms.rollout.trajectory import Trajectory, write_jsonl

    run = tmp_path / "run"  # a learner run as `train ... save_trajectories=true` leaves it
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"algo": "grpo"}))
    (run / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    traj = Trajectory(prompt_ids=[1], response_ids=[5, 6], loss_mask=[1, 1], logprobs=[-0.1, -0.2])
    write_jsonl([traj, traj], run / "trajectories" / "step_000001.jsonl")
    assert main(["analyze", str(run)]) == 0
    assert (run / "analysis" / "summary.json").is_file() and (run / "analysis" / "summary.md").is_file()
