"""Kills inside a checkpoint save, a full disk and damaged checkpoints, through the real
`agent-envs train` CLI (subprocesses, the tiny model, ~10 s a run)."""

from __future__ import annotations

import resource
import shutil

import pytest
from training_runs import assert_same_steps, cli_env, metrics, run, train_cmd

from algorithms.core.checkpoint import KILL_IN_SAVE_ENV, list_checkpoints, verify_checkpoint


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    proc = run(train_cmd(out, "total_steps=4", "save_every=2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[grpo] loading model" in proc.stdout  # the marker the preflight tests rely on
    return out


@pytest.mark.slow
def test_killed_between_manifest_and_rename_resumes_from_the_last_complete_checkpoint(uninterrupted, tmp_path):
    # (a kill before the manifest: tests/learners/test_resume.py, with a model whose updates differ)
    out = tmp_path / "run"
    killed = run(train_cmd(out, "total_steps=4", "save_every=2"), env=cli_env(**{KILL_IN_SAVE_ENV: "4:rename"}))
    assert killed.returncode == -9, killed.stderr[-3000:]
    root = out / "checkpoints"
    assert [p.name for p in list_checkpoints(out)] == ["step_00000002"]
    assert (root / ".tmp-step_00000004").is_dir()  # the half-written save, never taken for a checkpoint
    assert sorted(metrics(out)) == [1, 2, 3, 4]  # step 4 was logged, its checkpoint not finished

    resumed = run(train_cmd(out, "total_steps=4", "save_every=2") + ["--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {root / 'step_00000002'} at step 2" in resumed.stdout
    assert not (root / ".tmp-step_00000004").exists()
    assert_same_steps(uninterrupted, out, steps=(3, 4))


@pytest.mark.slow
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(uninterrupted, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(uninterrupted, out)
    for name in ("final_model", "trajectories"):
        shutil.rmtree(out / name)
    # the uninterrupted run kept steps 2 and 4; truncate the newest one's model
    ckpt2, ckpt4 = list_checkpoints(out)
    model = ckpt4 / "pytorch_model.bin"
    model.write_bytes(model.read_bytes()[:1000])
    resumed = run(train_cmd(out, "total_steps=4", "save_every=2") + ["--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{model}: 1000 bytes" in resumed.stderr and f"falling back to {ckpt2}" in resumed.stderr
    assert f"resumed from {ckpt2} at step 2" in resumed.stdout
    assert_same_steps(uninterrupted, out, steps=(3, 4))

    # nothing usable left: a clear stop before the model is loaded
    (ckpt2 / "learner_state.json").write_text("garbage")
    (ckpt4 / "learner_state.json").unlink()
    stopped = run(train_cmd(out, "total_steps=4") + ["--resume"])
    assert stopped.returncode == 2  # a user error: one line, exit status 2
    assert "train: resume: no usable checkpoint" in stopped.stderr and "Traceback" not in stopped.stderr
    assert "loading model" not in stopped.stdout


def _file_limit(nbytes: int):
    def limit() -> None:  # runs in the child before exec: the limit covers the whole training run
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return limit


@pytest.mark.slow
def test_a_full_disk_stops_the_run_and_keeps_its_last_checkpoint(tmp_path):
    out = tmp_path / "run"
    first = run(train_cmd(out, "total_steps=2", "export_model=false"))
    assert first.returncode == 0, first.stderr[-3000:]
    # the model file is 2.6 MB: with writes capped at 1 MB the next save fails part-way
    full = run(train_cmd(out, "total_steps=4", "export_model=false") + ["--resume"], preexec_fn=_file_limit(2**20))
    assert full.returncode == 2, full.stderr[-3000:]
    last = out / "checkpoints" / "step_00000002"
    assert "train: writing checkpoint" in full.stderr and "step_00000004 failed" in full.stderr
    assert f"the last complete checkpoint, {last}, is intact" in full.stderr
    assert "files are limited to 1048576 bytes" in full.stderr and "Traceback" not in full.stderr
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000002"]
    verify_checkpoint(last)
    # room again: the run continues from that checkpoint
    again = run(train_cmd(out, "total_steps=4", "export_model=false") + ["--resume"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {last} at step 2" in again.stdout and sorted(metrics(out)) == [1, 2, 3, 4]
