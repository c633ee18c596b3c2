"""Env step costs: reset, a malformed action, a final answer in each world, 64 envs answering.

    python tests/perf/bench_env.py [--repeat 2000]

Baselines measured in the same run: grading the same answer directly with the reward function
(the floor an answer step cannot beat), and Gymnasium's SyncVectorEnv (`gymnasium.make_vec`) for
the 64-env case. Targets (docs/benchmarks.md): <= 30 us median for a QA-style answer step and
>= 1,000 steps/s for 64 envs answering together.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import gymnasium as gym  # noqa: E402

import agent_envs  # noqa: E402,F401
from agent_envs.core.vector import ToolVectorEnv  # noqa: E402
from agent_envs.rewards.recipe import make_reward  # noqa: E402

IDS = ["AgentMath-v0", "AgentQA-v0", "AgentSearch-v0"]


def final_answer(env: gym.Env) -> str:
    return env.unwrapped.task.gold_trace[-1]


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def bench_single(env_id: str, repeat: int) -> dict[str, float]:
    env = gym.make(env_id)
    tool_env = env.unwrapped
    recipe = make_reward("standard")
    reset_t, bad_t, answer_t, grade_t = [], [], [], []
    for i in range(repeat):
        t0 = time.perf_counter()
        env.reset(seed=i)
        t1 = time.perf_counter()
        reset_t.append(t1 - t0)
        answer = final_answer(env)
        # A and B alternate within one iteration so machine noise hits both alike.
        t0 = time.perf_counter()
        env.step(answer)
        answer_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        recipe(tool_env.task, answer, True, {})
        grade_t.append(time.perf_counter() - t0)
        env.reset(seed=i)
        t0 = time.perf_counter()
        env.step("<python>unclosed \ud800 <answer>")
        bad_t.append(time.perf_counter() - t0)
    return {
        "reset_us": median_us(reset_t),
        "malformed_us": median_us(bad_t),
        "answer_us": median_us(answer_t),
        "grade_only_us": median_us(grade_t),
    }


def bench_vector(env_id: str, rounds: int, n: int = 64) -> dict[str, float]:
    ours = ToolVectorEnv.make(env_id, num_envs=n, autoreset=False)
    sync = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync")
    ours_t, sync_t = [], []
    for r in range(rounds):
        ours.reset(seed=r * n)
        actions = [final_answer(e) for e in ours.envs]
        t0 = time.perf_counter()
        ours.step(actions)
        ours_t.append(time.perf_counter() - t0)
        sync.reset(seed=r * n)
        actions = [final_answer(e) for e in sync.envs]
        t0 = time.perf_counter()
        sync.step(actions)
        sync_t.append(time.perf_counter() - t0)
    return {"ours_steps_per_s": n / statistics.median(ours_t), "sync_steps_per_s": n / statistics.median(sync_t)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    print(f"{'env':<16} {'reset us':>9} {'malformed us':>13} {'answer us':>10} {'grade-only us':>14} {'answer/grade':>13}")
    for env_id in IDS:
        r = bench_single(env_id, args.repeat)
        print(f"{env_id:<16} {r['reset_us']:9.1f} {r['malformed_us']:13.1f} {r['answer_us']:10.1f} "
              f"{r['grade_only_us']:14.1f} {r['answer_us'] / r['grade_only_us']:12.2f}x")
    print(f"\n64 envs answering together (median of {args.rounds} rounds)")
    for env_id in IDS:
        v = bench_vector(env_id, args.rounds)
        print(f"{env_id:<16} ToolVectorEnv {v['ours_steps_per_s']:9.0f} steps/s   "
              f"gymnasium SyncVectorEnv {v['sync_steps_per_s']:9.0f} steps/s   "
              f"ratio {v['ours_steps_per_s'] / v['sync_steps_per_s']:.2f}x")


if __name__ == "__main__":
    main()
