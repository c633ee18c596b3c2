"""One run per folder: a new run refuses a folder that holds another run, unless told to resume
it (`--resume`) or to remove it first (`--overwrite`).

    >>> import tempfile
    >>> from algorithms.core.run_folder import claim_run_folder
    >>> claim_run_folder(tempfile.mkdtemp(), "train", config={"lr": 1e-4})  # empty: a fresh run
    False

Two runs in one folder mix silently: the old run's trajectories and checkpoints stay beside the new
run's, `analyze` counts both, and a later `--resume` continues the old one. So `train`, `sft`,
`compare` and `quickstart` all call `claim_run_folder` before they write anything; it raises a
one-line `UserError` (exit status 2) naming both flags. A resumed run must have the config the
folder's run was started with (its `config.json`, or `compare.json` / `quickstart.json`): the keys
that differ are named and the run stops, so `--resume` never continues a different experiment.
Keys that change how a run is shown, how many threads it uses or how often it checkpoints, not
what it computes, may differ, and so may `total_steps` (a finished run extended by more steps).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent_envs.base.config import UserError

# what a run leaves at the top of its folder: train and sft (config.json, metrics.jsonl,
# checkpoints, final_model, trajectories), compare (compare.json, results.*), quickstart
# (quickstart.json, results.*)
RUN_FILES = ("config.json", "metrics.jsonl", "checkpoints", "final_model", "trajectories", "compare.json",
             "quickstart.json", "results.json", "results.md", "result.json")
# may differ on resume: display, logging, thread and checkpoint-keeping settings (none changes what
# is computed: resumption is exact), the flags themselves, the folder's own name (a run moved), and
# total_steps (a run extended)
FREE_KEYS = frozenset({"progress", "tensorboard", "wandb", "wandb_project", "threads", "jobs", "save_every",
                       "keep_checkpoints", "resume", "overwrite", "total_steps", "out", "output_dir"})
FLAGS = "add --resume to continue it or --overwrite to remove it first, or choose another folder"


def run_files(folder: str | os.PathLike) -> list[str]:
    """The names at the top of `folder` that show it holds a run (empty: no run there)."""
    path = Path(folder)
    if not path.is_dir():
        return []
    return [name for name in RUN_FILES if (path / name).exists()]


def claim_run_folder(folder: str | os.PathLike, command: str, *, config: Mapping[str, Any] | None = None,
                     config_file: str = "config.json", resume: bool = False, overwrite: bool = False) -> bool:
    """Make `folder` safe to write a run into; True when the run continues the one already there.

    A folder with no run in it is used as it is (`resume` then starts afresh, as `--resume` always
    has). One with a run is removed with `overwrite`, continued with `resume` when `config` matches
    its `config_file` (else a `UserError` naming the keys that differ), and refused otherwise.
    Only the main process (RANK 0) removes anything: the other ranks of a launch see the same answer.
    `command` names the command in what is printed (the errors get their prefix where they are shown).
    """
    if resume and overwrite:
        raise UserError(f"--resume continues the run in {folder} and --overwrite removes it; "
                        "give one of them")
    path = Path(folder)
    found = run_files(path)
    if not found:
        return False
    if overwrite:
        if int(os.environ.get("RANK", "0")) == 0:
            _remove(path, command)
        return False
    if not resume:
        shown = ", ".join(f"{n}/" if (path / n).is_dir() else n for n in found)
        raise UserError(f"{path} holds another run ({shown}); {FLAGS}")
    if config is not None:
        check_same_config(path / config_file, config)
    return True


def check_same_config(saved: Path, config: Mapping[str, Any]) -> None:
    """Raise a `UserError` naming every key of `config` whose value differs from the one `saved`
    holds (keys of `FREE_KEYS` aside); nothing to check when the run saved no config."""
    if not saved.is_file():
        return
    try:
        old = json.loads(saved.read_text())
    except ValueError as exc:
        raise UserError(f"{saved}: not valid JSON ({exc}); --overwrite starts the run afresh") from None
    new = json.loads(json.dumps(dict(config), default=str))  # tuples as lists, paths as text: as saved
    differ = [key for key in sorted(new) if key not in FREE_KEYS and old.get(key, "(absent)") != new[key]]
    if differ:
        shown = "; ".join(f"{k}: {_short(old.get(k, '(absent)'))} there, {_short(new[k])} now" for k in differ)
        raise UserError(f"--resume {saved.parent}: the config differs from the run's ({saved.name}) "
                        f"in {', '.join(differ)} ({shown}); resume with the run's settings, or start a new "
                        "run with --overwrite or another folder")


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def _remove(path: Path, command: str) -> None:
    here = Path.cwd().resolve()
    if path.resolve() == here or path.resolve() in here.parents:
        raise UserError(f"--overwrite would remove {path}, which holds the current folder; "
                        "choose another folder for the run")
    print(f"{command}: --overwrite: removing the run in {path}", flush=True)
    shutil.rmtree(path)


__all__ = ["FREE_KEYS", "RUN_FILES", "check_same_config", "claim_run_folder", "run_files"]
