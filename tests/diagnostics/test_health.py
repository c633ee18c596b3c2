"""The rollout health checks on real rollouts of the warmed tiny model: clean rollouts pass every
check, and each injected fault (shifted mask, re-tokenized ids, unflagged truncation, reward out
of range) is caught and named with its trajectory, task and token index."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import re
import time

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401  (registers the ids)
from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT, build_tiny_model
from algorithms.rollout.engine import SamplingParams
from algorithms.rollout.health import (
    FAULTS,
    HealthChecker,
    RecordedEngine,
    RolloutHealthError,
    RolloutHealthWarning,
)
from algorithms.rollout.runner import run_episodes

BUDGET = 80  # tokens: some episodes answer after a tool call, some are cut by the budget


@pytest.fixture(scope="module")
def rollout():
    import torch

    from algorithms.rollout.hf import HFEngine

    torch.set_num_threads(1)
    engine = RecordedEngine(HFEngine(build_tiny_model(seed=0, warmup_steps=150), seed=0))

    def make_env():
        return gym.make("AgentMath-v0", tokenizer=engine.tokenizer, system_prompt=WARMUP_SYSTEM_PROMPT,
                        max_response_tokens=BUDGET).unwrapped

    trajs = asyncio.run(run_episodes(engine, make_env, SamplingParams(temperature=1.0, seed=0), n_prompts=6,
                                     group_size=4, max_response_tokens=BUDGET))
    checker = HealthChecker.for_env(make_env(), mode="warn", engine=engine, tokenizer=engine.tokenizer,
                                    max_response_tokens=BUDGET)
    return engine, trajs, checker


def fresh(trajs):
    return [copy.deepcopy(t) for t in trajs]


def with_tool_result(trajs):
    """A trajectory with an env-inserted span (mask 0) between two generated segments."""
    return next(t for t in trajs if len(t.segment_starts) >= 2 and 0 in t.loss_mask)


def expect(checker, trajs, check, t, index=None):
    report = checker.check(trajs)
    assert report.counts[check] == 1, report.counts
    assert check in t.health
    where = re.escape(f"trajectory {t.traj_id} (task '{t.task_id}') at response token ")
    where += str(index) if index is not None else r"\d+"
    with pytest.warns(RolloutHealthWarning, match=where):
        checker.raise_or_warn(report.faults)
    return report


def test_clean_rollouts_pass_every_check(rollout):
    engine, trajs, checker = rollout
    # the sample covers what the checks are about: tool results, truncations, answers
    assert any(0 in t.loss_mask for t in trajs)
    assert any(t.truncated and t.end_reason == "response_budget" for t in trajs)
    assert any(t.truncated and t.end_reason == "length" for t in trajs)
    assert any(t.terminated for t in trajs)
    assert checker.reward_bounds == (-1.0, 1.0) and checker.format_failure_reward == -1.0
    trajs = fresh(trajs)
    report = checker.check(trajs)
    assert {c: report.counts[c] for c in FAULTS} == dict.fromkeys(FAULTS, 0), report.first
    assert all(not set(t.health) & set(FAULTS) for t in trajs)
    dataclasses.replace(checker, mode="fatal").raise_or_warn(report.faults)  # nothing to raise


def test_shifted_mask(rollout):
    _, trajs, checker = rollout
    trajs = fresh(trajs)
    t = with_tool_result(trajs)
    t.loss_mask = [0] + t.loss_mask[:-1]  # one token late: the first generated token is not trained
    expect(checker, trajs, "loss_mask", t, index=0)
    # without the engine's record the segment starts still give it away
    bare = HealthChecker(max_response_tokens=BUDGET)
    assert bare.check([t]).counts["loss_mask"] == 1


def test_a_tool_result_token_with_mask_one(rollout):
    _, trajs, checker = rollout
    trajs = fresh(trajs)
    t = with_tool_result(trajs)
    first_obs = t.loss_mask.index(0)
    t.loss_mask[first_obs + 1] = 1
    report = expect(checker, trajs, "loss_mask", t, index=first_obs + 1)
    assert "env-inserted" in report.first["loss_mask"].detail


def test_retokenized_ids(rollout):
    engine, trajs, checker = rollout
    tok = engine.tokenizer
    trajs = fresh(trajs)

    def reencode(ids):
        return tok(tok.decode(ids), add_special_tokens=False)["input_ids"]

    # a pipeline that keeps text and re-encodes each generated segment (mask and log-probs
    # rebuilt to fit): ids change where the engine sampled a non-canonical tokenization
    def retokenized(t):
        ends = t.segment_starts[1:] + [len(t.response_ids)]
        ids, mask, lps, starts = [], [], [], []
        for s, e in zip(t.segment_starts, ends, strict=True):
            gen = s + t.loss_mask[s:e].count(1)
            new = reencode(t.response_ids[s:gen])
            starts.append(len(ids))
            ids += new + t.response_ids[gen:e]
            mask += [1] * len(new) + [0] * (e - gen)
            lps += [-1.0] * len(new) + [0.0] * (e - gen)
        return ids, mask, lps, starts

    t = next(t for t in trajs if retokenized(t)[0] != t.response_ids)
    old = list(t.response_ids)
    t.response_ids, t.loss_mask, t.logprobs, t.segment_starts = retokenized(t)
    first = next(i for i, (a, b) in enumerate(zip(old, t.response_ids, strict=False)) if a != b)
    report = expect(checker, trajs, "prefix", t, index=first)
    assert "re-tokenized" in report.first["prefix"].detail or "context" in report.first["prefix"].detail


def test_an_earlier_token_changed_after_generation(rollout):
    _, trajs, checker = rollout
    trajs = fresh(trajs)
    t = with_tool_result(trajs)
    t.prompt_ids = t.prompt_ids[:-1] + [t.prompt_ids[-1] + 1]  # a re-rendered prompt
    report = expect(checker, trajs, "prefix", t, index=0)
    assert "never generated from the context" in report.first["prefix"].detail


def test_unflagged_truncation(rollout):
    _, trajs, checker = rollout
    trajs = fresh(trajs)
    t = next(t for t in trajs if t.end_reason == "length")
    assert len(t.response_ids) == BUDGET and t.finish_reason == "length"
    t.truncated, t.terminated, t.end_reason = False, True, "end"
    expect(checker, trajs, "truncation", t, index=BUDGET - 1)


def test_a_truncation_scored_as_an_answer(rollout):
    _, trajs, checker = rollout
    trajs = fresh(trajs)
    t = next(t for t in trajs if t.end_reason == "response_budget")
    t.reward = t.components["reward"] = 1.0  # in range, but a cut-off response has no answer
    report = expect(checker, trajs, "truncation", t)
    assert "format" in report.first["truncation"].detail
    assert report.counts["reward"] == 0


@pytest.mark.parametrize("reward", [1.5, -3.0, math.nan])
def test_reward_out_of_range(rollout, reward):
    _, trajs, checker = rollout
    trajs = fresh(trajs)
    t = next(t for t in trajs if t.terminated)
    t.reward = reward
    expect(checker, trajs, "reward", t)


def test_fatal_mode_raises_naming_the_trajectory(rollout):
    _, trajs, checker = rollout
    trajs = fresh(trajs)
    t = trajs[5]
    t.reward = 7.0
    fatal = HealthChecker(mode="fatal", reward_bounds=checker.reward_bounds)
    with pytest.raises(RolloutHealthError, match=rf"'reward' failed: trajectory {t.traj_id} "):
        fatal.raise_or_warn(fatal.check(trajs).faults)


def test_recorded_engine_keeps_the_engine_interface(rollout):
    engine, _, _ = rollout
    assert engine.tokenizer is engine.wrapped.tokenizer
    assert bool(engine) and engine.contexts > 0
    copy_of = RecordedEngine(engine.wrapped)
    assert copy_of.contexts == 0 and bool(copy_of)  # empty, still truthy: `engine or ...` keeps it


def test_overhead_per_batch(rollout):
    """Prints the checks' cost for this 24-trajectory batch (numbers: docs/diagnostics.md)."""
    engine, trajs, checker = rollout
    trajs = fresh(trajs)
    bare = HealthChecker.for_env(None, engine=engine, max_response_tokens=BUDGET)
    for name, c in (("all checks", checker), ("without render_drift", bare)):
        c.check(trajs)
        t0 = time.perf_counter()
        for _ in range(5):
            c.check(trajs)
        ms = (time.perf_counter() - t0) / 5 * 1000
        print(f"health checks, {name}: {ms:.2f} ms per batch of {len(trajs)} trajectories")
        assert ms < 1000
