"""Two processes give the same update as one process on the same global batch (docs/algorithms.md §2.4).

Real `accelerate launch` of the real CLI, on CPU with the gloo backend. Rollouts use the HF engine
with per-trajectory seeds, so both runs sample the same episodes; the two runs then differ in how
the batch is split (2 ranks × 2 micro-batches vs 1 rank × 3) and must still agree to float
tolerance. Note: `accelerate launch --cpu --num_processes 2` starts a single process unless MPI
is set up; `ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2` starts two
CPU ranks through torchrun, which the test checks (world_size in config.json).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from learner_support import SFT_ENV_OVERRIDE, cli_env
from safetensors.torch import load_file

ARGS = [
    "total_steps=2", "prompts_per_step=4", "group_size=4", "max_response_tokens=64", "temperature=0.6",
    "micro_batch_size=3", "mini_batch_prompts=2", "ppo_epochs=2", "lr=3e-4", "progress=false",
    "tensorboard=false", "save_every=0", "eval_every=2", "eval_episodes=6", SFT_ENV_OVERRIDE,
]  # fmt: skip


def _launch(processes: int, model: str, out: str, algo: str = "grpo", args: list[str] = ARGS) -> list[dict]:
    # the CLI installed beside this interpreter (the venv need not be on PATH)
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    assert accelerate, "the accelerate CLI is not installed in this environment"
    mode = ["--multi_gpu"] if processes > 1 else ["--cpu"]
    env = cli_env()
    env["ACCELERATE_USE_CPU"] = "1"
    cmd = [
        accelerate, "launch", *mode, "--num_processes", str(processes), "--main_process_port", "29533",
        "-m", "agent_envs.cli", "train", "--algo", algo, "--config", f"configs/{algo}_tiny.yaml",
        f"model={model}", f"output_dir={out}", *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=env["PYTHONPATH"], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    config = json.loads(Path(out, "config.json").read_text())
    assert config["world_size"] == processes
    return [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_match_one(sft_run, tmp_path):
    model = sft_run["model"]
    one = _launch(1, model, str(tmp_path / "one"))
    two = _launch(2, model, str(tmp_path / "two"))
    w0 = load_file(f"{model}/model.safetensors")
    w1 = load_file(tmp_path / "one" / "final_model" / "model.safetensors")
    w2 = load_file(tmp_path / "two" / "final_model" / "model.safetensors")
    update = sum(((w1[k] - w0[k]) ** 2).sum() for k in w0).sqrt()
    gap = sum(((w1[k] - w2[k]) ** 2).sum() for k in w0).sqrt()
    print(f"\n|update| = {update:.4g}, |1-proc - 2-proc| = {gap:.3g}")
    assert one[1]["reward_std"] > 0 and one[1]["grad_norm"] > 0  # a real policy-gradient update happened
    assert update > 1e-2
    assert gap < 1e-4 * update
    assert [r["step"] for r in one] == [0, 1, 2]  # validation before training, then each step
    for a, b in zip(one, two, strict=True):
        keys = ["eval/accuracy", "eval/reward_mean"] if a["step"] in (0, 2) else []  # 3 + 3 episodes
        if a["step"]:
            keys += ["reward_mean", "pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "grad_norm",
                     "is_ratio/min", "is_ratio/mean", "is_ratio/max"]  # the extremes gathered over ranks
        for key in keys:
            # pg_loss and the gradient sum advantage-weighted terms that nearly cancel (a group's
            # advantages sum to 0): one process packs responses into rows, two run full sequences,
            # and their float32 rounding (~1e-6 of each term) shows at ~1e-4 of the sums; the
            # weights above agree to 1e-4 of the update
            loose = key in ("pg_loss", "grad_norm")
            assert a[key] == pytest.approx(b[key], rel=1e-3 if loose else 1e-4, abs=1e-6), key
    assert torch.isfinite(update)


@pytest.mark.slow
def test_tree_metrics_cover_every_rank(sft_run, tmp_path):
    # Trees depend only on their prompt's seed, so both runs grow the same 4 trees (2 per rank
    # with two processes); the logged accounting must be that of all 4, not of rank 0's two.
    # The preset's M = 8 (N = 4) leaves a budget to fork, and its 96 tokens room to react.
    skip = ("total_steps", "eval_", "max_response_tokens", "group_size")
    args = [a for a in ARGS if not a.startswith(skip)] + ["total_steps=1"]
    one = _launch(1, sft_run["model"], str(tmp_path / "one"), "arpo", args)
    two = _launch(2, sft_run["model"], str(tmp_path / "two"), "arpo", args)
    keys = [k for k in one[0] if k.startswith("rollout/")]
    assert "rollout/forks_per_prompt" in keys and one[0]["rollout/forks_per_prompt"] > 0
    for key in [*keys, "reward_mean", "num_trajectories"]:
        assert one[0][key] == pytest.approx(two[0][key], rel=1e-6), key
