"""Entropy-balanced clipping (AEPO §7.4): autograd against the hand-derived gradient."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.core.losses import policy_loss

EPS_L, EPS_H, C = 0.2, 0.2, 3.0


def hand_gradient(r: float, a: float, upper_clip: str) -> float:
    """∂ℓ/∂log π_θ of one token, from the case table of docs/algorithms.md §7.4 (∂r/∂log π = r)."""
    if a > 0:
        if r > 1 + EPS_H:
            return -a * (1 + EPS_H) if upper_clip == "grad_preserve" else 0.0
        return -a * r  # r ≤ 1+ε_h, including r < 1−ε_l: the unclipped branch is the max
    if r > C:
        return 0.0  # dual clip: constant −c·A
    if r < 1 - EPS_L:
        return 0.0  # lower clip: constant −A·(1−ε_l)
    return -a * r


def hand_value(r: float, a: float) -> float:
    value = max(-a * r, -a * min(max(r, 1 - EPS_L), 1 + EPS_H))
    return min(value, -C * a) if a < 0 else value


@pytest.mark.parametrize("upper_clip", ["grad_preserve", "hard"])
def test_autograd_matches_hand_derived_gradient(upper_clip):
    # ratios chosen in every region of the case table, for both signs of A
    ratios = [0.5, 0.9, 1.1, 1.5, 2.5, 3.5, 0.7, 1.25]
    advs = [1.0, -1.0]
    old = torch.zeros(len(advs), len(ratios), dtype=torch.float64)
    logp = torch.tensor([[math.log(r) for r in ratios]] * len(advs), dtype=torch.float64, requires_grad=True)
    mask = torch.ones_like(old)
    mask[1, -1] = 0  # a masked token gets no gradient and does not count in N_tok
    adv = torch.tensor(advs, dtype=torch.float64)
    loss, _ = policy_loss(
        logp, old, adv, mask, clip_low=EPS_L, clip_high=EPS_H, dual_clip=C, upper_clip=upper_clip
    )
    loss.backward()
    n_tok = float(mask.sum())
    for i, a in enumerate(advs):
        for j, r in enumerate(ratios):
            want = hand_gradient(r, a, upper_clip) * float(mask[i, j]) / n_tok
            assert float(logp.grad[i, j]) == pytest.approx(want, abs=1e-12), (a, r)
    value = sum(
        hand_value(r, a) * float(mask[i, j]) for i, a in enumerate(advs) for j, r in enumerate(ratios)
    )
    assert float(loss.detach()) == pytest.approx(value / n_tok)


def test_golden_single_token():
    # docs/algorithms.md §7.4: A = 1, ε_h = 0.2, r = 1.5 → value −1.2; gradient −1.2 (AEPO) vs 0 (PPO)
    for mode, grad in (("grad_preserve", -1.2), ("hard", 0.0)):
        lp = torch.tensor([[math.log(1.5)]], requires_grad=True)
        loss, _ = policy_loss(lp, torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), upper_clip=mode)
        loss.backward()
        assert float(loss.detach()) == pytest.approx(-1.2) and float(lp.grad) == pytest.approx(grad)


def test_per_token_advantages_flow_through():
    leaf = torch.log(torch.tensor([[1.5, 1.5]])).requires_grad_()
    adv = torch.tensor([[1.0, 2.0]])
    loss, _ = policy_loss(leaf, torch.zeros(1, 2), adv, torch.ones(1, 2), upper_clip="grad_preserve")
    loss.backward()
    assert leaf.grad.tolist()[0] == pytest.approx([-1.2 / 2, -2.4 / 2])


def test_one_switch_policy_loss(tmp_path):
    """The gradient-preserving clip has one switch, `policy_loss`: AEPO's default turns it on,
    any learner can, and AEPO's former switch is an unknown key."""
    from agent_envs.base.config import build_config
    from algorithms.aepo import AEPOConfig
    from algorithms.core.learner_config import LearnerConfig
    from algorithms.core.losses import LossConfig

    assert LossConfig.of(AEPOConfig()).policy_loss == "ppo_clip_gradpreserve"
    assert LossConfig.of(AEPOConfig(policy_loss="ppo_clip")).policy_loss == "ppo_clip"
    assert LossConfig.of(LearnerConfig()).policy_loss == "ppo_clip"
    assert LossConfig.of(LearnerConfig(policy_loss="ppo_clip_gradpreserve")).policy_loss == "ppo_clip_gradpreserve"
    preset = tmp_path / "aepo_old.yaml"
    preset.write_text("algo: aepo\nenable_entropy_balanced_clipping: false\n")
    for path, overrides in ((preset, []), (None, ["enable_entropy_balanced_clipping=true"])):
        with pytest.raises(ValueError) as err:
            build_config(AEPOConfig, path, overrides)
        message = str(err.value)
        assert "unknown config key 'enable_entropy_balanced_clipping'" in message and "\n" not in message, message
