"""Record every tool result of an evaluation, and replay them offline.

`ToolRecording(path, "record")` wraps an env's tools so that each result is appended to a JSONL
file as it arrives (a crash loses nothing already answered). `ToolRecording(path, "replay")`
serves those results without running the tool: no search API, retrieval server, browser or
sandbox is needed. Together with recorded judge verdicts and sampling seeds (see
`agent-envs evaluate --record/--replay`, docs/training.md), an evaluation re-runs offline and
reproduces its scores exactly.

A call is keyed by the tool's name and its normalised argument: the key the env itself uses to
spot repeated queries. What replay guarantees, and what it does not:
- a call the recording holds gets the recorded text, `ok` and `error` back;
- a call it lacks (the model wrote something new) becomes an error observation, counted as
  `missing`; it never runs the real tool;
- a call that outlived the env's timeout while recording times out again, with the same message;
- a call that got different answers while recording (Python printing the time or a random
  number) replays its first answer and is counted as `ambiguous`.

    >>> import asyncio, tempfile
    >>> from agent_envs.base.tool import Tool, ToolResult
    >>> class Upper(Tool):
    ...     name = "upper"
    ...     async def call(self, arg):
    ...         return ToolResult(arg.upper())
    >>> path = tempfile.mkdtemp() + "/tools.jsonl"
    >>> with ToolRecording(path, "record") as rec:
    ...     asyncio.run(rec.wrap(Upper())("abc")).text
    'ABC'
    >>> replay = ToolRecording(path, "replay")
    >>> tool = replay.wrap(Upper())
    >>> asyncio.run(tool("abc")).text, asyncio.run(tool("xyz")).error
    ('ABC', 'not_recorded')
    >>> replay.stats()
    {'recorded': 0, 'replayed': 1, 'missing': 1, 'ambiguous': 0}
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any, Literal

from agent_envs.base.tool import Tool, ToolResult

NOT_RECORDED = "{tool} call not in the recording (replay runs no tools): {arg!r}"


class ToolRecording:
    """Tool results kept in a JSONL file: one line per call while recording, served in replay."""

    def __init__(self, path: str | Path, mode: Literal["record", "replay"]) -> None:
        if mode not in ("record", "replay"):
            raise ValueError(f"ToolRecording mode must be 'record' or 'replay', got {mode!r}")
        self.path = Path(path)
        self.mode = mode
        self._lock = threading.Lock()
        self._answers: dict[str, list[dict[str, Any]]] = {}
        self._counts = {"recorded": 0, "replayed": 0, "missing": 0, "ambiguous": 0}
        self._file = None
        if mode == "replay":
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (open for the run: close())

    def _load(self) -> None:
        if not self.path.is_file():
            raise FileNotFoundError(
                f"{self.path}: no tool recording here; record one with `agent-envs evaluate --record DIR`"
            )
        with open(self.path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    key = _key(row["tool"], row["arg"])
                    answer = {"text": row["text"], "ok": row["ok"], "error": row["error"],
                              "timed_out": bool(row.get("timed_out"))}
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(
                        f"{self.path}, line {n}: not a tool recording row ({e}); it needs tool, arg, text, ok, error"
                    ) from None
                if answer not in (seen := self._answers.setdefault(key, [])):
                    seen.append(answer)
        self._counts["ambiguous"] = sum(len(v) > 1 for v in self._answers.values())

    def wrap(self, tool: Tool) -> Tool:
        """The tool as the env should see it: same name and argument policy, calls recorded or replayed."""
        return _RecordedTool(tool, self)  # type: ignore[return-value]  (a proxy with Tool's interface)

    def stats(self) -> dict[str, int]:
        return dict(self._counts)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> ToolRecording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the wrapped tools call ------------------------------------------------------------

    def _store(self, tool: Tool, arg: str, result: ToolResult | None) -> None:
        """`result` None: the env cancelled the call at its timeout."""
        row = {"tool": tool.name, "arg": tool.normalize(arg), "text": result.text if result else "",
               "ok": bool(result and result.ok), "error": result.error if result else "timeout",
               "timed_out": result is None}
        with self._lock:
            if self._file is None:
                raise RuntimeError(f"{self.path}: the recording is closed")
            self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
            self._file.flush()
            self._counts["recorded"] += 1

    def _serve(self, tool: Tool, arg: str) -> ToolResult:
        answers = self._answers.get(_key(tool.name, tool.normalize(arg)))
        with self._lock:
            self._counts["replayed" if answers else "missing"] += 1
        if not answers:
            return ToolResult(NOT_RECORDED.format(tool=tool.name, arg=arg[:200]), ok=False, error="not_recorded")
        first = answers[0]
        if first["timed_out"]:
            # the env's own timeout handling turns this into the observation it gave while recording
            raise TimeoutError(f"{tool.name} timed out while recording")
        return ToolResult(first["text"], ok=first["ok"], error=first["error"], cached=True)


def _key(tool: str, arg: str) -> str:
    return json.dumps([tool, arg], ensure_ascii=False)


class _RecordedTool:
    """Delegates everything to the real tool except the call itself."""

    def __init__(self, tool: Tool, recording: ToolRecording) -> None:
        self._tool = tool
        self._recording = recording

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tool, name)

    async def __call__(self, arg: str) -> ToolResult:
        if self._recording.mode == "replay":
            return self._recording._serve(self._tool, arg)
        try:
            result = await self._tool(arg)
        except asyncio.CancelledError:
            self._recording._store(self._tool, arg, None)
            raise
        self._recording._store(self._tool, arg, result)
        return result
