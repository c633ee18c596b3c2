"""Tables and plots of evaluation results (markdown + PNG), shared by quickstart and compare."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import mean, pstdev

COLUMNS = (("pass@1", "pass@1"), ("f1", "F1"), ("format_ok", "format ok"), ("tool_calls", "tool calls"),
           ("response_tokens", "response tokens"))


def markdown_table(rows: Sequence[Mapping], label: str = "run",
                   columns: Sequence[tuple[str, str]] = COLUMNS) -> str:
    """One row per run; `rows` hold a `label` key plus the metric names of `columns` (key, title)."""
    head = f"| {label} | " + " | ".join(title for _, title in columns) + " |"
    lines = [head, "|" + "---|" * (len(columns) + 1)]
    for r in rows:
        cells = [f"{r[key]:.3f}" if isinstance(r.get(key), float) else str(r.get(key, "")) for key, _ in columns]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def aggregate(rows: Sequence[Mapping], group_key: str) -> list[dict]:
    """Mean ± population std over the rows of each group (e.g. the seeds of one algorithm)."""
    groups: dict[str, list[Mapping]] = {}
    for r in rows:
        groups.setdefault(str(r[group_key]), []).append(r)
    out = []
    for name, rs in groups.items():
        row: dict = {"label": f"{name} (n={len(rs)})"}
        for key, _ in COLUMNS:
            vals = [float(r[key]) for r in rs if key in r]
            if vals:
                row[key] = f"{mean(vals):.3f} ± {pstdev(vals):.3f}" if len(vals) > 1 else mean(vals)
        out.append(row)
    return out


def bar_plot(labels: Sequence[str], values: Sequence[float], path: str | Path, title: str, ylabel: str = "pass@1") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(labels), 3.2))
    bars = ax.bar(labels, values, color="#4C72B0")
    ax.bar_label(bars, fmt="%.2f")
    ax.set_ylim(0, max(1.0, max(values, default=0) * 1.15))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def curves_plot(runs: Mapping[str, Sequence[Mapping]], key: str, path: str | Path, title: str) -> Path | None:
    """`runs`: name -> metrics rows (one per step). One line per run (moving average over faint
    raw values); None when no run has `key`."""
    import matplotlib

    from algorithms.core.run_log import plot_line, smoothing_window

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    drawn, window = False, 1
    for name, rows in runs.items():
        pts = [(r["step"], r[key]) for r in rows if key in r and "step" in r]
        if pts:
            steps, values = zip(*pts, strict=True)
            plot_line(ax, steps, values, label=name)
            window = max(window, smoothing_window(len(pts)))
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("RL step")
    ax.set_ylabel(key if window == 1 else f"{key} (moving mean of {window})")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def quickstart_plot(rows: Sequence[Mapping], rl_metrics: Sequence[Mapping], path: str | Path, title: str) -> Path:
    """Three panels: accuracy of each evaluation row, tool calls per task on hard and easy tasks,
    and the RL reward per step (moving average over the faint raw values)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from algorithms.core.run_log import plot_line, smoothing_window

    labels = [r["label"].replace(" (", "\n(").replace(", ", ",\n", 1) for r in rows]
    x = range(len(rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    bars = axes[0].bar(x, [float(r["pass@1"]) for r in rows], color="#4C72B0")
    axes[0].bar_label(bars, fmt="%.2f")
    axes[0].set_ylim(0, 1.05)
    axes[0].set_title("accuracy on held-out tasks")
    width = 0.4
    for offset, kind, color in ((-width / 2, "hard", "#C44E52"), (width / 2, "easy", "#55A868")):
        values = [float(r.get(f"{kind}_tool_calls", 0.0)) for r in rows]
        b = axes[1].bar([i + offset for i in x], values, width, color=color, label=f"{kind} tasks")
        axes[1].bar_label(b, fmt="%.2f", fontsize=7)
    axes[1].set_ylim(0, 1.15)
    axes[1].set_title("tool calls per task")
    axes[1].legend(fontsize=8)
    for ax in axes[:2]:
        ax.set_xticks(list(x), labels, fontsize=7)
    pts = [(m["step"], m["reward_mean"]) for m in rl_metrics if isinstance(m.get("reward_mean"), int | float)]
    if pts:
        steps, values = zip(*pts, strict=True)
        plot_line(axes[2], steps, values, color="#4C72B0")
        axes[2].set_title(f"RL reward per step (moving mean of {smoothing_window(len(pts))})")
        axes[2].set_xlabel("RL step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
