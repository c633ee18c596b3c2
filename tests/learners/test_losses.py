"""Policy loss, aggregation, KL and overlong shaping against hand-computed values (docs/algorithms.md §2,
§4.4, §7.4, §9)."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.core.logprobs import token_logprobs
from algorithms.core.losses import (
    AGG_MODES,
    aggregate,
    kl_penalty,
    local_denominators,
    overlong_penalty,
    policy_loss,
)


def one_token(ratio: float, adv: float, **kw) -> tuple[float, float, dict]:
    """Loss value and d loss / d log π for a single valid token at a given ratio."""
    lp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    loss, metrics = policy_loss(
        lp, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([adv]), torch.ones(1, 1), **kw
    )
    loss.backward()
    return loss.item(), lp.grad.item(), {k: v.item() for k, v in metrics.items()}


@pytest.mark.parametrize(
    ("ratio", "adv", "kw", "value", "grad", "clipped"),
    [
        # inside the trust region: ℓ = −A·r, ∂ℓ/∂log π = −A·r
        (1.1, 1.0, {}, -1.1, -1.1, 0.0),
        # A > 0 above 1 + ε_high = 1.2: clipped to −1.2, no gradient
        (1.25, 1.0, {}, -1.2, 0.0, 1.0),
        # clip-higher (ε_high 0.28): the same token is still inside, gradient −1.25
        (1.25, 1.0, {"clip_high": 0.28}, -1.25, -1.25, 0.0),
        # ... while the lower side is unchanged by ε_high: A < 0 below 1 − 0.2 → value 0.8, no gradient
        (0.75, -1.0, {"clip_high": 0.28}, 0.8, 0.0, 1.0),
        # asymmetric low bound ε_low = 0.3: r = 0.75 is now inside
        (0.75, -1.0, {"clip_low": 0.3}, 0.75, 0.75, 0.0),
        # A < 0 above the upper bound: the unclipped branch wins (max), gradient −A·r
        (1.5, -1.0, {}, 1.5, 1.5, 0.0),
        # dual clip c = 3: A = −1, r = 4 → min(4, 3) = 3, gradient 0 (docs/algorithms.md §9.2)
        (4.0, -1.0, {"dual_clip": 3.0}, 3.0, 0.0, 0.0),
        # dual clip does nothing below c, or for A > 0
        (2.5, -1.0, {"dual_clip": 3.0}, 2.5, 2.5, 0.0),
        (4.0, 1.0, {"dual_clip": 3.0}, -1.2, 0.0, 1.0),
        # AEPO §7.4 golden: A = 1, ε_h = 0.2, r = 1.5 → value −1.2; gradient −1.2 (vs 0 for PPO)
        (1.5, 1.0, {"upper_clip": "grad_preserve"}, -1.2, -1.2, 1.0),
        (1.5, 1.0, {"upper_clip": "hard"}, -1.2, 0.0, 1.0),
        # grad-preserve leaves the lower side alone: A < 0, r < 0.8 → constant 0.8
        (0.5, -1.0, {"upper_clip": "grad_preserve"}, 0.8, 0.0, 1.0),
    ],
)
def test_single_token_table(ratio, adv, kw, value, grad, clipped):
    v, g, metrics = one_token(ratio, adv, **kw)
    assert v == pytest.approx(value, abs=1e-9)
    assert g == pytest.approx(grad, abs=1e-9)
    assert metrics["pg_clipfrac"] == clipped


def test_dual_clip_metric():
    *_, metrics = one_token(4.0, -1.0, dual_clip=3.0)
    assert metrics["pg_clipfrac_lower"] == 1.0
    *_, metrics = one_token(2.0, -1.0, dual_clip=3.0)
    assert metrics["pg_clipfrac_lower"] == 0.0


def test_log_ratio_clamped_to_20():
    lp = torch.tensor([[100.0]], requires_grad=True)
    loss, _ = policy_loss(lp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-5)
    assert torch.isfinite(loss)


# ---- aggregation modes on a hand-built batch ---------------------------------------------------
# r ≡ 1, so ℓ = −A per token. Row 0: three model tokens and one tool token; row 1: one model token;
# row 2: only tool tokens. Tool positions carry absurd advantages and log-probs: they must not count.
ADV = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0], [99.0, 99.0, 99.0, 99.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
EXPECTED = {
    "token-mean": -(1 + 2 + 3 + 4) / 4,  # N_tok = 4
    "seq-mean-token-sum": -(6 + 4) / 2,  # B_S = 2 (row 2 has no trainable token)
    "seq-mean-token-mean": -(6 / 3 + 4 / 1) / 2,
    "seq-mean-token-sum-norm": -(6 + 4) / (2 * 4),  # L_const = 4
}


@pytest.mark.parametrize("agg", AGG_MODES)
def test_aggregation_modes_and_masked_tool_tokens(agg):
    old = torch.where(
        MASK.bool(), torch.full_like(ADV, -1.0), torch.zeros_like(ADV)
    )  # placeholder 0 off-mask
    logprobs = torch.where(MASK.bool(), torch.full_like(ADV, -1.0), torch.full_like(ADV, -60.0))
    logprobs.requires_grad_(True)
    loss, metrics = policy_loss(logprobs, old, ADV, MASK, agg=agg, max_len=4)
    assert loss.item() == pytest.approx(EXPECTED[agg])
    loss.backward()
    assert torch.all(logprobs.grad[~MASK.bool()] == 0)
    assert torch.all(logprobs.grad[MASK.bool()] != 0)
    assert metrics["ppo_kl"].item() == 0.0  # tool positions (log-ratio 60 → clamped 20) excluded


def test_sum_norm_needs_constant():
    with pytest.raises(ValueError, match="max_len"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "sum")


def test_per_token_and_per_sequence_advantages_agree():
    lp = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    old = lp + 0.1 * torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
    adv = torch.tensor([0.5, -1.0, 2.0])
    mask = torch.ones(3, 5)
    a, _ = policy_loss(lp, old, adv, mask, dual_clip=3.0)
    b, _ = policy_loss(lp, old, adv[:, None].expand(3, 5), mask, dual_clip=3.0)
    assert torch.allclose(a, b)


def _grads(agg: str, parts: list[list[int]] | None, world: int = 1) -> torch.Tensor:
    """Gradient of the policy loss on a toy linear policy, whole batch (parts=None) or split.

    parts: index lists, one per (rank, micro-batch), rank-major; each rank's gradient is the sum
    over its micro-batches of ∇(loss_mb · W); the ranks' gradients are then averaged, as DDP does.
    """
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(8, 6, 4, generator=g)
    old = torch.randn(8, 6, generator=g) * 0.1 - 1.0
    adv = torch.randn(8, generator=g)
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4, 1])
    mask = (torch.arange(6)[None] < lengths[:, None]).float()
    mask[2, 1] = 0  # a tool token in the middle
    mask[7] = 0  # a sequence with no trainable token
    w = torch.nn.Parameter(torch.randn(4, generator=g) * 0.3)

    def lp(idx):
        return (feats[idx] @ w) * 0.5 - 1.0

    kw = {"agg": agg, "max_len": 6, "clip_high": 0.28, "dual_clip": 3.0}
    if parts is None:
        loss, _ = policy_loss(lp(slice(None)), old, adv, mask, **kw)
        return torch.autograd.grad(loss, w)[0]
    n_tok, n_seq = local_denominators(mask)  # = the all-reduced sum of the ranks' local counts
    per_rank = len(parts) // world
    total = torch.zeros_like(w)
    for r in range(world):
        rank_grad = torch.zeros_like(w)
        for idx in parts[r * per_rank : (r + 1) * per_rank]:
            loss, _ = policy_loss(
                lp(idx), old[idx], adv[idx], mask[idx], num_tokens=n_tok, num_seqs=n_seq, **kw
            )
            rank_grad += torch.autograd.grad(loss * world, w)[0]
        total += rank_grad / world
    return total


@pytest.mark.parametrize("agg", AGG_MODES)
def test_world_size_times_accumulation_equals_whole_batch(agg):
    full = _grads(agg, None)
    # W = 2 ranks × GA = 2 micro-batches, uneven sizes and uneven token counts
    split = _grads(agg, [[0, 1, 2], [3], [4, 5], [6, 7]], world=2)
    assert torch.allclose(full, split, atol=1e-6), (full, split)
    assert torch.allclose(full, _grads(agg, [[i] for i in range(8)], world=4), atol=1e-6)


def test_mean_of_micro_batch_means_differs():
    """The classic pitfall (docs/algorithms.md D21) is visible on this batch, so the equality above is not
    vacuous."""
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(4, 5, generator=g, requires_grad=True)
    adv, mask = torch.randn(4, generator=g), (torch.rand(4, 5, generator=g) > 0.3).float()
    whole, _ = policy_loss(lp, lp.detach() + 0.05, adv, mask)
    micro = (
        sum(
            policy_loss(lp[i : i + 2], lp.detach()[i : i + 2] + 0.05, adv[i : i + 2], mask[i : i + 2])[0]
            for i in (0, 2)
        )
        / 2
    )
    assert not torch.allclose(whole, micro)


def test_metrics_are_additive_over_micro_batches():
    g = torch.Generator().manual_seed(3)
    lp, old = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    adv, mask = torch.randn(6, generator=g), (torch.rand(6, 4, generator=g) > 0.4).float()
    _, whole = policy_loss(lp, old, adv, mask, dual_clip=3.0)
    n_tok, _ = local_denominators(mask)
    parts = [
        policy_loss(
            lp[i : i + 3], old[i : i + 3], adv[i : i + 3], mask[i : i + 3], dual_clip=3.0, num_tokens=n_tok
        )[1]
        for i in (0, 3)
    ]
    for key in whole:
        assert torch.allclose(whole[key], parts[0][key] + parts[1][key]), key


def test_is_weights_scale_tokens():
    lp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = policy_loss(
        lp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), is_weights=torch.tensor([[2.0, 0.5]])
    )
    assert loss.item() == pytest.approx(-(2.0 + 0.5) / 2)


# ---- KL estimators (§2.7, §9.6) -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "values"),
    [
        ("k1", [-1.0, 0.0, 0.5]),
        ("kl", [-1.0, 0.0, 0.5]),
        ("abs", [1.0, 0.0, 0.5]),
        ("k2", [0.5, 0.0, 0.125]),
        ("mse", [0.5, 0.0, 0.125]),
        ("k3", [math.e - 2.0, 0.0, math.exp(-0.5) - 0.5]),
        ("low_var_kl", [math.e - 2.0, 0.0, math.exp(-0.5) - 0.5]),
    ],
)
def test_kl_hand_values(kind, values):
    delta = torch.tensor([-1.0, 0.0, 0.5], dtype=torch.float64)
    assert torch.allclose(
        kl_penalty(delta, torch.zeros(3, dtype=torch.float64), kind),
        torch.tensor(values, dtype=torch.float64),
    )


def test_low_var_kl_clamps_at_extremes_and_k3_does_not():
    delta = torch.tensor([-50.0, 50.0], dtype=torch.float64)
    zero = torch.zeros(2, dtype=torch.float64)
    assert kl_penalty(delta, zero, "low_var_kl").tolist() == [10.0, 10.0]
    k3 = kl_penalty(delta, zero, "k3")
    assert k3[0] == pytest.approx(math.exp(50) - 51) and k3[1] == pytest.approx(49.0)


def test_straight_through_kl():
    delta = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
    value = kl_penalty(delta, torch.zeros(1, dtype=torch.float64), "k3+")
    value.backward()
    assert value.item() == pytest.approx(math.exp(-0.5) - 0.5)
    assert delta.grad.item() == pytest.approx(0.5)  # gradient of ½Δ²


# ---- DAPO overlong shaping (§4.4, §9.7) -------------------------------------------------------------
def test_overlong_golden_values():
    pen = overlong_penalty(torch.tensor([100, 16384, 18432, 20480, 30000]), max_len=20480, cache_len=4096)
    assert pen.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    half = overlong_penalty(torch.tensor([18432]), max_len=20480, cache_len=4096, penalty_factor=0.5)
    assert half.tolist() == [-0.25]
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(torch.tensor([1]), max_len=10, cache_len=0)


# ---- log-probs and entropy from logits (§2.8) ---------------------------------------------------------
def test_token_logprobs_temperature_and_entropy_chunked():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 11, (2, 5), generator=g)
    lp, ent = token_logprobs(logits, targets, temperature=0.7, with_entropy=True, chunk=3)
    ref = torch.log_softmax(logits / 0.7, -1)
    assert torch.allclose(lp, ref.gather(-1, targets[..., None]).squeeze(-1).float(), atol=1e-6)
    assert torch.allclose(ent, -(ref.exp() * ref).sum(-1).float(), atol=1e-5)
    assert not ent.requires_grad
