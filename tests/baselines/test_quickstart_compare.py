"""The quickstart and compare commands run end to end (with very few steps, so only the
plumbing is checked here; the learning itself is checked by the SFT and learner tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent_envs.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quickstart_smoke(tmp_path):
    out = tmp_path / "qs"
    assert main(["quickstart", "--out", str(out), "--sft-steps", "8", "--rl-steps", "1", "--eval-tasks", "4"]) == 0
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert [r["label"].split(" (")[0] for r in rows] == ["SFT", "SFT", "GRPO", "GRPO"]
    assert all(r["tasks"] == 4.0 for r in rows)
    # "sampled" is the RL run's own sampling setup, read from its preset
    preset = yaml.safe_load((REPO / "configs" / "grpo_tiny.yaml").read_text())
    assert results["sampling"] == {k: preset[k] for k in ("temperature", "top_p", "top_k")}
    sampled = json.loads((out / "eval" / "sft" / "sampled" / "summary.json").read_text())["sampling"]
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (
        preset["temperature"], preset["top_p"], preset["top_k"])
    assert all("hard_tool_rate" in r for r in rows)  # the world mixes easy and hard tasks
    assert (out / "results.png").stat().st_size > 0 and "| model |" in (out / "results.md").read_text()
    assert (out / "grpo" / "final_model" / "config.json").is_file()


@pytest.mark.slow
def test_compare_two_algorithms(tmp_path):
    from algorithms.models.tiny import build_tiny_model

    out = tmp_path / "cmp"
    args = ["compare", "--algos", "grpo,arpo", "--seeds", "0", "--out", str(out), "--eval-tasks", "3",
            f"model={build_tiny_model()}", "total_steps=1", "prompts_per_step=2", "max_response_tokens=32"]
    assert main(args) == 0
    rows = json.loads((out / "results.json").read_text())
    assert [r["algo"] for r in rows] == ["grpo", "arpo"]
    assert all(r["trajectories_per_step"] == 16 for r in rows)  # same sample budget
    text = (out / "results.md").read_text()
    assert "grpo (n=1)" in text and "arpo (n=1)" in text
    assert (out / "pass_at_1.png").is_file() and (out / "reward_curves.png").is_file()
