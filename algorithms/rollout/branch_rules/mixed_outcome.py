"""`mixed_outcome`: TRACE's rule (arXiv 2606.11119): spend the branch budget on the prefixes whose
outcomes are mixed, where one more sample is most likely to add reward contrast.

TRACE scores each anchor (the prompt, or the prefix up to a thought-action-observation turn) by
how likely its continuations are to end both ways, p(1 − p) with p the predicted success
probability, and allocates rollouts to the best anchors. Here p is not predicted: it is the
mean reward of the paths seen so far through the node (`prefix_nodes`), and the score is their
reward variance (p(1 − p) for 0/1 rewards). After the N initial paths end, each wave forks the
N best nodes with a nonzero score (ties: the node with fewer paths through it, then the deeper,
then the earlier); the prompt itself is a node too, and choosing it, or finding no mixed node,
means a top-up. Waves repeat until M paths.

    >>> paths = [PathView(0, None, None, 1.0, [0, 5]), PathView(1, 0, 5, 0.0, [0, 5]),
    ...          PathView(2, None, None, 1.0, [0, 7])]
    >>> round(outcome_variance([1.0, 0.0, 1.0]), 4)
    0.2222
    >>> MixedOutcomeRule().anchors(paths, 2, None, TreeConfig())
    [Anchor(path=0, offset=5, score=0.25)]
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from algorithms.rollout.branch_rules import Anchor, PathView, prefix_nodes
from algorithms.rollout.tree_config import TreeConfig


def outcome_variance(rewards: Sequence[float]) -> float:
    """Population variance of the rewards seen through a node (p(1 − p) for 0/1 rewards)."""
    mean = math.fsum(rewards) / len(rewards)
    return math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)


class MixedOutcomeRule:
    name = "mixed_outcome"
    online = False
    needs_token_entropy = False

    def wave_size(self, initial: int, left: int) -> int:
        return min(initial, left)

    def anchors(self, paths: Sequence[PathView], k: int, rng: random.Random, cfg: TreeConfig) -> list[Anchor]:
        """The k most mixed nodes (score > 0); the prompt's node becomes a top-up (not returned)."""
        ranked = []
        for (owner, offset), through in prefix_nodes(paths).items():
            score = outcome_variance([paths[j].reward for j in through])
            if score > 0:
                ranked.append((-score, len(through), -offset, owner, offset, score))
        ranked.sort()
        return [Anchor(owner, offset, score) for *_, owner, offset, score in ranked[:k] if offset > 0]


__all__ = ["MixedOutcomeRule", "outcome_variance"]
