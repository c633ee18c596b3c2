"""`ArpoTags`, the inline tag protocol of the ARPO/AEPO family, and its format check.

    >>> from agent_envs.base.tool import Tool, ToolResult
    >>> class Py(Tool):
    ...     name = "python"
    ...     async def call(self, arg): return ToolResult(arg)
    >>> p = ArpoTags()
    >>> p.stop_sequences(["python"])
    ['</python>']
    >>> p.parse("<think>x</think><python>print(1)</python>", [Py()]).tool_input
    'print(1)'
    >>> p.format_observation("1")
    ' <result>\\n1\\n</result>'
    >>> arpo_format_check("<think>x</think><answer>\\\\boxed{1}</answer>")
    (True, None)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from agent_envs.base.tool import Tool, known_tool_tags
from agent_envs.core.protocols.base import ParsedAction, Protocol


def strip_code_fence(text: str) -> str:
    """The body of a Markdown code block that makes up the whole text, else the text (models
    often fence the code they put inside a tag).

    >>> strip_code_fence("```python\\nprint(1)\\n```")
    'print(1)'
    """
    m = re.fullmatch(r"\s*```[a-zA-Z0-9_+-]*\n?(.*?)\n?```\s*", text, re.DOTALL)
    return (m.group(1) if m else text).strip("\n")


class TagPatterns(NamedTuple):
    """The known tool tags and the pattern of any known tool's opening tag (`_tag_patterns`)."""

    tags: tuple[str, ...] | None
    opening: re.Pattern[str] | None


_patterns = TagPatterns(None, None)


def _tag_patterns() -> TagPatterns:
    """The known tool tags and their opening tags' pattern. Rebuilt only when a new tool class appears:
    `known_tool_tags()` returns the same tuple until then, and hashing it for a cache lookup on
    every step cost more than the search."""
    global _patterns
    tags = known_tool_tags()
    if _patterns.tags is not tags:
        names = "|".join(map(re.escape, tags))
        _patterns = TagPatterns(tags, re.compile(f"<({names})>"))
    return _patterns


@functools.cache
def _closing_tags(tags: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"</{t}>" for t in tags)


@functools.cache
def _parse_plan(enabled: tuple[str, ...], known: tuple[str, ...]) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """The tag strings `parse` looks for, built once per set of tools: (closing tag, tool) of each
    enabled tool, and (opening tag, flag) of each known tool that is not enabled."""
    closes = tuple((f"</{t}>", t) for t in enabled)
    disabled = tuple((f"<{t}>", f"disabled_tool:{t}") for t in known if t not in enabled)
    return closes, disabled


class ParsePlan(NamedTuple):
    """What `parse` looks for, for one sequence of tools: (closing tag, tool) of each enabled
    tool and (opening tag, flag) of each known tool that is not enabled."""

    tools: Sequence[Tool] | None
    known: tuple[str, ...] | None
    closes: tuple[tuple[str, str], ...]
    disabled: tuple[tuple[str, str], ...]


_NO_PLAN = ParsePlan(None, None, (), ())


def _plan_for(tools: Sequence[Tool]) -> ParsePlan:
    known = known_tool_tags()
    return ParsePlan(tools, known, *_parse_plan(tuple(t.name for t in tools), known))


def arpo_format_check(response: str, prefill: str = "") -> tuple[bool, str | None]:
    """The public ARPO recipe's format rule: (ok, failing rule). `prefill` is prompt text a chat
    template put before the response (Qwen3 can pre-fill `<think>`), so tag counts are taken over
    both. Calls of every known tool tag must be closed and answered by a result block."""
    # balanced `<think>` blocks (at least one, prefill included) and exactly one answer block
    text = prefill + response if prefill else response
    opened = text.count("<think>")
    if opened != text.count("</think>") or opened < 1:
        return False, "think_tags"
    if response.count("<answer>") != 1 or response.count("</answer>") != 1:
        return False, "answer_tags"
    # every tool call is followed, in order, by its closing tag and a result block
    pos = 0
    opening = _tag_patterns().opening
    while (m := opening.search(response, pos)) is not None:
        tag = m.group(1)
        close = response.find(f"</{tag}>", m.end())
        res = response.find("<result>", close) if close >= 0 else -1
        res_end = response.find("</result>", res) if res >= 0 else -1
        if min(close, res, res_end) < 0:
            return False, f"{tag}_without_result"
        pos = res_end
    # a closed `\boxed{` in the answer block
    end = response.find("</answer>")
    boxed = response.find("\\boxed{", response.find("<answer>"), end)
    if boxed < 0 or response.find("}", boxed, end) < 0:
        return False, "no_boxed"
    return True, None


class ArpoTags(Protocol):
    """The inline tag protocol of the ARPO/AEPO family (the default).

    `<think>` reasoning, `<search>query</search>` / `<python>code</python>` calls (their closing
    tags are the stop strings), results injected as `" <result>\\n...\\n</result>"`, and a final
    `<answer>... \\boxed{A} ...</answer>`. The whole trajectory is one assistant turn.
    """

    name = "arpo"

    def __init__(self, stop_on_answer: bool = False) -> None:
        self.stop_on_answer = stop_on_answer

    _plan = _NO_PLAN  # the parse plan of the last tuple of tools seen (per instance once set)

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

    def parse(self, action: str, tools: Sequence[Tool]) -> ParsedAction:
        plan = self._plan
        if plan.tools is not tools or plan.known is not known_tool_tags():
            plan = _plan_for(tools)
            if type(tools) is tuple:  # immutable, and held by the plan: its identity is its key
                self._plan = plan
        closes, disabled = plan.closes, plan.disabled
        flags = ("model_wrote_result",) if "<result>" in action else ()
        for opening, flag in disabled:
            if opening in action:
                flags += (flag,)
        first_close, first_tool = len(action) + 1, None
        for closing, t in closes:
            i = action.find(closing)
            if 0 <= i < first_close:
                first_close, first_tool = i, t
        answer_end = action.find("</answer>")
        if first_tool is not None and (answer_end < 0 or first_close < answer_end):
            end = first_close + len(first_tool) + 3
            opening = action.rfind(f"<{first_tool}>", 0, first_close)
            body = "" if opening < 0 else action[opening + len(first_tool) + 2 : first_close]
            tool = next(t for t in tools if t.name == first_tool)
            body = tool.clean_argument(strip_code_fence(body))
            if not body:
                return ParsedAction("invalid", action[:end], first_tool, "", "empty_call", flags)
            return ParsedAction("tool", action[:end], first_tool, body, None, flags)
        if answer_end >= 0 and action.find("<answer>", 0, answer_end) >= 0:
            # positional: a keyword call of a named tuple's `__new__` costs twice as much
            return ParsedAction("answer", action[: answer_end + 9], None, None, None, flags)  # 9: len("</answer>")
        return ParsedAction("end", action, None, None, "no_answer", flags)

    def format_observation(self, text: str, tool: str | None = None) -> str:
        return f" <result>\n{text}\n</result>"

    def check_format(self, response: str, prefill: str = "") -> tuple[bool, str | None]:
        ok, why = arpo_format_check(response, prefill)
        if ok and "<result>" in response and response.count("<result>") != sum(
            response.count(closing) for closing in _closing_tags(known_tool_tags())
        ):
            return False, "model_wrote_result"
        return ok, why
