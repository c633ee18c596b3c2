"""`ToolEnvConfig`: the settings every env has, typed like every other config of the package.

    >>> ToolEnvConfig.of({"max_tool_calls": 2.0, "reward": "binary"}).max_tool_calls
    2
    >>> ToolEnvConfig.of({"max_tool_cals": 2}, "AgentMath-v0")
    Traceback (most recent call last):
    ...
    agent_envs.base.config.UserError: env_kwargs.max_tool_cals: AgentMath-v0 has no such setting (did you mean 'max_tool_calls'?); see `agent-envs play --help`

An env family adds its own keys in a subclass (its tasks, tools and world: `MathEnvConfig` in
`agent_envs.envs.math`), the way a world adds its own to `WorldConfig`. `gym.make(id, **kwargs)`
builds the family's config from the kwargs once (`of`); `ToolEnv` reads the shared keys from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Literal, TypeVar

from agent_envs.base.config import UserError, check_types, from_mapping, option, suggest
from agent_envs.core.protocols import Protocol
from agent_envs.rewards.recipe import RewardFn

C = TypeVar("C", bound="ToolEnvConfig")


@dataclass
class ToolEnvConfig:
    """`ToolEnv`'s settings: protocol, reward, limits and budgets (`agent-envs play --help` lists them)."""

    protocol: Literal["arpo", "json"] | Protocol = option(
        "arpo", "how actions call tools: arpo (inline tags) or json (Hermes tool calls); or a Protocol object")
    reward: str | RewardFn = option(
        "standard", "reward recipe: standard, binary, f1, arpo (agent_envs.rewards.recipe), or a callable")
    reward_kwargs: dict = option(factory=dict, help="settings of the recipe, e.g. {format_penalty: -1.0, tool_cost: 0.1}")
    max_tool_calls: int = option(6, "tool calls allowed in an episode; later calls get the limit message (0: none)")
    max_calls_per_tool: dict = option(factory=dict, help="limits per tool, e.g. {python: 5, search: 10}")
    max_turns: int | None = option(None, "steps before the episode is truncated (null: max_tool_calls + 4)")
    max_response_chars: int = option(32_768, "response budget in characters (always enforced)")
    max_response_tokens: int | None = option(8_192, "response budget in tokens, enforced when a tokenizer is given")
    tokenizer: Any = option(None, "a Hugging Face tokenizer (Python only): the prompt uses its chat template and "
                            "info['prompt_token_ids'] is set")
    tool_timeout_s: float | None = option(None, "wall-clock deadline per tool call (null: the tool's timeout_s + 1)")
    system_prompt: str | None = option(None, "system prompt text (null: the protocol's, listing the tools)")
    render_mode: Literal["ansi", "human"] | None = option(None, "what render() does: ansi returns the text, human prints it")
    prefill: str | None = option(None, "text the chat template writes when it opens the assistant turn, counted "
                                 "with the response by the format check (null: what the tokenizer's template writes)")

    @classmethod
    def of(cls: type[C], settings: Mapping[str, Any], env: str = "ToolEnv") -> C:
        """The config of `gym.make(env, **settings)`: an unknown key is refused with the closest
        one, values are checked against their types (nested world keys too), then `validate()`."""
        names = [f.name for f in fields(cls)]
        for key in settings:
            if key not in names:
                raise UserError(f"env_kwargs.{key}: {env} has no such setting{suggest(key, names)}; "
                                "see `agent-envs play --help`")
        try:
            config = from_mapping(cls, settings, env, "env_kwargs.")
            config.validate()
        except UserError:
            raise
        except ValueError as exc:  # the message names the key; the user's mistake all the same
            raise UserError(str(exc) if str(exc).startswith(f"{env}:") else f"{env}: {exc}") from None
        return config

    def validate(self) -> None:
        """Types, then the limits: 0 tool calls is a no-tool baseline; a negative limit would read
        as "none" in one check and "unlimited" in another, so it is refused."""
        check_types(self, "env_kwargs.")
        for f in fields(self):  # a nested config (a family's world) runs its own rules
            nested = getattr(self, f.name)
            if is_dataclass(nested) and hasattr(nested, "validate"):
                nested.validate()
        limits = {"max_tool_calls": (self.max_tool_calls, 0), "max_turns": (self.max_turns, 1),
                  "max_response_chars": (self.max_response_chars, 1),
                  "max_response_tokens": (self.max_response_tokens, 1),
                  **{f"max_calls_per_tool.{k}": (v, 0) for k, v in self.max_calls_per_tool.items()}}
        for key, (value, least) in limits.items():
            if value is not None and value < least:
                raise UserError(f"env setting {key} must be >= {least}, got {value}")


__all__ = ["ToolEnvConfig"]
