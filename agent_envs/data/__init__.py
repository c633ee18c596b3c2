"""Benchmark data: a registry of the 13 seed benchmarks plus the ARPO training mix, loaders that
normalise any supported file into `Task`s, and a train/eval contamination filter.

    >>> from agent_envs.data import BENCHMARKS, load_benchmark
    >>> sorted(BENCHMARKS)[:3]
    ['2wikimultihopqa', 'aime24', 'aime25']

`load_benchmark("gsm8k")` reads `$AGENT_ENVS_DATA_DIR/gsm8k/test.jsonl`; `data_files` names the
file instead:

    >>> import json, pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "test.jsonl"
    >>> _ = path.write_text(json.dumps({"question": "What is 6*7?", "answer": "42"}) + "\\n")
    >>> [(t.answers, t.reward) for t in load_benchmark("gsm8k", data_files=path)]
    [(['42'], 'math')]
"""

from agent_envs.data.contamination import filter_contaminated, normalize_question
from agent_envs.data.loaders import (
    SUPPORTED,
    DataError,
    benchmark_path,
    load_benchmark,
    load_local_splits,
    load_tasks,
    normalize_row,
    read_rows,
)
from agent_envs.data.registry import ALIASES, BENCHMARKS, BenchmarkSpec, get_spec

__all__ = [
    "ALIASES",
    "BENCHMARKS",
    "SUPPORTED",
    "BenchmarkSpec",
    "DataError",
    "benchmark_path",
    "filter_contaminated",
    "get_spec",
    "load_benchmark",
    "load_local_splits",
    "load_tasks",
    "normalize_question",
    "normalize_row",
    "read_rows",
]
