"""Rollouts: engines that turn token-id prompts into segments, and the multi-turn runner.

    >>> from algorithms.rollout import HFEngine, SamplingParams
    >>> from algorithms.models.tiny import build_tiny_model
    >>> engine = HFEngine(build_tiny_model())
    >>> [seg] = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4))
    >>> 1 <= len(seg.token_ids) <= 4
    True

Engines and the runner are imported lazily: `import algorithms.rollout` loads neither torch nor
vLLM until an engine is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from algorithms.rollout.engine import RolloutEngine, SamplingParams, Segment

_LAZY = {
    "HFEngine": "algorithms.rollout.hf",
    "VLLMEngine": "algorithms.rollout.vllm",
    "OpenAIEngine": "algorithms.rollout.openai",
    "OpenAIChatEngine": "algorithms.rollout.openai_chat",
    "VLLMServerEngine": "algorithms.rollout.vllm_server",
    "Trajectory": "algorithms.rollout.trajectory",
    "read_jsonl": "algorithms.rollout.trajectory",
    "write_jsonl": "algorithms.rollout.trajectory",
    "to_jsonl": "algorithms.rollout.trajectory",
    "EpisodeBranch": "algorithms.rollout.runner",
    "run_episodes": "algorithms.rollout.runner",
    "build_tiny_model": "algorithms.models.tiny",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'algorithms.rollout' has no attribute {name!r}")


__all__ = ["RolloutEngine", "SamplingParams", "Segment", *_LAZY]
