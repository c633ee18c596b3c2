"""The `python` tool: run model-written code in a sandbox and show it what the code printed.

Stateless per call, REPL-style echo of a trailing bare expression, stdout (then stderr when the
code failed) truncated in the middle to `max_output_chars`, a wall-clock timeout that kills the
whole call, and empty output as a valid result (never re-executed). Code that raises is a valid
result too (`ok=True`); `ok=False` means the tool failed (timeout, a broken sandbox).

    >>> tool = PythonTool(timeout_s=5, preamble=("math",))
    >>> tool.run("x = 6*7\\nx").text
    '42'
    >>> tool.run("1/0").text.splitlines()[-1]
    'ZeroDivisionError: division by zero'
    >>> tool.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import threading
from typing import Any, Literal

from agent_envs.base.messages import MESSAGES
from agent_envs.base.tool import Tool, ToolResult
from agent_envs.tools.sandbox import BACKENDS, Sandbox, SandboxConfig, SandboxResult, make_sandbox


def truncate_middle(text: str, limit: int, dropped: int = 0) -> str:
    """Keep the head and tail of `text` within `limit` characters, marking what was cut."""
    if len(text) <= limit and not dropped:
        return text
    cut = max(0, len(text) - limit) + dropped
    marker = f"\n... [{cut} characters truncated] ...\n"
    keep = max(0, limit - len(marker))
    head = keep - keep // 2
    return text[:head] + marker + (text[len(text) - keep // 2 :] if keep // 2 else "")


def _seconds(value: float) -> str:
    return f"{value:g}"


class PythonTool(Tool):
    """Execute Python code in a sandbox (`backend="local"` warm workers, `"docker"`, or `"service"`).

    Args:
        timeout_s: wall-clock limit per call; the call is killed and answered with the timeout message.
        backend: "local" (namespaces + rlimits, milliseconds per call), "docker", or "service": the
            same local workers shared by many processes through `agent-envs serve-sandbox`
            (give `service_url="http://127.0.0.1:8100"`; its limits and preamble are the service's).
        preamble: modules imported once per worker and bound in every call, e.g. ("math", "numpy as np").
        max_output_chars: the observation is middle-truncated to this many characters.
        memory_mb: address-space limit (local: includes the preamble already loaded) / container memory.
        error_format: "full" traceback, or "last_line" (only the final error line, as GEM does).
        pool_size: warm workers / concurrent calls (default: min(8, CPUs); for "service", calls
            this tool sends at once).
        **sandbox_options: further `SandboxConfig` fields (fsize_mb, nproc, namespaces, docker_image, ...).
    """

    name = "python"
    argument = "code"
    description = "runs Python code and returns what it prints; a trailing expression is printed"

    def __init__(
        self,
        timeout_s: float = 10.0,
        backend: str = "local",
        preamble: tuple[str, ...] | list[str] = (),
        max_output_chars: int = 4000,
        memory_mb: int = 2048,
        error_format: Literal["full", "last_line"] = "full",
        pool_size: int | None = None,
        **sandbox_options: Any,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"PythonTool backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if error_format not in ("full", "last_line"):
            raise ValueError(f"PythonTool error_format must be 'full' or 'last_line', got {error_format!r}")
        if max_output_chars < 64:
            raise ValueError(f"PythonTool max_output_chars must be at least 64, got {max_output_chars}")
        unknown = set(sandbox_options) - set(SandboxConfig.__dataclass_fields__)
        if unknown:
            raise TypeError(f"PythonTool got unknown sandbox options {sorted(unknown)}; see SandboxConfig")
        if backend == "service" and not sandbox_options.get("service_url"):
            raise ValueError('PythonTool backend="service" needs service_url="http://HOST:PORT" (agent-envs serve-sandbox)')
        if pool_size is not None:
            sandbox_options["pool_size"] = pool_size
        self.config = SandboxConfig(
            timeout_s=timeout_s, memory_mb=memory_mb, preamble=tuple(preamble), **sandbox_options
        ).validate()
        self.timeout_s = float(timeout_s)
        self.backend = backend
        self.max_output_chars = max_output_chars
        self.error_format = error_format
        self._sandbox: Sandbox | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _ensure_started(self) -> tuple[Sandbox, concurrent.futures.ThreadPoolExecutor]:
        with self._lock:
            if self._sandbox is None:
                self._sandbox = make_sandbox(self.backend, self.config)
            if self._executor is None:
                # Calls block on worker pipes; one thread per warm worker bounds concurrency.
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self.config.pool_size, thread_name_prefix="python-sandbox"
                )
            return self._sandbox, self._executor

    @property
    def isolation(self) -> dict[str, Any]:
        """The guarantees the sandbox reported (empty before the first call)."""
        return self._sandbox.isolation if self._sandbox is not None else {}

    async def call(self, code: str) -> ToolResult:
        if not code.strip():
            return ToolResult(
                text=MESSAGES["empty_call"].format(tool=self.name), ok=False, error="empty_call"
            )
        sandbox, executor = self._ensure_started()
        result = await asyncio.get_running_loop().run_in_executor(
            executor, sandbox.execute, code, self.timeout_s
        )
        return self.format_result(result)

    def format_result(self, result: SandboxResult) -> ToolResult:
        """What the model reads, from what the sandbox produced."""
        meta: dict[str, Any] = {
            "exit_code": result.exit_code,
            "elapsed_s": result.elapsed_s,
            **result.metadata,
        }
        if result.error:
            text = MESSAGES["tool_error"].format(tool=self.name, reason=result.error)
            return ToolResult(text=text, ok=False, error="sandbox", metadata=meta)
        text = result.stdout
        failed = result.timed_out or result.exit_code != 0
        if failed:
            stderr = result.stderr
            if self.error_format == "last_line":
                lines = [line for line in stderr.splitlines() if line.strip()]
                stderr = lines[-1] + "\n" if lines else ""
            if result.exit_code is not None and result.exit_code < 0:
                try:
                    name = signal.Signals(-result.exit_code).name
                except ValueError:
                    name = f"signal {-result.exit_code}"
                stderr += f"Process killed by {name}.\n"
            text = text + ("\n" if text and not text.endswith("\n") and stderr else "") + stderr
        text = text.strip("\n")
        if result.timed_out:
            message = MESSAGES["timeout"].format(seconds=_seconds(self.timeout_s))
            text = truncate_middle(text, self.max_output_chars - len(message) - 1, result.dropped_bytes)
            return ToolResult(
                text=(text + "\n" + message) if text else message, ok=False, error="timeout", metadata=meta
            )
        if not text.strip():
            return ToolResult(text=MESSAGES["no_output"], metadata=meta)
        return ToolResult(
            text=truncate_middle(text, self.max_output_chars, result.dropped_bytes), metadata=meta
        )

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        """Stop the warm workers and the call threads (blocking); the tool restarts them if used again."""
        with self._lock:
            sandbox, executor = self._sandbox, self._executor
            self._executor = None
        if executor is not None:
            executor.shutdown(wait=True)
        if sandbox is not None:
            sandbox.close()


__all__ = ["PythonTool", "truncate_middle"]
