"""Env settings are one typed config per family: every registered id's own kwargs and every
preset's `env_kwargs` are keys of it, and `ToolEnv` takes the same keys as its settings."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401  (registers the ids)
from agent_envs.base.config import UserError, load_preset
from agent_envs.core.env import ToolEnv
from agent_envs.core.env_config import ToolEnvConfig
from agent_envs.envs import check_env_id, env_config_class
from agent_envs.envs.math import MathEnvConfig
from agent_envs.worlds import ArithmeticConfig, make_world

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(p for p in (REPO / "configs").rglob("*.yaml") if "env_kwargs" in p.read_text())


def test_every_registered_id_of_a_family_takes_its_own_kwargs():
    checked = 0
    for env_id, spec in gym.registry.items():
        config_class = env_config_class(env_id)
        if config_class is not None:
            config_class.of(spec.kwargs, env_id)
            checked += 1
    assert checked >= 4 + 10  # the four families and the benchmarks' ids


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_every_presets_env_kwargs_are_settings_of_its_env(preset):
    data = load_preset(preset)
    env_id = check_env_id(data.get("env", "AgentMath-v0"))
    config_class = env_config_class(env_id)
    assert config_class is not None
    config_class.of({**gym.spec(env_id).kwargs, **(data.get("env_kwargs") or {})}, env_id)


def test_a_family_config_is_the_settings_the_env_plays_by():
    config = MathEnvConfig.of({"max_tool_calls": 2.0, "world": {"difficulty": 2}})
    assert config.max_tool_calls == 2 and config.world == ArithmeticConfig(difficulty=2)
    assert MathEnvConfig.of({"world": ArithmeticConfig(seed=3)}).world.seed == 3  # a built world config too
    env = gym.make("AgentMath-v0", max_tool_calls=2, reward="binary").unwrapped
    assert env.config.max_tool_calls == env.max_tool_calls == 2 and env.max_turns == 6


def test_tool_env_takes_a_config_or_keywords_checked_the_same_way():
    world = make_world("arithmetic")
    assert ToolEnv(world, world.make_tools(), ToolEnvConfig(max_tool_calls=1)).max_tool_calls == 1
    assert ToolEnv(world, world.make_tools(), max_tool_calls=1).max_tool_calls == 1
    with pytest.raises(UserError, match=r"max_tool_cals: ToolEnv has no such setting \(did you mean 'max_tool_calls'"):
        ToolEnv(world, world.make_tools(), max_tool_cals=1)
    with pytest.raises(TypeError, match="not both"):
        ToolEnv(world, world.make_tools(), ToolEnvConfig(), max_tool_calls=1)
