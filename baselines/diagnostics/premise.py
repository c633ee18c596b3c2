"""`agent-envs analyze --premise`: ARPO's premise, that token entropy rises right after a tool
result, measured on evaluation runs of one or more worlds at several `world.ambiguity` levels.

    agent-envs analyze --premise runs/eval/qa_amb0 runs/eval/qa_amb1 runs/eval/web_amb1 --out runs/premise

Each run (an `evaluate --out` folder, or a learner run with saved trajectories) is one row,
labelled by its env id and `env_kwargs.world.ambiguity` (0 when unset). Over the model's tokens
(loss mask 1), with entropies as the engine recorded them:

* **after**: the 1st-8th model tokens after each tool result (offsets 0-7 of `analyze`);
* **before**: the 8 model tokens before each tool result, i.e. the end of the call;
* **episode**: every model token.

A token can be in both windows when two calls are less than 8 tokens apart; within one
trajectory it counts once per window. Each number is the mean over tasks of the task's mean
(after, before: the tokens of all its samples pooled; episode: the mean of its episodes' means),
with a 95 % Student-t interval over tasks: the samples of one task are not independent, the
tasks are. Tasks whose episodes make no tool call have no
after/before tokens and are left out of those two columns only.

**Where the high-entropy tokens are**: the run's top 5 % of model tokens by entropy, split into
after / before / *later* (the 9th token on after a result, outside both windows: the rest of
the model's turn, its answer included) / *opening* (before the first result, outside the
before window), beside each region's share of all model tokens (what the split would be if
entropy ignored position).

Writes `premise.md` (the table), `premise.json` (the numbers and per-offset curves) and
`premise.png` (mean entropy by offset, one panel per world, one line per level with its 95 %
band over tasks and its episode mean dashed).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.rollout.trajectory import Trajectory
from baselines.comparison.stats import mean_ci
from baselines.diagnostics.runs import Run, find_runs

AFTER = 8
BEFORE = 8
TOP_SHARE = 0.05
CURVE = (-BEFORE, 24)
# where a model token lies: the two windows, the 9th token on after a result (outside both), and
# the opening before the first result (outside both)
REGIONS = ("after", "before", "later", "opening")
_SPAN = CURVE[1] - CURVE[0] + 1  # offsets drawn in the figure


@dataclass
class _Task:
    """Entropy sums and token counts of one task's samples, per window and per offset."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    offset_sums: np.ndarray = field(default_factory=lambda: np.zeros(_SPAN))
    offset_counts: np.ndarray = field(default_factory=lambda: np.zeros(_SPAN, dtype=np.int64))

    def mean(self, window: str) -> float | None:
        return self.sums[window] / self.counts[window] if self.counts[window] else None


def result_ends(loss_mask: Sequence[int]) -> list[int]:
    """Response positions of the model's first token after each tool result (mask 0 -> 1): the
    rule of `analyze.tool_result_ends`, kept here so that `analyze`, which imports this module
    for `--premise`, is not imported back.

    >>> result_ends([1, 1, 0, 0, 1, 1, 0, 1])
    [4, 7]
    """
    return [i for i in range(1, len(loss_mask)) if loss_mask[i] and not loss_mask[i - 1]]


def windows(traj: Trajectory) -> dict[str, set[int]]:
    """Response positions of the model tokens in each window of one trajectory.

    >>> t = Trajectory(prompt_ids=[0], response_ids=[1] * 6, loss_mask=[1, 1, 0, 1, 1, 1],
    ...                logprobs=[0.0] * 6, entropy=[0.0] * 6)
    >>> w = windows(t)
    >>> sorted(w["before"]), sorted(w["after"]), sorted(w["episode"])
    ([0, 1], [3, 4, 5], [0, 1, 3, 4, 5])
    """
    model = [i for i, m in enumerate(traj.loss_mask) if m]
    rank = {pos: k for k, pos in enumerate(model)}
    out: dict[str, set[int]] = {"after": set(), "before": set(), "episode": set(model)}
    for end in result_ends(traj.loss_mask):
        k = rank[end]
        out["after"].update(model[k : k + AFTER])
        out["before"].update(model[max(0, k - BEFORE) : k])
    return out


def _region(pos: int, w: dict[str, set[int]], ends: Sequence[int]) -> str:
    if pos in w["after"]:
        return "after"
    if pos in w["before"]:
        return "before"
    return "later" if ends and ends[0] < pos else "opening"


def _label(run: Run) -> tuple[str, float]:
    config = run.config
    env = config.get("env") or run.summary.get("env", {}).get("id") or "unknown env"
    world = (config.get("env_kwargs") or {}).get("world") or {}
    return str(env), float(world.get("ambiguity", 0.0))


def _ci(values: Sequence[float]) -> list[float] | None:
    if not values:
        return None
    m, lo, hi = mean_ci(values)
    return [m, lo, hi]


def measure(run: Run) -> dict[str, Any]:
    """The premise numbers of one run (its trajectories must carry entropies)."""
    tasks: dict[str, _Task] = defaultdict(_Task)
    episodes = results = correct = 0
    model_h: list[float] = []
    region: list[str] = []
    lo = CURVE[0]
    for step in run.steps:
        for t in run.trajectories(step):
            if t.entropy is None:
                continue
            episodes += 1
            correct += float(t.components.get("correct") or 0.0)
            task = tasks[str(t.task_id if t.task_id is not None else t.group_id)]
            w = windows(t)
            for name in ("after", "before"):
                task.sums[name] += float(sum(t.entropy[i] for i in w[name]))
                task.counts[name] += len(w[name])
            if w["episode"]:  # each episode weighs the same in its task's episode mean
                task.sums["episode"] += float(np.mean([t.entropy[i] for i in w["episode"]]))
                task.counts["episode"] += 1
            ends = result_ends(t.loss_mask)
            for i in sorted(w["episode"]):
                model_h.append(float(t.entropy[i]))
                region.append(_region(i, w, ends))
            model = sorted(w["episode"])
            rank = {pos: k for k, pos in enumerate(model)}
            results += len(ends)
            for end in ends:
                k = rank[end]
                for d in range(max(CURVE[0], -k), min(CURVE[1], len(model) - 1 - k) + 1):
                    task.offset_sums[d - lo] += t.entropy[model[k + d]]
                    task.offset_counts[d - lo] += 1
    if not episodes:
        raise ValueError(f"{run.path}: no trajectory recorded token entropies (evaluate with an engine "
                         "that records them: --engine hf or vllm)")  # fmt: skip
    env, level = _label(run)
    row: dict[str, Any] = {"run": str(run.path), "env": env, "ambiguity": level, "tasks": len(tasks),
                           "episodes": episodes, "tool_results": results, "accuracy": correct / episodes}  # fmt: skip
    for name in ("episode", "before", "after"):
        row[name] = _ci([m for m in (task.mean(name) for task in tasks.values()) if m is not None])
    order = np.argsort(-np.asarray(model_h), kind="stable")[: max(1, math.ceil(TOP_SHARE * len(model_h)))]
    top = [region[i] for i in order]
    row["top_share"] = {r: top.count(r) / len(top) for r in REGIONS}
    row["token_share"] = {r: region.count(r) / len(region) for r in REGIONS}
    curve = []
    for j in range(_SPAN):
        counted = [task for task in tasks.values() if task.offset_counts[j]]
        curve.append(_ci([float(task.offset_sums[j] / task.offset_counts[j]) for task in counted]))
    row["curve"] = curve
    return row


def _fmt(ci: list[float] | None) -> str:
    if ci is None:
        return "–"
    m, lo, hi = ci
    return f"{m:.3f}" if math.isnan(lo) else f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    head = ["world", "`ambiguity`", "tasks", "episodes", "tool results", "accuracy",
            "H, episode", f"H, {BEFORE} tokens before a call", f"H, 1st–{AFTER}th after a result",
            f"top {TOP_SHARE:.0%} tokens in: after / before / later / opening", "all tokens in: the same"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        share = " / ".join(f"{{{r}:.0%}}" for r in REGIONS)
        lines.append(f"| {r['env']} | {r['ambiguity']:g} | {r['tasks']} | {r['episodes']} | {r['tool_results']} | "
                     f"{r['accuracy']:.3f} | {_fmt(r['episode'])} | {_fmt(r['before'])} | {_fmt(r['after'])} | "
                     f"{share.format(**r['top_share'])} | {share.format(**r['token_share'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def figure(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    from baselines.diagnostics.figures import _grid, _pyplot, _save

    worlds = list(dict.fromkeys(r["env"] for r in rows))
    levels = sorted({r["ambiguity"] for r in rows})
    cmap = _pyplot().get_cmap("viridis")
    color = {lv: cmap(0.85 * i / max(1, len(levels) - 1)) for i, lv in enumerate(levels)}
    offsets = np.arange(CURVE[0], CURVE[1] + 1)
    fig, axes = _grid(len(worlds), 2, (5.0, 3.4))
    for ax, world in zip(axes, worlds, strict=True):
        ax.axvspan(-0.5, AFTER - 0.5, color="0.92")
        for r in (r for r in rows if r["env"] == world):
            pts = [(d, c) for d, c in zip(offsets, r["curve"], strict=True) if c is not None]
            xs, ms = [p[0] for p in pts], [p[1][0] for p in pts]
            low = [p[1][1] if not math.isnan(p[1][1]) else p[1][0] for p in pts]
            high = [p[1][2] if not math.isnan(p[1][2]) else p[1][0] for p in pts]
            c = color[r["ambiguity"]]
            ax.plot(xs, ms, marker=".", markersize=3, color=c, label=f"ambiguity {r['ambiguity']:g}")
            ax.fill_between(xs, low, high, color=c, alpha=0.2, linewidth=0)
            if r["episode"]:
                ax.axhline(r["episode"][0], color=c, linestyle="--", linewidth=0.8)
        ax.axvline(-0.5, color="black", linewidth=0.6)
        ax.set_title(world)
        ax.set_xlabel("model tokens from the tool result (shaded: 1st–8th)")
        ax.set_ylabel("mean entropy (nats)")
        ax.legend(fontsize=7, title="dashed: episode mean", title_fontsize=7)
    return _save(fig, path)


def premise(inputs: Sequence[str | Path], out: str | Path) -> list[dict[str, Any]]:
    """Measure every run under `inputs`, write premise.md / .json / .png to `out`, return the rows
    (sorted by world in the order first met, then by ambiguity)."""
    runs = [r for path in inputs for r in find_runs(path)]
    rows = [measure(r) for r in runs]
    first = {env: i for i, env in reversed(list(enumerate(r["env"] for r in rows)))}
    rows.sort(key=lambda r: (first[r["env"]], r["ambiguity"]))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "premise.md").write_text(markdown(rows))
    (out / "premise.json").write_text(json.dumps({"after": AFTER, "before": BEFORE, "top_share": TOP_SHARE,
                                                  "curve_offsets": list(CURVE), "rows": rows}, indent=1))  # fmt: skip
    figure(rows, out / "premise.png")
    return rows


__all__ = ["markdown", "measure", "premise", "windows"]
