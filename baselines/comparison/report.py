"""Tables and plots of evaluation results (markdown + PNG), shared by quickstart and compare.

`write_report(dir)` turns a `compare` output folder (its `compare.json` and every run's
`result.json`) into `results.md`, `results.json`, `pass_at_1.png` and `reward_curves.png`, so the
report can be rebuilt without retraining (`agent-envs compare --report-only DIR`), or merges
several such folders into one report (`--report-only A,B --out DIR`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from statistics import mean
from typing import Any

from baselines.comparison.stats import mean_ci, paired_t_test

# a comparison folder: the manifest at its root, one result file per (algorithm, seed) run
MANIFEST = "compare.json"
RUN_RESULT = "result.json"

COLUMNS = (("pass@1", "pass@1"), ("f1", "F1"), ("format_ok", "format ok"), ("tool_calls", "tool calls"),
           ("response_tokens", "response tokens"))

# what `compare` reports per run: (key, title, how to read it from a run's result.json)
RUN_METRICS: tuple[tuple[str, str, Callable[[Mapping], float | None]], ...] = (
    ("sampled_pass@1", "pass@1 at training sampling", lambda r: r["sampled"]["pass@1"]),
    ("greedy_pass@1", "pass@1 greedy", lambda r: r["greedy"]["pass@1"]),
    ("generated", "trajectories generated", lambda r: r["budget"].get("generated_trajectories")),
    ("tool_calls", "tool calls / trajectory", lambda r: r["sampled"]["tool_calls"]),
    ("rollout_tool_calls", "tool calls run / training trajectory", lambda r: r.get("rollout_tool_calls")),
    ("tokens_per_solved", "tokens / solved task", lambda r: r["tokens_per_solved"]),
    ("train_s", "train wall s", lambda r: r["train_s"]),
    # where the tasks say whether they need a tool (`needs_tool`): the share of sampled episodes with a call
    ("easy_tool_rate", "tool use, tasks needing none", lambda r: r["sampled"].get("easy_tool_rate")),
    ("hard_tool_rate", "tool use, tasks needing one", lambda r: r["sampled"].get("hard_tool_rate")),
    # tree rollouts: a fork's mean token entropy over its first tokens from the branch point
    ("branch_entropy", "entropy where it forked", lambda r: r.get("branch_entropy")),
)
# the metrics tested against the first algorithm, paired by seed
PAIRED = ("sampled_pass@1", "greedy_pass@1", "tool_calls", "rollout_tool_calls", "easy_tool_rate", "hard_tool_rate",
          "branch_entropy")
# columns left out of the tables when no run has them (tasks without `needs_tool`, runs that never forked)
OPTIONAL = ("easy_tool_rate", "hard_tool_rate", "branch_entropy")


def markdown_table(rows: Sequence[Mapping], label: str = "run",
                   columns: Sequence[tuple[str, str]] = COLUMNS) -> str:
    """One row per run; `rows` hold a `label` key plus the metric names of `columns` (key, title)."""
    head = f"| {label} | " + " | ".join(title for _, title in columns) + " |"
    lines = [head, "|" + "---|" * (len(columns) + 1)]
    for r in rows:
        cells = [f"{r[key]:.3f}" if isinstance(r.get(key), float) else str(r.get(key, "")) for key, _ in columns]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_value(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}" if abs(x) < 100 else f"{x:.0f}"


def format_ci(m: float, lo: float, hi: float) -> str:
    if math.isnan(lo):
        return format_value(m)
    return f"{format_value(m)} [{format_value(lo)}, {format_value(hi)}]"


def format_p(p: float) -> str:
    if math.isnan(p):
        return "–"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"



def summarize_runs(manifest: Mapping[str, Any], runs: Sequence[Mapping[str, Any]],
                   baselines: Sequence[str] = ()) -> dict[str, Any]:
    """Per run and per algorithm numbers, and the paired tests of every algorithm against each of
    `baselines` (default: the first algorithm)."""
    algos = list(manifest["algos"])
    baselines = list(baselines) or algos[:1]
    for base in baselines:
        if base not in algos:
            raise ValueError(f"config field 'baselines': {base!r} is not among the compared runs {algos}")
    per_run = []
    for r in runs:
        row = {"algo": r["algo"], "seed": r["seed"], **{key: get(r) for key, _, get in RUN_METRICS}}
        row["trajectories"] = r["budget"]["trajectories"]
        per_run.append(row)
    per_algo = []
    for algo in algos:
        mine = [r for r in runs if r["algo"] == algo]
        rows = [p for p in per_run if p["algo"] == algo]
        entry: dict[str, Any] = {"algo": algo, "seeds": [r["seed"] for r in mine]}
        for key, _, _ in RUN_METRICS:
            vals = [p[key] for p in rows if p[key] is not None]
            if vals:
                m, lo, hi = mean_ci(vals)
                entry[key] = {"mean": m, "ci95": [lo, hi], "n": len(vals)}
        entry["budget"] = _same([r["budget"] for r in mine], ("trajectories_per_step", "steps", "trajectories"))
        entry["sampling"] = _same([r["sampling"] for r in mine], ("temperature", "top_p", "top_k"))
        per_algo.append(entry)
    paired = []
    by_seed = {(p["algo"], p["seed"]): p for p in per_run}
    for base in baselines:
        for algo in (a for a in algos if a != base):
            seeds = [s for s in manifest["seeds"] if (base, s) in by_seed and (algo, s) in by_seed]
            for key in PAIRED:
                pairs = [(by_seed[(base, s)][key], by_seed[(algo, s)][key]) for s in seeds]
                pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
                if pairs:
                    t = paired_t_test([a for a, _ in pairs], [b for _, b in pairs])
                    paired.append({"algo": algo, "baseline": base, "metric": key, "n": t.n,
                                   "mean_diff": t.mean_diff, "ci95": [t.ci_low, t.ci_high], "t": t.t,
                                   "p_value": t.p_value})
    return {"manifest": dict(manifest), "per_algo": per_algo, "paired": paired, "per_run": per_run}


def _same(dicts: Sequence[Mapping], keys: Sequence[str]) -> dict[str, Any]:
    """The values of `keys` that every run agrees on; "mixed" where seeds differ."""
    out = {}
    for k in keys:
        vals = {json.dumps(d.get(k)) for d in dicts}
        out[k] = json.loads(vals.pop()) if len(vals) == 1 else "mixed"
    return out


def markdown_report(summary: Mapping[str, Any]) -> str:
    man = summary["manifest"]
    titles = {key: title for key, title, _ in RUN_METRICS
              if key not in OPTIONAL or any(r.get(key) is not None for r in summary["per_run"])}
    lines = ["# Comparison", "", f"Preset: `{man['config']}`; overrides: `{' '.join(man['overrides']) or '(none)'}`."]
    if man.get("sources"):  # a report merged from several compare folders
        lines += ["", "Runs from:"]
        lines += [f"- `{src['folder']}` (preset `{src['config']}`; its own overrides "
                  f"`{' '.join(src['overrides']) or '(none)'}`): " + ", ".join(src["labels"].values())
                  for src in man["sources"]]
        lines.append("")
    lines += [
        f"Evaluation: the env's last {man['eval_tasks']} tasks, greedily and with {man['eval_samples']} "
        "samples per task at each run's own training sampling setup (temperature, top_p, top_k).",
        "Cells: mean over seeds [95% Student-t confidence interval]. Sample budget: trajectories trained "
        "on per RL step x steps (the same for every algorithm when the presets agree); trajectories "
        "generated also counts what was sampled and dropped (DAPO's dynamic sampling).", "",
        "## Per algorithm", "",
        "| algorithm | seeds | sample budget | sampling (T / top_p / top_k) | "
        + " | ".join(titles.values()) + " |",
        "|" + "---|" * (4 + len(titles)),
    ]
    for a in summary["per_algo"]:
        b, s = a["budget"], a["sampling"]
        cells = [format_ci(a[k]["mean"], *a[k]["ci95"]) if k in a else "–" for k in titles]
        lines.append(f"| {a['algo']} | {len(a['seeds'])} | {b['trajectories_per_step']} x {b['steps']} = "
                     f"{b['trajectories']} | {s['temperature']} / {s['top_p']} / {s['top_k']} | "
                     + " | ".join(cells) + " |")
    for base in dict.fromkeys(p["baseline"] for p in summary["paired"]):
        lines += ["", f"## Against {base} (paired by seed: two-sided paired t-test of algorithm − {base})", "",
                  "| algorithm | metric | pairs | mean difference [95% CI] | t | p |", "|---|---|---|---|---|---|"]
        for p in (p for p in summary["paired"] if p["baseline"] == base):
            lines.append(f"| {p['algo']} | {titles[p['metric']]} | {p['n']} | "
                         f"{format_ci(p['mean_diff'], *p['ci95'])} | {format_value(p['t'], 2)} | "
                         f"{format_p(p['p_value'])} |")
    lines += ["", "## Per run", "",
              "| algorithm | seed | trajectories | " + " | ".join(titles.values()) + " |",
              "|" + "---|" * (3 + len(titles))]
    for r in summary["per_run"]:
        lines.append(f"| {r['algo']} | {r['seed']} | {r['trajectories']} | "
                     + " | ".join(format_value(r[k]) for k in titles) + " |")
    return "\n".join(lines) + "\n"


def load_runs(root: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The manifest and the per-run results of a comparison directory, in (algorithm, seed) order."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {root} the --out folder of a `compare` run?")
    manifest = json.loads(path.read_text())
    runs, missing = [], []
    for algo in manifest["algos"]:
        for seed in manifest["seeds"]:
            result = root / f"{algo}-{seed}" / RUN_RESULT
            if result.is_file():
                runs.append(json.loads(result.read_text()))
            else:
                missing.append(str(result))
    if missing:
        raise FileNotFoundError("compare: runs without results (unfinished or failed; rerun them):\n  "
                                + "\n  ".join(missing))
    return manifest, runs


def merge_comparisons(folders: Sequence[str | os.PathLike]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One manifest and run list from several compare folders scored on the same tasks, so runs
    trained apart (a rule added later, a setting varied by override) are tabled and paired by seed
    together. A run keeps its algorithm's name where only one folder has that algorithm, else it is
    named by its folder's own overrides (those not shared by every folder): `arpo tree.branch_rule=turn`."""
    loaded = [(Path(f), *load_runs(f)) for f in folders]
    first, man0, runs0 = loaded[0]
    for folder, man, runs in loaded[1:]:
        for key in ("eval_tasks", "eval_samples"):
            if man[key] != man0[key]:
                raise ValueError(f"compare: {folder} was evaluated with {key}={man[key]}, {first} with {man0[key]}; "
                                 "only comparisons scored the same way can be merged")
        starts = {r["eval"]["first_task"] for r in runs + runs0 if "eval" in r}
        if len(starts) > 1:
            raise ValueError(f"compare: {folder} and {first} hold out different tasks (first held-out tasks "
                             f"{sorted(starts)}): merge comparisons of the same env")
    common = [o for o in man0["overrides"] if all(o in man["overrides"] for _, man, _ in loaded)]
    owners: dict[str, int] = {}
    for _, man, _ in loaded:
        for algo in man["algos"]:
            owners[algo] = owners.get(algo, 0) + 1
    algos, seeds, runs, sources = [], [], [], []
    for folder, man, folder_runs in loaded:
        own = [o for o in man["overrides"] if o not in common]
        labels = {}
        for algo in man["algos"]:
            label = " ".join([algo, *own]) if owners[algo] > 1 else algo
            if label in algos:  # folders that differ by preset alone
                label = f"{label} ({folder.name})"
            labels[algo] = label
            algos.append(label)
        seeds += [s for s in man["seeds"] if s not in seeds]
        runs += [{**r, "algo": labels[r["algo"]]} for r in folder_runs]
        sources.append({"folder": str(folder), "config": man["config"], "overrides": own, "labels": labels})
    configs = {man["config"] for _, man, _ in loaded}
    manifest = {"algos": algos, "seeds": seeds, "config": configs.pop() if len(configs) == 1 else "per folder",
                "overrides": common, "eval_tasks": man0["eval_tasks"], "eval_samples": man0["eval_samples"],
                "sources": sources}
    return manifest, runs


def write_report(root: str | os.PathLike, merge: Sequence[str | os.PathLike] = (),
                 baselines: Sequence[str] = ()) -> dict[str, Any]:
    """results.md / results.json / pass_at_1.png / reward_curves.png from a compare folder, or into
    `root` from the compare folders `merge`; paired tests against each of `baselines`."""
    root = Path(root)
    manifest, runs = merge_comparisons(merge) if merge else load_runs(root)
    summary = summarize_runs(manifest, runs, baselines)
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.md").write_text(markdown_report(summary))
    (root / "results.json").write_text(json.dumps(json_safe(summary), indent=1, allow_nan=False))
    ci_bar_plot(summary["per_algo"], ("sampled_pass@1", "greedy_pass@1"),
                ("at training sampling", "greedy"), root / "pass_at_1.png", "held-out pass@1 (mean, 95% CI)")
    curves = {}
    for r in runs:
        curves.setdefault(r["algo"], []).append(r["curve"])
    # the env's reward, before any algorithm's shaping (DAPO's overlong penalty), so curves compare
    smoothed_curves_plot(curves, "env_reward_mean", root / "reward_curves.png", "training reward (env)")
    return summary


def json_safe(obj: Any) -> Any:
    """NaN (an undefined interval or test, e.g. from one seed) as JSON null, so results.json stays
    strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ci_bar_plot(per_algo: Sequence[Mapping], keys: Sequence[str], names: Sequence[str], path: str | Path,
                title: str) -> Path:
    """Grouped bars, one group per algorithm and one bar per key, with 95% CI error bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(2.0 + 1.4 * len(per_algo), 3.4))
    width = 0.8 / len(keys)
    for j, (key, name) in enumerate(zip(keys, names, strict=True)):
        xs = [i + (j - (len(keys) - 1) / 2) * width for i in range(len(per_algo))]
        means = [a[key]["mean"] if key in a else 0.0 for a in per_algo]
        errs = [[0.0 if key not in a or math.isnan(a[key]["ci95"][0]) else m - a[key]["ci95"][0]
                 for a, m in zip(per_algo, means, strict=True)],
                [0.0 if key not in a or math.isnan(a[key]["ci95"][1]) else a[key]["ci95"][1] - m
                 for a, m in zip(per_algo, means, strict=True)]]  # fmt: skip
        bars = ax.bar(xs, means, width, yerr=errs, capsize=3, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
    # merged comparisons name runs by their overrides: one per line keeps the labels narrow
    ax.set_xticks(range(len(per_algo)), [a["algo"].replace(" ", "\n") + f"\n(n={len(a['seeds'])})" for a in per_algo],
                  fontsize=8 if any(" " in a["algo"] for a in per_algo) else None)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("pass@1")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def smoothed_curves_plot(runs: Mapping[str, Sequence[Sequence[Mapping]]], key: str, path: str | Path, title: str,
                         window: int | None = None) -> Path | None:
    """`runs`: algorithm -> its runs' per-step rows. Each run's raw `key` is drawn faintly; the
    mean over an algorithm's runs, smoothed by a trailing moving average (`window`; default a
    tenth of the steps), boldly. None when no run has `key`."""
    from algorithms.core.run_log import moving_average, smoothing_window

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    drawn = False
    for i, (algo, curves) in enumerate(runs.items()):
        color = f"C{i}"
        by_step: dict[int, list[float]] = {}
        for rows in curves:
            pts = [(int(r["step"]), float(r[key])) for r in rows if key in r and "step" in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), color=color, alpha=0.15, linewidth=0.8)
                for s, v in pts:
                    by_step.setdefault(s, []).append(v)
        if by_step:
            steps = sorted(by_step)
            avg = [mean(by_step[s]) for s in steps]
            w = window or smoothing_window(len(steps))
            ax.plot(steps, moving_average(avg, w), color=color, linewidth=2,
                    label=f"{algo} (mean of {len(curves)}, moving average over {w})")
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("RL step")
    ax.set_ylabel(key)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)



def quickstart_plot(rows: Sequence[Mapping], rl_metrics: Sequence[Mapping], path: str | Path, title: str) -> Path:
    """Three panels: accuracy of each evaluation row, tool calls per task on hard and easy tasks,
    and the RL reward per step (moving average over the faint raw values)."""
    from algorithms.core.run_log import plot_line, smoothing_window

    plt = _pyplot()

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
