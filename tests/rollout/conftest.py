"""Shared fixtures of the rollout tests: one warmed tiny model, one HF and one vLLM engine per session.

The tiny model is built locally (no hub) and SFT-warmed for a few steps so that it writes the tag
protocol (tool calls, results, answers): episodes then really have several turns. It is cached
on disk, so only the first run pays for building it.
"""

from __future__ import annotations

import pytest
from rollout_helpers import WARMUP_STEPS

from algorithms.models.tiny import build_tiny_model


def pytest_collection_modifyitems(items):
    """Tests on the vLLM engine are `slow`: its start (~25 s on a busy 2-core machine) would be most
    of `make test-fast`. A test asks for it as a fixture or, parametrised, by name."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "vllm_engine" in getattr(item, "fixturenames", ()) or "vllm_engine" in params.values():
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_model_path():
    return build_tiny_model(seed=0, warmup_steps=WARMUP_STEPS)


@pytest.fixture(scope="session")
def hf_engine(tiny_model_path):
    import torch

    from algorithms.rollout.hf import HFEngine

    torch.set_num_threads(1)
    return HFEngine(tiny_model_path, seed=0)


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_path):
    from algorithms.rollout.vllm import VLLMEngine

    # enforce_eager: skips torch.compile, which costs ~40 s of start-up on this CPU
    return VLLMEngine(tiny_model_path, max_model_len=1024, enforce_eager=True, kv_cache_gb=1)
