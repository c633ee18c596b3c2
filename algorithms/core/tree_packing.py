"""Tree packing: each token that trajectories share is computed once in the learner's forward pass.

A GRPO group shares its prompt; an ARPO/AEPO tree shares its prompt and, for each fork, every
response token before the branch point. `packing: tree` lays a micro-batch out as one packed
sequence holding each shared token once, with a tree attention mask: a token attends to the
tokens on its own root-to-leaf path and nothing else, and its position id is its depth on that
path. Causal attention makes every path's logits exactly those of its flat sequence, while the
transformer runs over `tree_token_ratio` of the flat tokens.

The tree comes from the rollout's own lineage (`Trajectory.group_id`, `parent_id`,
`branch_offset`: a fork's response before `branch_offset` is a copy of its parent's), never
from comparing token ids. A group whose members' prompts differ, or a fork whose parent is not
in the micro-batch, is laid out flat.

    >>> from algorithms.rollout.trajectory import Trajectory
    >>> root = Trajectory([1, 2], [3, 4, 5], [1, 1, 1], [0.0] * 3, traj_id=0)
    >>> fork = Trajectory([1, 2], [3, 4, 9], [1, 1, 1], [0.0] * 3, traj_id=1, parent_id=0, branch_offset=2)
    >>> plan = pack_trees([root, fork])
    >>> plan.input_ids.tolist(), plan.position_ids.tolist()
    ([[1, 2, 3, 4, 5, 9]], [[0, 1, 2, 3, 4, 4]])
    >>> plan.tree_token_ratio  # 6 packed tokens stand for 10
    0.6
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class PackedTrees:
    """One packed sequence for a micro-batch of trajectories.

    `paths[i]` lists the packed positions of trajectory i's prompt and response, in order; the
    logits at `paths[i][len(prompt) - 1 + r]` predict its response token r.
    """

    input_ids: torch.Tensor  # [1, L]
    position_ids: torch.Tensor  # [1, L]
    visible: torch.Tensor  # [L, L] bool: may query q attend to key k
    paths: list[list[int]]
    prompt_lens: list[int]
    flat_tokens: int

    @property
    def tree_token_ratio(self) -> float:
        return self.input_ids.shape[1] / max(1, self.flat_tokens)


def pack_trees(trajs: Sequence[Any], width: int | None = None) -> PackedTrees:
    """Lay `trajs` out with shared prompts and shared fork prefixes once (responses cut to `width`)."""
    ids: list[int] = []
    token_paths: list[list[int]] = []  # per packed token: the packed positions of its path, itself last
    index_of = {(t.group_id, t.traj_id): i for i, t in enumerate(trajs)}
    prompt_of_group: dict[int, tuple[list[int], list[int]]] = {}  # group -> (prompt ids, packed path)
    paths: dict[int, list[int]] = {}

    def extend(path: list[int], tokens: Sequence[int]) -> list[int]:
        for tok in tokens:
            ids.append(int(tok))
            path = [*path, len(ids) - 1]
            token_paths.append(path)
        return path

    for i in _parents_first(trajs, index_of):
        t = trajs[i]
        prompt = list(t.prompt_ids)
        response = list(t.response_ids if width is None else t.response_ids[:width])
        parent = index_of.get((t.group_id, t.parent_id)) if t.parent_id is not None else None
        if parent is not None and parent in paths and list(trajs[parent].prompt_ids) == prompt:
            # a fork: its response before branch_offset is its parent's, already laid out
            cut = min(t.branch_offset or 0, len(response), len(paths[parent]) - len(prompt))
            paths[i] = extend(paths[parent][: len(prompt) + cut], response[cut:])
            continue
        shared = prompt_of_group.get(t.group_id)
        if shared is not None and shared[0] == prompt:
            head = shared[1]
        else:
            head = extend([], prompt)
            prompt_of_group.setdefault(t.group_id, (prompt, head))
        paths[i] = extend(head, response)
    n = len(ids)
    visible = torch.zeros((n, n), dtype=torch.bool)
    positions = torch.empty(n, dtype=torch.long)
    for q, path in enumerate(token_paths):
        visible[q, path] = True
        positions[q] = len(path) - 1
    flat = sum(len(t.prompt_ids) + len(t.response_ids if width is None else t.response_ids[:width]) for t in trajs)
    return PackedTrees(torch.tensor([ids], dtype=torch.long), positions[None], visible,
                       [paths[i] for i in range(len(trajs))], [len(t.prompt_ids) for t in trajs], flat)


def _parents_first(trajs: Sequence[Any], index_of: dict) -> list[int]:
    """Indices in an order where every fork comes after its parent (if the parent is present)."""
    done: list[int] = []
    seen: set[int] = set()

    def visit(i: int, stack: set[int]) -> None:
        if i in seen:
            return
        t = trajs[i]
        parent = index_of.get((t.group_id, t.parent_id)) if t.parent_id is not None else None
        if parent is not None and parent not in stack:
            visit(parent, stack | {i})
        seen.add(i)
        done.append(i)

    for i in range(len(trajs)):
        visit(i, set())
    return done


def tree_logits(model: Any, trajs: list[Any], width: int, *, pad_id: int, device: Any) -> torch.Tensor:
    """Logits [b, width, vocab] predicting each response token, like `response_logits`, from one
    pass over the packed trees (rows past a response's end are zero; `pad_id` is unused: nothing
    is padded)."""
    return _packed_logits(model, trajs, width, device)[0]


def _packed_logits(model: Any, trajs: list[Any], width: int, device: Any) -> tuple[torch.Tensor, PackedTrees]:
    plan = pack_trees(trajs, width)
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(plan.visible.shape, dtype=dtype)
    mask.masked_fill_(~plan.visible, torch.finfo(dtype).min)
    out = model(
        input_ids=plan.input_ids.to(device),
        attention_mask=mask[None, None].to(device),
        position_ids=plan.position_ids.to(device),
        use_cache=False,
    )
    logits = out.logits[0]
    rows = torch.zeros((len(trajs), width), dtype=torch.long)
    valid = torch.zeros((len(trajs), width), dtype=torch.bool)
    for i, (path, p) in enumerate(zip(plan.paths, plan.prompt_lens, strict=True)):
        n = min(width, len(path) - p)
        rows[i, :n] = torch.tensor(path[p - 1 : p - 1 + n], dtype=torch.long)
        valid[i, :n] = True
    picked = logits[rows.to(device)]
    return picked * valid.to(device)[..., None].to(picked.dtype), plan


class TreePacker:
    """`tree_logits` for a learner's forward passes, counting what the packing saved:
    `take_metrics()` gives `tree_token_ratio` (packed ÷ flat tokens) since it was last called."""

    def __init__(self) -> None:
        self.packed = self.flat = 0

    def __call__(self, model: Any, trajs: list[Any], width: int, *, pad_id: int, device: Any) -> torch.Tensor:
        logits, plan = _packed_logits(model, trajs, width, device)
        self.packed += plan.input_ids.shape[1]
        self.flat += plan.flat_tokens
        return logits

    def take_metrics(self) -> dict[str, float]:
        ratio = self.packed / self.flat if self.flat else 1.0
        self.packed = self.flat = 0
        return {"tree_token_ratio": ratio}


__all__ = ["PackedTrees", "TreePacker", "pack_trees", "tree_logits"]
