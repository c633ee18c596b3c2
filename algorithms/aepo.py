"""AEPO (arXiv 2510.14545): ARPO with entropy-balanced rollout and policy optimisation.

    agent-envs train --algo aepo --config configs/aepo_tiny.yaml

ARPO, except (each switchable, docs/algorithms.md §7):

* pre-monitoring splits the budget M between global samples and branches (§7.2);
* the branch probability is damped by a consecutive-branch penalty counted per branch (§7.3);
* the PPO upper clip keeps a scaled gradient: (1+ε_h)·r/sg(r) above the bound (§7.4): the
  shared loss's `policy_loss: ppo_clip_gradpreserve`, AEPO's default;
* advantages are reweighted per token by the policy's entropy: Ã = A·(1 + α_H·Ĥ) (§7.5), with Ĥ
  normalised over the whole mini-batch (all ranks), and computed whenever the feature is on, even
  with `entropy_coeff=0` (the reference silently skips it then, docs/algorithms.md D9).

    >>> import torch
    >>> h, m = torch.tensor([[1.0, 2.0, 3.0, 9.0]]), torch.tensor([[1, 1, 1, 0]])
    >>> mean, std = entropy_stats(h, m)
    >>> entropy_aware_advantages(torch.ones(1), h, m, mean=mean, std=std)[0, :3].tolist()
    [0.800000011920929, 1.0, 1.2000000476837158]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from agent_envs.base.config import option
from algorithms.arpo import ARPOConfig, ARPOLearner
from algorithms.core.batch import MicroBatch, RolloutBatch
from algorithms.core.learner_config import PolicyLoss
from algorithms.rollout.tree_config import TreeConfig


def aepo_tree() -> TreeConfig:
    """ARPO's tree with AEPO's two rollout-side switches on: entropy pre-monitoring (§7.2) and the
    consecutive-branch penalty (§7.3). The `aepo_reference` presets turn pre-monitoring off, as the
    released scripts do."""
    return TreeConfig(enable_dynamic_rollouts=True, enable_consecutive_penalty=True)


@dataclass
class AEPOConfig(ARPOConfig):
    """ARPO's settings plus AEPO's four features, all on (docs/algorithms.md §7.6): two in `tree`,
    the gradient-preserving clip as `policy_loss`, the entropy-aware advantage here. The constants
    the reference hard-codes are keys here, with its values."""

    output_dir: str = "runs/aepo"
    tree: TreeConfig = option(factory=aepo_tree, help="the tree rollout's settings (AEPO: both switches on)")
    policy_loss: PolicyLoss = "ppo_clip_gradpreserve"  # (§7.4) the upper clip keeps a scaled gradient
    enable_entropy_balanced_advantage: bool = option(True, "(§7.5) Ã = A·(1 + α_H·Ĥ)")
    entropy_adv_alpha: float = option(0.2, "α_H of the entropy-aware advantage")
    entropy_adv_norm_scope: Literal["minibatch", "microbatch", "group"] = option(
        "minibatch", "where Ĥ's mean and std are taken: minibatch (all ranks), microbatch (reference), group"
    )
    clamp_entropy_factor: bool = option(False, "clamp (1 + α_H·Ĥ) at 0")


class AEPOLearner(ARPOLearner):
    """ARPO with pre-monitoring and the penalty (in its `tree`), the gradient-preserving upper
    clip (in its `policy_loss`), and the entropy-aware advantage (these hooks)."""

    name = "aepo"
    config_class = AEPOConfig
    config: AEPOConfig

    def needs_entropy(self) -> bool:
        return super().needs_entropy() or self.config.enable_entropy_balanced_advantage

    def prepare_minibatch(self, batch: RolloutBatch, rows: list[int]) -> Any:
        """μ, σ of π_θ's entropy over the whole mini-batch, all ranks (docs/algorithms.md D10). Weights do not
        change between a mini-batch's micro-batches, so a no-grad pass now sees the entropies those
        micro-batches will compute. Returns (μ, σ), or {group id: (μ, σ)} for the `group` scope,
        or None when the statistics are per micro-batch."""
        cfg = self.config
        if not cfg.enable_entropy_balanced_advantage or cfg.entropy_adv_norm_scope == "microbatch":
            return None
        size = cfg.micro_batch_size
        moments = torch.zeros(3, dtype=torch.float64)
        per_group: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for start in range(0, len(rows), size):
                part = rows[start : start + size]
                width = max(1, max(len(batch.trajectories[r].response_ids) for r in part))
                _, ent = self.forward(self.model, batch, MicroBatch(part, width), with_entropy=True)
                ent, mask = ent.float().cpu(), batch.loss_mask[part, :width]
                moments += entropy_moments(ent, mask)
                for j, r in enumerate(part):
                    g = int(batch.group_ids[r])
                    per_group[g] = per_group.get(g, 0) + entropy_moments(ent[j], mask[j])
        if cfg.entropy_adv_norm_scope == "group":  # groups never straddle ranks
            return {g: stats_from_moments(m) for g, m in per_group.items()}
        return stats_from_moments(self.ranks.sum(moments))

    def adjust_advantages(
        self,
        batch: RolloutBatch,
        micro: MicroBatch,
        advantages: torch.Tensor,
        extras: dict[str, torch.Tensor],
        minibatch_stats: Any = None,
    ) -> torch.Tensor:
        cfg = self.config
        if not cfg.enable_entropy_balanced_advantage:
            return advantages
        ent = extras.get("entropy")
        if ent is None:  # never silently skip the feature (docs/algorithms.md D9)
            raise RuntimeError("AEPO entropy-aware advantage: the training forward pass returned no entropy")
        mask = batch.loss_mask[micro.rows, : micro.width].to(ent.device)
        scope = cfg.entropy_adv_norm_scope
        if scope == "microbatch":
            mean, std = entropy_stats(ent, mask)
        elif scope == "group":
            pairs = [minibatch_stats[int(batch.group_ids[r])] for r in micro.rows]
            mean = torch.tensor([[p[0]] for p in pairs], device=ent.device)
            std = torch.tensor([[p[1]] for p in pairs], device=ent.device)
        else:
            mean, std = minibatch_stats
        out = entropy_aware_advantages(
            advantages,
            ent,
            mask,
            mean=mean,
            std=std,
            alpha=cfg.entropy_adv_alpha,
            clamp_factor=cfg.clamp_entropy_factor,
        )
        return out.to(ent.device)


def entropy_moments(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[Σh, Σh², n] over valid tokens: sums that all-reduce exactly across micro-batches and ranks."""
    m = mask.to(torch.float64)
    h = entropy.detach().to(torch.float64) * m
    return torch.stack([h.sum(), (h * h).sum(), m.sum()])


def stats_from_moments(moments: torch.Tensor) -> tuple[float, float]:
    """(μ, σ) from summed moments; σ is the unbiased std, and 1 when it is 0 or undefined (reference)."""
    s, sq, n = (float(x) for x in moments)
    if n <= 0:
        return 0.0, 1.0
    mean = s / n
    var = max(0.0, (sq - n * mean * mean) / (n - 1)) if n > 1 else 0.0
    std = var**0.5
    return mean, std if std > 0 else 1.0


def entropy_stats(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[float, float]:
    """μ, σ of the entropy over valid tokens; `all_reduce` sums the moments across ranks."""
    moments = entropy_moments(entropy, mask)
    if all_reduce is not None:
        moments = all_reduce(moments)
    return stats_from_moments(moments)


def entropy_aware_advantages(
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    mean: float | torch.Tensor,
    std: float | torch.Tensor,
    alpha: float = 0.2,
    clamp_factor: bool = False,
) -> torch.Tensor:
    """Ã_t = A_t·(1 + α_H·(H_t − μ)/σ), detached (docs/algorithms.md §7.5). Returns [B, T].

    `advantages` is [B] or [B, T]; `mean`/`std` are scalars or broadcastable tensors (per-group
    statistics for `entropy_adv_norm_scope="group"`). `clamp_factor` clamps the factor at 0 so a
    very low-entropy token cannot flip its advantage's sign (off by default, as the reference).
    """
    if entropy.shape != mask.shape:
        raise ValueError(
            f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must both be [batch, tokens]"
        )
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    norm = (entropy.detach().float() - torch.as_tensor(mean).float()) / torch.as_tensor(std).float()
    factor = 1.0 + alpha * norm
    if clamp_factor:
        factor = factor.clamp(min=0.0)
    return (adv.float() * factor).detach()


__all__ = [
    "AEPOConfig",
    "AEPOLearner",
    "aepo_tree",
    "entropy_aware_advantages",
    "entropy_moments",
    "entropy_stats",
    "stats_from_moments",
]
