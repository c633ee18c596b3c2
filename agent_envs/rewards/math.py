"""Math grading: is the response's final answer equivalent to a golden answer?

Cheap checks run first, in-process, and decide most answers in microseconds: MATH-style string
normalisation, exact rational numbers (with units, `$`, `%`, thousands separators and text
around them removed), multiple-choice letters, and comma lists (unordered for bare lists and
sets, ordered for tuples and intervals). Only answers they cannot decide go to the symbolic
stage: `math-verify`, then a sympy fallback, in a separate worker process with a wall-clock
timeout. The worker is killed and joined on timeout, so the timeout works from any thread and
inside asyncio (no SIGALRM), and a pathological expression never hangs the caller.

    >>> math_reward("<answer>\\\\boxed{0.5}</answer>", ["\\\\frac{1}{2}"]).score
    1.0
    >>> math_reward("<answer>\\\\boxed{2}</answer>", ["\\\\frac{1}{2}"]).components["math_method"]   # decided without sympy
    'cheap'
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from agent_envs.base.reward import RewardResult
from agent_envs.rewards.extract import extract_prediction, too_long

DEFAULT_TIMEOUT_S = 1.0
DEFAULT_REL_TOL = 1e-6

# ---------------------------------------------------------------------------------------------
# normalisation

_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\quad|\\qquad|\\displaystyle|\\\s|~")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|°|\\degree")
_VAR_PREFIX = re.compile(r"^(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?\s*(?:=|\\in)\s*(?=\S)")
_FRAC_SHORT = re.compile(r"\\frac(\d)(\d)")
_FRAC_HALF = re.compile(r"\\frac\{([^{}]+)\}(\d)")
_SQRT_SHORT = re.compile(r"\\sqrt(\d+)")


def normalize_math(s: str) -> str:
    """MATH-style canonical string: wrappers, spacing, `$`, `%`, degrees, `x =` dropped;
    `\\dfrac`/`\\tfrac` -> `\\frac`; no whitespace; no trailing period."""
    s = s.strip()
    for a, b in (("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
        if s.startswith(a) and s.endswith(b) and len(s) >= len(a) + len(b):
            s = s[len(a) : len(s) - len(b)].strip()
    for _ in range(2):  # nested wrappers, e.g. \text{\textbf{B}}
        s = _WRAPPERS.sub(r"\1", s)
    s = _SPACING.sub(" ", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
    s = _DEGREES.sub("", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.strip().rstrip(".").strip()
    if s.count("=") <= 1:
        s = _VAR_PREFIX.sub("", s)
    s = "".join(s.split())
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = s.replace("{,}", ",")
    if s.startswith("."):
        s = "0" + s
    return s


# ---------------------------------------------------------------------------------------------
# numbers

_UNITS = (
    "cm|mm|km|m|kg|mg|g|s|sec|secs|seconds?|minutes?|mins?|hours?|hrs?|h|days?|weeks?|months?|years?|"
    "inch|inches|in|feet|foot|ft|yards?|yd|miles?|mi|mph|kph|units?|dollars?|cents?|degrees?|deg|"
    "meters?|metres?|centimeters?|liters?|litres?|l|ml|pounds?|lbs?|oz|ounces?|percent|points?|"
    "square|sq|cubic|people|students|apples|cups?|pages?|times"
)
_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+"
_NUM_RE = re.compile(rf"^(?P<num>{_NUM})(?:\^\{{?2\}}?|\^\{{?3\}}?)?$")
_FRAC_RE = re.compile(r"^(?P<sign>-?)\\frac\{(?P<a>" + _NUM + r")\}\{(?P<b>" + _NUM + r")\}$")
_SLASH_RE = re.compile(rf"^\(?(?P<a>{_NUM})\)?/\(?(?P<b>{_NUM})\)?$")
_UNIT_TAIL = re.compile(rf"(?:\s*(?:{_UNITS})\b\.?(?:\^\{{?[23]\}}?|\^[23])?)+$", re.IGNORECASE)
_WORD_TAIL = re.compile(r"(?:\s+[a-zA-Z][a-zA-Z.]*)+$")


def _fraction(text: str) -> Fraction | None:
    """An exact rational from a normalised number string, or None."""
    if m := _NUM_RE.match(text):
        return Fraction(m.group("num").replace(",", ""))
    if m := _FRAC_RE.match(text):
        b = Fraction(m.group("b").replace(",", ""))
        if b == 0:
            return None
        v = Fraction(m.group("a").replace(",", "")) / b
        return -v if m.group("sign") else v
    if m := _SLASH_RE.match(text):
        b = Fraction(m.group("b").replace(",", ""))
        return None if b == 0 else Fraction(m.group("a").replace(",", "")) / b
    return None


def parse_number(s: str) -> Fraction | None:
    """The number an answer states, or None when it is not a plain number.

    Accepts `1,000`, `.5`, `-3`, `\\frac{1}{2}`, `1/2`, `$5`, `5%`, `90^\\circ`, and units or words
    after the number (`5 cm`, `5 \\text{ dollars}`, `12 apples`); `2x` is not a number.
    """
    raw = s.strip()
    for _ in range(2):
        raw = _WRAPPERS.sub(r" \1", raw)
    raw = _UNIT_TAIL.sub("", raw.rstrip(". ")).strip()
    raw = _WORD_TAIL.sub("", raw).strip()
    return _fraction(normalize_math(raw)) if raw else None


def numbers_equal(a: Fraction, b: Fraction, rel_tol: float = DEFAULT_REL_TOL) -> bool:
    """Exact for two integers (11111111101 is not 11111111100); otherwise within `rel_tol`, so a
    decimal written to 6+ significant digits matches its fraction, and 0.33 does not match 1/3."""
    if a == b:
        return True
    if a.denominator == 1 and b.denominator == 1:
        return False
    return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=0.0)


# ---------------------------------------------------------------------------------------------
# multiple choice and lists

_CHOICE_GOLD = re.compile(r"^\(?([A-J])\)?$")
# on the raw prediction (whitespace matters): "(B)", "B", "B) 12", "B. twelve", not "(B)+1" or "Because"
_CHOICE_PRED = re.compile(
    r"^(?:(?:option|answer|choice)\s*:?\s*)?(?:\(([A-J])\)|([A-J])[.:)]?)(?:\s|$)", re.IGNORECASE
)
_BRACKETS = {"(": ")", "[": "]", "{": "}"}


def _choice(norm: str, pattern: re.Pattern) -> str | None:
    m = pattern.match(norm)
    return m.group(1).upper() if m else None


def split_top_level(s: str) -> list[str]:
    """Split on commas outside (), [], {} (a normalised string, no whitespace)."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _outer(s: str) -> tuple[str, str, str] | None:
    """(open, body, close) when `s` is wrapped as a whole in one bracket pair, allowing the
    interval pairs `(..]` and `[..)`; None otherwise."""
    if s.startswith("\\{") and s.endswith("\\}"):
        s2 = s[2:-2]
        return ("{", s2, "}") if _balanced(s2) else None
    if len(s) < 2 or s[0] not in "([" or s[-1] not in ")]":
        return None
    body = s[1:-1]
    return (s[0], body, s[-1]) if _balanced(body) else None


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


# ---------------------------------------------------------------------------------------------
# the cheap grader


def cheap_equal(pred: str, gold: str, rel_tol: float = DEFAULT_REL_TOL, _depth: int = 0) -> bool | None:
    """True / False when cheap checks can decide; None when a symbolic check is needed."""
    if not gold.strip() or not pred.strip():
        return False
    if pred.strip() == gold.strip():
        return True
    np_, ng = normalize_math(pred), normalize_math(gold)
    if np_ == ng:
        return True
    if not np_ or not ng:
        return False
    gc = _choice(ng, _CHOICE_GOLD)
    if gc is not None:
        m = _CHOICE_PRED.match(_WRAPPERS.sub(r"\1", pred).strip())
        pc = (m.group(1) or m.group(2)).upper() if m else None
        if pc is not None or len(np_) <= 3:
            return pc == gc
    a, b = parse_number(pred), parse_number(gold)
    if a is not None and b is not None:
        return numbers_equal(a, b, rel_tol)
    if _depth < 2:
        listed = _list_equal(np_, ng, rel_tol, _depth)
        if listed is not None:
            return listed
    if (
        (a is None) != (b is None)
        and re.fullmatch(r"[\w.,\- ]+", np_ + ng)
        and not re.search(r"[a-z]", np_ + ng)
    ):
        return False  # a plain number against plain digits/punctuation that is no number
    if re.fullmatch(r"[A-Za-z ]{2,}", np_) and re.fullmatch(r"[A-Za-z ]{2,}", ng):
        return np_.lower() == ng.lower()  # words ("Evelyn", "odd"): no algebra to do
    return None


def _list_equal(np_: str, ng: str, rel_tol: float, depth: int) -> bool | None:
    go, po = _outer(ng), _outer(np_)
    if go is not None and po is not None:
        if go[0] == "{" or po[0] == "{":  # sets: unordered
            return _items_equal(split_top_level(po[1]), split_top_level(go[1]), rel_tol, depth, ordered=False)
        if (go[0], go[2]) != (po[0], po[2]):
            gi, pi = split_top_level(go[1]), split_top_level(po[1])
            return False if len(gi) == len(pi) == 2 else None  # (0,1] vs [0,1): different intervals
        return _items_equal(split_top_level(po[1]), split_top_level(go[1]), rel_tol, depth, ordered=True)
    gi, pi = split_top_level(ng), split_top_level(np_)
    if len(gi) > 1 or len(pi) > 1:
        if go is not None or po is not None:
            return None  # a tuple against a bare list: let the symbolic stage judge
        return _items_equal(pi, gi, rel_tol, depth, ordered=False)  # "Enter all solutions": any order
    return None


def _items_equal(pred: list[str], gold: list[str], rel_tol: float, depth: int, ordered: bool) -> bool | None:
    if len(pred) != len(gold):
        return False
    if ordered:
        results = [cheap_equal(p, g, rel_tol, depth + 1) for p, g in zip(pred, gold, strict=True)]
        if False in results:
            return False
        return True if all(results) else None
    remaining = list(gold)
    unsure = False
    for p in pred:
        for i, g in enumerate(remaining):
            r = cheap_equal(p, g, rel_tol, depth + 1)
            if r:
                del remaining[i]
                break
            if r is None:
                unsure = True
        else:
            return None if unsure else False
    return True


# ---------------------------------------------------------------------------------------------
# the public grader


def math_equal(
    pred: str | None,
    golden_answers: list[str],
    timeout: float = DEFAULT_TIMEOUT_S,
    rel_tol: float = DEFAULT_REL_TOL,
    symbolic: bool = True,
) -> tuple[bool | None, dict[str, Any]]:
    """(equivalent to some golden answer?, components). Never raises; a grader failure gives
    False with `grader_error` set. Components: `math_method` (string, number, choice, list, words,
    math_verify, sympy, symbolic, too_long (see `extract.too_long`: not graded) or none), `gold`
    (the matching or first golden answer). With `symbolic=False` an answer the cheap checks cannot
    decide gives None instead of waiting for the symbolic stage (a caller that must not block
    grades it later)."""
    comps: dict[str, Any] = {"gold": golden_answers[0] if golden_answers else None, "math_method": "none"}
    if pred is None or not golden_answers:
        return False, comps
    if too_long(pred, golden_answers):
        comps["math_method"] = "too_long"
        return False, comps
    try:
        undecided = []
        for g in golden_answers:
            r = cheap_equal(pred, g, rel_tol)
            if r:
                comps.update(gold=g, math_method="cheap")
                return True, comps
            if r is None:
                undecided.append(g)
        if not undecided:
            comps["math_method"] = "cheap"
            return False, comps
        if not symbolic:
            return None, comps
        from agent_envs.rewards.symbolic import symbolic_equal

        ok, method, err = symbolic_equal(pred, undecided, timeout)
        comps["math_method"] = method
        if err:
            comps["grader_error"] = err
        if ok is not None:
            comps["gold"] = ok
            return True, comps
        return False, comps
    except Exception as e:  # graders never raise (docs/envs.md, Graders)
        comps["grader_error"] = f"{type(e).__name__}: {e}"
        return False, comps


def _result(pred: str | None, ok: bool, comps: dict[str, Any]) -> RewardResult:
    return RewardResult(score=float(ok), components={"math_equal": float(ok), "pred": pred, **comps})


def math_reward(
    response: str,
    golden_answers: list[str],
    timeout: float = DEFAULT_TIMEOUT_S,
    rel_tol: float = DEFAULT_REL_TOL,
) -> RewardResult:
    """1.0 when the prediction is equivalent to any golden answer; components `math_equal`, `pred`,
    `gold`, `math_method` and, on failure of the grader, `grader_error`."""
    try:
        pred = extract_prediction(response)
    except Exception as e:
        return _result(None, False, {"grader_error": f"extract: {type(e).__name__}: {e}"})
    ok, comps = math_equal(pred, golden_answers, timeout, rel_tol)
    return _result(pred, ok, comps)
