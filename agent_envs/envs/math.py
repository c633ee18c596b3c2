"""AgentMath-v0: math problems solved with reasoning and a sandboxed Python interpreter.

    >>> import gymnasium as gym, agent_envs
    >>> env = gym.make("AgentMath-v0")                                  # procedural arithmetic world
    >>> env = gym.make("AgentMath-v0", world={"difficulty": 2, "seed": 1})

Your own tasks come from a file (JSONL with `question` and `answer`); a named benchmark,
`benchmark="aime24"`, reads `$AGENT_ENVS_DATA_DIR/aime24/test.jsonl` the same way.

    >>> import json, pathlib, tempfile
    >>> problems = pathlib.Path(tempfile.mkdtemp()) / "my_problems.jsonl"
    >>> _ = problems.write_text(json.dumps({"question": "What is 6*7?", "answer": "42"}) + "\\n")
    >>> env = gym.make("AgentMath-v0", data_files=str(problems))
    >>> env.unwrapped.tasks[0].answers
    ['42']

Defaults follow the ARPO reasoning setting: python only, 3 tool calls in total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_envs.base.config import option
from agent_envs.core.env import ToolEnv
from agent_envs.envs.resources import TaskFileConfig, python_tool, world_with_tools
from agent_envs.worlds.arithmetic import ArithmeticConfig, ArithmeticWorld


@dataclass
class MathEnvConfig(TaskFileConfig):
    """AgentMath-v0's settings: ToolEnv's, the task source's, the world's and the sandbox's."""

    max_tool_calls: int = option(3, "tool calls allowed in an episode (3: ARPO's reasoning setting, docs/envs.md)")
    world: ArithmeticConfig = option(factory=ArithmeticConfig, help="the arithmetic world played when no tasks "
                                     "are given")
    python: dict | None = option(None, "PythonTool settings of the sandbox (null: the world's tool, or the "
                                 "default sandbox for a benchmark)")


def make_math_env(**settings: Any) -> ToolEnv:
    """Build a math env from `MathEnvConfig`'s keys."""
    config = MathEnvConfig.of(settings, "AgentMath-v0")
    source = config.task_source(reward="math")
    if source is None:
        source, tools = world_with_tools(ArithmeticWorld, config.world)
        if config.python is None:
            return ToolEnv(source, tools, config)
    return ToolEnv(source, [python_tool(config.python)], config)
