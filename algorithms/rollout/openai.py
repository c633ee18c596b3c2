"""`OpenAIEngine`: any OpenAI-compatible completions server as a rollout engine (evaluation, judges).

Requests go to `POST {base_url}/completions` over aiohttp, at most `max_concurrency` at a time,
retried with exponential backoff on connection errors, 429 and 5xx.

Two prompt modes:
- `"ids"` (vLLM and other servers that take token-id prompts): the prompt is sent as a list of
  ids, and the generated ids come back exactly (`return_token_ids`, or tokens spelled
  `token_id:N` via `return_tokens_as_token_ids`), so token-in / token-out holds as with the
  in-process engines.
- `"text"` (servers that only take text): the prompt ids are decoded and sent as text, and the
  generated text is re-encoded with the local tokenizer. Caveat: this re-tokenizes, so the ids
  may differ from what the server sampled; log-probs are NaN when the server's token count does
  not match. Use it for evaluation and judging, not for training.
`"auto"` (default) uses ids and falls back to text when the server rejects an id prompt.

    from algorithms.rollout import OpenAIEngine, SamplingParams

    engine = OpenAIEngine("http://127.0.0.1:8000/v1", model="policy", tokenizer="tiny")
    segs = engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8))

(not a doctest: it needs a running server, e.g. `vllm serve`)
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import aiohttp

from agent_envs.net.http import SessionPool
from algorithms.rollout.engine import SamplingParams, Segment, per_request

RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class OpenAIEngine:
    """Rollouts from an OpenAI-compatible server.

    Args:
        base_url: e.g. `http://127.0.0.1:8000/v1`.
        model: the served model name.
        tokenizer: the model's tokenizer, an object or anything `resolve_model` takes (a
            checkpoint folder, a hub id, `tiny`, `smollm2`): prompts are token ids.
        api_key: sent as a bearer token; defaults to `$OPENAI_API_KEY`.
        prompt_mode: `auto`, `ids` or `text` (see the module docstring).
        max_concurrency: requests in flight at once.
        max_retries: retries per request on transient failures.
        timeout_s: per-request timeout.
        vllm_extensions: send vLLM's extra fields (top_k, stop-string inclusion, token ids).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        *,
        api_key: str | None = None,
        prompt_mode: Literal["auto", "ids", "text"] = "auto",
        max_concurrency: int = 32,
        max_retries: int = 3,
        timeout_s: float = 120.0,
        vllm_extensions: bool = True,
    ) -> None:
        if prompt_mode not in ("auto", "ids", "text"):
            raise ValueError(f"OpenAIEngine: prompt_mode={prompt_mode!r} must be 'auto', 'ids' or 'text'")
        if isinstance(tokenizer, (str, Path)):
            from transformers import AutoTokenizer

            from algorithms.models.resolve import resolve_model

            tokenizer = AutoTokenizer.from_pretrained(resolve_model(tokenizer))
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.prompt_mode = prompt_mode
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.vllm_extensions = vllm_extensions
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        # one pooled session per event loop, closed when that loop shuts down; the connection
        # limit is the concurrency limit
        self._pool = SessionPool(limit=max_concurrency, headers=headers)
        self.requests = 0
        self.retries = 0

    # -- public API -------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Segment]:
        async def run() -> list[Segment]:
            try:
                return await self.agenerate(prompts, params)
            finally:
                await self.aclose()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(run())
        # called from inside an event loop: run on a private loop in a thread
        box: list[Any] = []
        thread = threading.Thread(target=lambda: box.append(asyncio.run(run())))
        thread.start()
        thread.join()
        return box[0]

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Segment]:
        reqs = per_request(prompts, params)
        results = await asyncio.gather(*(self._one(list(p), r) for p, r in zip(prompts, reqs, strict=True)))
        return [seg for group in results for seg in group]

    def sync_weights(self, model: Any) -> None:
        raise NotImplementedError(
            "OpenAIEngine cannot receive weights: restart or reload the server with the new checkpoint, "
            "or use VLLMEngine for training"
        )

    async def aclose(self) -> None:
        await self._pool.aclose()

    def stats(self) -> dict[str, float]:
        return {"requests": float(self.requests), "retries": float(self.retries)}

    # -- one request ------------------------------------------------------------------------

    def _body(self, prompt: list[int], p: SamplingParams, as_ids: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt if as_ids else self.tokenizer.decode(prompt, skip_special_tokens=False),
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "n": p.n,
            "logprobs": p.logprobs,
        }
        if p.stop:
            body["stop"] = list(p.stop)
        if p.seed is not None:
            body["seed"] = p.seed
        if self.vllm_extensions:
            body.update(
                top_k=p.top_k,
                include_stop_str_in_output=True,
                skip_special_tokens=True,
                return_tokens_as_token_ids=True,
                return_token_ids=True,
            )
        return body

    async def _one(self, prompt: list[int], p: SamplingParams) -> list[Segment]:
        if p.max_tokens == 0:
            return [Segment([], [], [] if p.logprobs else None, "length") for _ in range(p.n)]
        as_ids = self.prompt_mode != "text"
        try:
            data = await self._post(self._body(prompt, p, as_ids))
        except _ClientError as exc:
            if not (self.prompt_mode == "auto" and as_ids):
                raise
            self.prompt_mode, as_ids = "text", False  # the server takes no id prompts: remember
            try:
                data = await self._post(self._body(prompt, p, as_ids))
            except _ClientError:
                raise exc from None
        choices = sorted(data.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != p.n:
            raise RuntimeError(f"{self.base_url}/completions returned {len(choices)} choices for n={p.n}")
        return [self._segment(c, p, as_ids) for c in choices]

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        session = await self._pool.get()
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        url = f"{self.base_url}/completions"
        delay = 0.5
        for attempt in range(self.max_retries + 1):
            try:
                async with session.post(url, json=body, timeout=timeout) as resp:
                    self.requests += 1
                    if resp.status == 200:
                        return await resp.json()
                    text = await resp.text()
                    if resp.status not in RETRY_STATUS:
                        raise _ClientError(f"{url} answered HTTP {resp.status}: {text[:500]}")
                    error: Exception = RuntimeError(f"{url} answered HTTP {resp.status}: {text[:200]}")
            except (aiohttp.ClientConnectionError, aiohttp.ServerTimeoutError, TimeoutError) as exc:
                error = exc
            if attempt < self.max_retries:
                self.retries += 1
                await asyncio.sleep(delay * (1 + random.random()))
                delay *= 2
        raise RuntimeError(f"{url}: failed after {self.max_retries + 1} attempts: {error}") from error

    def _segment(self, choice: dict[str, Any], p: SamplingParams, as_ids: bool) -> Segment:
        lp = choice.get("logprobs") or {}
        tokens = lp.get("tokens") or []
        token_lps = [float(x) if x is not None else math.nan for x in (lp.get("token_logprobs") or [])]
        ids = choice.get("token_ids")
        if ids is None and tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            ids = [int(t.split(":", 1)[1]) for t in tokens]
        text = choice.get("text") or ""
        if ids is None or not as_ids:
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(token_lps) != len(ids):
                token_lps = [math.nan] * len(ids)  # re-encoded ids do not align with the server's tokens
        top = None
        if p.logprobs:
            top = [sorted(d.values(), reverse=True)[: p.logprobs] for d in (lp.get("top_logprobs") or [])]
        stop_reason = choice.get("stop_reason")
        if choice.get("finish_reason") == "length":
            reason, stop_str = "length", None
        elif isinstance(stop_reason, str):
            reason, stop_str = "stop", stop_reason
        else:
            # servers without vLLM's stop_reason: a stop string at the end means a stop-string stop
            stop_str = next((s for s in p.stop if text.endswith(s)), None) if stop_reason is None else None
            reason = "stop" if stop_str is not None else "eos"
        if stop_str is not None and not text.endswith(stop_str):
            text = text if stop_str in text else text + stop_str  # server cut the stop string off
        if len(token_lps) != len(ids):
            token_lps = (token_lps + [math.nan] * len(ids))[: len(ids)]
        return Segment(list(ids), token_lps, top, reason, stop_str, text, None)


class _ClientError(RuntimeError):
    """A 4xx answer other than 408/429: the request itself is wrong, retrying will not help."""


__all__ = ["OpenAIEngine"]
