"""Passages and the corpus files they come from: `Hit`, query normalisation, the corpus parser.

A corpus is JSONL, one passage a line, with `id` and either `title` + `text` or Search-R1's
`contents = '"Title"\\ntext'`. Errors name the file and line.

    >>> split_contents('"Alpha"\\nAlpha was founded by Ada.')
    ('Alpha', 'Alpha was founded by Ada.')
    >>> normalize_query(' who  founded "Alpha" ')
    'who founded Alpha'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_envs.data.jsonl import iter_json_objects


@dataclass
class Hit:
    """One retrieved passage or web result."""

    id: str
    title: str
    text: str
    url: str | None = None
    score: float = 0.0

    @property
    def contents(self) -> str:
        """The Search-R1 corpus form: quoted title on the first line, then the text."""
        return f'"{self.title}"\n{self.text}'

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Hit:
        return cls(
            id=str(d.get("id", "")),
            title=str(d.get("title", "")),
            text=str(d.get("text", "")),
            url=d.get("url"),
            score=float(d.get("score") or 0.0),
        )


def normalize_query(query: str) -> str:
    """Canonical query: strip, collapse whitespace, drop double quotes (case is kept)."""
    return " ".join(query.replace('"', " ").split())


def split_contents(contents: str) -> tuple[str, str]:
    """`'"Title"\\ntext'` -> (title, text); a single line has no title."""
    first, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents.strip()
    return first.strip().strip('"'), rest.strip()


def parse_doc(row: Any, where: str) -> dict[str, str]:
    """Validate one corpus row into {id, title, text}; `where` names the file and line for errors."""
    if not isinstance(row, dict | Mapping):
        raise ValueError(f"{where}: a corpus row must be a JSON object, got {type(row).__name__}")
    if "id" not in row or row["id"] is None or str(row["id"]) == "":
        raise ValueError(f"{where}: corpus row has no 'id' field (every passage needs a unique id)")
    doc_id = str(row["id"])
    if isinstance(row.get("text"), str):
        title = row.get("title")
        if title is None and isinstance(row.get("contents"), str):
            title = split_contents(row["contents"])[0]
        return {"id": doc_id, "title": str(title or ""), "text": row["text"]}
    if isinstance(row.get("contents"), str):
        title, text = split_contents(row["contents"])
        if row.get("title") is not None:
            title = str(row["title"])
        return {"id": doc_id, "title": title, "text": text}
    raise ValueError(f"{where}: corpus row {doc_id!r} has neither a 'text' nor a 'contents' string field")


def load_corpus(path: str | os.PathLike) -> list[dict[str, str]]:
    """Read a corpus JSONL into [{id, title, text}], with errors naming the file and line."""
    docs: list[dict[str, str]] = []
    seen: dict[str, int] = {}
    for where, lineno, row in iter_json_objects(path, "corpus file"):
        doc = parse_doc(row, where)
        if doc["id"] in seen:
            raise ValueError(f"{where}: duplicate id {doc['id']!r} (first on line {seen[doc['id']]})")
        seen[doc["id"]] = lineno
        docs.append(doc)
    if not docs:
        raise ValueError(f"corpus file {path} has no passages")
    return docs
