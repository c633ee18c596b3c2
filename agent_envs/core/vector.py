"""Many episodes stepped together, concurrently.

Gymnasium's `make_vec(..., vectorization_mode="sync")` works with every env id here and steps
envs one after another. RL rollouts step hundreds of episodes whose tool calls take
milliseconds to seconds, so `ToolVectorEnv` steps them concurrently on one event loop: a slow
tool call of one episode never blocks the others. Answers need no I/O: they are graded in
the calling thread, in one pass over the batch, and only the steps that wait (tool calls, a
judge request, symbolic math) go to the loop.

    >>> import agent_envs
    >>> venv = ToolVectorEnv.make("AgentMath-v0", num_envs=4)
    >>> prompts, infos = venv.reset(seed=0)
    >>> actions = [e.unwrapped.task.gold_trace[0] for e in venv.envs]
    >>> obs, rewards, terminated, truncated, infos = venv.step(actions)
    >>> len(obs)
    4

Autoreset follows Gymnasium's "next step" mode: the step after an episode ended resets that
env (its action is ignored) and returns the new prompt. An action of `None` leaves that env
untouched this step (`infos[i]["skipped"] = True`), so a runner can step only the episodes whose
generation finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from agent_envs.core.env import ToolEnv, background_loop


class ToolVectorEnv:
    """A batch of `ToolEnv`s stepped concurrently with `asyncio.gather`."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], autoreset: bool = True) -> None:
        if not env_fns:
            raise ValueError("ToolVectorEnv needs at least one env factory")
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.autoreset = autoreset
        self._tool_envs: list[ToolEnv] = [env.unwrapped for env in self.envs]  # type: ignore[misc]
        self._needs_reset = [False] * self.num_envs
        self._seed: int | None = None
        self._episodes = 0

    @classmethod
    def make(cls, env_id: str, num_envs: int, autoreset: bool = True, **kwargs: Any) -> ToolVectorEnv:
        return cls([lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)], autoreset=autoreset)

    def tool_env(self, i: int) -> ToolEnv:
        return self._tool_envs[i]

    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict | None = None) -> tuple[list[str], list[dict]]:
        seeds = list(seed) if isinstance(seed, Sequence) else [None if seed is None else seed + i for i in range(self.num_envs)]
        if len(seeds) != self.num_envs:
            raise ValueError(f"got {len(seeds)} seeds for {self.num_envs} envs")
        results = [env.reset(seed=s, options=options) for env, s in zip(self.envs, seeds, strict=True)]
        self._needs_reset = [False] * self.num_envs
        return [r[0] for r in results], [r[1] for r in results]

    async def astep(self, actions: Sequence[str | None]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        results, waiting = self._step_now(actions)
        if waiting:
            for i, result in zip(waiting, await _gather(list(waiting.values())), strict=True):
                results[i] = self._record(i, result)
        return self._batch(results)

    def step(self, actions: Sequence[str | None]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        if asyncio._get_running_loop() is not None:
            raise RuntimeError("step() was called inside a running event loop; use `await venv.astep(actions)` there")
        results, waiting = self._step_now(actions)
        if waiting:  # only tool calls (and judge or symbolic grading) pay for the event loop
            done = asyncio.run_coroutine_threadsafe(_gather(list(waiting.values())), background_loop()).result()
            for i, result in zip(waiting, done, strict=True):
                results[i] = self._record(i, result)
        return self._batch(results)

    def _step_now(self, actions: Sequence[str | None]) -> tuple[list, dict[int, Coroutine]]:
        """Step every env whose step needs no waiting (answers, resets, skips) right here; return
        the results so far and the coroutines of the others (tool calls), by env index.

        Answers need no I/O, so a batch of them is graded in one pass without a coroutine per env.
        """
        if len(actions) != self.num_envs:
            raise ValueError(f"got {len(actions)} actions for {self.num_envs} envs")
        results: list = [None] * self.num_envs
        waiting: dict[int, Coroutine] = {}
        try:
            for i, action in enumerate(actions):
                if self._needs_reset[i] and self.autoreset:
                    self._needs_reset[i] = False
                    obs, info = self.envs[i].reset()
                    results[i] = (obs, 0.0, False, False, {**info, "autoreset": True})
                elif action is None:
                    results[i] = ("", 0.0, False, False, {"skipped": True})
                else:
                    now, later = self._tool_envs[i].step_or_defer(action)
                    if later is None:
                        results[i] = self._record(i, now)
                    else:
                        waiting[i] = later
        except BaseException:
            for coro in waiting.values():  # never started: close them so none is left un-awaited
                coro.close()
            raise
        return results, waiting

    def _record(self, i: int, result: tuple[str, float, bool, bool, dict]) -> tuple[str, float, bool, bool, dict]:
        self._needs_reset[i] = result[2] or result[3]
        return result

    @staticmethod
    def _batch(results: list) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        obs, rew, term, trunc, infos = zip(*results, strict=True)
        return list(obs), np.array(rew, dtype=np.float64), np.array(term), np.array(trunc), list(infos)

    def close(self) -> None:
        for env in self.envs:
            env.close()


async def _gather(coros: list[Coroutine]) -> list:
    """The steps that wait, run concurrently on the loop this coroutine runs on."""
    return await asyncio.gather(*coros)
