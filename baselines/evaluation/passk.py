"""pass@k from n samples per task, and the per-run summary table.

    >>> round(pass_at_k(n=4, c=1, k=2), 4)
    0.5
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from math import comb
from statistics import mean


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021): n samples, c correct."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarize(samples: Iterable[Mapping], ks: Iterable[int] = (1,), correct_key: str = "correct") -> dict[str, float]:
    """Aggregate per-sample records (`task_id`, `correct`, other numeric components) over tasks.

    pass@1 is the mean over the n samples of each task, then over tasks; pass@k uses the unbiased
    estimator; `any_correct` is the share of tasks with at least one correct sample.
    """
    by_task: dict[str, list[Mapping]] = defaultdict(list)
    for s in samples:
        by_task[str(s["task_id"])].append(s)
    if not by_task:
        raise ValueError("no samples to summarize")
    n = min(len(v) for v in by_task.values())
    out: dict[str, float] = {"tasks": float(len(by_task)), "samples_per_task": float(n)}
    for k in ks:
        if k <= n:
            out[f"pass@{k}"] = mean(pass_at_k(n, sum(float(s[correct_key]) > 0 for s in v[:n]), k) for v in by_task.values())
    out["any_correct"] = mean(float(any(float(s[correct_key]) > 0 for s in v)) for v in by_task.values())
    skip = {correct_key, "sample"}  # the sample index is bookkeeping, not a metric
    numeric = {key for v in by_task.values() for s in v for key, val in s.items()
               if isinstance(val, int | float) and not isinstance(val, bool) and key not in skip}
    for key in sorted(numeric):
        vals = [float(s[key]) for v in by_task.values() for s in v if isinstance(s.get(key), int | float)]
        if vals:
            out[key] = mean(vals)
    return out
