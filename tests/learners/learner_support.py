"""Helpers shared by the learner tests (imported by module name; pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PROMPT = (
    "Solve the task. Compute with <python> code </python>, then answer with <answer> \\boxed{} </answer>."
)
# The env the session's SFT model (conftest.sft_run) learned: the perfect teacher, this system
# prompt, the standard reward. The tiny presets hold the quickstart's imperfect-teacher task, so
# runs of a preset from that model pass this override to play the env it knows.
SFT_ENV_OVERRIDE = "env_kwargs=" + json.dumps({"system_prompt": SYSTEM_PROMPT})


def cli_env() -> dict[str, str]:
    """Environment of CLI subprocesses: one thread, the repository importable."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    return env


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent_envs.cli", *args]
