"""AgentNotebook-v0: computations spread over several python calls that reuse earlier names.

    >>> import gymnasium as gym, agent_envs
    >>> env = gym.make("AgentNotebook-v0")                     # python session: state persists
    >>> env = gym.make("AgentNotebook-v0", world={"steps": 4}, python={"session": False})

The tasks (`agent_envs.worlds.notebook`) need a stateful tool: each call after the first uses a
variable or function an earlier call defined. `python` replaces the tool's settings (see
`PythonTool`); `python={"session": False}` gives the stateless tool, under which every later call
fails with a `NameError`, to measure what the state is worth.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_envs.core.env import ToolEnv
from agent_envs.envs.resources import check_env_keywords, python_tool, world_with_tools


def make_notebook_env(
    world: Mapping[str, Any] | None = None,
    python: Mapping[str, Any] | None = None,
    max_tool_calls: int = 8,
    **env_kwargs: Any,
) -> ToolEnv:
    """Build a notebook env. `python` configures the sandbox (default: a session per episode)."""
    from agent_envs.worlds.notebook import NotebookConfig, NotebookWorld

    check_env_keywords(make_notebook_env, env_kwargs)
    source, tools = world_with_tools("notebook", NotebookWorld, NotebookConfig, world)
    if python is not None:
        tools = [python_tool({"session": True, **python})]
    return ToolEnv(source, tools, max_tool_calls=max_tool_calls, **env_kwargs)
