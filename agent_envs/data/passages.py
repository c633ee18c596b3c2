"""The passages that ship with multi-hop QA question files, as a benchmark's own search corpus.

HotpotQA's distractor setting gives each question 10 paragraphs (its 2 gold ones and 8 retrieved
distractors), MuSiQue 20, 2WikiMultihopQA 10. Where a benchmark's question files carry them, the
paragraphs of all its questions, deduplicated, make a small BM25 corpus that needs no Wikipedia
dump: the QA envs search it when no corpus is configured (docs/benchmarks-data.md). Accepted row
fields: `contexts` (IRCoT: `[{title, paragraph_text}]`), `paragraphs` (MuSiQue, same shape) and
`context` (HotpotQA / 2Wiki originals: `[[title, [sentence, ...]], ...]`, or the Hugging Face
form `{title: [...], sentences: [[...], ...]}`).

    >>> row = {"question": "Who founded Alpha?", "contexts": [
    ...     {"title": "Alpha", "paragraph_text": "Alpha was founded by Ada."}]}
    >>> row_passages(row)
    [('Alpha', 'Alpha was founded by Ada.')]
    >>> row_passages({"context": [["Beta", ["Beta is a river.", " It is long."]]]})
    [('Beta', 'Beta is a river. It is long.')]
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agent_envs.data.loaders import read_rows

PASSAGE_FIELDS = ("contexts", "paragraphs", "context")


def _text(value: Any) -> str:
    parts = value if isinstance(value, list | tuple) else [value]
    return " ".join(" ".join(str(p) for p in parts).split())


def row_passages(row: Any) -> list[tuple[str, str]]:
    """(title, text) of every passage a question row carries; [] when it carries none."""
    if not isinstance(row, Mapping):
        return []
    for key in PASSAGE_FIELDS:
        value = row.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("title"), list):  # HF columns
            value = list(zip(value["title"], value.get("sentences") or [], strict=False))
        if not isinstance(value, list) or not value:
            continue
        out = []
        for item in value:
            if isinstance(item, Mapping):
                title, text = item.get("title", ""), item.get("paragraph_text", item.get("text", ""))
            elif isinstance(item, list | tuple) and len(item) == 2:
                title, text = item
            else:
                continue
            text = _text(text)
            if text:
                out.append((str(title or ""), text))
        return out
    return []


def collect_passages(files: Iterable[str | os.PathLike]) -> tuple[list[tuple[str, str]], list[str]]:
    """The passages of every row of `files` (first occurrence kept, in file order), and the files
    that carry any."""
    seen: dict[tuple[str, str], None] = {}
    used = []
    for path in files:
        before = len(seen)
        for _, row in read_rows(path):
            for passage in row_passages(row):
                seen.setdefault(passage, None)
        if len(seen) > before:
            used.append(str(path))
    return list(seen), used


def write_passage_corpus(name: str, passages: Sequence[tuple[str, str]], folder: Path) -> Path:
    """Write the passages as a corpus JSONL (`id`, `title`, `text`) named by its content, once."""
    digest = hashlib.sha256(json.dumps(passages, ensure_ascii=False).encode()).hexdigest()[:16]
    path = folder / f"{name}-passages-{digest}.jsonl"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for i, (title, text) in enumerate(passages):
                fh.write(json.dumps({"id": f"{name}-p{i:05d}", "title": title, "text": text}, ensure_ascii=False) + "\n")
        os.replace(tmp, path)  # atomic: another process building the same corpus writes the same bytes
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


__all__ = ["PASSAGE_FIELDS", "collect_passages", "row_passages", "write_passage_corpus"]
