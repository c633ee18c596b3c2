"""CI guards learning itself: GRPO and ARPO, started from an SFT model whose teacher often skipped
the tool (configs/sft_tiny.yaml), must raise the held-out reward within a minute of training.

The claim is statistical, not a threshold on one noisy number: each held-out task is sampled
before and after training with the run's own sampling setup, and a one-sided sign-flip
permutation test on the per-task differences must reject "no rise" at p < 0.01. With lr=0 the
same procedure gives p = 1.0 (the weights and the seeded samples do not change), so the test
fails when learning is broken (checked when it was written; docs/training.md).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from learner_support import REPO

from agent_envs.base.config import build_config
from algorithms.arpo import ARPOConfig, ARPOLearner
from algorithms.core.learner import Learner
from algorithms.core.learner_config import LearnerConfig

P_MAX = 0.01
HELD_OUT = 48  # tasks at the end of the env's index range (RL draws among 100,000: rarely these)
SAMPLES = 4  # per task, at the run's temperature
STEPS = 40  # about a minute of RL on one idle core


def rise_p_value(before: np.ndarray, after: np.ndarray, rounds: int = 20_000, seed: int = 0) -> float:
    """One-sided paired permutation test of mean(after - before) > 0: under "no change" each
    task's difference is as likely negated, so count the random sign flips whose mean is at
    least the observed one."""
    diffs = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)
    observed = diffs.mean()
    signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(rounds, len(diffs)))
    flipped = (signs * diffs).mean(axis=1)
    return float((1 + np.sum(flipped >= observed - 1e-12)) / (rounds + 1))


def rl_config(config_cls, preset: str, model: str, out, *extra: str):
    """The preset's learner on the quickstart task (grpo_tiny.yaml's env, temperature and lr)."""
    grpo = build_config(LearnerConfig, REPO / "configs" / "grpo_tiny.yaml", [])
    cfg = build_config(config_cls, REPO / "configs" / preset, [
        f"model={model}", f"output_dir={out}", f"total_steps={STEPS}", "save_every=0", "progress=false",
        "tensorboard=false", "eval_every=0", "threads=1", f"temperature={grpo.temperature}", f"lr={grpo.lr}",
        f"max_response_tokens={grpo.max_response_tokens}", *extra,
    ])  # fmt: skip
    cfg.env_kwargs = grpo.env_kwargs
    return cfg


def held_out_correct(model: str, cfg, out) -> np.ndarray:
    """Mean correctness per held-out task over SAMPLES samples at the run's sampling setup."""
    import json

    import gymnasium as gym

    from baselines.evaluation.evaluate import EvalConfig, evaluate

    total = len(gym.make(cfg.env, **cfg.env_kwargs).unwrapped.tasks)
    evaluate(EvalConfig(env=cfg.env, model=model, engine="hf", n=SAMPLES, limit=HELD_OUT,
                        first_task=total - HELD_OUT, temperature=cfg.temperature, top_p=cfg.top_p,
                        top_k=cfg.top_k, max_response_tokens=cfg.max_response_tokens,
                        env_kwargs=cfg.env_kwargs, out=str(out)))  # fmt: skip
    per_task: dict[str, list[float]] = {}
    for line in (out / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        per_task.setdefault(row["task_id"], []).append(row["correct"])
    return np.array([np.mean(v) for _, v in sorted(per_task.items())])


@pytest.fixture(scope="session")
def teacher_sft(tmp_path_factory) -> str:
    """The quickstart's SFT (imperfect teacher, configs/sft_tiny.yaml), once per session."""
    from algorithms.sft import SFTConfig, run_sft

    cfg = build_config(SFTConfig, REPO / "configs" / "sft_tiny.yaml", [
        f"output_dir={tmp_path_factory.mktemp('teacher_sft')}", "eval_episodes=0", "progress=false",
        "tensorboard=false", "threads=1",
    ])
    return run_sft(cfg)["model"]


@pytest.fixture(scope="session")
def before(teacher_sft, tmp_path_factory) -> np.ndarray:
    cfg = rl_config(LearnerConfig, "grpo_tiny.yaml", teacher_sft, tmp_path_factory.mktemp("unused"))
    return held_out_correct(teacher_sft, cfg, tmp_path_factory.mktemp("eval_sft"))


@pytest.mark.slow
# the first test also builds the session's SFT model (1,000 steps, about 4 min on 2 idle cores;
# measured past 10 min on a loaded CI machine), and pytest-timeout counts fixture setup
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("cls, config_cls, preset", [
    (Learner, LearnerConfig, "grpo_tiny.yaml"), (ARPOLearner, ARPOConfig, "arpo_tiny.yaml")])
def test_held_out_reward_rises_within_a_minute(teacher_sft, before, tmp_path, cls, config_cls, preset):
    cfg = rl_config(config_cls, preset, teacher_sft, tmp_path / "run")
    start = time.perf_counter()
    cls(cfg).train()
    wall = time.perf_counter() - start
    after = held_out_correct(str(tmp_path / "run" / "final_model"), cfg, tmp_path / "eval")
    p = rise_p_value(before, after)
    print(f"\n{preset}: {before.mean():.3f} -> {after.mean():.3f} in {STEPS} steps ({wall:.0f} s), p = {p:.5f}")
    assert p < P_MAX, (
        f"{preset}: held-out accuracy at T={cfg.temperature} went {before.mean():.3f} -> {after.mean():.3f} "
        f"after {STEPS} steps ({wall:.0f} s); one-sided permutation p = {p:.4f}, needs < {P_MAX}"
    )


# Last in the file: with two workers (`make test`), a worker takes its next file when two tests of
# this one are left, and that file should wait behind one long test, not both.
def test_permutation_test_separates_a_rise_from_noise():
    rng = np.random.default_rng(1)
    before = rng.random(HELD_OUT)
    assert rise_p_value(before, before + rng.normal(0, 0.2, HELD_OUT)) > 0.05
    assert rise_p_value(before, before + 0.25 + rng.normal(0, 0.2, HELD_OUT)) < 1e-3
    assert rise_p_value(before, before - 0.25) == pytest.approx(1.0, abs=1e-3)  # a fall is not a rise
    assert rise_p_value(before, before) == 1.0  # no change at all never counts as a rise
