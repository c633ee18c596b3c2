"""Sampled-token log-probs and exact entropy from a causal LM's logits, at the rollout temperature;
and the forward passes that produce those logits for a batch of trajectories.

    >>> import torch
    >>> from algorithms.core.logprobs import token_logprobs
    >>> logits = torch.zeros(1, 2, 4)                     # uniform over 4 tokens
    >>> lp, ent = token_logprobs(logits, torch.tensor([[1, 3]]), with_entropy=True)
    >>> lp.exp(), ent.round(decimals=4)
    (tensor([[0.2500, 0.2500]]), tensor([[1.3863, 1.3863]]))

The logits are divided by the rollout temperature before the log-softmax (docs/algorithms.md §2.8: verl and
TRL do the same), so the ratio compares the distribution that was actually sampled. Work is chunked over
positions so a 150k vocabulary never needs a full [tokens, vocab] log-softmax in memory at once.

`response_logits` left-pads prompts and right-pads responses so every response starts at the same
column; position ids skip the padding; only the response positions reach the LM head.
`prompt_pass` runs each distinct prompt once, keeping its keys and values for its responses: the
learner's forward pass (`tree_packing.TreePacker`, which chooses between the two) packs the
responses after it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from algorithms.core.batch import MicroBatch, RolloutBatch

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


def response_logits(model: Any, trajs: list[Any], width: int, *, pad_id: int, device: Any) -> torch.Tensor:
    """Logits [b, width, vocab] predicting each response token, from one pass over prompt and
    response."""
    plen = max(len(t.prompt_ids) for t in trajs)
    b = len(trajs)
    ids = torch.full((b, plen + width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, plen + width), dtype=torch.long)
    for i, t in enumerate(trajs):
        p = len(t.prompt_ids)
        n = min(len(t.response_ids), width)
        ids[i, plen - p : plen] = torch.tensor(t.prompt_ids, dtype=torch.long)
        ids[i, plen : plen + n] = torch.tensor(t.response_ids[:n], dtype=torch.long)
        attn[i, plen - p : plen + n] = 1
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        position_ids=positions.to(device),
        logits_to_keep=width + 1,
        use_cache=False,
    )
    return out.logits[:, :-1]


def prompt_pass(model: Any, prompts: list[Any], *, pad_id: int, device: Any) -> tuple[Any, torch.Tensor] | None:
    """One pass over distinct prompts (left-padded) keeping their keys and values: the model's
    output (`past_key_values`, the last position's logits) and the prompts' attention mask; None
    when the cache keeps something other than every position (sliding-window or hybrid caches)."""
    plen = max(len(p) for p in prompts)
    p_ids = torch.full((len(prompts), plen), pad_id, dtype=torch.long)
    p_attn = torch.zeros((len(prompts), plen), dtype=torch.long)
    for i, p in enumerate(prompts):
        p_ids[i, plen - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        p_attn[i, plen - len(p) :] = 1
    head = model(
        input_ids=p_ids.to(device),
        attention_mask=p_attn.to(device),
        position_ids=(p_attn.cumsum(-1) - 1).clamp(min=0).to(device),
        logits_to_keep=1,
        use_cache=True,
    )
    layers = getattr(head.past_key_values, "layers", [None])
    if not all(type(layer).__name__ == "DynamicLayer" for layer in layers):
        return None
    return head, p_attn


Forward = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


@torch.no_grad()
def frozen_logprobs(
    forward: Forward, model: Any, batch: RolloutBatch, micro_batch_size: int, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) [B, T] of a whole batch under `model`, without gradients, in
    micro-batches: π_old before the first update, or π_ref. `forward` is `Learner.forward`."""
    width = batch.response_ids.shape[1]
    lps = torch.zeros(len(batch), width)
    ents = torch.zeros(len(batch), width) if with_entropy else None
    rows = list(range(len(batch)))
    for start in range(0, len(rows), micro_batch_size):
        part = rows[start : start + micro_batch_size]
        w = max(1, max(len(batch.trajectories[r].response_ids) for r in part))
        lp, ent = forward(model, batch, MicroBatch(part, w), with_entropy=with_entropy)
        lps[part, :w] = lp.float().cpu()
        if ents is not None:
            ents[part, :w] = ent.float().cpu()
    return lps, ents


__all__ = ["frozen_logprobs", "prompt_pass", "response_logits", "token_logprobs"]
