"""AgentQA-v0: multi-hop questions answered by searching a passage corpus.

    >>> import gymnasium as gym, agent_envs
    >>> env = gym.make("AgentQA-v0")                                       # synthetic knowledge base

Search is in-process BM25 over `corpus` (a JSONL of id/title/text) unless `retriever_url` points
at a Search-R1 style retrieval server (`agent-envs serve-retriever`; nothing is contacted before
the first search). A named benchmark (`benchmark="hotpotqa"`) searches
`$AGENT_ENVS_DATA_DIR/corpus/wiki_multihop_mini.jsonl` by default.

    >>> import json, pathlib, tempfile
    >>> corpus = pathlib.Path(tempfile.mkdtemp()) / "corpus.jsonl"
    >>> _ = corpus.write_text(json.dumps({"id": "d1", "title": "Alpha", "text": "Alpha was founded by Ada."}) + "\\n")
    >>> tasks = [agent_envs.Task(id="q0", question="Who founded Alpha?", answers=["Ada"])]
    >>> env = gym.make("AgentQA-v0", tasks=tasks, corpus=str(corpus))
    >>> _ = env.reset(seed=0)
    >>> env.step("<think>look it up</think><search>Alpha founded</search>")[0]
    ' <result>\\nDoc 1(Title: Alpha) Alpha was founded by Ada.\\n</result>'
    >>> env = gym.make("AgentQA-v0", tasks=tasks, retriever_url="http://127.0.0.1:8000/retrieve")
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from agent_envs.base.task import Task
from agent_envs.core.env import ToolEnv
from agent_envs.data.loaders import data_dir
from agent_envs.envs.resources import check_env_keywords, python_tool, resolve_tasks, shared, world_with_tools

DEFAULT_CORPUS = "corpus/wiki_multihop_mini.jsonl"


def search_tool(corpus: str | None, retriever_url: str | None, topk: int):
    """The search tool for a benchmark: a retrieval server when given, else BM25 over the corpus."""
    from agent_envs.retrieval import BM25Backend, HttpBackend
    from agent_envs.tools.search import SearchTool

    if retriever_url:
        return shared("tool:search-http", lambda url, k: SearchTool(HttpBackend(url), topk=k), url=retriever_url, k=topk)
    if corpus is None:
        corpus = os.path.join(data_dir(), DEFAULT_CORPUS)
    if not os.path.exists(corpus):
        raise FileNotFoundError(
            f"search corpus {corpus or DEFAULT_CORPUS!r} not found: pass corpus='path/to/corpus.jsonl' "
            "(JSONL with id, title, text or contents), retriever_url='http://host:port/retrieve', "
            "or set AGENT_ENVS_DATA_DIR to the folder that holds corpus/"
        )
    path = os.path.abspath(corpus)
    return shared("tool:search-bm25", lambda path, k: SearchTool(BM25Backend.from_jsonl(path), topk=k), path=path, k=topk)


def make_qa_env(
    benchmark: str | None = None,
    data_files: str | Sequence[str] | None = None,
    split: str | None = None,
    tasks: Sequence[Task] | None = None,
    world: Mapping[str, Any] | None = None,
    corpus: str | None = None,
    retriever_url: str | None = None,
    topk: int = 3,
    python: Mapping[str, Any] | None = None,
    max_tool_calls: int = 6,
    **env_kwargs: Any,
) -> ToolEnv:
    """`python` (PythonTool settings, `{}` for defaults) adds the python tool beside search."""
    check_env_keywords(make_qa_env, env_kwargs)
    source = resolve_tasks(benchmark, data_files, split, tasks, reward="qa")
    if source is None and corpus is None and retriever_url is None:
        from agent_envs.worlds import KnowledgeConfig, KnowledgeWorld

        w, tools = world_with_tools("knowledge", KnowledgeWorld, KnowledgeConfig, world)
        return ToolEnv(w, tools, max_tool_calls=max_tool_calls, **env_kwargs)
    if source is None:
        raise ValueError("AgentQA-v0 with a corpus or retriever needs tasks: pass benchmark=..., data_files=... or tasks=[...]")
    tools = [search_tool(corpus, retriever_url, topk)]
    if python is not None:
        tools.append(python_tool(dict(python)))
    return ToolEnv(source, tools, max_tool_calls=max_tool_calls, **env_kwargs)
