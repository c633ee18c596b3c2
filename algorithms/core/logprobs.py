"""Sampled-token log-probs and exact entropy from a causal LM's logits, at the rollout temperature.

    >>> import torch
    >>> from algorithms.core.logprobs import token_logprobs
    >>> logits = torch.zeros(1, 2, 4)                     # uniform over 4 tokens
    >>> lp, ent = token_logprobs(logits, torch.tensor([[1, 3]]), with_entropy=True)
    >>> lp.exp(), ent.round(decimals=4)
    (tensor([[0.2500, 0.2500]]), tensor([[1.3863, 1.3863]]))

The logits are divided by the rollout temperature before the log-softmax (docs/algorithms.md §2.8: verl and
TRL do the same), so the ratio compares the distribution that was actually sampled. Work is chunked over
positions so a 150k vocabulary never needs a full [tokens, vocab] log-softmax in memory at once.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK = 1024


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk: int = DEFAULT_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(target) per position, and optionally the exact entropy H per position.

    Args:
        logits: [batch, tokens, vocab], already aligned so `logits[:, t]` predicts `targets[:, t]`.
        targets: [batch, tokens] token ids.
        temperature: rollout temperature T; logits are divided by it.
        with_entropy: also return H = logsumexp(z/T) − Σ softmax(z/T)·z/T.
        entropy_grad: keep the entropy's graph (an entropy bonus needs it; statistics do not).
    """
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 for log-probs (greedy rollouts have none), got {temperature}"
        )
    b, t, v = logits.shape
    flat = logits.reshape(b * t, v)
    flat_targets = targets.reshape(b * t)
    lps, ents = [], []
    for start in range(0, b * t, chunk):
        z = flat[start : start + chunk].float()
        if temperature != 1.0:
            z = z / temperature
        lse = torch.logsumexp(z, dim=-1)
        lps.append(z.gather(-1, flat_targets[start : start + chunk, None]).squeeze(-1) - lse)
        if with_entropy:
            zz, lse_e = (z, lse) if entropy_grad else (z.detach(), lse.detach())
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ents.append(lse_e - (torch.softmax(zz, dim=-1) * zz).sum(-1))
    logp = torch.cat(lps).reshape(b, t) if lps else flat.new_zeros(b, t)
    entropy = (torch.cat(ents).reshape(b, t) if ents else flat.new_zeros(b, t)) if with_entropy else None
    return logp, entropy


__all__ = ["token_logprobs"]
