"""Checkpoints: everything comes back, and a checkpoint directory is never half-written."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from accelerate import Accelerator

from algorithms.core.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
)


def _setup():
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    model, opt, sched = accelerator.prepare(model, opt, sched)
    return accelerator, model, opt, sched


def _train_step(model, opt, sched):
    loss = model(torch.randn(2, 4)).square().sum()
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def test_roundtrip_restores_weights_optimizer_scheduler_and_rngs(tmp_path):
    accelerator, model, opt, sched = _setup()
    _train_step(model, opt, sched)
    path = save_checkpoint(accelerator, tmp_path, 1, {"data": {"epoch": 0, "cursor": 4}})
    # what an uninterrupted run does next
    expected_draws = (random.random(), float(np.random.rand()), torch.rand(1).item())
    _train_step(model, opt, sched)
    expected_weights = {k: v.clone() for k, v in model.state_dict().items()}
    expected_lr = sched.get_last_lr()

    _train_step(model, opt, sched)  # wander off
    state = load_checkpoint(accelerator, path)
    assert state == {"step": 1, "data": {"epoch": 0, "cursor": 4}}
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == expected_draws
    _train_step(model, opt, sched)
    for k, v in model.state_dict().items():
        assert torch.equal(v, expected_weights[k]), k
    assert sched.get_last_lr() == expected_lr


def test_atomic_and_pruned(tmp_path):
    accelerator, model, opt, sched = _setup()
    # a save killed half-way leaves only a hidden temp dir, which is never taken for a checkpoint
    broken = tmp_path / "checkpoints" / ".tmp-step_00000009"
    broken.mkdir(parents=True)
    (broken / "model.bin").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path) is None
    for step in (1, 2, 3):
        save_checkpoint(accelerator, tmp_path, step, {}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002", "step_00000003"]
    assert not broken.exists()
    assert resolve_resume("auto", tmp_path).name == "step_00000003"
    assert resolve_resume(tmp_path, "elsewhere").name == "step_00000003"
    assert resolve_resume(None, tmp_path) is None
    with pytest.raises(FileNotFoundError, match="neither a checkpoint"):
        resolve_resume(tmp_path / "nope", tmp_path)
