"""`loss_and_metrics`, the whole loss of a micro-batch, against values computed by hand from the
formulas of docs/algorithms.md: token-mean (§2.3), PPO clip with dual clip (§2.2), KL (§2.7),
entropy bonus (§2.8), truncated importance sampling (§2.9) and the global denominators (§2.4)."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.core.losses import LossConfig, LossInputs, loss_and_metrics

# Two sequences, three response positions; the second trains one token. Ratios r = π_θ/π_old:
# sequence 0 (A = +1): r = 1.1 (inside the clip), r = 1.5 (above 1 + ε = 1.2: clipped);
# sequence 1 (A = −1): r = 4 (above c = 3: the dual clip bounds ℓ at −c·A = 3).
RATIOS = [[1.1, 1.5, 1.0], [4.0, 1.0, 1.0]]
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
ADV = torch.tensor([1.0, -1.0])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -1.0]], dtype=torch.float64)


def _inputs(behaviour=None, ref=None, num_tokens=None, advantages=ADV, mask=MASK) -> LossInputs:
    n_tok = float(mask.sum()) if num_tokens is None else num_tokens
    n_seq = float((mask.sum(-1) > 0).sum())
    return LossInputs(old_logprobs=OLD, behaviour_logprobs=OLD if behaviour is None else behaviour,
                      advantages=advantages, mask=mask, num_tokens=n_tok, num_seqs=n_seq, ref_logprobs=ref)  # fmt: skip


def _logprobs() -> torch.Tensor:
    return (OLD + torch.log(torch.tensor(RATIOS, dtype=torch.float64))).requires_grad_(True)


def test_token_mean_ppo_clip_with_dual_clip():
    lp = _logprobs()
    loss, metrics = loss_and_metrics(_inputs(), lp, LossConfig(clip_ratio_c=3.0))
    # ℓ per token: −A·r = −1.1; clipped −1.2; dual-clipped min(4, 3) = 3. Token mean over N_tok = 3.
    assert loss.item() == pytest.approx((-1.1 - 1.2 + 3.0) / 3)
    assert float(metrics["pg_loss"]) == pytest.approx(loss.item())
    assert float(metrics["pg_clipfrac"]) == pytest.approx(1 / 3)  # r = 1.5
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(1 / 3)  # r = 4
    assert float(metrics["ppo_kl"]) == pytest.approx(-(math.log(1.1) + math.log(1.5) + math.log(4.0)) / 3)
    loss.backward()
    # ∂ℓ/∂log π = −A·r inside the clip, 0 on both clipped tokens and on untrained positions
    assert lp.grad.flatten().tolist() == pytest.approx([-1.1 / 3, 0.0, 0.0, 0.0, 0.0, 0.0])
    # no KL or entropy asked for: no such metrics; π_old = π_roll: every IS ratio is 1
    assert "kl" not in metrics and "entropy" not in metrics
    assert float(metrics["rollout_mismatch_kl"]) == 0.0
    assert [float(metrics[f"is_ratio/{k}"]) for k in ("sum", "tokens", "min", "max")] == [3.0, 3.0, 1.0, 1.0]


def test_without_dual_clip_the_negative_advantage_is_unbounded():
    loss, metrics = loss_and_metrics(_inputs(), _logprobs(), LossConfig(clip_ratio_c=None))
    assert loss.item() == pytest.approx((-1.1 - 1.2 + 4.0) / 3)
    assert float(metrics["pg_clipfrac_lower"]) == 0.0


def test_kl_and_entropy_terms():
    lp = _logprobs()
    delta = 0.1  # log π_θ − log π_ref on every token
    ref = lp.detach() - delta
    entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]], dtype=torch.float64, requires_grad=True)
    cfg = LossConfig(kl_coef=0.5, kl_estimator="k3", entropy_coeff=0.01)
    loss, metrics = loss_and_metrics(_inputs(ref=ref), lp, cfg, entropy=entropy)
    k3 = math.exp(-delta) + delta - 1  # the GRPO paper's estimator, the same on every token
    pg = (-1.1 - 1.2 + 3.0) / 3
    h = (1.0 + 2.0 + 3.0) / 3  # entropy token mean over the trained tokens only
    assert float(metrics["kl"]) == pytest.approx(k3)
    assert float(metrics["entropy"]) == pytest.approx(h)
    assert float(metrics["pg_loss"]) == pytest.approx(pg)  # the policy term alone
    assert loss.item() == pytest.approx(pg + 0.5 * k3 - 0.01 * h)
    loss.backward()
    # the bonus pulls every trained token's entropy up by c_H / N_tok, and no other position
    assert entropy.grad.flatten().tolist() == pytest.approx([-0.01 / 3, -0.01 / 3, 0.0, -0.01 / 3, 0.0, 0.0])


def test_entropy_is_a_metric_only_without_a_coefficient():
    entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]], dtype=torch.float64, requires_grad=True)
    loss, metrics = loss_and_metrics(_inputs(), _logprobs(), LossConfig(), entropy=entropy)
    assert float(metrics["entropy"]) == pytest.approx(2.0)
    assert loss.item() == pytest.approx((-1.1 - 1.2 + 3.0) / 3)
    loss.backward()
    assert entropy.grad is None  # no bonus term in the graph at all


def test_truncated_importance_sampling():
    # the engine sampled token (0, 0) with π_roll = π_old / 3 and token (1, 0) with π_roll = 2·π_old
    behaviour = OLD.clone()
    behaviour[0, 0] -= math.log(3.0)
    behaviour[1, 0] += math.log(2.0)
    inputs = _inputs(behaviour=behaviour)
    loss, metrics = loss_and_metrics(inputs, _logprobs(), LossConfig(rollout_is="tis", rollout_is_threshold=2.0))
    # w = min(π_old/π_roll, C): 3 → 2 on the first token, 1 on the second, 1/2 on the third
    assert loss.item() == pytest.approx((2 * -1.1 - 1.2 + 0.5 * 3.0) / 3)
    assert float(metrics["rollout_mismatch_kl"]) == pytest.approx(-(math.log(3.0) - math.log(2.0)) / 3)
    assert float(metrics["is_ratio/min"]) == pytest.approx(0.5)
    assert float(metrics["is_ratio/max"]) == pytest.approx(3.0)  # before truncation
    assert float(metrics["is_ratio/sum"]) == pytest.approx(3.0 + 1.0 + 0.5)
    # without `tis` the same mismatch is only measured
    plain, _ = loss_and_metrics(inputs, _logprobs(), LossConfig())
    assert plain.item() == pytest.approx((-1.1 - 1.2 + 3.0) / 3)


def test_global_denominators_and_sequence_modes():
    # this micro-batch is a third of a mini-batch of N_tok = 9 trained tokens: its loss is a third
    loss, metrics = loss_and_metrics(_inputs(num_tokens=9.0), _logprobs(), LossConfig())
    assert loss.item() == pytest.approx((-1.1 - 1.2 + 3.0) / 9)
    assert float(metrics["pg_clipfrac"]) == pytest.approx(1 / 9)
    # seq-mean-token-mean: mean over B_S = 2 sequences of each sequence's token mean
    loss, _ = loss_and_metrics(_inputs(), _logprobs(), LossConfig(loss_agg_mode="seq-mean-token-mean"))
    assert loss.item() == pytest.approx(((-1.1 - 1.2) / 2 + 3.0) / 2)
    # Dr. GRPO: Σ m·ℓ / (B_S · L_const)
    loss, _ = loss_and_metrics(_inputs(), _logprobs(), LossConfig(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_len=4))
    assert loss.item() == pytest.approx((-1.1 - 1.2 + 3.0) / (2 * 4))


def test_gradient_preserving_upper_clip():
    lp = _logprobs()
    loss, _ = loss_and_metrics(_inputs(), lp, LossConfig(policy_loss="ppo_clip_gradpreserve"))
    loss.backward()
    # the clipped token (r = 1.5, A = 1) keeps the gradient −(1 + ε_h) (docs/algorithms.md §7.4)
    assert lp.grad[0].tolist() == pytest.approx([-1.1 / 3, -1.2 / 3, 0.0])


def test_per_token_advantages_and_an_empty_mask():
    per_token = torch.tensor([[1.0, 0.0, 7.0], [-1.0, 7.0, 7.0]])
    loss, _ = loss_and_metrics(_inputs(advantages=per_token), _logprobs(), LossConfig())
    assert loss.item() == pytest.approx((-1.1 + 0.0 + 3.0) / 3)  # A = 0 on the clipped token
    # a micro-batch that trains nothing (a rank's padding pass): zero loss, no IS statistics
    empty = torch.zeros(2, 3)
    loss, metrics = loss_and_metrics(_inputs(mask=empty, num_tokens=3.0), _logprobs(), LossConfig())
    assert loss.item() == 0.0
    assert not any(k.startswith("is_ratio/") for k in metrics)


def test_pure_same_inputs_same_outputs():
    inputs, cfg = _inputs(ref=OLD + 0.2), LossConfig(kl_coef=0.1)
    before = {k: v.clone() for k, v in vars(inputs).items() if isinstance(v, torch.Tensor)}
    first = loss_and_metrics(inputs, _logprobs(), cfg)
    second = loss_and_metrics(inputs, _logprobs(), cfg)
    assert first[0].item() == second[0].item()
    assert {k: float(v) for k, v in first[1].items()} == {k: float(v) for k, v in second[1].items()}
    assert all(torch.equal(v, getattr(inputs, k)) for k, v in before.items())  # nothing written into


def test_loss_config_reads_the_learner_fields_by_their_names():
    from dataclasses import fields

    from algorithms.core.learner_config import LearnerConfig

    cfg = LearnerConfig(clip_ratio_low=0.1, clip_ratio_high=0.28, clip_ratio_c=None, policy_loss="ppo_clip_gradpreserve",
                        loss_agg_mode="seq-mean-token-sum-norm", kl_coef=0.05, kl_estimator="k3", entropy_coeff=0.01,
                        rollout_is="tis", rollout_is_threshold=4.0, max_response_tokens=96)  # fmt: skip
    loss = LossConfig.of(cfg)
    assert {f.name: getattr(loss, f.name) for f in fields(LossConfig)} == {
        **{f.name: getattr(cfg, f.name) for f in fields(LossConfig)}, "loss_scale_len": 96}  # unset: the budget
    assert LossConfig.of(LearnerConfig(loss_scale_len=64, max_response_tokens=96)).loss_scale_len == 64
