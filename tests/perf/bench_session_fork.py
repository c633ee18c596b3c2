"""Benchmark: forking a live python session, and the memory of many live sessions.

A session's interpreter is a sandboxed process of a local worker; a fork is an `os.fork` of it
(copy-on-write), with a reseed and a copy of its working directory (`sandbox/session_host.py`).
This measures, on the local backend with every isolation on:

- fork: `SessionPool.fork` of a session holding a little state (its own timer: the request to the
  worker, the fork, the fork's hello with its pidfd), closed right after; p50 / p90 / max;
- first cell of a fork (`x + 1`), and a cell in a long-lived session, for scale;
- memory with `--live` sessions open at once (roots forked from `--roots` sessions that each
  hold `--state-mb` of data): the sum of the session processes' RSS (what `ps` shows, shared
  pages counted in each) and of their PSS (shared pages split between sharers: the real cost).

    python tests/perf/bench_session_fork.py --forks 200 --live 64 --roots 8 --state-mb 20

Target: a fork <= 5 ms p50 on 2 cores; memory bounded with 64 live sessions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from agent_envs.tools.sandbox import SandboxConfig  # noqa: E402
from agent_envs.tools.sandbox.local import LocalSandbox  # noqa: E402


def descendants(pid: int) -> list[int]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            tree.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def memory_kb(pids: list[int]) -> tuple[int, int]:
    """Sum of RSS and of PSS (kB) over `pids`."""
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return rss, pss


def ms(values: list[float]) -> str:
    qs = statistics.quantiles(values, n=10)
    return f"p50 {statistics.median(values) * 1e3:.2f} ms, p90 {qs[8] * 1e3:.2f} ms, max {max(values) * 1e3:.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forks", type=int, default=200)
    ap.add_argument("--live", type=int, default=64, help="sessions open at once for the memory figure")
    ap.add_argument("--roots", type=int, default=8, help="sessions the live ones are forked from")
    ap.add_argument("--state-mb", type=int, default=20, help="data each root holds before it is forked")
    ap.add_argument("--pool-size", type=int, default=2)
    args = ap.parse_args()
    # nproc: as root every interpreter runs as the sandbox uid, whose process count the limit caps
    config = SandboxConfig(timeout_s=30, pool_size=args.pool_size, preamble=("math",), nproc=4 * args.live + 64)
    sandbox = LocalSandbox(config)
    pool = sandbox.sessions
    try:
        root = pool.open()
        pool.run(root, "import json, random\nstate = {'x': list(range(1000))}\nx = 41")
        for _ in range(5):  # warm: the worker's first fork pays its page faults
            pool.close(pool.fork(root, 0))
        forks, firsts, closes = [], [], []
        for i in range(args.forks):
            start = time.perf_counter()
            twin = pool.fork(root, i)
            forks.append(time.perf_counter() - start)
            start = time.perf_counter()
            result = pool.run(twin, "x + 1")
            firsts.append(time.perf_counter() - start)
            assert result.stdout == "42\n", result
            start = time.perf_counter()
            pool.close(twin)
            closes.append(time.perf_counter() - start)
        cells = []
        for _ in range(args.forks):
            start = time.perf_counter()
            pool.run(root, "x + 1")
            cells.append(time.perf_counter() - start)
        pool.close(root)
        print(f"fork ({args.forks}, {os.cpu_count()} CPUs): {ms(forks)}")
        print(f"first cell of a fork: {ms(firsts)}")
        print(f"close of a fork: {ms(closes)}")
        print(f"a cell in a live session: {ms(cells)}")

        workers = pool.worker_pids()
        base_rss, base_pss = memory_kb([p for w in workers for p in [w, *descendants(w)]])
        roots = [pool.open() for _ in range(args.roots)]
        for r in roots:
            result = pool.run(r, f"blob = bytearray(b'x' * ({args.state_mb} << 20))\nprint(len(blob))")
            assert result.stdout.strip() == str(args.state_mb << 20), result
        live = list(roots)
        i = 0
        while len(live) < args.live:
            live.append(pool.fork(roots[i % len(roots)], i))
            i += 1
        for sid in live:  # every session alive and holding its state
            assert pool.run(sid, "len(blob)").stdout.strip() == str(args.state_mb << 20)
        workers = pool.worker_pids()
        pids = [p for w in workers for p in [w, *descendants(w)]]
        rss, pss = memory_kb(pids)
        print(f"{len(live)} live sessions ({args.roots} roots of {args.state_mb} MB, the rest forks), "
              f"{len(pids)} processes under {len(workers)} workers:")
        print(f"  RSS sum {rss / 1024:.0f} MB, PSS sum {pss / 1024:.0f} MB "
              f"(workers alone before: RSS {base_rss / 1024:.0f} MB, PSS {base_pss / 1024:.0f} MB); "
              f"PSS per live session {(pss - base_pss) / 1024 / len(live):.2f} MB")
        for sid in live:
            pool.close(sid)
        left = [p for w in workers for p in descendants(w)[1:]]
        print(f"after closing all: {len(left)} processes left under the workers")
    finally:
        sandbox.close()


if __name__ == "__main__":
    main()
