"""Tree rollout invariants on real tiny-model rollouts (HF engine; the vLLM engine in the slow test)."""

from __future__ import annotations

import pytest
from arpo_helpers import make_env_factory, run

from algorithms.rollout.engine import SamplingParams
from algorithms.rollout.tree import TreeRollout
from algorithms.rollout.tree_config import TreeConfig

M, N = 6, 3
PARAMS = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=96)


def tree_rollout(engine, tokenizer, seed=0, **cfg):
    # α = 0.9 so that the few tool results of a tiny model still give branches to check
    config = TreeConfig(**{"initial_rollouts": N, "branch_probability": 0.9, **cfg})
    t = TreeRollout(engine, config, budget=M)
    return run(
        t.arollout(make_env_factory(tokenizer), PARAMS, n_prompts=3, max_response_tokens=96, seed=seed)
    )


def check_tree(res, m=M):
    trajs = res.trajectories
    assert len(trajs) == len(res.prompts) * m
    by_key = {(t.group_id, t.traj_id): (t, p) for t, p in zip(trajs, res.branches, strict=True)}
    assert len(by_key) == len(trajs)
    for g in {t.group_id for t in trajs}:
        group = [t for t in trajs if t.group_id == g]
        assert len(group) == m and len({t.task_id for t in group}) == 1
        assert len({tuple(t.prompt_ids) for t in group}) == 1
    forks = 0
    for t, branch in zip(trajs, res.branches, strict=True):
        t.validate()
        assert branch.env.get_state().done  # every episode ran to its end
        if t.parent_id is None:
            assert t.branch_offset is None and t.lineage["depth"] == 0
            continue
        forks += 1
        parent, pbranch = by_key[(t.group_id, t.parent_id)]
        b = t.branch_offset
        # the prefix (ids, mask, rollout log-probs) up to and including the tool result is the parent's
        assert t.response_ids[:b] == parent.response_ids[:b]
        assert t.loss_mask[:b] == parent.loss_mask[:b]
        assert t.logprobs[:b] == parent.logprobs[:b]
        assert b in parent.segment_starts and parent.loss_mask[b - 1] == 0  # right after a result
        # the env state at the branch point is the parent's: the same episode segments up to there
        n_env = 2 * sum(1 for s in parent.segment_starts if s < b)
        assert branch.env.get_state().segments[:n_env] == pbranch.env.get_state().segments[:n_env]
        n_seg = n_env // 2  # and the entropies of the shared segments, H_init included
        assert t.lineage["segment_entropy"][:n_seg] == parent.lineage["segment_entropy"][:n_seg]
        assert t.lineage["h_init"] == parent.lineage["h_init"]
        assert t.lineage["depth"] == parent.lineage["depth"] + 1
        assert t.lineage["root_id"] == parent.lineage["root_id"]
        assert t.lineage["kind"] == "fork"
    return forks


@pytest.mark.slow
def test_invariants_on_tiny_model_rollouts(hf_engine, tokenizer):
    res = tree_rollout(hf_engine, tokenizer)
    forks = check_tree(res)
    assert forks >= 1, "the warmed-up tiny model made no branch; the invariants were not exercised"
    assert forks == sum(p.forks for p in res.prompts)
    assert all(p.tool_calls >= 1 for p in res.prompts)
    m = res.metrics()
    assert m["rollout/forks_per_prompt"] == pytest.approx(forks / 3)


@pytest.mark.slow
def test_no_state_leaks_between_calls(hf_engine, tokenizer):
    # same seed, with an unrelated call in between: identical trees (docs/algorithms.md D1)
    first = tree_rollout(hf_engine, tokenizer, seed=11)
    tree_rollout(hf_engine, tokenizer, seed=12, branch_probability=1.0)
    again = tree_rollout(hf_engine, tokenizer, seed=11)

    def key(r):
        return [(t.traj_id, t.parent_id, t.branch_offset, t.response_ids, t.reward) for t in r.trajectories]

    assert key(first) == key(again)
    assert [p.delta_h for p in first.prompts] == [p.delta_h for p in again.prompts]


def test_no_branching_in_evaluation(hf_engine, tokenizer):
    t = TreeRollout(
        hf_engine, TreeConfig(initial_rollouts=N, branch_probability=1.0, entropy_weight=0.0), budget=M
    )
    res = run(
        t.arollout(
            make_env_factory(tokenizer),
            PARAMS,
            n_prompts=2,
            max_response_tokens=96,
            evaluate=True,
            eval_group_size=2,
        )
    )
    greedy = run(
        t.arollout(
            make_env_factory(tokenizer), PARAMS.with_(temperature=0.0), n_prompts=2, max_response_tokens=96
        )
    )
    for r, size in ((res, 2), (greedy, 1)):
        assert len(r.trajectories) == 2 * size
        assert all(tr.parent_id is None for tr in r.trajectories)
        assert sum(p.forks + p.topups for p in r.prompts) == 0


@pytest.mark.slow
def test_aepo_premonitoring_and_penalty_on_tiny_model(hf_engine, tokenizer):
    res = tree_rollout(hf_engine, tokenizer, enable_dynamic_rollouts=True, enable_consecutive_penalty=True)
    check_tree(res)
    for st in res.prompts:
        assert st.h_root is not None and st.h_tool is not None
        assert 1 <= st.initial <= M and st.overhead_tokens > 0
    reuse = tree_rollout(hf_engine, tokenizer, enable_dynamic_rollouts=True, reuse_probe=True)
    check_tree(reuse)


@pytest.mark.slow
def test_invariants_with_vllm_engine_and_prefix_cache(tiny_model_path, tokenizer, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from algorithms.rollout.vllm import VLLMEngine

    engine = VLLMEngine(str(tiny_model_path), dtype="float32", max_model_len=512, seed=0)
    try:
        res = tree_rollout(engine, tokenizer, seed=5)
        assert check_tree(res) >= 1
        stats = engine.stats()
        # forks resubmit their parent's prefix: whole 16-token blocks come from the prefix cache
        assert stats.get("prefix_cache_hits", 0) > 0
    finally:
        del engine
