"""The ground floor: the types every other part of `agent_envs` speaks, importing none of them.

`Task` (what an episode plays), `Tool` / `ToolResult` (what an agent calls and gets back),
`RewardResult` (what a grader returns) and `MESSAGES` (the fixed texts the env and tools write).
"""

from agent_envs.base.messages import MESSAGES
from agent_envs.base.reward import RewardResult
from agent_envs.base.task import REWARD_KINDS, Task
from agent_envs.base.tool import Tool, ToolResult, known_tool_tags

__all__ = ["MESSAGES", "REWARD_KINDS", "RewardResult", "Task", "Tool", "ToolResult", "known_tool_tags"]
