"""Branch probability (docs/algorithms.md §6.5, §7.3) and pre-monitoring (§7.2): golden values and
frequencies."""

from __future__ import annotations

import math
import random

import pytest

from algorithms.rollout.branching import branch_probability, decide_branch, premonitor_global_samples
from algorithms.rollout.tree_config import TreeConfig


def rule_of(probability=0.5, threshold=None, entropy_weight=0.2, consecutive_penalty=0.0,
               mode="sample", rule="ours") -> TreeConfig:  # fmt: skip
    """The branch settings of a TreeConfig under the short names of the formulas."""
    return TreeConfig(branch_probability=probability, branch_threshold=threshold, entropy_weight=entropy_weight,
                      enable_consecutive_penalty=consecutive_penalty > 0, consecutive_penalty=consecutive_penalty,
                      branch_mode=mode, entropy_formula=rule)  # fmt: skip


ARPO = rule_of(probability=0.5, entropy_weight=0.2)


@pytest.mark.parametrize(("dh", "p"), [(1.0, 0.7), (0.0, 0.5), (-2.5, 0.0), (4.0, 1.0)])
def test_arpo_branch_probability_golden(dh, p):
    assert branch_probability(dh, ARPO) == pytest.approx(p)
    assert branch_probability(dh, rule_of(rule="reference")) == pytest.approx(p)


@pytest.mark.parametrize(("depth", "ours", "ref"), [(0, 0.5, 0.5), (2, 0.45, 1 - 0.5 / 0.9), (10, 0.25, 0.0)])
def test_consecutive_penalty_golden(depth, ours, ref):
    assert branch_probability(0.0, rule_of(consecutive_penalty=0.05), depth) == pytest.approx(ours)
    rule = rule_of(consecutive_penalty=0.05, rule="reference")
    assert branch_probability(0.0, rule, depth) == pytest.approx(ref)


def test_threshold_mode_is_deterministic():
    rule = rule_of(probability=0.5, threshold=0.5, mode="threshold")
    assert branch_probability(0.1, rule) == 1.0 and branch_probability(-0.1, rule) == 0.0
    rng = random.Random(0)
    assert all(decide_branch(rng, 0.1, rule) for _ in range(50))
    assert not any(decide_branch(rng, -0.1, rule) for _ in range(50))


@pytest.mark.parametrize(
    ("rule", "dh", "depth"),
    [
        (ARPO, 1.0, 0),
        (ARPO, -1.3, 0),
        (rule_of(rule="reference"), 0.8, 0),
        (rule_of(consecutive_penalty=0.05), 0.5, 4),
        (rule_of(consecutive_penalty=0.05, rule="reference"), 0.5, 4),
    ],
)
def test_decision_frequency_matches_probability_within_3_sigma(rule, dh, depth):
    n = 12_000
    rng = random.Random(1234)
    hits = sum(decide_branch(rng, dh, rule, depth) for _ in range(n))
    p = branch_probability(dh, rule, depth)
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(hits / n - p) <= 3 * sigma + 1e-12, (hits / n, p)


@pytest.mark.parametrize(
    ("m", "diff", "expected"), [(16, 2.0, 12), (16, -2.0, 5), (16, 0.0, 9), (12, 0.0, 7)]
)
def test_premonitor_golden(m, diff, expected):
    assert premonitor_global_samples(h_root=diff, h_tool=0.0, budget=m) == expected


def test_premonitor_is_clamped_to_budget():
    assert premonitor_global_samples(100.0, 0.0, 16) == 16
    assert premonitor_global_samples(-100.0, 0.0, 16) == 1
    with pytest.raises(ValueError, match="budget"):
        premonitor_global_samples(0.0, 0.0, 0)


def test_bad_rule_names_the_field():
    with pytest.raises(ValueError, match="branch_probability"):
        rule_of(probability=1.5)
    with pytest.raises(ValueError, match="entropy_formula"):
        rule_of(rule="paper")


@pytest.mark.parametrize("old", ["ours", "reference"])
def test_old_branch_rule_spelling_names_the_new_key(old):
    with pytest.raises(ValueError, match=f"'tree.branch_rule: {old}' is now 'tree.entropy_formula: {old}'"):
        TreeConfig(branch_rule=old)
