"""Tree packing: each token that trajectories share is computed once in the learner's forward pass.

A GRPO group shares its prompt; an ARPO/AEPO tree shares its prompt and, for each fork, every
response token before the branch point. `packing: tree` computes a micro-batch's prompts once,
keeping their keys and values, then every unshared response token once, packed into rows under a
tree attention mask: a token sees its prompt and its own path (`mask_logits`). Where the model's
attention takes no such mask, it walks down the trees instead, each fork attending to its
parent's cached keys and values up to its branch point (`walk_logits`). Either way every path's
logits are exactly those of its flat sequence (the cached keys and values keep their autograd
graph, so gradients are the flat ones too), while the transformer runs over `tree_token_ratio`
of the flat tokens (docs/algorithms.md §2.12).

Flat GRPO groups take the same path without forks (`TreePacker(forks=False)`, the learner's
`packing: flat`): each prompt once, the responses packed into rows, so a micro-batch computes its
real tokens rather than every response padded to the longest.

The tree comes from the rollout's own lineage (`Trajectory.group_id`, `parent_id`,
`branch_offset`: a fork's response before `branch_offset` is a copy of its parent's), never
from comparing token ids. A fork whose parent is not in the micro-batch, or whose prompt differs,
is computed as a root.

    >>> from algorithms.rollout.trajectory import Trajectory
    >>> root = Trajectory([1, 2], [3, 4, 5], [1, 1, 1], [0.0] * 3, traj_id=0)
    >>> fork = Trajectory([1, 2], [3, 4, 9], [1, 1, 1], [0.0] * 3, traj_id=1, parent_id=0, branch_offset=2)
    >>> packed_tokens([root, fork]), sum(len(t.input_ids) for t in (root, fork))  # 6 computed of 10
    (6, 10)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from algorithms.core.logprobs import prompt_pass, response_logits


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


def _lineage(trajs: Sequence[Any], forks: bool = True) -> tuple[list[int], dict[int, int | None]]:
    """Parents-first order, and each trajectory's parent index: None for a root, for a fork
    whose parent is not in `trajs`, and for one whose prompt differs from its parent's; every
    trajectory is a root when `forks` is false."""
    if not forks:
        return list(range(len(trajs))), dict.fromkeys(range(len(trajs)))
    index_of = {(t.group_id, t.traj_id): i for i, t in enumerate(trajs)}
    order = _parents_first(trajs, index_of)
    parent: dict[int, int | None] = {}
    for i in order:
        t = trajs[i]
        p = index_of.get((t.group_id, t.parent_id)) if t.parent_id is not None else None
        if p is not None and (p not in parent or list(trajs[p].prompt_ids) != list(t.prompt_ids)):
            p = None
        parent[i] = p
    return order, parent


def packed_tokens(trajs: Sequence[Any], width: int | None = None, forks: bool = True) -> int:
    """How many tokens a tree-packed pass computes: each group's distinct prompts once, each
    root's response, and each fork's response from its branch point (`forks` false: every
    response whole)."""
    _, parent = _lineage(trajs, forks)
    total = sum(len(p) for _, p in {(t.group_id, tuple(t.prompt_ids)) for t in trajs})
    for i, t in enumerate(trajs):
        n = len(t.response_ids) if width is None else min(width, len(t.response_ids))
        total += n - (min(t.branch_offset or 0, n) if parent[i] is not None else 0)
    return total


class TreePacker:
    """The learner's forward pass over a micro-batch, and the one place that chooses its packing:
    logits [b, width, vocab] predicting each response token (`response_logits`' layout).

    - `share_prompts` (one process, no gradient checkpointing) or `forks`: each distinct prompt
      once, then the responses packed into rows (`tree_logits`), so only real tokens are computed
      but for the rows' ends; with `forks` (`packing: tree`) a fork's tokens before its branch
      point are its parent's, computed once;
    - otherwise one full pass per trajectory (`response_logits`): DDP-style wrappers expect one
      forward per backward, and gradient checkpointing turns the KV cache off.

    With `forks`, `take_metrics()` gives `tree_token_ratio` (packed ÷ flat tokens) since it was
    last called."""

    def __init__(self, *, forks: bool = True, share_prompts: bool = True) -> None:
        self.forks, self.share_prompts = forks, share_prompts
        self.packed = self.flat = 0

    def __call__(self, model: Any, trajs: list[Any], width: int, *, pad_id: int, device: Any) -> torch.Tensor:
        if not (self.forks or self.share_prompts):
            return response_logits(model, trajs, width, pad_id=pad_id, device=device)
        if self.forks:
            self.packed += packed_tokens(trajs, width)
            self.flat += sum(len(t.prompt_ids) + min(width, len(t.response_ids)) for t in trajs)
        return tree_logits(model, trajs, width, pad_id=pad_id, device=device, forks=self.forks)

    def take_metrics(self) -> dict[str, float]:
        if not self.forks:
            return {}
        ratio = self.packed / self.flat if self.flat else 1.0
        self.packed = self.flat = 0
        return {"tree_token_ratio": ratio}


def tree_logits(model: Any, trajs: list[Any], width: int, *, pad_id: int, device: Any,
                forks: bool = True) -> torch.Tensor:
    """Logits [b, width, vocab] like `response_logits`, each shared token computed once: in one
    pass over the packed trees (`mask_logits`) where the model takes a custom attention mask, else
    by the walk through cached keys and values (`walk_logits`). `forks` false: every trajectory is
    a root (its prompt still shared with its group)."""
    if _takes_tree_mask(model):
        return mask_logits(model, trajs, width, pad_id=pad_id, device=device, forks=forks)
    return walk_logits(model, trajs, width, pad_id=pad_id, device=device, forks=forks)


def _takes_tree_mask(model: Any) -> bool:
    """Eager and SDPA attention use a 4D mask as given, on every layer; flash and flex attention
    take none, and a sliding-window layer would get the full-attention mask."""
    config = model.config
    layers = getattr(config, "layer_types", None) or ["full_attention"]
    return (getattr(config, "_attn_implementation", None) in ("eager", "sdpa")
            and all(kind == "full_attention" for kind in layers))


@dataclass
class _Rows:
    """The packed layout of `mask_logits`: the distinct (group, prompt) pairs, and per row its
    prompt's index, token ids and position ids; per trajectory its row, its first own response
    offset (earlier ones are its parent's) and the row index of each response offset."""

    prompts: list[tuple[int, ...]]
    owners: list[int]
    ids: list[list[int]]
    positions: list[list[int]]
    row: dict[int, int]
    first: dict[int, int]
    path: dict[int, list[int]]
    lens: dict[int, int]

    @classmethod
    def of(cls, trajs: list[Any], width: int, capacity: int, forks: bool = True) -> _Rows:
        order, parent = _lineage(trajs, forks)
        lens = {i: min(width, len(t.response_ids)) for i, t in enumerate(trajs)}
        first: dict[int, int] = {}
        root: dict[int, int] = {}
        size: dict[int, int] = {}  # tokens of each root's subtree
        for i in order:
            p = parent[i]
            first[i] = 0 if p is None else min(trajs[i].branch_offset or 0, lens[p], lens[i])
            root[i] = i if p is None else root[p]
            size[root[i]] = size.get(root[i], 0) + lens[i] - first[i]
        owner_of: dict[tuple, int] = {}  # (group, prompt) -> its index in the prompt pass
        subtrees: dict[int, list[int]] = {}  # per prompt: the roots of its subtrees
        for r in size:
            owner = owner_of.setdefault((trajs[r].group_id, tuple(trajs[r].prompt_ids)), len(owner_of))
            subtrees.setdefault(owner, []).append(r)
        # each prompt's subtrees go into ceil(tokens / capacity) rows; largest first, each into the
        # emptiest row of its prompt: rows come out near equal, each padded to the longest
        owners: list[int] = []
        row_of_root: dict[int, int] = {}
        for owner, roots in subtrees.items():
            fill = dict.fromkeys(range(len(owners), len(owners) + -(-sum(size[r] for r in roots) // capacity)), 0)
            owners += [owner] * len(fill)
            for r in sorted(roots, key=lambda r: -size[r]):
                row_of_root[r] = row = min(fill, key=fill.__getitem__)
                fill[row] += size[r]
        rows = cls([key[1] for key in owner_of], owners, [[] for _ in owners], [[] for _ in owners], {}, first, {}, lens)
        for i in order:  # parents first: a fork's path starts with its parent's
            r, t, p, f = row_of_root[root[i]], trajs[i], parent[i], first[i]
            start = len(rows.ids[r])
            rows.row[i] = r
            rows.path[i] = (rows.path[p][:f] if p is not None else []) + list(range(start, start + lens[i] - f))
            rows.ids[r] += t.response_ids[f : lens[i]]
            rows.positions[r] += range(len(t.prompt_ids) + f, len(t.prompt_ids) + lens[i])
        return rows

    def allowed(self, prompt_mask: torch.Tensor) -> torch.Tensor:
        """[rows, L, P + L]: True where a token may attend: its prompt (`prompt_mask`, the prompt
        pass's padding mask) and its own path up to itself; a padding position sees itself."""
        length = max(1, max(len(row) for row in self.ids))
        own = torch.eye(length, dtype=torch.bool).repeat(len(self.owners), 1, 1)
        for i, cols in self.path.items():
            f = self.first[i]
            if len(cols) > f:
                idx = torch.tensor(cols)
                tri = torch.ones((len(cols), len(cols)), dtype=torch.bool).tril()[f:]
                own[self.row[i], idx[f:].unsqueeze(1), idx.unsqueeze(0)] = tri
        prompts = prompt_mask.bool()[self.owners].unsqueeze(1).expand(-1, length, -1)
        return torch.cat([prompts, own], dim=2)


def mask_logits(model: Any, trajs: list[Any], width: int, *, pad_id: int, device: Any,
                row_tokens: int | None = None, forks: bool = True) -> torch.Tensor:
    """`tree_logits` in two forward passes: each group's distinct prompt once, keeping its keys and
    values, then packed rows of response tokens. A row holds whole subtrees of one group and
    prompt: each root's response and each fork's tokens after its branch point, parents first. A
    token attends to its prompt's cached keys and values and to its own path up to itself (the
    tree mask of TRL PR #7328, built here from lineage); its position id is its position in its
    flat sequence, so every logit is the flat one. Only the rows' ends are padded.

    Rows hold `row_tokens`, by default 1.5 x the hidden size: the dense mask makes a row's
    attention cost ~L / (6 x hidden) of its dense layers, so rows that long keep it a quarter of
    them (of 1, 1.25, 1.5, 2 and 2.5, 1.5 was fastest on the tiny model's ARPO batches)."""
    rows = _Rows.of(trajs, width, row_tokens or 3 * model.config.hidden_size // 2, forks)
    passed = prompt_pass(model, rows.prompts, pad_id=pad_id, device=device)
    if passed is None:
        return walk_logits(model, trajs, width, pad_id=pad_id, device=device, forks=forks)
    head, p_mask = passed
    allowed = rows.allowed(p_mask)
    if model.config._attn_implementation == "eager":  # eager adds the mask to the scores
        dtype = getattr(model, "dtype", torch.float32)
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    else:
        mask = allowed
    length = allowed.shape[1]
    input_ids = torch.full((len(rows.owners), length), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows.owners), length), dtype=torch.long)
    for r, row in enumerate(rows.ids):
        input_ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
        position_ids[r, : len(row)] = torch.tensor(rows.positions[r], dtype=torch.long)
    sel = torch.tensor(rows.owners, device=device)
    cache = head.past_key_values
    keys = [layer.keys.index_select(0, sel) for layer in cache.layers]
    values = [layer.values.index_select(0, sel) for layer in cache.layers]
    out = model(input_ids=input_ids.to(device), attention_mask=mask.unsqueeze(1).to(device),
                position_ids=position_ids.to(device), past_key_values=_cache(keys, values), use_cache=True)
    vocab = out.logits.shape[-1]
    # the rows predicting each response token: a prompt's last position for token 0, then the
    # token before it on its path
    logits = torch.cat([head.logits[:, -1], out.logits.reshape(-1, vocab)])
    take, put = [], []
    for i in range(len(trajs)):
        n = rows.lens[i]
        if n:
            r = rows.row[i]
            take += [rows.owners[r]] + [len(rows.prompts) + r * length + j for j in rows.path[i][: n - 1]]
            put += range(i * width, i * width + n)
    flat = logits.new_zeros((len(trajs) * width, vocab))
    flat = flat.index_copy(0, torch.tensor(put, dtype=torch.long, device=device),
                           logits.index_select(0, torch.tensor(take, dtype=torch.long, device=device)))
    return flat.reshape(len(trajs), width, vocab)


@dataclass
class _Node:
    """A computed trajectory: its keys and values per layer, the attention mask over them, where
    each response offset sits in that layout, and the logits row predicting each response token."""

    keys: list[torch.Tensor]  # per layer [kv_heads, T, head_dim]
    values: list[torch.Tensor]
    mask: torch.Tensor  # [T]
    offset_at: int  # layout index of response offset `first`
    first: int  # response offsets before this are the parent's (at the parent's layout)
    parent: _Node | None
    prompt_len: int
    logits: torch.Tensor  # [n + 1, vocab]: row t predicts response token t

    def index(self, t: int) -> int:
        """Layout index just past response offset t - 1: a prefix of the layout ending there holds
        the prompt and the response before t (and masked holes)."""
        if t >= self.first or self.parent is None:
            return self.offset_at + (t - self.first)
        return self.parent.index(t)


def walk_logits(model: Any, trajs: list[Any], width: int, *, pad_id: int, device: Any,
                forks: bool = True) -> torch.Tensor:
    """Logits [b, width, vocab] like `response_logits`, computing each shared token once: each
    group's prompt once (its keys and values repeated for the group), then roots, then forks level
    by level, each fork attending to its parent's cached keys and values up to its branch point.
    Causal attention makes this the flat computation; gradients flow through the caches."""

    order, parent = _lineage(trajs, forks)
    depth: dict[int, int] = {}
    for i in order:
        p = parent[i]
        depth[i] = 0 if p is None else depth[p] + 1
    nodes: dict[int, _Node] = {}
    for level in range(max(depth.values()) + 1):
        rows = [i for i in order if depth[i] == level]
        if level == 0:
            if not _roots(model, trajs, rows, width, pad_id, device, nodes):
                return response_logits(model, trajs, width, pad_id=pad_id, device=device)
        else:
            _forks(model, trajs, rows, width, pad_id, device, nodes, parent)
    vocab = nodes[0].logits.shape[-1]
    out = []
    for i, t in enumerate(trajs):
        n = min(width, len(t.response_ids))
        rows_i = nodes[i].logits[:n]
        if n < width:
            rows_i = torch.cat([rows_i, rows_i.new_zeros((width - n, vocab))])
        out.append(rows_i)
    return torch.stack(out)


def _cache(keys: list[torch.Tensor], values: list[torch.Tensor]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
        cache.update(k, v, layer)
    return cache


def _roots(model: Any, trajs: list[Any], rows: list[int], width: int, pad_id: int, device: Any,
           nodes: dict[int, _Node]) -> bool:
    """Lay out the roots; False when the model's cache cannot be reused (sliding-window layers)."""
    owner_of: dict[tuple[int, ...], int] = {}
    owners = [owner_of.setdefault(tuple(trajs[i].prompt_ids), len(owner_of)) for i in rows]
    passed = prompt_pass(model, list(owner_of), pad_id=pad_id, device=device)
    if passed is None:
        return False
    head, p_mask = passed
    plen = p_mask.shape[1]
    sel = torch.tensor(owners, device=device)
    keys = [layer.keys.index_select(0, sel) for layer in head.past_key_values.layers]
    values = [layer.values.index_select(0, sel) for layer in head.past_key_values.layers]
    lens = [min(width, len(trajs[i].response_ids)) for i in rows]
    w = max(1, max(lens))
    ids = torch.full((len(rows), w), pad_id, dtype=torch.long)
    r_mask = torch.zeros((len(rows), w), dtype=torch.long)
    for k, (i, n) in enumerate(zip(rows, lens, strict=True)):
        ids[k, :n] = torch.tensor(trajs[i].response_ids[:n], dtype=torch.long)
        r_mask[k, :n] = 1
    starts = torch.tensor([len(trajs[i].prompt_ids) for i in rows]).unsqueeze(1)
    mask = torch.cat([p_mask[owners], r_mask], dim=1)
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                position_ids=(starts + torch.arange(w)).to(device), past_key_values=_cache(keys, values),
                use_cache=True)
    cache = out.past_key_values
    first_rows = head.logits[:, -1][sel]
    for k, i in enumerate(rows):
        logits = torch.cat([first_rows[k : k + 1], out.logits[k, : lens[k]]])  # row t predicts token t
        nodes[i] = _Node([layer.keys[k] for layer in cache.layers], [layer.values[k] for layer in cache.layers],
                         mask[k], plen, 0, None, len(trajs[i].prompt_ids), logits)
    return True


def _forks(model: Any, trajs: list[Any], rows: list[int], width: int, pad_id: int, device: Any,
           nodes: dict[int, _Node], parent: dict[int, int | None]) -> None:
    cuts, prefixes = [], []
    for i in rows:
        up = nodes[parent[i]]
        cut = min(trajs[i].branch_offset or 0, len(up.logits) - 1, width)
        cuts.append(cut)
        prefixes.append(up.index(cut))
    longest = max(prefixes)
    lens = [max(0, min(width, len(trajs[i].response_ids)) - c) for i, c in zip(rows, cuts, strict=True)]
    w = max(1, max(lens))
    layers = len(nodes[parent[rows[0]]].keys)
    keys: list[list[torch.Tensor]] = [[] for _ in range(layers)]
    values: list[list[torch.Tensor]] = [[] for _ in range(layers)]
    masks = []
    ids = torch.full((len(rows), w), pad_id, dtype=torch.long)
    own_mask = torch.zeros((len(rows), w), dtype=torch.long)
    for k, (i, cut, end) in enumerate(zip(rows, cuts, prefixes, strict=True)):
        up = nodes[parent[i]]
        hole = longest - end  # the parent's layout up to the branch point, then masked padding
        for layer in range(layers):
            kk, vv = up.keys[layer][:, :end], up.values[layer][:, :end]
            keys[layer].append(torch.nn.functional.pad(kk, (0, 0, 0, hole)))
            values[layer].append(torch.nn.functional.pad(vv, (0, 0, 0, hole)))
        masks.append(torch.nn.functional.pad(up.mask[:end], (0, hole)))
        ids[k, : lens[k]] = torch.tensor(trajs[i].response_ids[cut : cut + lens[k]], dtype=torch.long)
        own_mask[k, : lens[k]] = 1
    prefix_mask = torch.stack(masks).to(device)
    starts = torch.tensor([len(trajs[i].prompt_ids) + c for i, c in zip(rows, cuts, strict=True)]).unsqueeze(1)
    cache = _cache([torch.stack(k) for k in keys], [torch.stack(v) for v in values])
    mask = torch.cat([prefix_mask, own_mask.to(device)], dim=1)
    out = model(input_ids=ids.to(device), attention_mask=mask, position_ids=(starts + torch.arange(w)).to(device),
                past_key_values=cache, use_cache=True)
    for k, (i, cut) in enumerate(zip(rows, cuts, strict=True)):
        up = nodes[parent[i]]
        # rows up to the branch point are the parent's (same context); the rest are this fork's
        logits = torch.cat([up.logits[: cut + 1], out.logits[k, : lens[k]]])
        nodes[i] = _Node([layer.keys[k] for layer in out.past_key_values.layers],
                         [layer.values[k] for layer in out.past_key_values.layers], mask[k], longest, cut, up,
                         len(trajs[i].prompt_ids), logits)


__all__ = ["TreePacker", "mask_logits", "packed_tokens", "tree_logits", "walk_logits"]
