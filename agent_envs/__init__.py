"""agent-envs: Gymnasium environments for multi-turn, tool-using LLM agents."""

from agent_envs.base.task import Task
from agent_envs.base.tool import Tool, ToolResult
from agent_envs.core.env import EpisodeState, ToolEnv
from agent_envs.core.protocols import ArpoTags, JsonToolCalls, Protocol

# The built-in tools are defined on import, so protocols know their tags even in an env that
# does not enable them (a call of a disabled tool is flagged, and the format check sees it).
from agent_envs import tools  # noqa: E402, F401  isort: skip

__all__ = [
    "register_benchmark",
    "ArpoTags", "EpisodeState", "JsonToolCalls", "Protocol", "Task", "Tool", "ToolEnv", "ToolResult"]
__version__ = "0.1.0"

from agent_envs.envs import register_benchmark, register_envs  # noqa: E402

register_envs()
