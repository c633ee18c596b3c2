"""pass@k from n samples per task, the per-run summary table, and its split by whether a task
needs a tool.

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


def tool_use_by_need(samples: Iterable[Mapping], needs_tool: Mapping[str, bool],
                     correct_key: str = "correct") -> dict[str, float]:
    """Accuracy and tool use split by whether each sample's task needs a tool: `needs_tool` maps a
    task id to the `needs_tool` key of its metadata (docs/envs.md), and samples of other tasks count
    in neither half. `hard_*` are the tasks that need one, `easy_*` those that do not; per half,
    `*_tool_rate` is the share of episodes with at least one tool call, `*_tool_calls` the calls per
    episode, `*_accuracy` the share of episodes right and `*_accuracy_with_tool` that share among the
episodes with a tool call (absent when there are none). A half without episodes has no keys.

    >>> rows = [{"task_id": "a", "correct": 1.0, "tool_calls": 0}, {"task_id": "b", "correct": 0.0, "tool_calls": 2}]
    >>> split = tool_use_by_need(rows, {"a": False, "b": True})
    >>> split["easy_tool_rate"], split["easy_accuracy"], split["hard_tool_rate"], split["hard_tool_calls"]
    (0.0, 1.0, 1.0, 2.0)
    """
    rows = [s for s in samples if str(s["task_id"]) in needs_tool]
    out: dict[str, float] = {}
    for half, wanted in (("hard", True), ("easy", False)):
        picked = [s for s in rows if bool(needs_tool[str(s["task_id"])]) == wanted]
        if picked:
            n = len(picked)
            out[f"{half}_accuracy"] = sum(float(s[correct_key]) > 0 for s in picked) / n
            out[f"{half}_tool_rate"] = sum(s["tool_calls"] > 0 for s in picked) / n
            out[f"{half}_tool_calls"] = sum(float(s["tool_calls"]) for s in picked) / n
            tooled = [s for s in picked if s["tool_calls"] > 0]
            if tooled:
                out[f"{half}_accuracy_with_tool"] = sum(float(s[correct_key]) > 0 for s in tooled) / len(tooled)
    return out
