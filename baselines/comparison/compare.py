"""Baseline comparisons: N algorithms x seeds on the same env, model and sample budget.

    agent-envs compare --algos grpo,dapo,arpo,aepo --seeds 0,1 --out runs/compare \\
        model=runs/quickstart/sft/final_model total_steps=100

Each (algorithm, seed) trains from `--config` (default `configs/{algo}_tiny.yaml`; `{algo}` is
filled in) with the shared `key=value` overrides plus `seed` and `output_dir`, then its final
model is evaluated on held-out tasks of the same env. Written to `--out`: `results.md` (per run
and mean ± std per algorithm), `results.json`, `pass_at_1.png` and `reward_curves.png`.
The presets give every algorithm the same trajectories per prompt (G = M) and prompts per step,
so they spend the same sample budget; `results.md` records each run's trajectory count.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from statistics import mean
from typing import Any

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def run_compare(algos: list[str], seeds: list[int], out: str, config: str, overrides: list[str],
                eval_tasks: int = 64, eval_samples: int = 1) -> dict[str, Any]:
    import gymnasium as gym

    from algorithms.cli import learner_class
    from algorithms.core.config import build_config
    from algorithms.core.run_log import read_metrics
    from baselines.comparison.report import aggregate, bar_plot, curves_plot, markdown_table
    from baselines.evaluation.evaluate import EvalConfig, evaluate

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    rows, curves = [], {}
    for algo in algos:
        cls = learner_class(algo)
        for seed in seeds:
            run_dir = root / f"{algo}-{seed}"
            cfg = build_config(cls.config_class, config.format(algo=algo),
                               [*overrides, f"seed={seed}", f"output_dir={run_dir}"])
            print(f"\n== {algo} seed {seed} -> {run_dir} ==", flush=True)
            t0 = time.perf_counter()
            cls(cfg).train()
            train_s = time.perf_counter() - t0
            metrics = read_metrics(run_dir)
            curves[f"{algo}-{seed}"] = metrics
            n_tasks = len(gym.make(cfg.env, **cfg.env_kwargs).unwrapped.tasks)
            limit = min(eval_tasks, n_tasks)
            summary = evaluate(EvalConfig(
                env=cfg.env, model=str(run_dir / "final_model"), engine="hf", n=eval_samples, ks=(1,),
                limit=limit, first_task=n_tasks - limit, temperature=None if eval_samples == 1 else 1.0,
                max_response_tokens=cfg.max_response_tokens, env_kwargs=dict(cfg.env_kwargs),
                out=str(run_dir / "eval"), seed=seed))
            last = metrics[-10:]
            rows.append({
                "label": f"{algo} seed {seed}", "algo": algo, "seed": seed, **summary["metrics"],
                "train_reward_last10": mean(m["reward_mean"] for m in last) if last and "reward_mean" in last[0] else None,
                "trajectories_per_step": cfg.prompts_per_step * cfg.group_size, "train_s": train_s,
            })
    per_run = markdown_table(rows)
    per_algo = markdown_table(aggregate(rows, "algo"), label="algorithm")
    bar_plot([r["label"].replace(" seed ", "\nseed ") for r in rows], [r["pass@1"] for r in rows],
             root / "pass_at_1.png", "held-out pass@1 after training")
    curves_plot(curves, "reward_mean", root / "reward_curves.png", "training reward")
    text = (f"# Comparison\n\nOverrides: `{' '.join(overrides)}`; held-out tasks per run: {eval_tasks}.\n\n"
            f"## Per algorithm (mean ± std over seeds)\n\n{per_algo}\n\n## Per run\n\n{per_run}\n\n"
            + "\n".join(f"- {r['label']}: {r['trajectories_per_step']} trajectories per step, "
                        f"trained in {r['train_s']:.0f} s" for r in rows) + "\n")
    (root / "results.md").write_text(text)
    (root / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    print("\n" + text)
    return {"rows": rows}


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("compare", help="train N algorithms x seeds on one env; table + plots")
    p.add_argument("--algos", default="grpo,dapo,arpo,aepo")
    p.add_argument("--seeds", default="0")
    p.add_argument("--config", default=str(CONFIGS / "{algo}_tiny.yaml"), help="preset path; {algo} is filled in")
    p.add_argument("--out", default="runs/compare")
    p.add_argument("--eval-tasks", type=int, default=64)
    p.add_argument("--eval-samples", type=int, default=1)
    p.add_argument("overrides", nargs="*", help="key=value overrides applied to every run")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    run_compare(args.algos.split(","), [int(s) for s in args.seeds.split(",")], args.out, args.config,
                args.overrides, args.eval_tasks, args.eval_samples)
    return 0
