"""`mixed_outcome`: TRACE's rule (arXiv 2606.11119): spend the branch budget on the prefixes whose
outcomes are mixed, where one more sample is most likely to add reward contrast.

TRACE scores each anchor (the prompt, or the prefix up to a thought-action-observation turn) by
how likely its continuations are to end both ways, p(1 − p) with p the success probability a
learned predictor gives, and allocates rollouts to the best anchors. Here nothing is learned:
a node (`prefix_nodes`) is scored by the variance of the rewards seen through it, with the
prompt's mean reward added as one pseudo-observation (so a prefix seen once scores by how far
its outcome lies from the prompt's: (r − r̄)²/4). The prompt's own budget is fixed (M per
prompt), so only prefixes after a tool result are anchors. After the N initial branches end, each
wave forks the N best nodes with a nonzero score (ties: fewer branches through it, then deeper,
then earlier); budget without such a node (every outcome equal) goes to top-ups. Waves repeat
until M branches.

    >>> branches = [BranchView(0, None, None, 1.0, [0, 5]), BranchView(1, 0, 5, 0.0, [0, 5]),
    ...             BranchView(2, None, None, 1.0, [0, 7])]
    >>> round(outcome_variance([1.0, 0.0, 1.0]), 4)
    0.2222
    >>> [(a.branch, a.offset, round(a.score, 4)) for a in MixedOutcomeRule().anchors(branches, 2, None, TreeConfig())]
    [(0, 5, 0.1728), (2, 7, 0.0278)]
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from algorithms.rollout.branch_rules import Anchor, BranchView, prefix_nodes
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

    def anchors(self, branches: Sequence[BranchView], k: int, rng: random.Random, cfg: TreeConfig) -> list[Anchor]:
        """The k most mixed prefixes after a tool result (score > 0)."""
        prior = math.fsum(p.reward for p in branches) / len(branches)
        ranked = []
        for (owner, offset), through in prefix_nodes(branches).items():
            score = outcome_variance([*(branches[j].reward for j in through), prior])
            if offset > 0 and score > 1e-12:
                ranked.append((-score, len(through), -offset, owner, offset, score))
        ranked.sort()
        return [Anchor(owner, offset, score) for *_, owner, offset, score in ranked[:k]]


__all__ = ["MixedOutcomeRule", "outcome_variance"]
