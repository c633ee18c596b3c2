"""Rollout benchmark: tool latency hidden behind generation, and engine throughput vLLM vs HF.

    OMP_NUM_THREADS=1 python tests/perf/bench_rollout.py [--rounds 5] [--plot bench_rollout.png]

1. 64 episodes (16 prompts x 4) of a warmed tiny model on ToolEnv math tasks whose tool sleeps
   100 ms per call, against the same episodes with an instant tool (same seeds, so the same
   tokens). Target: slow / instant <= 1.2 (tool calls overlap each other and generation).
2. Engine throughput in generated tokens/s, vLLM (CPU, in-process) vs HF, 64 prompts x 128 tokens.
A and B alternate each round; the medians are compared. Threads are fixed to 1.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

from agent_envs.base.task import Task  # noqa: E402
from agent_envs.base.tool import Tool, ToolResult  # noqa: E402
from agent_envs.core.env import ToolEnv  # noqa: E402
from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT, build_tiny_model  # noqa: E402
from algorithms.rollout import HFEngine, SamplingParams, VLLMEngine, run_episodes  # noqa: E402

BUDGET = 192


class SleepyCalc(Tool):
    """Evaluates `print(a op b)` after sleeping `delay_s` (stands in for a slow sandbox / API)."""

    name = "python"
    argument = "code"
    description = "runs Python code and returns what it prints"

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls = 0

    async def call(self, arg: str) -> ToolResult:
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        parts = arg.strip().removeprefix("print(").removesuffix(")").split()
        try:
            a, op, b = int(parts[0]), parts[1], int(parts[2])
            return ToolResult(str({"*": a * b, "+": a + b, "-": a - b, "%": a % b if b else 0}[op]))
        except (IndexError, ValueError, KeyError):
            return ToolResult("Error: could not evaluate")


def tasks(n: int) -> list[Task]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        a, b = rng.randint(10, 9999), rng.randint(2, 99)
        out.append(Task(id=f"bench-{i}", question=f"What is {a} * {b}?", answers=[str(a * b)], reward="math"))
    return out


async def episodes(engine, delay_s: float) -> tuple[float, int, int]:
    tool = SleepyCalc(delay_s)
    pool = tasks(16)

    def make() -> ToolEnv:
        return ToolEnv(
            pool,
            [tool],
            tokenizer=engine.tokenizer,
            system_prompt=WARMUP_SYSTEM_PROMPT,
            max_response_tokens=BUDGET,
            max_tool_calls=3,
        )

    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=BUDGET, seed=0)
    start = time.perf_counter()
    trajs = await run_episodes(engine, make, params, n_prompts=16, group_size=4, max_response_tokens=BUDGET)
    wall = time.perf_counter() - start
    return wall, tool.calls, sum(t.num_generated for t in trajs)


def throughput(engine, prompts) -> float:
    params = SamplingParams(temperature=1.0, max_tokens=128, seed=1)
    start = time.perf_counter()
    segs = engine.generate(prompts, params)
    return sum(len(s) for s in segs) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--plot", default=None, help="write a PNG bar chart here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    console = Console()
    path = build_tiny_model(seed=0, warmup_steps=150)
    vllm_engine = VLLMEngine(path, max_model_len=1024, kv_cache_gb=1)
    hf = HFEngine(path)
    tok = hf.tokenizer
    prompts = [
        tok(
            f"<|im_start|>user\nWhat is {i} * 7?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
        )["input_ids"]
        for i in range(64)
    ]
    # warm both engines once (compilation, caches) before timing
    asyncio.run(episodes(vllm_engine, 0.0))
    throughput(hf, prompts[:8])

    slow, fast, calls, tps_v, tps_h = [], [], [], [], []
    tokens: set[int] = set()  # generated tokens per run: one value when seeds make runs identical
    with Progress(console=console, transient=True) as bar:
        job = bar.add_task("rounds", total=args.rounds)
        for _ in range(args.rounds):
            w, c, n = asyncio.run(episodes(vllm_engine, 0.1))
            slow.append(w)
            calls.append(c)
            tokens.add(n)
            w, _, n = asyncio.run(episodes(vllm_engine, 0.0))
            fast.append(w)
            tokens.add(n)
            tps_v.append(throughput(vllm_engine, prompts))
            tps_h.append(throughput(hf, prompts))
            bar.advance(job)

    ratio = statistics.median(slow) / statistics.median(fast)
    table = Table(title="rollout benchmark (tiny model, 1 thread)")
    for col in ("measure", "A", "B", "A / B"):
        table.add_column(col)
    table.add_row(
        f"64 episodes wall s: tool 100 ms (A) vs instant (B); {statistics.mean(calls):.0f} calls",
        f"{statistics.median(slow):.2f}",
        f"{statistics.median(fast):.2f}",
        f"{ratio:.2f}x (target <= 1.2x)",
    )
    table.add_row(
        "engine tokens/s: vLLM CPU (A) vs HF (B), 64 x 128 tokens",
        f"{statistics.median(tps_v):.0f}",
        f"{statistics.median(tps_h):.0f}",
        f"{statistics.median(tps_v) / statistics.median(tps_h):.2f}x",
    )
    console.print(table)
    console.print(f"generated tokens per 64-episode run: {sorted(tokens)}")
    console.print(
        f"per round: slow {[round(x, 2) for x in slow]}, instant {[round(x, 2) for x in fast]}, "
        f"vLLM tok/s {[round(x) for x in tps_v]}, HF tok/s {[round(x) for x in tps_h]}"
    )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3))
        a1.bar(["tool 100 ms", "instant tool"], [statistics.median(slow), statistics.median(fast)])
        a1.set_ylabel("wall s, 64 episodes")
        a2.bar(["vLLM CPU", "HF"], [statistics.median(tps_v), statistics.median(tps_h)])
        a2.set_ylabel("generated tokens / s")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        console.print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
