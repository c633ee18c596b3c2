"""Wall time of one tiny GRPO step with tool calls: the quickstart's RL step on a 2-core CPU.

    OMP_NUM_THREADS=1 python tests/perf/bench_grpo_step.py [--steps 12] [--model PATH] [--threads auto]

The step of configs/grpo_tiny.yaml: 4 prompts x 8 samples of at most 96 tokens at T = 0.6 in
AgentMath-v0, python calls through the sandbox, HF engine, one optimizer step. The model is the
quickstart's SFT checkpoint when `--model` names one; by default a tiny model warmed for 150
steps on protocol text, which writes `<python>` calls and answers, so episodes have tool turns.
Prints the median step time after the first (warm-up) step, with the rollout's share.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
warnings.filterwarnings("ignore")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--model", default=None, help="checkpoint dir (default: the warmed tiny model)")
    ap.add_argument("--threads", default="1", help="torch threads: an integer or auto")
    args = ap.parse_args()

    from algorithms.core.learner import Learner
    from algorithms.core.learner_config import LearnerConfig
    from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT, build_tiny_model

    model = args.model or str(build_tiny_model(seed=0, warmup_steps=150))
    system_prompt = None if args.model else WARMUP_SYSTEM_PROMPT
    threads = args.threads if args.threads == "auto" else int(args.threads)
    cfg = LearnerConfig(
        model=model, env="AgentMath-v0", output_dir=tempfile.mkdtemp(), total_steps=10_000,
        prompts_per_step=4, group_size=8, max_response_tokens=96, temperature=0.6,
        micro_batch_size=16, lr=2e-5, threads=threads, progress=False, tensorboard=False,
        export_model=False, env_kwargs={"system_prompt": system_prompt} if system_prompt else {},
    )  # fmt: skip
    learner = Learner(cfg)
    times, rollout, tools, lengths = [], [], [], []
    for _ in range(args.steps):
        t = time.perf_counter()
        m = learner.train_step()
        times.append(time.perf_counter() - t)
        rollout.append(m["time_rollout_s"])
        tools.append(m["tool_calls_mean"])
        lengths.append(m["total_length_mean"])
    print(f"threads {os.environ.get('OMP_NUM_THREADS')}/{cfg.threads}; load {os.getloadavg()[0]:.2f}")
    print(
        f"tool calls per episode {statistics.mean(tools):.2f}; tokens per episode {statistics.mean(lengths):.1f}"
    )
    print(f"step: median {statistics.median(times[1:]):.3f} s over {len(times) - 1} steps")
    print(f"rollout: median {statistics.median(rollout[1:]):.3f} s")


if __name__ == "__main__":
    main()
