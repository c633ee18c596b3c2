"""Pulling the prediction out of a response: the last `\\boxed{}` inside the last `<answer>` block.

>>> extract_prediction("<answer>so \\\\boxed{\\\\frac{1}{2}}</answer>")
'\\\\frac{1}{2}'
"""

from __future__ import annotations

import re

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


_BRACE = re.compile(r"[{}]")
_BARE_BOXED = re.compile(r"\\boxed\s+([^\s$]+)")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), with balanced braces; None if absent."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        # `\boxed 5` without braces, as some models write
        m = _BARE_BOXED.findall(text)
        return m[-1] if m else None
    i = text.index("{", start) + 1
    depth = 1
    for m in _BRACE.finditer(text, i):  # visits the braces only, not every character
        if m.group() == "{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return text[i : m.start()]
    return None  # unbalanced: no complete prediction


def answer_span(text: str) -> str | None:
    """Content of the last complete `<answer>...</answer>` block, or None."""
    start = text.find("<answer>")
    if start < 0:
        return None
    if text.find("<answer>", start + 8) < 0:  # one opening tag (the usual case): one block at most
        end = text.find("</answer>", start + 8)
        return text[start + 8 : end] if end >= 0 else None
    blocks = _ANSWER_RE.findall(text)
    return blocks[-1] if blocks else None


def extract_prediction(response: str) -> str | None:
    """The prediction of a response.

    Order: the last `\\boxed{}` in the last `<answer>` block; else the answer block itself; else
    the last `\\boxed{}` anywhere (for protocols without answer tags); else None.
    """
    span = answer_span(response)
    if span is not None:
        boxed = last_boxed(span)
        return (boxed if boxed is not None else span).strip()
    boxed = last_boxed(response)
    return boxed.strip() if boxed is not None else None
