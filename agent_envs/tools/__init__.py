"""The built-in tools an agent can call: python (sandboxed), search (over any retrieval backend), browse.

The `Tool` contract they implement is in `agent_envs.base.tool`; search backends are in
`agent_envs.retrieval`, the HTTP client and result cache in `agent_envs.remote`.
"""

from agent_envs.tools.browse import BrowseTool
from agent_envs.tools.python import PythonTool
from agent_envs.tools.search import SearchTool, format_hits

__all__ = ["BrowseTool", "PythonTool", "SearchTool", "format_hits"]
