"""SIGKILL in the middle of training, then `--resume`: the following steps equal an uninterrupted
run's (same batches, same samples, same updates), through the real CLI in subprocesses."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from learner_support import SFT_ENV_OVERRIDE, cli, cli_env
from safetensors.torch import load_file

ARGS = [
    "total_steps=4", "save_every=2", "prompts_per_step=2", "group_size=4", "max_response_tokens=64",
    "temperature=0.6", "lr=3e-4", "progress=false", "tensorboard=false", SFT_ENV_OVERRIDE,
]  # fmt: skip
KEYS = ("reward_mean", "pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "grad_norm", "response_length_mean")


def _train(model: str, out, *extra: str) -> list[str]:
    return cli("train", "--algo", "grpo", "--config", "configs/grpo_tiny.yaml", f"model={model}",
               f"output_dir={out}", *ARGS, *extra)  # fmt: skip


def _metrics(out) -> dict[int, dict]:
    return {row["step"]: row for row in map(json.loads, open(out / "metrics.jsonl"))}


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted(sft_run, tmp_path):
    env = cli_env()
    model = sft_run["model"]
    full, broken = tmp_path / "full", tmp_path / "broken"
    subprocess.run(
        _train(model, full), env=env, cwd=env["PYTHONPATH"], check=True, capture_output=True, timeout=400
    )

    proc = subprocess.Popen(_train(model, broken), env=env, cwd=env["PYTHONPATH"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    marker = broken / "checkpoints" / "step_00000002" / "learner_state.json"
    deadline = time.monotonic() + 300
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # in step 3: rolling out or updating
    proc.wait()
    assert marker.exists(), "the run never wrote its step-2 checkpoint"
    assert not (broken / "final_model").exists(), "the run finished before it could be killed"
    assert sorted(_metrics(broken)) == [1, 2]

    subprocess.run(_train(model, broken) + ["--resume"], env=env, cwd=env["PYTHONPATH"], check=True,
                   capture_output=True, timeout=400)  # fmt: skip
    a, b = _metrics(full), _metrics(broken)
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in KEYS:
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-7), (step, key)
    assert any(a[s]["grad_norm"] > 0 for s in (3, 4))  # the compared steps did update the model
    wa = load_file(full / "final_model" / "model.safetensors")
    wb = load_file(broken / "final_model" / "model.safetensors")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
