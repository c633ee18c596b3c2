"""Atomic training checkpoints: model, optimizer, scheduler, every RNG, data position and step.

    >>> from algorithms.core.checkpoint import latest_checkpoint
    >>> latest_checkpoint("runs/does-not-exist") is None
    True

A checkpoint is a directory `<run>/checkpoints/step_00000012/`. It is written into a hidden
temporary directory first and renamed into place only once every rank has finished writing, so a
directory with that name is always complete: a run killed while saving leaves only a
`.tmp-*` directory, which the next save removes. Model, optimizer and scheduler go through
`Accelerator.save_state` (which also knows FSDP and DeepSpeed sharding, and saves the python,
numpy and torch RNG states of every rank); the learner's own state (step, data position, its
private generators, the rollout engine's seed) goes to `learner_state.json`.

`save_checkpoint` / `load_checkpoint` are collective: every rank must call them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

STATE_FILE = "learner_state.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


def checkpoint_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def resolve_resume(resume: str | os.PathLike | bool | None, run_dir: str | os.PathLike) -> Path | None:
    """What `--resume` means: `True`/`"auto"` = newest checkpoint of this run (None when there is
    none yet), a path = that checkpoint (which must exist)."""
    if resume in (None, False, "", "false", "no"):
        return None
    if resume in (True, "auto", "true", "latest"):
        return latest_checkpoint(run_dir)
    path = Path(resume)
    if (path / STATE_FILE).is_file():
        return path
    latest = latest_checkpoint(path)  # a run directory
    if latest is None:
        raise FileNotFoundError(
            f"--resume {path}: neither a checkpoint (no {STATE_FILE}) nor a run directory with checkpoints"
        )
    return latest


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    accelerator: Any,
    run_dir: str | os.PathLike,
    step: int,
    learner_state: dict[str, Any],
    *,
    keep_last: int | None = 2,
) -> Path:
    """Write checkpoint `step` atomically and prune old ones beyond `keep_last` (None keeps all).

    `learner_state` must be JSON-serialisable; it is written by the main process only (the RNG
    states of every rank are saved by `save_state`).
    """
    root = checkpoint_root(run_dir)
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp-step_{step:08d}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=False)
    if accelerator.is_main_process:
        state = {"step": step, **learner_state}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True))
        _fsync_tree(tmp)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():  # a re-run over an old run directory: the new state wins
            shutil.rmtree(final)
        os.replace(tmp, final)
        if keep_last is not None and keep_last > 0:
            for old in list_checkpoints(run_dir)[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Any, path: str | os.PathLike) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and RNG states into the prepared objects; return the
    learner state saved with them."""
    path = Path(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint ({STATE_FILE} missing)")
    accelerator.load_state(str(path))
    try:
        return json.loads(state_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{state_file}: corrupt learner state ({exc}); resume from an older checkpoint"
        ) from exc


__all__ = [
    "STATE_FILE",
    "checkpoint_root",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "resolve_resume",
    "save_checkpoint",
]
