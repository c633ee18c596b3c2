"""`OpenAIChatEngine` against a stand-in chat server on 127.0.0.1 that checks every request.

The stand-in replaces a hosted model (none can be reached here). It answers from each task's
gold trace, the way a capable model would, and fails the request when the messages are not what
an OpenAI chat endpoint expects: roles in order, our earlier answers sent back, tool results as
`tool` messages tied to their call, no token ids or prompt text anywhere.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading

import gymnasium as gym
import pytest
from aiohttp import web

import agent_envs  # noqa: F401
from algorithms.rollout import SamplingParams, run_episodes
from algorithms.rollout.openai_chat import OpenAIChatEngine

GOLD = {}  # question -> gold trace (arpo tags)


class StandIn:
    def __init__(self, native_tools: bool):
        self.native_tools, self.requests, self.errors = native_tools, [], []
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result()

    async def _start(self):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"

    def close(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)

    def check(self, body) -> str | None:
        if body.get("model") != "hosted" or "prompt" in body:
            return "bad model or a text prompt"
        if self.native_tools != bool(body.get("tools")):
            return f"tools sent: {bool(body.get('tools'))}"
        msgs = body["messages"]
        if [m["role"] for m in msgs[:2]] != ["system", "user"]:
            return f"roles start {[m['role'] for m in msgs[:2]]}"
        for m in msgs:
            if any(ch in json.dumps(m) for ch in ("\\u0001", "\\u0002", "\\u0003")):
                return "record separators leaked into a message"
        for prev, m in zip(msgs, msgs[1:], strict=False):
            if m["role"] == "tool" and prev.get("tool_calls", [{}])[0].get("id") != m["tool_call_id"]:
                return "a tool message does not answer the call before it"
            if m["role"] == prev["role"] == "assistant":
                return "two assistant turns in a row"
        return None

    async def chat(self, request):
        body = await request.json()
        self.requests.append(body)
        error = self.check(body)
        if error:
            self.errors.append(error)
            return web.json_response({"error": {"message": error}}, status=400)
        msgs = body["messages"]
        gold = GOLD[msgs[1]["content"]]
        turn = sum(m["role"] == "assistant" for m in msgs)
        step = gold[min(turn, len(gold) - 1)]
        code = re.search(r"<python>(.*?)</python>", step, re.S)
        if self.native_tools and code:
            message = {"role": "assistant", "content": step[: step.index("<python>")],
                       "tool_calls": [{"id": f"call_{turn}", "type": "function",
                                       "function": {"name": "python", "arguments": json.dumps({"code": code.group(1)})}}]}
        else:  # a model that runs past the stop string: the engine must cut it
            message = {"role": "assistant", "content": step + (" <result>\nmade up\n</result>" if code else "")}
        return web.json_response({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


@pytest.mark.parametrize("protocol", ["arpo", "json"])
def test_a_hosted_chat_model_plays_through_the_runner(protocol):
    server = StandIn(native_tools=protocol == "json")
    engine = OpenAIChatEngine(server.url, "hosted", api_key="k")
    try:
        def make_env():
            env = gym.make("AgentMath-v0", protocol=protocol, tokenizer=engine.tokenizer).unwrapped
            for i in range(4):
                env.reset(seed=0, options={"index": i})
                GOLD[env.task.question] = env.task.gold_trace
            return env

        trajs = asyncio.run(run_episodes(engine, make_env, SamplingParams(temperature=0.0, max_tokens=2048),
                                         tasks=[0, 1, 2, 3], group_size=2, max_response_tokens=4096, seed=0))
        assert server.errors == []
        assert [t.reward for t in trajs] == [1.0] * 8, [t.components for t in trajs]
        assert all(t.tool_calls == 1 for t in trajs)
        assert "made up" not in engine.tokenizer.decode(trajs[0].response_ids)
        followups = [r for r in server.requests if len(r["messages"]) > 2]
        assert followups and all(r["messages"][2]["role"] == "assistant" for r in followups)
        kind = "tool" if protocol == "json" else "user"
        assert all(r["messages"][3]["role"] == kind for r in followups)
    finally:
        server.close()


def test_the_byte_tokenizer_round_trips_any_text():
    tok = OpenAIChatEngine("http://127.0.0.1:9/v1", "m").tokenizer
    text = "héllo \x00 <python>print('∑')</python> 😀\n"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_an_unreachable_server_names_the_url():
    engine = OpenAIChatEngine("http://127.0.0.1:9/v1", "m", max_retries=0, timeout_s=2)
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False,
                                                add_generation_prompt=True)
    ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    with pytest.raises(RuntimeError, match=r"127\.0\.0\.1:9/v1/chat/completions unreachable"):
        engine.generate([ids], SamplingParams(max_tokens=4))


def test_evaluate_runs_a_hosted_chat_model(tmp_path):
    import gymnasium as gym

    from agent_envs.cli import main

    env = gym.make("AgentMath-v0").unwrapped
    total = len(env.tasks)
    for i in range(total - 3, total):  # evaluate's default: the held-out tail
        env.reset(seed=0, options={"index": i})
        GOLD[env.task.question] = env.task.gold_trace
    server = StandIn(native_tools=False)
    try:
        code = main(["evaluate", "--env", "AgentMath-v0", "--engine", "openai-chat", "--base-url", server.url,
                     "--model", "hosted", "--limit", "3", "--out", str(tmp_path / "eval")])
        assert code == 0 and server.errors == []
        summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
        assert summary["metrics"]["pass@1"] == 1.0, summary["metrics"]
    finally:
        server.close()
