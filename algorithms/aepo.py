"""AEPO: ARPO with entropy-balanced rollout and entropy-balanced policy optimisation.

ARPO, except (each switchable, spec §7):

* pre-monitoring splits the budget M between global samples and branches (§7.2);
* the branch probability is damped by a consecutive-branch penalty counted per path (§7.3);
* the PPO upper clip keeps a scaled gradient: (1+ε_h)·r/sg(r) above the bound (§7.4);
* advantages are reweighted per token by the policy's entropy: Ã = A·(1 + α_H·Ĥ) (§7.5), with Ĥ
  normalised over the whole mini-batch (all ranks), and computed whenever the feature is on, even
  with `entropy_coeff=0` (the reference silently skips it then, defect D9).

    >>> import torch
    >>> h, m = torch.tensor([[1.0, 2.0, 3.0, 9.0]]), torch.tensor([[1, 1, 1, 0]])
    >>> mean, std = entropy_stats(h, m)
    >>> entropy_aware_advantages(torch.ones(1), h, m, mean=mean, std=std)[0, :3].tolist()
    [0.800000011920929, 1.0, 1.2000000476837158]
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ENTROPY_ADV_SCOPES = ("minibatch", "microbatch", "group")


def entropy_moments(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[Σh, Σh², n] over valid tokens: sums that all-reduce exactly across micro-batches and ranks."""
    m = mask.to(torch.float64)
    h = entropy.detach().to(torch.float64) * m
    return torch.stack([h.sum(), (h * h).sum(), m.sum()])


def stats_from_moments(moments: torch.Tensor) -> tuple[float, float]:
    """(μ, σ) from summed moments; σ is the unbiased std, and 1 when it is 0 or undefined (reference)."""
    s, sq, n = (float(x) for x in moments)
    if n <= 0:
        return 0.0, 1.0
    mean = s / n
    var = max(0.0, (sq - n * mean * mean) / (n - 1)) if n > 1 else 0.0
    std = var**0.5
    return mean, std if std > 0 else 1.0


def entropy_stats(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[float, float]:
    """μ, σ of the entropy over valid tokens; `all_reduce` sums the moments across ranks."""
    moments = entropy_moments(entropy, mask)
    if all_reduce is not None:
        moments = all_reduce(moments)
    return stats_from_moments(moments)


def entropy_aware_advantages(
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    mean: float | torch.Tensor,
    std: float | torch.Tensor,
    alpha: float = 0.2,
    clamp_factor: bool = False,
) -> torch.Tensor:
    """Ã_t = A_t·(1 + α_H·(H_t − μ)/σ), detached (spec §7.5). Returns [B, T].

    `advantages` is [B] or [B, T]; `mean`/`std` are scalars or broadcastable tensors (per-group
    statistics for `entropy_adv_norm_scope="group"`). `clamp_factor` clamps the factor at 0 so a
    very low-entropy token cannot flip its advantage's sign (off by default, as the reference).
    """
    if entropy.shape != mask.shape:
        raise ValueError(
            f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must both be [batch, tokens]"
        )
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    norm = (entropy.detach().float() - torch.as_tensor(mean).float()) / torch.as_tensor(std).float()
    factor = 1.0 + alpha * norm
    if clamp_factor:
        factor = factor.clamp(min=0.0)
    return (adv.float() * factor).detach()


__all__ = [
    "ENTROPY_ADV_SCOPES",
    "entropy_aware_advantages",
    "entropy_moments",
    "entropy_stats",
    "stats_from_moments",
]
