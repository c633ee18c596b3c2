"""Test helpers of the env server tests: a real `EnvServer` on 127.0.0.1 in a thread of its own,
and raw HTTP calls that know nothing of our client."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import gymnasium as gym

import agent_envs  # noqa: F401  (registers the ids)
from agent_envs.server.env_server import EnvServer
from agent_envs.server.serving import InThread


@contextlib.contextmanager
def serving(env_id: str = "AgentMath-v0", **server_kwargs: Any) -> Iterator[tuple[str, EnvServer]]:
    """A real server on a free port, on its own event loop and thread, so that the synchronous
    client calls of a test (which block the test's loop) never wait on the server's loop."""
    with InThread(EnvServer(env_id, **server_kwargs)) as served:
        yield served.url, served.server


def call(method: str, url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any, dict]:
    """(status, JSON answer, headers) of one plain HTTP request; the answer is parsed as strict
    JSON (no NaN or Infinity, which strict parsers in other languages refuse)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, strict_json(response.read() or b"null"), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, strict_json(exc.read() or b"null"), dict(exc.headers)


def strict_json(raw: bytes | str) -> Any:
    """`raw` as JSON, failing on the NaN and Infinity that Python's parser accepts."""
    def refuse(name: str) -> Any:
        raise AssertionError(f"the server answered with {name}, which is not JSON: {raw[:300]!r}")

    return json.loads(raw, parse_constant=refuse)


def gold_episode(env_id: str, seed: int, **env_kwargs: Any) -> tuple[str, list[str]]:
    """The task id and gold trace that `reset(seed=seed)` of a local env draws."""
    env = gym.make(env_id, **env_kwargs).unwrapped
    env.reset(seed=seed)
    return env.task.id, list(env.task.gold_trace)
