"""ARPO (arXiv 2507.19849): GRPO over an entropy-branching tree rollout, soft or hard attribution.

    agent-envs train --algo arpo --config configs/arpo_tiny.yaml

GRPO, except:

* rollouts come from `algorithms.rollout.tree.TreeRollout` (M trajectories per prompt: N full
  ones, plus forks after high-entropy tool results, plus top-ups), not flat group sampling;
* `advantage_attribution="hard"` gives a token shared by several trajectories of a tree the mean
  advantage of those trajectories, counted once (docs/algorithms.md §6.7); `"soft"` (default) is plain GRPO;
  `"appo"` is APPO's training rule (§6.10): forks out of the loss, their advantage on their source's prefix.

    >>> import torch
    >>> adv, mask = hard_attribution(torch.tensor([1.0, -1.0]), keys=["a", "b"], parents=[None, "a"],
    ...                              offsets=[0, 2], mask=torch.ones(2, 4))
    >>> adv[1].tolist(), mask[1].tolist()
    ([0.0, 0.0, -1.0, -1.0], [0.0, 0.0, 1.0, 1.0])
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from agent_envs.base.config import option
from algorithms.core.advantages import outcome_advantages
from algorithms.core.batch import PromptDraw, RolloutBatch
from algorithms.core.credit import lineage_index, owner_spans
from algorithms.core.group_sampling import run_coroutine
from algorithms.core.learner import Learner
from algorithms.core.learner_config import LearnerConfig
from algorithms.rollout.tree import TreeRollout
from algorithms.rollout.tree_config import TreeConfig
from algorithms.rollout.tree_stats import tree_metrics


@dataclass
class ARPOConfig(LearnerConfig):
    """ARPO's defaults (reference scripts, docs/algorithms.md §6.2, §6.8); `group_size` is the
    tree budget M, and every rollout setting is in `tree`."""

    output_dir: str = "runs/arpo"
    group_size: int = option(16, "M: trajectories per prompt, forks and top-ups included")
    tree: TreeConfig = option(factory=TreeConfig, help="the tree rollout's settings")
    advantage_attribution: Literal["soft", "hard", "hard_no_dedupe", "appo"] = option(
        "soft",
        "soft: plain GRPO; hard: a shared token gets its sharers' mean advantage, counted once; "
        "appo: APPO's rule (forks out of the loss, their advantage added to their source's prefix)",
    )


class ARPOLearner(Learner):
    """GRPO with the tree rollout and (optionally) hard attribution."""

    name = "arpo"
    config_class = ARPOConfig
    one_version_per_group = True
    config: ARPOConfig

    def rollout(self, draws: Sequence[PromptDraw]) -> list[Any]:
        return self.tree_rollout(draws)[0]

    def tree_rollout(self, draws: Sequence[PromptDraw]) -> tuple[list[Any], dict[str, float]]:
        """The trajectories of this rank's draws, and tree metrics over every rank's prompts."""
        cfg = self.config
        tree = TreeRollout(self.engine, cfg.tree, budget=cfg.group_size)
        result = run_coroutine(
            tree.arollout(
                [self.env_factory() for _ in draws],
                self.sampling_params,
                max_response_tokens=cfg.max_response_tokens,
                tasks=[d.index for d in draws],
                group_ids=[d.group_id for d in draws],
                seeds=[d.seed for d in draws],
            )
        )
        # Accounting of every rank's prompts, so logged tree metrics describe the whole step.
        gathered = self.ranks.gather_lists(
            {
                "prompts": result.prompts,
                "depths": [int(t.lineage.get("depth", 0)) for t in result.trajectories],
            }
        )
        return result.trajectories, tree_metrics(gathered["prompts"], gathered["depths"])

    def collect(self, step: int) -> tuple[list[Any], dict[str, float]]:
        return self.tree_rollout(self.step_draws(step))

    def compute_advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        adv, mask = super().compute_advantages(batch)
        cfg = self.config
        mode = cfg.advantage_attribution
        if mode == "soft":
            return adv, mask
        trajs = batch.trajectories
        if mode == "appo":
            forks = [t.parent_id is not None for t in trajs]
            # initial branches (top-ups too) and forks normalised as two groups per prompt
            groups = [2 * int(g) + f for g, f in zip(batch.group_ids.tolist(), forks, strict=True)]
            base = outcome_advantages(batch.rewards, groups, estimator=cfg.advantage_estimator,
                                      scale_rewards=cfg.scale_rewards, eps=cfg.adv_eps)  # fmt: skip
            return appo_attribution(
                base,
                keys=[(t.group_id, t.traj_id) for t in trajs],
                parents=[None if t.parent_id is None else (t.group_id, t.parent_id) for t in trajs],
                offsets=[t.branch_offset or 0 for t in trajs],
                mask=mask,
            )
        return hard_attribution(
            adv,
            keys=[(t.group_id, t.traj_id) for t in trajs],
            parents=[None if t.parent_id is None else (t.group_id, t.parent_id) for t in trajs],
            offsets=[t.branch_offset or 0 for t in trajs],
            mask=mask,
            dedupe=mode == "hard",
        )


def hard_attribution(
    advantages: torch.Tensor,
    *,
    keys: Sequence[Hashable],
    parents: Sequence[Hashable | None],
    offsets: Sequence[int],
    mask: torch.Tensor,
    dedupe: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token advantages and loss mask under hard attribution (docs/algorithms.md §6.7).

    Trajectory i is a fork of `parents[i]` (None for a root: an initial branch or a top-up) whose own
    tokens start at response offset `offsets[i]`; its positions before that are copies of the
    parent's. The tree is built from this lineage only, never from equal token values.

    A token node shared by the set S of trajectories gets A_node = mean_{j∈S} A_j. With `dedupe`
    only the lowest-index copy keeps its mask, so the shared token counts once in the loss
    numerator and in N_tok; the other copies get mask 0 (for the loss only). Without `dedupe`
    (`hard_no_dedupe`) every copy keeps A_node and its mask.

    With per-token advantages (`advantage.credit: tree`) a shared token gets the mean of its
    sharers' advantages at that token: tree credit's node term is the same for every sharer, so
    only the outcome part is averaged.

    Args:
        advantages: [B] one outcome advantage per trajectory (e.g. GRPO's), or [B, T] per token.
        keys / parents: a unique key per trajectory and its parent's key (within this batch).
        offsets: branch offset of each fork in response positions (ignored for roots).
        mask: [B, T] loss mask over response positions.
    Returns:
        ([B, T] advantages, [B, T] mask).
    """
    n, width = mask.shape
    if advantages.shape not in ((n,), (n, width)):
        raise ValueError(
            f"advantages must be [B]={n} or [B, T]={(n, width)} (per trajectory or per token), "
            f"got {tuple(advantages.shape)}"
        )
    if len(keys) != n:
        raise ValueError(f"keys, parents and offsets need one entry per trajectory ({n})")
    parent_index = lineage_index(keys, parents, offsets, width)

    memo: dict = {}
    spans = [owner_spans(i, parent_index, offsets, width, memo) for i in range(n)]
    adv = advantages.detach().double()
    adv = adv[:, None].expand(n, width) if adv.dim() == 1 else adv
    total = torch.zeros(n, width, dtype=torch.float64)  # indexed by owner
    count = torch.zeros(n, width, dtype=torch.float64)
    first = torch.full((n, width), n, dtype=torch.long)
    for j in range(n):
        for s, e, o in spans[j]:
            if s < e:
                total[o, s:e] += adv[j, s:e]
                count[o, s:e] += 1
                first[o, s:e] = torch.minimum(first[o, s:e], torch.tensor(j))
    out = torch.zeros(n, width, dtype=torch.float64)
    keep = torch.zeros(n, width, dtype=torch.bool)
    for j in range(n):
        for s, e, o in spans[j]:
            if s < e:
                out[j, s:e] = total[o, s:e] / count[o, s:e]
                keep[j, s:e] = first[o, s:e] == j
    new_mask = mask * keep.to(mask.dtype) if dedupe else mask.clone()
    return out.to(advantages.dtype if advantages.is_floating_point() else torch.float32), new_mask


def appo_attribution(
    advantages: torch.Tensor,
    *,
    keys: Sequence[Hashable],
    parents: Sequence[Hashable | None],
    offsets: Sequence[int],
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """APPO's training rule (arXiv 2606.12384, its code's `compute_appo_advantage`; docs/algorithms.md §6.10).

    `advantages` [B] are already normalised in two groups per prompt (branches from the prompt;
    forks). A fork is out of the loss (advantage and mask 0); each position p < offset of its
    parent gets, on top of the parent's own advantage, the mean advantage of the parent's forks
    that share position p. Forks of forks add to their own parent, which is out of the loss too.

        >>> adv, mask = appo_attribution(torch.tensor([1.0, -1.0, 0.5]), keys=["a", "b", "c"],
        ...                              parents=[None, "a", "a"], offsets=[0, 2, 3], mask=torch.ones(3, 4))
        >>> adv[0].tolist(), mask[1].tolist()
        ([0.75, 0.75, 1.5, 1.0], [0.0, 0.0, 0.0, 0.0])
    """
    n, width = mask.shape
    if advantages.shape != (n,) or not len(keys) == len(parents) == len(offsets) == n:
        raise ValueError(f"appo attribution: one advantage, key, parent and offset per trajectory ({n})")
    index = {k: i for i, k in enumerate(keys)}
    total = torch.zeros(n, width, dtype=torch.float64)
    count = torch.zeros(n, width, dtype=torch.float64)
    for i, p in enumerate(parents):
        if p is None:
            continue
        if p not in index:
            raise ValueError(f"trajectory {keys[i]!r} is a fork of {p!r}, which is not in the batch")
        end = min(max(offsets[i], 0), width)
        total[index[p], :end] += float(advantages[i])
        count[index[p], :end] += 1
    own = advantages.detach().double().unsqueeze(1).expand(n, width)
    out = own + torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))
    roots = torch.tensor([p is None for p in parents], dtype=mask.dtype).unsqueeze(1)
    new_mask = mask * roots
    return (out * new_mask.double()).to(advantages.dtype), new_mask


__all__ = ["ARPOConfig", "ARPOLearner", "appo_attribution", "hard_attribution"]
