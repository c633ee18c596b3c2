"""Retrieval backends: where passages come from, shared by `SearchTool` and the retrieval server.

Backends share one coroutine, `search(queries, topk) -> list[list[Hit]]`:

- `BM25Backend` (`bm25`): in-process BM25 over a corpus; a file's index is cached on disk,
  keyed by the file's content.
- `HttpBackend` (`searchr1`): client of a `/retrieve` server (ours, `agent-envs
  serve-retriever`, or Search-R1's).
- `WebBackend` (`web`): a web search API (Serper or Brave), key read from an environment
  variable; `ReferenceCacheBackend`: the ARPO reference's offline cache of web results.

    >>> import asyncio
    >>> backend = BM25Backend([{"id": "d1", "title": "Alpha", "text": "Alpha was founded by Ada."}])
    >>> [h.title for h in asyncio.run(backend.search(["Alpha founder"]))[0]]
    ['Alpha']
"""

from agent_envs.retrieval.backend import SearchBackend, SearchBackendError
from agent_envs.retrieval.bm25 import BM25Backend
from agent_envs.retrieval.corpus import Hit, load_corpus, normalize_query, parse_doc, split_contents
from agent_envs.retrieval.searchr1 import HttpBackend, parse_retrieve_response
from agent_envs.retrieval.web import WEB_PROVIDERS, ReferenceCacheBackend, WebBackend, WebProvider

__all__ = [
    "WEB_PROVIDERS",
    "BM25Backend",
    "Hit",
    "HttpBackend",
    "ReferenceCacheBackend",
    "SearchBackend",
    "SearchBackendError",
    "WebBackend",
    "WebProvider",
    "load_corpus",
    "normalize_query",
    "parse_doc",
    "parse_retrieve_response",
    "split_contents",
]
