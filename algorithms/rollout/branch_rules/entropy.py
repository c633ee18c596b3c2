"""`entropy`: ARPO's rule (arXiv 2507.19849), the default: fork after a tool result where the
model's reaction is more uncertain than its start.

Online: after a tool result, the branch's next segment is generated and its entropy H_seg compared
with the branch's initial entropy H_init; each of Z − 1 candidate forks is then drawn with
P = clip((α + β·ΔH)·max(0, 1 − γ·l), 0, 1), ΔH = H_seg − H_init (`branching.py`, docs/algorithms.md
§6.5; γ·l is AEPO's penalty, §7.3). A prompt whose branches all end short of M gets top-ups.

    >>> import random
    >>> rule = EntropyRule()
    >>> cfg = TreeConfig(branch_probability=0.5, entropy_weight=0.2)
    >>> rule.decide(random.Random(0), 1.0, cfg, 0)  # P = 0.7; u = 0.844 -> no fork
    False
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from algorithms.rollout.branch_rules import Anchor, BranchView
from algorithms.rollout.branching import decide_branch
from algorithms.rollout.tree_config import TreeConfig


class EntropyRule:
    name = "entropy"
    online = True
    needs_token_entropy = False

    def decide(self, rng: random.Random, delta_h: float, cfg: TreeConfig, consecutive: int) -> bool:
        """One candidate fork at a tool result: ARPO's draw (one uniform per call)."""
        return decide_branch(rng, delta_h, cfg, consecutive)

    def wave_size(self, initial: int, left: int) -> int:
        return 0  # never waves: the budget left is topped up

    def anchors(self, branches: Sequence[BranchView], k: int, rng: random.Random, cfg: TreeConfig) -> list[Anchor]:
        return []


__all__ = ["EntropyRule"]
