"""`HttpBackend`: client of a Search-R1 `/retrieve` server (ours, `agent-envs serve-retriever`, or
Search-R1's), with batched queries, pooled connections and retries."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agent_envs.net.http import (
    PermanentError,
    RetryPolicy,
    SessionPool,
    TransientError,
    json_or_error,
    raise_for_status,
    request_id,
    with_retries,
)
from agent_envs.retrieval.backend import SearchBackend, SearchBackendError
from agent_envs.retrieval.corpus import Hit, split_contents


def parse_retrieve_response(payload: Any, n_queries: int, url: str) -> list[list[Hit]]:
    """Read a `/retrieve` answer in any of the shapes forks produce.

    Accepts `{"result": [...]}` or a bare list; inner entries with or without a `document`
    wrapper; documents with `contents` and/or `title` + `text`.
    """
    result = payload.get("result") if isinstance(payload, Mapping) else payload
    if not isinstance(result, list):
        shown = str(payload)[:100]
        raise PermanentError(f"unexpected /retrieve answer from {url}: no 'result' list in {shown!r}")
    if n_queries == 1 and result and all(isinstance(e, Mapping) for e in result):
        result = [result]  # a single-query server that answered a flat list
    if len(result) != n_queries:
        raise PermanentError(
            f"/retrieve at {url} answered {len(result)} result lists for {n_queries} queries"
        )
    out: list[list[Hit]] = []
    for row in result:
        hits = []
        if not isinstance(row, list | None):
            raise PermanentError(f"unexpected /retrieve result row from {url}: {str(row)[:100]!r}")
        for entry in row or []:
            doc = entry.get("document", entry) if isinstance(entry, Mapping) else None
            score = entry.get("score", doc.get("score", 0.0)) if isinstance(doc, Mapping) else None
            if not isinstance(doc, Mapping) or not isinstance(score, int | float | None):
                raise PermanentError(f"unexpected /retrieve entry from {url}: {str(entry)[:100]!r}")
            if isinstance(doc.get("contents"), str) and not isinstance(doc.get("text"), str):
                title, text = split_contents(doc["contents"])
                title = str(doc.get("title") or title)
            else:
                title, text = str(doc.get("title", "")), str(doc.get("text", ""))
            hits.append(
                Hit(
                    id=str(doc.get("id", "")),
                    title=title,
                    text=text,
                    url=doc.get("url"),
                    score=float(score or 0.0),
                )
            )
        out.append(hits)
    return out


class HttpBackend(SearchBackend):
    """Client of a Search-R1 `/retrieve` server: batched `queries`, pooled connections, retries.

    Args:
        url: the full endpoint, e.g. ``http://127.0.0.1:8000/retrieve``.
        timeout_s: per-attempt timeout (a `SearchTool` also bounds the whole call, retries included).
        max_retries / backoff_s: retries on 5xx, 429, dropped connections and timeouts, sleeping
            `backoff_s * attempt` between tries (SkyRL's policy: 10 retries, 1 s steps). A refused
            connection is retried only a few times, quickly (see `RetryPolicy`).
        dialect: `queries` (batch, default) or `query` (one request per query, for servers
            that only accept the single-query form).
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = 30.0,
        max_retries: int = 10,
        backoff_s: float = 1.0,
        dialect: Literal["queries", "query"] = "queries",
        pool_size: int = 64,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"HttpBackend url must start with http:// or https://, got {url!r}")
        if dialect not in ("queries", "query"):
            raise ValueError(f"HttpBackend dialect must be 'queries' or 'query', got {dialect!r}")
        self.url = url
        self.timeout_s = timeout_s
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s, attempt_timeout_s=timeout_s)
        self.dialect = dialect
        self.pool = SessionPool(limit=pool_size)
        self.backend_id = f"http:{url}"

    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        return (await self.search_with_retries(queries, topk))[0]

    async def search_with_retries(
        self, queries: Sequence[str], topk: int = 3, budget_s: float | None = None
    ) -> tuple[list[list[Hit]], int]:
        queries = list(queries)
        if not queries:
            return [], 0
        if self.dialect == "query":
            parts = await asyncio.gather(
                *(self._post({"query": q, "topk": topk, "return_scores": True}, 1, budget_s) for q in queries)
            )
            return [p[0][0] for p in parts], max(p[1] for p in parts)
        return await self._post({"queries": queries, "topk": topk, "return_scores": True}, len(queries), budget_s)

    async def _post(self, body: dict, n: int, budget_s: float | None) -> tuple[list[list[Hit]], int]:
        rid = request_id()

        async def attempt() -> list[list[Hit]]:
            session = await self.pool.get()
            async with session.post(self.url, json=body, headers={"X-Request-Id": rid}) as resp:
                raw = await resp.read()
                raise_for_status(resp.status, self.url, raw.decode("utf-8", errors="replace"))
                return parse_retrieve_response(json_or_error(raw, self.url), n, self.url)

        try:
            return await with_retries(attempt, self.retry, describe=f"POST {self.url}", budget_s=budget_s)
        except (TransientError, PermanentError) as exc:
            tries = f"{exc.retries} {'retry' if exc.retries == 1 else 'retries'}, " if exc.retries else ""
            raise SearchBackendError(f"{exc} ({tries}request {rid})", exc.retries, exc.kind) from exc

    async def aclose(self) -> None:
        await self.pool.aclose()
