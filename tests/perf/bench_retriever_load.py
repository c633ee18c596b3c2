"""The retrieval server under a burst of connections: listen backlog 128 (aiohttp's default)
against 4096 (the server's default), both as real `serve-retriever` subprocesses.

    python tests/perf/bench_retriever_load.py [--clients 1000] [--rounds 3]

Each round sends one sharp burst of `--clients` single-request connections (`sharp_burst`: all
opened in about 0.1 s) to A, then to B: alternated in one run, so both see the same machine load.
When the accept queue is full the kernel drops the SYN (counted in /proc/net/netstat as
ListenOverflows, read before and after each burst) and the client resends it only after 1 s, so
with too small a backlog part of a burst waits a second or more; the table counts both.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `tests.servers`, which it imports

from reliability_support import CORPUS, listen_overflows, questions, retriever_process, sharp_burst  # noqa: E402

from agent_envs.retrieval import BM25Backend  # noqa: E402

DATA = Path(os.environ.get("AGENT_ENVS_DATA_DIR", Path(__file__).resolve().parents[3] / "shared" / "data"))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        index = BM25Backend.from_jsonl(DATA / CORPUS, cache_dir=cache)
        asked = questions(DATA)
        expected = {q: [h.id for h in row] for q, row in zip(asked, index.search_sync(asked, 3), strict=True)}
        servers = {b: retriever_process(DATA / CORPUS, Path(cache), "--backlog", str(b)) for b in (128, 4096)}
        for s in servers.values():
            s.start()
        try:
            reports: dict[int, list] = {b: [] for b in servers}
            for r in range(args.rounds):
                for backlog, server in servers.items():
                    before = listen_overflows()
                    rep = await sharp_burst(server.port, asked, expected, args.clients)
                    overflows = listen_overflows() - before
                    reports[backlog].append((rep, overflows))
                    print(f"round {r + 1}, backlog {backlog}: {rep.line()}; {overflows} listen overflows", flush=True)
        finally:
            for s in servers.values():
                s.stop()
    print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| listen backlog | requests | failed | p50 | p99 | max | over 1 s | listen overflows |")
    print("|---|---|---|---|---|---|---|---|")
    for backlog, runs in reports.items():
        lat = sorted(t for rep, _ in runs for t in rep.latencies)
        failed = sum(sum(rep.failures.values()) for rep, _ in runs)
        over = sum(rep.over(1.0) for rep, _ in runs)
        overflows = sum(n for _, n in runs)
        print(f"| {backlog} | {len(lat)} | {failed} | {lat[len(lat) // 2] * 1000:.0f} ms | "
              f"{lat[int(0.99 * len(lat))] * 1000:.0f} ms | {lat[-1] * 1000:.0f} ms | {over} | {overflows} |")


if __name__ == "__main__":
    asyncio.run(main())
