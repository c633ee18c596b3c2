"""Protocol-use checks for the inline tag protocol (the public ARPO recipe's format rule).

>>> arpo_format_check("<think>x</think><answer>\\\\boxed{1}</answer>")
(True, None)
"""

from __future__ import annotations

import re

_TOOL_TAG = re.compile(r"<(search|python|browse)>")


def arpo_format_check(response: str, prefill: str = "") -> tuple[bool, str | None]:
    """Return (ok, failing rule). `prefill` is prompt text a chat template put before the response
    (Qwen3 can pre-fill `<think>`), so tag counts are taken over both."""
    text = prefill + response
    if text.count("<think>") != text.count("</think>") or text.count("<think>") < 1:
        return False, "think_tags"
    if response.count("<answer>") != 1 or response.count("</answer>") != 1:
        return False, "answer_tags"
    # every tool call is followed, in order, by its closing tag and a result block
    pos = 0
    while (m := _TOOL_TAG.search(response, pos)) is not None:
        tag = m.group(1)
        close = response.find(f"</{tag}>", m.end())
        res = response.find("<result>", close) if close >= 0 else -1
        res_end = response.find("</result>", res) if res >= 0 else -1
        if min(close, res, res_end) < 0:
            return False, f"{tag}_without_result"
        pos = res_end
    span = response[response.find("<answer>") : response.find("</answer>")]
    if "\\boxed{" not in span or "}" not in span[span.find("\\boxed{") :]:
        return False, "no_boxed"
    return True, None
