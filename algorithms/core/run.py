"""A training run around the RL step: resume, the run log, validation, checkpoints, the export.

    agent-envs train --algo grpo --config configs/grpo_tiny.yaml --resume auto

`run_training(learner)` is what `Learner.train()` does: resume from a checkpoint when asked
(docs/training.md, Resume), validate before the first step, then call `learner.train_step()`
until `total_steps`, validating every `eval_every` steps and at the end, logging every step and
checkpointing every `save_every` steps and at the end; the final policy is exported to
`<output_dir>/final_model`.
"""

from __future__ import annotations

import os
import textwrap
import warnings
from pathlib import Path
from typing import Any

from agent_envs.base.config import config_dict
from algorithms.core.async_rollout import AsyncRollout
from algorithms.core.checkpoint import load_checkpoint, resolve_resume, save_checkpoint
from algorithms.core.evaluation import evaluate
from algorithms.core.model_setup import export_policy
from algorithms.core.run_folder import claim_run_folder
from algorithms.core.run_log import RunLogger


def run_training(learner: Any, resume: str | os.PathLike | bool | None = None,
                 overwrite: bool = False) -> list[dict[str, float]]:
    """Run `learner` until its config's `total_steps`; returns the logged metrics of the steps run
    here (collective: every rank calls it). An `output_dir` that holds another run is refused unless
    `resume` continues it (with the same config) or `overwrite` removes it (run_folder.py)."""
    cfg, acc = learner.config, learner.accelerator
    claim_run_folder(learner.run_dir, "train", config=run_config(learner), resume=bool(resume), overwrite=overwrite)
    # every rank looks at the folder before any rank writes into it: a rank that looked after the
    # main one wrote config.json would take this very run for another one
    acc.wait_for_everyone()
    start = resolve_resume(resume, learner.run_dir)
    if start is not None:
        state = load_checkpoint(acc, start)
        learner.step = int(state["step"])
        learner.sampler.load_state_dict(state["sampler"])
        learner.sync_engine()
    learner.logger = RunLogger(
        learner.run_dir,
        config={**run_config(learner), "world_size": learner.world},
        total_steps=cfg.total_steps,
        enabled=acc.is_main_process,
        tensorboard=cfg.tensorboard,
        wandb=cfg.wandb,
        wandb_project=cfg.wandb_project,
        progress=cfg.progress,
        resume_step=learner.step if start is not None else None,
    )
    if acc.is_main_process:
        # a paragraph a reader can scan, not one line of 1,500 characters
        resolved = textwrap.fill(", ".join(f"{k}={v!r}" for k, v in config_dict(cfg).items()), width=100,
                                 initial_indent="  ", subsequent_indent="  ", break_long_words=False,
                                 break_on_hyphens=False)
        print(f"[{learner.name}] resolved config:\n{resolved}", flush=True)
        if start is not None:
            print(f"[{learner.name}] resumed from {start} at step {learner.step}", flush=True)
            if learner.step >= cfg.total_steps:
                print(f"[{learner.name}] the run is at step {learner.step} of total_steps={cfg.total_steps}: "
                      "nothing left to train (raise total_steps to train on)", flush=True)
        elif resume:
            print(f"[{learner.name}] no checkpoint in {learner.run_dir} to resume from: starting at step 0",
                  flush=True)
    history = []
    try:
        if cfg.eval_every and start is None:
            learner.logger.log(0, validate(learner))
        if cfg.max_staleness:
            learner.producer = AsyncRollout(learner)
            learner.producer.start(learner.step, cfg.total_steps)
        while learner.step < cfg.total_steps:
            metrics = learner.train_step()
            if cfg.eval_every and (learner.step % cfg.eval_every == 0 or learner.step == cfg.total_steps):
                metrics.update(validate(learner))
            learner.logger.log(learner.step, metrics)
            history.append({"step": learner.step, **metrics})
            if cfg.save_every and learner.step % cfg.save_every == 0 and learner.step < cfg.total_steps:
                save(learner)
            if learner.step == 1 and metrics.get("tool_calls_mean", 1.0) == 0.0 and acc.is_main_process:
                warnings.warn(
                    "no tool calls in the first step's rollouts: check the env's tools and stop "
                    "strings (docs/algorithms.md D23)",
                    stacklevel=3,
                )
        if cfg.total_steps > 0:
            save(learner)
        if cfg.export_model:
            export_policy(acc, learner.model, learner.tokenizer, learner.run_dir / "final_model")
    finally:
        if learner.producer is not None:
            learner.producer.close()
            learner.producer = None
        learner.logger.close(plot=acc.is_main_process)
    return history


def run_config(learner: Any) -> dict[str, Any]:
    """What `config.json` records and a resumed run must match: the algorithm and its resolved config."""
    return {"algo": learner.name, **config_dict(learner.config)}


def validate(learner: Any) -> dict[str, float]:
    """Greedy episodes on the learner's held-out tasks (algorithms/core/evaluation.py)."""
    return evaluate(
        model=learner.model,
        engine=learner.engine,
        env_factory=learner.env_factory,
        tasks=learner.eval_tasks,
        max_response_tokens=learner.config.max_response_tokens,
        health=learner.health,
        ranks=learner.ranks,
    )


def save(learner: Any) -> Path:
    """Checkpoint the learner at its step (collective; docs/training.md, Reliability)."""
    # the producer draws prompts ahead of the learner: save the draw position of the last step taken
    producer = learner.producer
    sampler = producer.sampler_state if producer is not None else learner.sampler.state_dict()
    state = {"sampler": sampler, "algo": learner.name}
    return save_checkpoint(
        learner.accelerator, learner.run_dir, learner.step, state, keep_last=learner.config.keep_checkpoints
    )


__all__ = ["run_config", "run_training", "save", "validate"]
