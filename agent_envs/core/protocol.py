"""Text protocols: how a model calls tools and answers, and how results come back.

A protocol owns everything textual about an episode: the system prompt, stop strings, parsing of
one generated segment, the wrapping of tool output, and the env's fixed messages. The env owns
the episode; the rollout runner owns tokens.

    >>> p = ArpoTags()
    >>> p.stop_sequences(["python"])
    ['</python>']
    >>> p.parse("<think>x</think><python>print(1)</python>", ["python"]).tool_input
    'print(1)'
    >>> p.format_observation("1")
    ' <result>\\n1\\n</result>'
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agent_envs.rewards.extract import extract_prediction
from agent_envs.rewards.format import arpo_format_check

PROMPT_VERSION = "v1"

# Every message the env itself writes, in one place (fixed English text).
MESSAGES = {
    "limit_exceeded": "The maximum {tool} call limit is exceeded. You are not allowed to use {tool} anymore. Give your final answer.",
    "repeated_query": "You have searched this query. Please refer to previous results.",
    "empty_call": "Empty {tool} call: nothing to execute.",
    "no_results": "No search results found.",
    "search_error": "Search failed: {reason}.",
    "timeout": "Execution timed out after {seconds} seconds.",
    "no_output": "Code ran successfully with no output.",
    "invalid_call": "Invalid tool call: {reason}.",
    "tool_error": "{tool} failed: {reason}.",
}

KNOWN_TOOL_TAGS = ("python", "search", "browse")


@dataclass(frozen=True)
class ParsedAction:
    """One generated segment, understood.

    kind: `tool` (a call to execute), `invalid` (a malformed call: the env answers with an
    error observation and the episode continues), `answer` (a complete answer block or final
    message) or `end` (the model stopped without a usable answer).
    `text` is the action cut right after the first tool block; anything after is dropped, as a
    real engine would have stopped there.
    """

    kind: Literal["tool", "invalid", "answer", "end"]
    text: str
    tool: str | None = None
    tool_input: str | None = None
    reason: str | None = None
    flags: tuple[str, ...] = field(default_factory=tuple)


class Protocol(ABC):
    """Base class of text protocols."""

    name: str = "protocol"

    @abstractmethod
    def stop_sequences(self, tools: Sequence[str]) -> list[str]: ...

    @abstractmethod
    def system_prompt(self, tools: Sequence[Any]) -> str: ...

    @abstractmethod
    def parse(self, action: str, tools: Sequence[str]) -> ParsedAction: ...

    @abstractmethod
    def format_observation(self, text: str, tool: str | None = None) -> str:
        """The exact text appended to the response after a tool call (loss mask 0)."""

    def check_format(self, response: str, prefill: str = "") -> tuple[bool, str | None]:
        """Was the protocol used correctly over the whole response? (ok, failing rule)."""
        return extract_prediction(response) is not None, "no_answer"

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


def _clean_query(text: str) -> str:
    return " ".join(text.replace('"', " ").split())


def _strip_fences(code: str) -> str:
    m = re.fullmatch(r"\s*```[a-zA-Z0-9_+-]*\n?(.*?)\n?```\s*", code, re.DOTALL)
    return (m.group(1) if m else code).strip("\n")


class ArpoTags(Protocol):
    """The inline tag protocol of the ARPO/AEPO family (the default).

    `<think>` reasoning, `<search>query</search>` / `<python>code</python>` calls (their closing
    tags are the stop strings), results injected as `" <result>\\n...\\n</result>"`, and a final
    `<answer>... \\boxed{A} ...</answer>`. The whole trajectory is one assistant turn.
    """

    name = "arpo"

    def __init__(self, stop_on_answer: bool = False) -> None:
        self.stop_on_answer = stop_on_answer

    def stop_sequences(self, tools: Sequence[str]) -> list[str]:
        stops = [f"</{t}>" for t in tools]
        return stops + ["</answer>"] if self.stop_on_answer else stops

    def system_prompt(self, tools: Sequence[Any]) -> str:
        lines = [
            "You are a helpful assistant that solves the given question step by step, using tools when they help.",
            "Think inside <think> </think> before each action.",
        ]
        for tool in tools:
            lines.append(f"To use the {tool.name} tool ({tool.description}), write <{tool.name}> {tool.argument} </{tool.name}>;"
                         " its output will be returned inside <result> </result>.")
        lines.append("Give the final answer inside <answer> </answer>, with the exact final answer in \\boxed{} in LaTeX format.")
        example = "<think> reasoning </think> "
        if tools:
            t = tools[0]
            example += f"<{t.name}> {t.argument} </{t.name}> <result> output </result> <think> reasoning </think> "
        lines.append("For example: " + example + "<answer> The final answer is \\boxed{answer}. </answer>")
        return "\n".join(lines)

    def parse(self, action: str, tools: Sequence[str]) -> ParsedAction:
        flags = []
        if "<result>" in action:
            flags.append("model_wrote_result")
        flags += [f"disabled_tool:{t}" for t in KNOWN_TOOL_TAGS if t not in tools and f"<{t}>" in action]
        first_close, first_tool = len(action) + 1, None
        for t in tools:
            i = action.find(f"</{t}>")
            if 0 <= i < first_close:
                first_close, first_tool = i, t
        answer_end = action.find("</answer>")
        if first_tool is not None and (answer_end < 0 or first_close < answer_end):
            end = first_close + len(first_tool) + 3
            opening = action.rfind(f"<{first_tool}>", 0, first_close)
            body = "" if opening < 0 else action[opening + len(first_tool) + 2 : first_close]
            body = _clean_query(body) if first_tool == "search" else _strip_fences(body).strip()
            if not body:
                return ParsedAction("invalid", action[:end], first_tool, "", "empty_call", tuple(flags))
            return ParsedAction("tool", action[:end], first_tool, body, None, tuple(flags))
        if answer_end >= 0 and "<answer>" in action[:answer_end]:
            return ParsedAction("answer", action[: answer_end + len("</answer>")], flags=tuple(flags))
        return ParsedAction("end", action, reason="no_answer", flags=tuple(flags))

    def format_observation(self, text: str, tool: str | None = None) -> str:
        return f" <result>\n{text}\n</result>"

    def check_format(self, response: str, prefill: str = "") -> tuple[bool, str | None]:
        ok, why = arpo_format_check(response, prefill)
        if ok and "<result>" in response and response.count("<result>") != sum(
            response.count(f"</{t}>") for t in KNOWN_TOOL_TAGS
        ):
            return False, "model_wrote_result"
        return ok, why


class JsonToolCalls(Protocol):
    """Hermes/Qwen function calling: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

    Tool results are tool-role messages rendered by the tokenizer's chat template when a
    tokenizer is given (the text between the end of the assistant's call and the start of its
    next turn), else in Qwen2.5's ChatML form. The final answer is the last assistant message,
    graded on its last `\\boxed{}`.
    """

    name = "json"
    _SENTINEL = "\x00CALL\x00"

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer
        self._obs_template: tuple[str, str] | None = None

    def stop_sequences(self, tools: Sequence[str]) -> list[str]:
        return ["</tool_call>"] if tools else []

    def system_prompt(self, tools: Sequence[Any]) -> str:
        text = "You are a helpful assistant. Solve the question step by step and put the exact final answer in \\boxed{}."
        if tools:
            specs = "\n".join(json.dumps(t.spec()) for t in tools)
            text += (
                "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{specs}\n</tools>\n\n"
                "For each function call, return a json object with function name and arguments within "
                '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
            )
        return text

    def render_prompt(self, messages: list[dict], tokenizer: Any = None, tools: Sequence[Any] = ()) -> str:
        tok = tokenizer or self.tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            # the template renders the tool schemas itself: drop ours from the system turn
            msgs = [{"role": "system", "content": self.system_prompt(())}, *messages[1:]]
            return tok.apply_chat_template(msgs, tools=[t.spec() for t in tools] or None, tokenize=False,
                                           add_generation_prompt=True)
        return super().render_prompt(messages)

    def parse(self, action: str, tools: Sequence[str]) -> ParsedAction:
        close = action.find("</tool_call>")
        if close < 0:
            flags = ("tool_call_unclosed",) if "<tool_call>" in action else ()
            kind = "answer" if extract_prediction(action) is not None else "end"
            return ParsedAction(kind, action, reason=None if kind == "answer" else "no_answer", flags=flags)
        text = action[: close + len("</tool_call>")]
        opening = action.rfind("<tool_call>", 0, close)
        body = action[opening + len("<tool_call>") : close].strip() if opening >= 0 else ""
        if not body:
            return ParsedAction("invalid", text, None, "", "empty_call")
        try:
            call = json.loads(body)
            name, args = call["name"], call.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args) if args.strip().startswith("{") else {"input": args}
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            return ParsedAction("invalid", text, None, body, f"tool call is not valid JSON with 'name' and 'arguments' ({type(exc).__name__})")
        if name not in tools:
            return ParsedAction("invalid", text, str(name), body, f"unknown tool {name!r}; available: {', '.join(tools)}")
        if not isinstance(args, dict) or not args:
            return ParsedAction("invalid", text, name, "", "empty_call")
        value = next(iter(args.values())) if len(args) == 1 else json.dumps(args)
        value = str(value).strip()
        if name == "search":
            value = _clean_query(value)
        if not value:
            return ParsedAction("invalid", text, name, "", "empty_call")
        return ParsedAction("tool", text, name, value)

    def format_observation(self, text: str, tool: str | None = None) -> str:
        if self._obs_template is None:
            self._obs_template = self._build_obs_template()
        head, tail = self._obs_template
        return head + text + tail

    def _build_obs_template(self) -> tuple[str, str]:
        """Render [user, assistant(SENTINEL), tool(SENTINEL2)] and keep what surrounds the result."""
        tok = self.tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            marker = "\x00RESULT\x00"
            msgs = [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": self._SENTINEL},
                {"role": "tool", "content": marker},
            ]
            full = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            after_call = full[full.index(self._SENTINEL) + len(self._SENTINEL) :]
            head, tail = after_call.split(marker, 1)
            return head, tail
        return "<|im_end|>\n<|im_start|>user\n<tool_response>\n", "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


PROTOCOLS = {"arpo": ArpoTags, "json": JsonToolCalls}


def make_protocol(spec: str | Protocol, tokenizer: Any = None) -> Protocol:
    if isinstance(spec, Protocol):
        return spec
    if spec == "json":
        return JsonToolCalls(tokenizer)
    if spec in PROTOCOLS:
        return PROTOCOLS[spec]()
    raise ValueError(f"protocol {spec!r} is unknown; choose one of {sorted(PROTOCOLS)} or pass a Protocol")
