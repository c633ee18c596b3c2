"""Fixtures of the fault and load tests: the real BM25 index over the shared multi-hop corpus, the
real retrieval server in process, and the fault-injecting proxy in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from reliability_support import CORPUS, FaultProxy

from agent_envs.retrieval import BM25Backend
from agent_envs.server.retriever import RetrieverServer


@pytest.fixture(scope="session")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bm25-index")


@pytest.fixture(scope="session")
def wiki(shared_data: Path, index_dir: Path) -> BM25Backend:
    """The 12,816-passage corpus, indexed once per session (subprocess servers load the cached index)."""
    return BM25Backend.from_jsonl(shared_data / CORPUS, cache_dir=index_dir)


@pytest.fixture
async def retriever(wiki: BM25Backend) -> AsyncIterator[RetrieverServer]:
    server = RetrieverServer(wiki)
    await server.start(port=0)
    yield server
    await server.stop()


@pytest.fixture
async def proxy(retriever: RetrieverServer) -> AsyncIterator[FaultProxy]:
    assert retriever.url is not None
    double = FaultProxy(retriever.url)
    await double.start()
    yield double
    await double.stop()
