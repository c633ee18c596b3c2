"""`agent-envs analyze`: what the policy does around tool calls, read from saved trajectories.

    agent-envs analyze runs/grpo_tiny runs/arpo_tiny --out runs/analysis
    agent-envs analyze runs/compare --out runs/compare/analysis     # every run of a comparison

Reads learner runs trained with `save_trajectories=true`, `evaluate` outputs and folders of runs
(`baselines.diagnostics.runs`), one step file at a time, and writes to `--out`:

* `entropy_by_offset.png`: mean token entropy against the position relative to each tool result,
  per algorithm and training phase (the entropy-spike figure of the ARPO and AEPO papers);
* `tool_calls.png`, `branches.png` (forks per prompt and depth of each trajectory in tree
  rollouts), `tokens_per_solved.png`, `reward_components.png` (over training steps);
* `pca.png`: a 2-D PCA of trajectory representations, coloured by algorithm and by reward;
* `summary.md` and `summary.json`: one row per run with the numbers behind the figures.

Definitions (docs/diagnostics.md has the pictures):

* **offset**: a tool result ends where the loss mask goes 0 -> 1; offset 0 is the model's first
  token after it. Offsets count *model* tokens only, so offset -1 is the last token of the
  model's tool call and the window steps over the tool result (whose tokens have no entropy).
* **phase**: a learner run's saved steps split in half, `early` and `late` (`all` for a single
  step); evaluate runs are `eval`.
* **series**: runs are pooled by algorithm (seeds together); an evaluate output is its own
  series: `<algorithm> <folder>` inside a learner run (`grpo eval_sampled`), else its path.
* **tokens per solved task**: generated tokens over all trajectories / sum of `correct`.
* **tool cost / traj**: the mean of the env's `tool_cost` reward component (what the scalar was
  charged for tool calls; a column only when some run's env charges it, `reward_kwargs.tool_cost`).
* **representation** (PCA): the bag of the token ids a trajectory generated (loss mask 1),
  weighted by tf-idf over the trajectories drawn (up to `--max-points` per run, uniformly), the
  `--max-features` ids in most trajectories kept, rows scaled to unit length, then centred and
  projected on the two leading right singular vectors (numpy SVD). Runs of different tokenizers
  do not share a token space: analyse them separately.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.rollout.trajectory import Trajectory
from baselines.diagnostics.runs import Run, find_runs

WINDOW = (-10, 30)
# reward components plotted over training, when the env reports them
REWARD_COMPONENTS = ("reward", "correct", "format_ok", "f1", "tool_cost")


def tool_result_ends(loss_mask: Sequence[int]) -> list[int]:
    """Response positions of the model's first token after each env-inserted span (mask 0 -> 1).

    >>> tool_result_ends([1, 1, 0, 0, 1, 1, 0, 1])
    [4, 7]
    """
    return [i for i in range(1, len(loss_mask)) if loss_mask[i] and not loss_mask[i - 1]]


def entropy_by_offset(traj: Trajectory, window: tuple[int, int] = WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """Sums and counts of the entropy of model tokens at each offset of `window` (inclusive) from
    every tool result of one trajectory; zeros when it recorded no entropy.

    >>> t = Trajectory(prompt_ids=[0], response_ids=[1] * 5, loss_mask=[1, 1, 0, 1, 1],
    ...                logprobs=[0.0] * 5, entropy=[0.5, 0.25, 0.0, 2.0, 1.0])
    >>> sums, counts = entropy_by_offset(t, (-2, 1))
    >>> sums.tolist(), counts.tolist()
    ([0.5, 0.25, 2.0, 1.0], [1, 1, 1, 1])
    """
    lo, hi = window
    sums, counts = np.zeros(hi - lo + 1), np.zeros(hi - lo + 1, dtype=np.int64)
    if traj.entropy is None:
        return sums, counts
    model_pos = [i for i, m in enumerate(traj.loss_mask) if m]
    rank = {pos: k for k, pos in enumerate(model_pos)}
    for end in tool_result_ends(traj.loss_mask):
        k = rank[end]
        first, last = max(lo, -k), min(hi, len(model_pos) - 1 - k)
        for d in range(first, last + 1):
            sums[d - lo] += traj.entropy[model_pos[k + d]]
            counts[d - lo] += 1
    return sums, counts


@dataclass
class RunStats:
    """Everything `analyze` keeps of one run after reading it (trajectories are not kept)."""

    run: Run
    series: str
    window: tuple[int, int]
    trajectories: int = 0
    reward_sum: float = 0.0
    correct_sum: float = 0.0
    tool_cost_sum: float | None = None  # the env's `tool_cost` component, when it charges one
    generated_tokens: int = 0
    tool_calls: Counter = field(default_factory=Counter)  # tool calls -> trajectories
    entropy_sum: float = 0.0  # over every model token that has an entropy
    entropy_tokens: int = 0
    by_phase: dict[str, list[np.ndarray]] = field(default_factory=dict)  # phase -> [sums, counts]
    forks_per_prompt: Counter = field(default_factory=Counter)  # forks in a prompt's group -> prompts
    depth: Counter = field(default_factory=Counter)  # lineage depth -> trajectories
    per_step: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # step -> component -> values
    health_flagged: int | None = None  # trajectories with a non-empty `health` list, when recorded

    def add(self, step: int, phase: str, t: Trajectory) -> None:
        self.trajectories += 1
        self.reward_sum += float(t.reward)
        correct = _number(t.components.get("correct")) or 0.0
        self.correct_sum += correct
        cost = _number(t.components.get("tool_cost"))
        if cost is not None:
            self.tool_cost_sum = (self.tool_cost_sum or 0.0) + cost
        self.generated_tokens += t.num_generated
        self.tool_calls[int(t.tool_calls)] += 1
        self.depth[int(t.lineage.get("depth", 0))] += 1
        if t.entropy is not None:
            model = [h for h, m in zip(t.entropy, t.loss_mask, strict=True) if m]
            self.entropy_sum += float(sum(model))
            self.entropy_tokens += len(model)
            sums, counts = entropy_by_offset(t, self.window)
            acc = self.by_phase.setdefault(phase, [np.zeros_like(sums), np.zeros_like(counts)])
            acc[0] += sums
            acc[1] += counts
        row = self.per_step.setdefault(step, defaultdict(list))
        row["reward"].append(float(t.reward))
        for key in REWARD_COMPONENTS[1:]:
            value = _number(t.components.get(key))
            if value is not None:
                row[key].append(value)
        health = getattr(t, "health", None)  # a field of newer Trajectory versions
        if health is not None:
            self.health_flagged = (self.health_flagged or 0) + bool(health)

    def add_step_groups(self, trajs: Sequence[Trajectory]) -> None:
        forks: Counter = Counter()
        for t in trajs:
            forks[t.group_id] += t.parent_id is not None
        for n in forks.values():
            self.forks_per_prompt[n] += 1

    def row(self) -> dict[str, Any]:
        n = max(1, self.trajectories)
        lo = self.window[0]
        pooled = _pool(list(self.by_phase.values()))
        h0 = pooled[0][-lo] / pooled[1][-lo] if pooled and pooled[1][-lo] else None
        prompts = sum(self.forks_per_prompt.values())
        return {
            "run": self.run.name,
            "algorithm": self.run.algorithm,
            "series": self.series,
            "kind": self.run.kind,
            "steps": len(self.per_step),
            "trajectories": self.trajectories,
            "reward": self.reward_sum / n if self.trajectories else None,
            "accuracy": self.correct_sum / n if self.trajectories else None,
            "tool_calls": sum(k * v for k, v in self.tool_calls.items()) / n if self.trajectories else None,
            "tool_cost": self.tool_cost_sum / n if self.tool_cost_sum is not None else None,
            "generated_tokens": self.generated_tokens / n if self.trajectories else None,
            "tokens_per_solved": self.generated_tokens / self.correct_sum if self.correct_sum else None,
            "entropy_mean": self.entropy_sum / self.entropy_tokens if self.entropy_tokens else None,
            "entropy_at_0": float(h0) if h0 is not None else None,
            "tool_results": int(pooled[1][-lo]) if pooled else 0,
            "forks_per_prompt": sum(k * v for k, v in self.forks_per_prompt.items()) / prompts if prompts else None,
            "max_depth": max(self.depth) if self.depth else None,
            "health_flagged": self.health_flagged,
            "health_counts": health_counts(self.run.metrics),
        }


def health_counts(metrics: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Totals over steps of the `health/<check>` counts a learner logs (empty when it logs none)."""
    out: dict[str, float] = {}
    for row in metrics:
        for key, value in row.items():
            if key.startswith("health/") and _number(value) is not None:
                out[key] = out.get(key, 0.0) + float(value)
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool | int | float) and math.isfinite(float(value)):
        return float(value)
    return None


def _pool(parts: list[list[np.ndarray]]) -> list[np.ndarray] | None:
    if not parts:
        return None
    return [sum(p[0] for p in parts), sum(p[1] for p in parts)]


def phase_of(run: Run, step: int, steps: Sequence[int]) -> str:
    if run.kind == "evaluate":
        return "eval"
    if len(steps) == 1:
        return "all"
    return "early" if steps.index(step) < len(steps) / 2 else "late"


def series_of(run: Run) -> str:
    if run.kind == "learner":
        return run.algorithm
    # an evaluate output inside a learner run evaluates that run's algorithm; one on its own
    # (quickstart's eval/sft/greedy) is named by its path
    return run.name if run.algorithm == "evaluate" else f"{run.algorithm} {run.path.name}"


def why_no_trajectories(run: Run) -> str:
    if run.kind == "evaluate":
        return "no trajectories.jsonl (evaluate writes it beside samples.jsonl: rerun evaluate)"
    if run.algorithm == "sft":
        return "an SFT run has no rollouts"
    return "no trajectories/ (train with save_trajectories=true)"


class _Progress:
    """A line on stderr at most every `every` seconds while runs are read (long runs take minutes)."""

    def __init__(self, every: float = 2.0) -> None:
        self.every, self.last = every, time.monotonic()

    def __call__(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.every:
            print(f"analyze: {text}", file=sys.stderr, flush=True)
            self.last = now


def read_run(run: Run, window: tuple[int, int], max_points: int, rng: random.Random,
             points: list[dict[str, Any]], progress: _Progress) -> RunStats:
    """Stream one run's trajectories into its stats, and draw up to `max_points` of them
    (reservoir sampling) into `points` for the PCA."""
    stats = RunStats(run, series_of(run), window)
    steps = run.steps
    drawn: list[dict[str, Any]] = []
    for i, step in enumerate(steps, 1):
        trajs = run.trajectories(step)
        phase = phase_of(run, step, steps)
        for t in trajs:
            stats.add(step, phase, t)
            point = {"series": stats.series, "reward": float(t.reward), "run": run.name,
                     "ids": [tok for tok, m in zip(t.response_ids, t.loss_mask, strict=True) if m]}  # fmt: skip
            if len(drawn) < max_points:
                drawn.append(point)
            else:
                j = rng.randrange(stats.trajectories)
                if j < max_points:
                    drawn[j] = point
        stats.add_step_groups(trajs)
        progress(f"{run.name}: step {i}/{len(steps)} read, {stats.trajectories} trajectories", force=i == len(steps))
    points.extend(drawn)
    return stats


def tfidf_pca(bags: Sequence[Sequence[int]], max_features: int = 2048) -> tuple[np.ndarray, list[float]]:
    """2-D coordinates of bags of token ids (tf-idf, unit rows, centred, SVD) and the share of
    variance of each of the two axes.

    >>> xy, share = tfidf_pca([[1, 1, 2], [1, 2, 2], [3, 4], [3, 4, 4]])
    >>> xy.shape, bool(xy[0, 0] * xy[2, 0] < 0)   # the two kinds of bag fall on opposite sides
    ((4, 2), True)
    """
    df: Counter = Counter()
    for bag in bags:
        df.update(set(bag))
    vocab = [tok for tok, _ in sorted(df.items(), key=lambda kv: (-kv[1], kv[0]))[:max_features]]
    column = {tok: j for j, tok in enumerate(vocab)}
    x = np.zeros((len(bags), len(vocab)))
    for i, bag in enumerate(bags):
        for tok, c in Counter(bag).items():
            if tok in column:
                x[i, column[tok]] = c / len(bag)
    n = len(bags)
    x *= np.log((1 + n) / (1 + np.array([df[t] for t in vocab], dtype=float))) + 1.0
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
    x -= x.mean(axis=0)
    u, s, _ = np.linalg.svd(x, full_matrices=False)
    k = min(2, len(s))
    coords = np.zeros((n, 2))
    coords[:, :k] = u[:, :k] * s[:k]
    total = float((s**2).sum())
    share = [float(s[i] ** 2 / total) if total and i < k else 0.0 for i in range(2)]
    return coords, share


def entropy_curves(stats: Sequence[RunStats]) -> dict[str, dict[str, dict[str, Any]]]:
    """series -> phase -> {mean entropy per offset (None where no token), tokens per offset}."""
    parts: dict[str, dict[str, list[list[np.ndarray]]]] = defaultdict(lambda: defaultdict(list))
    for s in stats:
        for phase, acc in s.by_phase.items():
            parts[s.series][phase].append(acc)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for series, phases in parts.items():
        for phase in sorted(phases, key=["early", "late", "all", "eval"].index):
            sums, counts = _pool(phases[phase])
            if not counts.any():
                continue
            mean = [float(a / c) if c else None for a, c in zip(sums, counts, strict=True)]
            out.setdefault(series, {})[phase] = {"entropy": mean, "tokens": counts.tolist()}
    return out


def series_means(stats: Sequence[RunStats]) -> dict[str, dict[str, Any]]:
    """Pooled numbers of each series: mean entropy of model tokens, tool-call, fork and depth
    histograms, tokens per solved task."""
    out: dict[str, dict[str, Any]] = {}
    for s in stats:
        d = out.setdefault(s.series, {"entropy_sum": 0.0, "entropy_tokens": 0, "tool_calls": Counter(),
                                      "forks_per_prompt": Counter(), "depth": Counter(), "tokens": 0,
                                      "solved": 0.0})  # fmt: skip
        d["entropy_sum"] += s.entropy_sum
        d["entropy_tokens"] += s.entropy_tokens
        d["tool_calls"] += s.tool_calls
        d["forks_per_prompt"] += s.forks_per_prompt
        d["depth"] += s.depth
        d["tokens"] += s.generated_tokens
        d["solved"] += s.correct_sum
    return {
        name: {
            "entropy_mean": d["entropy_sum"] / d["entropy_tokens"] if d["entropy_tokens"] else None,
            "tool_calls": {str(k): v for k, v in sorted(d["tool_calls"].items())},
            "forks_per_prompt": {str(k): v for k, v in sorted(d["forks_per_prompt"].items())},
            "depth": {str(k): v for k, v in sorted(d["depth"].items())},
            "tokens_per_solved": d["tokens"] / d["solved"] if d["solved"] else None,
        }
        for name, d in out.items()
    }


def reward_curves(stats: Sequence[RunStats]) -> dict[str, dict[str, list[list[float]]]]:
    """run -> component -> [[step, mean], ...] over training (learner runs only)."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    for s in stats:
        if s.run.kind != "learner":
            continue
        curves: dict[str, list[list[float]]] = {}
        for step in sorted(s.per_step):
            for key, values in s.per_step[step].items():
                if values:
                    curves.setdefault(key, []).append([step, float(np.mean(values))])
        out[s.run.name] = curves
    return out


COLUMNS = (
    ("run", "run"), ("series", "series"), ("steps", "steps"), ("trajectories", "trajectories"),
    ("reward", "reward"), ("accuracy", "accuracy"), ("tool_calls", "tool calls / traj"),
    ("generated_tokens", "generated tokens / traj"), ("tokens_per_solved", "tokens / solved task"),
    ("entropy_mean", "H mean"), ("entropy_at_0", "H at offset 0"), ("tool_results", "tool results"),
    ("forks_per_prompt", "forks / prompt"), ("max_depth", "max depth"),
)  # fmt: skip


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def markdown(summary: dict[str, Any]) -> str:
    rows = summary["runs"]
    columns = list(COLUMNS)
    if any(r["tool_cost"] is not None for r in rows):
        columns.insert(columns.index(("tool_calls", "tool calls / traj")) + 1, ("tool_cost", "tool cost / traj"))
    if any(r["health_flagged"] is not None for r in rows):
        columns.append(("health_flagged", "health-flagged trajectories"))
    lines = ["# Run analysis", "", "Runs: " + ", ".join(f"`{p}`" for p in summary["inputs"]), "",
             "| " + " | ".join(t for _, t in columns) + " |", "|" + "---|" * len(columns)]  # fmt: skip
    lines += ["| " + " | ".join(_cell(r[k]) for k, _ in columns) + " |" for r in rows]
    lo, hi = summary["window"]
    shown = [d for d in (-1, 0, 1, 5, 10) if lo <= d <= hi]
    lines += ["", f"## Entropy around tool results (offsets {lo}..{hi}, model tokens)", "",
              "| series | phase | tool results | H mean | " + " | ".join(f"H({d:+d})" for d in shown) + " |",
              "|" + "---|" * (4 + len(shown))]  # fmt: skip
    for series, phases in summary["entropy_by_offset"].items():
        for phase, curve in phases.items():
            cells = [_cell(curve["entropy"][d - lo]) for d in shown]
            lines.append(f"| {series} | {phase} | {curve['tokens'][-lo]} | "
                         f"{_cell(summary['series'][series]['entropy_mean'])} | " + " | ".join(cells) + " |")
    health = [(r["run"], r["health_counts"]) for r in rows if any(r["health_counts"].values())]
    if health:
        lines += ["", "## Health-check counts (sums over steps)", ""]
        lines += [f"- {run}: " + ", ".join(f"{k} {v:g}" for k, v in sorted(c.items()) if v) for run, c in health]
    if summary["pca"]:
        share = summary["pca"]["variance_share"]
        lines += ["", f"PCA of {summary['pca']['points']} trajectories: the axes hold "
                  f"{share[0]:.1%} and {share[1]:.1%} of the variance."]
    if summary["skipped"]:
        lines += ["", "Not drawn:"] + [f"- {s}" for s in summary["skipped"]]
    lines += ["", "Figures: " + ", ".join(summary["figures"]), ""]
    return "\n".join(lines)


def analyze(inputs: Sequence[str | Path], out: str | Path, *, window: tuple[int, int] = WINDOW,
            max_points: int = 500, max_features: int = 2048, seed: int = 0) -> dict[str, Any]:
    """Read every run under `inputs`, write the figures and `summary.md` / `summary.json` to
    `out`, and return the summary."""
    from baselines.diagnostics import figures

    if window[0] > 0 or window[1] < 0:
        raise ValueError(f"--window {window[0]} {window[1]}: the window must contain offset 0")
    runs: list[Run] = []
    for path in inputs:
        found = find_runs(path)
        if len(inputs) > 1:  # the same folder names (grpo-0) in two comparisons stay apart
            for r in found:
                r.name = f"{Path(path).name}/{r.name}" if r.name != Path(path).name else r.name
        runs += found
    progress = _Progress()
    progress(f"{len(runs)} run(s): " + ", ".join(r.name for r in runs), force=True)
    rng = random.Random(seed)
    points: list[dict[str, Any]] = []
    stats = [read_run(r, window, max_points, rng, points, progress) for r in runs]
    skipped = [f"{s.run.name}: {why_no_trajectories(s.run)}" for s in stats if not s.trajectories]
    stats = [s for s in stats if s.trajectories]
    if not stats:
        raise ValueError("none of the runs has saved trajectories:\n  " + "\n  ".join(skipped))
    for s in stats:
        if s.run.dropped_fields:
            skipped.append(f"{s.run.name}: fields unknown to this version, ignored: {sorted(s.run.dropped_fields)}")

    pca = None
    if len(points) >= 3:
        coords, share = tfidf_pca([p["ids"] for p in points], max_features)
        pca = {"points": len(points), "variance_share": share,
               "xy": [[round(float(x), 5), round(float(y), 5)] for x, y in coords],
               "series": [p["series"] for p in points], "reward": [p["reward"] for p in points],
               "run": [p["run"] for p in points]}  # fmt: skip
    summary: dict[str, Any] = {
        "inputs": [str(p) for p in inputs],
        "window": list(window),
        "runs": [s.row() for s in stats],
        "series": series_means(stats),
        "entropy_by_offset": entropy_curves(stats),
        "reward_components": reward_curves(stats),
        "pca": pca,
        "figures": [],
        "skipped": skipped,
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    drawn, not_drawn = figures.draw_all(summary, out)
    summary["figures"] = [p.name for p in drawn]
    summary["skipped"] += not_drawn
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary))
    progress(f"wrote {out / 'summary.md'}, {out / 'summary.json'} and {len(drawn)} figure(s)", force=True)
    return summary


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("analyze", help="figures and tables from saved trajectories of runs "
                              "(entropy around tool results, tool calls, branches, PCA)")  # fmt: skip
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="a learner run (save_trajectories=true), an evaluate --out folder, or a folder of runs")
    p.add_argument("--out", default=None, help="folder for the PNGs, summary.md and summary.json "
                   "(default: RUN/analysis, beside the first run's files)")
    p.add_argument("--window", type=int, nargs=2, default=list(WINDOW), metavar=("FROM", "TO"),
                   help="offsets around each tool result, in model tokens (default: %(default)s)")
    p.add_argument("--max-points", type=int, default=500, help="trajectories per run drawn for the PCA")
    p.add_argument("--max-features", type=int, default=2048, help="token ids kept for the PCA (most common)")
    p.add_argument("--seed", type=int, default=0, help="seed of the PCA's draw of trajectories")
    p.add_argument("--premise", action="store_true",
                   help="instead: entropy after tool results against before calls and the episode, per world "
                   "and world.ambiguity, with 95%% intervals over tasks (premise.md/.json/.png; "
                   "baselines/diagnostics/premise.py)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        out = args.out if args.out is not None else str(Path(args.runs[0]) / "analysis")
        if args.premise:
            from baselines.diagnostics.premise import markdown as premise_table
            from baselines.diagnostics.premise import premise

            print(premise_table(premise(args.runs, out)), end="")
            return 0
        summary = analyze(args.runs, out, window=tuple(args.window), max_points=args.max_points,
                          max_features=args.max_features, seed=args.seed)
    except ValueError as exc:  # a folder that is not a run, a run without trajectories, a bad line
        print(f"agent-envs analyze: {exc}", file=sys.stderr)
        return 2
    print(markdown(summary))
    return 0


__all__ = ["analyze", "entropy_by_offset", "tfidf_pca", "tool_result_ends"]
