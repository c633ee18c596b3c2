"""One config style on every entry point: `--help` lists typed keys with defaults and help, and a
misspelt key, nested ones included, is refused with the closest name (train, evaluate, play).

Each case runs the real `agent-envs` command in a fresh process, as a user does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def agent_envs(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "agent_envs.cli", *argv], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300)


@pytest.mark.parametrize("argv, expected", [
    pytest.param(["train", "--algo", "grpo", "--help"],  # 7.6 s on a busy 2-core machine
                 ["  temperature (float, default 1.0)\n      rollout sampling temperature",
                  "  env_kwargs (dict, default {})", "--env ENV"], marks=pytest.mark.slow),
    (["evaluate", "--help"], ["--temperature FLOAT", "(float | null, default null)", "--n INT",
                              "samples per task (int, default 1)", "--limit INT", "(int | null, default 100)",
                              "--engine {vllm,hf,openai,openai-chat}", "null: the run's engine (hf for an SFT run), else vllm", "the env is --env (or env=ID)"]),
    (["play", "--help"], ["--seed INT", "(int, default 0)", "--env ENV", "play ENV",
                          "    world.difficulty (int, default 1): 1: one operation",
                          "    max_tool_calls (int, default 3)"]),
])  # fmt: skip
def test_help_shows_typed_keys_with_defaults_and_help(argv, expected):
    proc = agent_envs(*argv)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split(" "))  # argparse wraps lines; the checks hold within one line
    for piece in expected:
        assert piece in text or " ".join(piece.split()) in " ".join(text.split()), (piece, proc.stdout)


@pytest.mark.parametrize("argv, expected", [
    pytest.param(["train", "--algo", "grpo", "model=tiny", "env_kwargs.world.dificulty=2"],  # train: 8-14 s
                 "unknown config key 'env_kwargs.world.dificulty' (did you mean 'difficulty'?)", marks=pytest.mark.slow),
    pytest.param(["train", "--algo", "grpo", "model=tiny", "env_kwargs.max_tool_cals=2"],
                 "env_kwargs.max_tool_cals: AgentMath-v0 has no such setting (did you mean 'max_tool_calls'?)",
                 marks=pytest.mark.slow),
    (["evaluate", "--env", "AgentMath-v0", "--model", "tiny", "env_kwargs.world.min_digts=2"],
     "unknown config key 'env_kwargs.world.min_digts' (did you mean 'min_digits'?)"),
    (["evaluate", "--env", "AgentMath-v0", "--model", "tiny", "temprature=0"],
     "unknown config key 'temprature' (did you mean 'temperature'?)"),
    (["play", "AgentQA-v0", "world.min_hop=2"], "unknown config key 'env_kwargs.world.min_hop' (did you mean 'min_hops'?)"),
    (["play", "AgentSearch-v0", "env_kwargs.max_tool_cals=1"], "(did you mean 'max_tool_calls'?)"),
])  # fmt: skip
def test_a_misspelt_nested_key_is_refused_with_a_suggestion(argv, expected):
    proc = agent_envs(*argv)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_play_takes_typed_settings():
    # max_tool_calls=1 arrives as an int (it used to be the string "1" and end in a TypeError);
    # an empty stdin quits after the first observation
    proc = agent_envs("play", "AgentMath-v0", "max_tool_calls=1", "world.difficulty=2", "--index", "5")
    assert proc.returncode == 0, proc.stderr
    assert "[task arithmetic-s0-5;" in proc.stdout
    proc = agent_envs("play", "--env", "AgentMath-v0", "env_kwargs.max_tool_calls=one")
    assert proc.returncode == 2 and "'env_kwargs.max_tool_calls' must be an integer, got 'one'" in proc.stderr
