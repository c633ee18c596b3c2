"""Tree-rollout benchmark: ARPO's branching against flat GRPO sampling at the same number of trajectories.

    OMP_NUM_THREADS=1 python tests/perf/bench_tree_rollout.py [--prompts 8] [--rounds 3] [--model DIR]
        [--env AgentQA-v0 --env-kwargs '{"world": {"min_hops": 2}}' --budget 900]
        [--initial 8] [--beam 2] [--alpha 0.5] [--temperature 0.6]
        [--plot docs/images/bench_tree_rollout.png]

Both sides roll out M = 16 trajectories for each of the same prompts of one env (default the
arithmetic world `AgentMath-v0`, real python sandbox, one call per episode; `--env` takes any
registered id, e.g. the multi-hop knowledge world `AgentQA-v0`), with the same engine: the tiny model on the vLLM CPU engine,
in-process, prefix caching on. A = flat GRPO (16 independent episodes per prompt, the runner);
B = ARPO's tree (by default the paper's N = 8 initial branches, Z = 2, α = 0.5, β = 0.2, k = 20,
K = 10; forks after tool results, top-ups to exactly 16; `--initial`, `--beam` and `--alpha` change
the tree's shape). The prefix cache is reset before every run, A and B alternate,
and each round uses a new seed. Measured per run:

* prefill tokens actually computed: prompt tokens the engine was asked for minus those served
  from the prefix cache (vLLM's `prefix_cache_queries − prefix_cache_hits`);
* generated tokens (sampled by the engine);
* tool calls actually executed, per trajectory (a fork does not re-run its prefix's calls);
* wall time of the rollout.

Targets (issue): B/A ≤ 0.7 for prefill and ≤ 0.6 for tool calls per trajectory. The default model
is the rollout builder's warmed-up tiny model (`warmup_steps=150`: it writes the tag protocol);
`--model` takes an SFT checkpoint instead (e.g. runs/sft_tiny/final_model). `--env-kwargs` (JSON)
overrides the env defaults (the warm-up system prompt, `max_tool_calls=3`); `--budget` is the
response token budget per episode (search results are long: 2-hop QA episodes need ~800).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

M = 16


def make_env_factory(tokenizer, env_id: str, env_kwargs: dict, budget: int):
    import gymnasium as gym

    import agent_envs  # noqa: F401  (registers the ids)
    from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT

    kwargs = {"system_prompt": WARMUP_SYSTEM_PROMPT, "max_tool_calls": 3, **env_kwargs}

    def make():
        return gym.make(env_id, tokenizer=tokenizer, max_response_tokens=budget, **kwargs).unwrapped

    return make


def executed_calls(branches) -> int:
    return sum(sum(p.env.metrics.calls.values()) for p in branches)


def prefill_counters(engine) -> tuple[float, float]:
    s = engine.stats()
    return s.get("prefix_cache_queries", 0.0), s.get("prefix_cache_hits", 0.0)


async def flat(engine, make_env, params, prompts: list[int], seed: int, budget: int):
    from algorithms.rollout.runner import run_branches, start_group

    branches = []
    for g, idx in enumerate(prompts):
        branches += start_group(make_env(), engine.tokenizer, g, M, g * M, seed=seed + g, options={"index": idx})
    await run_branches(engine, branches, params, budget)
    trajs = [p.to_trajectory() for p in branches]
    return trajs, sum(sum(t.loss_mask) for t in trajs), executed_calls(branches)


async def tree(engine, make_env, params, prompts: list[int], seed: int, budget: int, shape: dict):
    from algorithms.rollout.tree import TreeRollout
    from algorithms.rollout.tree_config import TreeConfig

    t = TreeRollout(engine, TreeConfig(**shape), budget=M)
    res = await t.arollout(
        make_env,
        params,
        tasks=prompts,
        max_response_tokens=budget,
        seeds=[seed + g for g in range(len(prompts))],
    )
    gen = sum(p.generated_tokens + p.overhead_tokens for p in res.prompts)
    shape = {
        "forks": sum(p.forks for p in res.prompts),
        "topups": sum(p.topups for p in res.prompts),
        "delta_h": [d for p in res.prompts for d in p.delta_h],
    }
    return res.trajectories, gen, sum(p.tool_calls for p in res.prompts), shape


def measure(engine, fn, *args) -> dict[str, float]:
    engine.llm.reset_prefix_cache()
    q0, h0 = prefill_counters(engine)
    t0 = time.perf_counter()
    out = asyncio.run(fn(*args))
    wall = time.perf_counter() - t0
    q1, h1 = prefill_counters(engine)
    trajs, gen, calls = out[:3]
    row = {
        "trajectories": len(trajs),
        "prefill_submitted": q1 - q0,
        "prefill_computed": (q1 - q0) - (h1 - h0),
        "generated": gen,
        "tool_calls_per_traj": calls / len(trajs),
        "wall_s": wall,
        "reward": statistics.fmean(t.reward for t in trajs),
    }
    if len(out) > 3:
        groups = len(trajs) / M
        row["forks_per_prompt"] = out[3]["forks"] / groups
        row["topups_per_prompt"] = out[3]["topups"] / groups
        row["mean_delta_h"] = statistics.fmean(out[3]["delta_h"]) if out[3]["delta_h"] else float("nan")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=None, help="checkpoint dir (default: the warmed-up tiny model)")
    ap.add_argument("--plot", default=None, help="write a PNG of the ratios here")
    ap.add_argument("--block-size", type=int, default=32, help="vLLM KV block size in tokens")
    ap.add_argument("--alpha", type=float, default=0.5, help="ARPO base branch probability α")
    ap.add_argument("--initial", type=int, default=8, help="ARPO initial rollouts N (of M = 16)")
    ap.add_argument("--beam", type=int, default=2, help="ARPO beam size Z (forks per source ≤ Z − 1)")
    ap.add_argument("--temperature", type=float, default=0.6, help="sampling temperature (the tiny presets train at 0.6)")
    ap.add_argument("--env", default="AgentMath-v0", help="registered env id")
    ap.add_argument("--env-kwargs", type=json.loads, default={}, help="JSON env kwargs (override defaults)")
    ap.add_argument("--budget", type=int, default=160, help="response tokens per episode (model and tool)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from algorithms.models.tiny import build_tiny_model
    from algorithms.rollout.engine import SamplingParams
    from algorithms.rollout.vllm import VLLMEngine

    model = args.model or str(build_tiny_model(warmup_steps=150))
    # small KV blocks (GPUs use 16; the CPU kernels need a multiple of 32 and default to 128, which caches
    # almost nothing of ~200-token episodes); only whole blocks are served from the prefix cache
    max_len = max(1024, args.budget + 256)  # room for the prompt
    engine = VLLMEngine(model, dtype="float32", max_model_len=max_len, seed=0, block_size=args.block_size)
    make_env = make_env_factory(engine.tokenizer, args.env, args.env_kwargs, args.budget)
    n_tasks = len(make_env().tasks)
    params = SamplingParams(temperature=args.temperature, top_p=1.0, top_k=-1, max_tokens=args.budget, seed=0)
    # warm the engine and the tools once, outside the measurements
    asyncio.run(flat(engine, make_env, params, [0], 999, args.budget))

    k = 10  # the top-K log-probs ARPO requests for its entropy
    shape = {"initial_rollouts": args.initial, "beam_size": args.beam, "branch_probability": args.alpha}
    rows: dict[str, list[dict[str, float]]] = {"flat GRPO": [], f"flat, logprobs={k}": [], "ARPO tree": []}
    with Progress(transient=True) as bar:
        job = bar.add_task("rounds (A, A', B alternate)", total=3 * args.rounds)
        for r in range(args.rounds):
            prompts = [(1_000 * r + 97 * i) % n_tasks for i in range(args.prompts)]
            seed = 10_000 * (r + 1)
            params_r = params.with_(seed=seed)
            common = (engine, make_env, params_r, prompts, seed, args.budget)
            rows["flat GRPO"].append(measure(engine, flat, *common))
            bar.advance(job)
            params_k = params_r.with_(logprobs=k)
            rows[f"flat, logprobs={k}"].append(
                measure(engine, flat, engine, make_env, params_k, prompts, seed, args.budget)
            )
            bar.advance(job)
            rows["ARPO tree"].append(measure(engine, tree, *common, shape))
            bar.advance(job)

    keys = ["prefill_computed", "prefill_submitted", "generated", "tool_calls_per_traj", "wall_s", "reward"]
    console = Console()
    table = Table(
        title=f"{args.env}: {args.prompts} prompts x M={M} (tree N={args.initial}, Z={args.beam}, "
        f"α={args.alpha}), T={args.temperature}, {args.rounds} rounds (mean per run), vLLM CPU"
    )
    table.add_column("metric")
    for name in rows:
        table.add_column(name, justify="right")
    table.add_column("tree / flat", justify="right")
    ratios = {}
    for key in keys:
        means = [statistics.fmean(x[key] for x in rows[name]) for name in rows]
        ratios[key] = means[-1] / means[0] if means[0] else float("nan")
        table.add_row(key, *(f"{m:.3g}" for m in means), f"{ratios[key]:.2f}")
    for key in ("forks_per_prompt", "topups_per_prompt", "mean_delta_h"):
        value = statistics.fmean(x[key] for x in rows["ARPO tree"])
        table.add_row(key.replace("_", " ").replace("delta h", "ΔH after tool results"), "-", "-", f"{value:.2f}", "")
    console.print(table)
    for key, target in (("prefill_computed", 0.7), ("tool_calls_per_traj", 0.6)):
        verdict = "meets" if ratios[key] <= target else "misses"
        console.print(f"{key}: tree / flat = {ratios[key]:.2f} ({verdict} the target ≤ {target})")
    wall_k = statistics.fmean(x["wall_s"] for x in rows[f"flat, logprobs={k}"])
    wall_b = statistics.fmean(x["wall_s"] for x in rows["ARPO tree"])
    console.print(f"wall time, tree / flat with the same logprobs={k}: {wall_b / wall_k:.2f}")
    per_round = [
        f"round {r}: prefill {b['prefill_computed'] / a['prefill_computed']:.2f}, "
        f"tool calls {b['tool_calls_per_traj'] / max(a['tool_calls_per_traj'], 1e-9):.2f}, "
        f"wall {b['wall_s'] / a['wall_s']:.2f}"
        for r, (a, b) in enumerate(zip(rows["flat GRPO"], rows["ARPO tree"], strict=True))
    ]
    console.print("\n".join(per_round))

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = ["prefill computed", "generated", "tool calls / traj", "wall time"]
        values = [ratios[k] for k in ("prefill_computed", "generated", "tool_calls_per_traj", "wall_s")]
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.bar(labels, values, color=["#4c72b0", "#8c8c8c", "#55a868", "#8c8c8c"])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.plot([-0.4, 0.4], [0.7, 0.7], "r--", lw=1)
        ax.plot([1.6, 2.4], [0.6, 0.6], "r--", lw=1)
        ax.set_ylabel("ARPO tree / flat GRPO")
        ax.set_title(f"{args.env}: same {M} trajectories per prompt (red: targets)", fontsize=10)
        fig.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=120)
        console.print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
