"""Gymnasium `Text` spaces that hold arbitrary Unicode text.

Gymnasium's `Text` only accepts a fixed character set; model output is any string. Sampling
stays on printable ASCII and short lengths so `check_env` is fast.
"""

from __future__ import annotations

import string
from typing import Any

from gymnasium import spaces


class UnicodeText(spaces.Text):
    def __init__(self, max_length: int, seed: int | None = None) -> None:
        super().__init__(max_length=max_length, min_length=0, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, min(self.max_length, 64) + 1))
        chars = self.np_random.choice(list(string.printable), size=n)
        return "".join(chars)

    def __repr__(self) -> str:
        return f"UnicodeText({self.max_length})"
