"""`SearchTool`: `<search> query </search>` over any retrieval backend (see `agent_envs.retrieval`).

It formats hits the way Search-R1/GEM do (`Doc i(Title: t) text`, one line per hit), serves
repeated queries from a `ToolCache`, and turns every backend failure into a distinct
`Search failed: ...` observation (never confused with "No search results found.").

    >>> import asyncio
    >>> from agent_envs.retrieval import BM25Backend
    >>> docs = [{"id": "d1", "title": "Alpha", "text": "Alpha was founded by Ada."},
    ...         {"id": "d2", "title": "Beta", "text": "Beta is a river."}]
    >>> tool = SearchTool(BM25Backend(docs), topk=1)
    >>> asyncio.run(tool("who founded Alpha")).text
    'Doc 1(Title: Alpha) Alpha was founded by Ada.'
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, ClassVar, Literal

from agent_envs.base.messages import MESSAGES
from agent_envs.base.tool import Tool, ToolResult
from agent_envs.net.http import LoopSemaphore
from agent_envs.remote.cache import ToolCache
from agent_envs.retrieval.backend import SearchBackend, SearchBackendError
from agent_envs.retrieval.bm25 import BM25Backend
from agent_envs.retrieval.corpus import Hit, normalize_query


def format_hits(
    hits: Sequence[Hit], style: Literal["doc", "skyrl", "page"] = "doc", max_chars: int = 1000
) -> str:
    """Hits as the model sees them, one line each.

    `doc`: ``Doc 1(Title: T) text`` (Search-R1, GEM); `skyrl`: ``Doc 1: "T"\\ntext``;
    `page`: ``Page 1: snippet`` (ARPO's web search). Each passage is cut to `max_chars`.
    """
    if style not in ("doc", "skyrl", "page"):
        raise ValueError(f"unknown result style {style!r}; use 'doc', 'skyrl' or 'page'")
    lines = []
    for i, h in enumerate(hits, 1):
        text = h.text if len(h.text) <= max_chars else h.text[:max_chars].rstrip() + "..."
        if style == "doc":
            lines.append(f"Doc {i}(Title: {h.title}) {text}")
        elif style == "skyrl":
            lines.append(f'Doc {i}: "{h.title}"\n{text}')
        else:
            lines.append(f"Page {i}: {text}")
    return "\n".join(lines)

# How long past its budget a backend call may run before the tool cuts it (a backend that honours
# `budget_s` ends on time; the env's own deadline is a second later still).
_GRACE_S = 0.1


class SearchTool(Tool):
    """`<search> query </search>`: top-k passages from a backend, formatted for the model.

    Args:
        backend: any `SearchBackend`.
        topk: passages per query.
        cache: optional `ToolCache` (structured hits are cached; errors never are).
        max_result_chars: characters kept per passage.
        timeout_s: wall-clock budget of one call, queueing and retries included (the failure
            text says what failed, or that the budget ran out).
        concurrency: at most this many backend calls of this tool at once.
        style: result format (`doc`, `skyrl`, `page`; see `format_hits`).
    """

    name: ClassVar[str] = "search"
    argument: ClassVar[str] = "query"
    description: ClassVar[str] = "search a knowledge source; returns the top passages for a query"
    # the same query again would return the same passages: remind the model instead (Search-R1)
    dedupe_repeats: ClassVar[bool] = True

    def __init__(
        self,
        backend: SearchBackend,
        topk: int = 3,
        cache: ToolCache | None = None,
        max_result_chars: int = 1000,
        timeout_s: float = 30.0,
        concurrency: int = 64,
        style: Literal["doc", "skyrl", "page"] = "doc",
    ) -> None:
        if topk < 1:
            raise ValueError(f"SearchTool topk must be >= 1, got {topk}")
        format_hits([], style)  # validates style early
        self.backend = backend
        self.topk = topk
        self.cache = cache
        self.max_result_chars = max_result_chars
        self.timeout_s = timeout_s
        self.style = style
        self.concurrency = LoopSemaphore(concurrency)

    @classmethod
    def from_corpus(
        cls,
        corpus: str | os.PathLike | Iterable[Mapping[str, Any]],
        topk: int = 3,
        cache_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> SearchTool:
        """A BM25 search tool over a corpus file (index cached on disk) or a list of passages."""
        if isinstance(corpus, str | os.PathLike):
            backend = BM25Backend.from_jsonl(corpus, cache_dir=cache_dir)
        else:
            backend = BM25Backend(corpus)
        return cls(backend, topk=topk, **kwargs)

    def clean_argument(self, text: str) -> str:
        return normalize_query(text)

    def normalize(self, arg: str) -> str:
        return normalize_query(arg)

    def cache_key(self, query: str) -> str:
        return ToolCache.key(self.name, self.backend.backend_id, self.normalize(query), topk=self.topk)

    async def call(self, arg: str) -> ToolResult:
        query = self.normalize(arg)
        if not query:
            return ToolResult(MESSAGES["empty_call"].format(tool=self.name), ok=False, error="empty")
        meta: dict[str, Any] = {"backend": self.backend.backend_id, "query": query}
        key = None
        if self.cache is not None:
            key = self.cache_key(query)
            cached = self.cache.get(key)
            if cached is not None:
                return self._result([Hit.from_dict(h) for h in cached], meta, cached=True)
            if self.cache.mode == "offline":
                reason = "not in the offline cache"
                return ToolResult(
                    MESSAGES["search_error"].format(reason=reason),
                    ok=False,
                    error="cache_miss",
                    metadata=meta,
                )
        retries = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:
            # The backend gets what is left of the budget after the queue and stops retrying in
            # time to say why it failed; the grace is only for backends that ignore their budget.
            async with asyncio.timeout_at(deadline + _GRACE_S), self.concurrency.get():
                hits_lists, retries = await self.backend.search_with_retries(
                    [query], self.topk, budget_s=max(deadline - loop.time(), 0.0)
                )
            hits = hits_lists[0][: self.topk]
        except TimeoutError:
            reason = f"timeout after {self.timeout_s:g} s"
            return ToolResult(
                MESSAGES["search_error"].format(reason=reason), ok=False, error="timeout", metadata=meta
            )
        except SearchBackendError as exc:
            return ToolResult(
                MESSAGES["search_error"].format(reason=exc.reason),
                ok=False,
                error=exc.kind,
                retries=exc.retries,
                metadata=meta,
            )
        except Exception as exc:  # a backend bug is still a search failure the model can read
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return ToolResult(
                MESSAGES["search_error"].format(reason=reason), ok=False, error="exception", metadata=meta
            )
        if key is not None and self.cache is not None:
            self.cache.put(key, [asdict(h) for h in hits])
        result = self._result(hits, meta, cached=False)
        result.retries = retries
        return result

    def _result(self, hits: list[Hit], meta: dict[str, Any], cached: bool) -> ToolResult:
        meta["doc_ids"] = [h.id for h in hits]
        if not hits:
            return ToolResult(
                MESSAGES["no_results"], ok=True, error="no_results", cached=cached, metadata=meta
            )
        return ToolResult(format_hits(hits, self.style, self.max_result_chars), cached=cached, metadata=meta)

    async def search_many(self, queries: Sequence[str]) -> list[ToolResult]:
        """Several queries at once (each through the cache and the concurrency limit)."""
        return list(await asyncio.gather(*(self(q) for q in queries)))

    async def aclose(self) -> None:
        await self.backend.aclose()
