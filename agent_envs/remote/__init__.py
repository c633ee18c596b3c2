"""Playing and calling what runs elsewhere: the remote env client (`env_client`, `AgentRemote-v0`)
and `ToolCache`, the store of results of idempotent calls (`cache`), shared by the search backends
and the browse tool. The HTTP they speak is `agent_envs.net.http`."""

from agent_envs.remote.cache import ToolCache

__all__ = ["ToolCache"]
