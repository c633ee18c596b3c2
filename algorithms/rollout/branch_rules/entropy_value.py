"""`entropy_value`: APPO's rule (arXiv 2606.12384, code AMAP-ML/APPO): branch at the tokens, anywhere
in a turn, where the model is unsure and its continuation is valuable.

After the N initial branches end, every generated position t of each gets the branching score

    BS_t = z(H_t) · z(Ω_t),   Ω_t = Σ_{k ≥ t} γ^(k−t) · m_k · log π(a_k | s_k)

with H_t the token's entropy, m the loss mask (tool-result tokens add nothing), and z the z-score
over the branch's candidate positions. Candidates are the positions with both z > 0, pooled over
the prompt's branches; the M − N highest scores are forked (the copy keeps response[:t+1] and
samples on from there), then the highest remaining scores of any sign, then top-ups.

APPO's code sets Ω_t = exp(Σ γ^(k−t)·(log π_current − log π_rollout)), a likelihood gain of the
current policy over the one that sampled; here rollout and training weights are the same when
branches are chosen, so that ratio is 1 everywhere, and Ω is the discounted log-likelihood of
the branch's own continuation instead (docs/algorithms.md §6.10).

    >>> future_values([-1.0, -2.0, 0.0], [True, True, False], gamma=0.5)
    [-2.0, -2.0, 0.0]
    >>> [round(z, 4) for z in zscores([1.0, 2.0, 3.0])]
    [-1.2247, 0.0, 1.2247]
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from algorithms.rollout.branch_rules import Anchor, BranchView
from algorithms.rollout.tree_config import TreeConfig


def zscores(values: Sequence[float]) -> list[float]:
    """(v − mean) / std (population std); all 0 when the values do not vary."""
    if not values:
        return []
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    return [0.0] * len(values) if std < 1e-12 else [(v - mean) / std for v in values]


def future_values(logprobs: Sequence[float], generated: Sequence[bool], gamma: float) -> list[float]:
    """Ω_t = Σ_{k ≥ t} γ^(k−t)·m_k·log π(a_k), for every response position t (one backward pass)."""
    out = [0.0] * len(logprobs)
    acc = 0.0
    for t in range(len(logprobs) - 1, -1, -1):
        acc = (logprobs[t] if generated[t] else 0.0) + gamma * acc
        out[t] = acc
    return out


def branch_scores(branch: BranchView, gamma: float) -> list[tuple[int, float, bool]]:
    """[(t, BS_t, strict)] over the branch's forkable positions; `strict`: z(H_t) > 0 and z(Ω_t) > 0."""
    cand = [t for t, ok in enumerate(branch.forkable) if ok and branch.entropy[t] is not None]
    if not cand:
        return []
    omega = future_values(branch.logprobs, branch.generated, gamma)
    zh = zscores([branch.entropy[t] for t in cand])
    zv = zscores([omega[t] for t in cand])
    return [(t, a * b, a > 0 and b > 0) for t, a, b in zip(cand, zh, zv, strict=True)]


class EntropyValueRule:
    name = "entropy_value"
    online = False
    needs_token_entropy = True

    def wave_size(self, initial: int, left: int) -> int:
        return left  # one wave: every fork is chosen from the initial branches

    def anchors(self, branches: Sequence[BranchView], k: int, rng: random.Random, cfg: TreeConfig) -> list[Anchor]:
        """The k best (branch, t) by BS among the initial branches: strict candidates first (APPO's
        order), ties to the earlier branch and position; a fork keeps response[:t + 1]."""
        scored = [
            (strict, s, j, t)
            for j, p in enumerate(branches)
            if p.initial
            for t, s, strict in branch_scores(p, cfg.future_discount)
        ]
        scored.sort(key=lambda x: (not x[0], -x[1], x[2], x[3]))
        return [Anchor(j, t + 1, s) for _, s, j, t in scored[:k]]


__all__ = ["EntropyValueRule", "branch_scores", "future_values", "zscores"]
