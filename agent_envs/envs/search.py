"""AgentSearch-v0: deep search: search, then read pages along links until the answer is found.

    >>> import gymnasium as gym, agent_envs
    >>> env = gym.make("AgentSearch-v0")                     # synthetic linked web, offline

Benchmarks (`benchmark="gaia"`) search a local corpus or the web. Web search reads its API key
from an environment variable when the env is built and uses it at the first search; here a
stand-in key under a name of our own shows the setting, offline:

    >>> import json, os, pathlib, tempfile
    >>> tasks = [agent_envs.Task(id="q0", question="Who founded Alpha?", answers=["Ada"])]
    >>> corpus = pathlib.Path(tempfile.mkdtemp()) / "wiki.jsonl"
    >>> _ = corpus.write_text(json.dumps({"id": "d1", "title": "Alpha", "text": "Founded by Ada."}) + "\\n")
    >>> env = gym.make("AgentSearch-v0", tasks=tasks, corpus=str(corpus))            # local corpus
    >>> os.environ["DOC_EXAMPLE_SEARCH_KEY"] = "stand-in"
    >>> env = gym.make("AgentSearch-v0", tasks=tasks, search="web", web={"api_key_env": "DOC_EXAMPLE_SEARCH_KEY"})
    >>> env.unwrapped.tools["search"].backend
    WebBackend(provider='serper', endpoint='https://google.serper.dev/search')
    >>> del os.environ["DOC_EXAMPLE_SEARCH_KEY"]

Training uses token F1 (the reference setting); evaluation of deep-search benchmarks uses an
LLM judge (see docs/benchmarks-data.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent_envs.base.task import Task
from agent_envs.core.env import ToolEnv
from agent_envs.envs.qa import search_tool
from agent_envs.envs.resources import check_env_keywords, resolve_tasks, shared, world_with_tools


def make_search_env(
    benchmark: str | None = None,
    data_files: str | Sequence[str] | None = None,
    split: str | None = None,
    tasks: Sequence[Task] | None = None,
    world: Mapping[str, Any] | None = None,
    search: str = "local",
    corpus: str | None = None,
    retriever_url: str | None = None,
    web: Mapping[str, Any] | None = None,
    browse: bool = True,
    topk: int = 10,
    max_tool_calls: int = 6,
    **env_kwargs: Any,
) -> ToolEnv:
    """`search` is `local` (BM25 corpus or retriever server) or `web` (a web-search API; `web`
    holds its settings, e.g. {"provider": "serper", "api_key_env": "SERPER_API_KEY"})."""
    check_env_keywords(make_search_env, env_kwargs)
    source = resolve_tasks(benchmark, data_files, split, tasks, reward="qa")
    if source is None and corpus is None and retriever_url is None and search == "local":
        from agent_envs.worlds import WebConfig, WebWorld

        w, tools = world_with_tools("web", WebWorld, WebConfig, world)
        return ToolEnv(w, tools, max_tool_calls=max_tool_calls, **env_kwargs)
    if source is None:
        raise ValueError("AgentSearch-v0 with real search needs tasks: pass benchmark=..., data_files=... or tasks=[...]")
    from agent_envs.retrieval import WebBackend
    from agent_envs.tools.browse import BrowseTool
    from agent_envs.tools.search import SearchTool

    if search == "web":
        tools: list = [shared("tool:search-web", lambda **kw: SearchTool(WebBackend(**kw), topk=topk), **dict(web or {}))]
    elif search == "local":
        tools = [search_tool(corpus, retriever_url, topk, benchmark, data_files, web=True)]
    else:
        raise ValueError(f"search={search!r} is unknown; use 'local' or 'web'")
    if browse:
        tools.append(shared("tool:browse", BrowseTool))
    return ToolEnv(source, tools, max_tool_calls=max_tool_calls, **env_kwargs)
