"""Per-token credit (`advantage.credit`): from the rollout tree, or per turn, on top of the outcome.

    >>> import torch
    >>> # a root branch (reward 1) forked after its first tool result, at offset 2 (the fork: reward 0)
    >>> tree_credit(torch.tensor([0.5, -0.5]), torch.tensor([1.0, 0.0]), keys=["a", "b"],
    ...             parents=[None, "a"], offsets=[0, 2], lengths=[4, 4], scale=torch.ones(2)).tolist()
    [[0.5, 0.5, 1.0, 1.0], [-0.5, -0.5, -1.0, -1.0]]

`outcome` (the default) gives every token of a trajectory its outcome advantage A_j (GRPO's or
RLOO's, `algorithms/core/advantages.py`). The two other modes (formulas: docs/algorithms.md
§11.1):

* `tree` (ARPO, AEPO: tree rollouts): a node of the tree is a run of tokens shared by the same set
  of trajectories; its value V(n) is the mean reward of those trajectories. A token in a node n
  that starts after a branch point inside the response gets A_j + (V(n) − V(parent(n))) / s_j,
  where parent(n) is the node that ends at the branch point and s_j the outcome's divisor (group
  std + eps under `scale_rewards: group`). Tokens before the first branch point keep A_j, so a
  tree without forks is plain GRPO. This is TreeRL's global plus local advantage (Hou et al.,
  2025; RTMC, arXiv 2604.11037, step advantages from rollout-tree Monte Carlo), with the global
  part kept per trajectory so that ARPO's attribution modes stay as they are.
* `turn` (GRPO, DAPO: flat groups): G_k(j), the reward trajectory j collects from its turn k on,
  minus b_k, the mean of G_k over the trajectories of the group that reached turn k, over s_j.
  b_k depends only on reaching turn k, never on how many turns a trajectory takes after it: the
  baseline per turn *index* over every trajectory's per-turn rewards (MT-GRPO style) does, and
  puts a hidden bonus or penalty on every "take another turn" decision (verl#7244).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from algorithms.core.advantages import _group_index, group_stats


def lineage_index(
    keys: Sequence[Hashable], parents: Sequence[Hashable | None], offsets: Sequence[int], width: int
) -> list[int | None]:
    """The batch row of each trajectory's parent (None for a root), checked: the tree is built from
    this lineage only, never from equal token values."""
    n = len(keys)
    if not len(parents) == len(offsets) == n:
        raise ValueError(f"keys, parents and offsets need one entry per trajectory ({n})")
    index = {k: i for i, k in enumerate(keys)}
    if len(index) != n:
        raise ValueError("trajectory keys must be unique within the batch")
    parent_index: list[int | None] = []
    for i, p in enumerate(parents):
        if p is None:
            parent_index.append(None)
            continue
        if p not in index:
            raise ValueError(
                f"trajectory {keys[i]!r} is a fork of {p!r}, which is not in the batch; "
                "keep whole tree groups together (never filter single trajectories of a tree)"
            )
        if not 0 <= offsets[i] <= width:
            raise ValueError(f"trajectory {keys[i]!r}: branch offset {offsets[i]} is outside [0, {width}]")
        parent_index.append(index[p])
    return parent_index


def owner_spans(
    i: int, parent_index: Sequence[int | None], offsets: Sequence[int], width: int, memo: dict
) -> list[tuple[int, int, int]]:
    """[(start, end, owner)]: which trajectory first generated each response position of i (a fork's
    positions before its branch offset are copies of its parent's)."""
    if i in memo:
        return memo[i]
    p = parent_index[i]
    if p is None:
        spans = [(0, width, i)]
    else:
        b = offsets[i]
        spans = [(s, min(e, b), o) for s, e, o in owner_spans(p, parent_index, offsets, width, memo) if s < b]
        spans.append((b, width, i))
    memo[i] = spans
    return spans


def tree_credit(
    outcome: torch.Tensor,
    rewards: torch.Tensor,
    *,
    keys: Sequence[Hashable],
    parents: Sequence[Hashable | None],
    offsets: Sequence[int],
    lengths: Sequence[int],
    scale: torch.Tensor,
) -> torch.Tensor:
    """[B, T] advantages: A_j, plus (V(n) − V(parent(n))) / s_j on tokens after a branch point.

    Args:
        outcome: [B] outcome advantages A_j.
        rewards: [B] the rewards the outcome advantages came from (node values are their means).
        keys / parents / offsets: the lineage, as `hard_attribution` takes it (algorithms/arpo.py).
        lengths: response length of each trajectory; positions past it get 0.
        scale: [B] s_j, the divisor that put R_j − μ_g in advantage units (1 for none/rloo).
    """
    n = outcome.numel()
    if rewards.shape != (n,) or scale.shape != (n,) or len(lengths) != n:
        raise ValueError(f"outcome, rewards, scale and lengths need one entry per trajectory ({n})")
    width = max(1, max(lengths, default=0))
    parent_index = lineage_index(keys, parents, offsets, width)
    memo: dict = {}
    spans = [owner_spans(i, parent_index, offsets, width, memo) for i in range(n)]
    trees: dict[int, list[int]] = {}  # root row -> rows of its tree (only they share tokens)
    for i in range(n):
        trees.setdefault(spans[i][0][2], []).append(i)
    out = outcome.detach().double()[:, None].repeat(1, width)
    r, s = rewards.detach().double(), scale.detach().double()
    pos = torch.arange(width)
    for rows in trees.values():
        if len(rows) < 2:
            continue
        owner = torch.empty(len(rows), width, dtype=torch.long)
        for a, j in enumerate(rows):
            for start, end, o in spans[j]:
                owner[a, start:end] = o
        same = owner[:, None, :] == owner[None, :, :]  # [m, m, W]: do rows a and b share token t?
        count = same.sum(1)
        value = (same.double() * r[rows][None, :, None]).sum(1) / count  # V of each token's node
        # the sharers only shrink along a branch, so a node starts where their count changes
        changed = torch.cat([torch.zeros(len(rows), 1, dtype=torch.bool), count[:, 1:] != count[:, :-1]], 1)
        node_start = torch.where(changed, pos, 0).cummax(1).values
        parent_value = value.gather(1, (node_start - 1).clamp(min=0))
        local = torch.where(node_start > 0, value - parent_value, torch.zeros_like(value))
        out[rows] += local / s[rows][:, None]
    out[pos[None, :] >= torch.tensor(list(lengths))[:, None]] = 0.0
    return out.to(outcome.dtype if outcome.is_floating_point() else torch.float32)


def turn_advantages(
    turn_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[int],
    *,
    scale: Sequence[float] | None = None,
    leave_one_out: bool = False,
) -> list[list[float]]:
    """A_k(j) = (G_k(j) − b_k) / s_j for every turn k of every trajectory j.

    G_k(j) = Σ_{k' ≥ k} r_{k'}(j) is the reward from turn k on (the outcome is the last turn's
    reward); b_k is the mean of G_k over the trajectories of j's group that reached turn k (with
    `leave_one_out`, over the others among them, 0 when there are none). At k = 0 every trajectory
    counts, so A_0 is the outcome advantage of the total reward.

    >>> [[round(a, 4) for a in turns] for turns in turn_advantages([[0.0, 1.0], [0.0], [0.0, 0.0, 0.0]], [0, 0, 0])]
    [[0.6667, 0.5], [-0.3333], [-0.3333, -0.5, 0.0]]
    """
    n = len(turn_rewards)
    if len(group_ids) != n or (scale is not None and len(scale) != n):
        raise ValueError(f"group_ids and scale need one entry per trajectory ({n})")
    to_go = []
    for r in turn_rewards:
        g, acc = [], 0.0
        for x in reversed(r):
            acc += float(x)
            g.append(acc)
        to_go.append(g[::-1])
    sums: dict[tuple[int, int], float] = {}
    counts: dict[tuple[int, int], int] = {}
    for gid, g in zip(group_ids, to_go, strict=True):
        for k, x in enumerate(g):
            sums[gid, k] = sums.get((gid, k), 0.0) + x
            counts[gid, k] = counts.get((gid, k), 0) + 1
    out = []
    for j, (gid, g) in enumerate(zip(group_ids, to_go, strict=True)):
        s = 1.0 if scale is None else float(scale[j])
        row = []
        for k, x in enumerate(g):
            total, c = sums[gid, k], counts[gid, k]
            if leave_one_out:
                base = (total - x) / (c - 1) if c > 1 else x
            else:
                base = total / c
            row.append((x - base) / s)
        out.append(row)
    return out


def turn_credit(
    rewards: torch.Tensor,
    group_ids: Sequence[int],
    *,
    segment_starts: Sequence[Sequence[int]],
    lengths: Sequence[int],
    scale: torch.Tensor,
    leave_one_out: bool = False,
) -> torch.Tensor:
    """[B, T] advantages from `turn_advantages`, turn k covering the response positions from its
    segment's start to the next one's (its tool result included). The envs reward only the end of
    an episode, so a trajectory's turn rewards are 0, …, 0, R_j: b_k is then the mean reward of the
    group's trajectories that reached turn k."""
    n = rewards.numel()
    if len(segment_starts) != n or len(lengths) != n or scale.shape != (n,):
        raise ValueError(f"segment_starts, lengths and scale need one entry per trajectory ({n})")
    turns = [max(1, len(s)) for s in segment_starts]
    per_turn = [[0.0] * (k - 1) + [float(r)] for k, r in zip(turns, rewards.tolist(), strict=True)]
    adv = turn_advantages(per_turn, group_ids, scale=scale.tolist(), leave_one_out=leave_one_out)
    width = max(1, max(lengths, default=0))
    out = torch.zeros(n, width, dtype=torch.float64)
    for j, (starts, a) in enumerate(zip(segment_starts, adv, strict=True)):
        bounds = [0, *list(starts)[1:], lengths[j]] if starts else [0, lengths[j]]
        for k, value in enumerate(a):
            out[j, bounds[k] : bounds[k + 1]] = value
    return out.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def credit_scale(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[int],
    *,
    estimator: str = "grpo",
    scale_rewards: str = "group",
    eps: float = 1e-6,
    every_reward: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B] s_j: what the outcome advantage divided R_j − μ_g by (`outcome_advantages`), so that
    node-value and per-turn differences come in the same units."""
    n = rewards.numel()
    if estimator == "rloo" or scale_rewards == "none" or n == 0:
        return torch.ones(n, dtype=torch.float64)
    if scale_rewards == "batch":
        pool = every_reward if every_reward is not None else rewards
        return torch.full((n,), float(pool.double().std()) + eps if pool.numel() > 1 else 1.0, dtype=torch.float64)
    index, k = _group_index(group_ids, n)
    _, std, _, _ = group_stats(torch.as_tensor(rewards), index, k)
    return std + eps


__all__ = ["credit_scale", "lineage_index", "owner_spans", "tree_credit", "turn_advantages", "turn_credit"]
