"""Token losses of the learners: the whole loss of a micro-batch (`loss_and_metrics`), and its
parts: PPO clip (clip-higher, dual clip, gradient-preserving upper clip), loss aggregation with
global denominators, KL estimators, and DAPO's overlong shaping.

    >>> import torch
    >>> from algorithms.core.losses import policy_loss
    >>> lp = torch.zeros(2, 3, requires_grad=True)
    >>> loss, metrics = policy_loss(lp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]),
    ...                             torch.tensor([[1, 1, 0], [1, 0, 0]]))
    >>> float(loss), float(metrics["pg_clipfrac"])
    (-0.3333333432674408, 0.0)

Shapes: logprobs, old_logprobs, mask are [batch, tokens] over the *response* positions; mask is 1
exactly on tokens the policy sampled (tool output, prompt and padding are 0 and count nowhere).
Advantages are [batch] (broadcast over tokens) or [batch, tokens] (per-token, e.g. AEPO).

Global denominators (docs/algorithms.md §2.3–§2.4): under gradient accumulation and data
parallelism a micro-batch sees only part of the mini-batch. Pass `num_tokens` (N_tok = Σ mask
over the whole mini-batch, all ranks) and `num_seqs` (B_S = sequences with at least one trainable
token) computed once per mini-batch; then the micro-batch losses *sum* to the mini-batch loss
(the learner multiplies by the world size W to undo DDP's gradient averaging). Token metrics
use the same denominators, so they too sum to the mini-batch value.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
UPPER_CLIP_MODES = ("hard", "grad_preserve")
KL_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k1+", "k3+", "low_var_kl+")
LOG_RATIO_CLAMP = 20.0
# the config's `policy_loss` choices, as `clipped_ratio`'s upper-clip modes
POLICY_LOSSES = {"ppo_clip": "hard", "ppo_clip_gradpreserve": "grad_preserve"}


def _as_float(x: torch.Tensor | float | int | None, fallback: torch.Tensor) -> torch.Tensor:
    if x is None:
        return fallback
    return torch.as_tensor(x, dtype=fallback.dtype, device=fallback.device)


def local_denominators(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N_tok, B_S) of one batch: trainable tokens, and sequences with at least one of them."""
    m = mask.float()
    return m.sum(), (m.sum(-1) > 0).float().sum()


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token-mean",
    *,
    num_tokens: torch.Tensor | float | None = None,
    num_seqs: torch.Tensor | float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce per-token values [batch, tokens] to one loss by an aggregation mode (§2.3).

    `num_tokens`/`num_seqs` default to this batch's own counts; pass the mini-batch's global
    counts to make micro-batch losses additive. `max_len` is L_const of `seq-mean-token-sum-norm`
    (Dr. GRPO: the max response length) and is required for that mode.
    """
    if agg not in AGG_MODES:
        raise ValueError(f"loss aggregation must be one of {AGG_MODES}, got {agg!r}")
    if values.shape != mask.shape:
        raise ValueError(
            f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must have the same shape"
        )
    m = mask.to(values.dtype)
    masked = values * m
    n_tok_local, n_seq_local = local_denominators(m)
    if agg == "token-mean":
        return masked.sum() / _as_float(num_tokens, n_tok_local).clamp(min=1)
    n_seq = _as_float(num_seqs, n_seq_local).clamp(min=1)
    if agg == "seq-mean-token-sum":
        return masked.sum() / n_seq
    if agg == "seq-mean-token-mean":
        return (masked.sum(-1) / m.sum(-1).clamp(min=1)).sum() / n_seq
    if max_len is None or max_len <= 0:
        raise ValueError(
            "loss aggregation 'seq-mean-token-sum-norm' needs max_len (L_const, e.g. max_response_length)"
        )
    return masked.sum() / (n_seq * max_len)


def clipped_ratio(
    ratio: torch.Tensor, clip_low: float, clip_high: float, upper_clip: str = "hard"
) -> torch.Tensor:
    """clip(r, 1−ε_low, 1+ε_high), built explicitly so the gradient at each bound is what we say.

    `upper_clip="grad_preserve"` (AEPO §7.4, CE-GPPO family) uses (1+ε_high)·r/sg(r) above the
    bound: the value is 1+ε_high, the gradient is (1+ε_high)·∇log π. The lower bound stays a
    constant (no gradient), as in the reference.
    """
    if upper_clip not in UPPER_CLIP_MODES:
        raise ValueError(f"upper_clip must be one of {UPPER_CLIP_MODES}, got {upper_clip!r}")
    hi, lo = 1.0 + clip_high, 1.0 - clip_low
    if upper_clip == "grad_preserve":
        upper = hi * ratio / ratio.detach()
    else:
        upper = torch.full_like(ratio, hi)
    out = torch.where(ratio > hi, upper, ratio)
    return torch.where(ratio < lo, torch.full_like(ratio, lo), out)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token-mean",
    dual_clip: float | None = None,
    upper_clip: str = "hard",
    is_weights: torch.Tensor | None = None,
    num_tokens: torch.Tensor | float | None = None,
    num_seqs: torch.Tensor | float | None = None,
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate, aggregated (§2.2–§2.3). Returns `(loss, metrics)`.

    ℓ = max(−r·A, −clip(r)·A); with `dual_clip=c`, where A < 0: ℓ = min(ℓ, −c·A). The log-ratio
    is clamped to ±20 before exp. `is_weights` (detached, per token) multiply ℓ before
    aggregation (rollout/trainer mismatch correction, §2.9).

    Metrics (detached, same denominators as the loss, so additive over micro-batches):
    `pg_loss`, `pg_clipfrac` (clipped branch active), `pg_clipfrac_lower` (dual clip active),
    `ppo_kl` (mean of log π_old − log π_θ).
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must all be [batch, tokens]"
        )
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    elif advantages.shape != logprobs.shape:
        raise ValueError(f"advantages must be [batch] or [batch, tokens], got {tuple(advantages.shape)}")
    advantages = advantages.to(logprobs.dtype).detach()
    log_ratio = (logprobs - old_logprobs.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * clipped_ratio(ratio, clip_low, clip_high, upper_clip)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    clipped = (loss_clipped > loss_unclipped).to(logprobs.dtype)
    dual = torch.zeros_like(clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip (clip_ratio_c) must be > 1, got {dual_clip}")
        bound = -advantages * dual_clip
        negative = (advantages < 0).expand_as(per_token)
        dual = (negative & (per_token > bound)).to(logprobs.dtype)
        per_token = torch.where(negative, torch.minimum(per_token, bound), per_token)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    kw = {"num_tokens": num_tokens, "num_seqs": num_seqs, "max_len": max_len}
    loss = aggregate(per_token, mask, agg, **kw)
    with torch.no_grad():
        metrics = {
            "pg_loss": loss.detach(),
            "pg_clipfrac": aggregate(clipped, mask, "token-mean", num_tokens=num_tokens),
            "pg_clipfrac_lower": aggregate(dual, mask, "token-mean", num_tokens=num_tokens),
            "ppo_kl": aggregate(-log_ratio, mask, "token-mean", num_tokens=num_tokens),
        }
    return loss, metrics


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate of π_θ against π_ref from sampled-token log-probs (§2.7).

    Δ = log π_θ − log π_ref. `k1`/`kl`: Δ; `abs`: |Δ|; `k2`/`mse`: ½Δ²; `k3`: e^{−Δ} + Δ − 1
    (unclamped, as TRL); `low_var_kl`: k3 with −Δ clamped to ±20 and the value to ±10 (verl).
    A `+` suffix keeps the forward value and takes the gradient of k2 (straight-through).
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kl estimator must be one of {KL_KINDS}, got {kind!r}")
    if kind.endswith("+"):
        value = kl_penalty(logprobs, ref_logprobs, kind[:-1]).detach()
        k2 = kl_penalty(logprobs, ref_logprobs, "k2")
        return value + k2 - k2.detach()
    delta = logprobs - ref_logprobs
    if kind in ("k1", "kl"):
        return delta
    if kind == "abs":
        return delta.abs()
    if kind in ("k2", "mse"):
        return 0.5 * delta.square()
    if kind == "k3":
        return torch.exp(-delta) + delta - 1.0
    neg = (-delta).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(neg) - neg - 1.0).clamp(-10.0, 10.0)


@dataclass(frozen=True)
class LossConfig:
    """The options of `loss_and_metrics`, under the names and meanings of the `LearnerConfig`
    fields they come from (docs/training.md); `LossConfig.of(learner_config)` copies them."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float | None = 3.0  # the dual clip (None: off)
    policy_loss: str = "ppo_clip"  # a key of POLICY_LOSSES
    loss_agg_mode: str = "token-mean"
    loss_scale_len: int | None = None  # L_const of seq-mean-token-sum-norm (`of` fills it in)
    kl_coef: float = 0.0
    kl_estimator: str = "low_var_kl"
    entropy_coeff: float = 0.0
    rollout_is: str = "none"  # "tis": token-level truncated importance sampling
    rollout_is_threshold: float = 2.0

    @classmethod
    def of(cls, cfg: Any) -> LossConfig:
        """The loss options of a `LearnerConfig`; an unset `loss_scale_len` is the response budget."""
        values = {f.name: getattr(cfg, f.name) for f in fields(cls)}
        values["loss_scale_len"] = cfg.loss_scale_len or cfg.max_response_tokens
        return cls(**values)


@dataclass
class LossInputs:
    """The tensors of one micro-batch that the loss reads besides the policy's log-probs; every one
    is [batch, tokens] over response positions, except `advantages` ([batch] or [batch, tokens])
    and the mini-batch's global denominators `num_tokens` (N_tok) and `num_seqs` (B_S)."""

    old_logprobs: torch.Tensor  # log π_old (detached; log π_θ itself under the on-policy shortcut)
    behaviour_logprobs: torch.Tensor  # log π_roll, as the rollout engine sampled
    advantages: torch.Tensor
    mask: torch.Tensor
    num_tokens: torch.Tensor | float
    num_seqs: torch.Tensor | float
    ref_logprobs: torch.Tensor | None = None  # log π_ref, when the loss has a KL term


def loss_and_metrics(
    inputs: LossInputs,
    logprobs: torch.Tensor,
    config: LossConfig,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one micro-batch and its metrics (docs/algorithms.md §2.2–§2.9).

    L = agg(w·ℓ_clip) + β_KL·agg(KL(π_θ‖π_ref)) − c_H·agg(H), every agg over the mini-batch's
    global denominators, so micro-batch losses sum to the mini-batch loss. w is the truncated
    rollout importance weight min(e^{log π_old − log π_roll}, C) under `rollout_is: tis`, else 1.
    The KL term needs `inputs.ref_logprobs`; the entropy term and metric need `entropy`
    (the bonus only when `entropy_coeff` ≠ 0).

    Metrics (detached): `pg_loss`, `pg_clipfrac`, `pg_clipfrac_lower`, `ppo_kl`, `kl`, `entropy`,
    `rollout_mismatch_kl`, each additive over micro-batches; and the raw rollout-IS statistics
    `is_ratio/sum`, `is_ratio/tokens`, `is_ratio/min`, `is_ratio/max` (of e^{log π_old − log π_roll}
    before truncation, on trained tokens; absent when there are none).
    """
    mask = inputs.mask
    old = inputs.old_logprobs
    denoms = {"num_tokens": inputs.num_tokens, "num_seqs": inputs.num_seqs, "max_len": config.loss_scale_len}
    log_w = (old - inputs.behaviour_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) * mask
    is_w = log_w.exp().clamp(max=config.rollout_is_threshold) if config.rollout_is == "tis" else None
    loss, metrics = policy_loss(
        logprobs,
        old,
        inputs.advantages,
        mask,
        clip_low=config.clip_ratio_low,
        clip_high=config.clip_ratio_high,
        agg=config.loss_agg_mode,
        dual_clip=config.clip_ratio_c,
        upper_clip=POLICY_LOSSES[config.policy_loss],
        is_weights=is_w,
        **denoms,
    )
    if inputs.ref_logprobs is not None:
        kl_loss = aggregate(kl_penalty(logprobs, inputs.ref_logprobs, config.kl_estimator), mask, config.loss_agg_mode, **denoms)
        loss = loss + config.kl_coef * kl_loss
        metrics["kl"] = kl_loss.detach()
    if entropy is not None:
        if config.entropy_coeff != 0:
            loss = loss - config.entropy_coeff * aggregate(entropy, mask, config.loss_agg_mode, **denoms)
        metrics["entropy"] = aggregate(entropy.detach(), mask, "token-mean", num_tokens=inputs.num_tokens)
    # trainer/engine mismatch (only meaningful where π_old was computed, §2.9)
    metrics["rollout_mismatch_kl"] = aggregate(-log_w, mask, "token-mean", num_tokens=inputs.num_tokens)
    on = mask > 0
    if bool(on.any()):
        ratio = log_w.detach()[on].double().exp().cpu()
        metrics["is_ratio/sum"], metrics["is_ratio/tokens"] = ratio.sum(), on.sum()
        metrics["is_ratio/min"], metrics["is_ratio/max"] = ratio.min(), ratio.max()
    return loss, metrics


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, cache_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong punishment (§4.4), added to the task reward before normalisation.

    0 up to L_max − L_cache, then linear down to −penalty_factor at L_max, and −penalty_factor
    beyond it.
    """
    if cache_len <= 0 or cache_len > max_len:
        raise ValueError(f"overlong cache_len must be in (0, max_len={max_len}], got {cache_len}")
    lengths = torch.as_tensor(lengths, dtype=torch.float64)
    free = max_len - cache_len
    penalty = ((free - lengths) / cache_len * penalty_factor).clamp(max=0.0)
    return penalty.clamp(min=-penalty_factor).float()


__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "POLICY_LOSSES",
    "UPPER_CLIP_MODES",
    "LossConfig",
    "LossInputs",
    "aggregate",
    "clipped_ratio",
    "kl_penalty",
    "local_denominators",
    "loss_and_metrics",
    "overlong_penalty",
    "policy_loss",
]
