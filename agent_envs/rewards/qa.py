"""QA grading: SQuAD-style normalisation, exact match and token F1, max over golden aliases.

>>> qa_reward("<answer>\\\\boxed{The Eiffel Tower}</answer>", ["Eiffel Tower"]).score
1.0
"""

from __future__ import annotations

import functools
import re
import string

from agent_envs.base.reward import RewardResult
from agent_envs.rewards.extract import MAX_PRED_CHARS, extract_prediction, too_long

_DROP_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ARTICLE_WORDS = frozenset(("a", "an", "the"))
_SPECIAL = {"yes", "no", "noanswer"}
# Separators of alternatives in a hedged answer; commas are not among them ("Paris, France").
_HEDGE = re.compile(r"\s+(?:and/)?or\s+|\s*[|;]\s*", re.IGNORECASE)


_ANY_PUNCT = re.compile("[" + re.escape(string.punctuation) + "]")


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation and articles, collapse whitespace (SQuAD)."""
    text = text.lower()
    if text.replace(" ", "").isalnum():
        # Words and spaces only, as most answers are: no punctuation, and the article pattern's
        # word boundaries fall only at the spaces (its `\w` is `isalnum` or "_"), so whole words
        # are dropped, without the two regex passes.
        words = text.split()
        if _ARTICLE_WORDS.isdisjoint(words):
            return " ".join(words)
        return " ".join([w for w in words if w not in _ARTICLE_WORDS])
    if _ANY_PUNCT.search(text):  # translate costs five searches; most answers have no punctuation
        text = text.translate(_DROP_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(pred: str, gold: str) -> float:
    return _f1_normalized(normalize_answer(pred), normalize_answer(gold))


def _f1_normalized(p: str, g: str) -> float:
    if p == g:  # the common case of a right answer needs no token counting
        return float(bool(p))
    if p in _SPECIAL or g in _SPECIAL:  # yes/no answers must match exactly, as in HotpotQA's scorer
        return float(p == g)
    pt, gt = p.split(), g.split()
    # tokens in common, counted with multiplicity (a Counter intersection, without its overhead:
    # this runs for every wrong answer)
    left: dict[str, int] = {}
    for t in gt:
        left[t] = left.get(t, 0) + 1
    same = 0
    for t in pt:
        if left.get(t):
            left[t] -= 1
            same += 1
    if same == 0:
        return 0.0
    precision, recall = same / len(pt), same / len(gt)
    return 2 * precision * recall / (precision + recall)


@functools.lru_cache(maxsize=1 << 16)
def _normalized_golds(golden_answers: tuple[str, ...]) -> tuple[str, ...]:
    """Golden answers normalised once per task rather than on every graded step (a benchmark's
    tasks are graded again in every epoch and every sample of a group)."""
    return tuple(normalize_answer(g) for g in golden_answers)


@functools.lru_cache(maxsize=1 << 16)
def _gold_has_separator(golden_answers: tuple[str, ...]) -> bool:
    return any(_HEDGE.search(g) for g in golden_answers)


def candidates(pred: str, golden_answers: list[str]) -> list[str]:
    """The alternatives a prediction hedges between ("Paris or Lyon", "Paris | Lyon", "Paris;
    Lyon"), or `[pred]` when it names one, or when a gold alias is itself written with such a
    separator (then the "or" is part of the name).

    >>> candidates("Ada Lovelace or Charles Babbage", ["Ada Lovelace"])
    ['Ada Lovelace', 'Charles Babbage']
    >>> candidates("Pride or Prejudice", ["Pride or Prejudice"])
    ['Pride or Prejudice']
    """
    if _HEDGE.search(pred) is None or _gold_has_separator(tuple(golden_answers)):
        return [pred]
    parts = [p for p in _HEDGE.split(pred) if normalize_answer(p)]
    return parts if len({normalize_answer(p) for p in parts}) > 1 else [pred]


def qa_scores(pred: str | None, golden_answers: list[str], hedge: bool = True) -> dict[str, float]:
    """`em`, `f1` and `acc` (gold is a substring of the prediction), each the max over aliases.

    A prediction past the length cap (`extract.too_long`) scores 0, with `too_long` set.
    A hedged prediction (`candidates`) is scored as its weakest candidate, and `hedged` says how
    many it listed: token F1 otherwise pays for listing candidates ("Ada Lovelace or Charles
    Babbage" has F1 0.57 against "Ada Lovelace", more than a coin-flip guess earns).
    `hedge=False` scores the text as written, as the ARPO reference does.

    >>> qa_scores("Ada Lovelace or Charles Babbage", ["Ada Lovelace"])
    {'em': 0.0, 'f1': 0.0, 'acc': 0.0, 'hedged': 2.0}
    >>> round(qa_scores("Ada Lovelace or Charles Babbage", ["Ada Lovelace"], hedge=False)["f1"], 2)
    0.57
    """
    if pred is None or not golden_answers:
        return {"em": 0.0, "f1": 0.0, "acc": 0.0}
    # past the cap, F1 would be near 0 anyway, after seconds of tokenising (`len` first: no call
    # for a prediction of normal length)
    if len(pred) > MAX_PRED_CHARS and too_long(pred, golden_answers):
        return {"em": 0.0, "f1": 0.0, "acc": 0.0, "too_long": 1.0}
    golds = _normalized_golds(tuple(golden_answers))
    npred = normalize_answer(pred)
    # the hedge regex costs more than the rest of grading; a hedge needs "|", ";" or the word "or",
    # whose letters normalising keeps (lowercased), so the normalised text shows it
    if not hedge or not ("|" in pred or ";" in pred or "or" in npred):
        return _scores(npred, golds)
    parts = candidates(pred, golden_answers)
    if len(parts) == 1:  # `pred` itself
        return _scores(npred, golds)
    scores = [_scores(normalize_answer(p), golds) for p in parts]
    out = {k: min(s[k] for s in scores) for k in ("em", "f1", "acc")}
    out["hedged"] = float(len(parts))
    return out


def _scores(npred: str, golds: tuple[str, ...]) -> dict[str, float]:
    if len(golds) == 1:  # most tasks have one answer: no generator expressions to run
        g = golds[0]
        if npred == g:  # a right answer: nothing to count
            right = float(bool(g))
            return {"em": 1.0, "f1": right, "acc": right}
        return {"em": 0.0, "f1": _f1_normalized(npred, g), "acc": float(bool(g) and g in npred)}
    return {
        "em": max(float(npred == g) for g in golds),
        "f1": max(_f1_normalized(npred, g) for g in golds),
        "acc": max(float(bool(g) and g in npred) for g in golds),
    }


def answer_in_text(text: str, golden_answers: list[str]) -> bool:
    """Does a golden answer appear anywhere in `text`, as whole normalised words? A lenient upper
    bound for responses that never write the answer format (zero-shot baselines): a response
    that lists many candidates counts as right too.

    >>> answer_in_text("I think the tower is in Paris, France.", ["Paris"])
    True
    >>> answer_in_text("It is 1234.", ["123"])
    False
    """
    words = f" {normalize_answer(text)} "
    return any((g := normalize_answer(a)) and f" {g} " in words for a in golden_answers)


def qa_reward(response: str, golden_answers: list[str]) -> RewardResult:
    """Token F1 of the response's prediction; components `em`, `f1`, `acc`, `pred`."""
    pred = extract_prediction(response)
    scores = qa_scores(pred, golden_answers)
    return RewardResult(score=scores["f1"], components={**scores, "pred": pred})
