"""`agent-envs evaluate RUN` agrees with what the quickstart showed: given the quickstart's folder
(positionally or as `--model`), or its RL run's folder, it finds the final model, takes the run's
env, held-out tasks, sampling setup and engine, and prints the quickstart's greedy and sampled
figures exactly. vLLM's own log lines are off unless asked. Then `quickstart --resume` on the same
folder keeps the finished SFT, resumes RL at its last step and reports the same rows again.

A real quickstart on the tiny model with a few steps; `evaluate` runs once in a fresh process,
as a user runs it, and otherwise through the same `main` in this process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_envs.cli import main

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = ["--sft-steps", "8", "--rl-steps", "1", "--eval-tasks", "4"]
METRIC = re.compile(r"^\s*([\w@/.-]+): (-?[\d.]+|nan)$")

pytestmark = pytest.mark.slow  # a quickstart, then evaluations of its model: ~1 min on 2 cores


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qs") / "quickstart"
    assert main(["quickstart", "--out", str(out), *QUICKSTART]) == 0
    return out


def shown(quickstart: Path) -> dict[str, dict[str, str]]:
    """The GRPO rows of the quickstart's results, each metric as `evaluate` prints it."""
    rows = json.loads((quickstart / "results.json").read_text())["rows"]
    grpo = [r for r in rows if r["label"].startswith("GRPO")]
    assert [r["label"].split(" (")[1][:6] for r in grpo] == ["greedy", "T=1, t"]
    return {kind: {k: f"{v:.4f}" for k, v in row.items() if isinstance(v, float)}
            for kind, row in zip(("greedy", "sampled"), grpo, strict=True)}  # fmt: skip


def printed(stdout: str) -> dict[str, dict[str, str]]:
    """The metrics `evaluate` printed under its "greedy (...)" and "sampled (...)" headings."""
    sections: dict[str, dict[str, str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith(("greedy (", "sampled (")):
            current = sections.setdefault(line.split(" ")[0], {})
        elif current is not None and (m := METRIC.match(line)):
            current[m.group(1)] = m.group(2)
    return sections


def assert_same_figures(stdout: str, quickstart: Path) -> None:
    got, want = printed(stdout), shown(quickstart)
    assert set(got) == {"greedy", "sampled"}, stdout[-3000:]
    for kind in ("greedy", "sampled"):
        common = set(got[kind]) & set(want[kind])
        assert {"pass@1", "f1", "tool_calls", "response_tokens"} <= common and len(common) >= 8, (kind, sorted(got[kind]))
        assert {k: got[kind][k] for k in common} == {k: want[kind][k] for k in common}, kind


def test_evaluate_positional_run_prints_the_quickstarts_figures(quickstart):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "agent_envs.cli", "evaluate", str(quickstart)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the RL run's model, tasks, sampling and engine, each said before the run
    assert f"evaluate: loading model {quickstart / 'grpo' / 'final_model'}" in proc.stdout
    assert "(the run's held-out tasks: eval_episodes=4)" in proc.stdout
    assert "engine hf (run " in proc.stdout
    assert_same_figures(proc.stdout, quickstart)
    assert "sampled (T=1, top_p=1, top_k=-1, 4 samples per task):" in proc.stdout


@pytest.mark.parametrize("how", ["--model QS", "--model QS/grpo", "QS/grpo/final_model"])
def test_evaluate_model_run_folder_agrees_too(quickstart, how, capsys):
    argv = [a.replace("QS", str(quickstart)) for a in how.split(" ")]
    capsys.readouterr()
    assert main(["evaluate", *argv]) == 0
    assert_same_figures(capsys.readouterr().out, quickstart)


def test_a_sampling_setting_asks_for_one_evaluation(quickstart, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(quickstart), "temperature=0", "--n", "2"]) == 0
    out = capsys.readouterr().out
    assert "greedy (" not in out and "sampled (" not in out and METRIC.search(out.splitlines()[-1])


def test_a_folder_of_several_runs_asks_for_one(tmp_path, quickstart, capsys):
    for name in ("grpo-0", "dapo-0"):
        shutil.copytree(quickstart / "grpo", tmp_path / name, ignore=shutil.ignore_patterns("trajectories", "tb"))
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} holds 2 runs (dapo-0, grpo-0); name one, e.g. {tmp_path / 'dapo-0'}" in err
    assert main(["evaluate", str(tmp_path / "grpo-0"), str(tmp_path / "dapo-0")]) == 2
    assert "evaluate takes one model or run folder" in capsys.readouterr().err


def test_vllm_log_lines_are_off_unless_asked():
    """vLLM's own lines (its config, CPU tuning hints, deprecation notes) drowned the figures; on
    this CPU it prints a dozen WARNING lines of its format even at its default level."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install 'agent-envs[vllm]')")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("VLLM_LOGGING_LEVEL", None)
    proc = subprocess.run([sys.executable, "-m", "agent_envs.cli", "evaluate", "--env", "AgentMath-v0", "--model",
                           "tiny", "--engine", "vllm", "--limit", "2", "max_response_tokens=16"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert not re.search(r"(INFO|WARNING|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d \[", output), output[-3000:]
    assert "FutureWarning" not in output and "pass@1: " in proc.stdout


def test_quickstart_resume_keeps_sft_resumes_rl_and_shows_the_same_rows(quickstart, capsys):
    # in place (the last test of the file): the RL run's config names the SFT model by its path
    before = json.loads((quickstart / "results.json").read_text())["rows"]
    capsys.readouterr()
    assert main(["quickstart", "--out", str(quickstart), *QUICKSTART, "--resume"]) == 0
    stdout = capsys.readouterr().out
    assert f"the run in {quickstart / 'sft'} finished all 8 steps; its final model is kept" in stdout
    assert f"resumed from {quickstart / 'grpo' / 'checkpoints' / 'step_00000001'} at step 1" in stdout
    assert json.loads((quickstart / "results.json").read_text())["rows"] == before
