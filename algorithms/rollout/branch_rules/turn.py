"""`turn`: Tree-GRPO's rule (arXiv 2509.21240): branch at agent steps, uniformly at random, with
no entropy signal.

Tree-GRPO grows trees whose nodes are whole agent steps (thought, action, observation): each of
the N initial chains is a tree; then, wave after wave, each tree expands a node drawn uniformly
at random from its non-leaf nodes, and the copy samples the rest of the episode from there.
Here a node is the prefix up to a tool result (`prefix_nodes`); a wave gives one expansion per
tree, trees in the order they were started, until M branches. A tree without a tool result has no
node to expand: its share goes to a top-up (a new chain, so a new tree).

    >>> import random
    >>> branches = [BranchView(0, None, None, 1.0, [0, 5, 9]), BranchView(1, None, None, 0.0, [0])]
    >>> TurnRule().anchors(branches, 2, random.Random(0), TreeConfig())  # tree 1 has no step to expand
    [Anchor(branch=0, offset=9, score=None)]
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from algorithms.rollout.branch_rules import Anchor, BranchView, prefix_nodes
from algorithms.rollout.tree_config import TreeConfig


def tree_of(branches: Sequence[BranchView], j: int) -> int:
    """The index of the chain (initial branch or top-up) whose tree branch j belongs to."""
    while branches[j].parent is not None:
        j = branches[j].parent
    return j


class TurnRule:
    name = "turn"
    online = False
    needs_token_entropy = False

    def wave_size(self, initial: int, left: int) -> int:
        return min(initial, left)

    def anchors(self, branches: Sequence[BranchView], k: int, rng: random.Random, cfg: TreeConfig) -> list[Anchor]:
        """One uniformly drawn agent-step node per tree (in tree order), at most k."""
        steps: dict[int, list[tuple[int, int]]] = {}
        for owner, offset in sorted(prefix_nodes(branches)):
            if offset > 0:  # the prompt itself is a tree's root, not a step
                steps.setdefault(tree_of(branches, owner), []).append((owner, offset))
        out = []
        for tree in sorted(steps):
            if len(out) == k:
                break
            owner, offset = rng.choice(steps[tree])
            out.append(Anchor(owner, offset))
        return out


__all__ = ["TurnRule", "tree_of"]
