"""Today's ARPO tree, pinned: a seeded tiny-model rollout must keep its trajectory ids, forks and
token ids exactly (the `entropy` branch rule is the default and changes nothing)."""

from __future__ import annotations

import hashlib
import json

import pytest
from arpo_helpers import make_env_factory, run

from algorithms.rollout.engine import SamplingParams
from algorithms.rollout.tree import TreeRollout
from algorithms.rollout.tree_config import TreeConfig

PARAMS = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=96)
G1 = 1 << 16  # the traj id stride of group 1 (algorithms.base.seeds.TREE_ID_STRIDE)

ARPO_TREE = [
    (0, 0, None, None, "initial"), (0, 1, None, None, "initial"), (0, 2, None, None, "initial"),
    (0, 3, 0, 77, "fork"), (0, 4, 1, 75, "fork"), (0, 5, 2, 76, "fork"),
    (1, G1, None, None, "initial"), (1, G1 + 1, None, None, "initial"), (1, G1 + 2, None, None, "initial"),
    (1, G1 + 3, G1, 76, "fork"), (1, G1 + 4, G1 + 2, 78, "fork"), (1, G1 + 5, None, None, "topup"),
]  # fmt: skip
AEPO_REFERENCE_TREE = [
    (0, 0, None, None, "initial"), (0, 1, None, None, "initial"), (0, 2, None, None, "initial"),
    (0, 3, None, None, "topup"), (0, 4, None, None, "topup"), (0, 5, None, None, "topup"),
    (1, G1, None, None, "initial"), (1, G1 + 1, None, None, "initial"), (1, G1 + 2, None, None, "initial"),
    (1, G1 + 3, G1 + 1, 75, "fork"), (1, G1 + 4, None, None, "topup"), (1, G1 + 5, None, None, "topup"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("cfg", "tree", "digest"),
    [
        ({}, ARPO_TREE, "f7cc47bd2c261053"),
        (
            {"enable_consecutive_penalty": True, "entropy_formula": "reference"},
            AEPO_REFERENCE_TREE,
            "70ec6a40f894e699",
        ),
    ],
)
def test_seeded_tree_is_unchanged(hf_engine, tokenizer, cfg, tree, digest):
    config = TreeConfig(initial_rollouts=3, branch_probability=0.9, **cfg)
    t = TreeRollout(hf_engine, config, budget=6)
    res = run(t.arollout(make_env_factory(tokenizer), PARAMS, n_prompts=2, max_response_tokens=96, seed=7))
    shape = [
        (x.group_id, x.traj_id, x.parent_id, x.branch_offset, x.lineage["kind"]) for x in res.trajectories
    ]
    assert shape == tree
    tokens = json.dumps([x.response_ids for x in res.trajectories]).encode()
    assert hashlib.sha256(tokens).hexdigest()[:16] == digest
