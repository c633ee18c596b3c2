"""Pooled aiohttp sessions and retried HTTP requests, shared by every client of ours that speaks HTTP.

Tools are called from whatever event loop the caller runs (the env's background loop, a test's
loop, `asyncio.run` inside `Tool.run`). An aiohttp session belongs to one loop, so the pool keeps
one session per loop and drops sessions whose loop has closed. Retries (as SkyRL retries search):
transient failures only (HTTP 5xx and 429, connection errors, timeouts), linear back-off. A
connection that cannot be opened at all (refused, unknown host) gets only a few quick retries: a
server that is down stays down for longer than a long back-off would wait, and the caller should
hear "connection refused" within a second or two rather than a timeout much later. A caller's
`budget_s` bounds attempts and back-off together, so a call never outlives its tool's timeout and
still reports what went wrong (see `with_retries`).

    >>> import asyncio
    >>> pool = SessionPool()
    >>> async def main():
    ...     s = await pool.get()
    ...     same = s is await pool.get()
    ...     await pool.aclose()
    ...     return same
    >>> asyncio.run(main())
    True
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

T = TypeVar("T")


class TransientError(Exception):
    """A failure worth retrying (5xx, 429, dropped connection, timeout); `retries` were spent on it.

    `kind` names the cause for metrics: `http_<status>`, `timeout`, `refused`, `connect`, `reset`,
    `disconnected`, `truncated` or `connection` (any other dropped connection).
    """

    def __init__(self, message: str, retries: int = 0, kind: str = "transient") -> None:
        super().__init__(message)
        self.retries = retries
        self.kind = kind


class PermanentError(Exception):
    """A failure that retrying cannot fix (4xx, a body that is not the expected answer); `retries`
    were spent on transient failures before it."""

    def __init__(self, message: str, kind: str = "bad_response", retries: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.retries = retries


class SessionPool:
    """One pooled `aiohttp.ClientSession` per running event loop.

    A session is closed by `aclose`, or when its loop shuts down through `asyncio.run` (which
    finalises the loop's async generators; the pool parks one per session for that purpose).
    """

    def __init__(self, limit: int = 64, headers: dict[str, str] | None = None) -> None:
        self.limit = limit
        self.headers = dict(headers or {})
        self._sessions: dict[int, tuple[asyncio.AbstractEventLoop, aiohttp.ClientSession, Any]] = {}

    async def get(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        self._drop_dead()
        entry = self._sessions.get(id(loop))
        if entry is not None and entry[0] is loop and not entry[1].closed:
            return entry[1]
        connector = aiohttp.TCPConnector(limit=self.limit, limit_per_host=self.limit, ttl_dns_cache=300)
        session = aiohttp.ClientSession(connector=connector, headers=self.headers)
        closer = _close_at_loop_shutdown(session)
        await closer.__anext__()  # now the loop knows it, and finalises it in shutdown_asyncgens()
        self._sessions[id(loop)] = (loop, session, closer)
        return session

    def _drop_dead(self) -> None:
        for key, (loop, session, _) in list(self._sessions.items()):
            if loop.is_closed():
                # The loop closed without finalising its generators (a hand-made loop): close
                # the connector synchronously so the session is not reported as leaked.
                with contextlib.suppress(Exception):
                    if session.connector is not None:
                        session.connector._close()
                del self._sessions[key]

    async def aclose(self) -> None:
        """Close the current loop's session (and forget those of closed loops)."""
        self._drop_dead()
        loop = asyncio.get_running_loop()
        entry = self._sessions.pop(id(loop), None)
        if entry is not None:
            await entry[1].close()
            await entry[2].aclose()


async def _close_at_loop_shutdown(session: aiohttp.ClientSession) -> AsyncIterator[None]:
    try:
        yield
    finally:
        if not session.closed:
            await session.close()


class LoopSemaphore:
    """A concurrency limit that works from any event loop (asyncio primitives bind to one)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"concurrency limit must be >= 1, got {limit}")
        self.limit = limit
        self._sems: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = {}

    def get(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        entry = self._sems.get(id(loop))
        if entry is None or entry[0] is not loop:
            for key, (old, _) in list(self._sems.items()):
                if old.is_closed():
                    del self._sems[key]
            entry = (loop, asyncio.Semaphore(self.limit))
            self._sems[id(loop)] = entry
        return entry[1]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries for idempotent requests: `max_retries` extra attempts, sleeping `backoff_s * attempt`.

    A connection that could not be opened is retried at most `connect_retries` times (and never
    more than `max_retries`), sleeping `connect_backoff_s * attempt`: about 1.2 s in all by default.
    `attempt_timeout_s` limits each attempt (None: only the caller's budget limits it).
    """

    max_retries: int = 10
    backoff_s: float = 1.0
    max_backoff_s: float = 10.0
    connect_retries: int = 3
    connect_backoff_s: float = 0.2
    attempt_timeout_s: float | None = None


async def with_retries(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    describe: str = "",
    budget_s: float | None = None,
) -> tuple[T, int]:
    """Run `attempt` until it succeeds or a permanent error; returns (value, retries used).

    `budget_s` bounds the whole call, attempts and back-off together: the last attempt is cut at
    the budget, and a retry whose back-off would end past it is not started. The caller then
    hears the cause of the last failure (an HTTP 500, a reset) rather than only "timeout".
    Raises a `TransientError` (cause, `kind` and `retries`) once retries or budget are spent, or
    a `PermanentError` at once.
    """
    loop = asyncio.get_running_loop()
    deadline = None if budget_s is None else loop.time() + budget_s
    retries = 0
    while True:
        limit, budget_bound = policy.attempt_timeout_s, False
        if deadline is not None:
            remaining = max(deadline - loop.time(), 0.0)
            if limit is None or remaining <= limit:
                limit, budget_bound = remaining, True
        try:
            async with asyncio.timeout(limit):
                return await attempt(), retries
        except PermanentError as exc:
            exc.retries = retries
            raise
        except aiohttp.ClientResponseError as exc:  # a broken server or site, not a busy one
            prefix = f"{describe}: " if describe else ""
            if isinstance(exc, aiohttp.TooManyRedirects):
                raise PermanentError(f"{prefix}too many redirects", "redirects", retries) from exc
            complaint = _parser_complaint(exc.message)
            raise PermanentError(f"{prefix}malformed HTTP response ({complaint})", retries=retries) from exc
        except (TransientError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            shown_limit = budget_s if budget_bound else limit
            error = exc if isinstance(exc, TransientError) else _transient(exc, describe, shown_limit)
            error.retries = retries
            cause = None if error is exc else exc
            if budget_bound and isinstance(exc, TimeoutError):
                raise error from cause  # the budget is spent
            connect = isinstance(exc, aiohttp.ClientConnectorError)  # nothing was sent: retry briefly
            cap = min(policy.connect_retries, policy.max_retries) if connect else policy.max_retries
            if retries >= cap:
                raise error from cause
            pause = min((policy.connect_backoff_s if connect else policy.backoff_s) * (retries + 1),
                        policy.max_backoff_s)  # fmt: skip
            if retries == 0 and error.kind in ("disconnected", "reset", "connection"):
                pause = 0.0  # most often a pooled keep-alive connection the server had dropped
            if deadline is not None and loop.time() + pause >= deadline:
                left = deadline - loop.time()
                error.args = (f"{error} (no retry: {left:.1f} s of the budget left, back-off {pause:g} s)",)
                raise error from cause
            retries += 1
            await asyncio.sleep(pause)


def _transient(exc: BaseException, describe: str, timeout_s: float | None) -> TransientError:
    """Name the cause of a network failure the way a person would want to read it."""
    prefix = f"{describe}: " if describe else ""
    if isinstance(exc, TimeoutError):
        after = f" after {timeout_s:.2g} s" if timeout_s is not None else ""
        return TransientError(f"{prefix}timeout{after}", kind="timeout")
    if isinstance(exc, aiohttp.ClientConnectorError):
        origin = f"{exc.host}:{exc.port}"
        if isinstance(exc.os_error, ConnectionRefusedError):
            return TransientError(
                f"{prefix}connection refused by {origin} (is the server running?)", kind="refused"
            )
        reason = exc.os_error.strerror or type(exc.os_error).__name__
        return TransientError(f"{prefix}cannot connect to {origin} ({reason})", kind="connect")
    if isinstance(exc, aiohttp.ClientPayloadError):
        # aiohttp says how much of the body came: "(received 13 of 1000 bytes)"
        got = re.search(r"\(received \d+ of \d+ bytes\)", str(exc))
        detail = f" {got.group(0)}" if got else ""
        if "reset" in str(exc).lower():
            return TransientError(f"{prefix}connection reset mid-response{detail}", kind="reset")
        return TransientError(f"{prefix}response cut off before its end{detail}", kind="truncated")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return TransientError(f"{prefix}server closed the connection without answering", kind="disconnected")
    if isinstance(exc, OSError) and exc.errno == errno.ECONNRESET:
        return TransientError(f"{prefix}connection reset before an answer", kind="reset")
    if isinstance(exc, OSError):  # e.g. "Can not write request body": the connection broke while sending
        return TransientError(f"{prefix}connection lost: {exc.strerror or exc}", kind="connection")
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return TransientError(f"{prefix}{text}", kind="connection")


def _parser_complaint(text: str) -> str:
    """aiohttp's multi-line parser message (with a caret line) on one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip().strip("^")]
    return " ".join(lines)[:200] or "unreadable status line"


def raise_for_status(status: int, url: str, body: str = "") -> None:
    """Classify an HTTP status: 5xx/429 are transient, other 4xx permanent."""
    if status < 400:
        return
    snippet = " ".join(body.split())[:200]
    message = f"HTTP {status} from {url}" + (f": {snippet}" if snippet else "")
    if status >= 500 or status == 429:
        raise TransientError(message, kind=f"http_{status}")
    raise PermanentError(message, kind=f"http_{status}")


def request_id() -> str:
    """A short id sent as `X-Request-Id` so client and server logs can be matched."""
    return uuid.uuid4().hex[:12]


def json_or_error(body: bytes | str, url: str) -> Any:
    """The JSON value of an answer, or a `PermanentError` quoting the start of what came instead."""
    # JSON is UTF-8 (RFC 8259); undecodable bytes are shown, not raised as UnicodeDecodeError
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PermanentError(
            f"invalid JSON from {url} ({exc.msg} at char {exc.pos}): {text[:120]!r}"
        ) from exc
