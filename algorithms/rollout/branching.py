"""Branch rules of entropy-guided tree rollouts: when to fork a path, and how to split the budget.

ARPO (spec §6.5): after a tool result, fork with probability P = clip(α + β·ΔH, 0, 1), where ΔH
is the entropy of the model's reaction to that result minus the path's initial entropy.
AEPO (spec §7.3) multiplies by a consecutive-branch penalty max(0, 1 − γ·l), with l counted per
path lineage; AEPO's pre-monitoring (spec §7.2) sets the number of initial (global) samples
m = clamp(⌊M·σ(β_pm·(H_root − H̄_tool))⌋ + 1, 1, M).

    >>> rule = BranchRule(probability=0.5, entropy_weight=0.2)
    >>> branch_probability(1.0, rule), branch_probability(0.0, rule), branch_probability(-2.5, rule)
    (0.7, 0.5, 0.0)
    >>> premonitor_global_samples(h_root=2.0, h_tool=0.0, budget=16)
    12

`rule="reference"` reproduces the public code's realisations exactly (ARPO: fork iff
clip(u − β·ΔH, 0, 1) ≤ τ; AEPO: fork iff clip((u + β·ΔH)·(1 − γ·l), 0, 1) ≥ τ with a per-prompt l).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class BranchRule:
    """Settings of one branch decision.

    probability: α, the base branch probability (`branch_probability`; paper/reference 0.5).
    threshold: τ. In `mode="sample"` the reference uses one key for α and τ, so None means τ = α;
        in `mode="threshold"` the paper's literal test α + β·ΔH > τ uses it separately.
    entropy_weight: β_br, sensitivity to ΔH (0.2).
    consecutive_penalty: γ per consecutive branching (AEPO 0.05; 0 = ARPO, no penalty).
    mode: `sample` (fork iff u < P, u ~ U(0,1)) or `threshold` (deterministic).
    rule: `ours` (one explicit formula; penalty counted per path) or `reference` (the public
        code's realisation, AEPO's per-prompt counter included).
    """

    probability: float = 0.5
    threshold: float | None = None
    entropy_weight: float = 0.2
    consecutive_penalty: float = 0.0
    mode: Literal["sample", "threshold"] = "sample"
    rule: Literal["ours", "reference"] = "ours"

    def __post_init__(self) -> None:
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"branch_probability must be in [0, 1], got {self.probability}")
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"branch_threshold must be in [0, 1] or null, got {self.threshold}")
        if self.consecutive_penalty < 0:
            raise ValueError(f"consecutive_penalty must be ≥ 0, got {self.consecutive_penalty}")
        if self.mode not in ("sample", "threshold"):
            raise ValueError(f"branch_mode must be 'sample' or 'threshold', got {self.mode!r}")
        if self.rule not in ("ours", "reference"):
            raise ValueError(f"branch_rule must be 'ours' or 'reference', got {self.rule!r}")

    @property
    def tau(self) -> float:
        return self.probability if self.threshold is None else self.threshold


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))


def penalty_factor(consecutive: int, gamma: float) -> float:
    """max(0, 1 − γ·l): the AEPO consecutive-branch factor."""
    return max(0.0, 1.0 - gamma * consecutive)


def branch_probability(delta_h: float, rule: BranchRule, consecutive: int = 0) -> float:
    """Probability that one candidate fork is created at a branch point.

    `consecutive` is l: the path's consecutive branchings (`ours`) or the prompt's counter
    (`reference`). In `threshold` mode the result is 0 or 1.
    """
    beta_dh = rule.entropy_weight * delta_h
    f = penalty_factor(consecutive, rule.consecutive_penalty)
    if rule.mode == "threshold":
        return 1.0 if (rule.probability + beta_dh) * f > rule.tau else 0.0
    if rule.rule == "reference" and rule.consecutive_penalty > 0:
        # AEPO code: s = clip((u + βΔH)·f, 0, 1) ≥ τ  ⇔  u ≥ τ/f − βΔH
        return 0.0 if f <= 0.0 else _clip01(1.0 - rule.tau / f + beta_dh)
    if rule.rule == "reference":
        # ARPO code: clip(u − βΔH, 0, 1) ≤ τ  ⇔  u ≤ τ + βΔH
        return _clip01(rule.tau + beta_dh)
    return _clip01((rule.probability + beta_dh) * f)


def decide_branch(rng: random.Random, delta_h: float, rule: BranchRule, consecutive: int = 0) -> bool:
    """Draw one branch decision. Consumes exactly one uniform draw in every mode.

    `ours` forks iff u < P. `reference` evaluates the public code's expression on the same u,
    so a seeded run follows the reference's decisions one-to-one.
    """
    u = rng.random()
    if rule.mode == "threshold":
        return branch_probability(delta_h, rule, consecutive) >= 1.0
    beta_dh = rule.entropy_weight * delta_h
    if rule.rule == "reference" and rule.consecutive_penalty > 0:
        f = penalty_factor(consecutive, rule.consecutive_penalty)
        return _clip01((u + beta_dh) * f) >= rule.tau
    if rule.rule == "reference":
        return _clip01(u - beta_dh) <= rule.tau
    return u < branch_probability(delta_h, rule, consecutive)


def premonitor_global_samples(h_root: float, h_tool: float, budget: int, beta: float = 0.5) -> int:
    """AEPO pre-monitoring: number m of global (initial) samples out of the budget M (spec §7.2).

    m = clamp(⌊M·σ(β_pm·(H_root − H̄_tool))⌋ + 1, 1, M), the "+1" as in the public code.
    """
    if budget < 1:
        raise ValueError(f"the rollout budget M must be ≥ 1, got {budget}")
    x = beta * (h_root - h_tool)
    sig = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
    return min(budget, max(1, math.floor(budget * sig) + 1))


__all__ = ["BranchRule", "branch_probability", "decide_branch", "penalty_factor", "premonitor_global_samples"]
