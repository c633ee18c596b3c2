"""Search costs: BM25 latency on a 100k-passage corpus, cache hits, retrieval-server throughput.

    python tests/perf/bench_search.py [--passages 100000] [--queries 500] [--plot bench_search.png]

The corpus is the real multi-hop corpus (12,816 passages) plus synthetic passages drawn from its
own word distribution up to `--passages`; queries are the 500 HotpotQA IRCoT questions. Every
comparison alternates A and B query by query, in one run, with one thread:

1. `BM25Backend.search_sync` (one query, top 3) against bm25s's own `tokenize` + `retrieve` on
   the same index (the baseline), and `SearchTool` end to end. Target: p50 <= 6 ms.
2. `SearchTool` cache hits (memory LRU and SQLite) against the miss that computes the result.
3. `agent-envs serve-retriever` throughput with 32 concurrent single-query clients, batching on
   (2 ms window) against batching off (0 ms), both servers as real subprocesses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import bm25s  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import track  # noqa: E402
from rich.table import Table  # noqa: E402

from agent_envs.remote import ToolCache  # noqa: E402
from agent_envs.retrieval import BM25Backend, HttpBackend  # noqa: E402
from agent_envs.tools import SearchTool  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("AGENT_ENVS_DATA_DIR", REPO.parent / "shared" / "data"))
console = Console()


def build_corpus(path: Path, n: int, seed: int = 0) -> int:
    """Real passages, then synthetic ones sampled from the real unigram distribution."""
    import numpy as np

    real = [
        json.loads(line) for line in (DATA / "corpus" / "wiki_multihop_mini.jsonl").open(encoding="utf-8")
    ]
    counts = Counter(w for d in real for w in d["text"].split())
    words, freq = zip(*counts.most_common(50_000), strict=True)
    p = np.asarray(freq, dtype=np.float64) / sum(freq)
    lengths = np.asarray([len(d["text"].split()) for d in real])
    rng = np.random.default_rng(seed)
    n_syn = max(0, n - len(real))
    sizes = rng.choice(lengths, size=n_syn)
    drawn = rng.choice(len(words), size=int(sizes.sum()), p=p)
    title_words = rng.integers(200, 5000, size=(n_syn, 3))
    with path.open("w", encoding="utf-8") as f:
        for d in real[:n]:
            f.write(json.dumps({"id": d["id"], "title": d["title"], "text": d["text"]}) + "\n")
        start = 0
        for i in track(range(n_syn), description="synthetic passages", console=console):
            text = " ".join(words[j] for j in drawn[start : start + sizes[i]])
            start += sizes[i]
            title = " ".join(words[j] for j in title_words[i])
            f.write(json.dumps({"id": f"syn-{i:06d}", "title": title, "text": text}) + "\n")
    return max(n, 0)


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e3


def bench_latency(backend: BM25Backend, questions: list[str]) -> dict[str, list[float]]:
    tool = SearchTool(backend, topk=3)
    out: dict[str, list[float]] = {"ours": [], "bm25s": [], "tool": []}

    def baseline(q: str) -> None:
        # The library's own query path on the same index: tokenize, then retrieve top 3.
        toks = bm25s.tokenize([q], stopwords="en", show_progress=False, return_ids=False)[0]
        toks = [t for t in toks if t in backend.vocab]
        if toks:
            backend.index.retrieve([toks], k=3, show_progress=False, n_threads=0)

    async def run() -> None:
        for q in questions[:5]:  # warm caches and any lazy compilation
            backend.search_sync([q], 3)
            baseline(q)
            await tool(q)
        for q in track(questions, description="BM25 latency (A/B alternating)", console=console):
            t0 = time.perf_counter()
            backend.search_sync([q], 3)
            t1 = time.perf_counter()
            baseline(q)
            t2 = time.perf_counter()
            await tool(q)
            t3 = time.perf_counter()
            out["ours"].append(t1 - t0)
            out["bm25s"].append(t2 - t1)
            out["tool"].append(t3 - t2)

    asyncio.run(run())
    return out


def bench_cache(backend: BM25Backend, questions: list[str], db: Path) -> dict[str, list[float]]:
    mem = SearchTool(backend, topk=3, cache=ToolCache())
    disk_writer = SearchTool(backend, topk=3, cache=ToolCache(db))
    out: dict[str, list[float]] = {"miss": [], "memory_hit": [], "sqlite_hit": []}

    async def run() -> None:
        for q in questions:  # fill both caches
            await mem(q)
            await disk_writer(q)
        disk = SearchTool(backend, topk=3, cache=ToolCache(db, max_entries=0))  # every read goes to SQLite
        nocache = SearchTool(backend, topk=3)
        for q in track(questions, description="cache hit vs miss", console=console):
            t0 = time.perf_counter()
            r = await mem(q)
            t1 = time.perf_counter()
            d = await disk(q)
            t2 = time.perf_counter()
            await nocache(q)
            t3 = time.perf_counter()
            assert r.cached and d.cached
            out["memory_hit"].append(t1 - t0)
            out["sqlite_hit"].append(t2 - t1)
            out["miss"].append(t3 - t2)

    asyncio.run(run())
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(corpus: Path, cache_dir: Path, window_ms: float) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "agent_envs.cli",
        "serve-retriever",
        "--corpus",
        str(corpus),
        "--port",
        str(port),
        "--cache-dir",
        str(cache_dir),
        "--batch-window-ms",
        str(window_ms),
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"serve-retriever exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"http://127.0.0.1:{port}/retrieve"
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("serve-retriever did not start within 120 s") from None
            time.sleep(0.2)


async def throughput(url: str, questions: list[str], clients: int) -> float:
    backend = HttpBackend(url, max_retries=0)
    queue = list(questions)

    async def client() -> None:
        while queue:
            await backend.search([queue.pop()], topk=3)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - t0
    await backend.aclose()
    return len(questions) / elapsed


def bench_server(corpus: Path, cache_dir: Path, questions: list[str], rounds: int, clients: int) -> dict:
    servers = {name: start_server(corpus, cache_dir, w) for name, w in (("batched", 2.0), ("unbatched", 0.0))}
    out: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for _ in track(range(rounds), description="server throughput (A/B rounds)", console=console):
            for name, (_, url) in servers.items():
                out[name].append(asyncio.run(throughput(url, questions, clients)))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    return out


def plot(path: Path, lat: dict, cache: dict, server: dict, n_docs: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, xs in {**lat, **{f"cache {k}": v for k, v in cache.items()}}.items():
        s = sorted(x * 1e3 for x in xs)
        axes[0].plot(s, [i / len(s) for i in range(len(s))], label=name)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("latency per query (ms, log)")
    axes[0].set_ylabel("fraction of queries")
    axes[0].set_title(f"BM25 over {n_docs:,} passages, top 3")
    axes[0].legend(fontsize=8)
    names = list(lat)
    axes[1].bar(names, [statistics.median(lat[n]) * 1e3 for n in names])
    axes[1].axhline(6.0, color="red", linestyle="--", label="target 6 ms")
    axes[1].set_ylabel("p50 latency (ms)")
    axes[1].legend()
    axes[2].bar(list(server), [statistics.median(v) for v in server.values()])
    axes[2].set_ylabel("queries / s (median of rounds)")
    axes[2].set_title("serve-retriever, 32 concurrent clients")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3, help="server throughput rounds per variant")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of the results here")
    args = parser.parse_args()

    with (DATA / "hotpotqa" / "dev_500_ircot_with_contexts.jsonl").open(encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f][: args.queries]
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        tmp_path = Path(tmp)
        corpus = tmp_path / "corpus.jsonl"
        build_corpus(corpus, args.passages)
        t0 = time.perf_counter()
        backend = BM25Backend.from_jsonl(corpus, cache_dir=tmp_path / "index")
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        backend = BM25Backend.from_jsonl(corpus, cache_dir=tmp_path / "index")
        load_s = time.perf_counter() - t0
        console.print(
            f"{len(backend):,} passages: index built in {build_s:.1f} s, loaded from cache in {load_s:.2f} s"
        )
        lat = bench_latency(backend, questions)
        cache = bench_cache(backend, questions, tmp_path / "cache.sqlite")
        server = bench_server(corpus, tmp_path / "index", questions, args.rounds, args.clients)

    table = Table(title=f"search, {len(backend):,} passages, {len(questions)} HotpotQA queries, 1 thread")
    for col in ("measure", "p50 ms", "p95 ms", "vs baseline"):
        table.add_column(col)
    base = statistics.median(lat["bm25s"])
    for name, label in (
        ("bm25s", "bm25s tokenize+retrieve (baseline)"),
        ("ours", "BM25Backend.search_sync"),
        ("tool", "SearchTool call (format)"),
    ):
        table.add_row(
            label,
            f"{pct(lat[name], 0.5):.3f}",
            f"{pct(lat[name], 0.95):.3f}",
            f"{base / statistics.median(lat[name]):.2f}x faster",
        )
    miss = statistics.median(cache["miss"])
    for name in ("miss", "memory_hit", "sqlite_hit"):
        table.add_row(
            f"SearchTool cache {name}",
            f"{pct(cache[name], 0.5):.4f}",
            f"{pct(cache[name], 0.95):.4f}",
            f"{miss / statistics.median(cache[name]):.1f}x vs miss",
        )
    ub = statistics.median(server["unbatched"])
    for name, v in server.items():
        table.add_row(
            f"server {name}: queries/s (median of {args.rounds})",
            f"{statistics.median(v):.0f}",
            "",
            f"{statistics.median(v) / ub:.2f}x vs unbatched",
        )
    console.print(table)
    p50 = pct(lat["ours"], 0.5)
    console.print(
        f"BM25 p50 {p50:.2f} ms (target <= 6 ms: {'met' if p50 <= 6 else 'MISSED'}); "
        f"index build {build_s:.1f} s, cached load {load_s:.2f} s"
    )
    if args.plot:
        plot(args.plot, lat, cache, server, len(backend))
        console.print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
