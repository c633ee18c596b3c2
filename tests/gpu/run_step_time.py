"""Step time, tokens/s and memory peaks of real training steps on GPUs, beside the capacity model.

Not collected by pytest (pyproject.toml: norecursedirs). Run from the repository root on a
machine with GPUs and `vllm` (CUDA) installed; see tests/gpu/README.md:

    python tests/gpu/run_step_time.py --model Qwen/Qwen2.5-0.5B-Instruct --gpus 1
    python tests/gpu/run_step_time.py --model Qwen/Qwen2.5-1.5B-Instruct --gpus 8 --modes colocated server

Each mode trains `--steps` GRPO steps of configs/grpo_tiny_qa.yaml's env on the given model:
- colocated: `engine: vllm`, one in-process engine per learner rank;
- server: `agent-envs serve-rollout` on the same GPUs (memory split by --server-mem) and
  `engine: vllm-server`;
- async: the colocated run plus the overrides in --async-overrides (docs/scaling.md names
  the keys); skipped when none are given.
It prints one line per mode (step, rollout and update seconds, generated and total tokens/s, peak
GPU memory from nvidia-smi) and the model's prediction for the same shape
(algorithms/core/capacity.py). Send the printed block back.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.servers import free_port, running_server  # noqa: E402


class MemoryPeak(threading.Thread):
    """Samples nvidia-smi every 0.5 s; `peak_gb` is the highest used memory seen on any GPU."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_gb, self.stop = 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout
            used = [float(x) / 1024 for x in out.split()] or [0.0]
            self.peak_gb = max(self.peak_gb, max(used))
            time.sleep(0.5)


def train(args, mode: str, out: Path, extra: list[str]) -> list[dict]:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(args.gpus),
           "--mixed_precision", "bf16", *(["--multi_gpu"] if args.gpus > 1 else []),
           "-m", "agent_envs.cli", "train", "--algo", "grpo", "--config", args.config,
           f"model={args.model}", f"output_dir={out}", f"total_steps={args.steps}",
           f"prompts_per_step={args.prompts}", f"group_size={args.group}",
           f"max_response_tokens={args.max_response_tokens}", "eval_every=0", "save_every=0",
           "progress=false", "tensorboard=false", "gradient_checkpointing=true", "micro_batch_size=4",
           *extra]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                          capture_output=True)
    if proc.returncode:
        raise SystemExit(f"{mode}: training failed\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def summarize(mode: str, rows: list[dict], peak_gb: float, args) -> dict:
    steps = [r for r in rows if "time_step_s" in r][1:]  # the first step pays for compilation
    if not steps:
        raise SystemExit(f"{mode}: need --steps >= 2 (the first step is left out as warm-up)")
    mean = lambda k: sum(r[k] for r in steps) / len(steps)  # noqa: E731
    n = mean("num_trajectories")
    step, rollout = mean("time_step_s"), mean("time_rollout_s")
    return {"mode": mode, "gpus": args.gpus, "model": args.model, "step_s": step, "rollout_s": rollout,
            "update_s": step - rollout, "generated_tok_s": n * mean("response_length_mean") / rollout,
            "trained_tok_s": n * mean("total_length_mean") / (step - rollout), "peak_gpu_gb": peak_gb,
            "mean_total_length": mean("total_length_mean"), "trajectories": n}


def predicted(m: dict, args) -> str:
    """The capacity model's update time, decode rate and learner memory for the measured shape."""
    import dataclasses

    from algorithms.core.capacity import GPUS, QWEN25, Assumptions, decode_tokens_per_s, plan, train_flops

    size = next((s for s in QWEN25 if f"-{s}" in m["model"]), None)
    if size is None:
        return "  (no capacity row for this model name)"
    shape, g, a = QWEN25[size], GPUS[args.gpu], Assumptions()
    length = int(m["mean_total_length"])
    flops = train_flops(shape, m["trajectories"] * length, length)
    mfu = flops / (m["update_s"] * m["gpus"] * g.bf16_tflops * 1e12)
    model_s = flops / (m["gpus"] * g.bf16_tflops * 1e12 * a.mfu)
    live = max(1, min(a.concurrency, int(m["trajectories"]) // m["gpus"]))
    rate = m["gpus"] * decode_tokens_per_s(shape, g, 1, dataclasses.replace(a, concurrency=live), 2 * length)
    learner = plan(size, gpus=m["gpus"], gpu=args.gpu, seq_len=4096, micro_batch=4).learner_peak_gb
    return (f"  capacity model: update {model_s:.1f}s at MFU {a.mfu} (measured {m['update_s']:.1f}s = MFU "
            f"{mfu:.3f}); decode {rate:.0f} tok/s (measured {m['generated_tok_s']:.0f}, tool time "
            f"included); learner peak {learner:.1f} GB + the engine's share (measured peak "
            f"{m['peak_gpu_gb']:.1f} GB)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF id or folder of a 0.5B-1.5B Qwen2.5 model")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--gpu", default="h100", help="capacity model's GPU: h100 or h200")
    p.add_argument("--modes", nargs="+", default=["colocated", "server", "async"])
    p.add_argument("--config", default="configs/grpo_tiny_qa.yaml")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-response-tokens", type=int, default=1024)
    p.add_argument("--engine-mem", type=float, default=0.4, help="colocated vLLM's gpu_memory_utilization")
    p.add_argument("--server-mem", type=float, default=0.4, help="the server's gpu_memory_utilization")
    p.add_argument("--async-overrides", default="", help="key=value overrides that turn async training on")
    args = p.parse_args()
    colocated = ["engine=vllm", f'engine_kwargs={{"gpu_memory_utilization": {args.engine_mem}, '
                 f'"dtype": "bfloat16", "max_model_len": 4096}}']
    results = []
    for mode in args.modes:
        extra = colocated
        if mode == "async":
            if not args.async_overrides:
                print("async: skipped (give --async-overrides, see docs/scaling.md)")
                continue
            extra = colocated + shlex.split(args.async_overrides)
        with contextlib.ExitStack() as stack:
            if mode == "server":
                port = free_port()
                cmd = [sys.executable, "-m", "agent_envs.cli", "serve-rollout", args.model, "--port", str(port),
                       "--vllm-args", f"--gpu-memory-utilization {args.server_mem} --max-model-len 4096"]
                log = Path(tempfile.mkdtemp(prefix="gpu_server_")) / "server.log"
                url = stack.enter_context(running_server(cmd, port, log, env={"PYTHONPATH": str(REPO)},
                                                         ready_path="/v1/models", timeout_s=600))
                extra = ["engine=vllm-server", f'engine_kwargs={{"base_url": "{url}/v1"}}']
            watch = MemoryPeak()
            watch.start()
            try:
                rows = train(args, mode, Path(tempfile.mkdtemp(prefix=f"gpu_{mode}_")), extra)
            finally:
                watch.stop.set()
        m = summarize(mode, rows, watch.peak_gb, args)
        results.append(m)
        print(json.dumps(m))
        print(predicted(m, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
