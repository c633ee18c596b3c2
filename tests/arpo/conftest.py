"""Fixtures for the ARPO/AEPO tests: the warmed-up tiny model, its tokenizer, an HF engine."""

from __future__ import annotations

import pytest

WARMUP_STEPS = 150  # the tiny model then writes the tag protocol (tool calls, results, answers)


@pytest.fixture(scope="session")
def tiny_model_path():
    from algorithms.models.tiny import build_tiny_model

    return build_tiny_model(warmup_steps=WARMUP_STEPS)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="session")
def hf_engine(tiny_model_path):
    from algorithms.rollout.hf import HFEngine

    return HFEngine(tiny_model_path, seed=0)
