"""The learning-rate schedule of every trainer (RL learners and SFT): linear warm-up, then constant
or cosine down to a floor.

    >>> [round(lr_factor(s, total_steps=10, warmup_steps=2, schedule="cosine"), 3) for s in (0, 1, 2, 6, 10)]
    [0.5, 1.0, 1.0, 0.5, 0.0]
    >>> lr_factor(5, total_steps=10, warmup_steps=2, schedule="constant")
    1.0

The factor multiplies the configured lr (`torch.optim.lr_scheduler.LambdaLR`); `step` counts
optimizer steps from 0. Warm-up: (step + 1) / warmup_steps for the first `warmup_steps` steps.
Cosine: min_ratio + (1 − min_ratio)·½·(1 + cos(π·p)), p = (step − warmup) / (total − warmup),
capped at 1.
"""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "cosine"]


def lr_factor(
    step: int, *, total_steps: int, warmup_steps: int, schedule: Schedule, min_ratio: float = 0.0
) -> float:
    """The lr multiplier of optimizer step `step` (0-based) of a run of `total_steps` steps."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    total = max(1, total_steps)
    progress = min(1.0, (step - warmup_steps) / max(1, total - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


__all__ = ["Schedule", "lr_factor"]
