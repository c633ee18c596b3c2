"""The retrieval server and its HTTP client, over real sockets on 127.0.0.1.

The server runs in-process (aiohttp on a free port) for most tests and once as the real
`agent-envs serve-retriever` subprocess. Failure paths (5xx, slow answers, refused connections)
use small real aiohttp servers that misbehave on purpose.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from search_support import CORPUS, hotpot_questions, recall_at_k, wiki_backend

from agent_envs.net.http import PermanentError
from agent_envs.retrieval import BM25Backend, HttpBackend, parse_retrieve_response
from agent_envs.server.retriever import RetrieverServer
from agent_envs.tools import SearchTool

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    {"id": "d1", "title": "Alpha Corp", "text": "Alpha Corp was founded by Ada Lovelace in London."},
    {"id": "d2", "title": "Beta River", "text": "The Beta River flows through the valley of Gamma."},
    {"id": "d3", "title": "Gamma Valley", "text": "Gamma Valley is home to the Beta River and Alpha fans."},
]


@pytest.fixture(scope="session")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bm25-index")


@pytest.fixture
async def small_server() -> AsyncIterator[RetrieverServer]:
    server = RetrieverServer(BM25Backend(DOCS), default_topk=2, batch_window_ms=20)
    await server.start(port=0)
    yield server
    await server.stop()


async def _post(url: str, body: object) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(url, data=json.dumps(body)) as r:
        return r.status, await r.json()


async def test_both_dialects_and_both_result_shapes(small_server: RetrieverServer) -> None:
    url = f"{small_server.url}/retrieve"
    status, batch = await _post(
        url, {"queries": ["Alpha founder", "Beta River"], "topk": 1, "return_scores": True}
    )
    assert status == 200 and len(batch["result"]) == 2
    first = batch["result"][0][0]
    assert first["document"]["id"] == "d1" and first["score"] > 0
    assert first["document"]["contents"] == '"Alpha Corp"\nAlpha Corp was founded by Ada Lovelace in London.'
    status, single = await _post(url, {"query": "Beta River"})
    assert status == 200 and len(single["result"]) == 1 and len(single["result"][0]) == 2  # default topk 2
    plain = single["result"][0][0]
    assert "document" not in plain and plain["id"] == "d2" and plain["contents"].startswith('"Beta River"\n')
    status, empty = await _post(url, {"queries": []})
    assert status == 200 and empty == {"result": []}
    status, none = await _post(url, {"query": "xylophone"})
    assert status == 200 and none == {"result": [[]]}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"q": "x"}, "needs 'queries'"),
        ({"queries": "x"}, "'queries' must be a list of strings"),
        ({"query": 3}, "'query' must be a string"),
        ({"query": "x", "topk": 0}, "'topk' must be a positive integer"),
        (["x"], "must be a JSON object"),
    ],
)
async def test_bad_requests_get_400_with_a_reason(
    small_server: RetrieverServer, body: object, message: str
) -> None:
    status, answer = await _post(f"{small_server.url}/retrieve", body)
    assert status == 400 and message in answer["error"]


async def test_concurrent_requests_are_batched(small_server: RetrieverServer) -> None:
    backend = HttpBackend(f"{small_server.url}/retrieve")
    queries = ["Alpha", "Beta", "Gamma", "River", "London"] * 4
    rows = await asyncio.gather(*(backend.search([q], topk=1 + i % 3) for i, q in enumerate(queries)))
    await backend.aclose()
    direct = BM25Backend(DOCS).search_sync(queries, topk=3)
    for i, (row, want) in enumerate(zip(rows, direct, strict=True)):
        assert [h.id for h in row[0]] == [h.id for h in want[: 1 + i % 3]]  # each request keeps its own topk
    async with aiohttp.ClientSession() as s, s.get(f"{small_server.url}/health") as r:
        health = await r.json()
    assert health["status"] == "ok" and health["docs"] == 3 and health["requests"] == 20
    assert health["batches"] < 20 and health["max_batch_requests"] > 1, health


async def test_http_backend_single_query_dialect(small_server: RetrieverServer) -> None:
    backend = HttpBackend(f"{small_server.url}/retrieve", dialect="query")
    rows = await backend.search(["Alpha", "Beta River"], topk=1)
    await backend.aclose()
    assert [[h.id for h in r] for r in rows] == [["d1"], ["d2"]]
    assert rows[0][0].title == "Alpha Corp" and rows[0][0].text.startswith("Alpha Corp was founded")


def test_client_reads_the_shapes_forks_produce() -> None:
    bare = [[{"id": "a", "contents": '"T"\nbody'}]]
    assert parse_retrieve_response(bare, 1, "u")[0][0].title == "T"
    flat = {"result": [{"document": {"id": "a", "contents": "T2\nbody"}, "score": 2.5}]}
    hit = parse_retrieve_response(flat, 1, "u")[0][0]
    assert (hit.id, hit.title, hit.text, hit.score) == ("a", "T2", "body", 2.5)
    with pytest.raises(Exception, match="answered 1 result lists for 2 queries"):
        parse_retrieve_response({"result": [[]]}, 2, "u")
    # a server's garbage is a PermanentError naming the piece, never a TypeError inside the client
    for garbage, piece in [([[3]], "entry"), ([[{"document": 3}]], "entry"), ([[{"id": "a", "score": "high"}]], "entry"),
                           ([7], "result row"), ({"hits": []}, "no 'result' list")]:  # fmt: skip
        with pytest.raises(PermanentError, match=f"unexpected /retrieve {piece}|{piece}"):
            parse_retrieve_response(garbage, 1, "u")


class _Misbehaving:
    """A real HTTP server that fails the first `failures` requests with 503, or answers slowly."""

    def __init__(self, failures: int = 0, delay_s: float = 0.0) -> None:
        self.failures, self.delay_s, self.seen = failures, delay_s, 0

    async def handle(self, request: web.Request) -> web.Response:
        self.seen += 1
        await asyncio.sleep(self.delay_s)
        if self.seen <= self.failures:
            return web.Response(status=503, text="warming up")
        body = await request.json()
        return web.json_response(
            {"result": [[{"id": "x", "contents": '"X"\nfound ' + q}] for q in body["queries"]]}
        )

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_post("/retrieve", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/retrieve"  # type: ignore[union-attr]


async def test_retries_on_5xx_are_counted() -> None:
    upstream = _Misbehaving(failures=2)
    runner, url = await upstream.start()
    tools = [
        SearchTool(HttpBackend(url, backoff_s=0.01)),
        SearchTool(HttpBackend(url, max_retries=2, backoff_s=0.01)),
    ]
    try:
        res = await tools[0]("q1")
        assert res.ok and res.retries == 2 and res.text == "Doc 1(Title: X) found q1"
        assert upstream.seen == 3
        upstream.failures, upstream.seen = 10, 0
        failed = await tools[1]("q2")
        assert not failed.ok and failed.retries == 2 and upstream.seen == 3
        assert failed.text.startswith("Search failed: HTTP 503 from") and "warming up" in failed.text
    finally:
        for tool in tools:
            await tool.aclose()
        await runner.cleanup()


async def test_slow_server_and_refused_connection_become_search_errors() -> None:
    upstream = _Misbehaving(delay_s=1.0)
    runner, url = await upstream.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens here
    tools = [
        SearchTool(HttpBackend(url, timeout_s=0.1, max_retries=1, backoff_s=0.01)),
        SearchTool(HttpBackend(url, timeout_s=5, max_retries=0), timeout_s=0.2),
        SearchTool(HttpBackend(f"http://127.0.0.1:{port}/retrieve", max_retries=1, backoff_s=0.01)),
    ]
    try:
        res = await tools[0]("q")
        assert not res.ok and res.error == "timeout" and "timeout after 0.1 s (1 retry," in res.text
        assert upstream.seen == 2
        res = await tools[1]("q")
        # the tool's 0.2 s budget cuts the 5 s attempt, and the text still says which server it was
        assert not res.ok and res.error == "timeout" and res.latency_s < 0.35
        # "after" is what was left of the 0.2 s once the call was queued: 0.2 s on an idle machine
        assert re.match(rf"Search failed: POST {re.escape(url)}: timeout after 0\.(2|1\d*) s \(request ", res.text), res.text
        refused = await tools[2]("q")
        assert not refused.ok and refused.retries == 1 and refused.error == "refused"
        assert f"connection refused by 127.0.0.1:{port}" in refused.text, refused.text
    finally:
        for tool in tools:
            await tool.aclose()
        await runner.cleanup()


async def test_a_killed_server_is_reported_as_refused_within_seconds(small_server: RetrieverServer) -> None:
    # default retry policy and tool timeout (10 retries, 30 s), as a new user runs them
    tool = SearchTool(HttpBackend(f"{small_server.url}/retrieve"))
    try:
        assert (await tool("Alpha founder")).ok
        await small_server.stop()  # the server dies mid-episode; the port now refuses
        start = time.monotonic()
        res = await tool("Beta River")
        elapsed = time.monotonic() - start
    finally:
        await tool.aclose()
    print(f"refused connection reported after {elapsed:.2f} s: {res.text}")
    assert not res.ok and res.error == "refused" and res.retries == 3
    port = small_server.url.rsplit(":", 1)[1]
    assert f"connection refused by 127.0.0.1:{port}" in res.text and "timeout" not in res.text
    assert elapsed < 3.0


_SEARCH_AND_EXIT = """
import sys
import gymnasium as gym, agent_envs
tasks = [agent_envs.Task(id="q0", question="Who founded Alpha Corp?", answers=["Ada Lovelace"])]
env = gym.make("AgentQA-v0", tasks=tasks, retriever_url=sys.argv[1])
env.reset(seed=0)
print(env.step("<think>look it up</think><search>Alpha founder</search>")[0].split()[:4])
if sys.argv[2] == "close":
    env.close()
    assert not env.unwrapped.tools["search"].backend.pool._sessions, "env.close() left a session open"
"""


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["close", "exit"])
async def test_a_process_that_searched_ends_without_unclosed_sessions(
    small_server: RetrieverServer, ending: str
) -> None:
    # before the loop's exit hook, this process ended with "Unclosed client session" on stderr
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _SEARCH_AND_EXIT,
        f"{small_server.url}/retrieve",
        ending,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "['<result>', 'Doc', '1(Title:', 'Alpha']", (out.decode(), err.decode())
    assert "Unclosed" not in err.decode(), err.decode()



async def test_recall_at_5_through_the_server_matches_in_process(shared_data: Path, index_dir: Path) -> None:
    backend = wiki_backend(shared_data, index_dir)
    questions = hotpot_questions(shared_data)
    server = RetrieverServer(backend, batch_window_ms=5)
    base = await server.start(port=0)
    client = HttpBackend(f"{base}/retrieve")
    try:
        # 25 concurrent requests of 20 questions each: the server batches them.
        chunks = [questions[i : i + 20] for i in range(0, len(questions), 20)]
        parts = await asyncio.gather(*(client.search([q["question"] for q in c], topk=5) for c in chunks))
        results = [row for part in parts for row in part]
    finally:
        await client.aclose()
        await server.stop()
    recall, complete = recall_at_k(questions, results)
    print(
        f"\nrecall@5 through /retrieve: {recall:.3f} (all supporting found: {complete:.3f}); "
        f"{server.stats['requests']} requests in {server.stats['batches']} batches"
    )
    assert recall >= 0.70
    direct = backend.search_sync([q["question"] for q in questions[:50]], topk=5)
    assert [[h.id for h in r] for r in results[:50]] == [[h.id for h in r] for r in direct]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_subprocess_serves_the_corpus(shared_data: Path, index_dir: Path) -> None:
    wiki_backend(shared_data, index_dir)  # index cached in index_dir: the subprocess only loads it
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "agent_envs.cli",
        "serve-retriever",
        "--corpus",
        str(shared_data / CORPUS),
        "--port",
        str(port),
        "--topk",
        "2",
        "--cache-dir",
        str(index_dir),
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (
                f"serve-retriever exited early:\n{proc.stdout.read() if proc.stdout else ''}"
            )
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "serve-retriever did not start listening within 60 s"
                time.sleep(0.1)
        tool = SearchTool(HttpBackend(f"{base}/retrieve"), topk=2)
        res = tool.run("Shirley Temple Chief of Protocol")
        assert res.ok and "hotpotqa-000002" in res.metadata["doc_ids"], res.text
        status, single = asyncio.run(_post(f"{base}/retrieve", {"query": "Shirley Temple"}))
        assert status == 200 and len(single["result"][0]) == 2  # the --topk default
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert "12816 passages" in out and f"listening on http://127.0.0.1:{port}/retrieve" in out


@pytest.mark.slow
def test_cli_reports_a_missing_corpus(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "agent_envs.cli",
        "serve-retriever",
        "--corpus",
        str(tmp_path / "nope.jsonl"),
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "nope.jsonl not found" in done.stderr


async def test_a_failing_backend_gives_500_and_the_client_reports_it() -> None:
    class Broken(BM25Backend):
        async def search(self, queries, topk=3):  # type: ignore[no-untyped-def]
            raise RuntimeError("index file vanished")

    server = RetrieverServer(Broken(DOCS))
    base = await server.start(port=0)
    tool = SearchTool(HttpBackend(f"{base}/retrieve", max_retries=1, backoff_s=0.01))
    try:
        status, answer = await _post(f"{base}/retrieve", {"query": "Alpha"})
        assert status == 500 and "RuntimeError: index file vanished" in answer["error"]
        res = await tool("Alpha")
        assert (
            not res.ok and res.retries == 1 and "HTTP 500" in res.text and "index file vanished" in res.text
        )
        assert server.stats["errors"] == 3
    finally:
        await tool.aclose()
        await server.stop()
