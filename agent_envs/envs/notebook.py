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

from dataclasses import dataclass
from typing import Any

from agent_envs.base.config import option
from agent_envs.core.env import ToolEnv
from agent_envs.core.env_config import ToolEnvConfig
from agent_envs.envs.resources import python_tool, world_with_tools
from agent_envs.worlds.notebook import NotebookConfig, NotebookWorld


@dataclass
class NotebookEnvConfig(ToolEnvConfig):
    """AgentNotebook-v0's settings: ToolEnv's, the world's and the sandbox's."""

    max_tool_calls: int = option(8, "tool calls allowed in an episode (8: room for a task's steps and a retry "
                                 "or two, docs/envs.md)")
    world: NotebookConfig = option(factory=NotebookConfig, help="the notebook world")
    python: dict | None = option(None, "PythonTool settings that replace the world's session tool "
                                 "({session: false}: the stateless tool)")


def make_notebook_env(**settings: Any) -> ToolEnv:
    """Build a notebook env from `NotebookEnvConfig`'s keys (default: a python session per episode)."""
    config = NotebookEnvConfig.of(settings, "AgentNotebook-v0")
    source, tools = world_with_tools(NotebookWorld, config.world)
    if config.python is not None:
        tools = [python_tool({"session": True, **config.python})]
    return ToolEnv(source, tools, config)
