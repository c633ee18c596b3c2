"""Hard attribution on a hand-built tree (§6.7) and the entropy-aware advantage (§7.5)."""

from __future__ import annotations

import pytest
import torch

from algorithms.aepo import entropy_aware_advantages, entropy_moments, entropy_stats, stats_from_moments
from algorithms.arpo import hard_attribution


def hand_tree():
    # 0: root (len 10); 1: fork of 0 at 4; 2: fork of 1 at 7; 3: fork of 0 at 4; 4: independent top-up
    keys = ["r", "f1", "f2", "f3", "t"]
    parents = [None, "r", "f1", "r", None]
    offsets = [0, 4, 7, 4, 0]
    lengths = [10, 9, 10, 6, 8]
    mask = torch.zeros(5, 10)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    mask[:4, 2] = 0  # a tool-result token inside the shared prefix (copied into every fork)
    adv = torch.tensor([1.0, -1.0, 2.0, 0.5, -3.0])
    return keys, parents, offsets, mask, adv


def test_hard_attribution_on_hand_built_tree():
    keys, parents, offsets, mask, adv = hand_tree()
    out, m = hard_attribution(adv, keys=keys, parents=parents, offsets=offsets, mask=mask)
    shared4 = (1.0 - 1.0 + 2.0 + 0.5) / 4  # positions 0..3 shared by r, f1, f2, f3
    shared2 = (-1.0 + 2.0) / 2  # positions 4..6 shared by f1, f2
    expected = torch.tensor(
        [
            [shared4] * 4 + [1.0] * 6,
            [shared4] * 4 + [shared2] * 3 + [-1.0] * 3,
            [shared4] * 4 + [shared2] * 3 + [2.0] * 3,
            [shared4] * 4 + [0.5] * 6,
            [-3.0] * 10,
        ]
    )
    assert torch.allclose(out, expected)
    # shared tokens count once: the lowest-index copy keeps the mask
    assert m[0, :4].tolist() == [1, 1, 0, 1]
    assert m[1:4, :4].sum() == 0
    assert m[1, 4:7].tolist() == [1, 1, 1] and m[2, 4:7].sum() == 0
    assert m[2, 7:].sum() == 3 and m[3, 4:6].sum() == 2 and m[3, 6:].sum() == 0
    # N_tok: every token node once = root 9 (one tool token) + f1 own 5 + f2 own 3 + f3 own 2 + top-up 8
    assert int(m.sum()) == 9 + 5 + 3 + 2 + 8
    # the loss numerator Σ m·A over the tree equals Σ over nodes of A_node
    assert float((m * out).sum()) == pytest.approx(
        3 * shared4 + 6 * 1.0 + 3 * shared2 + 2 * -1.0 + 3 * 2.0 + 2 * 0.5 + 8 * -3.0
    )


def test_hard_no_dedupe_keeps_every_copy():
    keys, parents, offsets, mask, adv = hand_tree()
    out, m = hard_attribution(adv, keys=keys, parents=parents, offsets=offsets, mask=mask, dedupe=False)
    assert torch.equal(m, mask)
    assert out[3, 0] == out[0, 0]


def test_independent_equal_tokens_are_not_shared():
    adv = torch.tensor([1.0, -1.0])
    out, m = hard_attribution(adv, keys=[0, 1], parents=[None, None], offsets=[0, 0], mask=torch.ones(2, 3))
    assert out[:, 0].tolist() == [1.0, -1.0] and m.sum() == 6


def test_missing_parent_is_a_clear_error():
    with pytest.raises(ValueError, match="not in the batch"):
        hard_attribution(torch.zeros(1), keys=["a"], parents=["gone"], offsets=[1], mask=torch.ones(1, 3))


def test_entropy_aware_advantage_hand_values():
    h = torch.tensor([[1.0, 2.0, 3.0, 50.0], [2.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    mean, std = entropy_stats(h, mask)
    assert mean == pytest.approx(2.0)
    assert std == pytest.approx((2 / 4) ** 0.5)  # unbiased over the 5 valid tokens
    out = entropy_aware_advantages(torch.tensor([1.0, -2.0]), h, mask, mean=mean, std=std, alpha=0.2)
    z = (h - 2.0) / std
    assert torch.allclose(out, torch.tensor([[1.0], [-2.0]]) * (1 + 0.2 * z))


def test_entropy_stats_are_minibatch_wide_not_per_microbatch():
    torch.manual_seed(0)
    h = torch.rand(6, 5) * 3
    mask = (torch.rand(6, 5) > 0.3).int()
    whole = entropy_stats(h, mask)
    # two "ranks", each with two micro-batches: summed moments give the same statistics
    # (docs/algorithms.md D10)
    parts = [entropy_moments(h[i : i + 2], mask[i : i + 2]) for i in range(0, 6, 2)]
    assert stats_from_moments(sum(parts)) == pytest.approx(whole)
    assert entropy_stats(h[:2], mask[:2]) != pytest.approx(whole)


def test_constant_entropy_gives_unit_std_and_clamp_option():
    h = torch.full((1, 3), 0.7)
    assert entropy_stats(h, torch.ones(1, 3)) == pytest.approx((0.7, 1.0))
    h = torch.tensor([[0.0, 10.0]])
    out = entropy_aware_advantages(torch.ones(1), h, torch.ones(1, 2), mean=10.0, std=1.0, clamp_factor=True)
    assert out[0, 0] == 0.0
