"""The learner's side of the rollout health checks (docs/diagnostics.md): each step's
trajectories are checked before any update, the engine/trainer log-prob gap is noted during the
update, and `health/*` metrics are summed over every rank.

    >>> from algorithms.core.health_watch import HealthWatch
    >>> from algorithms.rollout.health import HealthChecker
    >>> HealthWatch(HealthChecker(mode="off"), ranks=None).enabled
    False

The checks themselves live in `algorithms.rollout.health`; this module adds what a data-parallel
learner needs: one verdict on every rank in fatal mode, and metrics over every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from algorithms.core.losses import LossInputs
from algorithms.core.ranks import Ranks


class HealthWatch:
    """A `HealthChecker` inside the learner loop; `gaps` holds the step's log-prob gaps per row."""

    def __init__(self, checker: Any, ranks: Ranks | None) -> None:
        self.checker, self.ranks = checker, ranks
        self.gaps: dict[int, tuple[float, int, float, float]] = {}

    @classmethod
    def start(
        cls, cfg: Any, engine: Any, env_factory: Callable[[], Any], tokenizer: Any, ranks: Ranks
    ) -> tuple[HealthWatch, Any]:
        """The watch of `cfg.health_checks`, and the engine it watches through a recorder."""
        from algorithms.rollout.health import HealthChecker, RecordedEngine

        if cfg.health_checks == "off":
            return cls(HealthChecker(mode="off"), ranks), engine
        if not isinstance(engine, RecordedEngine):
            engine = RecordedEngine(engine)
        checker = HealthChecker.for_env(
            env_factory(),
            mode=cfg.health_checks,
            engine=engine,
            tokenizer=tokenizer,
            max_response_tokens=cfg.max_response_tokens,
            logprob_tol=cfg.health_logprob_tol,
            # a gateway session's reward is its agent's, an agent run's may be agent.failure_reward:
            # not the env recipe's, so no recipe rules
            **({"reward_bounds": None, "format_failure_reward": None} if cfg.rollout_source != "envs" else {}),
        )
        return cls(checker, ranks), engine

    @property
    def enabled(self) -> bool:
        return self.checker.enabled

    def check_rollouts(self, trajs: list[Any], engine: Any) -> Any:
        """The trajectory checks of this step's rollouts, before any update (fatal mode raises
        here); the engine's record is then cleared for the next step. None when off."""
        if not self.enabled:
            return None
        report = self.checker.check(trajs)
        if hasattr(engine, "forget"):
            engine.forget(trajs)
        self.gaps = {}
        self.verdict(report.faults)
        return report

    def check_episodes(self, trajs: list[Any]) -> None:
        """The trajectory checks of evaluation episodes (no update follows)."""
        if self.enabled:
            self.verdict(self.checker.check(trajs).faults)

    def verdict(self, findings: list[Any]) -> None:
        """Warn about this rank's first failures; in fatal mode every rank raises together (one
        rank raising alone would leave the others waiting in the next collective)."""
        from algorithms.rollout.health import RolloutHealthError

        if self.checker.mode == "fatal" and self.ranks.world > 1:
            total = float(self.ranks.sum(float(len(findings))))
            if total and not findings:
                raise RolloutHealthError("a rollout health check failed on another rank (its warning names it)")
        self.checker.raise_or_warn(findings)

    def note_gap(self, rows: list[int], inputs: LossInputs) -> None:
        """|π_old − π_behaviour| on the trained tokens of a micro-batch (its loss inputs): per row
        its max, where, sum and token count (π_old is fixed within a step, so later epochs rewrite
        the same)."""
        mask = inputs.mask
        gap = (inputs.old_logprobs - inputs.behaviour_logprobs).detach().abs() * mask
        worst, where = gap.max(dim=-1)
        sums, counts = gap.sum(-1), (mask > 0).sum(-1)
        for j, r in enumerate(rows):
            self.gaps[r] = (float(worst[j]), int(where[j]), float(sums[j]), float(counts[j]))

    def step_metrics(self, report: Any, trajs: list[Any]) -> dict[str, float]:
        """`health/<check>` counts over every rank, the engine/trainer log-prob gap, the time taken."""
        from algorithms.rollout.health import CHECKS

        gaps = self.gaps
        findings = self.checker.logprob_findings(trajs, {r: (g[0], g[1]) for r, g in gaps.items()})
        for f in findings:
            report.add(f)
        counts = self.ranks.sum(torch.tensor([float(report.counts[c]) for c in CHECKS]))
        out = {f"health/{c}": float(v) for c, v in zip(CHECKS, counts, strict=True)}
        total, tokens = self.ranks.sum(torch.tensor([sum(g[2] for g in gaps.values()),
                                                     sum(g[3] for g in gaps.values())]))  # fmt: skip
        worst = self.ranks.max(torch.tensor(max((g[0] for g in gaps.values()), default=0.0), dtype=torch.float64))
        out["health/logprob_diff_mean"] = float(total / tokens) if tokens else 0.0
        out["health/logprob_diff_max"] = float(worst)
        out["health/time_ms"] = 1000 * report.seconds
        self.verdict(findings[:1])
        return out


__all__ = ["HealthWatch"]
