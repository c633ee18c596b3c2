"""Tree rollout decisions with chosen entropies (scripted engine, real runner and real ToolEnvs)."""

from __future__ import annotations

import math

import pytest
from arpo_helpers import ScriptedEngine, make_env_factory, run

from algorithms.rollout.engine import SamplingParams
from algorithms.rollout.tree import TreeRollout
from algorithms.rollout.tree_config import TreeConfig

K = 20  # entropy_tokens


def react_entropy(h_first: float, delta_h: float, vocab: int) -> float:
    """h after a tool result such that ΔH (scaled_mean over constant positions) equals delta_h."""
    return h_first + delta_h * math.log(vocab) / K


def tree(engine, vocab, *, n: int, **cfg) -> TreeRollout:
    return TreeRollout(engine, TreeConfig(**cfg), budget=n, vocab_size=vocab)


@pytest.mark.slow
def test_branch_frequency_matches_probability_over_10k_decisions(tokenizer):
    vocab = len(tokenizer.get_vocab())
    h0 = 0.2
    engine = ScriptedEngine(tokenizer, h0, react_entropy(h0, 1.0, vocab))  # ΔH = +1 → P = 0.7
    n_prompts, n_init, z = 4, 250, 11
    # M = N·Z: the budget can never stop a draw early, so every draw is an unconditioned Bernoulli
    t = tree(engine, vocab, n=n_init * z, initial_rollouts=n_init, beam_size=z)
    res = run(
        t.arollout(
            make_env_factory(tokenizer), SamplingParams(), n_prompts=n_prompts, max_response_tokens=64, seed=3
        )
    )
    decisions = sum(p.decisions for p in res.prompts)
    forks = sum(p.forks for p in res.prompts)
    assert decisions == n_prompts * n_init * (z - 1) >= 10_000
    assert all(d == pytest.approx(1.0) for p in res.prompts for d in p.delta_h)
    p = 0.7
    sigma = math.sqrt(p * (1 - p) / decisions)
    assert abs(forks / decisions - p) <= 3 * sigma, (forks / decisions, p, sigma)
    # exactly M per prompt: forks plus top-ups fill the budget, never duplicates
    assert len(res.trajectories) == n_prompts * n_init * z
    assert all(p.initial + p.forks + p.topups == n_init * z for p in res.prompts)


def test_decision_uses_the_reaction_to_that_result_and_answers_are_eligible(tokenizer):
    # ΔH = +3 after the first result (P = 1), −3 after the second (P = 0): every fork must start at
    # the first result; the reaction to the second result is the answer itself (EOS, docs/algorithms.md D6)
    vocab = len(tokenizer.get_vocab())
    h0 = 1.0
    hi, lo = react_entropy(h0, 3.0, vocab), react_entropy(h0, -3.0, vocab)
    engine = ScriptedEngine(tokenizer, h0, lambda n: hi if n == 1 else lo, calls_before_answer=2)
    t = tree(engine, vocab, n=10, initial_rollouts=2, beam_size=3)
    res = run(t.arollout(make_env_factory(tokenizer), SamplingParams(), n_prompts=1, max_response_tokens=96))
    forks = [tr for tr in res.trajectories if tr.parent_id is not None]
    # 2 sources x (Z − 1) = 4 forks at the first result, none at the second; 4 top-ups fill M = 10
    assert len(forks) == 4 and res.prompts[0].topups == 4
    for f in forks:
        parent = next(tr for tr in res.trajectories if tr.traj_id == f.parent_id)
        first_result_end = parent.segment_starts[1]
        assert f.branch_offset == first_result_end
        assert f.response_ids[: f.branch_offset] == parent.response_ids[: f.branch_offset]
    # per trajectory: H_init and the entropy after each result (scaled_mean, constant positions)
    log_v = math.log(vocab)
    for tr in res.trajectories:
        assert tr.lineage["h_init"] == pytest.approx(K * h0 / log_v)
        assert tr.lineage["segment_entropy"] == pytest.approx(
            [K * h0 / log_v, K * hi / log_v, K * lo / log_v]
        )
    # branch points: both sources at results 1 and 2, the four forks at result 2 (not at their birth)
    assert sorted(res.prompts[0].delta_h) == pytest.approx([-3.0] * 6 + [3.0] * 2)


def test_high_entropy_answers_right_after_a_result_still_branch(tokenizer):
    vocab = len(tokenizer.get_vocab())
    engine = ScriptedEngine(tokenizer, 0.1, react_entropy(0.1, 3.0, vocab), calls_before_answer=1)
    res = run(
        tree(engine, vocab, n=4, initial_rollouts=2).arollout(
            make_env_factory(tokenizer), SamplingParams(), n_prompts=1, max_response_tokens=64
        )
    )
    assert res.prompts[0].forks == 2 and all(tr.terminated for tr in res.trajectories)


@pytest.mark.parametrize("mode", ["all", "one"])
def test_topups_fill_the_budget_when_nothing_branches(tokenizer, mode):
    vocab = len(tokenizer.get_vocab())
    engine = ScriptedEngine(tokenizer, 1.0, react_entropy(1.0, -3.0, vocab))  # P = 0
    t = tree(engine, vocab, n=5, initial_rollouts=2, topup_mode=mode)
    res = run(t.arollout(make_env_factory(tokenizer), SamplingParams(), n_prompts=2, max_response_tokens=64))
    assert len(res.trajectories) == 10
    for i, st in enumerate(res.prompts):
        group = res.trajectories[5 * i : 5 * i + 5]
        assert st.forks == 0 and st.topups == 3
        assert [tr.lineage["kind"] for tr in group] == ["initial"] * 2 + ["topup"] * 3
        assert len({tr.traj_id for tr in group}) == 5 and all(tr.parent_id is None for tr in group)
    # top-ups start all at once, or one per iteration as in the reference (more engine rounds)
    assert engine.requests == 2 * 5 * 2
    assert engine.batches == (4 if mode == "all" else 8)


def _penalty_tree(tokenizer, rule: str):
    # threshold mode: fork iff (0.5 + 0.05)·max(0, 1 − 0.05·l) > 0.5, i.e. iff l ≤ 1
    vocab = len(tokenizer.get_vocab())
    engine = ScriptedEngine(tokenizer, 0.2, react_entropy(0.2, 0.25, vocab), calls_before_answer=3)
    t = tree(
        engine,
        vocab,
        n=50,
        initial_rollouts=1,
        branch_mode="threshold",
        branch_threshold=0.5,
        enable_consecutive_penalty=True,
        entropy_formula=rule,
    )
    res = run(t.arollout(make_env_factory(tokenizer), SamplingParams(), n_prompts=1, max_response_tokens=128))
    return [tr for tr in res.trajectories if tr.lineage["kind"] != "topup"]


def test_consecutive_penalty_is_counted_per_path(tokenizer):
    trajs = _penalty_tree(tokenizer, "ours")
    by_id = {tr.traj_id: tr for tr in trajs}
    root = trajs[0]
    results = root.segment_starts[1:]  # offsets right after results 1, 2, 3
    forks = [
        (by_id[tr.parent_id].lineage["kind"], tr.parent_id, tr.branch_offset, tr.lineage["depth"])
        for tr in trajs
        if tr.parent_id is not None
    ]
    # hand trace: the root forks at results 1 and 2 (l = 0, 1) and not at 3 (l = 2); its first
    # fork, born at result 1 with l = 1, forks once at result 2 and stops; the others are born at l = 2
    f1 = trajs[1].traj_id
    assert forks == [
        ("initial", root.traj_id, results[0], 1),
        ("initial", root.traj_id, results[1], 1),
        ("fork", f1, results[1], 2),
    ]


def test_reference_rule_counts_per_prompt(tokenizer):
    # the reference's per-prompt counter resets after an iteration without new branches, so later
    # branch points fork again where our per-branch counter would not: the trees differ
    ours = _penalty_tree(tokenizer, "ours")
    ref = _penalty_tree(tokenizer, "reference")
    assert len(ref) != len(ours)
