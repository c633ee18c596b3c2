"""The tool cost: the env's per-call charge as its own reward component, the learners' scaling of
it by the group's pass rate, and its column in `agent-envs analyze`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from agent_envs.base.task import Task
from agent_envs.core.protocols import arpo_format_check
from agent_envs.rewards import make_reward
from algorithms.core.advantages import pass_rate_tool_cost
from algorithms.core.learner import Learner
from algorithms.core.learner_config import LearnerConfig, RewardConfig
from algorithms.rollout.trajectory import Trajectory, write_jsonl
from baselines.diagnostics.analyze import analyze

MATH = Task(id="m", question="1 + 1?", answers=["2"], reward="math")
CALL = "<python>print(1 + 1)</python><result>2</result>"


def grade(recipe, response: str, calls: int):
    return recipe(MATH, response, arpo_format_check(response)[0], {"python": calls} if calls else {})


def answer(pred: str, calls: int = 0) -> str:
    return "<think>t</think>" + CALL * calls + f"<answer>\\boxed{{{pred}}}</answer>"


def test_the_charge_is_its_own_component_and_absent_when_off():
    for name in ("standard", "binary"):
        costly = make_reward(name, tool_cost=0.1)
        r = grade(costly, answer("2", 3), 3)
        assert r.score == pytest.approx(1.0 - 0.3) and r.components["tool_cost"] == pytest.approx(0.3)
        assert r.score == pytest.approx(r.components["correct"] - r.components["tool_cost"])
        assert grade(costly, answer("2"), 0).components["tool_cost"] == 0.0
        malformed = grade(costly, "no tags", 1)  # not charged: the format verdict decides its scalar
        assert malformed.components["tool_cost"] == 0.0 and malformed.score == (-1.0 if name == "standard" else 0.0)
        assert "tool_cost" not in grade(make_reward(name), answer("2", 3), 3).components  # off: as before


def test_pass_rate_scaling_hand_computed():
    # group 0: pass rate 1/2; group 1 never succeeds: its charges are given back in full
    rewards = torch.tensor([1.0 - 0.2, 0.0 - 0.1, -0.3, 0.0])
    cost = torch.tensor([0.2, 0.1, 0.3, 0.0])
    correct = torch.tensor([1.0, 0.0, 0.0, 0.0])
    out = pass_rate_tool_cost(rewards, cost, correct, [5, 5, 9, 9])
    assert out.tolist() == pytest.approx([1.0 - 0.2 * 0.5, -0.1 * 0.5, 0.0, 0.0])
    all_solved = pass_rate_tool_cost(rewards[:2], cost[:2], torch.ones(2), [5, 5])
    assert torch.equal(all_solved, rewards[:2])  # pass rate 1: the env's charge as it was


def test_the_learners_reward_step_scales_only_when_asked():
    trajs = [Trajectory([1], [2], [1], [0.0], reward=r, group_id=g, components=c) for r, g, c in [
        (0.8, 0, {"correct": 1.0, "tool_cost": 0.2}), (-0.1, 0, {"correct": 0.0, "tool_cost": 0.1}),
        (-0.3, 1, {"correct": 0.0, "tool_cost": 0.3}), (0.0, 1, {"correct": 0.0})]]  # fmt: skip
    plain = Learner.shape_rewards(SimpleNamespace(config=LearnerConfig()), trajs)
    assert torch.equal(plain, torch.tensor([0.8, -0.1, -0.3, 0.0]))
    cfg = LearnerConfig(reward=RewardConfig(tool_cost_scaling="pass_rate"))
    scaled = Learner.shape_rewards(SimpleNamespace(config=cfg), trajs)
    assert scaled.tolist() == pytest.approx([0.9, -0.05, 0.0, 0.0])


def test_analyze_shows_the_tool_cost(tmp_path):
    def run(name: str, costs: list[float | None]) -> None:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"algo": "grpo"}))
        (folder / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
        trajs = [Trajectory([1], [2], [1], [0.0], components={} if c is None else {"tool_cost": c}) for c in costs]
        write_jsonl(trajs, folder / "trajectories" / "step_000001.jsonl")

    run("costly", [0.1, 0.3, 0.0, 0.0])
    run("free", [None, None])
    summary = analyze([tmp_path / "costly", tmp_path / "free"], tmp_path / "out")
    rows = {r["run"]: r for r in summary["runs"]}
    assert rows["costly"]["tool_cost"] == pytest.approx(0.1) and rows["free"]["tool_cost"] is None
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "tool cost / traj" in text and "| 0.100 |" in text
    assert summary["reward_components"]["costly"]["tool_cost"] == [[1, pytest.approx(0.1)]]
