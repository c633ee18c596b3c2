"""Pulling the prediction out of a response: the last `\\boxed{}` inside the last `<answer>` block.

>>> extract_prediction("<answer>so \\\\boxed{\\\\frac{1}{2}}</answer>")
'\\\\frac{1}{2}'
"""

from __future__ import annotations

import re

# Longest prediction graded, or 4x the longest golden answer if that is more. Real answers are
# short (the longest MATH-500 gold has 53 characters); a prediction of megabytes is wrong, and
# grading it costs seconds (backtracking regexes, a symbolic-math timeout and worker restart, a
# judge request of that size) that a policy could repeat to stall rollouts or flood a judge.
MAX_PRED_CHARS = 1000
_BRACE = re.compile(r"[{}]")


def too_long(pred: str, golden_answers: list[str]) -> bool:
    """Is `pred` past the length any grader reads (`MAX_PRED_CHARS`)? Such a prediction is wrong."""
    if len(pred) <= MAX_PRED_CHARS:  # every real answer: no pass over the golds
        return False
    return len(pred) > 4 * max(map(len, golden_answers), default=0)


_BARE_BOXED = re.compile(r"\\boxed\s+([^\s$]+)")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), with balanced braces; None if absent."""
    start = text.rfind("\\boxed{")
    fbox = text.rfind("\\fbox{")
    if fbox > start:
        start = fbox
    if start < 0:
        # `\boxed 5` without braces, as some models write
        m = _BARE_BOXED.findall(text)
        return m[-1] if m else None
    i = text.index("{", start) + 1
    close = text.find("}", i)
    if close >= 0 and text.find("{", i, close) < 0:  # no nested braces, as in most answers
        return text[i:close]
    depth = 1
    for m in _BRACE.finditer(text, i):  # visits braces only: a megabyte of text between is one step
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return text[i : m.start()]
    return None  # unbalanced: no complete prediction


def answer_span(text: str) -> str | None:
    """Content of the last complete `<answer>...</answer>` block, or None.

    Blocks are read left to right, each from an opening tag to the first closing tag after it
    (the matches of `<answer>(.*?)</answer>`). Scanning with `find` keeps this linear: the regex
    rescans to the end of the text from every unclosed `<answer>`, which is quadratic, and a
    response of 20,000 unclosed tags took minutes.

    >>> answer_span("<answer>a<answer>b</answer> <answer>c</answer></answer>")
    'c'
    """
    span, pos = None, 0
    while (start := text.find("<answer>", pos)) >= 0:
        end = text.find("</answer>", start + 8)
        if end < 0:
            break
        span, pos = text[start + 8 : end], end + 9
    return span


def prediction_in(span: str) -> str:
    """The prediction an answer block holds: its last `\\boxed{}`, else the whole block."""
    boxed = last_boxed(span)
    return (boxed if boxed is not None else span).strip()


def extract_prediction(response: str) -> str | None:
    """The prediction of a response.

    Order: the last `\\boxed{}` in the last `<answer>` block; else the answer block itself; else
    the last `\\boxed{}` anywhere (for protocols without answer tags); else None.
    """
    span = answer_span(response)
    if span is not None:
        return prediction_in(span)
    boxed = last_boxed(response)
    return boxed.strip() if boxed is not None else None
