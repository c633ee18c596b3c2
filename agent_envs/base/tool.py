"""The tool interface every tool implements, and the result it returns.

A tool takes one string argument (code, a query, a URL) and returns a `ToolResult`. It is async,
because tools are I/O; `run` is the blocking convenience. A tool never raises for a bad argument
or a failing backend: the failure is a result whose `text` the model reads.

    >>> class Echo(Tool):
    ...     name = "echo"
    ...     async def call(self, arg: str) -> ToolResult:
    ...         return ToolResult(text=arg)
    >>> Echo().run("hi").text
    'hi'

Each tool declares its own policy, so adding one touches no other file: its `name` is its tag
(`<name>...</name>` inline, the function name in JSON calls), `clean_argument` says how the text
the model wrote becomes the argument, and `dedupe_repeats` whether a repeated identical call
(same `normalize` form) is answered with a reminder instead of running again.

    >>> "echo" in known_tool_tags()
    True
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

# Tags of every Tool class defined so far, in definition order. Protocols use it to notice a call
# of a tool the env did not enable (it is flagged, not run) and to check the format of responses.
# A new tuple only when a new tag appears, so protocols can key what they derive on its identity.
_KNOWN_TAGS: tuple[str, ...] = ()


def known_tool_tags() -> tuple[str, ...]:
    """The tags of all tool classes defined in this process (the built-in tools are always among them)."""
    return _KNOWN_TAGS


@dataclass
class ToolResult:
    """What a tool call produced.

    `text` is exactly what the model sees (before the protocol wraps it). `ok` is False for
    failures of the tool or its backend (timeouts, HTTP errors, a crashing sandbox), not for code
    that raised inside the sandbox: that is a valid result the model should read.
    `error` is a short machine-readable kind (`timeout`, `http`, `no_results`, ...).
    """

    text: str
    ok: bool = True
    error: str | None = None
    latency_s: float = 0.0
    cached: bool = False
    retries: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)


class Tool(ABC):
    """Base class of tools.

    Subclasses set `name` (the protocol tag / function name, e.g. ``python``), `argument` (the
    JSON argument name for function-calling protocols) and `description`, and implement `call`.
    They may override `clean_argument`, `argument_text`, `normalize` and `dedupe_repeats` (the
    tool's policy).
    `__call__` adds latency measurement and turns any exception into a failed result, so one
    buggy backend never takes down a rollout.
    """

    name: ClassVar[str] = "tool"
    argument: ClassVar[str] = "input"
    description: ClassVar[str] = ""
    # Wall-clock budget the env enforces around a call (the tool may enforce a tighter one).
    timeout_s: float = 30.0
    # A repeated identical call is not run again: the env answers MESSAGES["repeated_query"]
    # (it still counts toward the call limits). Worth it for lookups, wrong for code.
    dedupe_repeats: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        global _KNOWN_TAGS
        if "name" in cls.__dict__ and cls.name not in _KNOWN_TAGS:
            _KNOWN_TAGS = (*_KNOWN_TAGS, cls.name)

    @abstractmethod
    async def call(self, arg: str) -> ToolResult: ...

    def clean_argument(self, text: str) -> str:
        """The argument to call with, from the text the model wrote inside the call (already taken
        out of the protocol's tags or JSON). An empty result is an empty call."""
        return text.strip()

    def argument_text(self, arguments: dict[str, Any]) -> str:
        """The text a function call (JSON protocols) passes on, from its `arguments` object: our
        tools take one string, so its lone value; several values as JSON; none as an empty call."""
        if len(arguments) == 1:
            return str(next(iter(arguments.values())))
        return json.dumps(arguments) if arguments else ""

    def normalize(self, arg: str) -> str:
        """Canonical form of an argument, used for repeated-call detection and cache keys."""
        return arg.strip()

    async def __call__(self, arg: str) -> ToolResult:
        start = time.perf_counter()
        try:
            result = await self.call(arg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a tool bug must become an observation, not a crashed rollout
            result = ToolResult(
                text=f"{self.name} failed: {type(exc).__name__}: {exc}", ok=False, error="exception"
            )
        if not result.latency_s:
            result.latency_s = time.perf_counter() - start
        return result

    def run(self, arg: str) -> ToolResult:
        """Blocking call; works with or without a running event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self(arg))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, self(arg)).result()

    async def aclose(self) -> None:  # noqa: B027 (optional hook: most tools hold nothing)
        """Release pooled resources (HTTP sessions, worker processes)."""

    def spec(self) -> dict[str, Any]:
        """OpenAI/Hermes function schema, for JSON tool-call protocols."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {self.argument: {"type": "string"}},
                    "required": [self.argument],
                },
            },
        }
