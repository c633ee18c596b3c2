"""The retrieval server: Search-R1's `/retrieve` JSON protocol over an in-process BM25 index.

Concurrent requests are batched: the server collects requests for a few milliseconds and answers
them with one backend call, so many rollout workers share one index without serialising on a
blocking handler. Both request dialects are accepted, `{"queries": [...], "topk", "return_scores"}`
and `{"query": "..."}`; the answer is always `{"result": [[...], ...]}`, one list per query.

    agent-envs serve-retriever --corpus corpus.jsonl --port 8000

    >>> import asyncio
    >>> from agent_envs.retrieval import BM25Backend, HttpBackend
    >>> async def main():
    ...     server = RetrieverServer(BM25Backend([{"id": "d1", "title": "Alpha", "text": "Ada founded Alpha."}]))
    ...     url = await server.start(port=0)
    ...     hits = await HttpBackend(url + "/retrieve").search(["who founded Alpha"], topk=1)
    ...     await server.stop()
    ...     return hits[0][0].id
    >>> asyncio.run(main())
    'd1'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from agent_envs.retrieval import BM25Backend, Hit, SearchBackend
from agent_envs.server.serving import AppServer, bind, serve_until_signal

log = logging.getLogger(__name__)

# aiohttp's default listen backlog is 128: a burst of rollout workers connecting at once then
# overflows the accept queue, and the kernel drops their SYNs, which clients resend only after
# 1 s, then 3 s (measured in docs/reliability.md).
DEFAULT_BACKLOG = 4096


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future = field(repr=False)


class RetrieverServer(AppServer):
    """An aiohttp app around a `SearchBackend`, batching concurrent requests.

    Args:
        backend: where hits come from (usually a `BM25Backend`).
        default_topk: used when a request has no `topk` (Search-R1's `retrieval_topk`).
        batch_window_ms: how long the first request of a batch waits for company.
        max_batch_queries: a batch is sent as soon as it holds this many queries.
        max_topk: requests asking for more are capped (protects the server).
    """

    backlog = DEFAULT_BACKLOG

    def __init__(
        self,
        backend: SearchBackend,
        default_topk: int = 3,
        batch_window_ms: float = 2.0,
        max_batch_queries: int = 256,
        max_topk: int = 100,
    ) -> None:
        self.backend = backend
        self.default_topk = default_topk
        self.batch_window_s = batch_window_ms / 1000.0
        self.max_batch_queries = max_batch_queries
        self.max_topk = max_topk
        self.stats = {"requests": 0, "queries": 0, "batches": 0, "max_batch_requests": 0, "errors": 0}
        self._queue: asyncio.Queue[_Pending] | None = None
        self._batcher: asyncio.Task | None = None

    # -- the app ----------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/retrieve", self._retrieve)
        app.router.add_get("/health", self._health)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self._queue = asyncio.Queue()
        self._batcher = asyncio.create_task(self._batch_loop())

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batcher
        await self.backend.aclose()

    async def _health(self, request: web.Request) -> web.Response:
        docs = len(self.backend) if hasattr(self.backend, "__len__") else None
        return web.json_response(
            {"status": "ok", "backend": self.backend.backend_id, "docs": docs, **self.stats}
        )

    async def _retrieve(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return self._bad(f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return self._bad("request body must be a JSON object with 'queries' (list) or 'query' (string)")
        if "queries" in body:
            queries = body["queries"]
            if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
                return self._bad("'queries' must be a list of strings")
        elif "query" in body:
            if not isinstance(body["query"], str):
                return self._bad("'query' must be a string")
            queries = [body["query"]]
        else:
            return self._bad("request needs 'queries' (list of strings) or 'query' (string)")
        topk = body.get("topk")
        if topk is None:
            topk = self.default_topk
        if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
            return self._bad(f"'topk' must be a positive integer, got {topk!r}")
        topk = min(topk, self.max_topk)
        return_scores = bool(body.get("return_scores", False))
        self.stats["requests"] += 1
        self.stats["queries"] += len(queries)
        if not queries:
            return web.json_response({"result": []})
        assert self._queue is not None, "server not started"
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(queries, topk, future))
        try:
            hits = await future
        except Exception as exc:  # the backend failed for the whole batch
            self.stats["errors"] += 1
            log.exception("retrieval failed (request %s)", request.headers.get("X-Request-Id", "-"))
            return web.json_response({"error": f"retrieval failed: {type(exc).__name__}: {exc}"}, status=500)
        return web.json_response({"result": [[_entry(h, return_scores) for h in row] for row in hits]})

    @staticmethod
    def _bad(message: str) -> web.Response:
        return web.json_response({"error": message}, status=400)

    async def _batch_loop(self) -> None:
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            batch = [first]
            n = len(first.queries)
            deadline = time.monotonic() + self.batch_window_s
            while n < self.max_batch_queries:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
                batch.append(item)
                n += len(item.queries)
            await self._run_batch(batch)

    async def _run_batch(self, batch: list[_Pending]) -> None:
        self.stats["batches"] += 1
        self.stats["max_batch_requests"] = max(self.stats["max_batch_requests"], len(batch))
        # One backend call at the largest topk; every request gets its prefix, which is exactly
        # its own top-k because the ranking is deterministic.
        topk = max(p.topk for p in batch)
        queries = [q for p in batch for q in p.queries]
        try:
            rows = await self.backend.search(queries, topk)
        except Exception as exc:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        i = 0
        for p in batch:
            part = [row[: p.topk] for row in rows[i : i + len(p.queries)]]
            i += len(p.queries)
            if not p.future.done():  # the client may have gone away
                p.future.set_result(part)

    # -- running ----------------------------------------------------------------------------------

def _entry(hit: Hit, return_scores: bool) -> dict[str, Any]:
    doc = {"id": hit.id, "contents": hit.contents, "title": hit.title, "text": hit.text}
    if hit.url:
        doc["url"] = hit.url
    return {"document": doc, "score": hit.score} if return_scores else doc


# -- command line ----------------------------------------------------------------------------------


def raise_open_file_limit() -> int:
    """Lift the soft limit on open files to the hard one; returns the limit now in force.

    Every client connection is a file descriptor. At the common soft limit of 1024, a burst of
    1,500 connections left the server unable to answer any of them (all 1,500 timed out after
    60 s; docs/reliability.md); the hard limit is usually far higher.
    """
    try:
        import resource
    except ImportError:  # not on POSIX: nothing to lift
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def serve(args: argparse.Namespace) -> int:
    """`agent-envs serve-retriever`: build or load the index, then serve until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    open_files = raise_open_file_limit()
    sock = bind(args.host, args.port, args.backlog)  # a port in use is said before the index is built
    start = time.perf_counter()
    try:
        backend = BM25Backend.from_jsonl(args.corpus, cache_dir=args.cache_dir)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"serve-retriever: {exc}") from None
    ready = time.perf_counter() - start
    server = RetrieverServer(backend, default_topk=args.topk, batch_window_ms=args.batch_window_ms)
    server.backlog = args.backlog
    serve_until_signal(server, args.host, sock, lambda url: (
        f"serve-retriever: {len(backend)} passages from {args.corpus} ready in {ready:.1f} s; listening on "
        f"{url}/retrieve (backlog {args.backlog}, up to {open_files} open files)"))
    return 0


def add_cli(subparsers: Any) -> None:
    """Register `serve-retriever` on the package CLI."""
    from agent_envs.server.serving import port_number

    p = subparsers.add_parser(
        "serve-retriever",
        help="serve a BM25 index over a corpus with the Search-R1 /retrieve protocol",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--corpus", required=True, help="corpus JSONL (id, title, text or contents)")
    p.add_argument("--port", type=port_number, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--topk", type=int, default=3, help="hits per query when a request gives no topk")
    p.add_argument(
        "--cache-dir", default=None, help="where the index is cached (default ~/.cache/agent_envs)"
    )
    p.add_argument("--batch-window-ms", type=float, default=2.0, help="how long requests wait to be batched")
    p.add_argument(
        "--backlog",
        type=int,
        default=DEFAULT_BACKLOG,
        help="connections the kernel queues before the server accepts them (capped by net.core.somaxconn)",
    )
    p.set_defaults(func=serve)
