"""Today's ARPO tree, pinned: a seeded rollout must keep its trajectory ids, forks and tokens exactly
(the `entropy` branch rule is the default and changes nothing).

The pin is of the tree's own decisions, so its model is `SeededEngine`, whose tokens and entropies
follow from each request's seed by exact arithmetic. A real model's floating-point sums differ
between kinds of CPU (the tiny model built from one seed differs between machines), so a pin of
its samples held on one kind of machine only.
"""

from __future__ import annotations

import hashlib
import json
import math
import random

import pytest
from arpo_helpers import TOP_K, ScriptedEngine, make_env_factory, run, top_probability

from algorithms.base.seeds import TREE_ID_STRIDE
from algorithms.rollout.engine import SamplingParams, Segment
from algorithms.rollout.tree import TreeRollout
from algorithms.rollout.tree_config import TreeConfig

PARAMS = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=96)
LEVELS = (0.1, 0.5, 0.9, 1.3, 1.7, 2.1)  # entropies far enough apart that rounding decides nothing


class SeededEngine(ScriptedEngine):
    """Each segment drawn from its request's seed: a call `print(a + b)` or, after one or two
    results, an answer; every position's entropy one of `LEVELS`."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, 0.0, 0.0)

    def generate(self, prompts, params):
        params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        out = []
        for ids, p in zip(prompts, params, strict=True):
            rng = random.Random(p.seed)
            ids = list(ids)
            seen = ids[len(ids) - ids[::-1].index(self.turn_id) :].count(self.result_id)
            if seen == 0 or (seen == 1 and rng.random() < 0.5):
                text = f"<python> print({rng.randint(1, 99)} + {rng.randint(1, 99)}) </python>"
                reason, stop, end = "stop", "</python>", []
            else:
                text = f"<answer> \\boxed{{{rng.randint(1, 199)}}} </answer>"
                reason, stop, end = "eos", None, [self.tokenizer.eos_token_id]
            toks = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], *end][: p.max_tokens]
            tops = [top_probability(rng.choice(LEVELS)) for _ in toks]
            rows = [[math.log(q)] + [math.log((1 - q) / (TOP_K - 1))] * (TOP_K - 1) for q in tops]
            out.append(Segment(toks, [r[0] for r in rows], rows if p.logprobs else None, reason, stop, text))
        return out


# per group, its trajectories in id order: i initial, t top-up, p@o a fork of the group's p-th
# trajectory at response token o
ARPO_TREES = [
    "i i 0@19 1@19 0@38 2@38 t t",
    "i i 0@19 t t t t t",
    "i i 1@20 0@40 t t t t",
    "i i 0@20 1@19 2@40 t t t",
]
AEPO_REFERENCE_TREES = [
    "i i 0@38 t t t t t",
    "i i 1@20 t t t t t",
    "i i 1@39 t t t t t",
    "i i 0@20 1@37 t t t t",
]


def test_entropy_is_the_default_rule():
    assert TreeConfig().branch_rule == "entropy"


@pytest.mark.parametrize(
    ("cfg", "trees", "digest"),
    [
        ({}, ARPO_TREES, "f13ba827ea3d6939"),
        ({"enable_consecutive_penalty": True, "entropy_formula": "reference"}, AEPO_REFERENCE_TREES, "c4b7f87b573b26e2"),
    ],
)  # fmt: skip
def test_seeded_tree_is_unchanged(tokenizer, cfg, trees, digest):
    # 4 prompts: with 2, a change of the entropy weight from 0.2 to 0.5 left every fork in place
    t = TreeRollout(SeededEngine(tokenizer), TreeConfig(initial_rollouts=2, **cfg), budget=8)
    res = run(t.arollout(make_env_factory(tokenizer), PARAMS, n_prompts=4, max_response_tokens=96, seed=7))
    groups: dict[int, list[str]] = {}
    for x in res.trajectories:
        index = x.traj_id - x.group_id * TREE_ID_STRIDE
        assert index == len(groups.setdefault(x.group_id, []))
        kind = x.lineage["kind"]
        fork = f"{x.parent_id - x.group_id * TREE_ID_STRIDE}@{x.branch_offset}" if kind == "fork" else None
        groups[x.group_id].append(fork or {"initial": "i", "topup": "t"}[kind])
    assert [" ".join(g) for g in groups.values()] == trees
    seen = json.dumps([(x.response_ids, x.response_text) for x in res.trajectories]).encode()
    assert hashlib.sha256(seen).hexdigest()[:16] == digest
