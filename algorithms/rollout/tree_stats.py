"""Accounting of a tree rollout: what each prompt's tree cost and did (`PromptStats`), the
rollout's result, and the per-step `rollout/*` metrics built from them (docs/algorithms.md §6.4,
§6.10). `TreeRollout` (`algorithms.rollout.tree`) fills them in; the ARPO and AEPO learners
gather them over ranks and log `tree_metrics`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from algorithms.rollout.runner import EpisodeBranch
from algorithms.rollout.trajectory import Trajectory

BRANCH_TOKENS = 8  # `rollout/branch_entropy` averages a fork's 1st-8th tokens, as `analyze --premise` does


@dataclass
class PromptStats:
    """Accounting of one prompt in one rollout call."""

    initial: int = 0
    forks: int = 0
    topups: int = 0
    decisions: int = 0  # candidate-fork draws
    branch_points: int = 0  # eligible (source, tool result) pairs visited
    generated_tokens: int = 0  # sampled by the engine for the kept trajectories
    overhead_tokens: int = 0  # sampled for pre-monitoring (root entropy, probe) and not kept
    tool_calls: int = 0  # tool calls actually executed (forks do not repeat their prefix's calls)
    engine_calls: int = 0
    delta_h: list[float] = field(default_factory=list)
    # per fork: mean token entropy of its first BRANCH_TOKENS tokens, the branch point's own
    # distribution first (what each rule chose to resample; docs/algorithms.md §6.10)
    branch_h: list[float] = field(default_factory=list)
    h_root: float | None = None
    h_tool: float | None = None


@dataclass
class TreeRolloutResult:
    """The trajectories (prompt-major, M per prompt), per-prompt accounting, and the finished
    runner branches in the same order (their envs hold the final episode states)."""

    trajectories: list[Trajectory]
    prompts: list[PromptStats]
    branches: list[EpisodeBranch] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Per-step rollout metrics (docs/algorithms.md §2.11): forks, top-ups, branch rate, ΔH, depth."""
        return tree_metrics(self.prompts, [int(t.lineage.get("depth", 0)) for t in self.trajectories])

    def to_dict(self) -> dict[str, Any]:
        return {"prompts": [asdict(p) for p in self.prompts], "metrics": self.metrics()}


def tree_metrics(prompts: Sequence[PromptStats], depths: Sequence[int]) -> dict[str, float]:
    """Rollout metrics from per-prompt accounting and the depth of every trajectory (of one call,
    or gathered from every rank)."""
    k = max(1, len(prompts))
    dh = [d for p in prompts for d in p.delta_h]
    bh = [h for p in prompts for h in p.branch_h]
    decisions = sum(p.decisions for p in prompts)
    trajs = max(1, len(depths))
    out = {
        "rollout/forks_per_prompt": sum(p.forks for p in prompts) / k,
        "rollout/topups_per_prompt": sum(p.topups for p in prompts) / k,
        "rollout/branch_rate": sum(p.forks for p in prompts) / decisions if decisions else 0.0,
        "rollout/delta_h_mean": sum(dh) / len(dh) if dh else 0.0,
        "rollout/branch_entropy": sum(bh) / len(bh) if bh else 0.0,
        "rollout/trajectories_per_prompt": len(depths) / k,
        "rollout/generated_tokens_per_traj": sum(p.generated_tokens for p in prompts) / trajs,
        "rollout/generated_tokens_per_prompt": sum(p.generated_tokens for p in prompts) / k,
        "rollout/overhead_tokens_per_prompt": sum(p.overhead_tokens for p in prompts) / k,
        "rollout/tool_calls_per_traj": sum(p.tool_calls for p in prompts) / trajs,
    }
    for d, c in sorted(Counter(depths).items()):
        out[f"rollout/depth_{d}"] = c / trajs
    return out


__all__ = ["BRANCH_TOKENS", "PromptStats", "TreeRolloutResult", "tree_metrics"]
