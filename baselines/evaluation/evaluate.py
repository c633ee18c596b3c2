"""Evaluate a model on an env: n samples per task, pass@1 / pass@k and every reward component.

    agent-envs evaluate --env AgentMath-v0 --model runs/quickstart/rl/final --n 4 --k 1,4 --limit 100
    agent-envs evaluate --env AgentQA-HotpotQA-v0 --engine openai --base-url http://127.0.0.1:8000/v1 \\
        --model Qwen2.5-7B-Instruct --tokenizer Qwen/Qwen2.5-7B-Instruct

    agent-envs evaluate --env AgentQA-v0 --model M --retriever ... --record runs/eval_rec
    agent-envs evaluate --replay runs/eval_rec      # offline: no search API, browser or judge
    agent-envs evaluate --env AgentMath-v0 --model M --n 4 --repeats 3    # noise floor per score

Writes `samples.jsonl` (one row per episode: task, sample, seed, reward components, tool calls,
response text), `trajectories.jsonl` (the same episodes in tokens, with loss mask and entropy, for
`agent-envs analyze`) and `summary.json` (the metrics plus everything that defines the run: env and its
kwargs, tool limits, model, engine, sampling, prompting baseline) into `--out`.
pass@1 is the mean over the n samples of each task; pass@k uses the unbiased estimator;
`correct` is math equivalence for math tasks and exact match otherwise; `f1` is reported beside it.

`--record DIR` also keeps every tool result (`tools.jsonl`) and judge verdict (`judge.jsonl`) with
the seeds; `--replay DIR` re-runs that evaluation with those answers instead of the tools and the
judge, compares every score and response with the recorded ones, and says what differs.
`--repeats K` runs K times with seeds seed, seed+1, ...: each metric is then the mean, with its
spread across seeds beside it (the run-to-run noise floor); see docs/training.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
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
    record: str | None = None  # folder for tool results, judge verdicts and seeds
    repeats: int = 1  # runs with seeds seed, seed+1, ...: the spread is the noise floor
    judge_url: str | None = None  # an OpenAI-compatible judge for `judge` tasks (or AGENT_ENVS_JUDGE_URL)
    judge_model: str | None = None
    health: str = "warn"  # rollout health checks: warn | fatal | off (docs/diagnostics.md)

    def validate(self) -> None:
        if self.engine not in ("vllm", "hf", "openai"):
            raise ValueError(f"engine={self.engine!r}: choose vllm, hf or openai")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline={self.baseline!r}: choose one of {BASELINES}")
        if self.n < 1 or any(k > self.n for k in self.ks):
            raise ValueError(f"need n >= max(ks) >= 1, got n={self.n}, ks={self.ks}")
        if self.health not in ("warn", "fatal", "off"):
            raise ValueError(f"health={self.health!r}: choose warn, fatal or off")
        if self.engine == "openai" and not self.base_url:
            raise ValueError("engine=openai needs base_url (e.g. http://127.0.0.1:8000/v1)")
        if self.repeats < 1:
            raise ValueError(f"repeats={self.repeats}: need at least 1")


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
    """Run the evaluation and return the summary (also written to `cfg.out` and `cfg.record`)."""
    return _evaluate(cfg, engine, replay_from=None)[0]


def _evaluate(cfg: EvalConfig, engine: Any, replay_from: Path | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from agent_envs.tools.recording import ToolRecording
    from algorithms.rollout.health import HealthChecker, RecordedEngine

    probe = check_eval_inputs(cfg, engine)
    total = len(probe.tasks)
    count = total - cfg.first_task if cfg.limit is None else min(cfg.limit, total - cfg.first_task)
    if engine is None:
        print(f"evaluate: loading model {cfg.model}", flush=True)  # also the preflight tests' marker
        engine = make_engine(cfg.engine, cfg.model, tokenizer=cfg.tokenizer, base_url=cfg.base_url, seed=cfg.seed)
    health = HealthChecker(mode="off")
    if cfg.health != "off":
        engine = RecordedEngine(engine)
        health = HealthChecker.for_env(probe, mode=cfg.health, engine=engine, tokenizer=engine.tokenizer,
                                       max_response_tokens=cfg.max_response_tokens)
    folder = replay_from or (Path(cfg.record) if cfg.record else None)
    recording = None
    if folder is not None:
        recording = ToolRecording(folder / "tools.jsonl", "replay" if replay_from else "record")
    judge = _judge(cfg, folder, replay=replay_from is not None)
    runs = []
    try:
        for r in range(cfg.repeats):
            runs.append(_evaluate_once(cfg, engine, count, cfg.seed + r, recording, judge, health))
    finally:
        if recording is not None:
            recording.close()
    samples = [s for run_samples, _, _, _ in runs for s in run_samples]
    trajectories = [t for *_, run_trajs in runs for t in run_trajs]
    per_seed = [metrics for _, metrics, _, _ in runs]
    summary = {
        "metrics": per_seed[0] if len(runs) == 1 else {k: _mean([m[k] for m in per_seed]) for k in per_seed[0]},
        "config": asdict(cfg),
        "env": {"id": cfg.env, "tools": sorted(probe.tools), "max_tool_calls": probe.max_tool_calls,
                "max_calls_per_tool": probe.max_calls_per_tool, "protocol": probe.protocol.name,
                "tasks": total},
        "sampling": runs[0][2],
        "seeds": {"sampling": [cfg.seed + r for r in range(cfg.repeats)],
                  "reset": "seed + i for the i-th task of a run (the runner's rule)"},
    }
    if len(runs) > 1:
        summary["noise"] = {k: _spread([m[k] for m in per_seed]) for k in per_seed[0]}
    if recording is not None:
        summary["tool_recording"] = recording.stats()
    for where in {cfg.out, cfg.record} - {None}:
        _write(Path(where), samples, trajectories, summary)
    return summary, samples


def _evaluate_once(cfg: EvalConfig, engine: Any, count: int, seed: int, recording: Any, judge: Any,
                   health: Any) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, Any], list[Any]]:
    from algorithms.rollout import SamplingParams, run_episodes

    env_kwargs = dict(cfg.env_kwargs)
    if judge is not None:
        env_kwargs["reward_kwargs"] = {**env_kwargs.get("reward_kwargs", {}), "judge": judge}

    def make_env() -> Any:
        env = gym.make(cfg.env, tokenizer=engine.tokenizer, **env_kwargs).unwrapped
        if recording is not None:
            env.tools = {name: recording.wrap(tool) for name, tool in env.tools.items()}
        return apply_baseline(env, cfg.baseline)

    greedy = cfg.temperature == 0 or (cfg.temperature is None and cfg.n == 1)
    # the runner adds each env's own stop strings to every request
    params = SamplingParams(
        temperature=0.0 if greedy else (cfg.temperature if cfg.temperature is not None else 0.6),
        top_p=1.0 if greedy else cfg.top_p,
        top_k=-1 if greedy else cfg.top_k,
        max_tokens=cfg.max_response_tokens,
        seed=seed,
    )
    indices = list(range(cfg.first_task, cfg.first_task + count))
    trajs = asyncio.run(run_episodes(engine, make_env, params, tasks=indices, group_size=cfg.n,
                                     max_response_tokens=cfg.max_response_tokens, seed=seed, progress=True))
    report = health.check(trajs) if health.enabled else None
    if report is not None:
        health.raise_or_warn(report.faults)
    samples = []
    for i, t in enumerate(trajs):
        c = t.components
        samples.append({
            "task_id": t.task_id, "sample": i % cfg.n, "seed": seed, "reward": t.reward,
            "correct": float(c.get("correct", 0.0)), "em": c.get("em", 0.0), "f1": c.get("f1", 0.0),
            "format_ok": float(bool(c.get("format_ok"))), "tool_calls": t.tool_calls,
            "truncated": float(t.truncated), "response_tokens": sum(t.loss_mask),
            "pred": c.get("pred"), "gold": c.get("gold"),
            "response": engine.tokenizer.decode(t.response_ids), "health": list(t.health),
        })
    metrics = summarize(samples, cfg.ks)
    if report is not None:
        metrics.update(report.metrics())
    return samples, metrics, asdict(params), trajs


def _judge(cfg: EvalConfig, folder: Path | None, replay: bool) -> Any:
    """The judge to hand the env, when the run records or replays its verdicts (else the env's own)."""
    from agent_envs.rewards.judge import LLMJudge

    given = cfg.env_kwargs.get("reward_kwargs", {}).get("judge")
    given = given if isinstance(given, dict) else {}  # a judge given in --env-kwargs is recorded too
    url = cfg.judge_url or given.get("base_url") or os.environ.get("AGENT_ENVS_JUDGE_URL")
    model = cfg.judge_model or given.get("model")
    if folder is None:
        return LLMJudge(base_url=url, model=model) if cfg.judge_url else None
    verdicts = folder / "judge.jsonl"
    if replay:
        return LLMJudge(model=model, cache_path=str(verdicts), offline=True) if verdicts.is_file() else None
    if not url:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    verdicts.unlink(missing_ok=True)  # a recording holds this run's verdicts only
    verdicts.touch()
    return LLMJudge(base_url=url, model=model, cache_path=str(verdicts))


def _write(out: Path, samples: list[dict[str, Any]], trajectories: list[Any], summary: dict[str, Any]) -> None:
    from algorithms.rollout.trajectory import write_jsonl

    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(trajectories, out / "trajectories.jsonl")
    with open(out / "samples.jsonl", "w") as f:
        for s in samples:
            f.write(json.dumps(s, default=str) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _spread(xs: list[float]) -> dict[str, Any]:
    """Mean, sample standard deviation and range across seeds."""
    m = _mean(xs)
    std = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return {"mean": m, "std": std, "min": min(xs), "max": max(xs), "per_seed": xs}


def replay(folder: str | Path, engine: Any = None, **overrides: Any) -> dict[str, Any]:
    """Re-run a recorded evaluation offline and compare it with the recording.

    The model runs again with the recorded seeds; tools and the judge answer from the recording.
    `overrides` change config fields (e.g. `model=` where the checkpoint moved). The summary gains
    `replay`: `reproduced` (every metric and every response equal), the differences, and the
    recording's counts (`missing` calls mean the model wrote something the recording lacks)."""
    folder = Path(folder)
    try:
        recorded = json.loads((folder / "summary.json").read_text())
        old_samples = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{folder}: not a recorded evaluation ({e.filename} missing); "
                                "record one with `agent-envs evaluate ... --record DIR`") from None
    fields = {**recorded["config"], "record": None, "out": None, **overrides}
    fields["ks"] = tuple(fields["ks"])
    cfg = EvalConfig(**fields)
    summary, replayed = _evaluate(cfg, engine, replay_from=folder)
    differences = {k: (v, summary["metrics"].get(k)) for k, v in recorded["metrics"].items()
                   if summary["metrics"].get(k) != v}
    replayed = json.loads(json.dumps(replayed, default=str))  # compare as the recording stored them
    changed = [i for i, (a, b) in enumerate(zip(old_samples, replayed, strict=False)) if a != b]
    if len(old_samples) != len(replayed):
        changed.append(min(len(old_samples), len(replayed)))
    summary["replay"] = {
        "reproduced": not differences and not changed,
        "metric_differences": differences,
        "samples_changed": len(changed),
        "first_changed_sample": changed[0] if changed else None,
        "tools": summary.get("tool_recording", {}),
    }
    return summary


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("evaluate", help="evaluate a model on an env (pass@k, reward components)")
    p.add_argument("--env", help="env id (required unless --replay)")
    p.add_argument("--model", help="checkpoint dir (vllm/hf) or served model name (openai); "
                   "required unless --replay")
    p.add_argument("--engine", choices=["vllm", "hf", "openai"], help="default vllm (replay: as recorded)")
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
    p.add_argument("--record", metavar="DIR", help="also keep every tool result, judge verdict and seed in DIR")
    p.add_argument("--replay", metavar="DIR", help="re-run the evaluation recorded in DIR offline and "
                   "compare (exit status 1 when it does not reproduce)")
    p.add_argument("--repeats", type=int, default=1, help="runs with seeds seed, seed+1, ...: the spread "
                   "across them is printed beside each score")
    p.add_argument("--judge-url", help="OpenAI-compatible judge for judge-graded tasks (.../v1)")
    p.add_argument("--judge-model")
    p.add_argument("--health", default="warn", choices=["warn", "fatal", "off"],
                   help="rollout health checks (docs/diagnostics.md)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.replay:
        overrides = {k: v for k, v in (("model", args.model), ("tokenizer", args.tokenizer),
                                       ("engine", args.engine),
                                       ("base_url", args.base_url)) if v}
        summary = replay(args.replay, **overrides)
        _print_metrics(summary)
        rep = summary["replay"]
        print(f"replay of {args.replay}: " + ("reproduced exactly" if rep["reproduced"] else
              f"NOT reproduced: {len(rep['metric_differences'])} metrics and {rep['samples_changed']} "
              f"samples differ (first: sample {rep['first_changed_sample']})") + f"; tool calls {rep['tools']}")
        return 0 if rep["reproduced"] else 1
    missing = [flag for flag, value in (("--env", args.env), ("--model", args.model)) if not value]
    if missing:
        raise SystemExit(f"agent-envs evaluate: {' and '.join(missing)} required (or --replay DIR)")
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as e:
        raise SystemExit(f"agent-envs evaluate: --env-kwargs is not JSON ({e})") from None
    cfg = EvalConfig(
        env=args.env, model=args.model, engine=args.engine or "vllm", base_url=args.base_url, tokenizer=args.tokenizer,
        n=args.n, ks=tuple(int(k) for k in args.k.split(",")), limit=args.limit or None,
        first_task=args.first_task, temperature=args.temperature, max_response_tokens=args.max_response_tokens,
        baseline=args.baseline, seed=args.seed, env_kwargs=env_kwargs, out=args.out,
        record=args.record, repeats=args.repeats, judge_url=args.judge_url, judge_model=args.judge_model,
        health=args.health,
    )
    try:
        check_eval_inputs(cfg)
    except USER_ERRORS as exc:  # the message names the option, file and line: no traceback needed
        raise SystemExit(f"evaluate: {type(exc).__name__}: {exc}") from exc
    _print_metrics(evaluate(cfg))
    return 0


def _print_metrics(summary: dict[str, Any]) -> None:
    noise = summary.get("noise", {})
    for key, value in summary["metrics"].items():
        spread = noise.get(key)
        extra = (f"  ± {spread['std']:.4f} across {len(spread['per_seed'])} seeds "
                 f"(range {spread['min']:.4f}–{spread['max']:.4f})") if spread else ""
        print(f"{key:>18}: {value:.4f}{extra}")
