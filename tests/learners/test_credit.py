"""`advantage.credit`: tree credit on hand-built trees, turn credit and the bias it avoids
(verl#7244), the config rules, and `outcome` left exactly as it was."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from algorithms.arpo import ARPOConfig, hard_attribution
from algorithms.core.advantages import grpo_advantages, outcome_advantages
from algorithms.core.credit import credit_scale, tree_credit, turn_advantages, turn_credit
from algorithms.core.learner_config import AdvantageConfig, LearnerConfig
from algorithms.dapo import DAPOConfig


def hand_tree():
    """r: a root path (10 tokens); f1: fork of r at 4; f2: fork of f1 at 7; f3: fork of r at 4;
    t: a top-up from the prompt. Rewards 1, 0, 1, 0, 0 (group mean 0.4)."""
    keys = ["r", "f1", "f2", "f3", "t"]
    parents = [None, "r", "f1", "r", None]
    offsets = [0, 4, 7, 4, 0]
    lengths = [10, 9, 10, 6, 8]
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])
    return dict(keys=keys, parents=parents, offsets=offsets, lengths=lengths), rewards


def test_tree_credit_on_a_hand_built_tree():
    lineage, rewards = hand_tree()
    outcome = grpo_advantages(rewards, [0] * 5, scale_rewards="none")  # R − 0.4
    out = tree_credit(outcome, rewards, scale=torch.ones(5), **lineage)
    # nodes: r[0:4] shared by {r, f1, f2, f3}, V = 0.5 (before any branch: outcome only);
    # r[4:] V = 1 (+0.5); f1[4:7] shared by {f1, f2}, V = 0.5 (+0); f1[7:] V = 0 (−0.5);
    # f2[7:] V = 1 (+0.5); f3[4:] V = 0 (−0.5); t: no fork, outcome only
    a, b = 0.6, -0.4
    expected = torch.tensor([
        [a] * 4 + [a + 0.5] * 6,
        [b] * 4 + [b] * 3 + [b - 0.5] * 2 + [0.0],
        [a] * 4 + [a] * 3 + [a + 0.5] * 3,
        [b] * 4 + [b - 0.5] * 2 + [0.0] * 4,
        [b] * 8 + [0.0] * 2,
    ])  # fmt: skip
    assert torch.allclose(out, expected, atol=1e-6)
    # the node terms of the continuations of a branch point sum to 0 over the trajectories below it
    local = out - outcome[:, None]
    assert float(local[:4, 4].sum()) == pytest.approx(0.0, abs=1e-6)  # r's fork point at 4
    assert float(local[1:3, 7].sum()) == pytest.approx(0.0, abs=1e-6)  # f1's fork point at 7


def test_tree_credit_under_hard_attribution_is_treerl_global_plus_local():
    """Averaged over the sharers of a token (hard attribution), tree credit gives each node
    (V(n) − μ) + (V(n) − V(parent)): TreeRL's global and local advantages."""
    lineage, rewards = hand_tree()
    outcome = grpo_advantages(rewards, [0] * 5, scale_rewards="none")
    per_token = tree_credit(outcome, rewards, scale=torch.ones(5), **lineage)
    mask = torch.zeros(5, 10)
    for i, n in enumerate(lineage["lengths"]):
        mask[i, :n] = 1
    out, m = hard_attribution(per_token, keys=lineage["keys"], parents=lineage["parents"],
                              offsets=lineage["offsets"], mask=mask)  # fmt: skip
    mu = 0.4
    assert torch.allclose(out[:4, :4], torch.full((4, 4), 0.5 - mu))  # first node: global only
    assert float(out[0, 5]) == pytest.approx((1 - mu) + (1 - 0.5))
    assert torch.allclose(out[1:3, 4:7], torch.full((2, 3), 0.5 - mu + 0.0))
    assert float(out[1, 8]) == pytest.approx((0 - mu) + (0 - 0.5))
    assert float(out[3, 4]) == pytest.approx((0 - mu) + (0 - 0.5))
    assert m[1:4, :4].sum() == 0  # shared tokens still count once


def test_tree_credit_without_forks_is_the_outcome_and_scales_with_it():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5])
    groups = [3, 3, 3, 3, 8, 8]
    outcome = outcome_advantages(rewards, groups)
    scale = credit_scale(rewards, groups)
    out = tree_credit(outcome, rewards, keys=list(range(6)), parents=[None] * 6, offsets=[0] * 6,
                      lengths=[3] * 6, scale=scale)  # fmt: skip
    assert torch.equal(out, outcome[:, None].expand(6, 3))
    # the node terms are in the outcome's units: with group scaling, divided by σ_g + eps
    lineage, r = hand_tree()
    scaled = tree_credit(outcome_advantages(r, [0] * 5), r, scale=credit_scale(r, [0] * 5), **lineage)
    sigma = float(r.std()) + 1e-6
    assert float(scaled[0, 5]) == pytest.approx((1 - 0.4) / sigma + 0.5 / sigma, rel=1e-5)


def test_turn_advantages_hand_computed():
    # group 0: j0 took 3 turns (rewards 0, 0, 1), j1 one turn (1), j2 two turns (0, 0)
    adv = turn_advantages([[0.0, 0.0, 1.0], [1.0], [0.0, 0.0], [0.0]], [0, 0, 0, 1])
    assert adv[0] == pytest.approx([1 - 2 / 3, 1 - 0.5, 0.0])  # b_0 = 2/3, b_1 = (1 + 0)/2, b_2 = 1
    assert adv[1] == pytest.approx([1 - 2 / 3])
    assert adv[2] == pytest.approx([0 - 2 / 3, 0 - 0.5])
    assert adv[3] == [0.0]  # alone in its group
    loo = turn_advantages([[0.0, 0.0, 1.0], [1.0], [0.0, 0.0]], [0, 0, 0], leave_one_out=True)
    assert loo[0] == pytest.approx([1 - 0.5, 1 - 0.0, 0.0])  # alone at turn 2: no baseline, 0


def test_turn_credit_maps_turns_to_tokens():
    rewards = torch.tensor([1.0, 0.0, 0.0])
    out = turn_credit(rewards, [0, 0, 0], segment_starts=[[0, 3, 6], [0], [0, 4]], lengths=[8, 2, 5],
                      scale=torch.ones(3))  # fmt: skip
    b0, b1 = 1 / 3, 1 / 2  # every trajectory reached turn 0; j0 and j2 reached turn 1
    assert torch.allclose(out, torch.tensor([
        [1 - b0] * 3 + [1 - b1] * 3 + [0.0] * 2,
        [-b0] * 2 + [0.0] * 6,
        [-b0] * 4 + [-b1] + [0.0] * 3,
    ]))  # fmt: skip


def mt_grpo_turn_advantages(turn_rewards, group_ids):
    """The per-turn-index normalisation (MT-GRPO style, centred only): Â_k(j) = r_k(j) − mean over
    the group's trajectories that have a turn k of r_k, and turn k's advantage Σ_{k' ≥ k} Â_k'(j).
    Built here only to show its bias; the learners never use it."""
    sums, counts = {}, {}
    for g, rs in zip(group_ids, turn_rewards, strict=True):
        for k, r in enumerate(rs):
            sums[g, k] = sums.get((g, k), 0.0) + r
            counts[g, k] = counts.get((g, k), 0) + 1
    out = []
    for g, rs in zip(group_ids, turn_rewards, strict=True):
        hat = [r - sums[g, k] / counts[g, k] for k, r in enumerate(rs)]
        out.append([sum(hat[k:]) for k in range(len(hat))])
    return out


def continue_bonus(scheme, *, q_stop, q_continue, groups=6000, size=8, seed=0):
    """E[A_0 | continue] − E[A_0 | stop] over sampled groups: the advantage a scheme gives the
    decision, made in turn 0, to take another turn rather than answer.

    The policy answers at once with probability 1/2 (outcome ~ Bernoulli(q_stop)), or calls a
    tool, which pays an intermediate reward of 0.3, and answers in turn 1 (outcome ~
    Bernoulli(q_continue − 0.3)). The true advantage of continuing is q_continue − q_stop."""
    rng = np.random.default_rng(seed)
    cont = rng.random((groups, size)) < 0.5
    u = rng.random((groups, size))
    rewards, ids = [], []
    for g in range(groups):
        for i in range(size):
            if cont[g, i]:
                rewards.append([0.3, float(u[g, i] < q_continue - 0.3)])
            else:
                rewards.append([float(u[g, i] < q_stop)])
            ids.append(g)
    a0 = np.array([a[0] for a in scheme(rewards, ids)])
    c = cont.ravel()
    diff = a0[c].mean() - a0[~c].mean()
    se = np.sqrt(a0[c].var() / c.sum() + a0[~c].var() / (~c).sum())
    return diff, se


def test_turn_credit_puts_no_bonus_on_another_turn_where_per_index_normalisation_does():
    """verl#7244: with per-turn rewards normalised per turn index, the baseline subtracted from a
    trajectory has as many terms as it took turns, so the choice to continue gets a bonus (here a
    penalty) that no reward justifies. Our baseline per turn depends only on reaching the turn."""
    ours = turn_advantages
    # continuing is worth exactly as much as answering (0.3 + 0.3 = 0.6)
    diff, se = continue_bonus(ours, q_stop=0.6, q_continue=0.6)
    assert abs(diff) < 4 * se, (diff, se)
    mt_diff, mt_se = continue_bonus(mt_grpo_turn_advantages, q_stop=0.6, q_continue=0.6)
    assert mt_diff < -0.2 and abs(mt_diff) > 20 * mt_se, (mt_diff, mt_se)  # ≈ (1 − 1/G)(0.3 − E[R | stop])
    # and where continuing is truly better, ours sees it: (1 − 1/G)·0.1 (the group mean holds j)
    diff, se = continue_bonus(ours, q_stop=0.5, q_continue=0.6)
    assert abs(diff - 0.1 * 7 / 8) < 4 * se, (diff, se)


def test_credit_keys_and_their_rules():
    assert LearnerConfig().advantage == AdvantageConfig(credit="outcome")
    LearnerConfig(advantage=AdvantageConfig(credit="turn")).validate()
    DAPOConfig(advantage=AdvantageConfig(credit="turn")).validate()
    ARPOConfig(advantage=AdvantageConfig(credit="tree")).validate()
    with pytest.raises(ValueError, match="advantage.credit.*tree needs tree rollouts"):
        LearnerConfig(advantage=AdvantageConfig(credit="tree")).validate()
    with pytest.raises(ValueError, match="advantage.credit.*turn is for flat groups"):
        ARPOConfig(advantage=AdvantageConfig(credit="turn")).validate()
    with pytest.raises(ValueError, match="advantage.credit"):
        dataclasses.replace(LearnerConfig(), advantage=AdvantageConfig(credit="steps")).validate()


class VariedRewards:
    """Distinct rewards per trajectory (the warmed-up tiny model fails the format nearly everywhere,
    which would make every advantage 0 and hide the arithmetic checked here)."""

    def shape_rewards(self, trajectories):
        return torch.tensor([float(len(t.response_ids) % 5) for t in trajectories])


def small_config(cls, tmp_path, **changes):
    from algorithms.models.tiny import build_tiny_model

    return cls(model=str(build_tiny_model(warmup_steps=150)), output_dir=str(tmp_path), total_steps=1,
               prompts_per_step=2, group_size=4, max_response_tokens=64, micro_batch_size=4, lr=1e-3,
               progress=False, tensorboard=False, export_model=False, threads=1, **changes)  # fmt: skip


@pytest.mark.slow
def test_tree_credit_in_the_arpo_loop(tmp_path):
    """A real tree rollout (AgentMath-v0, the tiny model, a fork at every tool result): the learner's
    advantages are tree credit's, then averaged over sharers by hard attribution, and one step trains."""
    from algorithms.arpo import ARPOLearner
    from algorithms.core.batch import RolloutBatch
    from algorithms.core.learner import Learner
    from algorithms.rollout.tree_config import TreeConfig

    class Varied(VariedRewards, ARPOLearner):
        pass

    cfg = small_config(ARPOConfig, tmp_path, advantage=AdvantageConfig(credit="tree"), advantage_attribution="hard",
                       tree=TreeConfig(initial_rollouts=2, branch_probability=1.0))  # fmt: skip
    learner = Varied(cfg)
    trajs, _ = learner.collect(0)
    assert any(t.parent_id is not None for t in trajs), "no fork: tree credit was not exercised"
    batch = RolloutBatch.from_trajectories(trajs, learner.shape_rewards(trajs))
    adv, mask = learner.compute_advantages(batch)
    outcome = outcome_advantages(batch.rewards, batch.group_ids)
    lineage = dict(keys=[(t.group_id, t.traj_id) for t in trajs],
                   parents=[None if t.parent_id is None else (t.group_id, t.parent_id) for t in trajs],
                   offsets=[t.branch_offset or 0 for t in trajs])  # fmt: skip
    per_token = tree_credit(outcome, batch.rewards, lengths=[len(t.response_ids) for t in trajs],
                            scale=credit_scale(batch.rewards, batch.group_ids), **lineage)  # fmt: skip
    expected, expected_mask = hard_attribution(per_token, mask=batch.loss_mask, **lineage)
    assert torch.allclose(adv, expected) and torch.equal(mask, expected_mask)
    soft, _ = Learner.compute_advantages(learner, batch)
    assert not torch.allclose(soft, outcome[:, None].expand_as(soft))  # the node terms are there
    metrics = learner.train_step()
    assert metrics["grad_norm"] > 0


@pytest.mark.slow
def test_turn_credit_in_the_grpo_loop_and_outcome_unchanged(tmp_path):
    """GRPO with `credit: turn` gives turn credit's per-token advantages; the default `outcome`
    gives exactly `outcome_advantages`, one per trajectory."""
    from algorithms.core.batch import RolloutBatch
    from algorithms.grpo import GRPOConfig, GRPOLearner

    class Varied(VariedRewards, GRPOLearner):
        pass

    learner = Varied(small_config(GRPOConfig, tmp_path, advantage=AdvantageConfig(credit="turn")))
    trajs, _ = learner.collect(0)
    assert any(len(t.segment_starts) > 1 for t in trajs), "no second turn: turn credit was not exercised"
    batch = RolloutBatch.from_trajectories(trajs, learner.shape_rewards(trajs))
    adv, mask = learner.compute_advantages(batch)
    expected = turn_credit(batch.rewards, batch.group_ids.tolist(), segment_starts=[t.segment_starts for t in trajs],
                           lengths=[len(t.response_ids) for t in trajs], scale=credit_scale(batch.rewards, batch.group_ids))
    assert adv.shape == mask.shape and torch.equal(adv, expected[:, : mask.shape[1]])
    first = torch.tensor([float(adv[i, 0]) for i in range(len(trajs))])
    assert torch.allclose(first, outcome_advantages(batch.rewards, batch.group_ids))  # turn 0 is GRPO's
    learner.config.advantage = AdvantageConfig()
    adv, _ = learner.compute_advantages(batch)
    assert torch.equal(adv, outcome_advantages(batch.rewards, batch.group_ids))
