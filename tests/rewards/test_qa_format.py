"""QA grading (SQuAD normalisation, EM, token F1 over aliases) and the ARPO format rule."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_envs.core.protocols import arpo_format_check
from agent_envs.rewards import normalize_answer, qa_reward, token_f1
from agent_envs.rewards.extract import last_boxed
from agent_envs.rewards.qa import answer_in_text, candidates


def wrap(pred: str) -> str:
    return f"<think>x</think><answer>\\boxed{{{pred}}}</answer>"


def test_normalisation_is_squad() -> None:
    assert normalize_answer("  The Eiffel  Tower! ") == "eiffel tower"
    assert normalize_answer("An apple, a day.") == "apple day"


def squad_normalize(text: str) -> str:
    """The SQuAD scorer's normalisation as it is written there, to check the shortcuts against."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


PIECES = ["a", "an", "the", "The", "AN", "Eiffel", "tower", "1961", "x2", "é", "e\u0301", "Ⅻ", "٣", "ß", "İ",
          "_", "-", ",", "'s", "’", "the_", "théâtre", " ", "  ", "\t", "\n", "\u00a0", "\u2028", "."]


@given(st.lists(st.sampled_from(PIECES), max_size=8).map("".join))
def test_normalisation_shortcut_matches_the_squad_formula(text: str) -> None:
    assert normalize_answer(text) == squad_normalize(text)


def test_f1_is_max_over_aliases_and_em_acc_are_reported() -> None:
    r = qa_reward(wrap("New York City"), ["NYC", "New York City", "Big Apple"])
    assert r.score == 1.0 and r.components["em"] == 1.0
    r = qa_reward(wrap("the city of New York"), ["New York City"])
    assert 0 < r.score < 1 and r.components["em"] == 0.0
    assert r.score == pytest.approx(2 * (3 / 4) * 1 / (3 / 4 + 1))  # "city of new york" vs "new york city"
    r = qa_reward(wrap("It was Paris, France"), ["Paris"])
    assert r.components["acc"] == 1.0 and r.components["em"] == 0.0


def test_yes_no_must_match_exactly() -> None:
    assert token_f1("yes it is", "yes") == 0.0
    assert token_f1("no", "no") == 1.0
    assert qa_reward(wrap("yes"), ["no"]).score == 0.0


def test_boxed_and_hedge_shortcuts_agree_with_the_full_scan() -> None:
    # last_boxed takes the next "}" when no "{" comes first, else counts nesting
    assert last_boxed("a \\boxed{x} b \\boxed{Paris}.") == "Paris"
    assert last_boxed("\\boxed{\\frac{1}{2}} z") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{{}}") == "{}"
    assert last_boxed("\\boxed{open") is None and last_boxed("\\boxed{a{b}") is None
    # candidates skips the regex only when no separator can be there; any case of "or" counts
    assert candidates("Ada Lovelace OR Charles Babbage", ["Ada Lovelace"]) == ["Ada Lovelace", "Charles Babbage"]
    assert candidates("Ada; Charles", ["Ada"]) == ["Ada", "Charles"]
    assert candidates("Oregon Trail", ["Oregon Trail"]) == ["Oregon Trail"]
    assert candidates("Paris", ["Paris"]) == ["Paris"]


def test_no_prediction_scores_zero() -> None:
    r = qa_reward("I think it is Paris", ["Paris"])
    assert r.score == 0.0 and r.components["pred"] is None


@pytest.mark.parametrize(
    ("response", "rule"),
    [
        ("<answer>\\boxed{1}</answer>", "think_tags"),
        ("<think>a</think><think>b</think><answer>\\boxed{1}</answer>", None),
        ("<think>a</think><answer>1</answer>", "no_boxed"),
        ("<think>a</think><answer>\\boxed{1}</answer><answer>\\boxed{2}</answer>", "answer_tags"),
        ("<think>a</think><search>q</search><answer>\\boxed{1}</answer>", "search_without_result"),
        ("<think>a</think><search>q</search><result>r</result><answer>\\boxed{1}</answer>", None),
        ("<think>a</think><python>1</python><result>1</result><answer>\\boxed{1}</answer>", None),
    ],
)
def test_arpo_format_rules(response: str, rule: str | None) -> None:
    ok, why = arpo_format_check(response)
    assert ok is (rule is None) and why == rule


def test_prefilled_think_counts() -> None:
    assert arpo_format_check("x</think><answer>\\boxed{1}</answer>", prefill="<think>")[0]


@pytest.mark.parametrize("text, golds, expected", [
    ("The founder was Matuk Dramin, I believe.", ["Matuk Dramin"], True),
    ("It was founded by the Dramin family.", ["Matuk Dramin"], False),  # part of a name is not the name
    ("2055 mod 75 = 30", ["30"], True),
    ("The result is 1230.", ["123"], False),  # whole words only
    ("Paris or Lyon", ["Lyon", "Marseille"], True),  # any alias
    ("anything", [""], False),  # an empty answer is never found
])
def test_answer_in_text_is_whole_normalised_words(text, golds, expected):
    assert answer_in_text(text, golds) is expected
