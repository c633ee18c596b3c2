"""Where a training run's numbers go: JSONL, TensorBoard, W&B (when installed and asked), its
progress (a bar on a terminal, plain lines in a log file), and a PNG of the curves at the end.

    >>> import tempfile
    >>> from algorithms.core.run_log import RunLogger, read_metrics
    >>> run = tempfile.mkdtemp()
    >>> log = RunLogger(run, config={"lr": 1e-4}, total_steps=2, tensorboard=False, progress=False)
    >>> log.log(1, {"reward_mean": 0.5}); log.log(2, {"reward_mean": 0.75}); log.close(plot=False)
    >>> [m["reward_mean"] for m in read_metrics(run)]
    [0.5, 0.75]

Files in the run directory: `config.json` (the fully resolved config, written at start: one
source of truth for what ran), `metrics.jsonl` (one line per step), `tb/` (TensorBoard),
`curves.png`. Only the main process writes; other ranks get a logger that does nothing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from algorithms.base.progress import Progress

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
# shown in the progress bar, in this order, when present (an RL step's, then SFT's loss)
BAR_FIELDS = (
    ("reward_mean", "reward"),
    ("accuracy", "acc"),
    ("tool_calls_mean", "tools"),
    ("entropy", "H"),
    ("response_length_mean", "len"),
    ("loss", "loss"),
)
PLOT_KEYS = (
    "reward_mean",
    "accuracy",
    "eval/accuracy",
    "tool_calls_mean",
    "entropy",
    "response_length_mean",
    "pg_loss",
    "pg_clipfrac",
    "grad_norm",
)


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every logged step of a run, in order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON line ({exc})") from exc
    return rows


def _clean(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    return value


class RunLogger:
    """Writes metrics of one run. `enabled=False` (non-main ranks) makes every call a no-op.

    On resume pass `resume_step`: lines logged after that step by the interrupted run are dropped,
    so the file holds exactly one line per step.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        config: Mapping[str, Any],
        total_steps: int,
        enabled: bool = True,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "agent-envs",
        progress: bool = True,
        resume_step: int | None = None,
    ) -> None:
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self._tb = self._wandb = self._progress = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / CONFIG_FILE).write_text(
            json.dumps(dict(config), indent=1, sort_keys=True, default=str)
        )
        path = self.run_dir / METRICS_FILE
        if resume_step is not None and path.is_file():
            kept = [r for r in read_metrics(self.run_dir) if r.get("step", 0) <= resume_step]
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        elif resume_step is None and path.is_file():
            path.unlink()  # a fresh run in an old directory starts a fresh log
        self._file = open(path, "a")  # noqa: SIM115 (kept open for the run)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"))
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as exc:
                raise ImportError(
                    "wandb=true but wandb is not installed: pip install 'agent-envs[wandb]'"
                ) from exc
            self._wandb = wandb_module.init(
                project=wandb_project, config=dict(config), dir=str(self.run_dir), resume="allow"
            )
        if progress:
            self._progress = Progress("train", total=total_steps, completed=resume_step or 0)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        numeric = {k: v for k, v in row.items() if isinstance(v, int | float) and k != "step"}
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if self._progress is not None:
            stats = " ".join(f"{label}={numeric[k]:.3g}" for k, label in BAR_FIELDS if k in numeric)
            self._progress.update(step, stats)

    def close(self, *, plot: bool = True) -> Path | None:
        """Flush everything; draw `curves.png`. Returns the plot's path when one was drawn."""
        if not self.enabled:
            return None
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        return plot_curves(self.run_dir) if plot else None


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values (shorter at the start), one per input value."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def smoothing_window(n_points: int) -> int:
    """About a tenth of the run, so 200 noisy RL steps read as a trend (1 for short runs)."""
    return max(1, n_points // 10)


def plot_line(ax: Any, steps: Sequence[float], values: Sequence[float], **style: Any) -> None:
    """The raw values faint, their moving average solid (per-step RL metrics are very noisy)."""
    window = smoothing_window(len(values))
    if window == 1:
        ax.plot(steps, values, **style)
        return
    (line,) = ax.plot(steps, moving_average(values, window), **style)
    ax.plot(steps, values, color=line.get_color(), alpha=0.25, linewidth=0.8)


def plot_curves(run_dir: str | os.PathLike, keys: Sequence[str] = PLOT_KEYS) -> Path | None:
    """One panel per metric over steps (raw faint, moving average solid), saved as `curves.png`."""
    rows = read_metrics(run_dir)
    present = [k for k in keys if any(isinstance(r.get(k), int | float) for r in rows)]
    if not present:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(present))
    nrows = math.ceil(len(present) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, present, strict=False):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
        window = smoothing_window(len(pts))
        plot_line(ax, [p[0] for p in pts], [p[1] for p in pts])
        ax.set_title(key if window == 1 else f"{key} (mean of {window})")
        ax.set_xlabel("step")
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


__all__ = [
    "CONFIG_FILE",
    "METRICS_FILE",
    "RunLogger",
    "moving_average",
    "plot_curves",
    "plot_line",
    "read_metrics",
    "smoothing_window",
]
