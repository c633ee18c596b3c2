"""Many episodes stepped together, concurrently.

Gymnasium's `make_vec(..., vectorization_mode="sync")` works with every env id here and steps
envs one after another. RL rollouts step hundreds of episodes whose tool calls take
milliseconds to seconds, so `ToolVectorEnv` steps them concurrently on one event loop: a slow
tool call of one episode never blocks the others. Each env takes its one step
(`ToolEnv._step`): the steps that need no waiting (answers graded in-process) finish right
there, and only those that wait (tool calls, a judge request, symbolic math) go to the loop,
together.

    >>> import agent_envs
    >>> venv = ToolVectorEnv.make("AgentMath-v0", num_envs=4)
    >>> prompts, infos = venv.reset(seed=0)
    >>> actions = [e.unwrapped.task.gold_trace[0] for e in venv.envs]
    >>> obs, rewards, terminated, truncated, infos = venv.step(actions)
    >>> len(obs), infos["tool"].tolist(), infos["_tool"].all()
    (4, ['python', 'python', 'python', 'python'], np.True_)

`infos` follows Gymnasium's vector convention: one dict, each key holding an array over the envs
and `infos["_key"]` the boolean mask of the envs whose info has that key (a nested dict is
batched the same way, inside). Numbers and flags get numeric arrays, anything else an object
array; an env without the key holds 0, False or None there.

Autoreset follows Gymnasium's "next step" mode: the step after an episode ended resets that
env (its action is ignored, `infos["autoreset"]` is set) and returns the new prompt. An action of
`None` leaves that env untouched this step (`infos["skipped"]`), so a runner can step only the
episodes whose generation finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from operator import itemgetter
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

    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict | None = None) -> tuple[list[str], dict]:
        seeds = list(seed) if isinstance(seed, Sequence) else [None if seed is None else seed + i for i in range(self.num_envs)]
        if len(seeds) != self.num_envs:
            raise ValueError(f"got {len(seeds)} seeds for {self.num_envs} envs")
        results = [env.reset(seed=s, options=options) for env, s in zip(self.envs, seeds, strict=True)]
        self._needs_reset = [False] * self.num_envs
        return [r[0] for r in results], batch_infos([r[1] for r in results])

    async def astep(self, actions: Sequence[str | None]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, dict]:
        results, waiting = self._step_now(actions)
        if waiting:
            for i, result in zip(waiting, await _gather(list(waiting.values())), strict=True):
                results[i] = self._record(i, result)
        return self._batch(results)

    def step(self, actions: Sequence[str | None]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, dict]:
        if asyncio._get_running_loop() is not None:
            raise RuntimeError("step() was called inside a running event loop; use `await venv.astep(actions)` there")
        results, waiting = self._step_now(actions)
        if waiting:  # only tool calls (and judge or symbolic grading) pay for the event loop
            done = asyncio.run_coroutine_threadsafe(_gather(list(waiting.values())), background_loop()).result()
            for i, result in zip(waiting, done, strict=True):
                results[i] = self._record(i, result)
        return self._batch(results)

    def _step_now(self, actions: Sequence[str | None]) -> tuple[list, dict[int, Coroutine]]:
        """Take every env's step (`ToolEnv._step`), or its autoreset or skip; return the results of
        those that needed no waiting and the coroutines of the others, by env index."""
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
                    result = self._tool_envs[i]._step(action)
                    if type(result) is tuple:
                        results[i] = self._record(i, result)
                    else:
                        waiting[i] = result
        except BaseException:
            for coro in waiting.values():  # never started: close them so none is left un-awaited
                coro.close()
            raise
        return results, waiting

    def _record(self, i: int, result: tuple[str, float, bool, bool, dict]) -> tuple[str, float, bool, bool, dict]:
        self._needs_reset[i] = result[2] or result[3]
        return result

    @staticmethod
    def _batch(results: list) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, rew, term, trunc, infos = zip(*results, strict=True)
        return list(obs), np.array(rew, dtype=np.float64), np.array(term), np.array(trunc), batch_infos(infos)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _Absent:
    """The value of a key an env's info does not have."""


_ABSENT: Any = _Absent()
_ABSENT_KIND, _DICT_KIND = frozenset({_Absent}), frozenset({dict})
_NUMBER_KINDS = {frozenset({bool}): np.bool_, frozenset({int}): np.int64, frozenset({bool, int}): np.int64,
                 frozenset({float}): np.float64, frozenset({int, float}): np.float64,
                 frozenset({bool, float}): np.float64, frozenset({bool, int, float}): np.float64}


def batch_infos(infos: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One info per env as Gymnasium's vector `infos`: every key an array over the envs, with its
    `_key` mask of the envs that have it; a dict value batched the same way, recursively.

    >>> out = batch_infos([{"reward": 1.0, "tool": None}, {"reward": 0.5, "calls_per_tool": {"search": 2}}])
    >>> out["reward"].tolist(), out["_tool"].tolist(), out["calls_per_tool"]["search"].tolist()
    ([1.0, 0.5], [True, False], [0, 2])

    Unlike Gymnasium's `VectorEnv._add_info`, whose array takes the type of the first env's value,
    the array type fits every env's value: an F1 of 0 in one env and 0.5 in the next stay 0.0
    and 0.5, not 0 and 0.
    """
    n = len(infos)
    if not n:
        return {}
    keys = tuple(infos[0])
    rows = _rows(infos, keys)
    if rows is not None:  # the common case: every env has the same keys; one column per key
        everywhere = np.ones(n, dtype=np.bool_)
        out: dict[str, Any] = {}
        for key, column in zip(keys, zip(*rows, strict=True), strict=True):
            out[key] = _column(column, n)
            out[f"_{key}"] = everywhere.copy()
        return out
    columns = {}
    for i, info in enumerate(infos):
        for key, value in info.items():
            column = columns.get(key)
            if column is None:
                column = columns[key] = [_ABSENT] * n
            column[i] = value
    out = {}
    for key, column in columns.items():
        mask = np.fromiter((v is not _ABSENT for v in column), dtype=np.bool_, count=n)
        out[key] = _column(column, n, None if mask.all() else mask)
        out[f"_{key}"] = mask
    return out


def _rows(infos: Sequence[Mapping[str, Any]], keys: tuple[str, ...]) -> list[tuple] | None:
    """Each info's values in the order of `keys`, or None when some info has other keys. One C
    call per info (`itemgetter`), whatever order its keys were written in: no tuple of its keys
    to build and compare first."""
    if len(keys) < 2 or set(map(len, infos)) != {len(keys)}:  # one key: itemgetter gives no tuple
        return None
    try:
        return list(map(itemgetter(*keys), infos))
    except KeyError:  # as many keys, but not the same ones
        return None


def _column(values: Sequence, n: int, mask: np.ndarray | None = None) -> Any:
    """The array of one info key over the envs; where `mask` is False the env lacks the key and
    the array holds 0 (numbers and flags), an empty dict's batch, or None."""
    kinds = frozenset(map(type, values))
    if mask is not None:
        kinds -= _ABSENT_KIND
        fill = 0 if kinds in _NUMBER_KINDS else {} if kinds == _DICT_KIND else None
        values = [v if there else fill for v, there in zip(values, mask.tolist(), strict=True)]
    number = _NUMBER_KINDS.get(kinds)
    if number is not None:
        return np.array(values, dtype=number)
    if kinds == _DICT_KIND:
        return batch_infos(values)
    return np.fromiter(values, dtype=object, count=n)


async def _gather(coros: list[Coroutine]) -> list:
    """The steps that wait, run concurrently on the loop this coroutine runs on."""
    return await asyncio.gather(*coros)
