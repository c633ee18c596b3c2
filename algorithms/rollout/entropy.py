"""Token entropy for entropy-guided rollouts (ARPO/AEPO) and for the trainer.

Two sources of per-position entropy h_j:

* **top-K estimate** from the engine's top-K log-probs (vLLM `SamplingParams.logprobs=K`):
  h_j = −Σ_{rank ≤ K} p·log p. Exactly the K most likely entries are used; the extra sampled-token
  entry vLLM appends when the sampled token is outside the top K is dropped (docs/algorithms.md D4).
* **exact** entropy from full logits at the rollout temperature, where the engine computes it
  (`Segment.entropy` from the HF engine; the trainer's forward pass uses
  `algorithms.core.logprobs.token_logprobs(..., with_entropy=True)`).

A segment's entropy (the quantity ARPO compares with the branch's initial entropy) reduces the first
k positions of a segment, normalised by ln|V| so it is comparable across vocabularies:

* `scaled_mean` (default): k · mean_{j ≤ min(k,n)} h_j / ln|V|. Equals the reference scale on
  segments of ≥ k tokens, and is not biased low on short segments (docs/algorithms.md D3).
* `sum` (the public reference): Σ_{j ≤ min(k,n)} h_j / ln|V|.
* `mean`: mean h_j / ln|V| ∈ [0, 1] (multiply `entropy_weight` by k to keep the same sensitivity).

    >>> h = position_entropies([[-0.1, -2.4, -5.0], [-0.7, -0.7]], topk=2)
    >>> round(segment_entropy(h, vocab_size=370, tokens=20), 4)
    1.6968
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from algorithms.rollout.tree_config import Reduction, TreeConfig

REDUCTIONS = ("scaled_mean", "sum", "mean")


def position_entropy(logprobs: Sequence[float], topk: int, *, vocab_size: int | None = None) -> float:
    """h_j from one position's returned log-probs, keeping the `topk` largest (rank ≤ K).

    With `vocab_size`, adds the tail term −(1−Σp)·log((1−Σp)/(|V|−K)) for the mass outside the
    top K (the `entropy_tail_correction` option).
    """
    kept = sorted(logprobs, reverse=True)[:topk]
    h = 0.0
    mass = 0.0
    for lp in kept:
        if lp == -math.inf:
            continue
        p = math.exp(lp)
        h -= p * lp
        mass += p
    if vocab_size is not None:
        rest = 1.0 - mass
        others = vocab_size - len(kept)
        if rest > 1e-12 and others > 0:
            h -= rest * math.log(rest / others)
    return h


def position_entropies(
    top_logprobs: Sequence[Sequence[float]], topk: int, *, vocab_size: int | None = None
) -> list[float]:
    """h_j for every position of a segment (see `position_entropy`)."""
    return [position_entropy(row, topk, vocab_size=vocab_size) for row in top_logprobs]


def segment_entropy(
    entropies: Sequence[float], *, vocab_size: int, tokens: int = 20, reduction: Reduction = "scaled_mean"
) -> float | None:
    """H_seg of a segment from its per-position entropies; `None` for an empty segment.

    An empty segment has no entropy, so it makes no branch decision (docs/algorithms.md §6.3).
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be ≥ 2 to normalise by ln|V|, got {vocab_size}")
    head = list(entropies[:tokens])
    if not head:
        return None
    log_v = math.log(vocab_size)
    total = math.fsum(head)
    if reduction == "scaled_mean":
        return tokens * total / len(head) / log_v
    if reduction == "sum":
        return total / log_v
    if reduction == "mean":
        return total / len(head) / log_v
    raise ValueError(f"entropy_reduction must be one of {REDUCTIONS}, got {reduction!r}")


def measure_segment(
    top_logprobs: Sequence[Sequence[float]] | None,
    exact: Sequence[float] | None,
    settings: TreeConfig,
    vocab_size: int,
) -> float | None:
    """H_seg of one generated segment from whatever entropy data the engine returned.

    `top_logprobs` is the engine's per-position top-K list, `exact` its exact per-position
    entropy (or None). Raises when the chosen source is missing, since a silent zero would
    disable branching (the engine must be asked for `logprobs=K`).
    """
    use_exact = settings.entropy_source == "exact" or (settings.entropy_source == "auto" and exact is not None)
    if use_exact:
        if exact is None:
            raise ValueError(
                "tree.entropy_source='exact' but the engine returned no exact entropy; use 'topk' or 'auto'"
            )
        h = list(exact[: settings.entropy_tokens])
    else:
        if top_logprobs is None:
            raise ValueError(
                "the engine returned no top-K log-probs; request SamplingParams(logprobs=K) with K = entropy_topk"
            )
        tail_v = vocab_size if settings.entropy_tail_correction else None
        h = position_entropies(top_logprobs[: settings.entropy_tokens], settings.entropy_topk, vocab_size=tail_v)
    return segment_entropy(h, vocab_size=vocab_size, tokens=settings.entropy_tokens, reduction=settings.entropy_reduction)


__all__ = [
    "REDUCTIONS",
    "measure_segment",
    "position_entropies",
    "position_entropy",
    "segment_entropy",
]
