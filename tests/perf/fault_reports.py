"""What `SearchTool` reports for a few server faults, against whichever `agent_envs` is imported.

    PYTHONPATH=<a checkout> python tests/perf/fault_reports.py

Run it with two checkouts (before and after a change) to compare what the model reads, how long
the call takes and how many requests the server saw. The faults come from `FaultProxy`, the
test double of a misbehaving server in tests/reliability, in front of a real `RetrieverServer`;
the tool has a 5 s timeout and the default retry policy (10 retries, 1 s x n apart).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))

from reliability_support import FaultProxy  # noqa: E402

import agent_envs  # noqa: E402
from agent_envs.retrieval import BM25Backend, HttpBackend  # noqa: E402
from agent_envs.server.retriever import RetrieverServer  # noqa: E402
from agent_envs.tools import SearchTool  # noqa: E402


async def main() -> None:
    print(f"agent_envs from {Path(agent_envs.__file__).parent}")
    server = RetrieverServer(BM25Backend([{"id": "d1", "title": "Alpha", "text": "Ada founded Alpha."}]))
    await server.start(port=0)
    proxy = FaultProxy(server.url, slow_s=60)
    await proxy.start()
    try:
        for fault in ("http_500", "reset", "garbage"):
            proxy.always(fault)
            proxy.hits = 0
            tool = SearchTool(HttpBackend(f"{proxy.url}/retrieve"), timeout_s=5.0)
            start = time.monotonic()
            res = await tool("who founded Alpha")
            print(f"{fault}: {proxy.hits} requests, {time.monotonic() - start:.1f} s, error={res.error}: {res.text}")
            await tool.aclose()
    finally:
        await proxy.stop()
        await server.stop()


if __name__ == "__main__":
    asyncio.run(main())
