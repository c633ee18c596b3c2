"""What a training run opens and prints around its steps: the run log, the resolved config, the
resume message and the first step's warning. The loop itself is `Learner.train` (learner.py).

    agent-envs train --algo grpo --config configs/grpo_tiny.yaml --resume auto
"""

from __future__ import annotations

import os
import textwrap
import warnings
from pathlib import Path
from typing import Any

from agent_envs.base.config import config_dict
from algorithms.core.learner_config import LearnerConfig
from algorithms.core.run_log import RunLogger


def open_run_log(cfg: LearnerConfig, run_dir: Path, *, run_config: dict[str, Any], world: int, enabled: bool,
                 resume_step: int | None) -> RunLogger:  # fmt: skip
    """The run's log (metrics.jsonl, and TensorBoard, W&B and the progress bar as `cfg` asks);
    `resume_step`: the checkpoint's step when the run continues one (run_log.py)."""
    return RunLogger(
        run_dir,
        config={**run_config, "world_size": world},
        total_steps=cfg.total_steps,
        enabled=enabled,
        tensorboard=cfg.tensorboard,
        wandb=cfg.wandb,
        wandb_project=cfg.wandb_project,
        progress=cfg.progress,
        resume_step=resume_step,
    )


def announce(name: str, cfg: LearnerConfig, *, run_dir: Path, resume: str | os.PathLike | bool | None,
             start: Path | None, step: int) -> None:  # fmt: skip
    """Print the resolved config and where the run starts (main process only)."""
    # a paragraph a reader can scan, not one line of 1,500 characters
    resolved = textwrap.fill(", ".join(f"{k}={v!r}" for k, v in config_dict(cfg).items()), width=100,
                             initial_indent="  ", subsequent_indent="  ", break_long_words=False,
                             break_on_hyphens=False)  # fmt: skip
    print(f"[{name}] resolved config:\n{resolved}", flush=True)
    if start is not None:
        print(f"[{name}] resumed from {start} at step {step}", flush=True)
        if step >= cfg.total_steps:
            print(f"[{name}] the run is at step {step} of total_steps={cfg.total_steps}: "
                  "nothing left to train (raise total_steps to train on)", flush=True)  # fmt: skip
    elif resume:
        print(f"[{name}] no checkpoint in {run_dir} to resume from: starting at step 0", flush=True)


def warn_without_tool_calls(metrics: dict[str, float]) -> None:
    """Warn when the first step's rollouts called no tool (called from `Learner.train`)."""
    if metrics.get("tool_calls_mean", 1.0) == 0.0:
        warnings.warn(
            "no tool calls in the first step's rollouts: check the env's tools and stop "
            "strings (docs/algorithms.md D23)",
            stacklevel=3,  # the caller of `Learner.train`
        )


__all__ = ["announce", "open_run_log", "warn_without_tool_calls"]
