"""`agent-envs analyze` on a real comparison: GRPO and ARPO train the warmed-up tiny model for two
steps with saved trajectories, `compare` evaluates each final model, and the CLI analyses the whole
folder in one command. The table must hold the numbers recomputed here from the JSONL files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from algorithms.rollout.trajectory import read_jsonl

REPO = Path(__file__).resolve().parents[2]
WARMUP_STEPS = 150  # the tiny model then writes tool calls, so there are tool results to look at
ALGOS = ("grpo", "arpo")
# the seed of every run: its draws include tasks the warmed-up model calls the tool on, in both
# steps of both algorithms (the entropy checks need tool results), and ARPO forks after one
SEED = 2
AT_0 = 10  # index of offset 0 in the curves of the default window, -10..30


@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> Path:
    from algorithms.models.tiny import build_tiny_model
    from baselines.comparison.compare import RunSpec, run_one

    out = tmp_path_factory.mktemp("compare")
    model = build_tiny_model(warmup_steps=WARMUP_STEPS)
    # env_kwargs={}: the default system prompt, the one the warm-up model saw
    overrides = [f"model={model}", "env_kwargs={}", "total_steps=2", "prompts_per_step=1", "group_size=8",
                 "max_response_tokens=96", "save_trajectories=true", "progress=false", "tensorboard=false"]
    # what `compare --jobs 1` runs for each (algorithm, seed), on one thread
    for algo in ALGOS:
        run_one(RunSpec(algo, SEED, str(REPO / "configs" / "{algo}_tiny.yaml"), overrides, str(out / f"{algo}-{SEED}"),
                        eval_tasks=3, eval_samples=2, threads=1))  # fmt: skip
    return out


def recompute_offset_0(files: list[Path]) -> tuple[float | None, int]:
    """Mean entropy of the first model token after each tool result, straight from the rows."""
    values: list[float] = []
    for f in files:
        for t in read_jsonl(f):
            values += [t.entropy[i] for i in range(1, len(t.loss_mask)) if t.loss_mask[i] and not t.loss_mask[i - 1]]
    return (sum(values) / len(values) if values else None), len(values)


@pytest.mark.slow
def test_cli_analyses_a_comparison_folder(comparison, tmp_path):
    out = tmp_path / "analysis"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "agent_envs.cli", "analyze", str(comparison), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"analyze: grpo-{SEED}: step 2/2 read" in proc.stderr  # progress of the reads
    summary = json.loads((out / "summary.json").read_text())
    runs = {r["run"]: r for r in summary["runs"]}
    assert set(runs) == {f"{a}-{SEED}{e}" for a in ALGOS for e in ("", "/eval_greedy", "/eval_sampled")}
    for name in ("entropy_by_offset.png", "tool_calls.png", "branches.png", "reward_components.png", "pca.png"):
        assert name in summary["figures"] and (out / name).stat().st_size > 5000, name

    for algo in ALGOS:
        files = sorted((comparison / f"{algo}-{SEED}" / "trajectories").glob("step_*.jsonl"))
        trajs = [t for f in files for t in read_jsonl(f)]
        row = runs[f"{algo}-{SEED}"]
        assert len(files) == row["steps"] == 2 and row["trajectories"] == len(trajs) == 2 * 8
        assert row["tool_calls"] == pytest.approx(sum(t.tool_calls for t in trajs) / len(trajs))
        assert row["reward"] == pytest.approx(sum(t.reward for t in trajs) / len(trajs))
        h0, results = recompute_offset_0(files)
        assert results > 0, f"{algo}: no tool result in the rollouts; the entropy checks test nothing"
        assert row["entropy_at_0"] == pytest.approx(h0) and row["tool_results"] == results
        # phases: step 1 is early, step 2 late (a phase without a tool result has no curve)
        curves = summary["entropy_by_offset"][algo]
        for phase, f in zip(("early", "late"), files, strict=True):
            h, n = recompute_offset_0([f])
            if n:
                assert curves[phase]["entropy"][AT_0] == pytest.approx(h) and curves[phase]["tokens"][AT_0] == n
            else:
                assert phase not in curves
        forks = sum(t.parent_id is not None for t in trajs)
        assert row["forks_per_prompt"] == pytest.approx(forks / 2)  # one prompt per step
        # the evaluation's episodes, from the trajectories.jsonl that evaluate writes beside samples.jsonl
        samples = [json.loads(line) for line in (comparison / f"{algo}-{SEED}" / "eval_sampled" / "samples.jsonl").open()]
        sampled = runs[f"{algo}-{SEED}/eval_sampled"]
        assert sampled["trajectories"] == len(samples) == 3 * 2
        assert sampled["tool_calls"] == pytest.approx(sum(s["tool_calls"] for s in samples) / len(samples))
        # the table shows the same numbers
        assert f"| {algo}-{SEED} | {algo} | 2 | 16 | {row['reward']:.3f} |" in (out / "summary.md").read_text()
    assert runs[f"arpo-{SEED}"]["max_depth"] >= 1 and runs[f"grpo-{SEED}"]["forks_per_prompt"] == 0
    assert summary["pca"]["points"] == len(summary["pca"]["xy"]) == 2 * (16 + 3 + 6)
