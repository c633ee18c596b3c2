"""Asynchronous training (`max_staleness`): real rollouts of the session's SFT'd tiny model.

The staleness bound is checked on the saved trajectories themselves: `step_N.jsonl` holds the
batch trained at version N-1, and each trajectory records the version of every segment.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from learner_support import SYSTEM_PROMPT

from algorithms.cli import learner_class
from algorithms.core.async_rollout import VersionedEngine, async_engine
from algorithms.core.learner import Learner
from algorithms.core.learner_config import LearnerConfig
from algorithms.rollout.trajectory import read_jsonl

# the untrained tiny model makes no tool calls; the learner rightly warns (docs/algorithms.md D23)
pytestmark = pytest.mark.filterwarnings("ignore:no tool calls")
# metrics fixed by the sampled tokens and rewards alone
SAMPLED = ("reward", "env_reward", "response_length", "total_length", "tool_calls", "num_trajectories",
           "accuracy", "format_ok", "truncation_rate", "advantage")  # fmt: skip
TIMING = ("time_", "health/time_ms", "async/wait_s", "async/sync_s", "async/generate_s", "async/overlap_s")
# engine-vs-trainer log-prob gaps of ~1e-6: float noise of batch composition, not a behaviour
NOISE = ("health/logprob",)


def _cfg(cls, model: str, out, **kw):
    base = dict(model=model, env="AgentMath-v0", env_kwargs={"system_prompt": SYSTEM_PROMPT}, output_dir=str(out),
                total_steps=3, prompts_per_step=2, group_size=4, max_response_tokens=96, lr=1e-3,
                rollout_is="tis", threads=1, progress=False, tensorboard=False, export_model=False,
                save_trajectories=True)  # fmt: skip
    base.update(kw)
    return cls(**base)


def _trained_batches(out) -> dict[int, list]:
    """Trajectories by the policy version they were trained at."""
    return {int(p.stem.split("_")[1]) - 1: read_jsonl(p) for p in sorted((out / "trajectories").glob("*.jsonl"))}


def _untimed(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(TIMING + NOISE)}


@pytest.mark.parametrize("algo", ["grpo", "dapo", "arpo", "aepo"])
def test_async_trains_within_the_staleness_bound(tmp_path, sft_run, algo):
    cls = learner_class(algo)
    kw = {"max_staleness": 1, "total_steps": 2}
    if algo in ("arpo", "aepo"):
        kw["tree"] = dataclasses.replace(cls.config_class().tree, initial_rollouts=2)
    if algo == "dapo":
        kw.update(warmup_steps=0, max_num_gen_batches=0)
    learner = cls(_cfg(cls.config_class, sft_run["model"], tmp_path, **kw))
    # the HF engine decodes with its own copy: generating never reads weights mid-update
    assert isinstance(learner.engine, VersionedEngine)
    assert learner.engine.model is not learner.accelerator.unwrap_model(learner.model)
    history = learner.train()

    assert [m["step"] for m in history] == [1, 2]
    for m in history:
        assert math.isfinite(m["pg_loss"]) and "reward_mean" in m
        assert 0 <= m["async/staleness_mean"] <= m["async/staleness_max"] <= 1
        assert {"is_ratio/mean", "async/dropped", "async/overlap_s"} <= set(m)
    # the engine times each sync: the first batch follows none of this run's, the second one does
    assert history[0]["async/sync_s"] == 0.0 < history[1]["async/sync_s"]
    batches = _trained_batches(tmp_path)
    assert sorted(batches) == [0, 1]
    ages = []
    for version, trajs in batches.items():
        for t in trajs:
            assert len(t.policy_version) == len(t.segment_starts) > 0
            assert version - 1 <= min(t.policy_version) and max(t.policy_version) <= version
            ages.append(version - min(t.policy_version))
        if algo in ("arpo", "aepo"):  # a tree is generated under one version
            for g in {t.group_id for t in trajs}:
                assert len({v for t in trajs if t.group_id == g for v in t.policy_version}) == 1
    # generation ran ahead of the update: some trained tokens are one version old, and the
    # correction saw a policy that differs from the behaviour one
    assert max(ages) == 1
    assert any(abs(m["is_ratio/mean"] - 1) > 1e-4 for m in history[1:])


def test_staleness_zero_is_the_synchronous_loop_and_the_first_async_step_equals_it(tmp_path, sft_run):
    """Same samples, so the same rewards, lengths and advantages, exactly. The losses match to
    float noise only: the engine's behaviour log-probs (TIS weights, `is_ratio/*`) depend on
    which requests the runner batched together, which tool-call timing decides, in any loop."""

    def first_step(name, **kw):
        cfg = _cfg(LearnerConfig, sft_run["model"], tmp_path / name, total_steps=1, **kw)
        learner = Learner(cfg)
        [metrics] = learner.train()
        return learner, _untimed(metrics)

    def sampled(metrics):
        return {k: v for k, v in metrics.items() if k.startswith(SAMPLED)}

    sync, m_sync = first_step("default")
    zero, m_zero = first_step("zero", max_staleness=0)
    assert not isinstance(zero.engine, VersionedEngine) and zero.engine.model is zero.model
    assert sampled(m_zero) == sampled(m_sync) and len(sampled(m_sync)) >= 10
    assert m_zero == pytest.approx(m_sync, rel=1e-5, abs=1e-7)
    # step 0's batch comes from version 0 in both loops: same samples, same update
    _, m_async = first_step("async", max_staleness=1)
    assert m_async["async/staleness_max"] == 0.0
    m_async = {k: v for k, v in m_async.items() if not k.startswith("async/")}
    assert sampled(m_async) == sampled(m_sync)
    assert m_async == pytest.approx(m_sync, rel=1e-5, abs=1e-7)


def test_a_sync_lands_between_engine_calls_and_later_segments_carry_the_new_version(sft_run):
    """`continue`: an episode in flight at a sync goes on under the new weights. Driven by hand
    (one segment, sync, the rest) so that the sync lands mid-episode every time."""
    import asyncio

    import gymnasium as gym

    import agent_envs  # noqa: F401
    from algorithms.rollout.engine import SamplingParams
    from algorithms.rollout.hf import HFEngine
    from algorithms.rollout.runner import generate_segments, run_branches, start_group, step_branches

    base = HFEngine(sft_run["model"])
    engine = VersionedEngine(base)
    env = gym.make("AgentMath-v0", tokenizer=base.tokenizer, system_prompt=SYSTEM_PROMPT).unwrapped
    branches = start_group(env, base.tokenizer, 0, 4, 0, seed=0, options={"index": 0})
    params = SamplingParams(seed=0)

    async def episode():
        segs = await generate_segments(engine, branches, params, 96)
        await step_branches(branches, segs, base.tokenizer, 96)
        other = copy.deepcopy(base.model)
        with torch.no_grad():
            for p in other.parameters():
                p.mul_(0.5)
        engine.sync_weights(other)  # version 1
        await run_branches(engine, branches, params, 96)

    asyncio.run(episode())
    trajs = [p.to_trajectory() for p in branches]
    continued = [t for t in trajs if len(t.segment_starts) > 1]
    assert continued, "no episode made a tool call, so none was in flight at the sync"
    for t in trajs:
        t.validate()
        assert t.policy_version == [0] + [1] * (len(t.segment_starts) - 1)
    assert engine.version == 1


@pytest.mark.parametrize("mode", ["continue", "drop"])
def test_partial_rollouts_continue_or_drop(tmp_path, sft_run, mode):
    """Generation (96 tokens, one token per forward) outlasts the update (one forward and backward),
    so the sync after each step lands while the next batch is in flight."""
    learner = Learner(_cfg(LearnerConfig, sft_run["model"], tmp_path, max_staleness=1,
                           partial_rollouts=mode, group_size=8))
    history = learner.train()
    batches = _trained_batches(tmp_path)
    mixed = [t for trajs in batches.values() for t in trajs if len(set(t.policy_version)) > 1]
    if mode == "continue":
        assert mixed and sum(m["async/partial"] for m in history) == len(mixed)
        assert sum(m["async/dropped"] for m in history) == 0
    else:
        assert not mixed and sum(m["async/partial"] for m in history) == 0
        assert sum(m["async/dropped"] for m in history) > 0
        for m in history:  # dropped groups are whole groups: the rest are trained
            assert m["num_trajectories"] % 8 == 0 and m["num_trajectories"] > 0


def test_async_config_and_engine_checks(tmp_path):
    with pytest.raises(ValueError, match="'rollout_is'.*set rollout_is: tis"):
        LearnerConfig(max_staleness=1).validate()
    with pytest.raises(ValueError, match="'max_staleness'"):
        LearnerConfig(max_staleness=-1).validate()
    # a synchronous learner's HF engine decodes with its module: async refuses such an engine
    learner = Learner(_cfg(LearnerConfig, "tiny", tmp_path))
    assert learner.engine.model is learner.model
    learner.config.max_staleness = 1
    with pytest.raises(ValueError, match="decodes with the learner's own module"):
        async_engine(learner.engine, policy=learner.model, world=1, max_staleness=1, version=0)


@pytest.mark.slow
def test_checkpoints_hold_the_draw_position_of_the_step_trained(tmp_path):
    """The producer draws prompts ahead of the learner; a checkpoint must not: resuming an async
    run from step 1 trains step 2 on the prompts the uninterrupted run trained it on."""
    import json

    def run(name, resume=None, **kw):
        cfg = _cfg(LearnerConfig, "tiny", tmp_path / name, max_response_tokens=16, group_size=2,
                   total_steps=2, save_every=1, keep_checkpoints=5, **kw)  # fmt: skip
        Learner(cfg).train(resume=resume)
        return tmp_path / name

    def samplers(out):
        return [json.loads((d / "learner_state.json").read_text())["sampler"]
                for d in sorted((out / "checkpoints").iterdir())]  # fmt: skip

    def step2_prompts(out):
        return [t.prompt_ids for t in read_jsonl(out / "trajectories" / "step_000002.jsonl")]

    sync, full = run("sync"), run("async", max_staleness=1)
    assert samplers(full) == samplers(sync)
    before = step2_prompts(full)
    resumed = run("async", resume=str(full / "checkpoints" / "step_00000001"), max_staleness=1)
    assert step2_prompts(resumed) == before
