"""Running the real `agent-envs train` CLI in subprocesses for the fault tests (imported by module
name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# the untrained tiny model: every test here is about files, data order and sampling, not learning
TINY_ARGS = [
    "model=tiny", "prompts_per_step=2", "group_size=4", "max_response_tokens=48", "progress=false",
    "tensorboard=false", "save_trajectories=true",
]  # fmt: skip
# what must match between a resumed and an uninterrupted run: the data order and the sampling RNG
# show in the rewards, lengths and trajectory ids; the update in the losses
KEYS = ("reward_mean", "response_length_mean", "pg_loss", "entropy", "grad_norm")


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO), **extra)
    return env


def train_cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agent_envs.cli", "train", "--algo", "grpo", "--config",
            "configs/grpo_tiny.yaml", f"output_dir={out}", *TINY_ARGS, *extra]  # fmt: skip


def run(cmd: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env or cli_env(), cwd=REPO, capture_output=True, text=True, timeout=600, **kwargs)


def metrics(out: Path) -> dict[int, dict]:
    return {row["step"]: row for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def trajectory_ids(out: Path, step: int) -> list[tuple[int, int, list[int]]]:
    rows = map(json.loads, (out / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines())
    return [(r["group_id"], r["traj_id"], r["response_ids"]) for r in rows]


def assert_same_steps(a: Path, b: Path, steps) -> None:
    """Run `b` (interrupted and resumed) logged the same metrics and trajectories as `a` at `steps`."""
    ma, mb = metrics(a), metrics(b)
    assert sorted(mb) == sorted(ma), (sorted(ma), sorted(mb))
    for step in steps:
        for key in KEYS:
            assert mb[step][key] == pytest.approx(ma[step][key], rel=1e-5, abs=1e-7), (step, key)
        assert trajectory_ids(b, step) == trajectory_ids(a, step), step
