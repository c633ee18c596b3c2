"""Reading JSONL files of objects with errors that name the file and line.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "x.jsonl")
    >>> _ = open(p, "w").write('{"a": 1}\\n\\n{"a": 2}\\n')
    >>> [(line, row["a"]) for _, line, row in iter_json_objects(p)]
    [(1, 1), (3, 2)]
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_json_objects(
    path: str | os.PathLike, what: str = "file", *, growing: bool = False
) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(`"path:line"`, line number, object) for every non-blank line (`.gz` is read as gzip).

    A missing file raises FileNotFoundError; a line that is not valid JSON, or not a JSON object,
    raises ValueError naming `path:line`. With `growing` (a file another process is appending to,
    such as the metrics of a run still training) a last line without its newline that does not
    parse is a write in progress: it ends the rows instead of raising, and a later read gets it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} not found")
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                if growing and not line.endswith("\n"):
                    return
                raise ValueError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, lineno, row
