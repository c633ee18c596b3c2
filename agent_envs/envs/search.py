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

from dataclasses import dataclass
from typing import Any, Literal

from agent_envs.base.config import UserError, option
from agent_envs.core.env import ToolEnv
from agent_envs.envs.qa import search_tool
from agent_envs.envs.resources import TaskFileConfig, shared, world_with_tools
from agent_envs.worlds.web import WebConfig, WebWorld


@dataclass
class SearchEnvConfig(TaskFileConfig):
    """AgentSearch-v0's settings: ToolEnv's, the task source's, the world's, search's and browse's."""

    world: WebConfig = option(factory=WebConfig, help="the linked-web world played when no tasks, corpus or "
                              "retriever are given")
    search: Literal["local", "web"] = option("local", "local: BM25 over a corpus or a retriever server; web: a "
                                             "web-search API (settings in web)")
    corpus: str | None = option(None, "a JSONL corpus (id, title, text) searched with BM25 (search=local)")
    retriever_url: str | None = option(None, "a retrieval server to search instead (agent-envs serve-retriever)")
    web: dict | None = option(None, "web-search settings, e.g. {provider: serper, api_key_env: SERPER_API_KEY}")
    browse: bool = option(True, "add the browse tool, which reads a page")
    topk: int = option(10, "results per search")


def make_search_env(**settings: Any) -> ToolEnv:
    """Build a search env from `SearchEnvConfig`'s keys."""
    config = SearchEnvConfig.of(settings, "AgentSearch-v0")
    source = config.task_source(reward="qa")
    if source is None and config.corpus is None and config.retriever_url is None and config.search == "local":
        world, tools = world_with_tools(WebWorld, config.world)
        return ToolEnv(world, tools, config)
    if source is None:
        raise UserError("AgentSearch-v0 with real search needs tasks: pass benchmark=..., data_files=... or "
                        "tasks=[...]")
    from agent_envs.retrieval import WebBackend
    from agent_envs.tools.browse import BrowseTool
    from agent_envs.tools.search import SearchTool

    if config.search == "web":
        tools: list = [shared("tool:search-web", lambda **kw: SearchTool(WebBackend(**kw), topk=config.topk),
                              **(config.web or {}))]
    else:
        tools = [search_tool(config.corpus, config.retriever_url, config.topk, config.benchmark,
                             config.data_files, web=True)]
    if config.browse:
        tools.append(shared("tool:browse", BrowseTool))
    return ToolEnv(source, tools, config)
