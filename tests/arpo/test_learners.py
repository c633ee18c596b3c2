"""ARPO/AEPO learners on the tiny model: hooks, hard attribution in the loop, AEPO's entropy-aware
advantage (active with entropy_coeff = 0, mini-batch statistics), and `agent-envs train`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from arpo_helpers import make_env_factory

from algorithms.aepo import AEPOConfig, AEPOLearner, aepo_tree, entropy_stats
from algorithms.arpo import ARPOConfig, ARPOLearner, hard_attribution
from algorithms.core.batch import MicroBatch, RolloutBatch
from algorithms.core.learner import Learner
from algorithms.core.losses import LossConfig
from algorithms.rollout.tree_config import TreeConfig

REPO = Path(__file__).resolve().parents[2]
SMALL = dict(
    total_steps=1,
    prompts_per_step=2,
    group_size=4,
    max_response_tokens=64,
    micro_batch_size=3,
    lr=1e-4,
    progress=False,
    tensorboard=False,
    export_model=False,
    threads=1,
    eval_episodes=0,  # 8 hand-written tasks (arpo_helpers.math_tasks): too few to hold any out
)
SMALL_TREE = dict(initial_rollouts=2, branch_probability=0.9)


def aepo_small_tree() -> TreeConfig:
    return dataclasses.replace(aepo_tree(), **SMALL_TREE)


class VariedRewards:
    """Distinct rewards per trajectory so that advantages are not all zero (the untrained tiny
    model gets the same reward nearly everywhere, which would hide the advantage arithmetic)."""

    def shape_rewards(self, trajectories):
        return torch.tensor([float(len(t.response_ids) % 5) for t in trajectories])


class ARPOVaried(VariedRewards, ARPOLearner):
    pass


class AEPOVaried(VariedRewards, AEPOLearner):
    pass


@pytest.mark.slow
def test_arpo_hard_attribution_in_the_loop(tiny_model_path, tokenizer, tmp_path):
    # room for a tool call and its result, and a fork at every result while the budget M lasts
    cfg = ARPOConfig(
        model=str(tiny_model_path),
        output_dir=str(tmp_path),
        advantage_attribution="hard",
        tree=TreeConfig(**{**SMALL_TREE, "branch_probability": 1.0}),
        **{**SMALL, "max_response_tokens": 96},
    )
    learner = ARPOVaried(cfg, env_factory=make_env_factory(tokenizer))
    trajs, metrics = learner.collect(0)
    forks = [t for t in trajs if t.parent_id is not None]
    # without a fork, hard attribution equals soft and nothing below would be checked
    assert forks, "no fork in the rollouts: the hard-attribution checks below were not exercised"
    assert len(trajs) == 2 * 4 and metrics["rollout/forks_per_prompt"] == len(forks) / 2
    batch = RolloutBatch.from_trajectories(trajs, learner.shape_rewards(trajs))
    adv, mask = learner.compute_advantages(batch)
    soft = Learner.compute_advantages(learner, batch)[0]  # the core's GRPO advantages
    ref_adv, ref_mask = hard_attribution(
        soft,
        keys=[(t.group_id, t.traj_id) for t in trajs],
        parents=[None if t.parent_id is None else (t.group_id, t.parent_id) for t in trajs],
        offsets=[t.branch_offset or 0 for t in trajs],
        mask=batch.loss_mask,
    )
    assert torch.equal(adv, ref_adv) and torch.equal(mask, ref_mask)
    for i, t in enumerate(trajs):  # a fork's shared prefix is trained once, in its ancestor
        if t.parent_id is not None:
            assert t.branch_offset > 0 and batch.loss_mask[i, : t.branch_offset].sum() > 0
            assert mask[i, : t.branch_offset].sum() == 0
    metrics = learner.train_step()
    assert torch.isfinite(torch.tensor(metrics["pg_loss"]))


def test_aepo_entropy_advantage_is_active_with_zero_entropy_coeff(tiny_model_path, tokenizer, tmp_path):
    cfg = AEPOConfig(
        model=str(tiny_model_path),
        output_dir=str(tmp_path),
        entropy_coeff=0.0,
        log_entropy=False,
        tree=aepo_small_tree(),
        **SMALL,
    )
    learner = AEPOVaried(cfg, env_factory=make_env_factory(tokenizer))
    assert learner.needs_entropy()  # the feature alone turns the entropy on (docs/algorithms.md D9)
    assert LossConfig.of(learner.config).policy_loss == "ppo_clip_gradpreserve"  # AEPO's default
    seen = []
    original = learner.adjust_advantages

    def spy(batch, micro, advantages, extras, minibatch_stats=None):
        out = original(batch, micro, advantages, extras, minibatch_stats)
        seen.append(
            (batch, micro, advantages.detach().clone(), extras["entropy"].clone(), out.detach().clone())
        )
        return out

    learner.adjust_advantages = spy
    learner.train_step()
    assert len(seen) >= 2  # several micro-batches in the mini-batch
    batch = seen[0][0]
    rows = sorted({r for _, micro, *_ in seen for r in micro.rows})
    # μ, σ over the whole mini-batch (one pass over every row), not per micro-batch (docs/algorithms.md D10)
    ent = torch.zeros_like(batch.loss_mask)
    for _, micro, _, h, _ in seen:
        ent[micro.rows, : micro.width] = h
    mean, std = entropy_stats(ent[rows], batch.loss_mask[rows])
    changed = False
    for _, micro, adv_in, h, out in seen:
        mask = batch.loss_mask[micro.rows, : micro.width]
        adv = adv_in.unsqueeze(-1) if adv_in.dim() == 1 else adv_in
        want = adv * (1 + 0.2 * (h - mean) / std)
        assert torch.allclose(out * mask, want * mask, atol=1e-5)
        changed |= bool(((out - adv).abs() * mask).sum() > 1e-6)
        local = entropy_stats(h, mask)
        assert local != pytest.approx((mean, std))  # a micro-batch's own statistics differ
    assert changed, "the entropy-aware advantage changed nothing"


@pytest.mark.parametrize(
    ("h_first", "h_react", "dynamic", "initial"),
    [
        # H = K·h/ln|V| per segment (scaled_mean, K = 20, |V| = 528): h 2.0 → 6.381, h 0.1 → 0.319.
        # H_root is the first segment's, H̄_tool the probe's mean over its two segments, and
        # m = ⌊M·σ(β·(H_root − H̄_tool))⌋ + 1 with M = 8, β = 0.5 (docs/algorithms.md §7.2):
        (2.0, 0.1, True, 7),  # ΔH = +3.031: σ = 0.820, m = ⌊6.56⌋ + 1 = 7
        (0.1, 2.0, True, 2),  # ΔH = −3.031: σ = 0.180, m = ⌊1.44⌋ + 1 = 2
        (2.0, 0.1, False, 4),  # pre-monitoring off: N = initial_rollouts
    ],
)
def test_aepo_premonitoring_sets_the_initial_paths(tokenizer, tiny_model_path, tmp_path, h_first, h_react, dynamic,
                                                   initial):  # fmt: skip
    from arpo_helpers import ScriptedEngine

    assert len(tokenizer.get_vocab()) == 528  # the hand computation above assumes it
    engine = ScriptedEngine(tokenizer, h_first, h_react)
    tree = dataclasses.replace(aepo_tree(), initial_rollouts=4, enable_dynamic_rollouts=dynamic)
    cfg = AEPOConfig(model=str(tiny_model_path), output_dir=str(tmp_path), tree=tree,
                     **{**SMALL, "group_size": 8})  # fmt: skip
    learner = AEPOLearner(cfg, engine=engine, env_factory=make_env_factory(tokenizer))
    trajs, metrics = learner.collect(0)
    assert len(trajs) == 2 * 8
    for g in {t.group_id for t in trajs}:
        kinds = [t.lineage["kind"] for t in trajs if t.group_id == g]
        assert kinds.count("initial") == initial, kinds
    # the root-entropy sample and the probe are spent only with pre-monitoring on
    assert (metrics["rollout/overhead_tokens_per_prompt"] > 0) == dynamic


def test_aepo_stats_do_not_depend_on_micro_batching(tiny_model_path, tokenizer, tmp_path):
    cfg = AEPOConfig(model=str(tiny_model_path), output_dir=str(tmp_path), tree=aepo_small_tree(), **SMALL)
    learner = AEPOVaried(cfg, env_factory=make_env_factory(tokenizer))
    trajs, _ = learner.collect(0)
    batch = RolloutBatch.from_trajectories(trajs, learner.shape_rewards(trajs))
    rows = list(range(len(trajs)))
    stats = []
    for size in (1, 3, 8):
        learner.config.micro_batch_size = size
        stats.append(learner.prepare_minibatch(batch, rows))
    assert stats[0] == pytest.approx(stats[1]) and stats[1] == pytest.approx(stats[2])
    # and the learner raises rather than skipping the feature when entropy is missing
    with pytest.raises(RuntimeError, match="no entropy"):
        learner.adjust_advantages(
            batch, MicroBatch(rows[:2], 4), torch.zeros(2), {"logprobs": torch.zeros(2, 4)}
        )


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["arpo", "aepo"])
def test_cli_train(algo, tiny_model_path, tmp_path):
    out = tmp_path / algo
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    cmd = [
        sys.executable, "-m", "agent_envs.cli", "train", "--algo", algo,
        "--config", str(REPO / "configs" / f"{algo}_tiny.yaml"),
        f"model={tiny_model_path}", f"output_dir={out}", "total_steps=1", "prompts_per_step=1",
        "group_size=4", "tree.initial_rollouts=2", "max_response_tokens=48", "progress=false",
        "tensorboard=false", "export_model=false", "save_every=0",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"[{algo}] resolved config" in proc.stdout
    # a paragraph a reader can scan: every line of the config short, the keys all there
    lines = proc.stdout.split(f"[{algo}] resolved config:\n", 1)[1].splitlines()
    config = "".join(line for line in lines if line.startswith("  "))
    assert all(len(line) <= 100 for line in lines if line.startswith("  ")) and "max_response_tokens=48" in config
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert rows and rows[-1]["num_trajectories"] == 4
    assert "rollout/forks_per_prompt" in rows[-1]
