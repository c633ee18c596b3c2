"""The backend contract every retrieval source implements, and the error it raises."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from agent_envs.retrieval.corpus import Hit


class SearchBackendError(Exception):
    """A backend failed (after its retries); `reason` is what the model reads."""

    def __init__(self, reason: str, retries: int = 0, kind: str = "backend") -> None:
        # kind: what failed, for metrics (`http_500`, `timeout`, `reset`, `refused`, ...)
        super().__init__(reason)
        self.reason = reason
        self.retries = retries
        self.kind = kind


class SearchBackend(ABC):
    """A source of hits. `backend_id` identifies the index or service in cache keys."""

    backend_id: str = "backend"

    @abstractmethod
    async def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Hit]]:
        """Hits for each query, best first, in request order."""

    async def search_with_retries(
        self, queries: Sequence[str], topk: int = 3, budget_s: float | None = None
    ) -> tuple[list[list[Hit]], int]:
        """Like `search`, also returning how many retries it took (network backends retry).

        `budget_s` is the wall time the caller allows, retries included; network backends stop
        retrying when it runs out and report the last failure's cause (in-process ones ignore it).
        """
        return await self.search(queries, topk), 0

    async def aclose(self) -> None:  # noqa: B027  (optional hook; most backends hold nothing)
        """Release pooled connections."""
