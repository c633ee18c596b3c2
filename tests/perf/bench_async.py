"""Colocated, server-mode and asynchronous GRPO steps on the tiny model, alternating.

    OMP_NUM_THREADS=1 python tests/perf/bench_async.py [--model DIR] [--blocks 3] [--steps 4] [--server]

Modes: `sync` (colocated HF engine, today's loop), `async` (max_staleness 1) and, with
`--server`, `server` (the policy served by `agent-envs serve-rollout` in another process, weights
synced every step; the server is started once, before the first block, and its start-up is not
counted).

Each block is a fresh run of `--steps` RL steps (B = 4 prompts x G = 4, 64 response tokens,
HF engine, TIS on in both so the update does the same work), A then B, `--blocks` times; torch
and `threads` are fixed at 1 thread per side, so async's gain is the second thread it adds
(generation on one core while the update runs on another). Reported per mode: the median wall
time per step after the first (the first async step has nothing to overlap with), generated
tokens per second over those steps, the time generating a batch and the rest of a step (whose
sum bounds a synchronous step and whose maximum an asynchronous one), and the overlap logged. The load average is printed
before and after: other processes on the machine shrink async's gain.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
warnings.filterwarnings("ignore")

import torch  # noqa: E402

torch.set_num_threads(1)

from algorithms.models.tiny import build_tiny_model  # noqa: E402


def run(model: str, steps: int, staleness: int, engine: dict | None = None) -> dict[str, float]:
    from algorithms.core.learner import Learner
    from algorithms.core.learner_config import LearnerConfig

    cfg = LearnerConfig(
        model=model, env="AgentMath-v0", output_dir=tempfile.mkdtemp(), total_steps=steps,
        prompts_per_step=4, group_size=4, max_response_tokens=64, micro_batch_size=16, lr=1e-4,
        rollout_is="tis", max_staleness=staleness, threads=1, progress=False, tensorboard=False,
        export_model=False, log_entropy=False, **(engine or {}),
    )  # fmt: skip
    history = Learner(cfg).train()
    # time_step_s spans a whole step in both loops: rollout and update (sync), or waiting for the
    # batch and update (async, whose generation of the next batch runs meanwhile)
    walls = [m["time_step_s"] for m in history[1:]]
    tokens = sum(m["response_length_mean"] * m["num_trajectories"] for m in history[1:])
    later = history[1:]
    return {
        "step_s": statistics.median(walls),
        "tokens_per_s": tokens / sum(walls),
        # generating a batch (async: in the producer) and the rest of the step (update, sync)
        "generate_s": statistics.median(m.get("async/generate_s", m["time_rollout_s"]) for m in later),
        "update_s": statistics.median(
            m["time_step_s"] - m["time_rollout_s"] - m.get("async/sync_s", 0.0) for m in later
        ),
        # async: the learner's wait in the weight sync for the segments in flight
        "sync_s": statistics.median(m.get("async/sync_s", 0.0) for m in later),
        "overlap_s": statistics.median(m.get("async/overlap_s", 0.0) for m in later),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny", help='checkpoint dir or "tiny" (untrained)')
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--server", action="store_true", help="also the server mode (starts vLLM)")
    args = parser.parse_args()
    modes: list[tuple[str, int, dict | None]] = [("sync", 0, None), ("async", 1, None)]
    with contextlib.ExitStack() as stack:
        if args.server:
            from tests.servers import free_port, running_server

            model = str(build_tiny_model()) if args.model == "tiny" else args.model
            port = free_port()
            cmd = [sys.executable, "-m", "agent_envs.cli", "serve-rollout", model, "--port", str(port),
                   "--vllm-args", "--dtype float32 --max-model-len 1024 --enforce-eager"]
            url = stack.enter_context(running_server(cmd, port, Path(tempfile.mkdtemp()) / "server.log"))
            modes.append(("server", 0, {"engine": "vllm-server", "engine_kwargs": {"base_url": f"{url}/v1"}}))
        _alternate(args, modes)


def _alternate(args: argparse.Namespace, modes: list[tuple[str, int, dict | None]]) -> None:
    print(f"load average before: {os.getloadavg()}", flush=True)
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in modes}
    for block in range(args.blocks):
        for name, staleness, engine in modes:
            r = run(args.model, args.steps, staleness, engine)
            results[name].append(r)
            print(f"block {block} {name:5s} " + " ".join(f"{k}={v:.3f}" for k, v in r.items()), flush=True)
    summary = {
        name: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for name, rows in results.items()
    }
    for name, s in summary.items():
        print(f"{name:5s} median: " + " ".join(f"{k}={v:.3f}" for k, v in s.items()))
    speedup = summary["sync"]["step_s"] / summary["async"]["step_s"]
    print(f"async speed-up (sync step time / async step time): {speedup:.2f}x")
    if "server" in summary:
        ratio = summary["server"]["step_s"] / summary["sync"]["step_s"]
        print(f"server mode step time / colocated step time: {ratio:.2f}x")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
