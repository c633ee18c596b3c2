"""Any of our env ids as an `environment_factory` of TRL's GRPOTrainer (TRL >= 1.x, transformers >= 5.2).

TRL makes one instance per rollout, calls `reset(**row)` and puts the text it returns in the user
turn, offers every public method as a tool (name, type hints and docstring make the schema), and
scores finished rollouts with `reward_funcs`. `trl_environment` builds that class for an env id:
one method per tool the env enables (`python(code: str) -> str`, `search(query: str) -> str`,
`browse(url: str) -> str`), each a step of our env with a JSON tool call; `env_reward` steps the
final assistant message and returns the env's reward (our grader). Nothing here imports TRL.

    from trl import GRPOConfig, GRPOTrainer
    from agent_envs.interop.trl import env_reward, trl_environment

    trainer = GRPOTrainer(model=..., args=GRPOConfig(max_steps=100, ...), reward_funcs=env_reward,
                          environment_factory=trl_environment("AgentMath-v0"))

With `url=`, each instance is a session of an `agent-envs serve-env` server (`RemoteEnv`), the
reward computed by the server. A `train_dataset` row's `seed` (or `index`) picks the task, so the
`num_generations` rollouts of a row play the same task; without one each reset draws a task.

    >>> env = trl_environment("AgentMath-v0")()
    >>> env.reset(seed=0).endswith("Add 872 and 830.")
    True
    >>> env.python(code="print(872 + 830)")
    '1702'
    >>> answer(env, "The sum is \\\\boxed{1702}.")
    1.0
    >>> env.env.close()
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from agent_envs.base.tool import Tool
from agent_envs.core.protocols.json_calls import JsonToolCalls

# the env plays the JSON tool-call protocol, which is what TRL's chat templates write; the
# instruction is that protocol's system prompt without tools (TRL renders the tool schemas)
_JSON = JsonToolCalls()
INSTRUCTION = _JSON.system_prompt(())
ENDED = "The episode has ended; no more tool calls are run."


class TrlEnv:
    """One rollout of an env for TRL. `trl_environment` makes the subclass with the env's tools."""

    env_id: str = ""
    _make: Callable[[], gym.Env]

    def __init__(self) -> None:
        self.env = type(self)._make()
        self.reward: float | None = None  # set when the episode ends
        self.info: dict[str, Any] = {}  # the last step's info: reward components once it ended
        self.tool_calls = 0
        self._head, self._tail = _JSON._build_obs_template()

    def reset(self, seed: int | None = None, index: int | None = None, **row: Any) -> str:
        """Start an episode (of the task that `index`, or `seed`, picks) and return its prompt."""
        _, info = self.env.reset(seed=seed, options=None if index is None else {"index": int(index)})
        self.reward, self.info, self.tool_calls = None, {}, 0
        return f"{INSTRUCTION}\n\n{info['messages'][-1]['content']}"

    def _call(self, tool: str, argument: str, value: str) -> str:
        if self.reward is not None:
            return ENDED
        self.tool_calls += 1
        call = json.dumps({"name": tool, "arguments": {argument: value}})
        obs, reward, terminated, truncated, info = self.env.step(f"<tool_call>{call}</tool_call>")
        if terminated or truncated:  # the turn or call limit: the episode is graded now
            self.reward, self.info = float(reward), info
        if obs.startswith(self._head) and obs.endswith(self._tail):
            obs = obs[len(self._head): len(obs) - len(self._tail)]
        return obs


def _tool_method(tool: Tool) -> Callable[..., str]:
    """A method `name(self, <argument>: str) -> str` with the docstring TRL reads the schema from."""
    name, argument = tool.name, tool.argument

    def method(self: TrlEnv, *args: str, **kwargs: str) -> str:
        value = kwargs[argument] if argument in kwargs else (args[0] if args else "")
        return self._call(name, argument, str(value))

    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter(argument, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)],
        return_annotation=str)
    method.__annotations__ = {argument: str, "return": str}
    description = tool.description or f"the {name} tool"
    method.__doc__ = (f"{description[0].upper()}{description[1:]}.\n\nArgs:\n    {argument}: the {argument} to "
                      f"give the {name} tool.\n\nReturns:\n    What the tool returned.")
    return method


def trl_environment(env_id: str, *, url: str | None = None, **env_kwargs: Any) -> type[TrlEnv]:
    """The `environment_factory` for `env_id`: a class whose instances are fresh envs (`gym.make`
    with `env_kwargs`), or sessions of the `serve-env` server at `url` (its kwargs plus these)."""
    kwargs = {**env_kwargs, "protocol": "json"}
    if url is None:
        def make() -> gym.Env:
            return gym.make(env_id, **kwargs)
        probe = make()
    else:
        from agent_envs.remote.env_client import RemoteEnv

        def make() -> gym.Env:
            return RemoteEnv(url, env_id=env_id, env_kwargs=kwargs)
        remote = make()
        try:
            server_kwargs = remote._sync(remote._request("GET", "/info"))["env_kwargs"]
        finally:
            remote.close()
        probe = gym.make(env_id, **{**server_kwargs, **kwargs})  # read its tools here; never played
    try:
        tools = list(probe.unwrapped.tools.values())
    finally:
        probe.close()
    methods: dict[str, Any] = {t.name: _tool_method(t) for t in tools}
    methods.update(env_id=env_id, _make=staticmethod(make), __doc__=f"{env_id} for TRL's GRPOTrainer.")
    return type(env_id.replace("-", "_"), (TrlEnv,), methods)


def answer(env: TrlEnv, text: str) -> float:
    """End `env`'s episode with the model's final message and return the env's reward (once graded,
    the same reward again). A message the env does not take as an answer is scored as cut off.
    A function, not a method: TRL would offer every public method to the model as a tool."""
    if env.reward is None:
        _, reward, terminated, truncated, info = env.env.step(text)
        if not (terminated or truncated):
            reward, info = env.env.unwrapped.truncate()
        env.reward, env.info = float(reward), info
    return env.reward


def env_reward(completions: list[Any], environments: list[TrlEnv], **kwargs: Any) -> list[float]:
    """TRL's reward function: each rollout's final assistant message, graded by its env."""
    return [answer(env, _final_text(completion)) for completion, env in zip(completions, environments, strict=True)]


def _final_text(completion: Any) -> str:
    """The text of the last assistant message of a completion (a string, or a list of messages)."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            return content
    return ""
