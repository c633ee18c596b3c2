"""The `python` tool: run model-written code in a sandbox and show it what the code printed.

Stateless per call by default; with `session=True` an episode's calls share one interpreter (a
`PythonSession`, see below). REPL-style echo of a trailing bare expression, stdout (then stderr when the
code failed) truncated in the middle to `max_output_chars`, a wall-clock timeout that kills the
whole call, and empty output as a valid result (never re-executed). Code that raises is a valid
result too (`ok=True`); `ok=False` means the tool failed (timeout, a broken sandbox).

    >>> tool = PythonTool(timeout_s=5, preamble=("math",))
    >>> tool.run("x = 6*7\\nx").text
    '42'
    >>> tool.run("1/0").text.splitlines()[-1]
    'ZeroDivisionError: division by zero'
    >>> tool.close()

A session keeps variables, imports and files from call to call, and forks: the fork starts from
the interpreter as it stood (on the local backend a copy-on-write `os.fork` of the live process;
elsewhere a replay of the cells that ran) and neither sees the other's later changes.

    >>> tool = PythonTool(timeout_s=5, session=True, pool_size=1)
    >>> session = tool.open_session()
    >>> session.run("x = 41").text
    'Code ran successfully with no output.'
    >>> twin = session.fork()
    >>> twin.run("x += 1; x").text, session.run("x").text
    ('42', '41')
    >>> tool.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import secrets
import signal
import threading
import weakref
from typing import Any, Literal

from agent_envs.base.messages import MESSAGES
from agent_envs.base.tool import Tool, ToolResult
from agent_envs.tools.sandbox import BACKENDS, Sandbox, SandboxConfig, SandboxResult, make_sandbox
from agent_envs.tools.sandbox.sessions import SessionLost


def truncate_middle(text: str, limit: int, dropped: int = 0) -> str:
    """Keep the head and tail of `text` within `limit` characters, marking what was cut."""
    if len(text) <= limit and not dropped:
        return text
    cut = max(0, len(text) - limit) + dropped
    marker = f"\n... [{cut} characters truncated] ...\n"
    keep = max(0, limit - len(marker))
    head = keep - keep // 2
    return text[:head] + marker + (text[len(text) - keep // 2 :] if keep // 2 else "")


SESSION_NPROC = 1024  # the default `nproc` of a session tool (see PythonTool.__init__)


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
        session: stateful calls: an env opens a `PythonSession` per episode (`open_session`), and
            calls made on the tool itself share one default session until `close()`. Its `nproc`
            defaults to 1024, since many live sessions share the sandbox uid's process budget.
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
        session: bool = False,
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
        if session:
            # As root every live interpreter (and each family's init) is a process of the one
            # sandbox uid, which RLIMIT_NPROC caps as a whole: 64 would stop at ~30 live sessions.
            sandbox_options.setdefault("nproc", SESSION_NPROC)
        self.config = SandboxConfig(
            timeout_s=timeout_s, memory_mb=memory_mb, preamble=tuple(preamble), **sandbox_options
        ).validate()
        self.timeout_s = float(timeout_s)
        self.backend = backend
        self.max_output_chars = max_output_chars
        self.error_format = error_format
        self.session = bool(session)
        self._default_session: PythonSession | None = None
        self._closer: concurrent.futures.ThreadPoolExecutor | None = None
        self._sandbox: Sandbox | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Reentrant: a dropped session's finalizer may run (and ask for `_background`) anywhere.
        self._lock = threading.RLock()

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
        if self.session:
            with self._lock:
                if self._default_session is None:
                    self._default_session = PythonSession(self)
            return await self._default_session.call(code)
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

    def open_session(self) -> PythonSession:
        """A new, empty session (its interpreter starts on its first call)."""
        return PythonSession(self)

    def fork_session(self, session: PythonSession, seed: int | None = None) -> PythonSession:
        """`session.fork(seed)`."""
        return session.fork(seed)

    def close_session(self, session: PythonSession) -> None:
        """`session.close()`."""
        session.close()

    def _background(self) -> concurrent.futures.ThreadPoolExecutor:
        """One thread that closes sessions in the order asked, off the caller's event loop."""
        with self._lock:
            if self._closer is None:
                self._closer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="python-session-close")
            return self._closer

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        """Stop the warm workers, every session and the call threads (blocking); the tool restarts
        them if used again."""
        with self._lock:
            default, self._default_session = self._default_session, None
        if default is not None:
            default.close()
        with self._lock:
            sandbox, executor, closer = self._sandbox, self._executor, self._closer
            self._executor = self._closer = None
        for pool in (executor, closer):
            if pool is not None:
                pool.shutdown(wait=True)
        if sandbox is not None:
            sandbox.close()


REPLAY_PRELUDE = """\
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    for cell in cells:
        try:
            exec(compile(cell, "<cell>", "exec"), ns)
        except BaseException:
            pass
"""


def replay_program(cells: list[str], code: str) -> str:
    """`code`, preceded by one line that reruns `cells` silently in the same globals.

    A replayed session shows what its cells print now, so time, randomness and anything else
    outside the code may differ from the first run; a traceback of `code` counts one line more.
    """
    if not cells:
        return code
    return f"exec({REPLAY_PRELUDE!r}, {{'cells': {cells!r}, 'ns': globals()}})\n{code}"


def _resolve(sid: str | concurrent.futures.Future | None) -> str | None:
    """A session id, waiting for it if a fork is still taking it (None if that fork failed)."""
    if isinstance(sid, concurrent.futures.Future):
        try:
            return sid.result()
        except Exception:  # SessionLost, WorkerError
            return None
    return sid


def _release(tool_ref: weakref.ref, state: dict) -> None:
    """Close a session's interpreter in the background, after its pending forks were taken."""
    tool = tool_ref()
    sid, forks = state.get("sid"), list(state.get("forks", ()))
    state.update(sid=None, forks=[])
    if tool is None or sid is None or tool._sandbox is None or not tool._sandbox.native_sessions:
        return
    sessions = tool._sandbox.sessions

    def close() -> None:
        concurrent.futures.wait(forks)
        remote = _resolve(sid)
        if remote is not None:
            sessions.close(remote)

    with contextlib.suppress(RuntimeError):  # the tool is closing: its sandbox ends every session
        tool._background().submit(close)


def _fork_from(sessions: Any, source: str | concurrent.futures.Future, seed: int) -> str:
    remote = _resolve(source)
    if remote is None:
        raise SessionLost("the session to fork from was lost")
    return sessions.fork(remote, seed)


class PythonSession(Tool):
    """One episode's interpreter, behind the `python` tool's name: variables, imports and files
    persist from call to call until `close()`.

    On the local backend the interpreter is a live sandboxed process and `fork()` is a
    copy-on-write fork of it (`sandbox/session_host.py`). On the other backends each call reruns
    the cells that ran before it, silently, then runs the new one (`replay_program`). A session
    whose interpreter was lost (killed at the deadline, by a signal, or with its worker) starts
    over empty and says so in the observation (`MESSAGES["session_reset"]`), never by raising.
    """

    name = "python"
    argument = PythonTool.argument
    description = PythonTool.description

    def __init__(self, tool: PythonTool, cells: list[str] | None = None) -> None:
        self.tool = tool
        self.timeout_s = tool.timeout_s
        self.cells: list[str] = list(cells or [])  # the cells that ran, for a replay
        self._replay = bool(self.cells)  # a native interpreter to rebuild from `cells` first
        # "sid": the interpreter's id, or the Future of a fork still taking it; "forks": forks of
        # this session not yet taken (its next call and its close wait for them). Shared with the
        # finalizer, which closes an interpreter whose session was dropped without close().
        self._state: dict[str, Any] = {"sid": None, "forks": []}
        self._lock = threading.Lock()
        weakref.finalize(self, _release, weakref.ref(tool), self._state)

    async def call(self, code: str) -> ToolResult:
        if not code.strip():
            return ToolResult(text=MESSAGES["empty_call"].format(tool=self.name), ok=False, error="empty_call")
        sandbox, executor = self.tool._ensure_started()
        return await asyncio.get_running_loop().run_in_executor(executor, self._run, sandbox, code)

    def _take_sid(self) -> str | None:
        """The interpreter's id once a pending fork gave it (a failed fork: rebuild by replay),
        after this session's own pending forks were taken (they copy the state they were asked at)."""
        pending = self._state["sid"]
        if isinstance(pending, concurrent.futures.Future):
            self._state["sid"] = _resolve(pending)
            self._replay = self._state["sid"] is None and bool(self.cells)
        concurrent.futures.wait(self._state["forks"])
        self._state["forks"] = []
        return self._state["sid"]

    def _run(self, sandbox: Sandbox, code: str) -> ToolResult:
        with self._lock:
            if not sandbox.native_sessions:
                result = sandbox.execute(replay_program(self.cells, code), self.timeout_s)
                if not (result.timed_out or result.error):  # a cell that timed out would again
                    self.cells.append(code)
                return self.tool.format_result(result)
            sid, notice = self._take_sid(), None
            for attempt in (1, 2):
                if sid is None:
                    try:
                        sid = self._state["sid"] = sandbox.sessions.open()
                    except Exception as exc:  # WorkerError, SessionLost: a failed call, not a crash
                        reason = f"cannot start a session: {exc}"
                        return ToolResult(MESSAGES["tool_error"].format(tool=self.name, reason=reason),
                                          ok=False, error="sandbox")
                    if self._replay:
                        self._replay = False
                        sandbox.sessions.run(sid, replay_program(self.cells, "pass"), self.timeout_s)
                result = sandbox.sessions.run(sid, code, self.timeout_s)
                lost = result.metadata.get("session_lost")
                if lost and not result.metadata.get("session_ran") and attempt == 1:
                    # Gone before this cell (killed between calls, its worker died): start over, say so.
                    sandbox.sessions.close(sid)
                    sid = self._state["sid"] = None
                    self.cells = []
                    notice = MESSAGES["session_reset"].format(reason=f"the interpreter was lost: {lost}")
                    continue
                break
            if lost and not result.metadata.get("session_ran"):  # a fresh interpreter was lost too
                sandbox.sessions.close(sid)
                self._state["sid"], self.cells = None, []
                reason = f"the session was lost twice: {lost}"
                return ToolResult(MESSAGES["tool_error"].format(tool=self.name, reason=reason), ok=False,
                                  error="sandbox", metadata={"session_reset": lost})
            formatted = self.tool.format_result(result)
            if lost:
                sandbox.sessions.close(sid)  # the worker has ended it; forget it here too
                self._state["sid"], self.cells = None, []
                formatted.text += "\n" + MESSAGES["session_reset"].format(reason=lost)
                formatted.metadata["session_reset"] = lost
                formatted.ok, formatted.error = False, formatted.error or "session_reset"
            else:
                self.cells.append(code)
            if notice:
                formatted.text = notice + "\n" + formatted.text
                formatted.metadata.setdefault("session_reset", notice)
            return formatted

    def fork(self, seed: int | None = None) -> PythonSession:
        """A session that starts from this one as it stands now, with its own random seed.

        Returns at once: the copy is taken in the background before this session's next call or
        close, so an env forks between two steps without waiting on the sandbox.
        """
        seed = secrets.randbits(31) if seed is None else int(seed)
        with self._lock:
            twin = PythonSession(self.tool, self.cells)
            sandbox, source = self.tool._sandbox, self._state["sid"]
            if sandbox is None or not sandbox.native_sessions or source is None:
                return twin  # nothing live to copy: the cells (if any) are replayed
            _, executor = self.tool._ensure_started()
            twin._replay = False
            twin._state["sid"] = future = executor.submit(_fork_from, sandbox.sessions, source, seed)
            self._state["forks"].append(future)
            return twin

    def close(self) -> None:
        """End the interpreter (in the background); the session starts empty if called again."""
        with self._lock:
            _release(weakref.ref(self.tool), self._state)
            self.cells = []
            self._replay = False


__all__ = ["PythonSession", "PythonTool", "replay_program", "truncate_middle"]
