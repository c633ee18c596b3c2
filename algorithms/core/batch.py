"""What one RL step carries: prompt draws, their seeded order, and the padded batch tensors.

    >>> sampler = PromptSampler(num_tasks=5, seed=0)
    >>> first = sampler.draw(3)
    >>> state = sampler.state_dict(); later = sampler.draw(4)
    >>> sampler.load_state_dict(state); sampler.draw(4) == later
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from algorithms.core.losses import LossInputs


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

    def loss_inputs(
        self, micro: MicroBatch, logprobs: torch.Tensor, *, num_tokens: Any, num_seqs: Any, device: Any
    ) -> LossInputs:
        """A micro-batch's slice of the tensors the loss reads (`losses.loss_and_metrics`); π_old is
        π_θ itself (detached) under the on-policy shortcut, and a dummy micro-batch trains nothing."""
        rows, w = micro.rows, micro.width
        mask = self.loss_mask[rows, :w].to(device)
        if micro.dummy:
            mask = torch.zeros_like(mask)
        old = logprobs.detach() if self.old_logprobs is None else self.old_logprobs[rows, :w].to(device)
        adv = self.advantages[rows] if self.advantages.dim() == 1 else self.advantages[rows, :w]
        ref = None if self.ref_logprobs is None else self.ref_logprobs[rows, :w].to(device)
        behaviour = self.rollout_logprobs[rows, :w].to(device)
        return LossInputs(old_logprobs=old, behaviour_logprobs=behaviour, advantages=adv.to(device), mask=mask,
                          num_tokens=num_tokens, num_seqs=num_seqs, ref_logprobs=ref)  # fmt: skip

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


def local_share(draws: Sequence[PromptDraw], num_minibatches: int, rank: int, world: int) -> list[PromptDraw]:
    """This rank's draws of a step: within each mini-batch a contiguous block per rank, so
    mini-batch k is the same set of prompts whatever the number of processes."""
    per_mb = len(draws) // num_minibatches
    per_rank = per_mb // world
    out: list[PromptDraw] = []
    for m in range(num_minibatches):
        start = m * per_mb + rank * per_rank
        out += draws[start : start + per_rank]
    return out


def minibatch_rows(batch: RolloutBatch, count: int) -> list[list[int]]:
    """Row indices of each of `count` mini-batches: consecutive groups, in draw order."""
    order: list[int] = []
    for g in batch.group_ids.tolist():
        if g not in order:
            order.append(g)
    per = math.ceil(len(order) / count) if order else 0
    out = []
    for m in range(count):
        groups = set(order[m * per : (m + 1) * per])
        out.append([i for i, g in enumerate(batch.group_ids.tolist()) if g in groups])
    return out


def micro_batches(batch: RolloutBatch, rows: list[int], count: int) -> list[MicroBatch]:
    """Split `rows` into exactly `count` micro-batches (ranks must agree on the count)."""
    parts = [p.tolist() for p in np.array_split(np.array(rows, dtype=np.int64), count)]
    out = []
    for part in parts:
        if part:
            lengths = [len(batch.trajectories[r].response_ids) for r in part]
            out.append(MicroBatch(rows=part, width=max(1, max(lengths))))
        else:  # fewer rows than micro-batches: a zero-weight pass keeps collectives aligned
            out.append(MicroBatch(rows=[rows[0] if rows else 0], width=1, dummy=True))
    return out


__all__ = [
    "MicroBatch",
    "PromptDraw",
    "PromptSampler",
    "RolloutBatch",
    "local_share",
    "micro_batches",
    "minibatch_rows",
]
