"""One place that builds a rollout engine by name, for commands that serve or evaluate a model.

    >>> from algorithms.rollout.engines import ENGINES, make_engine
    >>> ENGINES
    ('vllm', 'hf', 'openai', 'openai-chat', 'vllm-server')

`vllm` and `hf` load the model folder in-process; `openai` (completions, token ids) and
`openai-chat` (a chat-only endpoint such as a hosted model; evaluation only) call a server at
`base_url`; `vllm-server` is `agent-envs serve-rollout`'s server, with weight syncs. The learners
build theirs in `algorithms.core.model_setup`, where the HF engine shares the trained module.
"""

from __future__ import annotations

import os
from typing import Any

ENGINES = ("vllm", "hf", "openai", "openai-chat", "vllm-server")


def make_engine(kind: str, model: Any, *, tokenizer: Any = None, base_url: str | None = None, seed: int = 0,
                max_model_len: int = 4096, **kwargs: Any) -> Any:
    """An engine of `kind` for `model` (a folder for in-process engines, a served name otherwise)."""
    if kind == "vllm":
        from algorithms.rollout.vllm import VLLMEngine

        return VLLMEngine(model, seed=seed, max_model_len=max_model_len, **kwargs)
    if kind == "hf":
        from algorithms.rollout.hf import HFEngine

        if isinstance(tokenizer, (str, os.PathLike)):  # a folder: the engine loads it with the model
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        return HFEngine(model, tokenizer, seed=seed, **kwargs)
    if kind not in ENGINES:
        raise ValueError(f"engine {kind!r} is unknown; choose one of {', '.join(ENGINES)}")
    if not base_url:
        raise ValueError(f"engine {kind} needs a server address: base_url (e.g. http://127.0.0.1:8000/v1)")
    if kind == "openai-chat":
        from algorithms.rollout.openai_chat import OpenAIChatEngine

        return OpenAIChatEngine(base_url, str(model), **kwargs)
    if kind == "vllm-server":
        from algorithms.rollout.vllm_server import VLLMServerEngine

        return VLLMServerEngine(base_url=base_url, tokenizer=tokenizer or model, **kwargs)
    from algorithms.rollout.openai import OpenAIEngine

    return OpenAIEngine(base_url=base_url, model=str(model), tokenizer=tokenizer or model, **kwargs)


__all__ = ["ENGINES", "make_engine"]
