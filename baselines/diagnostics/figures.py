"""The PNGs of `agent-envs analyze`, drawn from its summary (so they can be redrawn from
`summary.json` alone). Each function returns the file it wrote, or None and why it drew nothing."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from algorithms.core.run_log import plot_line

PHASE_STYLE = {"early": ":", "late": "-", "all": "-", "eval": "--"}
DPI = 80


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(names: list[str]) -> dict[str, Any]:
    cmap = _pyplot().get_cmap("tab10")
    return {name: cmap(i % 10) for i, name in enumerate(names)}


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)
    return path


def _grid(n: int, cols: int, size: tuple[float, float]) -> tuple[Any, list[Any]]:
    cols = min(cols, n)
    rows = math.ceil(n / cols)
    fig, axes = _pyplot().subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n]


def entropy_figure(summary: dict[str, Any], out: Path) -> tuple[Path | None, str]:
    curves = summary["entropy_by_offset"]
    if not curves:
        return None, "entropy_by_offset.png: no trajectory recorded entropy after a tool result"
    lo, hi = summary["window"]
    offsets = list(range(lo, hi + 1))
    colors = _colors(list(summary["series"]))
    fig, axes = _grid(len(curves), 3, (4.5, 3.2))
    for ax, (series, phases) in zip(axes, curves.items(), strict=True):
        for phase, curve in phases.items():
            pts = [(d, h) for d, h in zip(offsets, curve["entropy"], strict=True) if h is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], PHASE_STYLE.get(phase, "-"), marker=".",
                    color=colors[series], label=f"{phase} ({curve['tokens'][-lo]} results)")
        mean = summary["series"][series]["entropy_mean"]
        if mean is not None:
            ax.axhline(mean, color="grey", linewidth=0.8, linestyle="--", label="mean, all model tokens")
        ax.axvline(0, color="black", linewidth=0.6)
        ax.set_title(series)
        ax.set_xlabel("model tokens after the tool result")
        ax.set_ylabel("mean entropy (nats)")
        ax.legend(fontsize=7)
    return _save(fig, out / "entropy_by_offset.png"), ""


def _grouped_bars(ax: Any, hists: dict[str, dict[str, int]], colors: dict[str, Any], xlabel: str, ylabel: str) -> None:
    keys = sorted({int(k) for h in hists.values() for k in h})
    width = 0.8 / max(1, len(hists))
    for i, (series, hist) in enumerate(hists.items()):
        total = sum(hist.values()) or 1
        ax.bar([k + (i - (len(hists) - 1) / 2) * width for k in keys],
               [hist.get(str(k), 0) / total for k in keys], width, color=colors[series], label=series)
    ax.set_xticks(keys)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)


def tool_calls_figure(summary: dict[str, Any], out: Path) -> tuple[Path | None, str]:
    series = summary["series"]
    fig, [ax] = _grid(1, 1, (5.5, 3.2))
    _grouped_bars(ax, {s: d["tool_calls"] for s, d in series.items()}, _colors(list(series)),
                  "tool calls in the trajectory", "share of trajectories")
    ax.set_title("tool calls per trajectory")
    return _save(fig, out / "tool_calls.png"), ""


def branches_figure(summary: dict[str, Any], out: Path) -> tuple[Path | None, str]:
    # evaluation never branches: only the learners' rollouts are drawn
    learners = {r["series"] for r in summary["runs"] if r["kind"] == "learner"}
    if not learners:
        return None, "branches.png: no learner run (evaluation never branches)"
    colors = _colors(list(summary["series"]))
    series = {s: d for s, d in summary["series"].items() if s in learners}
    fig, (left, right) = _grid(2, 2, (4.5, 3.2))
    _grouped_bars(left, {s: d["forks_per_prompt"] for s, d in series.items()}, colors,
                  "forks in the prompt's group", "share of prompts")
    left.set_title("branches per prompt")
    _grouped_bars(right, {s: d["depth"] for s, d in series.items()}, colors,
                  "branch depth (0: a root path)", "share of trajectories")
    right.set_title("branch depth")
    return _save(fig, out / "branches.png"), ""


def tokens_per_solved_figure(summary: dict[str, Any], out: Path) -> tuple[Path | None, str]:
    rows = [r for r in summary["runs"] if r["tokens_per_solved"] is not None]
    if not rows:
        return None, "tokens_per_solved.png: no run solved a task"
    colors = _colors(list(summary["series"]))
    fig, [ax] = _grid(1, 1, (5.5, 0.8 + 0.35 * len(rows)))
    ax.barh([r["run"] for r in rows], [r["tokens_per_solved"] for r in rows],
            color=[colors[r["series"]] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("generated tokens / solved task")
    ax.set_title("tokens per solved task")
    return _save(fig, out / "tokens_per_solved.png"), ""


def reward_figure(summary: dict[str, Any], out: Path) -> tuple[Path | None, str]:
    curves = summary["reward_components"]
    keys = [k for k in ("reward", "correct", "format_ok", "f1") if any(k in c for c in curves.values())]
    if not keys or all(len(c.get("reward", [])) < 2 for c in curves.values()):
        return None, "reward_components.png: no learner run with trajectories of two or more steps"
    series_of = {r["run"]: r["series"] for r in summary["runs"]}
    colors = _colors(list(summary["series"]))
    fig, axes = _grid(len(keys), 4, (4, 3))
    for ax, key in zip(axes, keys, strict=True):
        for run, c in curves.items():
            if key in c:
                plot_line(ax, [p[0] for p in c[key]], [p[1] for p in c[key]], color=colors[series_of[run]],
                          label=run)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    return _save(fig, out / "reward_components.png"), ""


def pca_figure(summary: dict[str, Any], out: Path) -> tuple[Path | None, str]:
    pca = summary["pca"]
    if not pca:
        return None, "pca.png: fewer than 3 trajectories"
    colors = _colors(list(summary["series"]))
    xs, ys = [p[0] for p in pca["xy"]], [p[1] for p in pca["xy"]]
    fig, (left, right) = _grid(2, 2, (4.8, 4))
    for series in summary["series"]:
        idx = [i for i, s in enumerate(pca["series"]) if s == series]
        left.scatter([xs[i] for i in idx], [ys[i] for i in idx], s=8, alpha=0.6, color=colors[series], label=series)
    left.legend(fontsize=7)
    left.set_title("by algorithm")
    dots = right.scatter(xs, ys, s=8, alpha=0.7, c=pca["reward"], cmap="viridis")
    fig.colorbar(dots, ax=right, label="reward")
    right.set_title("by reward")
    share = pca["variance_share"]
    for ax in (left, right):
        ax.set_xlabel(f"PC1 ({share[0]:.0%})")
        ax.set_ylabel(f"PC2 ({share[1]:.0%})")
    return _save(fig, out / "pca.png"), ""


FIGURES: tuple[Callable[[dict[str, Any], Path], tuple[Path | None, str]], ...] = (
    entropy_figure, tool_calls_figure, branches_figure, tokens_per_solved_figure, reward_figure, pca_figure,
)


def draw_all(summary: dict[str, Any], out: Path) -> tuple[list[Path], list[str]]:
    """Every figure into `out`: (files written, reasons for the ones not drawn)."""
    drawn, reasons = [], []
    for figure in FIGURES:
        path, why = figure(summary, out)
        if path is not None:
            drawn.append(path)
        else:
            reasons.append(why)
    return drawn, reasons
