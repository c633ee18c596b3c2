"""Shared test fixtures: where the real benchmark data lives, and thread limits.

Benchmark files live beside the repository in `../shared/data` (never copied in). Set
AGENT_ENVS_DATA_DIR to point elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# nothing can be downloaded here: fail fast instead of retrying a model or dataset hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("AGENT_ENVS_NO_HF", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("AGENT_ENVS_DATA_DIR", REPO.parent / "shared" / "data")).resolve()
os.environ.setdefault("AGENT_ENVS_DATA_DIR", str(SHARED_DATA))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"benchmark data not found at {SHARED_DATA}; set AGENT_ENVS_DATA_DIR to the shared data folder")
    return SHARED_DATA
