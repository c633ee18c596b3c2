"""Math grading: equivalences that matter, non-equivalences, and the never-hang / never-raise rules.

The symbolic stage runs in real worker processes (no mocks); the timeout test gives one a
pathological expression and checks that it is killed and reaped, from a thread and from asyncio.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import pytest

from agent_envs.base.task import Task
from agent_envs.rewards import make_reward, math_reward
from agent_envs.rewards.math import cheap_equal, math_equal, normalize_math, parse_number
from agent_envs.rewards.symbolic import default_pool

# these tests check verdicts, not speed: a loaded CI machine must not turn a verdict into a timeout
SLOW_MACHINE_TIMEOUT = 20.0


def wrap(pred: str) -> str:
    return f"<think>x</think><answer>\\boxed{{{pred}}}</answer>"


EQUIVALENT = [
    # fractions vs decimals, \frac forms
    ("0.5", "\\frac{1}{2}"),
    ("\\dfrac{1}{2}", "\\frac12"),
    ("\\tfrac{3}{4}", "0.75"),
    ("-\\frac{1}{2}", "-0.5"),
    ("1/2", "\\frac{1}{2}"),
    (".35625", "0.35625"),
    ("\\frac{16}{5}", "3.2"),
    # units, currency, percent, degrees and text around numbers
    ("5 cm", "5"),
    ("5\\text{ cm}", "5"),
    ("\\$5", "5"),
    ("$5", "5"),
    ("5\\%", "5"),
    ("5%", "5"),
    ("90^\\circ", "90"),
    ("12 apples", "12"),
    ("1,000", "1000"),
    ("1{,}000", "1000"),
    ("x = 5", "5"),
    ("18.90", "\\$18.90"),
    # multiple choice
    ("(B)", "B"),
    ("B", "\\text{(B)}"),
    ("B) 12", "B"),
    ("\\frac{1}{3}", "0.3333333"),  # 7 significant digits: within the default relative 1e-6
    # lists: bare lists and sets in any order; tuples and intervals in order
    ("1, 2", "2,1"),
    ("\\{1,2\\}", "\\{2, 1\\}"),
    ("x=1, x=-1", "-1, 1"),
    ("(0,1]", "(0, 1]"),
    ("(-\\infty, 1)", "(-\\infty,1)"),
    ("(6,31,-1)", "(6, 31, -1)"),
    # symbolic (math-verify in a worker)
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("(3,\\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("10^{5}", "100000"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}"),
    # words
    ("\\text{Evelyn}", "Evelyn"),
]

NOT_EQUIVALENT = [
    ("1/2", "2"),
    ("0.33", "\\frac{1}{3}"),  # default tolerance is relative 1e-6, not 2 digits
    ("2", "\\frac{1}{2}"),
    ("2x", "2"),
    ("(1,2)", "(2,1)"),  # ordered pair
    ("[0,1)", "(0,1]"),  # different interval
    ("1, 2, 3", "1, 2"),
    ("(A)", "B"),
    ("\\text{(C)}+1", "\\text{(C)}"),
    ("11111111101", "11,\\! 111,\\! 111,\\! 100"),  # integers compare exactly, at any size
    ("\\pi", "3.14159"),
    ("5", "50"),
    ("1001", "1000"),
    ("\\sqrt{2}", "2"),
    ("Evelyn", "Emily"),
    ("", "5"),
    ("5", " "),  # a blank golden answer matches nothing
]


@pytest.mark.parametrize(("pred", "gold"), EQUIVALENT)
def test_equivalent(pred: str, gold: str) -> None:
    r = math_reward(wrap(pred), [gold], timeout=SLOW_MACHINE_TIMEOUT)
    assert r.score == 1.0, r.components
    assert r.components["math_equal"] == 1.0 and r.components["gold"] == gold
    assert "grader_error" not in r.components


@pytest.mark.parametrize(("pred", "gold"), NOT_EQUIVALENT)
def test_not_equivalent(pred: str, gold: str) -> None:
    r = math_reward(wrap(pred), [gold], timeout=SLOW_MACHINE_TIMEOUT)
    assert r.score == 0.0, r.components
    assert "grader_error" not in r.components


def test_any_golden_alias_counts_and_the_matching_one_is_reported() -> None:
    r = math_reward(wrap("0.25"), ["7", "\\frac{1}{4}"])
    assert r.score == 1.0 and r.components["gold"] == "\\frac{1}{4}"


def test_cheap_checks_decide_common_answers_without_the_worker() -> None:
    # numbers, letters, lists and words never reach the symbolic stage, right or wrong
    for pred, gold in [("0.5", "\\frac12"), ("3", "4"), ("(B)", "C"), ("2, 1", "1,2"), ("odd", "even")]:
        assert cheap_equal(pred, gold) is not None
    assert math_equal("3", ["4"])[1]["math_method"] == "cheap"
    assert cheap_equal("\\sqrt{8}", "2\\sqrt{2}") is None  # needs algebra


def test_normalisation_and_number_parsing() -> None:
    assert normalize_math("\\left( 3, \\dfrac{\\pi}{2} \\right)") == "(3,\\frac{\\pi}{2})"
    assert normalize_math("$x = 10$.") == "10"
    assert parse_number("5 \\text{ dollars}") == 5
    assert parse_number("-\\frac{3}{4}") == parse_number("-0.75")
    assert parse_number("2x") is None and parse_number("\\frac{1}{0}") is None


def test_no_prediction_and_garbage_never_raise() -> None:
    assert math_reward("no answer tags at all", ["5"]).score == 0.0
    assert math_reward("<answer>\\boxed{\\frac{1}{</answer>", ["5"]).score == 0.0
    assert math_reward(wrap("5"), []).score == 0.0
    weird = ["\\frac{", "}}}{{{", "\ud800", "\\begin{pmatrix}1&2", "(" * 500, "^" * 100, "\\sqrt"]
    for w in weird:
        r = math_reward(wrap(w), ["\\frac{1}{2}", w[::-1]])
        assert r.score in (0.0, 1.0)


@pytest.mark.slow
def test_pathological_expression_times_out_and_the_worker_is_reaped() -> None:
    pool = default_pool()
    pool.warmup()
    before = pool.timeouts
    t0 = time.monotonic()
    r = math_reward(wrap("(x+1)^{300}"), ["x^{300}+1"], timeout=0.3)
    elapsed = time.monotonic() - t0
    assert r.score == 0.0 and r.components["math_method"] == "timeout"
    assert "worker killed" in r.components["grader_error"]
    assert pool.timeouts == before + 1
    assert elapsed < 5.0  # 0.3 s budget + terminate/join, never the minutes sympy would take
    # the pool recovers: the next symbolic check works
    assert math_reward(wrap("\\sqrt{8}"), ["2\\sqrt{2}"], timeout=30).score == 1.0


@pytest.mark.slow
def test_timeout_works_off_the_main_thread() -> None:
    out: dict = {}

    def work() -> None:
        out["slow"] = math_reward(wrap("(x+1)^{300}"), ["x^{300}+1"], timeout=0.3)
        out["fast"] = math_reward(wrap("\\sqrt{8}"), ["2\\sqrt{2}"], timeout=30)

    th = threading.Thread(target=work)
    th.start()
    th.join(60)
    assert not th.is_alive()
    assert out["slow"].components["math_method"] == "timeout"
    assert out["fast"].score == 1.0


@pytest.mark.slow
async def test_async_grading_keeps_the_event_loop_running() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    def graded(pred: str, gold: str, timeout: float = 30):
        """What ToolEnv awaits: the recipe's grade, an awaitable when only the symbolic stage decides."""
        task = Task(id=pred, question="?", answers=[gold], reward="math")
        result = make_reward("binary", math_timeout=timeout).grade(task, wrap(pred), True, {})
        return result if inspect.isawaitable(result) else asyncio.sleep(0, result)

    t = asyncio.create_task(ticker())
    slow, fast, cheap = await asyncio.gather(
        graded("(x+1)^{300}", "x^{300}+1", timeout=0.3),
        graded("\\sqrt{8}", "2\\sqrt{2}"),
        graded("0.5", "\\frac12"),
    )
    t.cancel()
    assert slow.components["math_method"] == "timeout"
    assert fast.score == 1.0 and cheap.score == 1.0
    assert cheap.components["math_method"] == "cheap"  # decided inline, never sent to the worker
    assert ticks >= 10  # the loop ran while the worker computed
