"""GRPO (DeepSeekMath): group-normalised outcome advantages, PPO clip, no critic.

    agent-envs train --algo grpo --config configs/grpo_tiny.yaml

    >>> from algorithms.grpo import GRPOConfig
    >>> cfg = GRPOConfig()
    >>> cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c, cfg.kl_coef
    (0.2, 0.2, 3.0, 0.0)

GRPO *is* the shared core (`algorithms/core/learner.py`): flat group sampling, A_i = (R_i − μ_g)
/ (σ_g + 1e-6) with the unbiased std, PPO clip 0.2/0.2 with dual clip c = 3, token-mean over
model tokens, no KL (no reference model) and AdamW lr 1e-6, constant (docs/algorithms.md §3.3). The paper's
sequence-level mean is `loss_agg_mode=seq-mean-token-mean` (preset configs/grpo_paper.yaml);
Dr. GRPO is `scale_rewards=none loss_agg_mode=seq-mean-token-sum-norm`.
"""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.core.learner import Learner
from algorithms.core.learner_config import LearnerConfig


@dataclass
class GRPOConfig(LearnerConfig):
    """GRPO's defaults are the core's (docs/algorithms.md §3.3)."""

    output_dir: str = "runs/grpo"


class GRPOLearner(Learner):
    name = "grpo"
    config_class = GRPOConfig


__all__ = ["GRPOConfig", "GRPOLearner"]
