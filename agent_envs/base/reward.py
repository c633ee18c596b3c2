"""The value every reward function returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RewardResult:
    """A scalar `score` plus the named `components` that produced it (always reported in `info`)."""

    score: float
    components: dict[str, Any] = field(default_factory=dict)
