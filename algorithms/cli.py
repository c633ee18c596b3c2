"""`agent-envs train` and `agent-envs sft`: the learners from the command line.

    agent-envs train --algo grpo --config configs/grpo_tiny.yaml total_steps=50 lr=1e-4
    agent-envs train --algo dapo --config configs/dapo_tiny.yaml --resume   # continue the run in output_dir
    agent-envs train --algo grpo --config configs/grpo_tiny.yaml --overwrite  # remove it, start afresh
    accelerate launch --config_file configs/accelerate/ddp.yaml -m agent_envs.cli train --algo grpo \\
        --config configs/grpo_qwen2.5_7b.yaml
    agent-envs sft --config configs/sft_tiny.yaml steps=300
    agent-envs check-template runs/sft_tiny/final_model      # is its chat template prefix-preserving?

A config file holds `key: value` lines of the algorithm's config dataclass (`inherit: base.yaml`
starts from another file); `key=value` arguments override it (dotted keys reach into mappings
and nested settings: `env_kwargs.world.difficulty=2`, `tree.beam_size=3`).
`agent-envs train --algo arpo --help` lists every key with its type, default and help.
Algorithms register here by import path, so adding one is one line in `ALGORITHMS`.
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

from algorithms.base.presets import find_preset

# name -> "module:LearnerClass"
ALGORITHMS = {
    "grpo": "algorithms.grpo:GRPOLearner",
    "dapo": "algorithms.dapo:DAPOLearner",
    "arpo": "algorithms.arpo:ARPOLearner",
    "aepo": "algorithms.aepo:AEPOLearner",
}


def learner_class(algo: str) -> Any:
    """The learner class registered under `algo`."""
    if algo not in ALGORITHMS:
        raise SystemExit(f"--algo {algo!r}: unknown algorithm; choose one of {sorted(ALGORITHMS)}")
    module, _, cls = ALGORITHMS[algo].partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] != "algorithms":
            raise  # an extra that is not installed: the command's error line names it
        raise SystemExit(f"--algo {algo}: {ALGORITHMS[algo]} is not available ({exc})") from exc
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"--algo {algo}: {ALGORITHMS[algo]} is not available ({exc})") from exc


def _train(args: argparse.Namespace) -> int:
    from agent_envs.base.config import build_config, config_dict, format_help
    from agent_envs.envs import env_settings_help
    from algorithms.base.preflight import USER_ERRORS, preflight_learner
    from algorithms.core.checkpoint import CheckpointError, resolve_resume
    from algorithms.core.run_folder import claim_run_folder

    if args.help:
        print(args.parser.format_help())
        if args.algo is None:
            print("config keys: add --algo NAME to list the keys of an algorithm's config")
        else:
            print(f"config keys of --algo {args.algo} (set as key=value, or key: value in --config):")
            print(format_help(learner_class(args.algo).config_class))
        print(f"\nenv settings (env_kwargs.KEY=value):\n{env_settings_help()}")
        return 0
    if args.algo is None:
        raise SystemExit(f"train: --algo is required; choose one of {sorted(ALGORITHMS)}")
    cls = learner_class(args.algo)
    try:  # everything that can be checked without the model, before loading it
        cfg = build_config(cls.config_class, args.config, _with_env(args))
        _check_algo_in_file(args.config, args.algo)
        preflight_learner(cfg)
        resume = args.resume_from or args.resume
        # before the model loads: a folder that holds another run costs a second, not a load
        claim_run_folder(cfg.output_dir, "train", config={"algo": cls.name, **config_dict(cfg)},
                         resume=bool(resume), overwrite=args.overwrite)
        start = resolve_resume(resume, cfg.output_dir)
    except (*USER_ERRORS, CheckpointError) as exc:  # the message names the key, file and line
        raise SystemExit(f"train: {_mistake(exc)}") from exc
    try:
        cls(cfg).train(resume=start or args.resume)
    except CheckpointError as exc:  # a full disk: the message says which checkpoint is intact
        raise SystemExit(f"train: {exc}") from exc
    return 0


def _mistake(exc: Exception) -> str:
    """A config error as one line: its message names the key, file and line (the type's name
    would add nothing a user acts on)."""
    from agent_envs.cli import describe_mistake

    return describe_mistake(exc)


def _with_env(args: argparse.Namespace) -> list[str]:
    """`--env ID` is the `env=ID` override (one way to name the env in every subcommand)."""
    return ([f"env={args.env}"] if args.env else []) + list(args.overrides)


def _check_algo_in_file(path: str | None, algo: str) -> None:
    if path is None:
        return
    from agent_envs.base.config import load_preset

    named = load_preset(path).get("algo")
    if named is not None and named != algo:
        raise SystemExit(f"{path} is a preset for algo {named!r}, but --algo {algo} was given")


def _sft(args: argparse.Namespace) -> int:
    from agent_envs.base.config import build_config, format_help
    from agent_envs.envs import env_settings_help
    from algorithms.base.preflight import USER_ERRORS
    from algorithms.sft import SFTConfig, preflight_sft, run_sft

    if args.help:
        print(args.parser.format_help())
        print("config keys (set as key=value, or key: value in --config):")
        print(format_help(SFTConfig))
        print(f"\nenv settings (env_kwargs.KEY=value):\n{env_settings_help()}")
        return 0
    try:
        cfg = build_config(SFTConfig, args.config, _with_env(args))
        preflight_sft(cfg)
    except USER_ERRORS as exc:
        raise SystemExit(f"sft: {_mistake(exc)}") from exc
    result = run_sft(cfg, preflight=False, resume=args.resume, overwrite=args.overwrite)
    print(json.dumps(result, indent=1))
    return 0


def add_cli(subparsers: Any) -> None:
    """Register `train`, `sft` and `check-template` on the package's argument parser."""
    from algorithms.rollout import chat_template, vllm_server

    p = subparsers.add_parser(
        "train", help="RL-train a policy (GRPO, DAPO, ARPO, AEPO) on an env", add_help=False
    )
    p.add_argument("-h", "--help", action="store_true", help="show this help and every config key of --algo")
    p.add_argument("--algo", choices=sorted(ALGORITHMS), help="the algorithm (required)")
    p.add_argument("--config", default=None, type=find_preset,
                   help="YAML preset: a file, or a shipped preset's name (grpo_tiny.yaml)")
    p.add_argument(
        "--resume",
        action="store_const",
        const="auto",
        default=None,
        help="continue from the newest checkpoint of output_dir (starts fresh when there is none)",
    )
    p.add_argument("--resume-from", default=None, help="continue from this checkpoint or run directory")
    p.add_argument("--overwrite", action="store_true",
                   help="remove the run that output_dir holds, then start afresh (without it, or --resume, "
                        "a folder that holds another run is refused)")
    p.add_argument("--env", default=None, help="env id: the same as the env=ID override (default: the preset's)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    p.set_defaults(func=_train, parser=p)

    p = subparsers.add_parser(
        "sft", help="cold-start SFT on tool-use traces (gold traces or a JSONL)", add_help=False
    )
    p.add_argument("-h", "--help", action="store_true", help="show this help and every config key")
    p.add_argument("--config", default=None, type=find_preset,
                   help="YAML preset: a file, or a shipped preset's name (sft_tiny.yaml)")
    p.add_argument("--env", default=None, help="env id: the same as the env=ID override (default: the preset's)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in output_dir (same config): a finished one is kept, an unfinished "
                        "one trains again from step 0 (SFT keeps no checkpoints)")
    p.add_argument("--overwrite", action="store_true",
                   help="remove the run that output_dir holds, then start afresh")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    p.set_defaults(func=_sft, parser=p)

    vllm_server.add_cli(subparsers)
    chat_template.add_cli(subparsers)


__all__ = ["ALGORITHMS", "add_cli", "learner_class"]
