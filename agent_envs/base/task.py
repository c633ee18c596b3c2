"""The unit of work an environment plays: one question, its golden answers, and how to solve it.

    >>> t = Task(id="demo-0", question="What is 6*7?", answers=["42"], reward="math")
    >>> t.answers
    ['42']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REWARD_KINDS = ("math", "qa", "judge", "exact")


@dataclass(frozen=True)
class Task:
    """One question.

    `answers` is always a list of accepted aliases. `reward` names the correctness grader the env
    uses by default (`math`, `qa`, `judge` or `exact`). `gold_trace`, when present, is a list of
    action strings that, replayed through `env.step`, solve the task (cold-start SFT data).
    """

    id: str
    question: str
    answers: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)
    gold_trace: list[str] | None = None
    reward: str = "qa"

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Task.id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError(f"task {self.id!r}: field 'question' must be a non-empty string")
        if not isinstance(self.answers, list) or not all(isinstance(a, str) for a in self.answers):
            raise ValueError(f"task {self.id!r}: field 'answers' must be a list of strings, got {self.answers!r}")
        if self.reward not in REWARD_KINDS:
            raise ValueError(f"task {self.id!r}: field 'reward' must be one of {REWARD_KINDS}, got {self.reward!r}")
