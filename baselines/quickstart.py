"""The CPU quickstart: a tiny model learns to use a Python tool, end to end, offline.

    agent-envs quickstart                    # about 5-10 minutes on 2 idle CPU cores
    agent-envs quickstart --sft-steps 40 --rl-steps 4 --eval-tasks 16   # a smoke run

Stages, each written under `--out` (default runs/quickstart):
1. build a tiny Qwen2-architecture model and tokenizer locally (no hub download);
2. evaluate it on held-out arithmetic tasks (greedy): it knows nothing yet;
3. cold-start SFT on the arithmetic world's gold tool-use traces (configs/sft_tiny.yaml);
4. GRPO from the SFT checkpoint with the python sandbox in the loop (configs/grpo_tiny.yaml);
5. evaluate after each stage, greedy and sampled; write results.md and results.png.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def run_quickstart(out: str = "runs/quickstart", sft_steps: int | None = None, rl_steps: int | None = None,
                   eval_tasks: int = 64, algo: str = "grpo") -> dict[str, Any]:
    from algorithms.base.config import build_config
    from algorithms.cli import learner_class
    from algorithms.models.tiny import build_tiny_model
    from algorithms.sft import SFTConfig, run_sft
    from baselines.comparison.report import bar_plot, markdown_table
    from baselines.evaluation.evaluate import EvalConfig, evaluate

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    def stage(name: str) -> None:
        timings[name] = time.perf_counter()
        print(f"\n== {name} ==", flush=True)

    stage("tiny model")
    base = build_tiny_model()
    sft_cfg = build_config(SFTConfig, CONFIGS / "sft_tiny.yaml",
                           [f"model={base}", f"output_dir={root / 'sft'}"] + ([f"steps={sft_steps}"] if sft_steps else []))
    env_kwargs = dict(sft_cfg.env_kwargs)
    # held-out tasks: the end of the world's index range (SFT trains on the start, RL samples uniformly)
    import gymnasium as gym

    probe_len = len(gym.make(sft_cfg.env, **env_kwargs).unwrapped.tasks)

    def evaluation(name: str, model: Path, n: int = 1, temperature: float | None = None) -> dict:
        cfg = EvalConfig(env=sft_cfg.env, model=str(model), engine="hf", n=n, ks=(1,), limit=eval_tasks,
                         first_task=probe_len - eval_tasks, temperature=temperature, max_response_tokens=96,
                         env_kwargs=env_kwargs, out=str(root / "eval" / name))
        metrics = evaluate(cfg)["metrics"]
        print(f"{name}: pass@1 {metrics['pass@1']:.3f}  format ok {metrics['format_ok']:.3f}  "
              f"tool calls {metrics['tool_calls']:.2f}", flush=True)
        return {"label": name, **metrics}

    cls = learner_class(algo)
    rl_overrides = [f"output_dir={root / algo}", "save_every=0"] + ([f"total_steps={rl_steps}"] if rl_steps else [])
    temp = build_config(cls.config_class, CONFIGS / f"{algo}_tiny.yaml", rl_overrides).temperature
    sampled = f"T={temp:g}, 4 samples"  # the temperature RL samples at

    rows = [evaluation("base (greedy)", base)]
    stage("SFT")
    sft = Path(run_sft(sft_cfg)["model"])
    rows.append(evaluation("SFT (greedy)", sft))
    rows.append(evaluation(f"SFT ({sampled})", sft, n=4, temperature=temp))
    stage(algo.upper())
    rl_cfg = build_config(cls.config_class, CONFIGS / f"{algo}_tiny.yaml", [f"model={sft}", *rl_overrides])
    cls(rl_cfg).train()
    rl = root / algo / "final_model"
    rows.append(evaluation(f"{algo.upper()} (greedy)", rl))
    rows.append(evaluation(f"{algo.upper()} ({sampled})", rl, n=4, temperature=temp))
    timings["done"] = time.perf_counter()

    names = list(timings)
    wall = {n: timings[b] - timings[n] for n, b in zip(names, names[1:], strict=False)}
    table = markdown_table(rows, label="model")
    plot = bar_plot([r["label"].replace(" (", "\n(") for r in rows], [r["pass@1"] for r in rows],
                    root / "results.png", "AgentMath-v0, held-out tasks")
    text = (f"# Quickstart results\n\nHeld-out tasks: {eval_tasks} (indices {probe_len - eval_tasks}-{probe_len - 1}).\n\n"
            f"{table}\n\nWall time per stage (s): " + ", ".join(f"{k} {v:.0f}" for k, v in wall.items())
            + f"\n\nTraining curves: {root / algo / 'curves.png'}\n")
    (root / "results.md").write_text(text)
    (root / "results.json").write_text(json.dumps({"rows": rows, "wall_s": wall}, indent=1, default=str))
    print("\n" + text + f"\nPlot: {plot}")
    return {"rows": rows, "wall_s": wall, "plot": str(plot)}


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("quickstart", help="CPU quickstart: tiny model -> SFT -> RL -> evaluation")
    p.add_argument("--out", default="runs/quickstart")
    p.add_argument("--sft-steps", type=int, help="default: configs/sft_tiny.yaml")
    p.add_argument("--rl-steps", type=int, help="default: the algorithm's tiny preset")
    p.add_argument("--eval-tasks", type=int, default=64)
    p.add_argument("--algo", default="grpo", choices=["grpo", "dapo", "arpo", "aepo"])
    p.set_defaults(func=lambda a: run_quickstart(a.out, a.sft_steps, a.rl_steps, a.eval_tasks, a.algo) and 0)
