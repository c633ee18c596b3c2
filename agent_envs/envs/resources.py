"""One instance per configuration of the expensive things envs use, shared within a process.

`gymnasium.make` builds a new env each call; a vector of 64 envs must not start 64 sandbox
pools or build 64 BM25 indexes. Tools and worlds are stateless between calls, so envs with the
same configuration share one instance.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_CACHE: dict[str, Any] = {}
_LOCK = threading.Lock()


def shared(kind: str, factory: Callable[..., T], **kwargs: Any) -> T:
    """Return the process-wide instance of `factory(**kwargs)`, creating it once."""
    key = kind + ":" + json.dumps(kwargs, sort_keys=True, default=repr)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = factory(**kwargs)
        return _CACHE[key]


def data_dir() -> str | None:
    """Where benchmark files and corpora are looked up by default (`AGENT_ENVS_DATA_DIR`)."""
    import os

    return os.environ.get("AGENT_ENVS_DATA_DIR")
