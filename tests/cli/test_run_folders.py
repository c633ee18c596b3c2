"""A run folder holds one run: `train`, `sft`, `compare` and `quickstart` refuse a folder that
holds another run in one line naming `--resume` and `--overwrite` (exit status 2, nothing written);
`--overwrite` removes the old run first; `--resume` continues it and says from which step, and
stops naming the keys when the config differs from the one the folder's run was started with.

The runs are real, on the tiny model with a few steps; the refusals run in a fresh process as a
user meets them, and in this process through the same `main`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_envs.base.config import UserError
from agent_envs.cli import main
from algorithms.core.run_folder import claim_run_folder, run_files

REPO = Path(__file__).resolve().parents[2]
TRAIN = ["train", "--algo", "grpo", "--config", str(REPO / "configs/grpo_tiny.yaml"), "model=tiny", "total_steps=1",
         "prompts_per_step=2", "group_size=2", "max_response_tokens=16", "eval_episodes=2", "progress=false",
         "tensorboard=false"]  # fmt: skip
SFT = ["sft", "--config", str(REPO / "configs/sft_tiny.yaml"), "model=tiny", "steps=2", "batch_size=2",
       "num_examples=4", "eval_episodes=0", "progress=false", "tensorboard=false"]  # fmt: skip


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time: equal before and after means
    nothing was written."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished one-step GRPO run on the tiny model, with its final checkpoint."""
    out = tmp_path_factory.mktemp("runs") / "grpo"
    assert main([*TRAIN, f"output_dir={out}"]) == 0
    assert (out / "checkpoints" / "step_00000001").is_dir()
    return out


@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    """A copy of the finished run, for a test to write into."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


# -- the check itself ---------------------------------------------------------------------------


def test_an_empty_or_missing_folder_is_a_fresh_run(tmp_path):
    assert claim_run_folder(tmp_path / "new", "train") is False
    assert claim_run_folder(tmp_path, "train", resume=True) is False  # nothing to resume: starts afresh
    (tmp_path / "notes.txt").write_text("not a run")
    assert run_files(tmp_path) == [] and claim_run_folder(tmp_path, "train") is False


def test_the_refusal_names_both_flags_and_what_it_found(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"algo": "grpo", "lr": 1e-4}))
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(UserError) as err:
        claim_run_folder(tmp_path, "train", config={"algo": "grpo", "lr": 1e-4})
    assert str(err.value) == (f"{tmp_path} holds another run (config.json, checkpoints/); add --resume "
                              "to continue it or --overwrite to remove it first, or choose another folder")
    with pytest.raises(UserError, match="give one of them"):
        claim_run_folder(tmp_path, "train", resume=True, overwrite=True)


def test_resume_compares_every_key_but_the_free_ones(tmp_path):
    saved = {"algo": "grpo", "lr": 1e-4, "seeds": [0, 1], "threads": 2, "total_steps": 10, "progress": True}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    # threads, progress and total_steps may differ (the machine, the display, a run extended)
    same = {**saved, "seeds": (0, 1), "threads": 1, "total_steps": 20, "progress": False}
    assert claim_run_folder(tmp_path, "train", config=same, resume=True) is True
    with pytest.raises(UserError) as err:
        claim_run_folder(tmp_path, "train", config={**same, "lr": 3e-4, "seeds": (0,), "beta": 0.1}, resume=True)
    message = str(err.value)
    assert "in beta, lr, seeds (beta: \"(absent)\" there, 0.1 now; lr: 0.0001 there, 0.0003 now; " in message
    assert "--overwrite" in message and "\n" not in message


def test_overwrite_refuses_to_remove_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="holds the current folder"):
        claim_run_folder(".", "train", overwrite=True)
    assert (tmp_path / "metrics.jsonl").is_file()


# -- each command, in a fresh process as a user runs it -----------------------------------------

COMMANDS = {
    "train": lambda out: [*TRAIN, f"output_dir={out}"],
    "sft": lambda out: [*SFT, f"output_dir={out}"],
    "compare": lambda out: ["compare", "--algos", "grpo", "--seeds", "0", "--out", str(out), "model=tiny"],
    "quickstart": lambda out: ["quickstart", "--out", str(out), "--rl-steps", "1"],
}


@pytest.mark.slow  # four fresh interpreters, each importing torch: ~5 s apiece
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_refuses_a_folder_with_another_run_in_one_line(command, run_copy):
    before = snapshot(run_copy)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "agent_envs.cli", *COMMANDS[command](run_copy)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{command}: {run_copy} holds another run (" in lines[0], proc.stderr[-3000:]
    assert "--resume" in lines[0] and "--overwrite" in lines[0]
    assert "loading model" not in proc.stdout
    assert snapshot(run_copy) == before


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_refuses_in_process_too(command, run_copy, capsys):
    before = snapshot(run_copy)
    capsys.readouterr()
    assert main(COMMANDS[command](run_copy)) == 2
    err = capsys.readouterr().err.strip()
    assert f"{command}: {run_copy} holds another run (" in err and "\n" not in err
    assert "--resume" in err and "--overwrite" in err
    assert snapshot(run_copy) == before


# -- train: --resume continues and names its step, --overwrite starts afresh ---------------------


def test_train_resume_continues_from_the_newest_checkpoint_and_says_its_step(run_copy, capsys):
    capsys.readouterr()
    assert main([*TRAIN, f"output_dir={run_copy}", "total_steps=2", "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"resumed from {run_copy / 'checkpoints' / 'step_00000001'} at step 1" in out
    steps = [json.loads(line)["step"] for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert steps[-2:] == [1, 2]  # step 1 of the first call kept, step 2 trained here


def test_train_resume_of_a_finished_run_says_there_is_nothing_left(run_copy, capsys):
    capsys.readouterr()
    assert main([*TRAIN, f"output_dir={run_copy}", "--resume"]) == 0
    assert "at step 1 of total_steps=1: nothing left to train" in capsys.readouterr().out


def test_train_resume_with_another_config_names_the_keys_and_stops(run_copy, capsys):
    before = snapshot(run_copy)
    capsys.readouterr()
    assert main([*TRAIN, f"output_dir={run_copy}", "lr=0.5", "group_size=4", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the config differs from the run's (config.json) in group_size, lr (group_size: 2 there, 4 now; " in err
    assert "\n" not in err and snapshot(run_copy) == before


def test_train_overwrite_removes_the_old_run_first(run_copy, capsys):
    (run_copy / "trajectories").mkdir(exist_ok=True)
    (run_copy / "trajectories" / "step_000120.jsonl").write_text("{}\n")  # what a longer run left
    capsys.readouterr()
    assert main([*TRAIN, f"output_dir={run_copy}", "--overwrite"]) == 0
    assert f"--overwrite: removing the run in {run_copy}" in capsys.readouterr().out
    assert not (run_copy / "trajectories" / "step_000120.jsonl").exists()
    assert [json.loads(line)["step"] for line in (run_copy / "metrics.jsonl").read_text().splitlines()] == [1]


# -- sft, compare and quickstart through the same check ------------------------------------------


def test_sft_resume_keeps_a_finished_run_and_overwrite_trains_again(tmp_path, capsys):
    out = tmp_path / "sft"
    assert main([*SFT, f"output_dir={out}"]) == 0
    model = out / "final_model" / "model.safetensors"
    first = model.stat().st_mtime_ns
    capsys.readouterr()
    assert main([*SFT, f"output_dir={out}", "--resume"]) == 0
    assert f"the run in {out} finished all 2 steps; its final model is kept" in capsys.readouterr().out
    assert model.stat().st_mtime_ns == first
    assert main([*SFT, f"output_dir={out}", "lr=0.5", "--resume"]) == 2
    assert "differs from the run's (config.json) in lr (lr: 0.001 there, 0.5 now)" in capsys.readouterr().err
    assert main([*SFT, f"output_dir={out}", "--overwrite"]) == 0
    assert model.stat().st_mtime_ns != first


def test_compare_resume_with_other_held_out_tasks_names_the_key(tmp_path, capsys):
    out = tmp_path / "cmp"
    out.mkdir()
    asked = {"algos": ["grpo"], "seeds": [0], "config": "configs/{algo}_tiny.yaml", "overrides": [],
             "eval_tasks": 64, "eval_samples": 4, "jobs": 1, "threads_per_job": 2}  # fmt: skip
    (out / "compare.json").write_text(json.dumps(asked))
    capsys.readouterr()
    argv = ["compare", "--algos", "grpo", "--seeds", "0", "--out", str(out), "--config", asked["config"],
            "--eval-tasks", "8", "--resume", "model=tiny"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "the config differs from the run's (compare.json) in eval_tasks (eval_tasks: 64 there, 8 now)" in err
    assert sorted(p.name for p in out.iterdir()) == ["compare.json"]


def test_quickstart_resume_with_other_settings_names_them(tmp_path, capsys):
    out = tmp_path / "qs"
    out.mkdir()
    settings = {"model": "tiny", "sft_steps": None, "rl_steps": None, "eval_tasks": 64, "algo": "grpo", "seed": 0}
    (out / "quickstart.json").write_text(json.dumps(settings))
    capsys.readouterr()
    assert main(["quickstart", "--out", str(out), "--sft-steps", "40", "--rl-steps", "4", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "(quickstart.json) in rl_steps, sft_steps (rl_steps: null there, 4 now; sft_steps: null there" in err
    assert sorted(p.name for p in out.iterdir()) == ["quickstart.json"]
