"""DAPO (arXiv 2503.14476): GRPO with clip-higher, dynamic sampling, token-level loss and overlong
reward shaping, and no KL.

    agent-envs train --algo dapo --config configs/dapo_tiny.yaml

    >>> from algorithms.dapo import DAPOConfig
    >>> cfg = DAPOConfig(max_response_tokens=100)
    >>> cfg.clip_ratio_high, cfg.clip_ratio_c, cfg.overlong_cache_len
    (0.28, 10.0, 20)

GRPO, except (docs/algorithms.md §4):

* clip-higher: ε_low 0.2, ε_high 0.28; dual clip c = 10;
* `token-mean` aggregation (the core's default, so nothing to change);
* soft overlong punishment added to the env reward before the group normalisation, with
  L_cache = 20 % of `max_response_tokens` unless set; lengths count model tokens (m = 1) unless
  `overlong_basis=total`;
* dynamic sampling: generation rounds of `gen_batch_multiplier` × the prompts still missing;
  groups whose filter metric has zero spread (or a single member) are dropped, and rounds
  continue until the step's prompts are filled. After `max_num_gen_batches` rounds it stops
  with an error (≤ 0: unlimited);
* optimizer as the recipe: lr 1e-6, 10 warm-up steps, weight decay 0.1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from agent_envs.base.config import option
from algorithms.base.seeds import DRAWS_PER_ROUND, dapo_first_group_id, dapo_seed_step
from algorithms.core.advantages import constant_groups
from algorithms.core.learner import Learner
from algorithms.core.learner_config import LearnerConfig
from algorithms.core.losses import overlong_penalty


@dataclass
class DAPOConfig(LearnerConfig):
    """DAPO's defaults (docs/algorithms.md §4); keys not set here are GRPO's."""

    output_dir: str = "runs/dapo"
    group_size: int = 16
    clip_ratio_high: float = 0.28
    clip_ratio_c: float | None = 10.0
    weight_decay: float = 0.1
    warmup_steps: int = 10
    dynamic_sampling: bool = option(True, "drop groups whose filter metric has zero spread, and refill")
    filter_metric: Literal["reward", "acc"] = option(
        "reward", "reward (the shaped scalar) or acc (the env's `correct` component)"
    )
    gen_batch_multiplier: float = option(3.0, "prompts per generation round, relative to the prompts missing")
    max_num_gen_batches: int = option(10, "generation rounds before giving up (<= 0: unlimited)")
    overlong_shaping: bool = option(True, "soft overlong punishment added to the env reward")
    overlong_buffer_len: int | None = option(None, "L_cache (null: 20 % of max_response_tokens)")
    overlong_penalty_factor: float = option(1.0, "weight of the overlong punishment")
    overlong_basis: Literal["model", "total"] = option(
        "model", "lengths count model tokens (model) or tool tokens too (total)"
    )

    def validate(self) -> None:
        super().validate()
        if self.gen_batch_multiplier < 1:
            raise ValueError(
                f"config field 'gen_batch_multiplier' must be >= 1, got {self.gen_batch_multiplier}"
            )

    @property
    def overlong_cache_len(self) -> int:
        return self.overlong_buffer_len or max(1, round(0.2 * self.max_response_tokens))


class DAPOLearner(Learner):
    name = "dapo"
    config_class = DAPOConfig
    config: DAPOConfig

    def shape_rewards(self, trajectories: Sequence[Any]) -> torch.Tensor:
        rewards = super().shape_rewards(trajectories)
        cfg = self.config
        if not cfg.overlong_shaping or not trajectories:
            return rewards
        if cfg.overlong_basis == "model":
            lengths = [sum(t.loss_mask) for t in trajectories]
        else:
            lengths = [len(t.response_ids) for t in trajectories]
        penalty = overlong_penalty(
            torch.tensor(lengths),
            cfg.max_response_tokens,
            cfg.overlong_cache_len,
            cfg.overlong_penalty_factor,
        )
        return rewards + penalty

    def _filter_values(self, trajectories: Sequence[Any]) -> torch.Tensor:
        if self.config.filter_metric == "acc":
            return torch.tensor([float(t.components.get("correct", 0.0) or 0.0) for t in trajectories])
        return self.shape_rewards(trajectories)

    def collect(self, step: int) -> tuple[list[Any], dict[str, float]]:
        cfg = self.config
        if not cfg.dynamic_sampling:
            return super().collect(step)
        quota = cfg.prompts_per_step // self.world  # groups this rank must keep
        g = cfg.group_size
        kept: list[Any] = []
        generated = kept_groups = 0
        rounds = 0
        missing_total = cfg.prompts_per_step
        while True:
            # every rank draws the same global prompts (keeps the sampler in sync), takes its
            # contiguous share, and rolls out only while it still misses groups
            count = max(
                self.world, math.ceil(cfg.gen_batch_multiplier * missing_total / self.world) * self.world
            )
            if count > DRAWS_PER_ROUND:
                raise ValueError(
                    f"DAPO dynamic sampling: {count} draws in one generation round exceed the "
                    f"{DRAWS_PER_ROUND} group ids a round owns; lower gen_batch_multiplier"
                )
            first = dapo_first_group_id(step, rounds, max_rounds=cfg.max_num_gen_batches)
            draws = self.draw_prompts(dapo_seed_step(step, rounds), count, first)
            per = count // self.world
            mine = draws[self.rank * per : (self.rank + 1) * per]
            if len(kept) < quota * g:
                trajs = self.rollout(mine)
                generated += len(mine)
                drop = constant_groups(self._filter_values(trajs), [t.group_id for t in trajs])
                for start in range(0, len(trajs), g):
                    if len(kept) < quota * g and not bool(drop[start]):
                        kept += trajs[start : start + g]
                        kept_groups += 1
            rounds += 1
            missing_total = int(self.ranks.sum(quota - len(kept) // g))
            if missing_total <= 0:
                break
            if cfg.max_num_gen_batches > 0 and rounds >= cfg.max_num_gen_batches:
                raise RuntimeError(
                    f"DAPO dynamic sampling: after {rounds} generation rounds (max_num_gen_batches) "
                    f"{missing_total} of {cfg.prompts_per_step} prompt groups still have zero reward "
                    "spread; every sampled group was all-correct or all-wrong. Raise "
                    "max_num_gen_batches or gen_batch_multiplier, lower the task difficulty, or set "
                    "dynamic_sampling=false"
                )
        gen_total = float(self.ranks.sum(generated))
        metrics = {
            "gen_rounds": float(rounds),
            "kept_group_fraction": float(self.ranks.sum(kept_groups)) / max(1.0, gen_total),
            "generated_groups": gen_total,
        }
        return kept, metrics


__all__ = ["DAPOConfig", "DAPOLearner"]
