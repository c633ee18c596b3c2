"""GRPO (DeepSeekMath): group-normalised outcome advantages, PPO clip, no critic.

    agent-envs train --algo grpo --config configs/grpo_tiny.yaml

    >>> from algorithms.grpo import GRPOConfig
    >>> cfg = GRPOConfig()
    >>> cfg.advantage_estimator, cfg.scale_rewards, cfg.adv_eps
    ('grpo', 'group', 1e-06)
    >>> cfg.policy_loss, cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c, cfg.loss_agg_mode
    ('ppo_clip', 0.2, 0.2, 3.0, 'token-mean')
    >>> cfg.kl_coef, cfg.entropy_coeff, cfg.lr, cfg.lr_schedule
    (0.0, 0.0, 1e-06, 'constant')

GRPO is the shared loop with none of its hooks changed; each other algorithm is "GRPO, except".
Where each part of GRPO is (docs/algorithms.md §3):

* the loop: `Learner.train_step` in `algorithms/core/learner.py` (collect → advantages → loss →
  update → sync);
* sampling: G = `group_size` independent episodes per prompt draw, `Learner.rollout` →
  `group_rollout` in `algorithms/core/group_sampling.py`;
* advantage: A_i = (R_i − μ_g) / (σ_g + 1e-6), σ the unbiased std of the group's rewards,
  `Learner.compute_advantages` → `outcome_advantages` → `grpo_advantages` in
  `algorithms/core/advantages.py` (§3.2);
* loss: PPO clip ε = 0.2/0.2 with dual clip c = 3, token-mean over model tokens, no KL term (no
  reference model is loaded), no entropy bonus: `loss_and_metrics` → `policy_loss` in
  `algorithms/core/losses.py` (§2.2–§2.3);
* optimiser: AdamW, lr 1e-6, constant (`algorithms/core/model_setup.py`, `make_optimizer`).

The defaults above are `LearnerConfig`'s (`algorithms/core/learner_config.py`). The paper's
sequence-level mean is `loss_agg_mode=seq-mean-token-mean` (preset configs/grpo_paper_tiny.yaml);
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
    """The shared loop as it is: every hook keeps GRPO's behaviour."""

    name = "grpo"
    config_class = GRPOConfig


__all__ = ["GRPOConfig", "GRPOLearner"]
