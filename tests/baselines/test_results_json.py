"""A quickstart's results.json is strict JSON: an undefined figure (accuracy when the tool was
never used: 0/0) is null, not a bare NaN that `json.loads` in other languages refuses."""

from __future__ import annotations

import json
import math

from baselines.quickstart import write_report


def test_an_undefined_figure_is_null_in_results_json(tmp_path):
    (tmp_path / "grpo").mkdir()  # the RL run's metrics, as training leaves them
    (tmp_path / "grpo" / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n{"step": 2, "reward_mean": 0.6}\n')
    rows = [{"label": "SFT (greedy)", "pass@1": 0.5, "hard_accuracy_with_tool": math.nan, "response_tokens": 40.0},
            {"label": "GRPO (greedy)", "pass@1": 0.75, "hard_accuracy_with_tool": 1.0, "response_tokens": 38.0}]
    timings = {"build": 0.0, "SFT": 1.0, "done": 3.0}
    write_report(tmp_path, rows, timings, "grpo", "tiny", range(60, 64), "T=1, 4 samples", {"temperature": 1.0})
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text
    results = json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert results["rows"][0]["hard_accuracy_with_tool"] is None
    assert results["rows"][1]["hard_accuracy_with_tool"] == 1.0 and results["wall_s"] == {"build": 1.0, "SFT": 2.0}
