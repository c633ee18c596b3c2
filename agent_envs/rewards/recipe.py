"""How an env turns a finished response into its scalar reward.

Three stages: format check, then the task's correctness grader, then an optional bonus. The
components of every stage always go into `info`; the recipe only decides the scalar.

| recipe     | format failed     | correctness used                       | bonus                         |
|------------|-------------------|----------------------------------------|-------------------------------|
| `standard` | `format_penalty`  | math: equivalence; qa/judge: F1; exact | none                          |
| `binary`   | 0                 | 1 if correct (equivalent / EM / judge) | none                          |
| `f1`       | 0                 | token F1 for every task kind           | none                          |
| `arpo`     | -1                | token F1 for every task kind (as the public ARPO code) | +0.1 if both search and python were used |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_envs.core.task import Task
from agent_envs.rewards.base import RewardResult
from agent_envs.rewards.extract import extract_prediction
from agent_envs.rewards.math import math_reward
from agent_envs.rewards.qa import qa_scores

RECIPES = ("standard", "binary", "f1", "arpo")


def correctness(task: Task, response: str) -> dict[str, Any]:
    """Every correctness component that applies to the task's kind, plus `correct` (0/1) and `pred`."""
    pred = extract_prediction(response)
    comps: dict[str, Any] = {"pred": pred, **qa_scores(pred, task.answers)}
    if task.reward == "math":
        comps["math_equal"] = math_reward(response, task.answers).components["math_equal"]
        comps["correct"] = comps["math_equal"]
    elif task.reward == "exact":
        comps["correct"] = float(pred is not None and pred.strip() in [a.strip() for a in task.answers])
    else:
        comps["correct"] = comps["em"]
    return comps


@dataclass(frozen=True)
class RewardRecipe:
    """Configured scalar reward. `name` is one of RECIPES."""

    name: str = "standard"
    format_penalty: float = -1.0
    multi_tool_bonus: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in RECIPES:
            raise ValueError(f"reward recipe {self.name!r} is unknown; choose one of {RECIPES} or pass a callable")

    def __call__(self, task: Task, response: str, format_ok: bool, tool_calls: Mapping[str, int]) -> RewardResult:
        comps = correctness(task, response)
        comps["format_ok"] = float(format_ok)
        if self.name == "arpo":
            if not format_ok or comps["pred"] is None:
                return RewardResult(-1.0, comps)
            bonus = 0.1 if comps["f1"] > 0 and tool_calls.get("search") and tool_calls.get("python") else 0.0
            return RewardResult(comps["f1"] + bonus, comps)
        if self.name == "binary":
            return RewardResult(comps["correct"] if format_ok else 0.0, comps)
        if self.name == "f1":
            return RewardResult(comps["f1"] if format_ok else 0.0, comps)
        if not format_ok:
            return RewardResult(self.format_penalty, comps)
        score = comps["correct"] if task.reward in ("math", "exact") else comps["f1"]
        if score > 0 and self.multi_tool_bonus and tool_calls.get("search") and tool_calls.get("python"):
            score += self.multi_tool_bonus
        return RewardResult(float(score), comps)


RewardFn = Callable[[Task, str, bool, Mapping[str, int]], RewardResult]


def make_reward(spec: str | RewardFn | RewardRecipe, **kwargs: Any) -> RewardFn:
    """A recipe name (with optional `format_penalty` / `multi_tool_bonus`) or a callable with the
    signature `(task, response, format_ok, tool_calls) -> RewardResult`."""
    if isinstance(spec, str):
        if spec == "arpo":
            kwargs = {"format_penalty": -1.0, "multi_tool_bonus": 0.1, **kwargs}
        return RewardRecipe(spec, **kwargs)
    if callable(spec):
        return spec
    raise TypeError(f"reward must be a recipe name {RECIPES} or a callable, got {type(spec).__name__}")
