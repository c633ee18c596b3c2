"""`JsonToolCalls`: Hermes/Qwen function calling, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agent_envs.base.tool import Tool
from agent_envs.core.protocols.base import ParsedAction, Protocol
from agent_envs.rewards.extract import extract_prediction


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes a `tools` list into the prompt (Qwen's and
    Hermes' do; SmolLM2's and many others ignore it, and then our system turn must carry the
    schemas). Read once per template by rendering one turn with and without a probe tool."""
    template = tokenizer.chat_template
    if template not in _RENDERS_TOOLS:
        probe = {"type": "function", "function": {"name": "probe_tool_x7", "description": "",
                                                  "parameters": {"type": "object", "properties": {}}}}
        turn = [{"role": "user", "content": "q"}]
        try:
            text = tokenizer.apply_chat_template(turn, tools=[probe], tokenize=False, add_generation_prompt=True)
        except Exception:  # a template that fails on tools cannot render them
            text = ""
        _RENDERS_TOOLS[template] = "probe_tool_x7" in text
    return _RENDERS_TOOLS[template]


_RENDERS_TOOLS: dict[str, bool] = {}


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
            specs = [t.spec() for t in tools]
            msgs = messages
            if specs and messages[0]["content"] == self.system_prompt(tools) and renders_tools(tok):
                # the template writes the tool schemas itself: drop ours from our system turn
                msgs = [{"role": "system", "content": self.system_prompt(())}, *messages[1:]]
            return tok.apply_chat_template(msgs, tools=specs or None, tokenize=False, add_generation_prompt=True)
        return super().render_prompt(messages)

    def parse(self, action: str, tools: Sequence[Tool]) -> ParsedAction:
        by_name = {t.name: t for t in tools}
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
        # ValueError also covers integers past Python's 4300-digit limit; RecursionError, JSON
        # nested deeper than the parser recurses: a model can write both, and neither is fatal
        except (ValueError, RecursionError, KeyError, TypeError, AttributeError) as exc:
            return ParsedAction("invalid", text, None, body, f"tool call is not valid JSON with 'name' and 'arguments' ({type(exc).__name__})")
        if not isinstance(name, str):
            return ParsedAction("invalid", text, None, body, f"tool call 'name' must be a string, got {type(name).__name__}")
        if name not in by_name:
            return ParsedAction("invalid", text, str(name), body, f"unknown tool {name!r}; available: {', '.join(by_name)}")
        if not isinstance(args, dict):
            return ParsedAction("invalid", text, name, "", "empty_call")
        tool = by_name[name]
        # a JSON escape ("\\ud800") decodes to a lone surrogate, which the env's cleaning of the
        # raw action cannot see; a tool echoing it would return text no tokenizer can encode
        value = tool.argument_text(args).encode("utf-8", "replace").decode("utf-8")
        value = tool.clean_argument(value)
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
