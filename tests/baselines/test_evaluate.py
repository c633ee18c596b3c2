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


@pytest.mark.parametrize("baseline", [pytest.param("tools", marks=pytest.mark.slow), "cot"])  # tools: ~13 s
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
    # the lenient column reads each row's own task's answers
    import gymnasium as gym

    from agent_envs.rewards.qa import answer_in_text

    tasks = gym.make("AgentMath-v0").unwrapped.tasks  # ids end in the task's index
    answers = {r["task_id"]: tasks[int(r["task_id"].rsplit("-", 1)[1])].answers for r in rows}
    assert [r["answer_in_response"] for r in rows] == [
        float(answer_in_text(r["response"], answers[r["task_id"]])) for r in rows]
    assert m["answer_in_response"] == pytest.approx(sum(r["answer_in_response"] for r in rows) / 6)


def test_config_errors():
    with pytest.raises(ValueError, match="baseline"):
        EvalConfig(env="AgentMath-v0", model="x", baseline="magic").validate()
    with pytest.raises(ValueError, match="max\\(ks\\)"):
        EvalConfig(env="AgentMath-v0", model="x", n=1, ks=(4,)).validate()


RUN_CONFIG = {  # what a learner writes to <output_dir>/config.json (the keys evaluate reads)
    "algo": "grpo", "env": "AgentMath-v0", "temperature": 0.7, "top_p": 0.9, "top_k": 5, "max_response_tokens": 12,
    "env_kwargs": {"max_tool_calls": 1, "system_prompt": "Solve it with python.", "world": {"difficulty": 2}},
}


@pytest.fixture
def tiny_run(tmp_path, tiny_model_path):
    """A run folder as training leaves it: the resolved config beside final_model (the tiny model)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(RUN_CONFIG))
    (run / "final_model").symlink_to(tiny_model_path, target_is_directory=True)
    return run


def test_a_runs_model_is_evaluated_with_the_runs_env_and_sampling_on_held_out_tasks(tiny_run, tmp_path, capsys):
    from agent_envs.cli import main

    out = tmp_path / "eval"
    # --n 1: one evaluation at the run's sampling (with no sampling setting, greedy and sampled:
    # tests/baselines/test_evaluate_run.py)
    assert main(["evaluate", "--model", str(tiny_run / "final_model"), "--engine", "hf", "--limit", "2",
                 "--health", "off", "--out", str(out), "--n", "1"]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("evaluate: ")]
    where = f"run {tiny_run / 'config.json'}"
    assert printed[0] == f"evaluate: env AgentMath-v0 ({where})"
    assert printed[1].startswith('evaluate: env_kwargs {"max_tool_calls": 1, "system_prompt": "Solve it with python."')
    assert printed[1].endswith(f"({where})")
    assert printed[2] == "evaluate: tasks 99998-99999: the last 2 of 100000 (held out: training draws start at task 0)"
    assert f"temperature=0.7 ({where}), top_p=0.9 ({where}), top_k=5 ({where}), max_response_tokens=12" in printed[3]
    assert printed[4].startswith("evaluate: loading model"), "the plan is printed before the model loads"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env"]["max_tool_calls"] == 1 and summary["config"]["env_kwargs"] == RUN_CONFIG["env_kwargs"]
    sampling = summary["sampling"]
    assert (sampling["temperature"], sampling["top_p"], sampling["top_k"], sampling["max_tokens"]) == (0.7, 0.9, 5, 12)
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["arithmetic-s0-99998", "arithmetic-s0-99999"]
    trajs = read_jsonl(out / "trajectories.jsonl")
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(str(tiny_run / "final_model")).decode(trajs[0].prompt_ids)
    assert "Solve it with python." in prompt  # the run's system prompt, not the env's default


def test_the_command_line_overrides_the_run_key_by_key(tiny_run):
    from baselines.evaluation.evaluate import resolve

    cfg, probe, lines = resolve(EvalConfig(model=str(tiny_run / "final_model"), engine="hf", temperature=0.0,
                                           first_task=10, limit=3, env_kwargs={"max_tool_calls": 2}))
    assert cfg.env_kwargs == {**RUN_CONFIG["env_kwargs"], "max_tool_calls": 2} and probe.max_tool_calls == 2
    assert (cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_response_tokens) == (0.0, 1.0, -1, 12)
    assert (cfg.first_task, cfg.limit) == (10, 3)
    assert "command line: max_tool_calls" in lines[1] and "temperature=0.0 (command line), top_p=1.0 (greedy)" in lines[3]
    # another env than the run's: none of the run's env settings or sampling carry over
    cfg, _, lines = resolve(EvalConfig(model=str(tiny_run / "final_model"), env="AgentQA-v0", engine="hf"))
    assert cfg.env_kwargs == {} and cfg.max_response_tokens == 1024 and "(command line)" in lines[0]


def test_model_tiny_is_built_locally_as_in_train(tmp_path):
    summary = evaluate(EvalConfig(env="AgentMath-v0", model="tiny", engine="hf", limit=1, max_response_tokens=4,
                                  health="off", out=str(tmp_path)))
    assert summary["metrics"]["tasks"] == 1 and summary["config"]["model"] == "tiny"
