"""What one RL step carries: prompt draws, their seeded order, and the padded batch tensors.

    >>> sampler = PromptSampler(num_tasks=5, seed=0)
    >>> first = sampler.draw(3)
    >>> state = sampler.state_dict(); later = sampler.draw(4)
    >>> sampler.load_state_dict(state); sampler.draw(4) == later
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class PromptDraw:
    """One prompt drawn for a step: which task, its group id, and the seed of its samples."""

    index: int
    group_id: int
    seed: int


class PromptSampler:
    """Seeded epochs over task indices; its state is (epoch, cursor) and fits in a checkpoint."""

    def __init__(self, num_tasks: int, seed: int) -> None:
        if num_tasks < 1:
            raise ValueError("the env has no tasks to draw prompts from")
        self.num_tasks, self.seed = num_tasks, seed
        self.epoch, self.cursor = 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.num_tasks)

    def draw(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.cursor >= self.num_tasks:
                self.epoch, self.cursor = self.epoch + 1, 0
                self._perm = self._permutation()
            take = min(k - len(out), self.num_tasks - self.cursor)
            out += self._perm[self.cursor : self.cursor + take].tolist()
            self.cursor += take
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._perm = self._permutation()


@dataclass
class RolloutBatch:
    """A rank's trajectories of one RL step as padded response-space tensors [B, T].

    Hooks may replace `advantages` (per trajectory or per token) and `loss_mask` (e.g. hard
    attribution), and put per-token tensors in `extras`.
    """

    trajectories: list[Any]
    rewards: torch.Tensor  # [B]
    group_ids: torch.Tensor  # [B]
    response_ids: torch.Tensor  # [B, T] (pad 0)
    loss_mask: torch.Tensor  # [B, T] float
    rollout_logprobs: torch.Tensor  # [B, T]
    advantages: torch.Tensor | None = None  # [B] or [B, T]
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    old_entropy: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.trajectories)

    @classmethod
    def from_trajectories(cls, trajs: Sequence[Any], rewards: torch.Tensor) -> RolloutBatch:
        width = max((len(t.response_ids) for t in trajs), default=0)
        b = len(trajs)
        ids = torch.zeros(b, max(width, 1), dtype=torch.long)
        mask = torch.zeros(b, max(width, 1))
        lps = torch.zeros(b, max(width, 1))
        for i, t in enumerate(trajs):
            n = len(t.response_ids)
            ids[i, :n] = torch.tensor(t.response_ids, dtype=torch.long)
            mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float)
            lps[i, :n] = torch.tensor(t.logprobs, dtype=torch.float)
        return cls(
            trajectories=list(trajs),
            rewards=rewards.float(),
            group_ids=torch.tensor([t.group_id for t in trajs], dtype=torch.long),
            response_ids=ids,
            loss_mask=mask,
            rollout_logprobs=lps,
        )


@dataclass
class MicroBatch:
    """Rows of a `RolloutBatch` trained together; `rows` index the batch, `width` trims padding."""

    rows: list[int]
    width: int
    dummy: bool = False  # a rank with fewer rows than others still runs forward/backward (mask 0)


__all__ = ["MicroBatch", "PromptDraw", "PromptSampler", "RolloutBatch"]
