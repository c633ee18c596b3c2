"""The quickstart command runs end to end (with very few steps, so only the
plumbing is checked here; the learning itself is checked by the SFT and learner tests)."""

from __future__ import annotations

import json

import pytest

from agent_envs.cli import main


@pytest.mark.slow
def test_quickstart_smoke(tmp_path):
    out = tmp_path / "qs"
    assert main(["quickstart", "--out", str(out), "--sft-steps", "8", "--rl-steps", "1", "--eval-tasks", "4"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["label"] for r in rows][:2] == ["base (greedy)", "SFT (greedy)"] and len(rows) == 5
    assert all(r["tasks"] == 4.0 for r in rows)
    assert (out / "results.png").stat().st_size > 0 and "| model |" in (out / "results.md").read_text()
    assert (out / "grpo" / "final_model" / "config.json").is_file()
