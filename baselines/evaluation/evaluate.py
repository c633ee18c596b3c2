"""Evaluate a model on an env: n samples per task, pass@1 / pass@k and every reward component.

    agent-envs evaluate --env AgentMath-v0 --model runs/quickstart/rl/final --n 4 --k 1,4 --limit 100
    agent-envs evaluate --env AgentQA-HotpotQA-v0 --engine openai --base-url http://127.0.0.1:8000/v1 \\
        --model Qwen2.5-7B-Instruct --tokenizer Qwen/Qwen2.5-7B-Instruct

Writes `samples.jsonl` (one row per episode: task, sample, reward components, tool calls,
response text) and `summary.json` (the metrics plus everything that defines the run: env and its
kwargs, tool limits, model, engine, sampling, prompting baseline) into `--out`.
pass@1 is the mean over the n samples of each task; pass@k uses the unbiased estimator;
`correct` is math equivalence for math tasks and exact match otherwise; `f1` is reported beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

import agent_envs  # noqa: F401  (registers the ids)
from algorithms.base.preflight import USER_ERRORS, check_engine, check_env, check_model
from baselines.evaluation.passk import summarize
from baselines.prompting import BASELINES, apply_baseline


@dataclass
class EvalConfig:
    env: str
    model: str
    engine: str = "vllm"  # vllm | hf | openai
    base_url: str | None = None  # openai engine
    tokenizer: str | None = None  # defaults to the model path
    n: int = 1
    ks: tuple[int, ...] = (1,)
    limit: int | None = 100
    first_task: int = 0
    temperature: float | None = None  # None: greedy when n == 1, else 0.6 (the reference evaluation)
    top_p: float = 0.95
    top_k: int = 20
    max_response_tokens: int = 1024
    baseline: str = "tools"
    seed: int = 0
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    out: str | None = None

    def validate(self) -> None:
        if self.engine not in ("vllm", "hf", "openai"):
            raise ValueError(f"engine={self.engine!r}: choose vllm, hf or openai")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline={self.baseline!r}: choose one of {BASELINES}")
        if self.n < 1 or any(k > self.n for k in self.ks):
            raise ValueError(f"need n >= max(ks) >= 1, got n={self.n}, ks={self.ks}")
        if self.engine == "openai" and not self.base_url:
            raise ValueError("engine=openai needs base_url (e.g. http://127.0.0.1:8000/v1)")


def make_engine(kind: str, model: Any, *, tokenizer: str | None = None, base_url: str | None = None,
                seed: int = 0, max_model_len: int = 4096) -> Any:
    """A rollout engine for evaluation: `vllm` (in-process), `hf` or `openai` (a server)."""
    if kind == "vllm":
        from algorithms.rollout import VLLMEngine

        return VLLMEngine(model, seed=seed, max_model_len=max_model_len)
    if kind == "hf":
        from algorithms.rollout import HFEngine

        return HFEngine(model, tokenizer, seed=seed)
    from algorithms.rollout import OpenAIEngine

    return OpenAIEngine(base_url=base_url, model=str(model), tokenizer=tokenizer or str(model))


def check_eval_inputs(cfg: EvalConfig, engine: Any = None) -> Any:
    """The config, the env with its task data, and (without a ready engine) the model path and
    engine package: checked before an engine loads the model. Returns the env, made without a
    tokenizer."""
    cfg.validate()
    probe = check_env(cfg.env, cfg.env_kwargs, key="--env")
    total = len(probe.tasks)
    if total - cfg.first_task <= 0:
        raise ValueError(f"{cfg.env} has {total} tasks; first_task={cfg.first_task} leaves none to evaluate")
    if engine is None and cfg.engine != "openai":  # a served model's name is not a path
        check_model(cfg.model, key="--model")
        check_engine(cfg.engine, key="--engine")
    return probe


def evaluate(cfg: EvalConfig, engine: Any = None) -> dict[str, Any]:
    """Run the evaluation and return the summary (also written to `cfg.out` when set)."""
    from algorithms.rollout import SamplingParams, run_episodes

    probe = check_eval_inputs(cfg, engine)
    total = len(probe.tasks)
    count = total - cfg.first_task if cfg.limit is None else min(cfg.limit, total - cfg.first_task)
    if engine is None:
        print(f"evaluate: loading model {cfg.model}", flush=True)  # also the preflight tests' marker
        engine = make_engine(cfg.engine, cfg.model, tokenizer=cfg.tokenizer, base_url=cfg.base_url, seed=cfg.seed)

    def make_env() -> Any:
        env = gym.make(cfg.env, tokenizer=engine.tokenizer, **cfg.env_kwargs).unwrapped
        return apply_baseline(env, cfg.baseline)

    greedy = cfg.temperature == 0 or (cfg.temperature is None and cfg.n == 1)
    # the runner adds each env's own stop strings to every request
    params = SamplingParams(
        temperature=0.0 if greedy else (cfg.temperature if cfg.temperature is not None else 0.6),
        top_p=1.0 if greedy else cfg.top_p,
        top_k=-1 if greedy else cfg.top_k,
        max_tokens=cfg.max_response_tokens,
        seed=cfg.seed,
    )
    indices = list(range(cfg.first_task, cfg.first_task + count))
    trajs = asyncio.run(run_episodes(engine, make_env, params, tasks=indices, group_size=cfg.n,
                                     max_response_tokens=cfg.max_response_tokens, seed=cfg.seed, progress=True))
    samples = []
    for i, t in enumerate(trajs):
        c = t.components
        samples.append({
            "task_id": t.task_id, "sample": i % cfg.n, "reward": t.reward,
            "correct": float(c.get("correct", 0.0)), "em": c.get("em", 0.0), "f1": c.get("f1", 0.0),
            "format_ok": float(bool(c.get("format_ok"))), "tool_calls": t.tool_calls,
            "truncated": float(t.truncated), "response_tokens": sum(t.loss_mask),
            "pred": c.get("pred"), "gold": c.get("gold"),
            "response": engine.tokenizer.decode(t.response_ids),
        })
    metrics = summarize(samples, cfg.ks)
    summary = {
        "metrics": metrics,
        "config": asdict(cfg),
        "env": {"id": cfg.env, "tools": sorted(probe.tools), "max_tool_calls": probe.max_tool_calls,
                "max_calls_per_tool": probe.max_calls_per_tool, "protocol": probe.protocol.name,
                "tasks": total},
        "sampling": asdict(params) if hasattr(params, "__dataclass_fields__") else str(params),
    }
    if cfg.out:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "samples.jsonl", "w") as f:
            for s in samples:
                f.write(json.dumps(s, default=str) + "\n")
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("evaluate", help="evaluate a model on an env (pass@k, reward components)")
    p.add_argument("--env", required=True)
    p.add_argument("--model", required=True, help="checkpoint dir (vllm/hf) or served model name (openai)")
    p.add_argument("--engine", default="vllm", choices=["vllm", "hf", "openai"])
    p.add_argument("--base-url")
    p.add_argument("--tokenizer")
    p.add_argument("--n", type=int, default=1, help="samples per task")
    p.add_argument("--k", default="1", help="comma-separated k values for pass@k")
    p.add_argument("--limit", type=int, default=100, help="number of tasks (0: all)")
    p.add_argument("--first-task", type=int, default=0)
    p.add_argument("--temperature", type=float)
    p.add_argument("--max-response-tokens", type=int, default=1024)
    p.add_argument("--baseline", default="tools", choices=BASELINES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--env-kwargs", default="{}", help='JSON, e.g. \'{"max_tool_calls": 5}\'')
    p.add_argument("--out", help="folder for samples.jsonl and summary.json")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    cfg = EvalConfig(
        env=args.env, model=args.model, engine=args.engine, base_url=args.base_url, tokenizer=args.tokenizer,
        n=args.n, ks=tuple(int(k) for k in args.k.split(",")), limit=args.limit or None,
        first_task=args.first_task, temperature=args.temperature, max_response_tokens=args.max_response_tokens,
        baseline=args.baseline, seed=args.seed, env_kwargs=json.loads(args.env_kwargs), out=args.out,
    )
    try:
        check_eval_inputs(cfg)
    except USER_ERRORS as exc:  # the message names the option, file and line: no traceback needed
        raise SystemExit(f"evaluate: {type(exc).__name__}: {exc}") from exc
    summary = evaluate(cfg)
    for key, value in summary["metrics"].items():
        print(f"{key:>18}: {value:.4f}")
    return 0
