"""GRPO trains the tiny model on the sessions of an agent that only speaks the `openai` client.

The learner serves its own HF engine through the gateway (`rollout_source: gateway`); the agent
harness (`openai_agent.py`, a subprocess importing nothing of this project) plays episodes and
posts a reward per session; each RL step takes two groups of two sessions.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from test_gateway import AGENT, math_tasks

from algorithms.grpo import GRPOConfig, GRPOLearner
from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT, build_tiny_model
from algorithms.rollout.trajectory import read_jsonl
from tests.servers import free_port

pytestmark = pytest.mark.slow


def test_three_grpo_steps_on_an_openai_agents_sessions(tmp_path):
    port = free_port()
    cfg = GRPOConfig(model=str(build_tiny_model(seed=0, warmup_steps=150)), env="AgentMath-v0",
                     env_kwargs={"system_prompt": WARMUP_SYSTEM_PROMPT}, engine="hf", rollout_source="gateway",
                     gateway_port=port, gateway_timeout_s=600, total_steps=3, prompts_per_step=2, group_size=2,
                     max_response_tokens=256, lr=1e-3, output_dir=str(tmp_path / "run"), progress=False,
                     tensorboard=False, export_model=False, save_trajectories=True, threads=1)
    learner = GRPOLearner(cfg)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    tasks, _ = math_tasks(2)
    plays = [{**tasks[t], "session": f"step{s}-task{t}-{k}", "reward": "length", "max_tokens": 40,
              "temperature": 1.0} for s in range(3) for t in range(2) for k in range(2)]
    (tmp_path / "tasks.json").write_text(json.dumps(plays))
    agent = subprocess.Popen([sys.executable, str(AGENT), f"http://127.0.0.1:{port}", str(tmp_path / "tasks.json"),
                              str(tmp_path / "finals.json")], stderr=subprocess.PIPE, text=True)
    try:
        metrics = learner.train()
        assert agent.wait(timeout=300) == 0, agent.stderr.read()[-2000:]
    finally:
        agent.kill()
        learner.gateway.close()
    assert len(metrics) == 3 and all(m["num_trajectories"] == 4.0 for m in metrics)
    changed = [n for n, p in learner.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no weight moved: the sessions' rewards gave no advantage"
    for step in (1, 2, 3):
        trajs = read_jsonl(tmp_path / "run" / "trajectories" / f"step_{step:06d}.jsonl")
        assert sorted(t.lineage["session"] for t in trajs) == sorted(
            f"step{step - 1}-task{t}-{k}" for t in range(2) for k in range(2))
        assert len({t.group_id for t in trajs}) == 2  # a group per task: the same first prompt
        for t in trajs:
            t.validate()
            assert t.lineage["drift"] == 0
