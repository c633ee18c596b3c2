"""agent-envs: Gymnasium environments for multi-turn, tool-using LLM agents."""

from agent_envs.core.env import EpisodeState, ToolEnv
from agent_envs.core.protocol import ArpoTags, JsonToolCalls, Protocol
from agent_envs.core.task import Task
from agent_envs.tools.base import Tool, ToolResult

__all__ = [
    "register_benchmark",
    "ArpoTags", "EpisodeState", "JsonToolCalls", "Protocol", "Task", "Tool", "ToolEnv", "ToolResult"]
__version__ = "0.1.0"

from agent_envs.envs import register_benchmark, register_envs  # noqa: E402

register_envs()
