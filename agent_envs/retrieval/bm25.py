"""`BM25Backend`: in-process BM25 (bm25s) over a corpus, its index cached on disk by content.

    >>> docs = [{"id": "d1", "title": "Alpha", "text": "Alpha was founded by Ada."},
    ...         {"id": "d2", "title": "Beta", "text": "Beta is a river."}]
    >>> [h.id for h in BM25Backend(docs).search_sync(["who founded Alpha"], topk=1)[0]]
    ['d1']
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent_envs.base.paths import cache_root
from agent_envs.retrieval.backend import SearchBackend
from agent_envs.retrieval.corpus import Hit, load_corpus, parse_doc

BM25_INDEX_VERSION = 1


_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")


class BM25Backend(SearchBackend):
    """In-process BM25 (bm25s) over a list of passages.

    Ranking is deterministic: ties are broken by corpus order, and passages with a zero score
    (no query term in common) are never returned.

    Args:
        docs: passages as dicts with `id` and `title` + `text`, or `contents`.
        k1, b: BM25 parameters.
        stopwords: bm25s stopword list name ("en") or None.
    """

    def __init__(
        self,
        docs: Iterable[Mapping[str, Any]],
        k1: float = 1.5,
        b: float = 0.75,
        stopwords: str | None = "en",
        *,
        _index: Any = None,
        _backend_id: str | None = None,
        _parsed: bool = False,
    ) -> None:
        import bm25s

        if _parsed:  # rows already validated by load_corpus
            self.docs = list(docs)  # type: ignore[arg-type]
        else:
            self.docs = [parse_doc(d, f"docs[{i}]") for i, d in enumerate(docs)]
        if not self.docs:
            raise ValueError("BM25Backend needs at least one passage")
        self.k1, self.b, self.stopwords = k1, b, stopwords
        self._stopset = (
            frozenset(bm25s.stopwords.STOPWORDS_EN) if stopwords in ("en", "english") else frozenset()
        )
        if stopwords not in (None, "en", "english"):
            raise ValueError(f"BM25Backend stopwords must be 'en' or None, got {stopwords!r}")
        if _index is None:
            _index = self._build_index()
        self.index = _index
        self.vocab: dict[str, int] = self.index.vocab_dict
        self.backend_id = _backend_id or f"bm25:{self._content_hash()}"

    # -- construction -----------------------------------------------------------------------------

    def _doc_text(self, d: Mapping[str, str]) -> str:
        return f"{d['title']} {d['text']}"

    def _tokenize(self, text: str) -> list[str]:
        return [t for t in _TOKEN_RE.findall(text.lower()) if t not in self._stopset]

    def _build_index(self) -> Any:
        import bm25s

        corpus_tokens = [self._tokenize(self._doc_text(d)) for d in self.docs]
        vocab: dict[str, int] = {}
        ids = [[vocab.setdefault(t, len(vocab)) for t in toks] for toks in corpus_tokens]
        index = bm25s.BM25(k1=self.k1, b=self.b)
        index.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)
        return index

    def _content_hash(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps([BM25_INDEX_VERSION, self.k1, self.b, self.stopwords]).encode())
        for d in self.docs:
            h.update(json.dumps([d["id"], d["title"], d["text"]], ensure_ascii=False).encode())
        return h.hexdigest()[:16]

    @classmethod
    def from_jsonl(
        cls,
        path: str | os.PathLike,
        cache_dir: str | os.PathLike | None = None,
        k1: float = 1.5,
        b: float = 0.75,
        stopwords: str | None = "en",
    ) -> BM25Backend:
        """Load a corpus JSONL; the index is built once and cached on disk by content hash.

        `cache_dir` defaults to `$AGENT_ENVS_CACHE/bm25` (default `~/.cache/agent-envs/bm25`).
        """
        import bm25s

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {path} not found")
        h = hashlib.sha256()
        h.update(json.dumps([BM25_INDEX_VERSION, k1, b, stopwords]).encode())
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        digest = h.hexdigest()[:16]
        docs = load_corpus(path)
        root = Path(cache_dir) if cache_dir is not None else cache_root() / "bm25"
        target = root / f"{path.stem}-{digest}"
        backend_id = f"bm25:{digest}"
        if (target / "params.index.json").is_file():
            try:
                index = bm25s.BM25.load(str(target), mmap=False)
                return cls(docs, k1, b, stopwords, _index=index, _backend_id=backend_id, _parsed=True)
            except Exception:  # a torn or foreign cache entry: replace it below
                shutil.rmtree(target, ignore_errors=True)
        backend = cls(docs, k1, b, stopwords, _backend_id=backend_id, _parsed=True)
        backend._save_index(target)
        return backend

    def _save_index(self, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp", dir=target.parent))
        try:
            self.index.save(str(tmp))
            # Atomic: a concurrent reader sees all or nothing. OSError: another process won the
            # race, and its index is identical.
            with contextlib.suppress(OSError):
                os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # -- querying ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.docs)

    def search_sync(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        """Blocking search (about a millisecond per query on 10k passages)."""
        return [self._one(q, topk) for q in queries]

    def _one(self, query: str, topk: int) -> list[Hit]:
        ids = [self.vocab[t] for t in self._tokenize(query) if t in self.vocab]
        if not ids or topk <= 0:
            return []
        scores = self._scores(ids)
        # Deterministic top-k: everything scoring at least the k-th best, sorted by (-score, index).
        # Partition only the non-zero scores: np.partition on an array that is mostly zeros hits
        # introselect's slow path (17 ms instead of <1 ms at 100k passages).
        nz = np.flatnonzero(scores)
        vals = scores[nz]
        if len(nz) > topk:
            kth = np.partition(vals, len(vals) - topk)[len(vals) - topk]
            keep = vals >= kth
            nz, vals = nz[keep], vals[keep]
        order = nz[np.lexsort((nz, -vals))][:topk]
        return [
            Hit(
                id=self.docs[i]["id"],
                title=self.docs[i]["title"],
                text=self.docs[i]["text"],
                score=float(scores[i]),
            )
            for i in order
        ]

    def _scores(self, token_ids: list[int]) -> np.ndarray:
        # bm25s keeps per-token postings (data = precomputed BM25 term scores, indices = doc
        # rows). Its numpy path sums them with np.add.at, which costs ~10 ms per query at 100k
        # passages; one np.bincount over the concatenated postings gives the same sums ~5x faster.
        m = self.index.scores
        indptr = m["indptr"]
        spans = [(indptr[t], indptr[t + 1]) for t in token_ids]
        rows = np.concatenate([m["indices"][a:b] for a, b in spans])
        weights = np.concatenate([m["data"][a:b] for a, b in spans])
        return np.bincount(rows, weights=weights, minlength=m["num_docs"])

    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        if len(queries) <= 2:  # cheaper than a thread hop
            return self.search_sync(queries, topk)
        return await asyncio.to_thread(self.search_sync, list(queries), topk)
