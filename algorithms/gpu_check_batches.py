"""What the GPU check feeds its rows: the batch shapes of a run (`FULL`, or `DRY` for the dry run)
and synthetic learner batches, GRPO-shaped or ARPO-shaped (forks that copy their parent's response
up to their branch point, which `packing: tree` computes once)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Sizes:
    """Batch shapes of one run: the real ones, or the dry run's."""

    gen_batches: tuple[int, ...]
    gen_prompt: int  # prompt tokens of each generation request
    gen_tokens: int  # tokens generated per request
    prompts: int  # prompt draws of a learner batch
    group: int  # trajectories per prompt
    prompt_len: int
    response_len: int  # prompt_len + response_len tokens per trajectory
    micro_batch: int
    parity_batch: int
    lora_r: int


FULL = Sizes(gen_batches=(16, 64), gen_prompt=128, gen_tokens=256, prompts=8, group=8, prompt_len=256,
             response_len=768, micro_batch=8, parity_batch=16, lora_r=16)
DRY = Sizes(gen_batches=(2, 4), gen_prompt=8, gen_tokens=8, prompts=2, group=4, prompt_len=8, response_len=24,
            micro_batch=4, parity_batch=2, lora_r=4)


def grpo_trajectories(sizes: Sizes, vocab: int, rng: np.random.Generator) -> list[Any]:
    """`prompts` groups of `group` trajectories sharing their prompt; a tool result (loss mask 0)
    in the middle of each response; rewards alternate 1, 0 within a group, so advantages are ±1."""
    from algorithms.rollout.trajectory import Trajectory

    out = []
    for g in range(sizes.prompts):
        prompt = random_tokens(rng, vocab, sizes.prompt_len)
        for i in range(sizes.group):
            mask = _tool_mask(sizes.response_len)
            out.append(Trajectory(prompt, random_tokens(rng, vocab, sizes.response_len), mask, _logprobs(mask, vocab),
                                  reward=float(i % 2 == 0), group_id=g, traj_id=i))  # fmt: skip
    return out


def arpo_trajectories(sizes: Sizes, vocab: int, rng: np.random.Generator) -> list[Any]:
    """ARPO-shaped groups: 2 paths from the prompt, then forks of earlier trajectories, each a copy
    of its parent's response up to a branch point in its middle half, then tokens of its own."""
    from algorithms.rollout.trajectory import Trajectory

    out, n = [], sizes.response_len
    for g in range(sizes.prompts):
        prompt = random_tokens(rng, vocab, sizes.prompt_len)
        group: list[Any] = []
        for i in range(sizes.group):
            reward = float(i % 2 == 0)
            if i < 2:
                mask = _tool_mask(n)
                t = Trajectory(prompt, random_tokens(rng, vocab, n), mask, _logprobs(mask, vocab), reward=reward,
                               group_id=g, traj_id=i)  # fmt: skip
            else:
                parent = group[int(rng.integers(0, i))]
                cut = int(rng.integers(n // 4, 3 * n // 4))
                mask = parent.loss_mask[:cut] + [1] * (n - cut)
                t = Trajectory(prompt, parent.response_ids[:cut] + random_tokens(rng, vocab, n - cut), mask,
                               parent.logprobs[:cut] + _logprobs([1] * (n - cut), vocab), reward=reward,
                               group_id=g, traj_id=i, parent_id=parent.traj_id, branch_offset=cut)  # fmt: skip
            group.append(t)
        out += group
    return out


def random_tokens(rng: np.random.Generator, vocab: int, n: int) -> list[int]:
    return rng.integers(3, vocab, size=n).tolist()  # above the tokenizer's pad and ChatML ids


def _tool_mask(n: int) -> list[int]:
    start, length = n // 2, max(1, n // 16)
    return [0 if start <= j < start + length else 1 for j in range(n)]


def _logprobs(mask: list[int], vocab: int) -> list[float]:
    return [-math.log(vocab) if m else 0.0 for m in mask]  # a random model's, roughly
