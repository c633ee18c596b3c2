"""Calling remote services: pooled aiohttp sessions with retries (`http`), and `ToolCache`, the
store of results of idempotent calls (`cache`), shared by the search backends and the browse tool."""

from agent_envs.remote.cache import ToolCache

__all__ = ["ToolCache"]
