"""GRPO / Dr. GRPO / batch-std / RLOO advantages against values worked out by hand (docs/algorithms.md §3.2,
§5)."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.core.advantages import constant_groups, grpo_advantages, rloo_advantages


def test_golden_group_of_four():
    # μ = 0.5, unbiased σ = sqrt(1/3) = 0.57735 → ±0.5/0.57735 = ±0.8660
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), [3, 3, 3, 3])
    assert torch.allclose(adv, torch.tensor([0.8660, -0.8660, -0.8660, 0.8660]), atol=1e-4)


def test_groups_by_id_not_by_position():
    # ids 5: rewards [1, 3] (μ 2, σ √2); ids 9: rewards [2, 6] (μ 4, σ √8); interleaved order
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0])
    ids = torch.tensor([5, 9, 5, 9])
    expected = torch.tensor([-1 / math.sqrt(2), -2 / math.sqrt(8), 1 / math.sqrt(2), 2 / math.sqrt(8)])
    assert torch.allclose(grpo_advantages(rewards, ids, eps=0.0), expected, atol=1e-6)
    # Dr. GRPO: centred only
    assert torch.allclose(
        grpo_advantages(rewards, ids, normalize_std=False), torch.tensor([-1.0, -2.0, 1.0, 2.0])
    )
    assert torch.equal(
        grpo_advantages(rewards, ids, scale_rewards="none"),
        grpo_advantages(rewards, ids, normalize_std=False),
    )
    # batch std: unbiased std of [1, 2, 3, 6] = sqrt(14/3)
    batch = grpo_advantages(rewards, ids, scale_rewards="batch", eps=0.0)
    assert torch.allclose(batch, torch.tensor([-1.0, -2.0, 1.0, 2.0]) / math.sqrt(14 / 3), atol=1e-6)


def test_constant_group_is_exactly_zero():
    # 0.1 is not exact in binary: a naive (r - mean) / (std + eps) leaves residue / 1e-6
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0])
    adv = grpo_advantages(rewards, [0, 0, 0, 1, 1])
    assert torch.equal(adv[:3], torch.zeros(3))
    assert adv[3] > 0 > adv[4]


def test_lone_sample_gets_zero_and_a_warning():
    with pytest.warns(UserWarning, match="single trajectory"):
        adv = grpo_advantages(torch.tensor([5.0, 1.0, 0.0]), [0, 1, 1])
    assert adv[0] == 0.0  # verl would give the raw score 5 (docs/algorithms.md D30)
    assert adv[1] > 0 > adv[2]


def test_rloo_leave_one_out():
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), [0, 0, 0, 0])
    assert torch.allclose(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


def test_constant_groups_marks_what_dapo_drops():
    flags = constant_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]), [0, 0, 1, 1, 2])
    assert flags.tolist() == [True, True, False, False, True]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="one id per reward"):
        grpo_advantages(torch.tensor([1.0, 0.0]), [0])
    with pytest.raises(ValueError, match="scale_rewards"):
        grpo_advantages(torch.tensor([1.0, 0.0]), [0, 0], scale_rewards="global")
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(torch.ones(2, 2), [0, 0])
