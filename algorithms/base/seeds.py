"""Every id and seed of a training run, derived in one place.

A prompt draw gets a group id, unique over the whole run; each trajectory of the group gets a
trajectory id derived from it; each engine request gets a sampling seed derived from the
trajectory id and the turn. So samples depend only on (seed, step, draw), not on ranks, batching
or resumption.

    >>> [flat_group_id(step, k, prompts_per_step=4) for step in (0, 1) for k in (0, 3)]
    [0, 3, 4, 7]
    >>> dapo_first_group_id(0, 1, max_rounds=0) != dapo_first_group_id(1, 0, max_rounds=0)
    True
    >>> flat_traj_id(group_id=5, k=2, group_size=8), tree_traj_id(group_id=5, k=2)
    (42, 327682)
    >>> request_seed(0, traj_id=42, turn=1)
    42000127
    >>> draw_seed(0, 3, 7) == draw_seed(0, 3, 7) != draw_seed(0, 3, 8)
    True
"""

from __future__ import annotations

import numpy as np

# DAPO: group ids of one generation round are first + k, k < DRAWS_PER_ROUND; rounds never overlap
DRAWS_PER_ROUND = 1_000_003
# trajectory k of a tree group g has id g * TREE_ID_STRIDE + k (k < M, however the tree grows)
TREE_ID_STRIDE = 1 << 16
# request seed stride per trajectory: turns of one trajectory never reach the next one's seeds
TURNS_PER_TRAJECTORY = 1_000_003


def draw_seed(*parts: int) -> int:
    """A 31-bit seed that depends on every part (so each draw's samples are reproducible)."""
    return int(np.random.SeedSequence([abs(int(p)) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


def flat_group_id(step: int, k: int, *, prompts_per_step: int) -> int:
    """Group id of draw k of an RL step that draws `prompts_per_step` prompts."""
    return step * prompts_per_step + k


def dapo_round_index(step: int, round: int, *, max_rounds: int) -> int:
    """A distinct index per (step, generation round). With a bound on rounds it is
    step·max_rounds + round; unbounded (max_rounds ≤ 0) it is the Cantor pairing of (step, round),
    because no per-step stride can hold an unlimited number of rounds."""
    if round < 0 or step < 0:
        raise ValueError(f"step {step} and round {round} must be >= 0")
    if max_rounds > 0:
        if round >= max_rounds:
            raise ValueError(f"round {round} is past max_num_gen_batches={max_rounds}")
        return step * max_rounds + round
    n = step + round
    return n * (n + 1) // 2 + round


def dapo_first_group_id(step: int, round: int, *, max_rounds: int) -> int:
    """Group id of the first draw of a DAPO generation round (the round's draws follow it)."""
    return dapo_round_index(step, round, max_rounds=max_rounds) * DRAWS_PER_ROUND


def dapo_seed_step(step: int, round: int) -> int:
    """The step part of a DAPO draw's seed (the group id, also in the seed, makes it unique)."""
    return step * 1000 + round


def flat_traj_id(group_id: int, k: int, group_size: int) -> int:
    """Id of sample k of a flat group of `group_size` samples."""
    return group_id * group_size + k


def tree_traj_id(group_id: int, k: int) -> int:
    """Id of the k-th trajectory (initial, fork, top-up or probe, in creation order) of a tree."""
    return group_id * TREE_ID_STRIDE + k


def request_seed(base: int | None, traj_id: int, turn: int) -> int | None:
    """Sampling seed of a trajectory's `turn`-th engine request (None: unseeded)."""
    return None if base is None else base + TURNS_PER_TRAJECTORY * traj_id + turn


__all__ = [
    "DRAWS_PER_ROUND",
    "TREE_ID_STRIDE",
    "TURNS_PER_TRAJECTORY",
    "dapo_first_group_id",
    "dapo_round_index",
    "dapo_seed_step",
    "draw_seed",
    "flat_group_id",
    "flat_traj_id",
    "request_seed",
    "tree_traj_id",
]
