"""Outcome advantages: one scalar per trajectory, computed within groups of the same prompt.

    >>> import torch
    >>> from algorithms.core.advantages import grpo_advantages
    >>> grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), [7, 7, 7, 7]).round(decimals=4)
    tensor([ 0.8660, -0.8660, -0.8660,  0.8660])

A group is every trajectory sampled from one prompt *draw* (one group id): two draws of the same
text are two groups. Formulas, defaults and reference behaviours: docs/algorithms.md §3.2, §5.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

SCALE_MODES = ("group", "batch", "none")


def _group_index(group_ids: torch.Tensor | Sequence[int], n: int) -> tuple[torch.Tensor, int]:
    """Dense group index 0..K-1 per trajectory (ids may be any ints, in any order)."""
    ids = torch.as_tensor(group_ids)
    if ids.dim() != 1 or ids.numel() != n:
        raise ValueError(f"group_ids must be 1-D with one id per reward ({n}), got shape {tuple(ids.shape)}")
    if ids.dtype.is_floating_point:
        raise ValueError("group_ids must be integers (one id per prompt draw), got floats")
    _, inverse = torch.unique(ids, return_inverse=True)
    return inverse, int(inverse.max()) + 1 if n else 0


def group_stats(rewards: torch.Tensor, index: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """Per-trajectory group mean, unbiased group std, group size, and whether the group is constant."""
    r = rewards.double()
    size = torch.zeros(k, dtype=torch.float64).index_add_(0, index, torch.ones_like(r))
    mean = torch.zeros(k, dtype=torch.float64).index_add_(0, index, r) / size
    sq = torch.zeros(k, dtype=torch.float64).index_add_(0, index, (r - mean[index]) ** 2)
    std = (sq / (size - 1).clamp(min=1)).sqrt()
    hi = torch.full((k,), -torch.inf, dtype=torch.float64).scatter_reduce(0, index, r, "amax")
    lo = torch.full((k,), torch.inf, dtype=torch.float64).scatter_reduce(0, index, r, "amin")
    return mean[index], std[index], size[index], (hi == lo)[index]


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[int],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    scale_rewards: str | None = None,
) -> torch.Tensor:
    """GRPO advantage A_i = (R_i − μ_g) / (σ_g + eps), one value per trajectory.

    Args:
        rewards: 1-D float tensor, one scalar reward per trajectory.
        group_ids: one int per trajectory; equal ids share a prompt draw.
        normalize_std: divide by the group std (False = Dr. GRPO, same as `scale_rewards="none"`).
        eps: added to the std (verl's 1e-6).
        scale_rewards: `"group"` (default), `"batch"` (std over all trajectories, LitePPO) or
            `"none"` (Dr. GRPO). Overrides `normalize_std` when given.

    σ is the unbiased (Bessel) std. A group whose rewards are all equal gets exactly 0 (no float
    residue from the mean). A group of size 1 gets 0 and a warning: verl would give it the raw,
    uncentred reward (docs/algorithms.md D30).
    """
    rewards = torch.as_tensor(rewards)
    if rewards.dim() != 1:
        raise ValueError(
            f"rewards must be a 1-D tensor (one per trajectory), got shape {tuple(rewards.shape)}"
        )
    mode = scale_rewards if scale_rewards is not None else ("group" if normalize_std else "none")
    if mode not in SCALE_MODES:
        raise ValueError(f"scale_rewards must be one of {SCALE_MODES}, got {mode!r}")
    n = rewards.numel()
    if n == 0:
        return torch.zeros(0, dtype=rewards.dtype if rewards.is_floating_point() else torch.float32)
    index, k = _group_index(group_ids, n)
    mean, std, size, constant = group_stats(rewards, index, k)
    centred = rewards.double() - mean
    if mode == "group":
        adv = centred / (std + eps)
    elif mode == "batch":
        adv = centred / (rewards.double().std() + eps) if n > 1 else torch.zeros_like(centred)
    else:
        adv = centred
    lone = size == 1
    if bool(lone.any()):
        warnings.warn(
            f"{int(lone.sum())} group(s) have a single trajectory; their advantage is set to 0 "
            "(sample more than one response per prompt draw)",
            stacklevel=2,
        )
    adv = torch.where(constant | lone, torch.zeros_like(adv), adv)
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    return adv.to(out_dtype)


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """Leave-one-out baseline: A_i = R_i − mean of the other rewards of its group (0 for lone samples)."""
    rewards = torch.as_tensor(rewards)
    n = rewards.numel()
    if n == 0:
        return torch.zeros(0)
    index, k = _group_index(group_ids, n)
    mean, _, size, _ = group_stats(rewards, index, k)
    r = rewards.double()
    others = (mean * size - r) / (size - 1).clamp(min=1)
    adv = torch.where(size > 1, r - others, torch.zeros_like(r))
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def constant_groups(rewards: torch.Tensor, group_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """Bool per trajectory: does its group have zero reward spread (or a single member)?

    DAPO's dynamic sampling drops these groups: their GRPO advantage is 0, so they only dilute.
    """
    rewards = torch.as_tensor(rewards)
    index, k = _group_index(group_ids, rewards.numel())
    _, _, size, constant = group_stats(rewards, index, k)
    return constant | (size == 1)


def pass_rate_tool_cost(
    rewards: torch.Tensor,
    tool_cost: torch.Tensor,
    correct: torch.Tensor,
    group_ids: torch.Tensor | Sequence[int],
) -> torch.Tensor:
    """Rewards with the env's tool cost scaled by the group's pass rate p_g (`reward.tool_cost_scaling:
    pass_rate`, as prime-rl's length penalty): R'_j = R_j + (1 − p_g)·c_j, where c_j ≥ 0 is what
    the env subtracted (its `tool_cost` component) and p_g the mean of `correct` over the group. A
    group that never succeeds keeps its tool calls free, so it is not pushed to stop trying them.

    >>> out = pass_rate_tool_cost(torch.tensor([0.9, -0.2, 0.0, -0.1]), torch.tensor([0.1, 0.2, 0.0, 0.1]),
    ...                           torch.tensor([1.0, 0.0, 0.0, 0.0]), [0, 0, 1, 1])
    >>> [round(x, 4) for x in out.tolist()]  # group 0 passes half the time; group 1 never
    [0.95, -0.1, 0.0, 0.0]
    """
    rewards = torch.as_tensor(rewards)
    n = rewards.numel()
    if tool_cost.shape != (n,) or correct.shape != (n,):
        raise ValueError(f"tool_cost and correct need one entry per reward ({n})")
    if n == 0:
        return rewards
    index, k = _group_index(group_ids, n)
    pass_rate, _, _, _ = group_stats(correct, index, k)
    out = rewards.double() + (1.0 - pass_rate) * tool_cost.double()
    return out.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


ADVANTAGE_ESTIMATORS = {"grpo": grpo_advantages, "rloo": rloo_advantages}


def outcome_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[int],
    *,
    estimator: str = "grpo",
    scale_rewards: str = "group",
    eps: float = 1e-6,
    every_reward: torch.Tensor | None = None,
) -> torch.Tensor:
    """The learners' advantage (config keys `advantage_estimator`, `scale_rewards`, `adv_eps`).

    `every_reward` holds every rank's rewards when the batch spans ranks: `batch` scaling then
    divides by their std (groups never straddle ranks, so the centring stays local).
    """
    if estimator == "rloo":
        return rloo_advantages(rewards, group_ids)
    if every_reward is not None and scale_rewards == "batch":
        centred = grpo_advantages(rewards, group_ids, scale_rewards="none")
        return centred / (every_reward.std() + eps)
    return grpo_advantages(rewards, group_ids, eps=eps, scale_rewards=scale_rewards)


__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "constant_groups",
    "group_stats",
    "grpo_advantages",
    "outcome_advantages",
    "pass_rate_tool_cost",
    "rloo_advantages",
]
