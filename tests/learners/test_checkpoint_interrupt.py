"""A save stopped half-way never leaves a `step_*` directory, and the previous checkpoint loads.

The faithful fault is a SIGKILL inside the save (tests/faults_training, slow: it needs a whole
training process). Here the save is stopped at the same point in-process instead: the first
fsync of `_seal` (after the accelerator's model/optimizer files and the learner state are on
disk, before the manifest) is patched to raise. KeyboardInterrupt stands for an interruption that
nothing in the save catches (Ctrl-C; like a kill, it leaves the partial files behind); OSError for
a failed write, which the save cleans up after.
"""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from algorithms.core import checkpoint
from algorithms.core.checkpoint import (
    CheckpointError,
    checkpoint_root,
    latest_checkpoint,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
)


def _model_and_optimizer():
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    return accelerator, model, opt


def _nudge(model, opt) -> None:
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, OSError])
def test_an_interrupted_save_leaves_no_step_dir_and_the_last_checkpoint_loads(tmp_path, monkeypatch, interrupt):
    accelerator, model, opt = _model_and_optimizer()
    first = save_checkpoint(accelerator, tmp_path, 1, {"cursor": 1})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    _nudge(model, opt)

    written: list[str] = []

    def fail_on_first_fsync(path):
        written.extend(sorted(p.name for p in path.parent.iterdir()))
        raise interrupt("interrupted while saving")

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "_fsync", fail_on_first_fsync)
        with pytest.raises(CheckpointError if interrupt is OSError else KeyboardInterrupt):
            save_checkpoint(accelerator, tmp_path, 2, {"cursor": 2})
    assert checkpoint.STATE_FILE in written and len(written) > 1  # it did stop half-way through

    step_dirs = sorted(p.name for p in checkpoint_root(tmp_path).iterdir() if p.name.startswith("step_"))
    assert step_dirs == ["step_00000001"]
    assert latest_checkpoint(tmp_path) == first and resolve_resume("auto", tmp_path) == first
    assert load_checkpoint(accelerator, first) == {"step": 1, "cursor": 1}
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved[name]), name

    # the next save of the same step goes through and clears what the interrupted one left
    assert save_checkpoint(accelerator, tmp_path, 2, {"cursor": 2}).name == "step_00000002"
    assert sorted(p.name for p in checkpoint_root(tmp_path).iterdir()) == ["step_00000001", "step_00000002"]
