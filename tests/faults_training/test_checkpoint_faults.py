"""Damaged checkpoints and a full disk, on a real Accelerate checkpoint of a small model.

A full disk is simulated without root: RLIMIT_FSIZE in a subprocess makes every write past the
limit fail with EFBIG (Python ignores SIGXFSZ, so the write returns an error instead of killing
the process), the same path through torch.save and the checkpoint code as ENOSPC.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from algorithms.core.checkpoint import (
    MANIFEST_FILE,
    STATE_FILE,
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
    verify_checkpoint,
)

REPO = Path(__file__).resolve().parents[2]


def _saved_run(run_dir: Path, steps=(1, 2)) -> list[Path]:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    out = []
    for step in steps:
        model(torch.randn(2, 16)).sum().backward()
        opt.step()
        out.append(save_checkpoint(accelerator, run_dir, step, {"data": {"cursor": step}}, keep_last=None))
    return out


def _model_file(ckpt: Path) -> Path:
    (path,) = [p for p in ckpt.iterdir() if p.name.startswith(("pytorch_model", "model"))]
    return path


def test_manifest_lists_every_file_with_size_and_hash(tmp_path):
    (ckpt,) = _saved_run(tmp_path, steps=(1,))
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    on_disk = {p.name for p in ckpt.iterdir()} - {MANIFEST_FILE}
    assert set(manifest["files"]) == on_disk and STATE_FILE in on_disk
    for name, entry in manifest["files"].items():
        assert entry["bytes"] == (ckpt / name).stat().st_size and len(entry["sha256"]) == 64
    verify_checkpoint(ckpt)
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


@pytest.mark.parametrize("damage", ["truncated", "missing", "garbled_json", "no_manifest"])
def test_a_damaged_newest_checkpoint_is_named_and_resume_falls_back(tmp_path, damage):
    first, second = _saved_run(tmp_path)
    model_file = _model_file(second)
    if damage == "truncated":
        data = model_file.read_bytes()
        model_file.write_bytes(data[: len(data) // 2])
        bad, why = model_file, "bytes, the manifest says"
    elif damage == "missing":
        model_file.unlink()
        bad, why = model_file, "missing"
    elif damage == "garbled_json":
        state = second / STATE_FILE
        text = state.read_text()
        state.write_text(text.replace("{", "[", 1))  # same size: only the hash can tell
        bad, why = state, "SHA-256"
    else:  # a save cut short after the files, before the manifest (or an older version's copy)
        (second / MANIFEST_FILE).unlink()
        bad, why = second, f"no {MANIFEST_FILE}"
    with pytest.raises(CheckpointError) as err:
        verify_checkpoint(second)
    assert str(bad) in str(err.value) and why in str(err.value), err.value
    with pytest.warns(UserWarning, match="falling back to") as warned:
        assert resolve_resume("auto", tmp_path) == first
    assert str(bad) in str(warned[0].message)
    # a checkpoint named explicitly is not swapped for another one
    with pytest.raises(CheckpointError, match=why.replace("(", r"\(")):
        resolve_resume(second, tmp_path)
    with pytest.warns(UserWarning, match="falling back to"):
        assert resolve_resume(tmp_path, "elsewhere") == first  # a run directory falls back too


def test_no_usable_checkpoint_stops_with_every_reason(tmp_path):
    first, second = _saved_run(tmp_path)
    _model_file(first).unlink()
    (second / STATE_FILE).write_text("{not json")
    with pytest.raises(CheckpointError) as err:
        resolve_resume("auto", tmp_path)
    msg = str(err.value)
    assert "no usable checkpoint" in msg
    assert str(first) in msg and str(second / STATE_FILE) in msg
    with pytest.raises(CheckpointError, match="SHA-256|bytes"):
        load_checkpoint(Accelerator(cpu=True), second)


def test_a_fresh_run_directory_resumes_from_nothing(tmp_path):
    assert resolve_resume("auto", tmp_path / "new") is None
    with pytest.raises(FileNotFoundError, match="neither a checkpoint"):
        resolve_resume(tmp_path / "nope", tmp_path)


_DISK_FULL = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    from accelerate import Accelerator
    from algorithms.core.checkpoint import CheckpointError, save_checkpoint

    run_dir = sys.argv[1]
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(torch.nn.Linear(256, 256), torch.optim.AdamW(torch.nn.Linear(1, 1).parameters()))
    save_checkpoint(acc, run_dir, 1, {})
    limit = 64 * 1024  # the model file is ~260 kB: every later checkpoint hits the limit
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        save_checkpoint(acc, run_dir, 2, {})
    except CheckpointError as exc:
        print(json.dumps({"error": str(exc), "cause": repr(exc.__cause__)}))
    else:
        print(json.dumps({"error": None}))
    """
)


@pytest.mark.slow
def test_a_full_disk_stops_the_save_and_keeps_the_last_checkpoint(tmp_path):
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", _DISK_FULL, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["error"] is not None, "the save succeeded past the file size limit"
    print(f"\nfull disk: {result['error']}")
    assert "writing checkpoint" in result["error"] and "step_00000002" in result["error"]
    # torch's zip writer hides the errno; the message still names the cause
    assert "File too large" in result["error"] or "files are limited to 65536 bytes" in result["error"], result
    assert "step_00000001, is intact" in result["error"] and "--resume" in result["error"]
    root = tmp_path / "checkpoints"
    assert [p.name for p in root.iterdir()] == ["step_00000001"]  # no partial copy left behind
    verify_checkpoint(root / "step_00000001")
    assert latest_checkpoint(tmp_path) == list_checkpoints(tmp_path)[-1] == root / "step_00000001"
