"""`rollout_source: agent`: the learner runs an agent program per sample against its own gateway.

The two framework agents (`agents/openai_agents_sdk.py`, `agents/smolagents_agent.py`) run from
venvs of their own with the framework pinned, built once and cached beside the MCP test's
(`tests/tools/mcp_support.py`); each plays AgentMath-v0 tasks while GRPO trains the tiny model
2 steps on its sessions. `agents/misbehaving.py` crashes, hangs, stays silent or prints bytes
that are not text: each run ends as a failed trajectory, and the run goes on.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

from algorithms.core.batch import PromptDraw
from algorithms.core.learner_config import AgentConfig
from algorithms.core.model_setup import env_factory
from algorithms.dapo import DAPOConfig, DAPOLearner
from algorithms.gateway.agent import AgentSource
from algorithms.grpo import GRPOConfig, GRPOLearner
from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT, build_tiny_model
from algorithms.rollout.hf import HFEngine
from algorithms.rollout.trajectory import read_jsonl
from baselines.diagnostics.view.server import _find_runs, prompt_view
from tests.tools.mcp_support import PyPIUnreachable, server_venv

OPENAI_AGENTS = "openai-agents==0.24.0"
SMOLAGENTS = "smolagents[openai]==1.26.0"
AGENTS = Path(__file__).parent / "agents"
MISBEHAVING = f"{sys.executable} {AGENTS / 'misbehaving.py'}"


def framework_python(requirement: str) -> str:
    """The interpreter of the venv with `requirement`: our base Python, none of our packages."""
    try:
        return str(server_venv(requirement) / "bin" / "python")
    except PyPIUnreachable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def model() -> Path:
    return build_tiny_model(seed=0, warmup_steps=150)


def grpo(model: Path, out: Path, command: str, **agent: object) -> GRPOLearner:
    cfg = GRPOConfig(model=str(model), env="AgentMath-v0", env_kwargs={"system_prompt": WARMUP_SYSTEM_PROMPT},
                     engine="hf", rollout_source="agent", agent=AgentConfig(command=command, **agent),
                     total_steps=2, prompts_per_step=2, group_size=2, max_response_tokens=48, lr=1e-3,
                     output_dir=str(out), progress=False, tensorboard=False, export_model=False,
                     save_trajectories=True, threads=1)
    return GRPOLearner(cfg)


def steps(run: Path) -> list[list]:
    return [read_jsonl(run / "trajectories" / f"step_{s:06d}.jsonl") for s in (1, 2)]


def port_closed(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


def check_framework_run(learner: GRPOLearner, run: Path, metrics: list[dict], framework_calls: int) -> None:
    assert [m["num_trajectories"] for m in metrics] == [4.0, 4.0]
    for trajs in steps(run):
        assert len({t.group_id for t in trajs}) == 2
        for t in trajs:
            t.validate()
            assert t.end_reason == "agent_answer", (t.end_reason, t.components)
            assert t.lineage["agent_exit"] == 0 and t.lineage["calls"] == framework_calls
            assert t.num_generated > 0 and "parsed_action" in t.components  # sampled here, graded by the env
    assert port_closed(learner.agents.url) and learner.agents.gateway.sessions.names() == []


@pytest.mark.slow  # the venv on a machine's first run (about 30 s), then about 40 s
def test_an_openai_agents_sdk_agent_trains_2_grpo_steps(model, tmp_path):
    python = framework_python(OPENAI_AGENTS)
    learner = grpo(model, tmp_path / "run", f"{python} {AGENTS / 'openai_agents_sdk.py'}", timeout_s=120)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    metrics = learner.train()
    check_framework_run(learner, tmp_path / "run", metrics, framework_calls=1)
    # the SDK sent its tool's schema: the prompt the model saw is the SDK's rendering, not the env's
    prompt = learner.tokenizer.decode(steps(tmp_path / "run")[0][0].prompt_ids)
    assert '"name": "python"' in prompt and "# Tools" in prompt
    if any(m["reward_std"] > 0 for m in metrics):
        assert any(not torch.equal(p.detach(), before[n]) for n, p in learner.model.named_parameters())


@pytest.mark.slow  # as above
def test_a_smolagents_agent_trains_2_grpo_steps(model, tmp_path):
    python = framework_python(SMOLAGENTS)
    learner = grpo(model, tmp_path / "run", f"{python} {AGENTS / 'smolagents_agent.py'}", timeout_s=120)
    metrics = learner.train()
    # a tool-calling step the tiny model does not answer with a tool call, then the library's own
    # final-answer request: two calls, and a second branch where that request re-renders the chat
    check_framework_run(learner, tmp_path / "run", metrics, framework_calls=2)
    for t in steps(tmp_path / "run")[1]:
        assert t.lineage["branches"] == 2
        assert "An agent tried to answer a user query" in learner.tokenizer.decode(t.prompt_ids)


def test_crashing_and_hanging_agents_fail_and_the_run_goes_on(model, tmp_path, monkeypatch, caplog):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where each run's folder is made
    pids = tmp_path / "pids"
    pids.mkdir()
    learner = grpo(model, tmp_path / "run", f"{MISBEHAVING} mixed {pids}", timeout_s=4)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="algorithms.gateway.agent"):
        metrics = learner.train()
    assert len(metrics) == 2 and time.monotonic() - start < 60
    for trajs in steps(tmp_path / "run"):
        ends = sorted(t.end_reason for t in trajs)
        assert ends == ["agent_answer", "agent_answer", "agent_crashed", "agent_timeout"], ends
        for t in trajs:
            t.validate()
            if t.end_reason == "agent_crashed":
                assert t.components["agent_error"] == "exited with 1: RuntimeError: the agent's own bug"
                assert t.reward == 0.0 and t.num_generated > 0  # it called the model before its bug
            if t.end_reason == "agent_timeout":
                assert t.components["agent_error"] == "still running after 4 s; killed"
    assert "RuntimeError: the agent's own bug" in caplog.text and "still running after 4 s" in caplog.text
    # the viewer shows the cause
    [run] = _find_runs(tmp_path).values()
    shown = [t for g in (0, 1) for t in (prompt_view(run, 1, g) or {}).get("trajectories", [])]
    failed = [t for t in shown if t["end_reason"] == "agent_timeout"]
    assert failed and failed[0]["components"]["agent_error"] == "still running after 4 s; killed"
    # nothing left behind: the hung runs' grandchildren, their folders, the gateway's port
    sleepers = [int(p.read_text()) for p in pids.iterdir()]
    assert len(sleepers) == 2
    for pid in sleepers:
        assert not alive(pid), f"grandchild {pid} of a hung agent outlived it"
    assert list(scratch.iterdir()) == []
    assert port_closed(learner.agents.url) and learner.agents.gateway.sessions.names() == []


def test_dapo_keeps_the_groups_of_agent_runs_whose_rewards_differ(model, tmp_path):
    # sample 0 answers (graded by the env, at least -1), sample 1 crashes (failure_reward -5): every
    # group has reward spread, so the first generation round fills the step
    cfg = DAPOConfig(model=str(model), env="AgentMath-v0", env_kwargs={"system_prompt": WARMUP_SYSTEM_PROMPT},
                     engine="hf", rollout_source="agent", total_steps=1, prompts_per_step=1, group_size=2,
                     gen_batch_multiplier=1.0, max_response_tokens=32, output_dir=str(tmp_path / "run"),
                     agent=AgentConfig(command=f"{MISBEHAVING} half", failure_reward=-5.0), progress=False,
                     tensorboard=False, export_model=False, save_trajectories=True, threads=1)
    [metrics] = DAPOLearner(cfg).train()
    assert metrics["gen_rounds"] == 1.0 and metrics["num_trajectories"] == 2.0
    trajs = read_jsonl(tmp_path / "run" / "trajectories" / "step_000001.jsonl")
    assert [t.end_reason for t in trajs] == ["agent_answer", "agent_crashed"]
    assert trajs[0].group_id == trajs[1].group_id and trajs[1].reward == -5.0 < trajs[0].reward


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its reaper does not)."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state == "Z":
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(scope="module")
def source_parts(model):
    tokenizer = AutoTokenizer.from_pretrained(model)
    cfg = SimpleNamespace(env="AgentMath-v0", env_kwargs={"system_prompt": WARMUP_SYSTEM_PROMPT},
                          max_response_tokens=32)
    return HFEngine(str(model), tokenizer), env_factory(cfg, tokenizer), tokenizer


def play(parts, command: str, **agent: object) -> list:
    engine, make_env, tokenizer = parts
    source = AgentSource(engine, make_env, tokenizer, AgentConfig(command=command, **agent), env_id="AgentMath-v0",
                         max_response_tokens=32)
    return source.rollout([PromptDraw(index=3, group_id=7, seed=0)], 2)


def test_silent_garbage_printing_and_unstartable_agents_fail_with_their_cause(source_parts, tmp_path):
    silent = play(source_parts, f"{MISBEHAVING} silent")
    assert [t.end_reason for t in silent] == ["agent_no_model_calls"] * 2
    assert silent[0].components == {"agent_error": "exited without calling the model"}
    assert silent[0].num_generated == 0 and silent[0].prompt_ids  # the task's prompt, nothing to train
    garbage = play(source_parts, f"{MISBEHAVING} garbage", answer="stdout")
    assert [t.end_reason for t in garbage] == ["agent_bad_output"] * 2
    assert garbage[0].components["agent_error"] == "printed bytes that are not UTF-8 text (at byte 0)"
    broken = tmp_path / "agent"  # executable, but its interpreter does not exist
    broken.write_text("#!/no/such/interpreter\n")
    broken.chmod(0o755)
    unstartable = play(source_parts, str(broken))
    assert [t.end_reason for t in unstartable] == ["agent_crashed"] * 2
    assert unstartable[0].components["agent_error"].startswith("could not start: [Errno 2]")
    for t in silent + garbage + unstartable:
        t.validate()
        assert t.group_id == 7 and t.reward == 0.0


def test_the_printed_answer_is_graded_with_answer_stdout(source_parts):
    trajs = play(source_parts, f"{sys.executable} {AGENTS / 'plain_openai.py'}", answer="stdout",
                 failure_reward=-2.0)
    for t in trajs:
        t.validate()
        assert t.end_reason == "agent_answer" and t.lineage["agent_exit"] == 0 and t.lineage["calls"] >= 1
        assert "parsed_action" in t.components and t.reward != -2.0  # graded by the env
        # the env's own prompt: the agent sent the task's messages as they are
        assert t.prompt_ids[:8] == trajs[0].prompt_ids[:8]


def test_agent_settings_are_checked_naming_the_field():
    with pytest.raises(ValueError, match="'agent.command'"):
        GRPOConfig(rollout_source="agent").validate()
    with pytest.raises(ValueError, match="'agent.timeout_s'"):
        GRPOConfig(rollout_source="agent", agent=AgentConfig(command="true", timeout_s=float("nan"))).validate()
    with pytest.raises(ValueError, match="'agent.answer'"):
        GRPOConfig(rollout_source="agent", agent=AgentConfig(command="true", answer="file")).validate()
    engine = SimpleNamespace(tokenizer=None)
    with pytest.raises(ValueError, match="'agent.command': 'no-such-agent-program' is neither"):
        AgentSource(engine, lambda: None, None, AgentConfig(command="no-such-agent-program --x"))
    with pytest.raises(ValueError, match="'agent.command': cannot split"):
        AgentSource(engine, lambda: None, None, AgentConfig(command="python 'unclosed"))
    assert os.path.isabs(AgentSource(engine, lambda: None, None, AgentConfig(
        command=os.path.relpath(sys.executable) + " x.py")).argv[0])
