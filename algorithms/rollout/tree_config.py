"""`TreeConfig`: every setting of the entropy-branching tree rollout (ARPO, AEPO), in one place.

It is the `tree` field of the ARPO and AEPO configs (`tree.beam_size=3` on the command line, a
`tree:` mapping in YAML), and what `TreeRollout`, the branch rule (`branching.py`) and the
segment entropy (`entropy.py`) read. The budget M is not here: it is the learner's `group_size`,
passed to `TreeRollout` as `budget`.

    >>> TreeConfig().branch_probability, TreeConfig(branch_threshold=0.3).tau
    (0.5, 0.3)
    >>> TreeConfig(entropy_formula="paper")
    Traceback (most recent call last):
    ...
    ValueError: config field 'tree.entropy_formula' must be one of ['ours', 'reference'], got 'paper'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from agent_envs.base.config import check_types, option, require

Reduction = Literal["scaled_mean", "sum", "mean"]
BranchRuleName = Literal["entropy", "turn", "entropy_value", "mixed_outcome"]


@dataclass
class TreeConfig:
    """Tree rollout settings. Defaults are ARPO's (reference scripts, docs/algorithms.md §6.2); AEPO's
    config turns on the consecutive-branch penalty and pre-monitoring (§7.2, §7.3)."""

    initial_rollouts: int = option(8, "N: full rollouts started from the prompt (clamped to [1, M])")
    beam_size: int = option(2, "Z: children per branch point, the source included (<= Z-1 forks)")
    branch_probability: float = option(0.5, "α: base branch probability (the reference's τ too)")
    branch_threshold: float | None = option(
        None, "τ of branch_mode=threshold (null: τ = α, as the reference's single key)"
    )
    entropy_weight: float = option(0.2, "β_br: sensitivity of the branch probability to ΔH")
    branch_mode: Literal["sample", "threshold"] = option(
        "sample", "sample: fork iff u < P; threshold: fork iff α + β·ΔH > τ (deterministic)"
    )
    # a str checked in validate(), so the old values `ours|reference` get a message naming their new key
    branch_rule: str = option(
        "entropy",
        "where a rollout branches: entropy (ARPO), turn (Tree-GRPO), entropy_value (APPO), "
        "mixed_outcome (TRACE); docs/algorithms.md §6.10",
    )
    entropy_formula: Literal["ours", "reference"] = option(
        "ours", "entropy rule: ours (one formula, penalty per branch) or reference (the public code's)"
    )
    future_discount: float = option(0.9, "entropy_value: γ of the future value Σ γ^(k-t)·log π(a_k)")
    entropy_tokens: int = option(20, "k: leading tokens of a segment whose entropy counts")
    entropy_topk: int = option(10, "K: top-K log-probs per position requested from the engine")
    entropy_reduction: Reduction = option(
        "scaled_mean", "scaled_mean (k·mean/ln|V|), sum (reference) or mean of the k entropies"
    )
    entropy_tail_correction: bool = option(False, "add the entropy of the mass outside the top K")
    entropy_source: Literal["auto", "topk", "exact"] = option(
        "topk", "topk estimate, exact (engine's full-logit entropy, HF), or auto (exact when given)"
    )
    topup_mode: Literal["all", "one"] = option(
        "all", "all: start every missing branch at once; one: one per iteration (reference)"
    )
    enable_consecutive_penalty: bool = option(False, "AEPO: damp branching by max(0, 1 - γ·l) (§7.3)")
    consecutive_penalty: float = option(0.05, "γ per consecutive branching of a branch lineage")
    enable_dynamic_rollouts: bool = option(False, "AEPO entropy pre-monitoring sets N per prompt (§7.2)")
    premonitor_beta: float = option(0.5, "β_pm of pre-monitoring")
    initial_entropy_tokens: int = option(50, "tokens generated from the prompt for H_root")
    reuse_probe: bool = option(False, "count the pre-monitoring probe as one of the global samples")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.branch_rule in ("ours", "reference"):  # the key's meaning before the rules were a choice
            raise ValueError(
                f"config field 'tree.branch_rule: {self.branch_rule}' is now 'tree.entropy_formula: "
                f"{self.branch_rule}' (tree.branch_rule picks the rule: entropy, turn, entropy_value, mixed_outcome)"
            )
        check_types(self, "tree.")
        rules = list(get_args(BranchRuleName))
        require(self.branch_rule in rules, "tree.branch_rule", f"must be one of {rules}", self.branch_rule)

        def need(ok: bool, key: str, what: str) -> None:
            require(ok, f"tree.{key}", what, getattr(self, key))

        need(self.initial_rollouts >= 1, "initial_rollouts", "(N) must be >= 1")
        need(self.beam_size >= 1, "beam_size", "(Z) must be >= 1")
        need(0.0 <= self.branch_probability <= 1.0, "branch_probability", "must be in [0, 1]")
        need(
            self.branch_threshold is None or 0.0 <= self.branch_threshold <= 1.0,
            "branch_threshold",
            "must be in [0, 1] or null",
        )
        need(self.consecutive_penalty >= 0, "consecutive_penalty", "must be >= 0")
        need(self.entropy_tokens >= 1, "entropy_tokens", "must be >= 1")
        need(self.entropy_topk >= 1, "entropy_topk", "(the engine's logprobs=K) must be >= 1")
        need(self.initial_entropy_tokens >= 1, "initial_entropy_tokens", "must be >= 1")
        need(0.0 < self.future_discount <= 1.0, "future_discount", "must be in (0, 1]")

    @property
    def tau(self) -> float:
        """τ: the threshold, which is α unless `branch_threshold` is set."""
        return self.branch_probability if self.branch_threshold is None else self.branch_threshold

    @property
    def penalty(self) -> float:
        """γ when the consecutive-branch penalty is on, else 0."""
        return self.consecutive_penalty if self.enable_consecutive_penalty else 0.0


__all__ = ["BranchRuleName", "Reduction", "TreeConfig"]
