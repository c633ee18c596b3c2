"""Reward recipes: the ARPO reference recipe's values, the standard recipe per task kind, and
that components always carry the grader's evidence."""

from __future__ import annotations

import pytest

from agent_envs.base.reward import RewardResult
from agent_envs.base.task import Task
from agent_envs.core.protocols import arpo_format_check
from agent_envs.rewards import RewardRecipe, make_reward
from agent_envs.rewards.recipe import grader, wait_for_grade

QA = Task(id="q", question="Who?", answers=["Frank Lowy"], reward="qa")
MATH = Task(id="m", question="1/2?", answers=["\\frac{1}{2}"], reward="math")


def resp(pred: str, tools: str = "") -> str:
    return f"<think>x</think>{tools}<answer>\\boxed{{{pred}}}</answer>"


def score(recipe, task: Task, response: str, calls=None):
    ok, _ = arpo_format_check(response)
    return recipe(task, response, ok, calls or {})


def test_arpo_recipe_values() -> None:
    arpo = make_reward("arpo")
    both = "<search>a</search><result>r</result><python>1</python><result>1</result>"
    assert score(arpo, QA, resp("Frank Lowy")).score == 1.0
    assert score(arpo, QA, resp("Frank Lowy", both), {"search": 1, "python": 1}).score == pytest.approx(1.1)
    assert score(arpo, QA, resp("Frank"), {"search": 1, "python": 1}).score == pytest.approx(2 / 3 + 0.1)
    assert score(arpo, QA, resp("Nobody"), {"search": 1, "python": 1}).score == 0.0  # no bonus at F1 = 0
    assert score(arpo, QA, "<answer>\\boxed{Frank Lowy}</answer>").score == -1.0  # no think
    assert score(arpo, QA, "<think>x</think><answer>Frank Lowy</answer>").score == -1.0  # no boxed
    # math is graded by F1 in the reference recipe, with math_equal still reported
    r = score(arpo, MATH, resp("0.5"))
    assert r.score == 0.0 and r.components["math_equal"] == 1.0


def test_standard_recipe_per_task_kind() -> None:
    std = make_reward("standard")
    assert score(std, MATH, resp("0.5")).score == 1.0
    assert score(std, QA, resp("Frank")).score == pytest.approx(2 / 3)
    assert score(std, QA, "no tags").score == -1.0
    exact = Task(id="e", question="code?", answers=["AbC"], reward="exact")
    assert score(std, exact, resp("AbC")).score == 1.0 and score(std, exact, resp("abc")).score == 0.0
    assert score(make_reward("binary"), QA, resp("Frank")).score == 0.0
    assert score(make_reward("f1"), MATH, resp("\\frac{1}{2}")).score == 1.0


def test_tool_cost_is_paid_per_call_by_well_formed_responses_only() -> None:
    calls = "<python>1</python><result>1</result>"
    for name in ("standard", "binary"):
        costly = make_reward(name, tool_cost=0.05)
        assert score(costly, MATH, resp("0.5")).score == 1.0  # no call, no cost
        assert score(costly, MATH, resp("0.5", calls * 2), {"python": 2}).score == pytest.approx(0.9)
        assert score(costly, MATH, resp("7", calls), {"python": 1}).score == pytest.approx(-0.05)
        assert score(costly, MATH, "no tags", {"python": 1}).score == (-1.0 if name == "standard" else 0.0)
    assert score(make_reward("standard"), MATH, resp("0.5", calls), {"python": 1}).score == 1.0  # off by default


def test_components_always_present() -> None:
    r = score(make_reward("standard"), MATH, resp("0.5"))
    for key in ("pred", "em", "f1", "acc", "math_equal", "gold", "math_method", "format_ok", "correct"):
        assert key in r.components


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown"):
        RewardRecipe("best")
    with pytest.raises(TypeError, match="recipe name"):
        make_reward(3)


async def test_grade_is_awaited_only_when_it_must_wait_and_agrees_with_the_blocking_call() -> None:
    """`grade` answers at once when in-process checks decide; an answer only the symbolic stage
    can decide comes back as an awaitable. Awaited or waited for in place, the verdict is one."""
    for recipe in (make_reward("standard"), make_reward("arpo")):
        for task, response, waits in [(MATH, resp("0.5"), False), (MATH, resp("2\\sqrt{2}"), True),
                                      (QA, resp("Frank"), False)]:
            ok, _ = arpo_format_check(response)
            graded = recipe.grade(task, response, ok, {})
            assert isinstance(graded, RewardResult) is not waits, response
            a = await graded if waits else graded
            s = recipe(task, response, ok, {})
            assert a.score == s.score and a.components == s.components


def test_a_plain_callable_may_return_an_awaitable() -> None:
    async def later(task, response, format_ok, tool_calls):
        return RewardResult(0.5, {"why": "async"})

    fn = make_reward(later)
    assert grader(fn) is later and wait_for_grade(fn(QA, "x", True, {})).score == 0.5
    assert grader(make_reward("f1")).__func__ is RewardRecipe.grade
