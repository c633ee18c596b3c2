"""Tools an agent can call: python (sandboxed), search (BM25, retrieval server, web APIs), browse, and their cache."""

from agent_envs.tools.base import Tool, ToolResult
from agent_envs.tools.browse import BrowseTool
from agent_envs.tools.cache import ToolCache
from agent_envs.tools.python import PythonTool
from agent_envs.tools.search import (
    BM25Backend,
    Hit,
    HttpBackend,
    ReferenceCacheBackend,
    SearchBackend,
    SearchTool,
    WebBackend,
)

__all__ = [
    "BM25Backend",
    "BrowseTool",
    "Hit",
    "HttpBackend",
    "PythonTool",
    "ReferenceCacheBackend",
    "SearchBackend",
    "SearchTool",
    "Tool",
    "ToolCache",
    "ToolResult",
    "WebBackend",
]
