"""Helpers shared by the search and retrieval-server tests: the real multi-hop corpus and recall.

The BM25 index of the 12.8k-passage corpus is built once per test session into a temporary
cache directory (about a second) and loaded from there afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent_envs.retrieval import BM25Backend, Hit

CORPUS = "corpus/wiki_multihop_mini.jsonl"
HOTPOT = "hotpotqa/dev_500_ircot_with_contexts.jsonl"
_BACKENDS: dict[tuple[Path, Path], BM25Backend] = {}


def wiki_backend(shared_data: Path, cache_dir: Path) -> BM25Backend:
    key = (shared_data, cache_dir)
    if key not in _BACKENDS:
        _BACKENDS[key] = BM25Backend.from_jsonl(shared_data / CORPUS, cache_dir=cache_dir)
    return _BACKENDS[key]


def hotpot_questions(shared_data: Path) -> list[dict]:
    with (shared_data / HOTPOT).open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert rows and all(r["supporting_doc_ids"] for r in rows), (
        "every IRCoT question names its supporting docs"
    )
    return rows


def recall_at_k(questions: list[dict], results: list[list[Hit]]) -> tuple[float, float]:
    """(fraction of supporting docs retrieved, fraction of questions with all of them)."""
    found = total = complete = 0
    for q, hits in zip(questions, results, strict=True):
        gold = set(q["supporting_doc_ids"])
        got = gold & {h.id for h in hits}
        found += len(got)
        total += len(gold)
        complete += got == gold
    return found / total, complete / len(questions)
