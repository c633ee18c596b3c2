"""AgentQA-v0: multi-hop questions answered by searching a passage corpus.

    >>> import gymnasium as gym, agent_envs
    >>> env = gym.make("AgentQA-v0")                                       # synthetic knowledge base

Search is in-process BM25 over `corpus` (a JSONL of id/title/text) unless `retriever_url` points
at a Search-R1 style retrieval server (`agent-envs serve-retriever`; nothing is contacted before
the first search). A named benchmark (`benchmark="hotpotqa"`) with neither searches
`$AGENT_ENVS_DATA_DIR/corpus/wiki_multihop_mini.jsonl` when that file exists, else the passages
that ship with its question files (`agent_envs.data.passages`: HotpotQA's and MuSiQue's
distractor-setting paragraphs, fetched by `agent-envs data download`); a benchmark whose files
carry none says in one line what to pass.

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
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_envs.base.config import UserError, option
from agent_envs.base.paths import cache_root
from agent_envs.core.env import ToolEnv
from agent_envs.data.download import PASSAGE_SOURCES
from agent_envs.data.loaders import benchmark_path, data_dir
from agent_envs.data.passages import PASSAGE_FIELDS, collect_passages, write_passage_corpus
from agent_envs.data.registry import get_spec
from agent_envs.envs.resources import TaskFileConfig, python_tool, shared, world_with_tools
from agent_envs.worlds.knowledge import KnowledgeConfig, KnowledgeWorld

DEFAULT_CORPUS = "corpus/wiki_multihop_mini.jsonl"


def search_tool(corpus: str | None, retriever_url: str | None, topk: int, benchmark: str | None = None,
                data_files: str | Sequence[str] | None = None, web: bool = False):
    """The search tool for a benchmark: a retrieval server when given, else BM25 over the corpus
    (`default_corpus` when none is given; `web` adds search='web' to what its error suggests)."""
    from agent_envs.retrieval import BM25Backend, HttpBackend
    from agent_envs.tools.search import SearchTool

    if retriever_url:
        return shared("tool:search-http", lambda url, k: SearchTool(HttpBackend(url), topk=k), url=retriever_url, k=topk)
    if corpus is None:
        corpus = default_corpus(benchmark, data_files, web)
    if not os.path.exists(corpus):
        raise FileNotFoundError(
            f"search corpus {corpus!r} not found: pass corpus='path/to/corpus.jsonl' "
            "(JSONL with id, title, text or contents), retriever_url='http://host:port/retrieve', "
            "or set AGENT_ENVS_DATA_DIR to the folder that holds corpus/"
        )
    path = os.path.abspath(corpus)
    return shared("tool:search-bm25", lambda path, k: SearchTool(BM25Backend.from_jsonl(path), topk=k), path=path, k=topk)


def default_corpus(benchmark: str | None, data_files: str | Sequence[str] | None = None, web: bool = False) -> str:
    """The corpus searched when none is configured: `corpus/wiki_multihop_mini.jsonl` in the data
    folder when it is there, else the passages of the question files (`data_files`, or every
    local split of `benchmark`), built once into the cache; else a one-line error saying what
    the benchmark needs."""
    mini = data_dir() / DEFAULT_CORPUS
    if mini.is_file():
        return str(mini)
    if data_files is not None:
        files = [str(f) for f in ([data_files] if isinstance(data_files, str | os.PathLike) else data_files)]
    elif benchmark is not None:
        spec = get_spec(benchmark)
        files = [str(p) for split in spec.files if (p := benchmark_path(spec.name, split)).is_file()]
    else:
        files = []
    name = get_spec(benchmark).name if benchmark is not None else "questions"
    built = shared("corpus:passages", _passage_corpus, name=name, files=files)
    if built is not None:
        return built
    fetch = f"`agent-envs data download {name}` fetches its question files with their passages, or p" \
        if name in PASSAGE_SOURCES else "P"
    raise FileNotFoundError(
        f"{name!r} needs a search corpus: no question file of it in {data_dir()} carries passages "
        f"(fields {', '.join(PASSAGE_FIELDS)}). {fetch}ass corpus='wiki.jsonl' (JSONL of id, title, text), "
        "or retriever_url='http://127.0.0.1:8000/retrieve' served by `agent-envs serve-retriever --corpus wiki.jsonl`"
        + (", or search='web'" if web else "") + " (docs/benchmarks-data.md)"
    )


def _passage_corpus(name: str, files: list[str]) -> str | None:
    passages, used = collect_passages(files)
    if not passages:
        return None
    path = write_passage_corpus(name, passages, cache_root() / "corpus")
    print(f"agent-envs: no corpus configured for {name!r}: searching the {len(passages)} passages that ship "
          f"with its question files ({', '.join(os.path.basename(f) for f in used)}), deduplicated; pass "
          "corpus= or retriever_url= to search a full Wikipedia", file=sys.stderr)
    return str(path)


@dataclass
class QAEnvConfig(TaskFileConfig):
    """AgentQA-v0's settings: ToolEnv's, the task source's, the world's and the search's."""

    world: KnowledgeConfig = option(factory=KnowledgeConfig, help="the knowledge-base world played when no "
                                    "tasks, corpus or retriever are given")
    corpus: str | None = option(None, "a JSONL corpus (id, title, text) searched with BM25 (null: the data "
                                "folder's, or the passages of the question files)")
    retriever_url: str | None = option(None, "a retrieval server to search instead (agent-envs serve-retriever)")
    topk: int = option(3, "passages per search")
    python: dict | None = option(None, "PythonTool settings: adds the python tool beside search ({}: defaults)")


def make_qa_env(**settings: Any) -> ToolEnv:
    """Build a QA env from `QAEnvConfig`'s keys."""
    config = QAEnvConfig.of(settings, "AgentQA-v0")
    source = config.task_source(reward="qa")
    if source is None and config.corpus is None and config.retriever_url is None:
        world, tools = world_with_tools(KnowledgeWorld, config.world)
        return ToolEnv(world, tools, config)
    if source is None:
        raise UserError("AgentQA-v0 with a corpus or retriever needs tasks: pass benchmark=..., data_files=... "
                        "or tasks=[...]")
    tools = [search_tool(config.corpus, config.retriever_url, config.topk, config.benchmark, config.data_files)]
    if config.python is not None:
        tools.append(python_tool(config.python))
    return ToolEnv(source, tools, config)
