"""Branch rules of entropy-guided tree rollouts: when to fork a branch, and how to split the budget.

ARPO (docs/algorithms.md §6.5): after a tool result, fork with probability P = clip(α + β·ΔH, 0, 1), where ΔH
is the entropy of the model's reaction to that result minus the branch's initial entropy.
AEPO (docs/algorithms.md §7.3) multiplies by a consecutive-branch penalty max(0, 1 − γ·l), with l counted per
branch lineage; AEPO's pre-monitoring (docs/algorithms.md §7.2) sets the number of initial (global) samples
m = clamp(⌊M·σ(β_pm·(H_root − H̄_tool))⌋ + 1, 1, M).

    >>> rule = TreeConfig(branch_probability=0.5, entropy_weight=0.2)
    >>> branch_probability(1.0, rule), branch_probability(0.0, rule), branch_probability(-2.5, rule)
    (0.7, 0.5, 0.0)
    >>> premonitor_global_samples(h_root=2.0, h_tool=0.0, budget=16)
    12

`entropy_formula="reference"` reproduces the public code's realisations exactly (ARPO: fork iff
clip(u − β·ΔH, 0, 1) ≤ τ; AEPO: fork iff clip((u + β·ΔH)·(1 − γ·l), 0, 1) ≥ τ with a per-prompt l).
"""

from __future__ import annotations

import math
import random

from algorithms.rollout.tree_config import TreeConfig


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))


def penalty_factor(consecutive: int, gamma: float) -> float:
    """max(0, 1 − γ·l): the AEPO consecutive-branch factor."""
    return max(0.0, 1.0 - gamma * consecutive)


def branch_probability(delta_h: float, rule: TreeConfig, consecutive: int = 0) -> float:
    """Probability that one candidate fork is created at a branch point.

    `consecutive` is l: the branch's consecutive branchings (`ours`) or the prompt's counter
    (`reference`). In `threshold` mode the result is 0 or 1.
    """
    beta_dh = rule.entropy_weight * delta_h
    f = penalty_factor(consecutive, rule.penalty)
    if rule.branch_mode == "threshold":
        return 1.0 if (rule.branch_probability + beta_dh) * f > rule.tau else 0.0
    if rule.entropy_formula == "reference" and rule.penalty > 0:
        # AEPO code: s = clip((u + βΔH)·f, 0, 1) ≥ τ  ⇔  u ≥ τ/f − βΔH
        return 0.0 if f <= 0.0 else _clip01(1.0 - rule.tau / f + beta_dh)
    if rule.entropy_formula == "reference":
        # ARPO code: clip(u − βΔH, 0, 1) ≤ τ  ⇔  u ≤ τ + βΔH
        return _clip01(rule.tau + beta_dh)
    return _clip01((rule.branch_probability + beta_dh) * f)


def decide_branch(rng: random.Random, delta_h: float, rule: TreeConfig, consecutive: int = 0) -> bool:
    """Draw one branch decision. Consumes exactly one uniform draw in every mode.

    `ours` forks iff u < P. `reference` evaluates the public code's expression on the same u,
    so a seeded run follows the reference's decisions one-to-one.
    """
    u = rng.random()
    if rule.branch_mode == "threshold":
        return branch_probability(delta_h, rule, consecutive) >= 1.0
    beta_dh = rule.entropy_weight * delta_h
    if rule.entropy_formula == "reference" and rule.penalty > 0:
        f = penalty_factor(consecutive, rule.penalty)
        return _clip01((u + beta_dh) * f) >= rule.tau
    if rule.entropy_formula == "reference":
        return _clip01(u - beta_dh) <= rule.tau
    return u < branch_probability(delta_h, rule, consecutive)


def premonitor_global_samples(h_root: float, h_tool: float, budget: int, beta: float = 0.5) -> int:
    """AEPO pre-monitoring: number m of global (initial) samples out of the budget M
    (docs/algorithms.md §7.2).

    m = clamp(⌊M·σ(β_pm·(H_root − H̄_tool))⌋ + 1, 1, M), the "+1" as in the public code.
    """
    if budget < 1:
        raise ValueError(f"the rollout budget M must be ≥ 1, got {budget}")
    x = beta * (h_root - h_tool)
    sig = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
    return min(budget, max(1, math.floor(budget * sig) + 1))


__all__ = ["branch_probability", "decide_branch", "penalty_factor", "premonitor_global_samples"]
