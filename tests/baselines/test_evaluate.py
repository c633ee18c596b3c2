"""Evaluation end to end with the real HF engine on the tiny local model."""

from __future__ import annotations

import json

import pytest

from algorithms.rollout.trajectory import read_jsonl
from baselines.evaluation.evaluate import EvalConfig, evaluate


@pytest.fixture(scope="module")
def tiny_model_path():
    from algorithms.models.tiny import build_tiny_model

    return str(build_tiny_model())


@pytest.mark.parametrize("baseline", ["tools", "cot"])
def test_evaluate_writes_samples_and_summary(tmp_path, tiny_model_path, baseline):
    cfg = EvalConfig(env="AgentMath-v0", model=tiny_model_path, engine="hf", n=2, ks=(1, 2), limit=3,
                     max_response_tokens=24, baseline=baseline, out=str(tmp_path), temperature=1.0)
    summary = evaluate(cfg)
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and {r["sample"] for r in rows} == {0, 1}
    assert len({r["task_id"] for r in rows}) == 3
    m = summary["metrics"]
    assert m["pass@1"] == pytest.approx(sum(r["correct"] for r in rows) / 6)
    assert all(r["response_tokens"] <= 24 for r in rows)
    assert json.loads((tmp_path / "summary.json").read_text())["env"]["tools"] == ["python"]
    # the same episodes in tokens, in the same order, for `agent-envs analyze`
    trajs = read_jsonl(tmp_path / "trajectories.jsonl")
    assert [(t.task_id, t.tool_calls, t.num_generated) for t in trajs] == [
        (r["task_id"], r["tool_calls"], r["response_tokens"]) for r in rows]
    if baseline == "cot":
        assert all(r["tool_calls"] == 0 for r in rows)


def test_config_errors():
    with pytest.raises(ValueError, match="baseline"):
        EvalConfig(env="AgentMath-v0", model="x", baseline="magic").validate()
    with pytest.raises(ValueError, match="max\\(ks\\)"):
        EvalConfig(env="AgentMath-v0", model="x", n=1, ks=(4,)).validate()
