"""Branch rules of the tree rollout: where (and whether) a branch is forked, one rule per module.

`tree.branch_rule` picks one (docs/algorithms.md §6.10). The rollout loop (`tree.py`) is the same
for all; a rule only chooses fork points:

* an *online* rule (`entropy`, ARPO's) decides at each tool result while the branches run;
* a *wave* rule (`turn`, `entropy_value`, `mixed_outcome`) waits until every branch of a prompt has
  ended, then names the anchors of the next wave: a branch and a response offset to fork from.
  A fork at an anchor copies the branch's tokens before the offset and the env saved at the tool
  result that precedes it, and samples its own continuation. Budget left with no anchor goes to
  top-ups (fresh branches from the prompt), so every rule returns exactly M branches per prompt.

    >>> branches = [BranchView(traj_id=0, parent=None, branch_offset=None, reward=1.0, boundaries=[0, 5, 9]),
    ...             BranchView(traj_id=1, parent=0, branch_offset=5, reward=0.0, boundaries=[0, 5, 12])]
    >>> sorted(prefix_nodes(branches).items())
    [((0, 0), [0, 1]), ((0, 5), [0, 1]), ((0, 9), [0]), ((1, 12), [1])]
    >>> sorted(RULES)
    ['entropy', 'entropy_value', 'mixed_outcome', 'turn']
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from algorithms.rollout.tree_config import TreeConfig


@dataclass(frozen=True)
class Anchor:
    """Fork branch `branch` (its index in the prompt's `BranchView` list) so that the copy keeps
    `response[:offset]` and generates from there; `score` is what the rule ranked it by."""

    branch: int
    offset: int
    score: float | None = None


@dataclass
class BranchView:
    """What a wave rule sees of one ended branch of a prompt.

    `boundaries`: response offsets where the branch could start generating with the env saved
    there: 0 and right after each tool result. Per response position: `logprobs` (rollout
    log-probs), `entropy` (None at tool-result tokens), `generated` (loss mask), `forkable` (a
    generated position t whose token is neither blank nor the last of its turn, so a fork after t
    continues the same turn).
    """

    traj_id: int
    parent: int | None  # index of the parent branch in the same list
    branch_offset: int | None
    reward: float
    boundaries: list[int]
    initial: bool = True  # an initial branch (not a fork or top-up)
    logprobs: list[float] = field(default_factory=list)
    entropy: list[float | None] = field(default_factory=list)
    generated: list[bool] = field(default_factory=list)
    forkable: list[bool] = field(default_factory=list)


class BranchRule(Protocol):
    """A rule. `online` rules implement `decide`; wave rules implement `anchors`."""

    name: str
    online: bool
    needs_token_entropy: bool  # the loop keeps per-position entropies for `BranchView.entropy`

    def wave_size(self, initial: int, left: int) -> int:
        """How many anchors the next wave asks for, with `left` branches still to make."""
        ...

    def anchors(self, branches: Sequence[BranchView], k: int, rng: random.Random, cfg: TreeConfig) -> list[Anchor]:
        """Up to `k` fork points among ended branches (fewer: the rest are top-ups)."""
        ...


def prefix_nodes(branches: Sequence[BranchView]) -> dict[tuple[int, int], list[int]]:
    """Agent-step nodes of a prompt's tree: {(owner, offset): branches through it}.

    A node is the prefix up to a boundary; its owner is the branch that generated that prefix's
    last token (a fork shares its parent's nodes up to its branch offset), so equal prefixes
    reached by a parent and its forks are one node, found from lineage alone. Offset 0, the
    prompt, is one node of every branch, keyed (0, 0).
    """
    nodes: dict[tuple[int, int], list[int]] = {}
    for j, p in enumerate(branches):
        for b in p.boundaries:
            owner = 0 if b == 0 else j
            while (
                branches[owner].parent is not None
                and branches[owner].branch_offset is not None
                and b <= branches[owner].branch_offset
            ):
                owner = branches[owner].parent
            nodes.setdefault((owner, b), []).append(j)
    return nodes


def _registry() -> dict[str, BranchRule]:
    from algorithms.rollout.branch_rules.entropy import EntropyRule
    from algorithms.rollout.branch_rules.entropy_value import EntropyValueRule
    from algorithms.rollout.branch_rules.mixed_outcome import MixedOutcomeRule
    from algorithms.rollout.branch_rules.turn import TurnRule

    return {r.name: r for r in (EntropyRule(), TurnRule(), EntropyValueRule(), MixedOutcomeRule())}


RULES: dict[str, BranchRule] = {}


def get_rule(name: str) -> BranchRule:
    """The rule registered as `name` (`tree.branch_rule`)."""
    if name not in RULES:
        raise ValueError(f"config field 'tree.branch_rule' must be one of {sorted(RULES)}, got {name!r}")
    return RULES[name]


RULES.update(_registry())

__all__ = ["RULES", "Anchor", "BranchRule", "BranchView", "get_rule", "prefix_nodes"]
