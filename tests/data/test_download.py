"""`agent-envs data`: download, check and write benchmark files, against a stand-in server.

The real sources are on the public internet, which tests cannot reach. The stand-in is a real
HTTP server on 127.0.0.1 that serves a file in the upstream layout, rebuilt from the benchmark
copy the tests use; its size and SHA-256 replace the pinned ones for the test (the pinned values
were checked against the upstream files themselves, docs/benchmarks-data.md).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import time

import gymnasium as gym
import pytest
from aiohttp import web

import agent_envs  # noqa: F401
from agent_envs.cli import main
from agent_envs.data import download as dl
from agent_envs.data.loaders import load_benchmark


def upstream_aime24(shared_data) -> bytes:
    """AIME 2024 as the ARPO repository publishes it: original ids, `problem`, answers like "025"."""
    rows = [json.loads(line) for line in (shared_data / "aime24" / "test.jsonl").read_text().splitlines()]
    return "".join(json.dumps({"id": r["orig_id"], "problem": r["problem"], "solution": r["solution"],
                               "answer": r["answer"], "url": r["url"]}) + "\n" for r in rows).encode()


@pytest.fixture
def stand_in(shared_data, monkeypatch, aiohttp_server_loop):
    body = upstream_aime24(shared_data)
    pinned = dataclasses.replace(dl.SOURCES["aime24"], sha256=hashlib.sha256(body).hexdigest(), size=len(body))
    monkeypatch.setitem(dl.SOURCES, "aime24", pinned)
    files = {"/" + pinned.path: body}
    url = aiohttp_server_loop(files)
    return url, pinned


@pytest.fixture
def aiohttp_server_loop():
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    runners = []

    def serve(files: dict[str, bytes]) -> str:
        async def handle(request):
            data = files.get(request.path)
            return web.Response(body=data) if data is not None else web.Response(status=404, text="not here")

        async def start():
            app = web.Application()
            app.router.add_get("/{tail:.*}", handle)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

        return asyncio.run_coroutine_threadsafe(start(), loop).result()

    yield serve
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
    loop.call_soon_threadsafe(loop.stop)


def test_download_writes_what_the_env_reads(stand_in, tmp_path, monkeypatch, shared_data, capsys):
    url, _ = stand_in
    assert main(["data", "download", "aime24", "--dir", str(tmp_path), "--base-url", url]) == 0
    written = tmp_path / "aime24" / "test.jsonl"
    first = json.loads(written.read_text().splitlines()[0])
    assert list(first)[:3] == ["id", "question", "golden_answers"] and first["id"] == "aime2024-60"
    monkeypatch.setenv("AGENT_ENVS_DATA_DIR", str(tmp_path))
    got = load_benchmark("aime24")
    monkeypatch.setenv("AGENT_ENVS_DATA_DIR", str(shared_data))
    ours = load_benchmark("aime24")
    assert [(t.id, t.question, list(t.answers)) for t in got] == [(t.id, t.question, list(t.answers)) for t in ours]
    monkeypatch.setenv("AGENT_ENVS_DATA_DIR", str(tmp_path))
    env = gym.make("AgentMath-AIME24-v0")
    env.reset(seed=0)
    assert env.unwrapped.task.answers[0].isdigit()
    assert main(["data", "list", "--dir", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert "aime24             yes" in listed and "hotpotqa           no" in listed


def test_a_changed_upstream_file_is_refused_and_nothing_is_written(stand_in, tmp_path, monkeypatch):
    url, pinned = stand_in
    monkeypatch.setitem(dl.SOURCES, "aime24", dataclasses.replace(pinned, sha256="0" * 64))
    with pytest.raises(dl.DownloadError, match="upstream file changed: nothing was written"):
        dl.download(["aime24"], tmp_path, url, log=lambda _: None)
    assert not any(tmp_path.rglob("*"))


def test_gated_benchmarks_are_written_gzipped(aiohttp_server_loop, monkeypatch, tmp_path):
    rows = [{"task_id": f"t{i}", "Question": f"What is {i}?", "answer": str(i)} for i in range(3)]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    pinned = dataclasses.replace(dl.SOURCES["gaia"], sha256=hashlib.sha256(body).hexdigest(), size=len(body))
    monkeypatch.setitem(dl.SOURCES, "gaia", pinned)
    url = aiohttp_server_loop({"/" + pinned.path: body})
    [path] = dl.download(["gaia"], tmp_path, url, log=lambda _: None)
    assert path.name.endswith(".jsonl.gz")
    with gzip.open(path, "rt") as fh:
        assert [json.loads(line)["id"] for line in fh] == ["t0", "t1", "t2"]


def test_errors_name_the_url_and_the_command(aiohttp_server_loop, tmp_path, monkeypatch):
    url = aiohttp_server_loop({})
    with pytest.raises(dl.DownloadError, match=r"aime24/test.jsonl: HTTP 404"):
        dl.download(["aime24"], tmp_path, url, log=lambda _: None)
    with pytest.raises(KeyError, match="agent-envs data list"):
        dl.download(["aime2024"], tmp_path, url)
    monkeypatch.setenv("AGENT_ENVS_DATA_DIR", str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="agent-envs data download aime24"):
        gym.make("AgentMath-AIME24-v0")
    assert time.perf_counter() - start < 1.0  # a missing benchmark fails at once, naming the command
