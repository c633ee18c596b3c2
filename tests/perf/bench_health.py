"""What the rollout health checks cost per batch, and per learner step.

    python tests/perf/bench_health.py [--steps 6]

1. The trajectory checks on one real batch (the warmed tiny model, 8 prompts x 4, 96 tokens):
   all checks, and all but `render_drift` (the one that runs the tokenizer), alternated.
2. Learner steps (GRPO, same model and sizes) with `health_checks: off` and `warn`, alternated
   step by step in one process so machine noise hits both alike; the `warn` steps include the
   engine recorder, the checks and the log-prob gap bookkeeping.
Prints the load average before and after: numbers from a busy machine are not comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

import agent_envs  # noqa: E402,F401
from algorithms.core.learner import Learner  # noqa: E402
from algorithms.core.learner_config import LearnerConfig  # noqa: E402
from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT, build_tiny_model  # noqa: E402
from algorithms.rollout.engine import SamplingParams  # noqa: E402
from algorithms.rollout.health import HealthChecker, RecordedEngine  # noqa: E402
from algorithms.rollout.hf import HFEngine  # noqa: E402
from algorithms.rollout.runner import run_episodes  # noqa: E402

BUDGET, PROMPTS, GROUP = 96, 8, 4


def bench_checks(model: str, repeat: int = 20) -> None:
    engine = RecordedEngine(HFEngine(model, seed=0))

    def make_env():
        return gym.make("AgentMath-v0", tokenizer=engine.tokenizer, system_prompt=WARMUP_SYSTEM_PROMPT,
                        max_response_tokens=BUDGET).unwrapped

    trajs = asyncio.run(run_episodes(engine, make_env, SamplingParams(temperature=1.0, seed=0),
                                     n_prompts=PROMPTS, group_size=GROUP, max_response_tokens=BUDGET))
    full = HealthChecker.for_env(make_env(), engine=engine, tokenizer=engine.tokenizer, max_response_tokens=BUDGET)
    light = HealthChecker.for_env(make_env(), engine=engine, max_response_tokens=BUDGET)
    times: dict[str, list[float]] = {"all checks": [], "without render_drift": []}
    for _ in range(repeat):
        for name, checker in (("all checks", full), ("without render_drift", light)):
            batch = copy.deepcopy(trajs)
            t0 = time.perf_counter()
            checker.check(batch)
            times[name].append(time.perf_counter() - t0)
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    for name, ts in times.items():
        print(f"trajectory checks, {name}: median {statistics.median(ts) * 1e3:.2f} ms per batch of "
              f"{len(trajs)} trajectories ({tokens} tokens)")


def bench_steps(model: str, steps: int) -> None:
    def learner(mode: str) -> Learner:
        cfg = LearnerConfig(model=model, env="AgentMath-v0", env_kwargs={"system_prompt": WARMUP_SYSTEM_PROMPT},
                            output_dir=tempfile.mkdtemp(), total_steps=10**6, prompts_per_step=PROMPTS,
                            group_size=GROUP, max_response_tokens=BUDGET, micro_batch_size=8, lr=1e-5, threads=1,
                            progress=False, tensorboard=False, export_model=False, health_checks=mode)
        return Learner(cfg)

    runs = {"off": learner("off"), "warn": learner("warn")}
    times: dict[str, list[float]] = {k: [] for k in runs}
    checks: list[float] = []
    for _ in range(steps):
        for mode, lrn in runs.items():
            m = lrn.train_step()
            times[mode].append(m["time_step_s"])
            if mode == "warn":
                checks.append(m["health/time_ms"])
    off, on = statistics.median(times["off"]), statistics.median(times["warn"])
    print(f"learner step, health_checks=off: median {off:.3f} s; warn: median {on:.3f} s "
          f"(the checks themselves: median {statistics.median(checks):.1f} ms per step)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()}")
    model = str(build_tiny_model(seed=0, warmup_steps=150))
    bench_checks(model)
    bench_steps(model, args.steps)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
