"""Shared test fixtures: where the real benchmark data lives, and thread limits.

Benchmark files live beside the repository in `../shared/data` (never copied in). Set
AGENT_ENVS_DATA_DIR to point elsewhere. A clean clone has no such folder: the tests that read
it then skip, saying what to fetch (`agent-envs data download`); where the folder exists (CI),
they run.
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


NO_DATA = (f"needs the benchmark data folder, not found at {SHARED_DATA}: fetch the benchmark files with "
           "`agent-envs data download --all` and set AGENT_ENVS_DATA_DIR to a folder that holds them "
           "(docs/benchmarks-data.md)")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real benchmark data folder; a test that takes it skips when the folder is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(NO_DATA)
    return SHARED_DATA
