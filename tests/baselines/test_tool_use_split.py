"""Tool use split by whether a task needs a tool (`needs_tool` in task metadata): the evaluation's
`easy_*` / `hard_*` metrics on hand-built episodes, and compare's columns and paired tests of them."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from baselines.comparison.report import markdown_report, summarize_runs
from baselines.comparison.stats import paired_t_test
from baselines.evaluation.evaluate import EvalConfig, evaluate
from baselines.evaluation.passk import tool_use_by_need


def _episode(task: str, correct: float, calls: int) -> dict:
    return {"task_id": task, "sample": 0, "correct": correct, "tool_calls": calls}


def test_split_by_need_by_hand():
    samples = [
        _episode("e1", 1.0, 0), _episode("e1", 1.0, 1),  # an easy task: one needless call in two
        _episode("e2", 0.0, 2), _episode("e2", 1.0, 0),  # an easy task: a wrong answer after two calls
        _episode("h1", 1.0, 1), _episode("h1", 0.0, 0),  # a hard task: the guess without the tool is wrong
        _episode("x", 1.0, 3),  # a task that does not say: in neither half
    ]
    out = tool_use_by_need(samples, {"e1": False, "e2": False, "h1": True})
    assert out == {"easy_accuracy": 3 / 4, "easy_tool_rate": 2 / 4, "easy_tool_calls": 3 / 4,
                   "easy_accuracy_with_tool": 1 / 2,  # e1's needless call was right, e2's two calls were not
                   "hard_accuracy": 1 / 2, "hard_tool_rate": 1 / 2, "hard_tool_calls": 1 / 2,
                   "hard_accuracy_with_tool": 1.0}
    # a half without episodes has no keys, and tasks without the key give none at all
    assert set(tool_use_by_need(samples[4:6], {"h1": True})) == {
        "hard_accuracy", "hard_tool_rate", "hard_tool_calls", "hard_accuracy_with_tool"}
    # no episode with a tool call: no accuracy with the tool (rather than a NaN in strict JSON)
    assert "easy_accuracy_with_tool" not in tool_use_by_need([_episode("e1", 1.0, 0)], {"e1": False})
    assert tool_use_by_need(samples, {}) == {}


@pytest.mark.slow  # loads the tiny model and runs six episodes
def test_evaluate_reports_the_split_of_its_own_episodes(tmp_path):
    """The real evaluation on the random tiny model: the split is that of its own samples.jsonl
    and the tasks' metadata."""
    kwargs = {"world": {"easy_fraction": 0.5}}
    summary = evaluate(EvalConfig(env="AgentMath-v0", model="tiny", engine="hf", limit=6, max_response_tokens=4,
                                  env_kwargs=kwargs, out=str(tmp_path)))
    tasks = gym.make("AgentMath-v0", **kwargs).unwrapped.tasks
    needs = {tasks[i].id: tasks[i].metadata["needs_tool"] for i in range(len(tasks) - 6, len(tasks))}
    assert set(needs.values()) == {True, False}  # both halves are held out here
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    want = tool_use_by_need(rows, needs)
    assert set(want) == {f"{h}_{m}" for h in ("easy", "hard") for m in ("accuracy", "tool_rate", "tool_calls")}
    assert {k: summary["metrics"][k] for k in want} == want


def _result(algo: str, seed: int, easy: float | None, hard: float) -> dict:
    sampled = {"pass@1": 0.5, "tool_calls": 1.0, "response_tokens": 20.0, "hard_tool_rate": hard}
    if easy is not None:
        sampled["easy_tool_rate"] = easy
    return {"algo": algo, "seed": seed, "sampled": sampled, "greedy": {"pass@1": 0.5},
            "budget": {"trajectories": 32, "trajectories_per_step": 16, "steps": 2, "generated_trajectories": 32},
            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1}, "tokens_per_solved": 40.0,
            "rollout_tool_calls": 1.0, "train_s": 10.0}


def test_compare_tables_and_pairs_the_split():
    manifest = {"algos": ["grpo", "dapo"], "seeds": [0, 1, 2], "config": "configs/{algo}_tiny.yaml",
                "overrides": [], "eval_tasks": 64, "eval_samples": 4}
    easy = {"grpo": [0.4, 0.5, 0.3], "dapo": [0.1, 0.3, 0.2]}
    runs = [_result(a, s, easy[a][s], 0.8) for a in ("grpo", "dapo") for s in (0, 1, 2)]
    summary = summarize_runs(manifest, runs)
    test = next(p for p in summary["paired"] if p["metric"] == "easy_tool_rate")
    want = paired_t_test(easy["grpo"], easy["dapo"])
    assert test["mean_diff"] == pytest.approx(-0.2) == pytest.approx(want.mean_diff)
    assert test["ci95"] == pytest.approx([want.ci_low, want.ci_high])
    grpo = next(a for a in summary["per_algo"] if a["algo"] == "grpo")
    assert grpo["easy_tool_rate"]["mean"] == pytest.approx(0.4) and grpo["hard_tool_rate"]["mean"] == 0.8
    text = markdown_report(summary)
    assert "tool use, tasks needing none" in text and "tool use, tasks needing one" in text
    # without `needs_tool` in the tasks (no run has the half), the column is left out
    text = markdown_report(summarize_runs(manifest, [_result(a, s, None, 0.8) for a in ("grpo", "dapo")
                                                      for s in (0, 1, 2)]))
    assert "tasks needing none" not in text and "tasks needing one" in text
