"""Greedy validation on held-out tasks: the env's last `eval_episodes` tasks, which training never
draws, one episode each at T = 0, split over ranks; logged as `eval/*` means over all of them.

The tail is held out whether or not validation runs (`eval_every: 0`), because `evaluate`,
`compare` and the quickstart score a run's model on those tasks afterwards:

    >>> from types import SimpleNamespace
    >>> held_out_tasks(10, SimpleNamespace(eval_every=0, eval_episodes=3, env="AgentMath-v0"))
    [7, 8, 9]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from algorithms.core.group_sampling import run_coroutine
from algorithms.core.ranks import Ranks


def held_out_tasks(num_tasks: int, cfg: Any) -> list[int]:
    """The task indices training never draws: the env's last `eval_episodes` (none when it is 0)."""
    held_out = cfg.eval_episodes
    if num_tasks <= held_out:
        raise ValueError(
            f"config field 'eval_episodes': env {cfg.env} has {num_tasks} tasks, too few to hold "
            f"out {held_out} from training and train on the rest; lower eval_episodes"
        )
    return list(range(num_tasks - held_out, num_tasks))


def evaluate(
    *,
    model: Any,
    engine: Any,
    env_factory: Callable[[], Any],
    tasks: list[int],
    max_response_tokens: int,
    health: Any,
    ranks: Ranks,
) -> dict[str, float]:
    """Greedy episodes on `tasks`, this rank's share of them; `eval/*` means over every rank
    (and `eval/health/*` counts when the health checks are on)."""
    from algorithms.rollout.engine import SamplingParams
    from algorithms.rollout.health import CHECKS
    from algorithms.rollout.runner import run_episodes

    mine = tasks[ranks.rank :: ranks.world]
    trajs = []
    if mine:
        params = SamplingParams(temperature=0.0, max_tokens=max_response_tokens)
        model.eval()
        trajs = run_coroutine(
            run_episodes(engine, env_factory, params, tasks=mine, max_response_tokens=max_response_tokens)
        )
    health.check_episodes(trajs)
    rows = {
        "reward_mean": [float(t.reward) for t in trajs],
        "accuracy": [float(t.components.get("correct", 0.0) or 0.0) for t in trajs],
        "protocol_valid": [float(bool(t.components.get("format_ok", False))) for t in trajs],
        "tool_calls_mean": [float(t.tool_calls) for t in trajs],
        "response_length_mean": [float(sum(t.loss_mask)) for t in trajs],
    }
    checks = {f"health/{c}": [float(c in t.health) for t in trajs] for c in CHECKS}
    gathered = ranks.gather_lists({**rows, **checks})
    out = {f"eval/{k}": float(np.mean(v)) for k, v in gathered.items() if v and k in rows}
    if health.enabled:
        out.update({f"eval/{k}": float(np.sum(v)) for k, v in gathered.items() if k in checks})
    return out


__all__ = ["evaluate", "held_out_tasks"]
