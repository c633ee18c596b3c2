"""Atomic, verified training checkpoints: model, optimizer, scheduler, every RNG, data position, step.

    >>> from algorithms.core.checkpoint import latest_checkpoint
    >>> latest_checkpoint("runs/does-not-exist") is None
    True

A checkpoint is a directory `<run>/checkpoints/step_00000012/`. It is written into a hidden
temporary directory, every file is fsync'd, and a manifest (`checkpoint_complete.json`: every
file's size and SHA-256) is written last; only then is the directory renamed into place and its
parent fsync'd. A directory with a `step_*` name and a manifest is therefore complete as written;
a run killed while saving leaves a `.tmp-*` directory, which the next save removes. Model,
optimizer and scheduler go through `Accelerator.save_state` (which knows FSDP and DeepSpeed
sharding and saves the python, numpy and torch RNG states of every rank); the learner's own state
(step, data position, its generators) goes to `learner_state.json`.

Resuming checks a checkpoint against its manifest before loading it: a missing, truncated or
altered file is named, and `--resume` falls back to the previous good checkpoint with a warning,
or stops when none is usable. A save that fails (a full disk) removes its temporary directory and
raises `CheckpointError` saying which checkpoint is still intact. docs/training.md (Reliability)
has the whole story.

`save_checkpoint` / `load_checkpoint` are collective: every rank must call them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import warnings
from pathlib import Path
from typing import Any

STATE_FILE = "learner_state.json"
MANIFEST_FILE = "checkpoint_complete.json"
# fault tests only: "STEP:POINT" makes the process SIGKILL itself inside the save of STEP, at
# POINT "files" (the accelerator's files written, no learner state or manifest yet) or "rename"
# (manifest written, directory not yet renamed)
KILL_IN_SAVE_ENV = "AGENT_ENVS_KILL_IN_SAVE"
_STEP_DIR = re.compile(r"^step_(\d{8})$")
_HASH_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or used; the message names the file and what to do."""


def checkpoint_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def _step_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """Every `step_*` directory of a run, complete or not, oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run (those with a manifest), oldest first; not yet verified."""
    return [p for p in _step_dirs(run_dir) if (p / MANIFEST_FILE).is_file()]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint of a run, or None (not verified: see `verify_checkpoint`)."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# verified checkpoints, by (directory, manifest mtime): a resume checks once, not once per caller
_verified: set[tuple[str, int]] = set()


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Check every file of a checkpoint against its manifest; raise `CheckpointError` naming the
    first file that is missing, of the wrong size, or altered."""
    path = Path(path)
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise CheckpointError(
            f"{path}: no {MANIFEST_FILE}, so it is not a complete checkpoint (a save was cut short, "
            "or an older version wrote it)"
        )
    key = (str(path.resolve()), manifest_path.stat().st_mtime_ns)
    if key in _verified:
        return
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
        if not isinstance(files, dict) or STATE_FILE not in files:
            raise ValueError(f"'files' must map every file, {STATE_FILE} included, to its size and hash")
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{manifest_path}: unreadable manifest ({exc})") from None
    for name, want in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (listed in {MANIFEST_FILE})")
        size = file.stat().st_size
        if size != want["bytes"]:
            raise CheckpointError(f"{file}: {size} bytes, the manifest says {want['bytes']} (truncated or replaced)")
        if _sha256(file) != want["sha256"]:
            raise CheckpointError(f"{file}: contents differ from the manifest's SHA-256 (corrupted)")
    try:
        json.loads((path / STATE_FILE).read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path / STATE_FILE}: not valid JSON ({exc})") from None
    _verified.add(key)


def _first_usable(candidates: list[Path], where: str) -> Path:
    """The newest candidate that verifies; a warning for each one skipped, an error if none is left."""
    problems = []
    for path in reversed(candidates):
        try:
            verify_checkpoint(path)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        if problems:
            warnings.warn(
                f"resume: skipping {len(problems)} unusable checkpoint(s) ({'; '.join(problems)}); "
                f"falling back to {path}",
                stacklevel=3,
            )
        return path
    raise CheckpointError(
        f"resume: no usable checkpoint in {where}: {'; '.join(problems)}. Remove the damaged "
        "checkpoint directories (or choose another output_dir) to start afresh"
    )


def resolve_resume(resume: str | os.PathLike | bool | None, run_dir: str | os.PathLike) -> Path | None:
    """What `--resume` means: `True`/`"auto"` = the newest usable checkpoint of this run (None when
    it has none yet), a run directory = its newest usable checkpoint, a checkpoint = that one.

    Every returned checkpoint has been verified against its manifest. Damaged newer checkpoints of
    a run are skipped with a warning that names their bad file; a named checkpoint that is damaged
    is an error (the caller asked for that one).
    """
    if resume in (None, False, "", "false", "no"):
        return None
    if resume in (True, "auto", "true", "latest"):
        found = _step_dirs(run_dir)
        return _first_usable(found, str(checkpoint_root(run_dir))) if found else None
    path = Path(resume)
    if _STEP_DIR.match(path.name) or (path / MANIFEST_FILE).is_file() or (path / STATE_FILE).is_file():
        if not path.is_dir():
            raise FileNotFoundError(f"--resume-from {path}: no such checkpoint directory")
        verify_checkpoint(path)
        return path
    found = _step_dirs(path)  # a run directory
    if not found:
        raise FileNotFoundError(
            f"--resume-from {path}: neither a checkpoint ({MANIFEST_FILE}) nor a run directory "
            "with checkpoints/step_* in it"
        )
    return _first_usable(found, str(checkpoint_root(path)))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _kill_if_asked(step: int, point: str) -> None:
    if os.environ.get(KILL_IN_SAVE_ENV) == f"{step}:{point}":
        os.kill(os.getpid(), signal.SIGKILL)


def _why_writes_fail(root: Path, exc: BaseException) -> str:
    """What torch's short-write error ("unexpected pos ...") means here: the free space and any
    file size limit (`ulimit -f`), so the user sees the cause, not the zip writer's internals."""
    if isinstance(exc, OSError):
        return ""  # ENOSPC / EFBIG already say it
    notes = []
    with contextlib.suppress(OSError):
        notes.append(f"{shutil.disk_usage(root).free / 2**20:.0f} MiB free on {root}")
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if soft != resource.RLIM_INFINITY:
            notes.append(f"files are limited to {soft} bytes (ulimit -f)")
    except (ImportError, OSError, ValueError):
        pass
    return f" (a short write: {', '.join(notes)})" if notes else " (a short write)"


def _seal(tmp: Path, step: int, learner_state: dict[str, Any]) -> None:
    """Write the learner state and the manifest into `tmp`, everything fsync'd, manifest last."""
    (tmp / STATE_FILE).write_text(json.dumps({"step": step, **learner_state}, indent=1, sort_keys=True))
    files = {}
    for p in sorted(tmp.rglob("*")):
        if p.is_file():
            _fsync(p)
            files[p.relative_to(tmp).as_posix()] = {"bytes": p.stat().st_size, "sha256": _sha256(p)}
    manifest = tmp / MANIFEST_FILE
    manifest.write_text(json.dumps({"step": step, "files": files}, indent=1))
    _fsync(manifest)
    _fsync(tmp)


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
    states of every rank are saved by `save_state`). A failed write (no space left, file too large)
    removes the partial copy and raises `CheckpointError`; older checkpoints are left as they were.
    """
    root = checkpoint_root(run_dir)
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp-step_{step:08d}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(str(tmp), safe_serialization=False)
        if accelerator.is_main_process:
            _kill_if_asked(step, "files")
            _seal(tmp, step, learner_state)
            _kill_if_asked(step, "rename")
    except (OSError, RuntimeError) as exc:  # torch.save reports a failed write as RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        intact = latest_checkpoint(run_dir)
        kept = f"the last complete checkpoint, {intact}, is intact" if intact else "no earlier checkpoint exists"
        raise CheckpointError(
            f"writing checkpoint {final} failed: {exc}{_why_writes_fail(root, exc)}; {kept}. Free disk "
            "space (or raise the file size limit) and continue with `--resume`"
        ) from exc
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():  # a re-run over an old run directory: the new state wins
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync(root)
        if keep_last is not None and keep_last > 0:
            for old in list_checkpoints(run_dir)[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Any, path: str | os.PathLike) -> dict[str, Any]:
    """Verify a checkpoint, restore model, optimizer, scheduler and RNG states into the prepared
    objects, and return the learner state saved with them."""
    path = Path(path)
    verify_checkpoint(path)
    accelerator.load_state(str(path))
    return json.loads((path / STATE_FILE).read_text())


__all__ = [
    "KILL_IN_SAVE_ENV",
    "MANIFEST_FILE",
    "STATE_FILE",
    "CheckpointError",
    "checkpoint_root",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "resolve_resume",
    "save_checkpoint",
    "verify_checkpoint",
]
