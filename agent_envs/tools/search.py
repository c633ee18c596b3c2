"""The search tool and its backends: in-process BM25, a Search-R1 retrieval server, web search APIs.

`SearchTool` formats hits the way Search-R1/GEM do (`Doc i(Title: t) text`, one line per hit),
serves repeated queries from a `ToolCache`, and turns every backend failure into a distinct
`Search failed: ...` observation (never confused with "No search results found.").

    >>> import asyncio
    >>> docs = [{"id": "d1", "title": "Alpha", "text": "Alpha was founded by Ada."},
    ...         {"id": "d2", "title": "Beta", "text": "Beta is a river."}]
    >>> tool = SearchTool(BM25Backend(docs), topk=1)
    >>> asyncio.run(tool("who founded Alpha")).text
    'Doc 1(Title: Alpha) Alpha was founded by Ada.'

Backends share one coroutine, `search(queries, topk) -> list[list[Hit]]`:

- `BM25Backend`: bm25s over a corpus (JSONL rows with `id`, `title`, `text` or
  `contents = '"Title"\\ntext'`); the index of a file is cached on disk, keyed by the file's content.
- `HttpBackend`: client of a `/retrieve` server (ours, `agent-envs serve-retriever`, or Search-R1's).
- `WebBackend`: a web search API (Serper or Brave), key read from an environment variable.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from agent_envs.core.protocol import MESSAGES
from agent_envs.data.jsonl import iter_json_objects
from agent_envs.tools.base import Tool, ToolResult
from agent_envs.tools.cache import ToolCache
from agent_envs.tools.http_client import (
    LoopSemaphore,
    PermanentError,
    RetryPolicy,
    SessionPool,
    TransientError,
    json_or_error,
    raise_for_status,
    request_id,
    timeout_of,
    with_retries,
)

BM25_INDEX_VERSION = 1


@dataclass
class Hit:
    """One retrieved passage or web result."""

    id: str
    title: str
    text: str
    url: str | None = None
    score: float = 0.0

    @property
    def contents(self) -> str:
        """The Search-R1 corpus form: quoted title on the first line, then the text."""
        return f'"{self.title}"\n{self.text}'

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Hit:
        return cls(
            id=str(d.get("id", "")),
            title=str(d.get("title", "")),
            text=str(d.get("text", "")),
            url=d.get("url"),
            score=float(d.get("score") or 0.0),
        )


def normalize_query(query: str) -> str:
    """Canonical query: strip, collapse whitespace, drop double quotes (case is kept)."""
    return " ".join(query.replace('"', " ").split())


def split_contents(contents: str) -> tuple[str, str]:
    """`'"Title"\\ntext'` -> (title, text); a single line has no title."""
    first, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents.strip()
    return first.strip().strip('"'), rest.strip()


def parse_doc(row: Any, where: str) -> dict[str, str]:
    """Validate one corpus row into {id, title, text}; `where` names the file and line for errors."""
    if not isinstance(row, dict | Mapping):
        raise ValueError(f"{where}: a corpus row must be a JSON object, got {type(row).__name__}")
    if "id" not in row or row["id"] is None or str(row["id"]) == "":
        raise ValueError(f"{where}: corpus row has no 'id' field (every passage needs a unique id)")
    doc_id = str(row["id"])
    if isinstance(row.get("text"), str):
        title = row.get("title")
        if title is None and isinstance(row.get("contents"), str):
            title = split_contents(row["contents"])[0]
        return {"id": doc_id, "title": str(title or ""), "text": row["text"]}
    if isinstance(row.get("contents"), str):
        title, text = split_contents(row["contents"])
        if row.get("title") is not None:
            title = str(row["title"])
        return {"id": doc_id, "title": title, "text": text}
    raise ValueError(f"{where}: corpus row {doc_id!r} has neither a 'text' nor a 'contents' string field")


def load_corpus(path: str | os.PathLike) -> list[dict[str, str]]:
    """Read a corpus JSONL into [{id, title, text}], with errors naming the file and line."""
    docs: list[dict[str, str]] = []
    seen: dict[str, int] = {}
    for where, lineno, row in iter_json_objects(path, "corpus file"):
        doc = parse_doc(row, where)
        if doc["id"] in seen:
            raise ValueError(f"{where}: duplicate id {doc['id']!r} (first on line {seen[doc['id']]})")
        seen[doc["id"]] = lineno
        docs.append(doc)
    if not docs:
        raise ValueError(f"corpus file {path} has no passages")
    return docs


# -- backends --------------------------------------------------------------------------------------


class SearchBackendError(Exception):
    """A backend failed (after its retries); `reason` is what the model reads."""

    def __init__(self, reason: str, retries: int = 0, kind: str = "backend") -> None:
        super().__init__(reason)
        self.reason = reason
        self.retries = retries
        self.kind = kind


class SearchBackend(ABC):
    """A source of hits. `backend_id` identifies the index or service in cache keys."""

    backend_id: str = "backend"

    @abstractmethod
    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        """Hits for each query, best first, in request order."""

    async def search_with_retries(self, queries: Sequence[str], topk: int = 3) -> tuple[list[list[Hit]], int]:
        """Like `search`, also returning how many retries it took (network backends retry)."""
        return await self.search(queries, topk), 0

    async def aclose(self) -> None:  # noqa: B027  (optional hook; most backends hold nothing)
        """Release pooled connections."""


_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")


class BM25Backend(SearchBackend):
    """In-process BM25 (bm25s) over a list of passages.

    Ranking is deterministic: ties are broken by corpus order, and passages with a zero score
    (no query term in common) are never returned.

    Args:
        docs: passages as dicts with `id` and `title` + `text`, or `contents`.
        k1, b: BM25 parameters.
        stopwords: bm25s stopword list name ("en") or None.
    """

    def __init__(
        self,
        docs: Iterable[Mapping[str, Any]],
        k1: float = 1.5,
        b: float = 0.75,
        stopwords: str | None = "en",
        *,
        _index: Any = None,
        _backend_id: str | None = None,
        _parsed: bool = False,
    ) -> None:
        import bm25s

        if _parsed:  # rows already validated by load_corpus
            self.docs = list(docs)  # type: ignore[arg-type]
        else:
            self.docs = [parse_doc(d, f"docs[{i}]") for i, d in enumerate(docs)]
        if not self.docs:
            raise ValueError("BM25Backend needs at least one passage")
        self.k1, self.b, self.stopwords = k1, b, stopwords
        self._stopset = (
            frozenset(bm25s.stopwords.STOPWORDS_EN) if stopwords in ("en", "english") else frozenset()
        )
        if stopwords not in (None, "en", "english"):
            raise ValueError(f"BM25Backend stopwords must be 'en' or None, got {stopwords!r}")
        if _index is None:
            _index = self._build_index()
        self.index = _index
        self.vocab: dict[str, int] = self.index.vocab_dict
        self.backend_id = _backend_id or f"bm25:{self._content_hash()}"

    # -- construction -----------------------------------------------------------------------------

    def _doc_text(self, d: Mapping[str, str]) -> str:
        return f"{d['title']} {d['text']}"

    def _tokenize(self, text: str) -> list[str]:
        return [t for t in _TOKEN_RE.findall(text.lower()) if t not in self._stopset]

    def _build_index(self) -> Any:
        import bm25s

        corpus_tokens = [self._tokenize(self._doc_text(d)) for d in self.docs]
        vocab: dict[str, int] = {}
        ids = [[vocab.setdefault(t, len(vocab)) for t in toks] for toks in corpus_tokens]
        index = bm25s.BM25(k1=self.k1, b=self.b)
        index.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)
        return index

    def _content_hash(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps([BM25_INDEX_VERSION, self.k1, self.b, self.stopwords]).encode())
        for d in self.docs:
            h.update(json.dumps([d["id"], d["title"], d["text"]], ensure_ascii=False).encode())
        return h.hexdigest()[:16]

    @classmethod
    def from_jsonl(
        cls,
        path: str | os.PathLike,
        cache_dir: str | os.PathLike | None = None,
        k1: float = 1.5,
        b: float = 0.75,
        stopwords: str | None = "en",
    ) -> BM25Backend:
        """Load a corpus JSONL; the index is built once and cached on disk by content hash.

        `cache_dir` defaults to `$AGENT_ENVS_CACHE_DIR/bm25` or `~/.cache/agent_envs/bm25`.
        """
        import bm25s

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {path} not found")
        h = hashlib.sha256()
        h.update(json.dumps([BM25_INDEX_VERSION, k1, b, stopwords]).encode())
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        digest = h.hexdigest()[:16]
        docs = load_corpus(path)
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "bm25"
        target = root / f"{path.stem}-{digest}"
        backend_id = f"bm25:{digest}"
        if (target / "params.index.json").is_file():
            try:
                index = bm25s.BM25.load(str(target), mmap=False)
                return cls(docs, k1, b, stopwords, _index=index, _backend_id=backend_id, _parsed=True)
            except Exception:  # a torn or foreign cache entry: replace it below
                shutil.rmtree(target, ignore_errors=True)
        backend = cls(docs, k1, b, stopwords, _backend_id=backend_id, _parsed=True)
        backend._save_index(target)
        return backend

    def _save_index(self, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp", dir=target.parent))
        try:
            self.index.save(str(tmp))
            # Atomic: a concurrent reader sees all or nothing. OSError: another process won the
            # race, and its index is identical.
            with contextlib.suppress(OSError):
                os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # -- querying ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.docs)

    def search_sync(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        """Blocking search (about a millisecond per query on 10k passages)."""
        return [self._one(q, topk) for q in queries]

    def _one(self, query: str, topk: int) -> list[Hit]:
        ids = [self.vocab[t] for t in self._tokenize(query) if t in self.vocab]
        if not ids or topk <= 0:
            return []
        scores = self._scores(ids)
        # Deterministic top-k: everything scoring at least the k-th best, sorted by (-score, index).
        # Partition only the non-zero scores: np.partition on an array that is mostly zeros hits
        # introselect's slow path (17 ms instead of <1 ms at 100k passages).
        nz = np.flatnonzero(scores)
        vals = scores[nz]
        if len(nz) > topk:
            kth = np.partition(vals, len(vals) - topk)[len(vals) - topk]
            keep = vals >= kth
            nz, vals = nz[keep], vals[keep]
        order = nz[np.lexsort((nz, -vals))][:topk]
        return [
            Hit(
                id=self.docs[i]["id"],
                title=self.docs[i]["title"],
                text=self.docs[i]["text"],
                score=float(scores[i]),
            )
            for i in order
        ]

    def _scores(self, token_ids: list[int]) -> np.ndarray:
        # bm25s keeps per-token postings (data = precomputed BM25 term scores, indices = doc
        # rows). Its numpy path sums them with np.add.at, which costs ~10 ms per query at 100k
        # passages; one np.bincount over the concatenated postings gives the same sums ~5x faster.
        m = self.index.scores
        indptr = m["indptr"]
        spans = [(indptr[t], indptr[t + 1]) for t in token_ids]
        rows = np.concatenate([m["indices"][a:b] for a, b in spans])
        weights = np.concatenate([m["data"][a:b] for a, b in spans])
        return np.bincount(rows, weights=weights, minlength=m["num_docs"])

    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        if len(queries) <= 2:  # cheaper than a thread hop
            return self.search_sync(queries, topk)
        return await asyncio.to_thread(self.search_sync, list(queries), topk)


def default_cache_dir() -> Path:
    env = os.environ.get("AGENT_ENVS_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "agent_envs"


def parse_retrieve_response(payload: Any, n_queries: int, url: str) -> list[list[Hit]]:
    """Read a `/retrieve` answer in any of the shapes forks produce.

    Accepts `{"result": [...]}` or a bare list; inner entries with or without a `document`
    wrapper; documents with `contents` and/or `title` + `text`.
    """
    result = payload.get("result") if isinstance(payload, Mapping) else payload
    if not isinstance(result, list):
        raise PermanentError(f"unexpected /retrieve answer from {url}: no 'result' list")
    if n_queries == 1 and result and all(isinstance(e, Mapping) for e in result):
        result = [result]  # a single-query server that answered a flat list
    if len(result) != n_queries:
        raise PermanentError(
            f"/retrieve at {url} answered {len(result)} result lists for {n_queries} queries"
        )
    out: list[list[Hit]] = []
    for row in result:
        hits = []
        for entry in row or []:
            if not isinstance(entry, Mapping):
                raise PermanentError(f"unexpected /retrieve entry from {url}: {str(entry)[:100]}")
            doc = entry.get("document", entry)
            score = entry.get("score", doc.get("score", 0.0))
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
        timeout_s: per-attempt timeout.
        max_retries / backoff_s: retries on 5xx, 429, connection errors and timeouts, sleeping
            `backoff_s * attempt` between tries (SkyRL's policy: 10 retries, 1 s steps).
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
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s)
        self.dialect = dialect
        self.pool = SessionPool(limit=pool_size)
        self.backend_id = f"http:{url}"

    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        return (await self.search_with_retries(queries, topk))[0]

    async def search_with_retries(self, queries: Sequence[str], topk: int = 3) -> tuple[list[list[Hit]], int]:
        queries = list(queries)
        if not queries:
            return [], 0
        if self.dialect == "query":
            parts = await asyncio.gather(
                *(self._post({"query": q, "topk": topk, "return_scores": True}, 1) for q in queries)
            )
            return [p[0][0] for p in parts], max(p[1] for p in parts)
        return await self._post({"queries": queries, "topk": topk, "return_scores": True}, len(queries))

    async def _post(self, body: dict, n: int) -> tuple[list[list[Hit]], int]:
        rid = request_id()

        async def attempt() -> list[list[Hit]]:
            session = await self.pool.get()
            async with session.post(
                self.url, json=body, timeout=timeout_of(self.timeout_s), headers={"X-Request-Id": rid}
            ) as resp:
                text = await resp.text()
                raise_for_status(resp.status, self.url, text)
                return parse_retrieve_response(json_or_error(text, self.url), n, self.url)

        try:
            return await with_retries(attempt, self.retry, describe=f"POST {self.url}")
        except (TransientError, PermanentError) as exc:
            raise SearchBackendError(
                f"{exc} (request {rid})",
                retries=self.retry.max_retries if isinstance(exc, TransientError) else 0,
            ) from exc

    async def aclose(self) -> None:
        await self.pool.aclose()


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
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s)
        self.market = market
        self.min_interval_s = 1.0 / max_rps if max_rps > 0 else 0.0
        self._next_slot = 0.0
        self.pool = SessionPool(limit=32)
        self.backend_id = f"web:{provider}:{market or ''}"

    def __repr__(self) -> str:  # never print the key
        return f"WebBackend(provider={self.provider.name!r}, endpoint={self.endpoint!r})"

    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        return (await self.search_with_retries(queries, topk))[0]

    async def search_with_retries(self, queries: Sequence[str], topk: int = 3) -> tuple[list[list[Hit]], int]:
        parts = await asyncio.gather(*(self._one(q, topk) for q in queries))
        return [p[0] for p in parts], max((p[1] for p in parts), default=0)

    async def _throttle(self) -> None:
        if not self.min_interval_s:
            return
        now = time.monotonic()
        slot = max(now, self._next_slot)
        self._next_slot = slot + self.min_interval_s
        if slot > now:
            await asyncio.sleep(slot - now)

    async def _one(self, query: str, topk: int) -> tuple[list[Hit], int]:
        p = self.provider
        headers = {p.key_header: self._key, "Accept": "application/json"}

        async def attempt() -> list[Hit]:
            await self._throttle()
            session = await self.pool.get()
            if p.method == "POST":
                body: dict[str, Any] = {"q": query, "num": topk}
                if self.market:
                    body["gl"] = self.market
                ctx = session.post(
                    self.endpoint, json=body, headers=headers, timeout=timeout_of(self.timeout_s)
                )
            else:
                params: dict[str, Any] = {"q": query, "count": topk}
                if self.market:
                    params["country"] = self.market
                ctx = session.get(
                    self.endpoint, params=params, headers=headers, timeout=timeout_of(self.timeout_s)
                )
            async with ctx as resp:
                text = await resp.text()
                raise_for_status(resp.status, self.endpoint, text)
                return self._parse(json_or_error(text, self.endpoint), topk)

        try:
            return await with_retries(attempt, self.retry, describe=f"{p.name} search")
        except (TransientError, PermanentError) as exc:
            raise SearchBackendError(
                str(exc), retries=self.retry.max_retries if isinstance(exc, TransientError) else 0
            ) from exc

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


# -- the tool --------------------------------------------------------------------------------------


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


class SearchTool(Tool):
    """`<search> query </search>`: top-k passages from a backend, formatted for the model.

    Args:
        backend: any `SearchBackend`.
        topk: passages per query.
        cache: optional `ToolCache` (structured hits are cached; errors never are).
        max_result_chars: characters kept per passage.
        timeout_s: wall-clock budget of one backend call (the failure text says so).
        concurrency: at most this many backend calls of this tool at once.
        style: result format (`doc`, `skyrl`, `page`; see `format_hits`).
    """

    name: ClassVar[str] = "search"
    argument: ClassVar[str] = "query"
    description: ClassVar[str] = "search a knowledge source; returns the top passages for a query"

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
        try:
            async with self.concurrency.get():
                hits_lists, retries = await asyncio.wait_for(
                    self.backend.search_with_retries([query], self.topk), self.timeout_s
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
