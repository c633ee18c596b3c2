"""Tables and plots of evaluation results (markdown + PNG), shared by quickstart and compare."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import mean, pstdev

COLUMNS = (("pass@1", "pass@1"), ("f1", "F1"), ("format_ok", "format ok"), ("tool_calls", "tool calls"),
           ("response_tokens", "response tokens"))


def markdown_table(rows: Sequence[Mapping], label: str = "run") -> str:
    """One row per run; `rows` hold a `label` key plus the metric names in COLUMNS."""
    head = f"| {label} | " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for r in rows:
        cells = [f"{r[key]:.3f}" if isinstance(r.get(key), float) else str(r.get(key, "")) for key, _ in COLUMNS]
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
    """`runs`: name -> metrics rows (one per step). One line per run; None when no run has `key`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    drawn = False
    for name, rows in runs.items():
        pts = [(r["step"], r[key]) for r in rows if key in r and "step" in r]
        if pts:
            ax.plot(*zip(*pts, strict=True), label=name)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("RL step")
    ax.set_ylabel(key)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
