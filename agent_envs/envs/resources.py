"""One instance per configuration of the expensive things envs use, shared within a process.

`gymnasium.make` builds a new env each call; a vector of 64 envs must not start 64 sandbox
pools or build 64 BM25 indexes. Tools and worlds are stateless between calls, so envs with the
same configuration share one instance.
"""

from __future__ import annotations

import dataclasses
import inspect
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


def world_with_tools(kind: str, world_cls: Any, config_cls: Any, kwargs: dict | None) -> tuple[Any, list]:
    """The shared procedural world of this configuration and the shared tools it needs.

    `kwargs` (the env's `world=` mapping) is checked key by key against the world's config, so a
    misspelt field names the closest one instead of failing inside a constructor."""
    from agent_envs.worlds.base import world_config

    kwargs = dataclasses.asdict(world_config(config_cls, kwargs, where=f"{kind} world"))
    world = shared(f"world:{kind}", lambda **kw: world_cls(config_cls(**kw)), **kwargs)
    tools = shared(f"tools:{kind}", lambda **_: world.make_tools(), **kwargs)
    return world, tools


def check_env_keywords(factory: Callable[..., Any], env_kwargs: dict[str, Any]) -> None:
    """Refuse keywords that neither `factory` nor `ToolEnv` takes, naming the closest one (what
    `gymnasium.make(id, **kwargs)` hands on to `ToolEnv` would otherwise end in a TypeError)."""
    from agent_envs.base.config import UserError, suggest

    known = env_keywords(factory)
    for key in env_kwargs:
        if key not in known:
            raise UserError(f"env keyword {key!r} is not a setting of this env{suggest(key, known)}; "
                            f"settings: {', '.join(known)}")


def env_keywords(factory: Callable[..., Any]) -> list[str]:
    """The keyword settings of an env: the factory's own, then `ToolEnv`'s (those it passes on)."""
    from agent_envs.core.env import ToolEnv

    names = [n for n, p in inspect.signature(factory).parameters.items() if p.kind is not p.VAR_KEYWORD]
    names += [n for n in inspect.signature(ToolEnv.__init__).parameters if n not in ("self", "tasks", "tools")]
    return list(dict.fromkeys(names))


def resolve_tasks(benchmark: str | None, data_files: Any, split: str | None, tasks: Any, reward: str) -> Any:
    """Tasks given directly, a named benchmark, or a user's own data file; None means "use the world"."""
    if tasks is not None:
        if benchmark is not None or data_files is not None:
            raise ValueError("pass either tasks=[...] or benchmark=/data_files=, not both")
        return list(tasks)
    if benchmark is None and data_files is None:
        return None
    from agent_envs.data import load_benchmark, load_tasks

    if benchmark is not None:
        return load_benchmark(benchmark, data_files=data_files, split=split)
    return load_tasks(data_files, reward=reward)


def python_tool(settings: dict | None = None) -> Any:
    """The shared sandboxed Python tool; `settings` are `PythonTool` keyword arguments."""
    from agent_envs.tools.python import PythonTool

    return shared("tool:python", PythonTool, **{"timeout_s": 10.0, "preamble": ("math",), **dict(settings or {})})
