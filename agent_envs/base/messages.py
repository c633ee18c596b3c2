"""Every message the env and its tools write to the model, in one place (fixed English text).

    >>> MESSAGES["limit_exceeded"].format(tool="search")[:38]
    'The maximum search call limit is excee'
"""

MESSAGES = {
    "limit_exceeded": "The maximum {tool} call limit is exceeded. You are not allowed to use {tool} anymore. Give your final answer.",
    "repeated_query": "You have searched this query. Please refer to previous results.",
    "empty_call": "Empty {tool} call: nothing to execute.",
    "no_results": "No search results found.",
    "search_error": "Search failed: {reason}.",
    "timeout": "Execution timed out after {seconds} seconds.",
    "no_output": "Code ran successfully with no output.",
    "invalid_call": "Invalid tool call: {reason}.",
    "tool_error": "{tool} failed: {reason}.",
    "session_reset": "[The Python session was reset ({reason}): variables, imports and files of earlier calls are gone.]",
}
