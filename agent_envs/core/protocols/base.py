"""The protocol contract: what every text protocol provides, and the action it parses into.

A protocol owns everything textual about an episode: the system prompt, stop strings, parsing of
one generated segment, the wrapping of tool output and the format check. The env owns the
episode; the rollout runner owns tokens. Tools bring their own policy (tag, argument cleaning),
so a protocol never names a tool.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from agent_envs.base.tool import Tool
from agent_envs.rewards.extract import extract_prediction

PROMPT_VERSION = "v1"


class ParsedAction(NamedTuple):
    """One generated segment, understood.

    kind: `tool` (a call to execute), `invalid` (a malformed call: the env answers with an
    error observation and the episode continues), `answer` (a complete answer block or final
    message) or `end` (the model stopped without a usable answer).
    `text` is the action cut right after the first tool block; anything after is dropped, as a
    real engine would have stopped there. Immutable; a named tuple because one is built on every
    step and that costs a third of a frozen dataclass.
    """

    kind: Literal["tool", "invalid", "answer", "end"]
    text: str
    tool: str | None = None
    tool_input: str | None = None
    reason: str | None = None
    flags: tuple[str, ...] = ()


class Protocol(ABC):
    """Base class of text protocols."""

    name: str = "protocol"

    @abstractmethod
    def stop_sequences(self, tools: Sequence[str]) -> list[str]: ...

    @abstractmethod
    def system_prompt(self, tools: Sequence[Any]) -> str: ...

    @abstractmethod
    def parse(self, action: str, tools: Sequence[Tool]) -> ParsedAction:
        """Understand one generated segment; `tools` are the enabled tools (their tags and policy)."""

    @abstractmethod
    def format_observation(self, text: str, tool: str | None = None) -> str:
        """The exact text appended to the response after a tool call (loss mask 0)."""

    def check_format(self, response: str, prefill: str = "") -> tuple[bool, str | None]:
        """Was the protocol used correctly over the whole response? (ok, failing rule: None when ok)."""
        if extract_prediction(response) is not None:
            return True, None
        return False, "no_answer"

    def messages(self, question: str, tools: Sequence[Any], system_prompt: str | None = None) -> list[dict]:
        return [
            {"role": "system", "content": system_prompt if system_prompt is not None else self.system_prompt(tools)},
            {"role": "user", "content": question},
        ]

    def render_prompt(self, messages: list[dict], tokenizer: Any = None, tools: Sequence[Any] = ()) -> str:
        """The prompt text: the tokenizer's chat template when one is given, else ChatML."""
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
        return "".join(parts) + "<|im_start|>assistant\n"

    def generation_prefill(self, tokenizer: Any = None) -> str:
        """The text the chat template writes when it opens the assistant turn (the header, and
        e.g. the `<think>` a Qwen3 thinking template pre-fills), read by rendering one user turn
        with and without the generation prompt. It is part of the prompt, not of the response,
        so format checks count it with the response. ChatML without a tokenizer pre-fills nothing.
        """
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            return ""
        turn = [{"role": "user", "content": "q"}]
        bare = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=False)
        full = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
        return full[len(bare):] if full.startswith(bare) else ""
