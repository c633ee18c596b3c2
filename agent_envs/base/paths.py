"""Where the package keeps what it builds or fetches, on the user's disk.

One root for every cache (BM25 indexes, the tiny and converted models, downloaded benchmark
files): `$AGENT_ENVS_CACHE`, else `~/.cache/agent-envs`.

    >>> import os; os.environ["AGENT_ENVS_CACHE"] = "/tmp/x"; cache_root()
    PosixPath('/tmp/x')
    >>> del os.environ["AGENT_ENVS_CACHE"]
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "AGENT_ENVS_CACHE"


def cache_root() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "agent-envs"


__all__ = ["CACHE_ENV", "cache_root"]
