"""How an env turns a finished response into its scalar reward.

Three stages: format check, then the task's correctness grader, then an optional bonus. The
components of every stage always go into `info`; the recipe only decides the scalar.

| recipe     | format failed     | correctness used                                          | bonus |
|------------|-------------------|-----------------------------------------------------------|-------|
| `standard` | `format_penalty`  | math: equivalence; judge: LLM verdict (EM without a judge); qa: F1; exact | `multi_tool_bonus` |
| `binary`   | 0                 | 1 if correct (equivalent / judge / EM)                    | none  |
| `f1`       | 0                 | token F1 for every task kind                              | none  |
| `arpo`     | -1                | token F1 for every task kind, as the public ARPO code     | +0.1 if both search and python were used |

A prediction that hedges ("A or B") scores as its weakest candidate in every recipe but `arpo`
(`hedge=`, see `qa_scores`), and one past the graders' length cap scores 0 in all of them.

`tool_cost` (default 0) is subtracted once per tool call from the scalar of a well-formed
response in the `standard` and `binary` recipes: a cheap way to let RL learn to skip calls a
task does not need (a correct answer still outweighs a few calls). When it is set, the amount
charged is the `tool_cost` component (0 for a malformed response, which is not charged); the
learners can scale it by the group's pass rate (`reward.tool_cost_scaling`, docs/algorithms.md §11.2).

The `arpo` recipe is the reference training reward of ARPO/AEPO (docs/envs.md, The ARPO reference recipe): -1
when the format check fails or no `\\boxed{}` prediction exists; otherwise the token F1 of the prediction (max
over golden aliases, SQuAD normalisation; `yes`/`no`/`noanswer` must match exactly), plus 0.1 when F1 > 0
and the response used both `search` and `python`. The range is {-1} U [0, 1.1]. Math is graded by
F1 too in this recipe (`\\frac{1}{2}` becomes "frac12"), as in the reference; `math_equal` is
still reported in the components.

Judge tasks (`task.reward == "judge"`) use `RewardRecipe(judge=LLMJudge(...))` when given, and
exact match otherwise, with `judge_fallback` saying why; a judge task without a prediction is
wrong with no request made. Only `standard` and `binary` call the judge; `f1` and `arpo` never
pay for it.

Each recipe grades in one place, `grade(task, response, format_ok, tool_calls)`: it returns the
`RewardResult` when in-process checks decide, else an awaitable of it (a judge request, or a math
answer only the symbolic stage can decide), which `ToolEnv` awaits on its event loop so nothing
blocks it. Calling the recipe, `recipe(...)`, is `grade` waited for in place.

    >>> from agent_envs.base.task import Task
    >>> r = make_reward("arpo")(Task("t", "q?", ["Paris"]), "<think>x</think><answer>\\\\boxed{Paris}</answer>", True, {})
    >>> r.score, r.components["f1"]
    (1.0, 1.0)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent_envs.base.reward import RewardResult
from agent_envs.base.task import Task
from agent_envs.rewards.extract import extract_prediction
from agent_envs.rewards.judge import JudgeVerdict, LLMJudge
from agent_envs.rewards.math import DEFAULT_TIMEOUT_S, math_equal
from agent_envs.rewards.qa import qa_scores

RECIPES = ("standard", "binary", "f1", "arpo")
_NO_JUDGE = "em: no judge configured (RewardRecipe(judge=LLMJudge(...)))"
T = TypeVar("T")


def _exact(task: Task, pred: str | None) -> float:
    return float(pred is not None and pred.strip() in [a.strip() for a in task.answers])


def _apply_verdict(comps: dict[str, Any], verdict: JudgeVerdict | None) -> dict[str, Any]:
    if verdict is None:
        comps["judge_fallback"] = _NO_JUDGE
        comps["correct"] = comps["em"]
        return comps
    comps["judge_raw"] = verdict.raw
    if verdict.screened:
        comps["judge_screened"] = verdict.screened
    if verdict.correct is None:
        comps["judge_error"] = verdict.error
        comps["judge_fallback"] = f"em: judge failed ({verdict.error})"
        comps["correct"] = comps["em"]
    else:
        comps["judge_equal"] = float(verdict.correct)
        comps["correct"] = comps["judge_equal"]
    return comps


# Nothing to judge: wrong, not a judge failure, and no request is made.
_NO_PREDICTION = JudgeVerdict(False, "", None)


def _components(
    task: Task, response: str, judge: LLMJudge | None, math_timeout: float, hedge: bool,
) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    """The correctness components of the task's kind, plus `correct` (0/1) and `pred`: at once
    when in-process checks decide, else an awaitable of them (a judge request, or a math answer
    only the symbolic stage can decide). The one grader behind `grade` and `correctness`."""
    try:
        pred = extract_prediction(response)
        comps = {"pred": pred, **qa_scores(pred, task.answers, hedge)}
        kind = task.reward
        if kind == "qa":  # the commonest kind first
            comps["correct"] = comps["em"]
        elif kind == "math":
            ok, mc = math_equal(pred, task.answers, math_timeout, symbolic=False)
            if ok is None:
                return _symbolic(comps, pred, task.answers, math_timeout)
            comps.update(mc, math_equal=float(ok), correct=float(ok))
        elif kind == "exact":
            comps["correct"] = _exact(task, pred)
        elif judge is None:  # judge (Task checks its kind)
            _apply_verdict(comps, None)
        elif pred is None:
            _apply_verdict(comps, _NO_PREDICTION)
        else:
            return _judged(comps, judge, task, pred)
        return comps
    except Exception as e:  # graders never raise (docs/envs.md, Graders)
        return _grader_failure(e)


async def _symbolic(comps: dict[str, Any], pred: str, golds: list[str], timeout: float) -> dict[str, Any]:
    """The symbolic math stage, in a thread: the event loop keeps running while a worker computes."""
    try:
        ok, mc = await asyncio.to_thread(math_equal, pred, golds, timeout)
        comps.update(mc, math_equal=float(ok), correct=float(ok))
        return comps
    except Exception as e:
        return _grader_failure(e)


async def _judged(comps: dict[str, Any], judge: LLMJudge, task: Task, pred: str) -> dict[str, Any]:
    try:
        return _apply_verdict(comps, await judge.ajudge(task.question, task.answers, pred))
    except Exception as e:
        return _grader_failure(e)


def _grader_failure(exc: Exception) -> dict[str, Any]:
    """Components of a grader that raised: wrong, with the error named (graders never raise)."""
    return {"pred": None, "em": 0.0, "f1": 0.0, "acc": 0.0, "correct": 0.0,
            "grader_error": f"{type(exc).__name__}: {exc}"}


def wait_for_grade(result: T | Awaitable[T]) -> T:
    """`result`, awaited here when it is awaitable: the blocking driver of `grade` for code
    without an event loop. With a loop running in this thread, the awaitable runs to completion
    on a helper thread's loop and this call blocks (prefer `await` there)."""
    if not inspect.isawaitable(result):
        return result

    async def run() -> T:  # asyncio.run takes a coroutine; a plain callable may return any awaitable
        return await result

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run())
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, run()).result()


def correctness(
    task: Task, response: str, judge: LLMJudge | None = None, math_timeout: float = DEFAULT_TIMEOUT_S,
    hedge: bool = True,
) -> dict[str, Any]:
    """Every correctness component that applies to the task's kind, plus `correct` (0/1) and
    `pred`, waiting here for a judge or the symbolic stage. Never raises: a grader failure gives
    `correct = 0` and `grader_error`. `hedge`: score a prediction listing alternatives as its
    weakest one (`qa_scores`)."""
    return wait_for_grade(_components(task, response, judge, math_timeout, hedge))


@dataclass(frozen=True)
class RewardRecipe:
    """Configured scalar reward. `name` is one of RECIPES; `judge` grades `reward="judge"` tasks
    in the `standard` and `binary` recipes."""

    name: str = "standard"
    format_penalty: float = -1.0
    multi_tool_bonus: float = 0.0
    judge: LLMJudge | None = field(default=None, compare=False)
    math_timeout: float = DEFAULT_TIMEOUT_S
    tool_cost: float = 0.0
    # Hedged answers ("A or B") score as their weakest candidate; None: all recipes but `arpo`,
    # which keeps the reference's plain F1 (docs/envs.md, Reward hacking: what is guaranteed).
    hedge: bool | None = None

    def __post_init__(self) -> None:
        if self.name not in RECIPES:
            raise ValueError(
                f"reward recipe {self.name!r} is unknown; choose one of {RECIPES} or pass a callable"
            )
        if self.hedge is None:
            object.__setattr__(self, "hedge", self.name != "arpo")
        # the judge `grade` passes on, decided once: `grade` runs on every finished episode
        object.__setattr__(self, "_judge_used", self.judge if self.uses_judge else None)

    @property
    def uses_judge(self) -> bool:
        return self.name in ("standard", "binary")

    @property
    def format_failure_score(self) -> float:
        """The scalar of a response that fails the format check (a truncated one always does)."""
        return self.format_penalty if self.name in ("standard", "arpo") else 0.0

    def bounds(self, max_tool_calls: int | None = None) -> tuple[float, float]:
        """The (low, high) range of the scalar, given the env's limit on tool calls (the
        `tool_cost` of `standard` and `binary` is paid per call; no limit: no lower bound).

        >>> RewardRecipe("arpo", multi_tool_bonus=0.1).bounds()
        (-1.0, 1.1)
        >>> RewardRecipe("binary", tool_cost=0.25).bounds(max_tool_calls=4)
        (-1.0, 1.0)
        """
        high = 1.0 + (self.multi_tool_bonus if self.name in ("standard", "arpo") else 0.0)
        low = min(self.format_failure_score, 0.0)
        if self.tool_cost and self.name in ("standard", "binary"):
            low = min(low, -self.tool_cost * max_tool_calls if max_tool_calls is not None else -math.inf)
        return low, high

    def _score(
        self, task: Task, comps: dict[str, Any], format_ok: bool, tool_calls: Mapping[str, int]
    ) -> RewardResult:
        comps["format_ok"] = float(format_ok)
        if self.name == "arpo":
            if not format_ok or comps["pred"] is None:
                return RewardResult(self.format_penalty, comps)
            bonus = self.multi_tool_bonus if comps["f1"] > 0 and _both_tools(tool_calls) else 0.0
            return RewardResult(comps["f1"] + bonus, comps)
        cost = self.tool_cost * sum(tool_calls.values()) if self.tool_cost else 0.0
        if self.tool_cost and self.name in ("standard", "binary"):
            # its own component, beside correct and format_ok: what the scalar was charged
            comps["tool_cost"] = cost if format_ok else 0.0
        if self.name == "binary":
            return RewardResult(comps["correct"] - cost if format_ok else 0.0, comps)
        if self.name == "f1":
            return RewardResult(comps["f1"] if format_ok else 0.0, comps)
        if not format_ok:
            return RewardResult(self.format_penalty, comps)
        score = comps["correct"] if task.reward in ("math", "exact", "judge") else comps["f1"]
        if score > 0 and self.multi_tool_bonus and _both_tools(tool_calls):
            score += self.multi_tool_bonus
        return RewardResult(float(score) - cost, comps)

    def grade(
        self, task: Task, response: str, format_ok: bool, tool_calls: Mapping[str, int]
    ) -> RewardResult | Awaitable[RewardResult]:
        """The reward of a finished response: a `RewardResult` when in-process checks decide, else
        an awaitable of one (a judge request, or a math answer only the symbolic stage can
        decide). `ToolEnv` awaits it on its event loop; `recipe(...)` waits for it here."""
        comps = _components(task, response, self._judge_used, self.math_timeout, self.hedge)
        if isinstance(comps, dict):
            return self._score(task, comps, format_ok, tool_calls)
        return self._score_later(comps, task, format_ok, tool_calls)

    async def _score_later(
        self, comps: Awaitable[dict[str, Any]], task: Task, format_ok: bool, tool_calls: Mapping[str, int]
    ) -> RewardResult:
        return self._score(task, await comps, format_ok, tool_calls)

    def __call__(
        self, task: Task, response: str, format_ok: bool, tool_calls: Mapping[str, int]
    ) -> RewardResult:
        """`grade`, waiting here for what it awaits (a plain `RewardFn`, for code without a loop)."""
        return wait_for_grade(self.grade(task, response, format_ok, tool_calls))


def _both_tools(tool_calls: Mapping[str, int]) -> bool:
    return bool(tool_calls.get("search")) and bool(tool_calls.get("python"))


RewardFn = Callable[[Task, str, bool, Mapping[str, int]], RewardResult | Awaitable[RewardResult]]


def grader(reward: RewardFn | RewardRecipe) -> RewardFn:
    """What an env calls to grade a finished response: a recipe's `grade`, or the callable itself
    (its result may be a `RewardResult` or an awaitable one)."""
    return reward.grade if isinstance(reward, RewardRecipe) else reward


def make_reward(spec: str | RewardFn | RewardRecipe, **kwargs: Any) -> RewardFn:
    """A recipe name (with optional `format_penalty`, `multi_tool_bonus`, `judge`, `math_timeout`, `tool_cost`, `hedge`)
    or a callable with the signature `(task, response, format_ok, tool_calls) -> RewardResult`.

    `judge` is an `LLMJudge` or a dict of its arguments; when absent and AGENT_ENVS_JUDGE_URL is
    set, the `standard` and `binary` recipes build one from the environment."""
    if isinstance(spec, str):
        if spec == "arpo":
            kwargs = {"format_penalty": -1.0, "multi_tool_bonus": 0.1, **kwargs}
        judge = kwargs.get("judge")
        if isinstance(
            judge, Mapping
        ):  # JSON-friendly: reward_kwargs={"judge": {"base_url": ..., "model": ...}}
            kwargs["judge"] = LLMJudge(**judge)
        elif judge is None and os.environ.get("AGENT_ENVS_JUDGE_URL") and spec in ("standard", "binary"):
            kwargs["judge"] = LLMJudge()  # configured by AGENT_ENVS_JUDGE_URL / _MODEL / _API_KEY
        return RewardRecipe(spec, **kwargs)
    if callable(spec):
        return spec
    raise TypeError(f"reward must be a recipe name {RECIPES} or a callable, got {type(spec).__name__}")
