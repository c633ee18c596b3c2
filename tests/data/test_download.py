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
import re
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
    assert re.search(r"^aime24 +yes ", listed, re.M) and re.search(r"^hotpotqa +no ", listed, re.M), listed


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


def test_one_download_makes_the_hotpotqa_env_run(aiohttp_server_loop, tmp_path, monkeypatch, capfd):
    """`data download hotpotqa` fetches ARPO's questions and IRCoT's questions with their passages;
    the env then searches those passages (hand-made files in the upstream layouts)."""
    arpo = json.dumps({"question": "Who founded Quellport?", "answer": ["Bran"]}) + "\n"
    ircot = json.dumps({"question_id": "5a1", "question_text": "Who founded Quellport?",
                        "answers_objects": [{"number": "", "date": {"day": "", "month": "", "year": ""},
                                             "spans": ["Bran"]}],
                        "contexts": [{"id": "0", "title": "Quellport", "is_supporting": True,
                                      "paragraph_text": "Quellport was founded by Bran."},
                                     {"id": "1", "title": "Zephyr", "is_supporting": False,
                                      "paragraph_text": "Zephyr is a wind."}]}) + "\n"
    files = {}
    for table, key, body in ((dl.SOURCES, "hotpotqa", arpo.encode()), (dl.PASSAGE_SOURCES, "hotpotqa", ircot.encode())):
        pinned = dataclasses.replace(table[key], sha256=hashlib.sha256(body).hexdigest(), size=len(body))
        monkeypatch.setitem(table, key, pinned)
        files["/" + pinned.path] = body
    url = aiohttp_server_loop(files)
    monkeypatch.setenv("AGENT_ENVS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AGENT_ENVS_CACHE", str(tmp_path / "cache"))
    assert main(["data", "download", "hotpotqa", "--base-url", url]) == 0
    written = sorted(p.relative_to(tmp_path / "data").as_posix() for p in (tmp_path / "data").rglob("*.jsonl"))
    assert written == ["hotpotqa/arpo_eval_200.jsonl", "hotpotqa/dev_500_ircot_with_contexts.jsonl"]
    [row] = [json.loads(line) for line in (tmp_path / "data/hotpotqa/dev_500_ircot_with_contexts.jsonl").open()]
    assert (row["id"], row["question"], row["golden_answers"]) == ("5a1", "Who founded Quellport?", ["Bran"])
    capfd.readouterr()
    env = gym.make("AgentQA-HotpotQA-v0")
    assert "2 passages" in capfd.readouterr().err
    env.reset(seed=0)
    obs = env.step("<think>x</think><search>Quellport founded</search>")[0]
    assert "Quellport was founded by Bran." in obs
    assert env.step("<think>x</think><answer>\\boxed{Bran}</answer>")[1] == 1.0


def test_the_passage_files_convert_to_the_copies_the_tests_use(shared_data):
    """IRCoT's HotpotQA and KAG's MuSiQue files, rebuilt in their upstream layouts from the shared
    copies, convert back to the same ids, questions and golden answers."""
    linked = ("id", "question", "golden_answers", "linked_id", "supporting_doc_ids", "context_doc_ids")
    for name, file in (("hotpotqa", "dev_500_ircot_with_contexts.jsonl"), ("musique", "dev_100_kag_with_paragraphs.jsonl")):
        ours = [json.loads(line) for line in (shared_data / name / file).read_text().splitlines()]
        kag = name == "musique"  # KAG's own fields are id and question; IRCoT's question_id and question_text
        upstream = [{k: v for k, v in r.items() if k not in linked} | ({"id": r["id"], "question": r["question"]} if kag else {})
                    for r in ours]
        body = ("".join(json.dumps(r) + "\n" for r in upstream) if name == "hotpotqa" else json.dumps(upstream)).encode()
        rows = dl.convert(name, body, dl.PASSAGE_SOURCES[name])
        assert [(r["id"], r["question"], r["golden_answers"]) for r in rows] == \
               [(r["id"], r["question"], r["golden_answers"]) for r in ours], name
