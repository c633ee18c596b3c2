"""The quickstart command runs end to end (with very few steps, so only the
plumbing is checked here; the learning itself is checked by the SFT and learner tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_envs.base.config import build_config
from agent_envs.cli import main
from algorithms.cli import learner_class

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
    cfg = build_config(learner_class("grpo").config_class, REPO / "configs" / "grpo_tiny.yaml")
    preset = {k: getattr(cfg, k) for k in ("temperature", "top_p", "top_k")}
    assert results["sampling"] == preset
    sampled = json.loads((out / "eval" / "sft" / "sampled" / "summary.json").read_text())["sampling"]
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (
        preset["temperature"], preset["top_p"], preset["top_k"])
    assert all("hard_tool_rate" in r for r in rows)  # the world mixes easy and hard tasks
    assert (out / "results.png").stat().st_size > 0 and "| model |" in (out / "results.md").read_text()
    assert (out / "grpo" / "final_model" / "config.json").is_file()
    # the run can be viewed and analysed as it is: it kept its trajectories
    assert (out / "grpo" / "trajectories" / "step_000001.jsonl").is_file()
    assert main(["analyze", str(out / "grpo")]) == 0 and (out / "grpo" / "analysis").is_dir()


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_every_quickstart_model_has_presets_that_build(model):
    from algorithms.sft import SFTConfig
    from baselines.quickstart import preset

    sft, rl = preset(model, "grpo")
    sft_cfg, rl_cfg = build_config(SFTConfig, sft), build_config(learner_class("grpo").config_class, rl)
    # RL continues on the task SFT learned, in the world SFT's traces came from
    assert sft_cfg.env == rl_cfg.env and sft_cfg.env_kwargs["world"] == rl_cfg.env_kwargs["world"]
    assert (sft_cfg.model == model) and rl_cfg.model == f"runs/{sft_cfg.output_dir.split('/')[-1]}/final_model"


def test_a_quickstart_model_without_a_preset_for_the_algorithm_is_one_line(capsys):
    assert main(["quickstart", "model=smollm2", "algo=dapo"]) == 2
    err = capsys.readouterr().err.strip()
    assert "smollm2 quickstart has presets for arpo, grpo, not 'dapo'" in err and "\n" not in err
