"""The collectives a learner needs across data-parallel ranks: sums, gathered lists, extremes.

    >>> from types import SimpleNamespace
    >>> ranks = Ranks(SimpleNamespace(num_processes=1, process_index=0, device="cpu"))  # an Accelerator
    >>> float(ranks.sum(3)), ranks.gather_lists({"reward": [1.0]})
    (3.0, {'reward': [1.0]})

Every method is collective: every rank must call it, in the same order. With one process they
are plain local computations.
"""

from __future__ import annotations

from typing import Any

import torch


class Ranks:
    """The ranks of an `Accelerator`: `world` processes, this one being `rank`."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self.world, self.rank = accelerator.num_processes, accelerator.process_index

    def sum(self, value: torch.Tensor | float) -> torch.Tensor:
        """Sum a scalar (or a tensor, element-wise) over ranks, in float64, on the CPU."""
        t = torch.as_tensor(value, dtype=torch.float64, device=self.accelerator.device)
        if self.world > 1:
            t = self.accelerator.reduce(t, reduction="sum")
        return t.cpu()

    def gather_lists(self, rows: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """Each key's list concatenated over ranks, in rank order."""
        if self.world == 1:
            return rows
        from accelerate.utils import gather_object

        parts = gather_object([rows])
        return {k: [x for p in parts for x in p[k]] for k in rows}

    def gather(self, value: torch.Tensor) -> torch.Tensor:
        """Every rank's tensor concatenated along the first dimension, on the CPU."""
        if self.world == 1:
            return value
        return self.accelerator.gather(value.to(self.accelerator.device)).cpu()

    def max(self, value: torch.Tensor) -> torch.Tensor:
        """The largest of the ranks' scalars."""
        if self.world == 1:
            return value
        return self.accelerator.gather(value.to(self.accelerator.device)[None]).max().cpu()

    def min_max(self, low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The least of the ranks' `low` and the largest of their `high`, in one gather."""
        if self.world == 1:
            return low, high
        both = self.accelerator.gather(torch.stack([low, high]).to(self.accelerator.device)[None])
        return both[:, 0].min().cpu(), both[:, 1].max().cpu()


__all__ = ["Ranks"]
