"""What the env families share: one instance per configuration of the expensive things they use
(shared within a process), and the settings of a family that plays a benchmark or a task file.

`gymnasium.make` builds a new env each call; a vector of 64 envs must not start 64 sandbox
pools or build 64 BM25 indexes. Tools and worlds are stateless between calls, so envs with the
same configuration share one instance.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agent_envs.base.config import UserError, option
from agent_envs.base.task import Task
from agent_envs.core.env_config import ToolEnvConfig

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


def world_with_tools(world_cls: Any, config: Any) -> tuple[Any, list]:
    """The shared procedural world of this (checked) config and the shared tools it needs."""
    key = dataclasses.asdict(config)
    world = shared(f"world:{world_cls.name}", lambda **_: world_cls(config), **key)
    tools = shared(f"tools:{world_cls.name}", lambda **_: world.make_tools(), **key)
    return world, tools


@dataclass
class TaskFileConfig(ToolEnvConfig):
    """The settings of a family that plays a named benchmark, a file or given tasks instead of
    its world (math, QA, search)."""

    benchmark: str | None = option(None, "a named benchmark to play instead of the world (aime24, hotpotqa, "
                                   "gaia, ...): its data folder's files (docs/benchmarks-data.md)")
    data_files: str | list[str] | None = option(None, "your own JSONL task file(s) (question, answer) to play "
                                                "instead of the world, or a benchmark's file")
    split: str | None = option(None, "the benchmark's split (null: its default)")
    tasks: list[Task] | None = option(None, "a list of agent_envs.Task to play (Python only)")

    def validate(self) -> None:
        super().validate()
        if self.tasks is not None and (self.benchmark is not None or self.data_files is not None):
            raise UserError("env_kwargs: pass either tasks=[...] or benchmark=/data_files=, not both")

    def task_source(self, reward: str) -> Any:
        """The tasks given, the named benchmark or the user's file; None means "play the world"."""
        if self.tasks is not None:
            return list(self.tasks)
        if self.benchmark is None and self.data_files is None:
            return None
        from agent_envs.data import load_benchmark, load_tasks

        if self.benchmark is not None:
            return load_benchmark(self.benchmark, data_files=self.data_files, split=self.split)
        return load_tasks(self.data_files, reward=reward)


def python_tool(settings: dict | None = None) -> Any:
    """The shared sandboxed Python tool; `settings` are `PythonTool` keyword arguments."""
    from agent_envs.tools.python import PythonTool

    return shared("tool:python", PythonTool, **{"timeout_s": 10.0, "preamble": ("math",), **dict(settings or {})})
