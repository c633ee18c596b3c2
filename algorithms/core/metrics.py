"""The metrics of an RL step: rollout statistics over every rank, and the update's loss metrics
summed over micro-batches and ranks, then averaged over the step's optimizer steps. Their names
are read by the run logs, the diagnostics and the viewer (docs/algorithms.md §2.11): keep them.

    >>> import torch
    >>> step = StepMetrics()
    >>> step.add({"pg_loss": 1.0, "is_ratio/sum": 3.0, "is_ratio/tokens": 3.0, "is_ratio/min": 0.5})
    >>> step.add({"pg_loss": 3.0, "is_ratio/min": 0.25, "is_ratio/max": 2.0})
    >>> step.is_ratio(), step.means()
    ({'is_ratio/min': 0.25, 'is_ratio/mean': 1.0, 'is_ratio/max': 2.0}, {'pg_loss': 2.0})
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from algorithms.core.batch import RolloutBatch
from algorithms.core.ranks import Ranks

Gather = Callable[[dict[str, list[Any]]], dict[str, list[Any]]]


def rollout_metrics(batch: RolloutBatch, gather_lists: Gather) -> dict[str, float]:
    """Reward, accuracy, tool and length statistics over every rank's trajectories."""
    trajs = batch.trajectories
    rows = {
        "reward": batch.rewards.tolist(),
        "env_reward": [float(t.reward) for t in trajs],
        "correct": [float(t.components.get("correct", 0.0) or 0.0) for t in trajs],
        "format_ok": [float(bool(t.components.get("format_ok", False))) for t in trajs],
        "tool_calls": [float(t.tool_calls) for t in trajs],
        "response_length": [float(sum(t.loss_mask)) for t in trajs],
        "total_length": [float(len(t.response_ids)) for t in trajs],
        "truncated": [float(t.truncated) for t in trajs],
        "advantage": (batch.advantages if batch.advantages.dim() == 1 else batch.advantages[:, 0]).tolist(),
    }
    if any("tool_cost" in t.components for t in trajs):  # the env charges tool calls (same on every rank)
        rows["tool_cost"] = [float(t.components.get("tool_cost", 0.0) or 0.0) for t in trajs]
    gathered = gather_lists(rows)
    out: dict[str, float] = {"num_trajectories": float(len(gathered["reward"]))}
    for key, values in gathered.items():
        v = np.asarray(values, dtype=np.float64)
        if v.size == 0:
            continue
        out[f"{key}_mean"] = float(v.mean())
        if key in ("reward", "advantage", "response_length", "total_length"):
            out[f"{key}_std"] = float(v.std())
        if key in ("response_length", "total_length"):
            out[f"{key}_max"] = float(v.max())
    out["accuracy"] = out.pop("correct_mean", 0.0)
    out["truncation_rate"] = out.pop("truncated_mean", 0.0)
    return out


def record_advantages(trajs: Sequence[Any], advantages: torch.Tensor, mask: torch.Tensor) -> None:
    """Write each trajectory's advantage into it, for the saved trajectories and the viewer:
    the sequence value, or with per-token advantages (ARPO hard attribution) their mean over the
    tokens the trajectory trains (None when it trains none)."""
    for i, t in enumerate(trajs):
        if advantages.dim() == 1:
            t.advantage = float(advantages[i])
        else:
            n = float(mask[i].sum())
            t.advantage = float((advantages[i] * mask[i]).sum()) / n if n else None


class MinibatchMetrics:
    """`loss_and_metrics`' metrics of one mini-batch's micro-batches: summed (the denominators are
    the mini-batch's, so sums are the mini-batch values), IS-ratio extremes combined."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.low = torch.tensor(math.inf, dtype=torch.float64)
        self.high = torch.tensor(-math.inf, dtype=torch.float64)

    def add(self, metrics: dict[str, torch.Tensor]) -> None:
        for key, value in metrics.items():
            if key == "is_ratio/min":
                self.low = torch.minimum(self.low, value)
            elif key == "is_ratio/max":
                self.high = torch.maximum(self.high, value)
            else:
                self.sums[key] = self.sums.get(key, 0.0) + value.detach().double().cpu()

    def reduce(self, ranks: Ranks, grad_norm: Any = None) -> dict[str, float]:
        """The mini-batch's metrics over every rank (collective), with its gradient norm."""
        keys = sorted(self.sums)
        out: dict[str, float] = {}
        if keys:
            summed = ranks.sum(torch.stack([torch.as_tensor(self.sums[k]) for k in keys]))
            out = {k: float(v) for k, v in zip(keys, summed, strict=True)}
        low, high = ranks.min_max(self.low, self.high)
        if math.isfinite(float(low)):
            out["is_ratio/min"], out["is_ratio/max"] = float(low), float(high)
        if grad_norm is not None:
            out["grad_norm"] = float(grad_norm)
        return out


class StepMetrics:
    """The mini-batch metrics of a step's optimizer steps: means, and IS-ratio statistics over
    every trained token of the step (not a mean of per-batch means)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.updates = 0

    def add(self, part: dict[str, float]) -> None:
        for k, v in part.items():
            if k == "is_ratio/min":
                self.sums[k] = min(self.sums.get(k, math.inf), v)
            elif k == "is_ratio/max":
                self.sums[k] = max(self.sums.get(k, -math.inf), v)
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v
        self.updates += 1

    def is_ratio(self) -> dict[str, float]:
        """`is_ratio/{min,mean,max}` (taking the raw statistics out of the sums)."""
        sums = self.sums
        total, tokens = sums.pop("is_ratio/sum", 0.0), sums.pop("is_ratio/tokens", 0.0)
        low, high = sums.pop("is_ratio/min", None), sums.pop("is_ratio/max", None)
        if not tokens or low is None or high is None:
            return {}
        return {"is_ratio/min": low, "is_ratio/mean": total / tokens, "is_ratio/max": high}

    def means(self) -> dict[str, float]:
        """Every other metric, averaged over the step's optimizer steps."""
        return {k: v / max(1, self.updates) for k, v in self.sums.items()}


__all__ = ["MinibatchMetrics", "StepMetrics", "record_advantages", "rollout_metrics"]
