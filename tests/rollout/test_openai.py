"""OpenAIEngine against vLLM's real OpenAI-compatible server, started on 127.0.0.1 in the test,
and through a real aiohttp proxy that fails the first requests (retries)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from algorithms.rollout import OpenAIEngine, SamplingParams
from tests.servers import free_port, running_server, vllm_command

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm_server(tiny_model_path, tmp_path_factory):
    port = free_port()
    cmd = vllm_command(tiny_model_path, "tiny", port, "--max-logprobs", "20",
                       "--logprobs-mode", "processed_logprobs", "--seed", "0")
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # engine core in the server process: a faster start
    with running_server(cmd, port, tmp_path_factory.mktemp("vllm-server") / "server.log", env) as url:
        yield f"{url}/v1"


def _prompts(tok, n=4):
    return [
        tok(
            f"<|im_start|>user\nWhat is {i + 12} * 7?<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )["input_ids"]
        for i in range(n)
    ]


async def test_openai_engine_matches_hf_greedy_with_token_ids(vllm_server, hf_engine):
    engine = OpenAIEngine(vllm_server, "tiny", hf_engine.tokenizer, max_concurrency=2)
    prompts = _prompts(hf_engine.tokenizer)
    params = SamplingParams(temperature=0, max_tokens=40, logprobs=3, stop=["</python>"])
    try:
        segs = await engine.agenerate(prompts, params)
    finally:
        await engine.aclose()
    ref = hf_engine.generate(prompts, params)
    assert engine.prompt_mode == "auto"  # the id prompts were accepted
    assert [s.token_ids for s in segs] == [s.token_ids for s in ref]
    for a, b in zip(segs, ref, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
        assert [len(t) for t in a.top_logprobs] == [3] * len(a)
        assert a.finish_reason == b.finish_reason and a.text == b.text and a.stop_str == b.stop_str


def test_openai_engine_sync_generate_n_and_seed(vllm_server, hf_engine):
    engine = OpenAIEngine(vllm_server, "tiny", hf_engine.tokenizer)
    prompts = _prompts(hf_engine.tokenizer, 2)
    params = SamplingParams(max_tokens=8, n=3, seed=4)
    a, b = engine.generate(prompts, params), engine.generate(prompts, params)
    assert len(a) == 6 and [s.token_ids for s in a] == [s.token_ids for s in b]
    assert all(len(s.token_ids) == len(s.logprobs) <= 8 for s in a)
    with pytest.raises(NotImplementedError, match="VLLMEngine"):
        engine.sync_weights(None)


async def test_openai_engine_text_mode_reads_the_same_text(vllm_server, hf_engine):
    """Text prompts (servers without id prompts): same text; ids are re-encoded (documented caveat)."""
    engine = OpenAIEngine(vllm_server, "tiny", hf_engine.tokenizer, prompt_mode="text")
    prompts = _prompts(hf_engine.tokenizer, 3)
    params = SamplingParams(temperature=0, max_tokens=40, stop=["</python>"])
    try:
        segs = await engine.agenerate(prompts, params)
    finally:
        await engine.aclose()
    ref = hf_engine.generate(prompts, params)
    assert [s.text for s in segs] == [s.text for s in ref]
    assert [s.finish_reason for s in segs] == [s.finish_reason for s in ref]
    for seg in segs:
        assert seg.token_ids == hf_engine.tokenizer(seg.text, add_special_tokens=False)["input_ids"]
        assert len(seg.logprobs) == len(seg.token_ids)


async def test_openai_engine_retries_through_a_flaky_proxy(vllm_server, hf_engine):
    failures = {"left": 2}

    async def proxy(request: web.Request) -> web.Response:
        if failures["left"] > 0:
            failures["left"] -= 1
            return web.Response(status=503, text="warming up")
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{vllm_server}/completions", json=await request.json()) as r,
        ):
            return web.Response(status=r.status, body=await r.read(), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/completions", proxy)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    engine = OpenAIEngine(f"http://127.0.0.1:{port}/v1", "tiny", hf_engine.tokenizer, max_retries=3)
    try:
        segs = await engine.agenerate(
            _prompts(hf_engine.tokenizer, 1), SamplingParams(temperature=0, max_tokens=5)
        )
        assert len(segs[0]) == 5 and engine.retries == 2
        with pytest.raises(RuntimeError, match="HTTP 404"):
            bad = OpenAIEngine(
                f"http://127.0.0.1:{port}/nowhere", "tiny", hf_engine.tokenizer, prompt_mode="ids"
            )
            try:
                await bad.agenerate([[1, 2]], SamplingParams(max_tokens=2))
            finally:
                await bad.aclose()
    finally:
        await engine.aclose()
        await runner.cleanup()
