"""Math grading: is the response's final answer equivalent to a golden answer?

Cheap checks first (normalised string, then numbers), symbolic checks only when those fail.

    >>> math_reward("<answer>\\\\boxed{0.5}</answer>", ["\\\\frac{1}{2}"]).score
    1.0
"""

from __future__ import annotations

import re
from fractions import Fraction

from agent_envs.rewards.base import RewardResult
from agent_envs.rewards.extract import extract_prediction

_STRIP = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\displaystyle|\$|\s")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")


def _normalize(s: str) -> str:
    s = _STRIP.sub("", s)
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    return s.rstrip(".").replace("\\%", "%")


def _as_number(s: str) -> Fraction | None:
    s = _FRAC.sub(r"(\1)/(\2)", _normalize(s)).replace(",", "")
    m = re.fullmatch(r"\(?(-?\d+(?:\.\d+)?)\)?(?:/\(?(-?\d+(?:\.\d+)?)\)?)?", s)
    if not m:
        return None
    try:
        num = Fraction(m.group(1))
        return num / Fraction(m.group(2)) if m.group(2) else num
    except (ValueError, ZeroDivisionError):
        return None


def is_equiv(pred: str, gold: str) -> bool:
    if _normalize(pred) == _normalize(gold):
        return True
    a, b = _as_number(pred), _as_number(gold)
    return a is not None and b is not None and a == b


def math_reward(response: str, golden_answers: list[str]) -> RewardResult:
    """1.0 when the prediction is equivalent to any golden answer; components `math_equal`, `pred`."""
    pred = extract_prediction(response)
    ok = pred is not None and any(is_equiv(pred, g) for g in golden_answers)
    return RewardResult(score=float(ok), components={"math_equal": float(ok), "pred": pred})
