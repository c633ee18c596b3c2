"""Baseline comparisons: N algorithms x seeds on the same env, model and sample budget.

    agent-envs compare --algos grpo,dapo,arpo,aepo --seeds 0,1,2 --out runs/compare \\
        model=runs/quickstart/sft/final_model total_steps=100
    agent-envs compare --report-only runs/compare        # rebuild table and plots, no training
    agent-envs compare --report-only runs/a,runs/b --out runs/ab --baselines grpo,arpo  # one report of both
    agent-envs compare ... --resume      # after a stop: finished runs are kept, the others resume
    agent-envs compare ... --overwrite   # remove the comparison in --out, then start afresh

Each (algorithm, seed) trains from `--config` (default `configs/{algo}_tiny.yaml`; `{algo}` is
filled in) with the shared `key=value` overrides plus `seed`, `output_dir`, `threads` and
`eval_episodes` (= `--eval-tasks`, so training never draws the tasks it is scored on); then
its final model is evaluated on the env's last `--eval-tasks` tasks twice: greedily, and with
`--eval-samples` samples per task at the run's own training sampling setup (temperature, top_p,
top_k), i.e. the policy that was trained.

Runs go to `--jobs` worker processes at once (default: one per core, at most one per run); each
worker gets cores / jobs torch threads (or a `threads=N` override's N) so that parallel runs do
not oversubscribe the CPU, and
writes its output to `<out>/<algo>-<seed>/log.txt`.

`--out` must not hold another comparison (algorithms/core/run_folder.py): `--overwrite` removes
it first, and `--resume` carries a comparison across stops (a long one on a small machine takes
days): runs that wrote their `result.json` are kept as they are, and every other run continues
from its newest checkpoint (`save_every` sets how often a run writes one; resumption is exact), or
starts if it has none. A resume must ask for what the folder's comparison asked (preset, held-out
tasks, samples, and each run's learner settings; `total_steps` may grow), or it names the keys
that differ and stops; algorithms and seeds may be added. A resumed run's `train_s` is the sum of
its steps' times (`time_step_s`, model loading left out), since the call that finished it trained
only the last steps.

Written to `--out`: `compare.json` (what was asked), `<algo>-<seed>/result.json` (the raw numbers
of one run, curves included), and from those `results.md`, `results.json` and `results.png`
(see `report.py`); `--report-only` rebuilds the last three from an existing directory, or writes
them to `--out` for the runs of several directories scored on the same tasks (a rule trained later,
a setting varied by an override), each run named by its algorithm and, where folders share an
algorithm, by its folder's own overrides.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from agent_envs.base.config import (
    UserError,
    add_flags,
    build_config,
    check_types,
    config_dict,
    field_help,
    flag_values,
    option,
    require,
    suggest,
)
from algorithms.base.presets import find_preset
from algorithms.core.threads import available_cores
from baselines.comparison.report import MANIFEST, RUN_RESULT, write_report

# the per-step metrics kept in result.json for the curves
CURVE_KEYS = ("env_reward_mean", "reward_mean", "accuracy", "tool_calls_mean", "response_length_mean", "num_trajectories")
# the env_kwargs that pick the task set, in place of the world; the others (reward, prompt, tool
# limits) leave the tasks as they are
TASK_KWARGS = ("data_files", "benchmark", "split", "tasks")


@dataclass
class RunSpec:
    """One (algorithm, seed) run of a comparison: enough to run it in a fresh process."""

    algo: str
    seed: int
    config: str
    overrides: list[str]
    run_dir: str
    eval_tasks: int = 64
    eval_samples: int = 4
    threads: int = 1
    log_to_file: bool = False
    resume: bool = False


def plan_parallelism(runs: int, jobs: int | None, cores: int | None = None,
                     overrides: Sequence[str] = ()) -> tuple[int, int]:
    """(worker processes, torch threads per worker): by default one worker per core (at most one
    per run), and the cores shared out so that workers x threads <= cores. A `threads=N` override
    wins (two comparisons side by side, one thread each); `threads=auto` is the share."""
    cores = cores or available_cores()
    jobs = max(1, min(runs, jobs if jobs else cores))
    given = [v.strip() for k, _, v in (o.partition("=") for o in overrides) if k.strip() == "threads"]
    if given and given[-1] != "auto":
        if not given[-1].isdigit() or int(given[-1]) < 1:
            raise UserError(f"compare: override 'threads={given[-1]}': use an integer >= 1 or auto")
        return jobs, int(given[-1])
    return jobs, max(1, cores // jobs)


def spec_config(spec: RunSpec) -> Any:
    """The learner config of one run: its preset, the shared overrides, then seed, folder, threads
    and the held-out tail, which is exactly the tasks the run is evaluated on."""
    from agent_envs.base.config import build_config
    from algorithms.cli import learner_class

    return build_config(learner_class(spec.algo).config_class, find_preset(spec.config.format(algo=spec.algo)),
                        [*spec.overrides, f"seed={spec.seed}", f"output_dir={spec.run_dir}",
                         f"threads={spec.threads}", f"eval_episodes={spec.eval_tasks}"])


def check_eval_episodes(overrides: list[str], eval_tasks: int) -> None:
    """Refuse an `eval_episodes` override that differs from `--eval-tasks`: the runs would train on
    tasks they are scored on, or hold out tasks nobody scores."""
    for item in overrides:
        key, _, value = item.partition("=")
        if key.strip() == "eval_episodes" and value.strip() != str(eval_tasks):
            raise UserError(f"compare: override {item!r}: every run holds out exactly its evaluation tasks; "
                            f"set --eval-tasks instead (now {eval_tasks})")


def task_source(env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What picks an env's tasks: its data settings when it has any, else its world's settings."""
    given = {k: env_kwargs[k] for k in TASK_KWARGS if env_kwargs.get(k) is not None}
    return given or {"world": env_kwargs.get("world")}


def sft_warning(cfg: Any, num_tasks: int, eval_tasks: int) -> str | None:
    """A warning when the runs' starting model came from an SFT run whose gold-trace tasks reach
    the evaluation tasks (same env and task set), so the scores would include trained-on tasks."""
    from baselines.evaluation.plan import find_run_config, sft_overlap

    path = find_run_config(cfg.model)
    if path is None:
        return None
    run = json.loads(path.read_text())
    if run.get("env") != cfg.env or task_source(run.get("env_kwargs") or {}) != task_source(cfg.env_kwargs):
        return None
    problem = sft_overlap(run, num_tasks, num_tasks - eval_tasks)
    return f"the model's SFT run {path}: {problem}, or lower --eval-tasks" if problem else None


def run_one(spec: RunSpec) -> dict[str, Any]:
    """Train one run, evaluate its final model greedily and at its training sampling setup, and
    write `<run_dir>/result.json`; returns that result."""
    import gymnasium as gym

    from algorithms.cli import learner_class
    from algorithms.core.run_log import read_metrics
    from baselines.evaluation.evaluate import EvalConfig, evaluate_greedy_and_sampled, run_engine

    run_dir = Path(spec.run_dir)
    if spec.resume and (run_dir / RUN_RESULT).is_file():
        print(f"compare: {spec.algo} seed {spec.seed}: finished ({run_dir / RUN_RESULT}): kept", flush=True)
        return json.loads((run_dir / RUN_RESULT).read_text())
    (run_dir / RUN_RESULT).unlink(missing_ok=True)  # a resumed run must not leave its old result behind
    cls = learner_class(spec.algo)
    cfg = spec_config(spec)
    t0 = time.perf_counter()
    learner = cls(cfg)
    learner.train(resume="auto" if spec.resume else None)
    train_s = time.perf_counter() - t0
    # its model copies, optimizer state and engine hold several GB on a real model; the evaluation
    # below loads its own engine, and two runs evaluating side by side must fit in memory together
    del learner
    gc.collect()
    metrics = read_metrics(run_dir)
    if spec.resume:  # this call trained only the steps after the checkpoint: count every step's time
        train_s = sum(float(m.get("time_step_s", 0.0)) for m in metrics if "step" in m) or train_s

    t0 = time.perf_counter()
    n_tasks = len(gym.make(cfg.env, **cfg.env_kwargs).unwrapped.tasks)
    limit = min(spec.eval_tasks, n_tasks)
    model = str(run_dir / "final_model")
    kind, engine = run_engine(cfg, model, seed=spec.seed)
    # the code path of the quickstart and of `agent-envs evaluate RUN`
    both = evaluate_greedy_and_sampled(
        EvalConfig(env=cfg.env, model=model, engine=kind, limit=limit, first_task=n_tasks - limit,
                   max_response_tokens=cfg.max_response_tokens, env_kwargs=dict(cfg.env_kwargs), seed=spec.seed,
                   temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k),
        spec.eval_samples, engine, folders=(str(run_dir / "eval_greedy"), str(run_dir / "eval_sampled")))
    greedy, sampled = both["greedy"], both["sampled"]
    eval_s = time.perf_counter() - t0

    s = sampled["metrics"]
    per_step = cfg.prompts_per_step * cfg.group_size
    result = {
        "algo": spec.algo, "seed": spec.seed, "run_dir": str(run_dir),
        "sampling": {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k},
        "budget": {"trajectories_per_step": per_step, "steps": cfg.total_steps,
                   "trajectories": per_step * cfg.total_steps,
                   "trained_trajectories": sum(float(m.get("num_trajectories", 0)) for m in metrics),
                   "generated_trajectories": generated_trajectories(metrics, cfg.group_size)},
        "eval": {"tasks": limit, "first_task": n_tasks - limit, "samples_per_task": spec.eval_samples},
        "greedy": greedy["metrics"],
        "sampled": s,
        # all response tokens over all samples / samples solved (None when nothing was solved)
        "tokens_per_solved": s["response_tokens"] / s["pass@1"] if s.get("pass@1") else None,
        "rollout_tool_calls": rollout_tool_calls(metrics),
        "branch_entropy": branch_entropy(metrics),
        "train_s": train_s, "eval_s": eval_s, "threads": spec.threads,
        "curve": [{"step": m["step"], **{k: m[k] for k in CURVE_KEYS if k in m}} for m in metrics if "step" in m],
    }
    (run_dir / RUN_RESULT).write_text(json.dumps(result, indent=1))
    return result


def generated_trajectories(metrics: list[dict[str, Any]], group_size: int) -> float:
    """Every trajectory sampled over a run, kept or not: DAPO's dynamic sampling generates rounds
    of groups and trains on the ones with reward variance, so it samples more than it trains on."""
    return sum(float(m["generated_groups"]) * group_size if "generated_groups" in m
               else float(m.get("num_trajectories", 0)) for m in metrics)


def branch_entropy(metrics: list[dict[str, Any]]) -> float | None:
    """Mean token entropy at the points where a tree rollout forked (`rollout/branch_entropy`), over
    the steps that forked; None for runs without forks."""
    per_step = [float(m["rollout/branch_entropy"]) for m in metrics if m.get("rollout/forks_per_prompt", 0) > 0]
    return sum(per_step) / len(per_step) if per_step else None


def rollout_tool_calls(metrics: list[dict[str, Any]]) -> float | None:
    """Tool calls executed per trajectory during training, averaged over steps: a tree rollout runs
    a call once for every branch that shares it (`rollout/tool_calls_per_traj`), flat sampling once
    per trajectory. This is the cost the ARPO paper halves."""
    per_step = [float(m.get("rollout/tool_calls_per_traj", m.get("tool_calls_mean", 0.0)))
                for m in metrics if "num_trajectories" in m]
    return sum(per_step) / len(per_step) if per_step else None


def run_pool(jobs: int, threads: int) -> ProcessPoolExecutor:
    """The worker processes of parallel runs: fresh interpreters (spawn), so the thread settings
    apply before torch starts, that end with the compare process however it ends."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_worker_start, initargs=(threads, os.getpid()))


def _worker_start(threads: int, parent: int) -> None:
    # A compare stopped by `timeout`, `kill` or a crash would leave its runs training unseen, with
    # no report: they end with it instead (checkpoints are crash-safe; `--resume true` goes on).
    if sys.platform == "linux":
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it ended before the line above
            os._exit(1)
    # before torch is imported in this fresh process, so every thread pool gets the same count
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from agent_envs.envs import load_plugins

    load_plugins()  # the env ids of installed packages and of --import, as in the parent


def _run_in_worker(spec: RunSpec) -> dict[str, Any]:
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if spec.log_to_file:  # parallel runs would interleave their progress output on one terminal
        log = open(run_dir / "log.txt", "a" if spec.resume else "w")  # noqa: SIM115  (open for the process's life)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    return run_one(spec)


def run_compare(algos: list[str], seeds: list[int], out: str, config: str, overrides: list[str],
                eval_tasks: int = 64, eval_samples: int = 4, jobs: int | None = None,
                resume: bool = False, overwrite: bool = False, baselines: Sequence[str] = ()) -> dict[str, Any]:
    """Train and evaluate every (algorithm, seed), `jobs` at a time, then write the report. `out`
    must not hold another comparison unless `resume` continues it (with the same preset, held-out
    tasks and, run by run, the same learner config) or `overwrite` removes it first."""
    from algorithms.core.run_folder import claim_run_folder

    if not algos or not seeds:
        raise ValueError("compare: --algos and --seeds each need at least one entry")
    check_eval_episodes(overrides, eval_tasks)
    root = Path(out)
    # the runs set (algos, seeds) may grow on resume; what every run is scored on may not change
    claim_run_folder(root, "compare", config={"config": config, "eval_tasks": eval_tasks, "eval_samples": eval_samples},
                     config_file=MANIFEST, resume=resume, overwrite=overwrite)
    root.mkdir(parents=True, exist_ok=True)
    # seed-major: with fewer jobs than runs, every algorithm's first seed ends first, so a comparison
    # stopped (or still running) after some runs already has paired runs to compare
    order = [(a, s) for s in seeds for a in algos]
    jobs, threads = plan_parallelism(len(order), jobs, overrides=overrides)
    specs = [RunSpec(a, s, config, list(overrides), str(root / f"{a}-{s}"), eval_tasks, eval_samples, threads,
                     log_to_file=jobs > 1, resume=resume) for a, s in order]  # fmt: skip
    # a bad key, preset or data file of the last run must not surface after the first runs trained
    from algorithms.base.preflight import USER_ERRORS, preflight_learner

    if resume:  # every run's learner config against its folder's, before the first one trains on
        for spec in specs:
            claim_run_folder(spec.run_dir, "compare", config={"algo": spec.algo, **config_dict(spec_config(spec))},
                             resume=True)
    checked, warned = set(), set()
    for spec in specs:
        try:
            cfg = spec_config(spec)
            if spec.algo not in checked:
                # the hold-out is checked here, against --eval-tasks, the flag a user of compare sets
                num_tasks = preflight_learner(dataclasses.replace(cfg, eval_episodes=0))
                if num_tasks <= eval_tasks:
                    raise ValueError(f"config field '--eval-tasks': env {cfg.env} has {num_tasks} tasks, too few to "
                                     f"hold out {eval_tasks} for evaluation and train on the rest; lower --eval-tasks")
                warning = sft_warning(cfg, num_tasks, eval_tasks)
                if warning and warning not in warned:
                    print(f"compare: warning: {warning}", file=sys.stderr, flush=True)
                    warned.add(warning)
                checked.add(spec.algo)
        except USER_ERRORS as exc:  # the message names the key, file and line: no traceback needed
            raise SystemExit(f"compare: {spec.algo} seed {spec.seed}: {type(exc).__name__}: {exc}") from exc
    manifest = {"algos": algos, "seeds": seeds, "config": config, "overrides": list(overrides),
                "eval_tasks": eval_tasks, "eval_samples": eval_samples, "jobs": jobs, "threads_per_job": threads}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1))
    print(f"compare: {len(specs)} runs, {jobs} at a time with {threads} thread(s) each -> {root}", flush=True)
    failed = []
    t0 = time.perf_counter()
    if jobs == 1:
        for spec in specs:
            print(f"\n== {spec.algo} seed {spec.seed} -> {spec.run_dir} ==", flush=True)
            run_one(spec)  # its `threads` override sets torch's thread count here
    else:
        with run_pool(jobs, threads) as pool:
            futures = {pool.submit(_run_in_worker, spec): spec for spec in specs}
            for future, spec in futures.items():
                try:
                    r = future.result()
                    print(f"  {spec.algo} seed {spec.seed}: trained in {r['train_s']:.0f} s "
                          f"(log: {spec.run_dir}/log.txt)", flush=True)
                except Exception as exc:  # report every failed run, not only the first
                    failed.append(f"{spec.algo} seed {spec.seed}: {exc!r}; see {spec.run_dir}/log.txt")
    if failed:
        raise RuntimeError("compare: runs failed:\n  " + "\n  ".join(failed))
    print(f"compare: all runs done in {time.perf_counter() - t0:.0f} s", flush=True)
    summary = write_report(root, baselines=baselines)
    print("\n" + (root / "results.md").read_text())
    return summary



@dataclass
class CompareConfig:
    """What `agent-envs compare` runs; the learner settings of every run are key=value overrides."""

    algos: tuple[str, ...] = option(("grpo", "dapo", "arpo", "aepo"), "algorithms; the first is the baseline "
                                    "of the paired tests unless --baselines names others")
    baselines: tuple[str, ...] = option((), "what the paired tests compare every other run against: algorithms, "
                                        "or the run names of a merged report (default: the first algorithm)")
    seeds: tuple[int, ...] = option((0, 1, 2), "seeds: each algorithm trains once per seed")
    config: str = option("{algo}_tiny.yaml", "preset of each run, {algo} filled in: a file, or a shipped "
                         "preset's name (configs/)")
    out: str = option("runs/compare", "folder of the runs, the table and the plots")
    eval_tasks: int = option(64, "evaluation tasks: the env's last N, held out of every run's training "
                             "(its eval_episodes)")
    eval_samples: int = option(4, "samples per task at the run's training sampling setup")
    jobs: int | None = option(None, f"runs at once (null: one per core, {available_cores()} here)")
    report_only: tuple[str, ...] = option((), "rebuild the table and plots of this existing --out folder; train "
                                          "nothing. Several folders (A,B,...) scored on the same tasks: one report "
                                          "of all their runs, paired by seed, written to --out")
    resume: bool = option(False, "continue the comparison in --out (same preset, tasks and learner settings): "
                          "its finished runs are kept, the others resume from their newest checkpoint (save_every)")
    overwrite: bool = option(False, "remove the comparison in --out first (without it, or --resume, a folder "
                             "that holds another run is refused)")

    def validate(self) -> None:
        from algorithms.cli import ALGORITHMS

        check_types(self)
        require(bool(self.algos) and bool(self.seeds), "algos", "and seeds each need at least one entry", self.algos)
        for algo in self.algos:
            if algo not in ALGORITHMS:
                raise UserError(f"config field 'algos': unknown algorithm {algo!r}{suggest(algo, list(ALGORITHMS))}; "
                                f"choose from {sorted(ALGORITHMS)}")
        if not self.report_only:  # a merged report's run names are checked against its runs
            for base in self.baselines:
                if base not in self.algos:
                    raise UserError(f"config field 'baselines': {base!r} is not among --algos {list(self.algos)}")
        require(self.eval_tasks >= 1 and self.eval_samples >= 1, "eval_tasks", "and eval_samples must be >= 1",
                (self.eval_tasks, self.eval_samples))


_FLAGS = tuple(f.name for f in fields(CompareConfig))


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare", help="train N algorithms x seeds on one env; table with CIs + plots",
        description="Train and evaluate every (algorithm, seed) on the same env, model and budget.",
        epilog="key=value arguments are learner settings applied to every run (env=AgentMath-v0, "
               "total_steps=100, env_kwargs.max_tool_calls=2); `agent-envs train --algo grpo --help` lists them.",
    )
    add_flags(p, CompareConfig, [f for f in _FLAGS if f not in ("resume", "overwrite")], metavars={"report_only": "DIR"})
    # bare flags, as in train and sft; `--resume true` (and false) as before
    p.add_argument("--resume", nargs="?", const="true", default=None, metavar="true",
                   help=field_help(CompareConfig, "resume"))
    p.add_argument("--overwrite", action="store_const", const="true", default=None,
                   help=field_help(CompareConfig, "overwrite"))
    p.add_argument("overrides", nargs="*", metavar="key=value", help="learner overrides applied to every run")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.resume is not None and "=" in args.resume:  # a bare --resume before the overrides took one
        args.overrides.insert(0, args.resume)
        args.resume = "true"
    cfg = build_config(CompareConfig, None, given=flag_values(args, _FLAGS, CompareConfig))
    if cfg.report_only:
        folders = [Path(f) for f in cfg.report_only]
        for folder in folders:
            if not any(folder.glob(f"*/{RUN_RESULT}")):
                raise UserError(f"--report-only {folder}: no run results ({RUN_RESULT} of <algo>-<seed>/) in it; "
                                "run `agent-envs compare --out DIR` first")
        if len(folders) == 1:
            out = folders[0]
            write_report(out, baselines=cfg.baselines)
        else:
            out = Path(cfg.out)
            if (out / MANIFEST).exists() or out.resolve() in {f.resolve() for f in folders}:
                raise UserError(f"--out {out} is a comparison's own folder; name a new folder for the merged report")
            write_report(out, merge=folders, baselines=cfg.baselines)
        print((out / "results.md").read_text())
        return 0
    run_compare(list(cfg.algos), list(cfg.seeds), cfg.out, cfg.config, args.overrides, cfg.eval_tasks,
                cfg.eval_samples, cfg.jobs, cfg.resume, cfg.overwrite, cfg.baselines)
    return 0


__all__ = ["CompareConfig", "RunSpec", "add_cli", "check_eval_episodes", "plan_parallelism", "run_compare", "run_one",
           "sft_warning", "spec_config"]
