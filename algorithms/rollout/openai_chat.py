"""`OpenAIChatEngine`: a chat-only OpenAI-compatible endpoint (a hosted model) as a rollout engine.

Hosted models take chat messages, not token ids, so they cannot be trained here; they are
baselines. This engine lets them run through the same runner, envs, graders and reports as a
checkpoint: its tokenizer is a byte-level one whose chat template writes each message as a
record (`\\x01 role \\x02 content \\x03`), so the prompt an env renders can be read back into
messages exactly. The engine remembers what it answered to each request; a later request that
extends one of them is turned back into chat turns: its own earlier answers as assistant
messages, the env's text in between as the user turn (our tag protocol) or as `tool` messages
answering native tool calls (the JSON protocol, whose tools are sent as the request's `tools`).

    agent-envs evaluate --env AgentMath-v0 --engine openai-chat --base-url https://host/v1 \\
        --model some-model --n 1     # the key from $OPENAI_API_KEY

Stop strings are applied here, not sent (OpenAI's API neither returns which one matched nor
keeps it in the text): the reply is cut after the first one. Token budgets count this engine's
tokens, one per UTF-8 byte (`max_response_tokens` is bytes). Log-probs are not known (0.0).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
from collections.abc import Sequence
from typing import Any

import aiohttp

from algorithms.rollout.engine import SamplingParams, Segment, cut_at_stop, per_request

# control characters that are not whitespace (jinja's `-` would strip \\x1c-\\x1f)
RECORD, FIELD, END = "\x01", "\x02", "\x03"
CHAT_TEMPLATE = (
    "{%- if tools %}" + RECORD + "tools" + FIELD + "{{ tools | tojson }}" + END + "{%- endif %}"
    "{%- for m in messages %}" + RECORD + "{{ m['role'] }}" + FIELD + "{{ m['content'] }}" + END + "{%- endfor %}"
    "{%- if add_generation_prompt %}" + RECORD + "assistant" + FIELD + "{%- endif %}"
)
RETRY_STATUS = {408, 429, 500, 502, 503, 504}


@functools.cache
def chat_tokenizer() -> Any:
    """A byte-level tokenizer (one token per UTF-8 byte, exact round trip) with the record template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|eos|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _records(text: str) -> list[tuple[str, str, bool]]:
    """(role, content, closed) for each record in `text`; text outside records is ignored."""
    out = []
    for chunk in text.split(RECORD)[1:]:
        role, _, rest = chunk.partition(FIELD)
        closed = END in rest
        out.append((role, rest.split(END, 1)[0], closed))
    return out


class OpenAIChatEngine:
    """Rollouts from `POST {base_url}/chat/completions`.

    Args:
        base_url: e.g. `https://api.example.com/v1`.
        model: the served model name.
        api_key: sent as a bearer token; defaults to `$OPENAI_API_KEY`.
        max_concurrency: requests in flight at once.
        max_retries: retries per request on connection errors, 429 and 5xx.
        timeout_s: per-request timeout.
        extra_body: further request fields (e.g. `{"reasoning_effort": "low"}`).
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, max_concurrency: int = 8,
                 max_retries: int = 3, timeout_s: float = 120.0, extra_body: dict[str, Any] | None = None) -> None:
        if not base_url:
            raise ValueError("OpenAIChatEngine needs base_url, e.g. https://api.example.com/v1")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.max_concurrency, self.max_retries, self.timeout_s = max_concurrency, max_retries, timeout_s
        self.extra_body = dict(extra_body or {})
        self.tokenizer = chat_tokenizer()
        # request text -> [(reply text as the env saw it, the assistant message to send back)]
        self._answers: dict[str, list[tuple[str, dict[str, Any]]]] = {}

    # -- the RolloutEngine interface ----------------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
                 ) -> list[Segment]:
        return asyncio.run(self.agenerate(prompts, params))

    async def agenerate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
                        ) -> list[Segment]:
        requests = [(list(p), sp) for p, sp in zip(prompts, per_request(prompts, params), strict=True)
                    for _ in range(sp.n)]
        limit = asyncio.Semaphore(self.max_concurrency)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as http:
            async def one(ids: list[int], sp: SamplingParams) -> Segment:
                async with limit:
                    return await self._sample(http, ids, sp)

            return list(await asyncio.gather(*(one(ids, sp) for ids, sp in requests)))

    def sync_weights(self, model: Any) -> None:
        raise RuntimeError("a hosted chat model cannot be trained here: OpenAIChatEngine is for evaluation")

    # -- internals ----------------------------------------------------------------------------

    def messages(self, text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The chat messages (and tool schemas) a rendered prompt plus response so far stands for."""
        known = sorted((k for k in self._answers if text.startswith(k)), key=len)
        base = known[0] if known else text
        messages: list[dict[str, Any]] = []
        tools = None
        for role, content, closed in _records(base):
            if role == "tools":
                tools = json.loads(content)
            elif closed:
                messages.append({"role": role, "content": content})
        at = len(base)
        for i, key in enumerate(known):
            if len(key) < at:
                continue
            reply = next(((out, msg) for out, msg in self._answers[key] if text.startswith(key + out)), None)
            if reply is None:
                continue
            out, msg = reply
            messages.append(msg)
            at = len(key) + len(out)
            end = len(known[i + 1]) if i + 1 < len(known) else len(text)
            between = text[at:end]
            calls = [c["id"] for c in msg.get("tool_calls", [])]
            records = _records(between)
            if records:  # the chat template's tool turn (JSON protocol)
                for role, content, closed in records:
                    if role == "tool" and closed:
                        messages.append({"role": "tool", "content": content,
                                         "tool_call_id": calls.pop(0) if calls else "call_0"})
            elif between.strip():  # text the env appended in the same turn (tag protocol)
                messages.append({"role": "user", "content": between.strip()})
            at = end
        return messages, tools

    async def _sample(self, http: aiohttp.ClientSession, ids: list[int], sp: SamplingParams) -> Segment:
        text = self.tokenizer.decode(ids)
        messages, tools = self.messages(text)
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": sp.temperature,
                                "top_p": sp.top_p, "max_tokens": max(1, sp.max_tokens), **self.extra_body}
        if sp.seed is not None:
            body["seed"] = sp.seed
        if tools:
            body["tools"] = tools
        reply = await self._post(http, body)
        choice = reply["choices"][0]
        message = choice.get("message") or {}
        content = message.get("content") or ""
        calls = message.get("tool_calls") or []
        sent: dict[str, Any] = {"role": "assistant", "content": content}
        out = content
        if calls:  # one call per step, as the env runs it; written the way JsonToolCalls parses it
            call = calls[0]
            fn = call.get("function", {})
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except json.JSONDecodeError:
                args = fn.get("arguments")
            out = content + "<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args}) + "\n</tool_call>"
            sent["tool_calls"] = [call]
        finish = "length" if choice.get("finish_reason") == "length" else "eos"
        out, stop = cut_at_stop(out, sp.stop)
        if stop is not None:
            finish = "stop"
            if not calls:
                sent["content"] = out
        token_ids = self.tokenizer(out, add_special_tokens=False)["input_ids"]
        if len(token_ids) > sp.max_tokens:  # the byte budget the runner gave
            token_ids, finish = token_ids[: sp.max_tokens], "length"
            out = self.tokenizer.decode(token_ids)
            sent["content"] = out
        self._answers.setdefault(text, []).append((out, sent))
        return Segment(token_ids=token_ids, logprobs=[0.0] * len(token_ids), finish_reason=finish,
                       stop_str=stop, text=out)

    async def _post(self, http: aiohttp.ClientSession, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = f"{self.base_url}/chat/completions"
        for attempt in range(self.max_retries + 1):
            try:
                async with http.post(url, json=body, headers=headers) as r:
                    if r.status in RETRY_STATUS and attempt < self.max_retries:
                        await asyncio.sleep(min(8.0, 0.5 * 2**attempt) * (0.5 + random.random()))
                        continue
                    if r.status != 200:
                        raise RuntimeError(f"{url} answered {r.status}: {(await r.text())[:300]}")
                    return await r.json()
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                if attempt >= self.max_retries:
                    raise RuntimeError(f"{url} unreachable after {attempt + 1} tries: {exc!r}") from None
                await asyncio.sleep(min(8.0, 0.5 * 2**attempt))
        raise AssertionError("unreachable")


__all__ = ["CHAT_TEMPLATE", "OpenAIChatEngine", "chat_tokenizer"]
