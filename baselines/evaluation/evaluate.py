"""Evaluate a model on an env: n samples per task, pass@1 / pass@k and every reward component.

    agent-envs evaluate runs/quickstart         # its RL run: greedy and sampled, as the quickstart showed
    agent-envs evaluate --model runs/quickstart/grpo/final_model --n 4 --k 1,4   # the run's env and sampling
    agent-envs evaluate --env AgentMath-v0 --model tiny --engine hf --limit 8 env_kwargs.max_tool_calls=1
    agent-envs evaluate --env AgentQA-HotpotQA-v0 --engine openai --base-url http://127.0.0.1:8000/v1 \\
        --model Qwen2.5-7B-Instruct --tokenizer Qwen/Qwen2.5-7B-Instruct

    agent-envs evaluate --env AgentQA-v0 --model M --record runs/eval_rec
    agent-envs evaluate --replay runs/eval_rec      # offline: no search API, browser or judge
    agent-envs evaluate --env AgentMath-v0 --model M --n 4 --repeats 3    # noise floor per score

Writes `samples.jsonl` (one row per episode: task, sample, seed, reward components, tool calls,
response text), `trajectories.jsonl` (the same episodes in tokens, with loss mask and entropy, for
`agent-envs analyze`) and `summary.json` (the metrics plus everything that defines the run: env and its
kwargs, tool limits, model, engine, sampling, prompting baseline) into `--out`.
pass@1 is the mean over the n samples of each task; pass@k uses the unbiased estimator;
`correct` is math equivalence for math tasks and exact match otherwise; `f1` is reported beside it,
and `answer_in_response` (a golden answer anywhere in the response, as whole normalised words: a
lenient upper bound for zero-shot baselines that never write the answer format).
Given a run (its folder, its final_model folder, or the quickstart's folder, which names its RL
run), the run's env, env_kwargs, sampling and engine are used, and tasks default to held-out ones:
the run's last `eval_episodes` tasks, which its training never drew (`plan.py` says which and why);
the choice is printed before the run starts. With no sampling setting on the command line, a run
is scored twice, greedily and with `RUN_SAMPLES` samples per task at its own sampling setup, by
`evaluate_greedy_and_sampled`: the code path of the quickstart and `compare`, so the figures match
theirs for the same seed and engine. vLLM's log lines are hidden unless `--verbose`.

`--record DIR` also keeps every tool result (`tools.jsonl`) and judge verdict (`judge.jsonl`) with
the seeds; `--replay DIR` re-runs that evaluation with those answers instead of the tools and the
judge, compares every score and response with the recorded ones, and says what differs.
`--repeats K` runs K times with seeds seed, seed+1, ...: each metric is then the mean, with its
spread across seeds beside it (the run-to-run noise floor); see docs/training.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym

import agent_envs  # noqa: F401  (registers the ids)
from agent_envs.base.config import (
    UserError,
    add_flags,
    build_config,
    check_types,
    flag_values,
    from_mapping,
    option,
    require,
)
from agent_envs.envs import check_env_id, env_settings_help
from agent_envs.rewards.qa import answer_in_text
from algorithms.base.preflight import check_engine, check_env, check_model
from baselines.evaluation.passk import summarize, tool_use_by_need
from baselines.evaluation.plan import DEFAULT_SAMPLING, SAMPLING_KEYS, held_out_range, run_model, run_settings
from baselines.prompting import BASELINES, apply_baseline

Engine = Literal["vllm", "hf", "openai", "openai-chat"]
# episodes per task of a run's sampled evaluation (the quickstart's, compare's, `evaluate RUN`'s)
RUN_SAMPLES = 4
Baseline = Literal[BASELINES]
Health = Literal["warn", "fatal", "off"]


@dataclass
class EvalConfig:
    """Everything that defines an evaluation. Settings left at null are taken from the run that
    made `model` (its config.json beside final_model), else from the defaults; see `plan.py`."""

    env: str | None = option(None, "env id (null: the run's env when --model is a run's final_model)")
    model: str | None = option(None, "a run's final_model folder (its env, env_kwargs and sampling are "
                               "used), a checkpoint folder, tiny, a hub id, or a served model name (openai)")
    engine: Engine | None = option(None, "vllm (in-process), hf (transformers, CPU), openai (a completions "
                                   "server: --base-url) or openai-chat (a chat-only endpoint such as a hosted "
                                   "model: --base-url); null: the run's engine (hf for an SFT run), else vllm")
    base_url: str | None = option(None, "OpenAI-compatible server of engine=openai (.../v1)")
    tokenizer: str | None = option(None, "tokenizer folder or hub id (null: the model's)")
    n: int = option(1, "samples per task")
    ks: tuple[int, ...] = option((1,), "k values of pass@k, e.g. 1,4 (each <= n)")
    limit: int | None = option(100, "number of tasks (0 or null: all)")
    first_task: int | None = option(None, "first task index (null: held-out tasks: the run's last eval_episodes, "
                                    "else the env's last `limit`)")
    temperature: float | None = option(None, "sampling temperature (null: the run's; without a run, greedy "
                                       "when n == 1, else 0.6); 0 is greedy")
    top_p: float | None = option(None, "nucleus mass (null: the run's, else 0.95)")
    top_k: int | None = option(None, "top-k (null: the run's, else 20; -1: off)")
    max_response_tokens: int | None = option(None, "per episode, model and tool tokens (null: the run's, else 1024)")
    baseline: Baseline = option("tools", "prompting baseline: tools (the env as is), cot or direct (no tools)")
    seed: int = option(0, "sampling seed (run r of --repeats uses seed + r)")
    env_kwargs: dict = option(factory=dict, help="env settings over the run's (env_kwargs.max_tool_calls=1)")
    out: str | None = option(None, "folder for samples.jsonl, trajectories.jsonl and summary.json")
    record: str | None = option(None, "also keep every tool result, judge verdict and seed in this folder")
    repeats: int = option(1, "runs with seeds seed, seed+1, ...: the spread is the noise floor")
    judge_url: str | None = option(None, "OpenAI-compatible judge for judge-graded tasks (or AGENT_ENVS_JUDGE_URL)")
    judge_model: str | None = option(None, "the judge's model name")
    health: Health = option("warn", "rollout health checks: warn, fatal or off (docs/diagnostics.md)")
    verbose: bool = option(False, "show the engine's own log lines (vLLM's), hidden by default")

    def validate(self) -> None:
        check_types(self)
        if self.limit == 0:
            self.limit = None
        # sampling settings are checked here, before the model loads (the engine would refuse them later)
        require(self.n >= 1, "n", "must be >= 1 (samples per task)", self.n)
        require(self.temperature is None or self.temperature >= 0, "temperature", "must be >= 0 (0: greedy)",
                self.temperature)
        require(self.top_p is None or 0 < self.top_p <= 1, "top_p", "must be in (0, 1]", self.top_p)
        require(self.top_k is None or self.top_k == -1 or self.top_k >= 1, "top_k", "must be >= 1, or -1 (off)",
                self.top_k)
        require(self.max_response_tokens is None or self.max_response_tokens >= 1, "max_response_tokens",
                "must be >= 1", self.max_response_tokens)
        require(all(1 <= k <= self.n for k in self.ks), "ks", f"needs n >= max(ks) >= 1 (n={self.n})", self.ks)
        require(not (self.engine or "").startswith("openai") or bool(self.base_url), "base_url",
                f"is needed by engine={self.engine} (e.g. http://127.0.0.1:8000/v1)", self.base_url)
        if self.repeats < 1:
            raise ValueError(f"config field 'repeats' must be >= 1, got repeats={self.repeats}")
        require(self.limit is None or self.limit >= 1, "limit", "must be >= 1, or 0/null for all", self.limit)


def resolve(cfg: EvalConfig, engine: Any = None) -> tuple[EvalConfig, Any, list[str]]:
    """`cfg` with every null setting filled from the model's run or the defaults, the env (made
    without a tokenizer, its data checked) and the lines saying what is used and why."""
    if not cfg.model:
        raise UserError("evaluate needs --model: a run's final_model folder, a checkpoint, tiny, or a served model")
    if cfg.engine is None or not cfg.engine.startswith("openai"):  # a served model's name is no folder
        cfg = dataclasses.replace(cfg, model=run_model(cfg.model))
    run, run_from = run_settings(cfg.model)
    sources: dict[str, str] = {}
    if cfg.engine is None:
        engine_kind, sources["engine"] = run.get("engine", "vllm"), run_from.get("engine", "default")
        cfg = dataclasses.replace(cfg, engine=engine_kind)
    env = cfg.env or run.get("env")
    if env is None:
        raise UserError(f"evaluate needs --env: {cfg.model} is not a run's model (no config.json of a run beside "
                        "it) and names no env")
    sources["env"] = "command line" if cfg.env else run_from["env"]
    same_env = env == run.get("env")
    env_kwargs = _merge(run["env_kwargs"], cfg.env_kwargs) if same_env else dict(cfg.env_kwargs)
    kw_from = [f"{run_from['env_kwargs']}" for _ in [0] if same_env and run["env_kwargs"]]
    kw_from += [f"command line: {', '.join(sorted(cfg.env_kwargs))}" for _ in [0] if cfg.env_kwargs]
    sources["env_kwargs"] = "; ".join(kw_from) or "none"
    check_env_id(env)  # the settings are checked where the env is made (check_eval_inputs)
    sampling: dict[str, Any] = {}
    for key in SAMPLING_KEYS:
        given = getattr(cfg, key)
        if given is not None:
            sampling[key], sources[key] = given, "command line"
        elif same_env and key in run:
            sampling[key], sources[key] = run[key], run_from[key]
        elif key == "temperature":
            sampling[key], sources[key] = (0.0, "default: greedy, n=1") if cfg.n == 1 else (0.6, "default")
        else:
            sampling[key], sources[key] = DEFAULT_SAMPLING[key], "default"
    if sampling["temperature"] == 0:  # greedy: the nucleus settings do not apply
        sampling.update(top_p=1.0, top_k=-1)
        sources.update(top_p="greedy", top_k="greedy")
    resolved = dataclasses.replace(cfg, env=env, env_kwargs=env_kwargs, **sampling)
    probe = check_eval_inputs(resolved, engine)
    # the run's tail only describes the tasks it trained around when the env is the run's own
    run_held_out = run.get("eval_episodes") if same_env else None
    first, count, why = held_out_range(probe.tasks, resolved.limit, resolved.first_task, run_held_out)
    if run_held_out and resolved.first_task is None:
        why += f" ({run_from['eval_episodes']})"
    resolved = dataclasses.replace(resolved, first_task=first, limit=count)
    show = ", ".join(f"{k}={sampling[k]} ({sources[k]})" for k in SAMPLING_KEYS)
    lines = [f"env {env} ({sources['env']})",
             f"env_kwargs {json.dumps(env_kwargs, default=str)} ({sources['env_kwargs']})",
             f"tasks {first}-{first + count - 1}: {why}",
             f"sampling {show}; n={cfg.n}, seed={cfg.seed}; engine {cfg.engine} ({sources.get('engine', 'command line')})"]
    return resolved, probe, lines


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def model_folder(model: str) -> str:
    """What `--model` names as a folder to load, by the one resolver the learner uses: `tiny` is
    built locally (cached, offline), `smollm2` converted once; a folder or hub id is itself."""
    from algorithms.models.resolve import resolve_model

    return resolve_model(model)


def make_engine(kind: str, model: Any, *, tokenizer: str | None = None, base_url: str | None = None,
                seed: int = 0, max_model_len: int = 4096, verbose: bool = False, **engine_kwargs: Any) -> Any:
    """A rollout engine for evaluation (`algorithms.rollout.engines`, the one factory); vLLM's own
    log lines (its config dump, load times, CPU tuning hints) are hidden unless `verbose`."""
    from algorithms.rollout.engines import make_engine as build

    if kind.startswith("openai") and tokenizer is None and kind != "openai-chat":
        tokenizer = str(model)
    kwargs = {"tokenizer": tokenizer, "base_url": base_url, "seed": seed, "max_model_len": max_model_len,
              **engine_kwargs}
    if kind != "vllm" or verbose:
        return build(kind, model, **kwargs)
    quiet_vllm()
    with warnings.catch_warnings():  # the deprecation notes its first import sets off
        warnings.simplefilter("ignore")
        return build(kind, model, **kwargs)


def run_engine(run_cfg: Any, model: str, *, seed: int) -> tuple[str, Any]:
    """The kind and a loaded engine for evaluating `model` as the run of `run_cfg` rolled out: vLLM
    with the run's engine settings (on SmolLM2 it decodes faster than HF, docs/benchmarks.md),
    else HF (a served engine's address is not where this run's model is)."""
    if run_cfg.engine != "vllm":
        return "hf", make_engine("hf", model, seed=seed)
    return "vllm", make_engine("vllm", model, seed=seed, **run_cfg.engine_kwargs)


def quiet_vllm() -> None:
    """Errors only from vLLM's loggers (its CPU tuning hints and load times are not the user's
    business): the level is read from the environment when vLLM is first imported, and set on its
    logger for an import that came earlier. A VLLM_LOGGING_LEVEL the user set is kept."""
    import logging

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"])


def load_engine(cfg: EvalConfig) -> Any:
    """The engine of a resolved config: its model loaded (a named model built first)."""
    model = cfg.model if cfg.engine.startswith("openai") else model_folder(cfg.model)
    # a vLLM run's engine settings (max_model_len, enforce_eager) load its model as it trained
    run_kwargs = run_settings(cfg.model)[0].get("engine_kwargs", {}) if cfg.engine == "vllm" else {}
    print(f"evaluate: loading model {cfg.model}", flush=True)  # also the preflight tests' marker
    return make_engine(cfg.engine, model, tokenizer=cfg.tokenizer, base_url=cfg.base_url, seed=cfg.seed,
                       verbose=cfg.verbose, **run_kwargs)


def check_eval_inputs(cfg: EvalConfig, engine: Any = None) -> Any:
    """The config, the env with its task data, and (without a ready engine) the model path and
    engine package: checked before an engine loads the model. Returns the env, made without a
    tokenizer."""
    cfg.validate()
    probe = check_env(cfg.env, cfg.env_kwargs, key="--env")
    if engine is None and not (cfg.engine or "").startswith("openai"):  # a served model's name is not a path
        check_model(cfg.model, key="--model")
        check_engine(cfg.engine or "vllm", key="--engine")
    return probe


def evaluate(cfg: EvalConfig, engine: Any = None) -> dict[str, Any]:
    """Run the evaluation and return the summary (also written to `cfg.out` and `cfg.record`)."""
    return _evaluate(cfg, engine, replay_from=None)[0]


def evaluate_greedy_and_sampled(cfg: EvalConfig, samples: int = RUN_SAMPLES, engine: Any = None,
                                folders: tuple[str | None, str | None] | None = None) -> dict[str, dict[str, Any]]:
    """How a run is reported, by the quickstart, `compare` and `agent-envs evaluate RUN` alike: on
    the same tasks and with one engine, greedily (one episode per task), then `samples` episodes
    per task at `cfg`'s sampling setup (null settings: the run's own, the policy it trained).
    Summaries go to `folders` (greedy, sampled), by default `<cfg.out>/greedy` and `<cfg.out>/sampled`."""
    if folders is None:
        folders = (None, None) if cfg.out is None else (str(Path(cfg.out) / "greedy"), str(Path(cfg.out) / "sampled"))
    greedy = dataclasses.replace(cfg, n=1, ks=(1,), temperature=0.0, top_p=None, top_k=None, out=folders[0])
    sampled = dataclasses.replace(cfg, n=samples, ks=(1,), out=folders[1])
    greedy_summary, _, engine = _evaluate(greedy, engine, replay_from=None)  # loads the engine when none is given
    return {"greedy": greedy_summary, "sampled": evaluate(sampled, engine)}


def _evaluate(cfg: EvalConfig, engine: Any,
              replay_from: Path | None) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    """The summary, the samples, and the engine used (loaded here when `engine` is None)."""
    from agent_envs.tools.recording import ToolRecording
    from algorithms.rollout.health import HealthChecker, RecordedEngine

    cfg, probe, plan = resolve(cfg, engine)
    total, count = len(probe.tasks), cfg.limit
    for line in plan:  # what is evaluated and where each setting came from, before the long part
        print(f"evaluate: {line}", flush=True)
    if engine is None:
        engine = load_engine(cfg)
    loaded = engine
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
            runs.append(_evaluate_once(cfg, engine, count, cfg.seed + r, recording, judge, health, probe.tasks))
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
    return summary, samples, loaded


def _evaluate_once(cfg: EvalConfig, engine: Any, count: int, seed: int, recording: Any, judge: Any,
                   health: Any, tasks: Any) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, Any], list[Any]]:
    from algorithms.rollout import SamplingParams, run_episodes

    env_kwargs = dict(cfg.env_kwargs)
    if judge is not None:
        env_kwargs["reward_kwargs"] = {**env_kwargs.get("reward_kwargs", {}), "judge": judge}

    def make_env() -> Any:
        env = gym.make(cfg.env, tokenizer=engine.tokenizer, **env_kwargs).unwrapped
        if recording is not None:
            env.tools = {name: recording.wrap(tool) for name, tool in env.tools.items()}
        return apply_baseline(env, cfg.baseline)

    # resolved by `resolve`: greedy is temperature 0 with the nucleus settings off; the runner
    # adds each env's own stop strings to every request
    params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                            max_tokens=cfg.max_response_tokens, seed=seed)
    indices = list(range(cfg.first_task, cfg.first_task + count))
    trajs = asyncio.run(run_episodes(engine, make_env, params, tasks=indices, group_size=cfg.n,
                                     max_response_tokens=cfg.max_response_tokens, seed=seed, progress=True))
    report = health.check(trajs) if health.enabled else None
    if report is not None:
        health.raise_or_warn(report.faults)
    answers = {task.id: task.answers for task in (tasks[j] for j in indices)}
    samples = []
    for i, t in enumerate(trajs):
        c = t.components
        response = engine.tokenizer.decode(t.response_ids)
        samples.append({
            "task_id": t.task_id, "sample": i % cfg.n, "seed": seed, "reward": t.reward,
            "correct": float(c.get("correct", 0.0)), "em": c.get("em", 0.0), "f1": c.get("f1", 0.0),
            "format_ok": float(bool(c.get("format_ok"))), "tool_calls": t.tool_calls,
            "truncated": float(t.truncated), "response_tokens": sum(t.loss_mask),
            "pred": c.get("pred"), "gold": c.get("gold"),
            # lenient: a golden answer anywhere in the response, for models that skip the format
            "answer_in_response": float(answer_in_text(response, answers.get(t.task_id, []))),
            "response": response, "health": list(t.health),
        })
    metrics = summarize(samples, cfg.ks)
    # split where the world says whether a task needs a tool: needless calls show as `easy_tool_rate`
    needs = {t.id: t.metadata["needs_tool"] for t in (tasks[j] for j in indices) if "needs_tool" in t.metadata}
    metrics.update(tool_use_by_need(samples, needs))
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
    recorded, old_samples = _read_recording(folder)
    fields = {**recorded["config"], "record": None, "out": None, **overrides}
    cfg = from_mapping(EvalConfig, fields, f"{folder / 'summary.json'}: config")
    summary, replayed, _ = _evaluate(cfg, engine, replay_from=folder)
    differences = {k: (v, summary["metrics"].get(k)) for k, v in recorded["metrics"].items()
                   if summary["metrics"].get(k) != v}
    replayed = json.loads(json.dumps(replayed, default=str))  # compare as the recording stored them
    # on the recorded keys: a column added since the recording was made is not a difference
    changed = [i for i, (a, b) in enumerate(zip(old_samples, replayed, strict=False))
               if a != {key: b.get(key) for key in a}]
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


def _read_recording(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary and samples of a recorded evaluation, or a UserError saying which file is wrong."""
    if not folder.is_dir():
        raise FileNotFoundError(f"--replay {folder}: no such folder; record one with "
                                "`agent-envs evaluate ... --record DIR`")
    rows = []
    for name in ("summary.json", "samples.jsonl"):
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"{folder} is not a recorded evaluation ({name} missing); record one with "
                                    "`agent-envs evaluate ... --record DIR`")
        lines = path.read_text().splitlines() if name.endswith("l") else [path.read_text()]
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append((name, json.loads(line)))
            except ValueError as exc:
                where = f"{path}, line {i}" if name.endswith("l") else str(path)
                raise UserError(f"{where}: not valid JSON ({exc}); the recording is damaged, record it again") from None
    summary = rows[0][1]
    if not isinstance(summary, dict) or not isinstance(summary.get("config"), dict) or "metrics" not in summary:
        raise UserError(f"{folder / 'summary.json'}: no config and metrics of a recorded evaluation in it")
    return summary, [r for name, r in rows[1:] if name == "samples.jsonl"]


# the settings shown as --flags (all of EvalConfig); the rest of the command line is key=value
FLAGS = tuple(f.name for f in dataclasses.fields(EvalConfig))


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "evaluate", help="evaluate a model on an env (pass@k, reward components)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Evaluate a model. Given a run (its folder or its final_model folder), the run's env, "
                    "env_kwargs, sampling and engine are used unless set here, and tasks default to its "
                    "held-out ones; with no sampling setting (n, ks, temperature, top_p, top_k) it is scored "
                    f"greedily and at its sampling setup with {RUN_SAMPLES} samples per task, as the quickstart "
                    "and compare report it. What is used, and from where, is printed before the run starts.",
        epilog="Every setting is also a key=value argument (n=4, env_kwargs.world.difficulty=2) and a "
               "key in --config; the env is --env (or env=ID) everywhere.\n\n"
               f"env settings (env_kwargs.KEY=value):\n{env_settings_help()}",
    )
    add_flags(p, EvalConfig, FLAGS)
    p.add_argument("--k", dest="ks", default=None, metavar="K,K", help="the same as --ks")
    p.add_argument("--config", default=None, help="YAML file of config keys (key: value)")
    p.add_argument("--replay", metavar="DIR", help="re-run the evaluation recorded in DIR offline and "
                   "compare (exit status 1 when it does not reproduce)")
    p.add_argument("overrides", nargs="*", metavar="[RUN] key=value",
                   help="a run folder (the same as --model RUN), then config overrides; dotted keys reach in")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    given = flag_values(args, FLAGS, EvalConfig)
    if args.replay:
        overrides = {k: v for k, v in given.items() if k in ("model", "tokenizer", "engine", "base_url")}
        summary = replay(args.replay, **overrides)
        _print_metrics(summary)
        rep = summary["replay"]
        print(f"replay of {args.replay}: " + ("reproduced exactly" if rep["reproduced"] else
              f"NOT reproduced: {len(rep['metric_differences'])} metrics and {rep['samples_changed']} "
              f"samples differ (first: sample {rep['first_changed_sample']})") + f"; tool calls {rep['tools']}")
        return 0 if rep["reproduced"] else 1
    overrides = [item for item in args.overrides if "=" in item]
    runs = [item for item in args.overrides if "=" not in item]
    if len(runs) > 1 or (runs and "model" in given):
        named = runs + ([f"--model {given['model']}"] if "model" in given else [])
        raise UserError(f"evaluate takes one model or run folder, got {', '.join(named)}; other settings are "
                        "key=value")
    if runs:
        given["model"] = runs[0]
    cfg = build_config(EvalConfig, args.config, overrides, given=given)
    if cfg.model and run_settings(run_model(cfg.model))[0] and not _sampling_named(given, overrides, args.config):
        # a run's model with no sampling settings: the two numbers its quickstart or compare showed
        results = evaluate_greedy_and_sampled(cfg)
        for kind, summary in results.items():
            params = summary["sampling"]
            setup = ("T=0, 1 sample per task" if kind == "greedy" else
                     f"T={params['temperature']:g}, top_p={params['top_p']:g}, top_k={params['top_k']}, "
                     f"{summary['config']['n']} samples per task")
            print(f"\n{kind} ({setup}):")
            _print_metrics(summary)
        print("\n" + "  ".join(f"{kind} pass@1 {r['metrics']['pass@1']:.3f}" for kind, r in results.items()))
        return 0
    _print_metrics(evaluate(cfg))
    return 0


def _sampling_named(given: dict[str, Any], overrides: list[str], config: str | None) -> bool:
    """Whether the command line or --config set how many samples to draw or how (or asks to record
    or repeat, which apply to one evaluation)."""
    from agent_envs.base.config import load_preset

    keys = set(given) | {item.partition("=")[0].strip() for item in overrides}
    keys |= set(load_preset(config)) if config else set()
    return bool(keys & {"n", "ks", "temperature", "top_p", "top_k", "record", "repeats"})


def _print_metrics(summary: dict[str, Any]) -> None:
    noise = summary.get("noise", {})
    for key, value in summary["metrics"].items():
        spread = noise.get(key)
        extra = (f"  ± {spread['std']:.4f} across {len(spread['per_seed'])} seeds "
                 f"(range {spread['min']:.4f}–{spread['max']:.4f})") if spread else ""
        print(f"{key:>18}: {value:.4f}{extra}")
