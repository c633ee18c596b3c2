"""`AgentRemote-v0`: an env served by `agent-envs serve-env`, played as a local Gymnasium env.

Same seeds and actions give the same observations, rewards, end flags and reward components as
the local env (the reward is computed by the server). `astep` for runners on an event loop,
`fork()` through the server's fork (ARPO branching on remote envs), `get_state()` /
`set_state()` to go back to an earlier step of the episode. Each client is one server session,
opened at the first reset and closed by `close()`.

    agent-envs serve-env AgentMath-v0 --port 8000          # in another terminal

    >>> import gymnasium as gym, agent_envs
    >>> env = gym.make("AgentRemote-v0", url="http://127.0.0.1:8000", env_id="AgentMath-v0")  # doctest: +SKIP
    >>> prompt, info = env.reset(seed=0)                                                     # doctest: +SKIP

A server that is down or unreachable gives one line naming the url and what to do
(`EnvServerError`), not a network traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from agent_envs.core.spaces import UnicodeText
from agent_envs.net.http import PermanentError, RetryPolicy, SessionPool, TransientError, with_retries

# steps carry a request id and the server answers a repeat from its cache, so a retry after a
# dropped connection is safe; a server that refuses connections is retried only briefly
_RETRY = RetryPolicy(max_retries=2, backoff_s=0.2, connect_retries=2, connect_backoff_s=0.2)
# one connection pool per event loop for every client in the process (forks included); the
# pool's sessions close when their loop shuts down
_POOL = SessionPool(limit=256)


class EnvServerError(RuntimeError):
    """The env server could not be reached, or refused a request; the message says what to do."""


@dataclass(frozen=True)
class RemoteState:
    """Where a remote episode stands: enough for `set_state` to bring a session (or a fork of it)
    back to this step."""

    episode_id: str | None
    step_count: int
    done: bool


class RemoteEnv(gym.Env[str, str]):
    """A client of one session on an env server.

    Args:
        url: the server's base URL, e.g. `http://127.0.0.1:8000`.
        env_id: the id the server must be serving (checked at construction; None: any).
        env_kwargs: `gym.make` keyword arguments added to the server's own for this session.
        timeout_s: longest wait for one answer (a step that runs tools may take a while).
    """

    metadata = {"render_modes": []}

    def __init__(self, url: str, env_id: str | None = None, env_kwargs: dict[str, Any] | None = None,
                 timeout_s: float = 300.0) -> None:
        self.url = url.rstrip("/")
        self.env_kwargs = dict(env_kwargs or {})
        self.timeout_s = timeout_s
        self.observation_space = UnicodeText(max_length=1 << 24)
        self.action_space = UnicodeText(max_length=1 << 24)
        self.session_id: str | None = None
        self.max_response_tokens: int | None = None  # runners set it; the server's env keeps its own
        self._state = RemoteState(None, 0, False)
        info = self._sync(self._request("GET", "/info"))
        self.server_env_id: str = info["env_id"]
        if env_id is not None and env_id != self.server_env_id:
            raise EnvServerError(f"env server {self.url} serves {self.server_env_id}, not {env_id}: start "
                                 f"`agent-envs serve-env {env_id}` or pass its url")
        self._stop_sequences: list[str] = list(info["stop_sequences"])

    # -- Gymnasium API ------------------------------------------------------------------------------

    @property
    def stop_sequences(self) -> list[str]:
        return list(self._stop_sequences)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        return self._sync(self.areset(seed=seed, options=options))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return self._sync(self.astep(action))

    def fork(self) -> RemoteEnv:
        """An independent copy at the current point of the episode (a new server session)."""
        return self._sync(self.afork())

    def get_state(self) -> RemoteState:
        return self._state

    def set_state(self, state: RemoteState) -> None:
        """Bring this session back to `state`, a step of its episode (or of the episode it forked)."""
        self._sync(self._rewind(state))

    def truncate(self, why: str = "response_budget") -> tuple[float, dict]:
        """End the episode from outside; the server scores the partial response."""
        return self._sync(self.atruncate(why))

    async def atruncate(self, why: str = "response_budget") -> tuple[float, dict]:
        """`truncate` inside an event loop (the rollout runner's)."""
        result = await self._request("POST", f"/sessions/{self._sid()}/truncate", {"why": why})
        self._state = RemoteState(self._state.episode_id, self._state.step_count, True)
        return float(result["reward"]), result["observation"]["info"]

    def render(self) -> None:
        return None

    def close(self) -> None:
        """Close the server session (the server also frees it after its idle timeout)."""
        self._sync(self.aclose())

    # -- the async side -----------------------------------------------------------------------------

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        episode_id = uuid.uuid4().hex
        body = {"seed": seed, "options": options, "episode_id": episode_id}
        if self.session_id is None:
            await self._open()
        try:
            result = await self._request("POST", f"/sessions/{self.session_id}/reset", body)
        except _Gone:  # expired while idle, or the server restarted: a reset needs no old state
            await self._open()
            result = await self._request("POST", f"/sessions/{self.session_id}/reset", body)
        self._state = RemoteState(episode_id, 0, False)
        return result["observation"]["text"], result["observation"]["info"]

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict]:
        body = {"action": {"message": action}, "request_id": uuid.uuid4().hex}
        result = await self._request("POST", f"/sessions/{self._sid()}/step", body)
        obs = result["observation"]
        self._state = RemoteState(self._state.episode_id, self._state.step_count + 1, result["done"])
        return obs["text"], float(result["reward"]), obs["terminated"], obs["truncated"], obs["info"]

    async def afork(self) -> RemoteEnv:
        answer = await self._request("POST", f"/sessions/{self._sid()}/fork", {})
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.session_id = answer["session_id"]
        if self._np_random is not None:
            twin._np_random = gym.utils.seeding.np_random(int(self._np_random.integers(1 << 31)))[0]
        return twin

    async def aclose(self) -> None:
        if self.session_id is not None:
            # gone already (server stopped or session expired): nothing left to free
            with contextlib.suppress(EnvServerError):
                await self._request("DELETE", f"/sessions/{self.session_id}")
            self.session_id = None

    async def _open(self) -> None:
        answer = await self._request("POST", "/sessions", {"env_kwargs": self.env_kwargs})
        self.session_id = answer["session_id"]
        self._stop_sequences = list(answer["stop_sequences"])

    async def _rewind(self, state: RemoteState) -> None:
        await self._request("POST", f"/sessions/{self._sid()}/rewind",
                            {"step_count": state.step_count, "episode_id": state.episode_id})
        self._state = state

    def _sid(self) -> str:
        if self.session_id is None:
            raise RuntimeError("step() before reset(): call env.reset() first")
        return self.session_id

    # -- transport ----------------------------------------------------------------------------------

    def _sync(self, coro: Any) -> Any:
        """Run `coro` to its end from synchronous code, even code called inside a running loop (a
        runner's reset): on the process's background loop, as `ToolEnv.step` runs its tools."""
        from agent_envs.core.env import background_loop

        return asyncio.run_coroutine_threadsafe(coro, background_loop()).result()

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        url = self.url + path

        async def attempt() -> tuple[int, Any]:
            session = await _POOL.get()
            async with session.request(method, url, json=body) as response:
                text = await response.text()
                try:
                    payload = json.loads(text) if text else {}
                except ValueError:
                    raise PermanentError(f"answer is not JSON: {text[:120]!r}") from None
                return response.status, payload

        try:
            status, payload = (await with_retries(attempt, _RETRY, budget_s=self.timeout_s))[0]
        except (TransientError, PermanentError) as exc:
            raise EnvServerError(f"env server {self.url}: {exc}; start it with `agent-envs serve-env ID --port N` "
                                 "or pass the url= it listens on") from None
        if status < 400:
            return payload
        detail = payload.get("detail") if isinstance(payload, dict) else payload
        if isinstance(detail, list):  # validation errors: where and what
            detail = "; ".join(f"{'.'.join(map(str, e.get('loc', [])))}: {e.get('msg')}" for e in detail)
        if status == 404 and "unknown session" in str(detail):
            raise _Gone(f"env server {self.url}: {detail}")
        raise EnvServerError(f"env server {self.url} answered {status} to {method} {path}: {detail}")


class _Gone(EnvServerError):
    """The session is no longer on the server (expired while idle, or the server restarted)."""


__all__ = ["EnvServerError", "RemoteEnv", "RemoteState"]
