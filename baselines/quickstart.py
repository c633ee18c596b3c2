"""The CPU quickstart: a tiny model learns *when* to use a Python tool, end to end, offline.

    agent-envs quickstart                    # about 6 minutes on 2 CPU cores
    agent-envs quickstart --sft-steps 40 --rl-steps 4 --eval-tasks 16   # a smoke run
    agent-envs quickstart --model smollm2    # the same story on a real pretrained model, with LoRA

`--model smollm2` runs SmolLM2-135M-Instruct (docs/real-model.md) through the same stages with
its own presets (configs/sft_smollm2.yaml, configs/grpo_smollm2.yaml, configs/arpo_smollm2.yaml).

The task mixes easy questions (one-digit sums, answerable at once) with hard ones that need the
tool, and the SFT traces come from a deliberately imperfect teacher that often skips the tool on
hard tasks and guesses (configs/sft_tiny.yaml). SFT teaches the protocol and digit copying; RL
must fix the strategy. Stages, each written under `--out` (default runs/quickstart):
1. build a tiny Qwen2-architecture model and tokenizer locally (no hub download; with
   `--model smollm2`, convert SmolLM2's GGUF file once instead);
2. cold-start SFT on the imperfect teacher's traces (configs/sft_tiny.yaml);
3. RL from the SFT checkpoint with the python sandbox in the loop (configs/grpo_tiny.yaml);
4. evaluate SFT and RL models on held-out tasks, greedy and with the RL run's own sampling setup
   (temperature, top_p, top_k); write results.md, results.json and results.png (accuracy before
   and after, tool calls per task by difficulty, the smoothed reward curve).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from agent_envs.base.config import (
    add_flags,
    build_config,
    check_types,
    field_help,
    flag_values,
    option,
    require,
)
from algorithms.base.presets import presets_dir

CONFIGS = presets_dir()  # the shipped presets: found in a checkout and in an installed package
SAMPLES = 4  # samples per held-out task in the sampled evaluation (evaluate.RUN_SAMPLES, the same)
SETTINGS_FILE = "quickstart.json"  # what a quickstart folder's run was asked for: --resume must ask the same


def preset(model: str, algo: str) -> tuple[Path, Path]:
    """The SFT and RL presets of a quickstart model."""
    rl = CONFIGS / f"{algo}_{model}.yaml"
    if not rl.is_file():
        have = sorted(p.name.split("_")[0] for p in CONFIGS.glob(f"*_{model}.yaml") if not p.name.startswith("sft"))
        raise ValueError(f"config field 'algo': the {model} quickstart has presets for {', '.join(have)}, "
                         f"not {algo!r}")
    return CONFIGS / f"sft_{model}.yaml", rl


def run_quickstart(out: str = "runs/quickstart", sft_steps: int | None = None, rl_steps: int | None = None,
                   eval_tasks: int = 64, algo: str = "grpo", seed: int = 0, model: str = "tiny",
                   resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Every stage into `out`, which must not hold another run unless `resume` continues it (a
    finished SFT is kept, RL goes on from its newest checkpoint, the evaluations run again) or
    `overwrite` removes it first."""
    import gymnasium as gym

    from agent_envs.base.config import build_config
    from algorithms.cli import learner_class
    from algorithms.core.run_folder import claim_run_folder
    from algorithms.models.resolve import resolve_model
    from algorithms.sft import SFTConfig, run_sft
    from baselines.evaluation.evaluate import EvalConfig, evaluate_greedy_and_sampled, run_engine

    root = Path(out)
    settings = {"model": model, "sft_steps": sft_steps, "rl_steps": rl_steps, "eval_tasks": eval_tasks,
                "algo": algo, "seed": seed}
    claim_run_folder(root, "quickstart", config=settings, config_file=SETTINGS_FILE, resume=resume,
                     overwrite=overwrite)
    root.mkdir(parents=True, exist_ok=True)
    (root / SETTINGS_FILE).write_text(json.dumps(settings, indent=1))  # marks the folder as this run's
    timings: dict[str, float] = {}

    def stage(name: str) -> None:
        timings[name] = time.perf_counter()
        print(f"\n== {name} ==", flush=True)

    sft_preset, rl_preset = preset(model, algo)
    stage(f"{model} model")
    base = resolve_model(model)
    sft_cfg = build_config(SFTConfig, sft_preset,
                           [f"model={base}", f"output_dir={root / 'sft'}", f"seed={seed}", "eval_episodes=0"]
                           + ([f"steps={sft_steps}"] if sft_steps else []))
    cls = learner_class(algo)
    # the run keeps its trajectories, so `agent-envs view` and `analyze` work on it as it is
    # the tasks it is scored on stay out of the RL run's draws
    rl_overrides = [f"output_dir={root / algo}", "save_every=0", f"seed={seed}", "save_trajectories=true",
                    f"eval_episodes={eval_tasks}"] + (
        [f"total_steps={rl_steps}"] if rl_steps else [])
    rl_cfg = build_config(cls.config_class, rl_preset, rl_overrides)
    # held-out tasks: the end of the world's index range (SFT trains on the start, RL holds them out)
    tasks = gym.make(rl_cfg.env, **rl_cfg.env_kwargs).unwrapped.tasks
    first = len(tasks) - eval_tasks
    held_out = range(first, len(tasks))
    # "sampled" means the RL run's whole sampling setup, so it measures the policy RL trained
    sampling = {"temperature": rl_cfg.temperature, "top_p": rl_cfg.top_p, "top_k": rl_cfg.top_k}
    sampled = f"T={rl_cfg.temperature:g}, top_p={rl_cfg.top_p:g}, top_k={rl_cfg.top_k}, {SAMPLES} samples"

    def evaluation(name: str, model: Path) -> list[dict]:
        """Greedy and sampled rows of one model (`agent-envs evaluate RUN` runs the same code)."""
        folder = root / "eval" / name.lower()
        engine_kind, engine = run_engine(rl_cfg, str(model), seed=seed)  # the engine RL rolls out with
        cfg = EvalConfig(env=rl_cfg.env, model=str(model), engine=engine_kind, ks=(1,), limit=eval_tasks, first_task=first,
                         max_response_tokens=rl_cfg.max_response_tokens, env_kwargs=rl_cfg.env_kwargs,
                         out=str(folder), seed=seed, **sampling)
        rows = []
        for kind, summary in evaluate_greedy_and_sampled(cfg, SAMPLES, engine).items():
            label = f"{name} ({'greedy' if kind == 'greedy' else sampled})"
            metrics = summary["metrics"]  # with the split by whether a task needs the tool
            print(f"{label}: pass@1 {metrics['pass@1']:.3f}  tool use on hard tasks "
                  f"{metrics.get('hard_tool_rate', float('nan')):.2f}", flush=True)
            rows.append({"label": label, **metrics})
        return rows

    stage("SFT")
    sft = Path(run_sft(sft_cfg, resume=resume)["model"])
    stage("SFT evaluation")
    rows = evaluation("SFT", sft)
    stage(algo.upper())
    rl_cfg = build_config(cls.config_class, rl_preset, [f"model={sft}", *rl_overrides])
    cls(rl_cfg).train(resume="auto" if resume else None)
    rl = root / algo / "final_model"
    stage(f"{algo.upper()} evaluation")
    rows += evaluation(algo.upper(), rl)
    timings["done"] = time.perf_counter()
    return write_report(root, rows, timings, algo, model, held_out, sampled, sampling)


def write_report(root: Path, rows: list[dict], timings: dict[str, float], algo: str, model: str,
                 held_out: range, sampled: str, sampling: dict) -> dict[str, Any]:
    """results.md, results.json and results.png of a quickstart run; the stages' wall times come
    from when each began (`timings`, ending with "done")."""
    from algorithms.core.run_log import read_metrics
    from baselines.comparison.report import json_safe, markdown_table, quickstart_plot

    eval_tasks, first = len(held_out), held_out.start
    names = list(timings)
    wall = {n: timings[b] - timings[n] for n, b in zip(names, names[1:], strict=False)}
    columns = (("pass@1", "accuracy"), ("hard_accuracy", "acc. hard"), ("easy_accuracy", "acc. easy"),
               ("hard_tool_rate", "tool use, hard"), ("easy_tool_rate", "tool use, easy"),
               ("hard_accuracy_with_tool", "acc. when the tool was used (hard)"),
               ("response_tokens", "response tokens"))
    table = markdown_table(rows, label="model", columns=columns)
    plot = quickstart_plot(rows, read_metrics(root / algo), root / "results.png",
                           f"AgentMath-v0 (easy + hard tasks), {eval_tasks} held-out tasks, {algo.upper()}, {model}")
    text = (f"# Quickstart results ({model})\n\nHeld-out tasks: {eval_tasks} (indices {first}-{held_out[-1]}); "
            f"sampled rows use the {algo.upper()} run's sampling setup ({sampled}).\n"
            "Hard tasks need the tool; easy ones (one-digit sums) do not.\n\n"
            f"{table}\n\nWall time per stage (s): " + ", ".join(f"{k} {v:.0f}" for k, v in wall.items())
            + f"\n\nTraining curves: {root / algo / 'curves.png'}\n")
    (root / "results.md").write_text(text)
    (root / "results.json").write_text(json.dumps(json_safe({"rows": rows, "wall_s": wall, "sampling": sampling}),
                                                  indent=1, default=str, allow_nan=False))
    print("\n" + text + f"\nPlot: {plot}")
    return {"rows": rows, "wall_s": wall, "plot": str(plot)}


@dataclass
class QuickstartConfig:
    """The settings of `agent-envs quickstart`."""

    out: str | None = option(None, "folder of every stage's output and results.md (null: runs/quickstart, "
                             "or runs/quickstart-<model> for a model other than tiny)")
    model: Literal["tiny", "smollm2"] = option("tiny", "tiny (built locally, ~5 min) or smollm2 "
                                                "(SmolLM2-135M-Instruct with LoRA, docs/real-model.md)")
    sft_steps: int | None = option(None, "SFT steps (null: the model's SFT preset's, configs/sft_<model>.yaml)")
    rl_steps: int | None = option(None, "RL steps (null: the model's preset for the algorithm)")
    eval_tasks: int = option(64, "held-out evaluation tasks: the env's last N")
    algo: Literal["grpo", "dapo", "arpo", "aepo"] = option("grpo", "the RL algorithm")
    seed: int = option(0, "seed of SFT and RL (the tasks stay the same)")
    resume: bool = option(False, "continue the quickstart in --out (same settings): a finished SFT is kept, RL "
                          "goes on from its newest checkpoint, the evaluations run again")
    overwrite: bool = option(False, "remove the quickstart in --out first (without it, or --resume, a folder "
                             "that holds another run is refused)")

    def validate(self) -> None:
        check_types(self)
        require(self.eval_tasks >= 1, "eval_tasks", "must be >= 1", self.eval_tasks)
        preset(self.model, self.algo)  # names the algorithms the model has presets for


_FLAGS = tuple(f.name for f in fields(QuickstartConfig))


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("quickstart", help="CPU quickstart: tiny model -> SFT -> RL -> evaluation",
                              epilog="every setting is also a key=value argument (rl_steps=4)")
    add_flags(p, QuickstartConfig, [f for f in _FLAGS if f not in ("resume", "overwrite")])
    for name in ("resume", "overwrite"):  # bare flags, as in train and sft
        p.add_argument(f"--{name}", action="store_const", const="true", default=None,
                       help=field_help(QuickstartConfig, name))
    p.add_argument("overrides", nargs="*", metavar="key=value", help="the same settings as key=value")
    p.set_defaults(func=_run)


def _run(args: Any) -> int:
    cfg = build_config(QuickstartConfig, None, args.overrides, given=flag_values(args, _FLAGS, QuickstartConfig))
    out = cfg.out or ("runs/quickstart" if cfg.model == "tiny" else f"runs/quickstart-{cfg.model}")
    run_quickstart(out, cfg.sft_steps, cfg.rl_steps, cfg.eval_tasks, cfg.algo, cfg.seed, cfg.model,
                   resume=cfg.resume, overwrite=cfg.overwrite)
    return 0
