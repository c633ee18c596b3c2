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


def _trajectories(out, step: int) -> list[tuple[int, list[int]]]:
    lines = (out / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()
    return [(r["traj_id"], r["response_ids"]) for r in map(json.loads, lines)]


def _assert_resumed_equals_full(full, broken, steps) -> None:
    a, b = _metrics(full), _metrics(broken)
    assert sorted(b) == sorted(a)
    for step in steps:
        for key in KEYS:
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-7), (step, key)
        assert _trajectories(broken, step) == _trajectories(full, step), step
    wa = load_file(full / "final_model" / "model.safetensors")
    wb = load_file(broken / "final_model" / "model.safetensors")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5


@pytest.fixture(scope="module")
def full_run(sft_run, tmp_path_factory):
    """The uninterrupted run the interrupted ones are compared with, and its training time."""
    env, full = cli_env(), tmp_path_factory.mktemp("full")
    log = full.parent / "full.log"  # a file, not a pipe: nobody reads while the run writes
    with open(log, "w") as err:
        proc = subprocess.Popen(_train(sft_run["model"], full, "save_trajectories=true"), env=env,
                                cwd=env["PYTHONPATH"], stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        while not (full / "config.json").exists() and proc.poll() is None:  # written once the model is loaded
            time.sleep(0.02)
        started = time.monotonic()
        last = full / "checkpoints" / "step_00000004" / "checkpoint_complete.json"
        while not last.exists() and proc.poll() is None:
            time.sleep(0.02)
        train_s = time.monotonic() - started  # the steps and saves, not the export and plots after them
        assert proc.wait(timeout=400) == 0, log.read_text()[-3000:]
    assert any(_metrics(full)[s]["grad_norm"] > 0 for s in (3, 4))  # the compared steps do update
    return full, train_s


@pytest.mark.slow
def test_sigkill_inside_a_checkpoint_save_resumes_from_the_previous_one(sft_run, full_run, tmp_path):
    from algorithms.core.checkpoint import KILL_IN_SAVE_ENV

    full, _ = full_run
    broken = tmp_path / "broken"
    killed = subprocess.run(_train(sft_run["model"], broken, "save_trajectories=true"),
                            env=cli_env() | {KILL_IN_SAVE_ENV: "4:files"}, cwd=cli_env()["PYTHONPATH"],
                            capture_output=True, timeout=400)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    assert (broken / "checkpoints" / ".tmp-step_00000004").is_dir()  # model and optimizer written, no manifest
    resumed = subprocess.run(_train(sft_run["model"], broken, "save_trajectories=true") + ["--resume"],
                             env=cli_env(), cwd=cli_env()["PYTHONPATH"], capture_output=True, text=True,
                             timeout=400)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step_00000002 at step 2" in resumed.stdout
    _assert_resumed_equals_full(full, broken, steps=(3, 4))


@pytest.mark.stress
@pytest.mark.timeout(3600)  # 20 runs or more, each ~10 s on an idle machine, several times that on a busy one
def test_sigkill_at_random_times_always_resumes_cleanly(sft_run, full_run, tmp_path):
    """10 SIGKILLs at uniformly random times of the training part of a run (its 4 steps and their
    checkpoints: one every step, so some kills land inside a save), each followed by `--resume`:
    the finished run equals the uninterrupted one (metrics, trajectory ids and tokens, final
    weights)."""
    import random

    full, train_s = full_run
    rng = random.Random(0)
    env = cli_env()
    kills = clean = inside_save = before_first = 0
    trial = 0
    while kills < 10:
        trial += 1
        assert trial <= 30, "the runs kept finishing before the kill"
        out = tmp_path / f"trial{trial}"
        args = _train(sft_run["model"], out, "save_trajectories=true", "save_every=1")
        proc = subprocess.Popen(args, env=env, cwd=env["PYTHONPATH"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        while not (out / "config.json").exists() and proc.poll() is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, train_s))
        if proc.poll() is not None:
            continue  # finished first: not a kill
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        root = out / "checkpoints"
        left = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        inside_save += any(root.glob(".tmp-*")) if root.is_dir() else 0
        before_first += not any(root.glob("step_*")) if root.is_dir() else 1
        resumed = subprocess.run(args + ["--resume"], env=env, cwd=env["PYTHONPATH"], capture_output=True,
                                 text=True, timeout=400)  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        _assert_resumed_equals_full(full, out, steps=(1, 2, 3, 4))
        clean += 1
        print(f"kill {kills}: {left} left at the kill, resumed cleanly", flush=True)
    print(f"\n{kills} kills, {clean} clean resumes ({inside_save} inside a checkpoint save, "
          f"{before_first} before the first checkpoint; {trial - kills} runs finished before their kill)")
