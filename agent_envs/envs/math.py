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

from collections.abc import Mapping, Sequence
from typing import Any

from agent_envs.base.task import Task
from agent_envs.core.env import ToolEnv
from agent_envs.envs.resources import check_env_keywords, python_tool, resolve_tasks, world_with_tools


def make_math_env(
    benchmark: str | None = None,
    data_files: str | Sequence[str] | None = None,
    split: str | None = None,
    tasks: Sequence[Task] | None = None,
    world: Mapping[str, Any] | None = None,
    python: Mapping[str, Any] | None = None,
    max_tool_calls: int = 3,
    **env_kwargs: Any,
) -> ToolEnv:
    """Build a math env. `python` configures the sandbox (see `PythonTool`)."""
    check_env_keywords(make_math_env, env_kwargs)
    source = resolve_tasks(benchmark, data_files, split, tasks, reward="math")
    if source is None:
        from agent_envs.worlds import ArithmeticConfig, ArithmeticWorld

        source, tools = world_with_tools("arithmetic", ArithmeticWorld, ArithmeticConfig, world)
        if python is None:
            return ToolEnv(source, tools, max_tool_calls=max_tool_calls, **env_kwargs)
    return ToolEnv(source, [python_tool(dict(python or {}))], max_tool_calls=max_tool_calls, **env_kwargs)
