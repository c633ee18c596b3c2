"""Web search: `WebBackend` (Serper or Brave APIs, key read from an environment variable) and
`ReferenceCacheBackend` (the ARPO reference's offline cache of web results)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent_envs.net.http import (
    PermanentError,
    RetryPolicy,
    SessionPool,
    TransientError,
    json_or_error,
    raise_for_status,
    with_retries,
)
from agent_envs.retrieval.backend import SearchBackend, SearchBackendError
from agent_envs.retrieval.corpus import Hit, normalize_query


@dataclass(frozen=True)
class WebProvider:
    """How to call one web search API and read its answer."""

    name: str
    endpoint: str
    method: Literal["GET", "POST"]
    key_header: str
    default_key_env: str
    results_path: tuple[str, ...]
    title_field: str = "title"
    url_field: str = "link"
    snippet_field: str = "snippet"


WEB_PROVIDERS: dict[str, WebProvider] = {
    # https://serper.dev : POST {"q", "num"} -> {"organic": [{"title", "link", "snippet"}]}
    "serper": WebProvider(
        "serper", "https://google.serper.dev/search", "POST", "X-API-KEY", "SERPER_API_KEY", ("organic",)
    ),
    # https://api.search.brave.com : GET ?q=&count= -> {"web": {"results": [{"title", "url", "description"}]}}
    "brave": WebProvider(
        "brave",
        "https://api.search.brave.com/res/v1/web/search",
        "GET",
        "X-Subscription-Token",
        "BRAVE_API_KEY",
        ("web", "results"),
        url_field="url",
        snippet_field="description",
    ),
}


class WebBackend(SearchBackend):
    """A web search API client returning title / url / snippet hits.

    The key is read from an environment variable (never from configs): `SERPER_API_KEY` or
    `BRAVE_API_KEY` by default, or the one named by `api_key_env`. `endpoint` overrides the
    provider URL (a proxy, or a local stand-in in tests). `max_rps` rate-limits requests (the
    reference evaluation uses 32 per second).
    """

    def __init__(
        self,
        provider: str = "serper",
        api_key_env: str | None = None,
        endpoint: str | None = None,
        timeout_s: float = 20.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_rps: float = 32.0,
        market: str | None = None,
    ) -> None:
        if provider not in WEB_PROVIDERS:
            raise ValueError(
                f"unknown web search provider {provider!r}; choose one of {sorted(WEB_PROVIDERS)}"
            )
        self.provider = WEB_PROVIDERS[provider]
        self.api_key_env = api_key_env or self.provider.default_key_env
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise ValueError(
                f"web search provider {provider!r} needs an API key: set the environment "
                f"variable {self.api_key_env}"
            )
        self._key = key
        self.endpoint = endpoint or self.provider.endpoint
        self.timeout_s = timeout_s
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s, attempt_timeout_s=timeout_s)
        self.market = market
        self.min_interval_s = 1.0 / max_rps if max_rps > 0 else 0.0
        self._next_slot = 0.0
        self.pool = SessionPool(limit=32)
        self.backend_id = f"web:{provider}:{market or ''}"

    def __repr__(self) -> str:  # never print the key
        return f"WebBackend(provider={self.provider.name!r}, endpoint={self.endpoint!r})"

    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        return (await self.search_with_retries(queries, topk))[0]

    async def search_with_retries(
        self, queries: Sequence[str], topk: int = 3, budget_s: float | None = None
    ) -> tuple[list[list[Hit]], int]:
        parts = await asyncio.gather(*(self._one(q, topk, budget_s) for q in queries))
        return [p[0] for p in parts], max((p[1] for p in parts), default=0)

    async def _throttle(self) -> None:
        if not self.min_interval_s:
            return
        now = time.monotonic()
        slot = max(now, self._next_slot)
        self._next_slot = slot + self.min_interval_s
        if slot > now:
            await asyncio.sleep(slot - now)

    async def _one(self, query: str, topk: int, budget_s: float | None) -> tuple[list[Hit], int]:
        p = self.provider
        headers = {p.key_header: self._key, "Accept": "application/json"}

        async def attempt() -> list[Hit]:
            await self._throttle()
            session = await self.pool.get()
            if p.method == "POST":
                body: dict[str, Any] = {"q": query, "num": topk}
                if self.market:
                    body["gl"] = self.market
                ctx = session.post(self.endpoint, json=body, headers=headers)
            else:
                params: dict[str, Any] = {"q": query, "count": topk}
                if self.market:
                    params["country"] = self.market
                ctx = session.get(self.endpoint, params=params, headers=headers)
            async with ctx as resp:
                raw = await resp.read()
                raise_for_status(resp.status, self.endpoint, raw.decode("utf-8", errors="replace"))
                return self._parse(json_or_error(raw, self.endpoint), topk)

        try:
            return await with_retries(attempt, self.retry, describe=f"{p.name} search", budget_s=budget_s)
        except (TransientError, PermanentError) as exc:
            raise SearchBackendError(str(exc), exc.retries, exc.kind) from exc

    def _parse(self, payload: Any, topk: int) -> list[Hit]:
        p = self.provider
        node = payload
        for part in p.results_path:
            node = node.get(part, []) if isinstance(node, Mapping) else []
        hits: list[Hit] = []
        seen: set[str] = set()
        for r in node if isinstance(node, list) else []:
            if not isinstance(r, Mapping):
                continue
            url = str(r.get(p.url_field) or "")
            snippet = _strip_tags(str(r.get(p.snippet_field) or ""))
            if (url, snippet) in seen:  # the reference deduplicates snippets
                continue
            seen.add((url, snippet))
            hits.append(
                Hit(
                    id=url,
                    title=_strip_tags(str(r.get(p.title_field) or "")),
                    text=snippet,
                    url=url or None,
                    score=float(len(node) - len(hits)),
                )
            )
            if len(hits) >= topk:
                break
        return hits

    async def aclose(self) -> None:
        await self.pool.aclose()


def _strip_tags(text: str) -> str:
    return " ".join(re.sub(r"</?(strong|b|em)>", "", text).split())


class ReferenceCacheBackend(SearchBackend):
    """Offline web search from the ARPO reference's cache file (JSON: query -> formatted text).

    The reference ships `search_cache.json`, 1000 training queries mapped to Bing snippets as
    ``Page 1: snippet\nPage 2: ...``. This backend parses those back into hits, so
    `SearchTool(ReferenceCacheBackend(path), topk=10, style="page")` reproduces the reference's
    observation for a cached query without network or key. Queries match after normalisation.
    A query that is not in the file is a search error (`missing="error"`, the spec's
    `cache_only` mode) or no results (`missing="empty"`).
    """

    _PAGE_RE = re.compile(r"(?:^|\n)Page (\d+): ")

    def __init__(self, path: str | os.PathLike, missing: Literal["error", "empty"] = "error") -> None:
        if missing not in ("error", "empty"):
            raise ValueError(f"ReferenceCacheBackend missing must be 'error' or 'empty', got {missing!r}")
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"reference search cache {self.path} not found")
        raw = self.path.read_bytes()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.path}: invalid JSON ({exc.msg} at line {exc.lineno})") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{self.path}: expected a JSON object mapping query -> result text")
        self.missing = missing
        self.entries: dict[str, list[Hit]] = {}
        for query, text in data.items():
            if not isinstance(text, str):
                raise ValueError(
                    f"{self.path}: the value of query {query!r} is {type(text).__name__}, not text"
                )
            self.entries[normalize_query(query)] = self.parse_pages(text)
        self.backend_id = f"refcache:{hashlib.sha256(raw).hexdigest()[:16]}"

    @classmethod
    def parse_pages(cls, text: str) -> list[Hit]:
        """``Page 1: a\nPage 2: b`` -> hits (anything else, e.g. "No search results found.", -> [])."""
        parts = cls._PAGE_RE.split(text)
        # split gives [before, n1, body1, n2, body2, ...]; a result text starts with "Page 1: "
        if len(parts) < 3 or parts[0].strip():
            return []
        return [
            Hit(id=f"page-{n}", title="", text=body, score=float(len(parts) - i))
            for i, (n, body) in enumerate(zip(parts[1::2], parts[2::2], strict=True))
        ]

    def __len__(self) -> int:
        return len(self.entries)

    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        out = []
        for q in queries:
            hits = self.entries.get(normalize_query(q))
            if hits is None and self.missing == "error":
                raise SearchBackendError(
                    f"query not in the offline search cache {self.path.name}", kind="cache_miss"
                )
            out.append((hits or [])[:topk])
        return out
