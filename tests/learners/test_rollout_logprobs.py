"""The trainer's log-probs against the rollout engine's, with real tiny-model rollouts.

On-policy (the HF engine decodes with the learner's own module) the recomputed log-probs must
equal the sampled ones at a temperature other than 1, so every rollout importance ratio is 1.
Off-policy (an engine holding other weights, as a lagging vLLM copy would) truncated importance
sampling must weight each token by min(π_old/π_behaviour, threshold) inside the loop.
"""

from __future__ import annotations

import pytest
import torch

from algorithms.core.batch import RolloutBatch
from algorithms.core.learner import Learner
from algorithms.core.learner_config import LearnerConfig
from algorithms.core.logprobs import frozen_logprobs

# an untrained tiny model rarely calls a tool; the learner rightly warns about that (docs/algorithms.md D23)
pytestmark = pytest.mark.filterwarnings("ignore:no tool calls")

TEMPERATURE = 0.6


def _config(tmp_path, **kw) -> LearnerConfig:
    base = dict(model="tiny", env="AgentMath-v0", output_dir=str(tmp_path), total_steps=1, prompts_per_step=2,
                group_size=4, max_response_tokens=32, temperature=TEMPERATURE, micro_batch_size=4, lr=1e-4,
                threads=1, progress=False, tensorboard=False, export_model=False)  # fmt: skip
    base.update(kw)
    return LearnerConfig(**base)


class Replay(Learner):
    """GRPO whose step trains on trajectories rolled out beforehand (by the real engine), so the
    test can compute what the step must do with exactly those trajectories."""

    replay: list

    def collect(self, step):
        return self.replay, {}

    def shape_rewards(self, trajectories):
        # distinct rewards, so that advantages (and with them the loss) are not all zero
        return torch.tensor([float(sum(t.response_ids) % 7) for t in trajectories])


def _rolled_out(learner: Replay) -> RolloutBatch:
    learner.model.eval()
    trajs, _ = Learner.collect(learner, 0)
    learner.replay = trajs
    batch = RolloutBatch.from_trajectories(trajs, learner.shape_rewards(trajs))
    batch.advantages, batch.loss_mask = learner.compute_advantages(batch)
    assert batch.loss_mask.sum() > 20
    return batch


def test_trainer_logprobs_equal_the_engines_at_temperature(tmp_path):
    learner = Replay(_config(tmp_path))
    batch = _rolled_out(learner)
    trainer, _ = frozen_logprobs(learner.forward, learner.model, batch, learner.config.micro_batch_size)
    mask = batch.loss_mask > 0
    gap = (trainer - batch.rollout_logprobs)[mask].abs().max()
    assert gap < 1e-4, f"trainer and engine log-probs differ by up to {gap:.2e} at T={TEMPERATURE}"
    # at T = 1 the same tokens have clearly different log-probs: the check above can fail
    learner.config.temperature = 1.0
    at_one, _ = frozen_logprobs(learner.forward, learner.model, batch, learner.config.micro_batch_size)
    learner.config.temperature = TEMPERATURE
    assert (at_one - batch.rollout_logprobs)[mask].abs().max() > 0.05
    # in the loop: every rollout importance ratio exp(old − behaviour) is 1
    metrics = learner.train_step()
    for key in ("is_ratio/min", "is_ratio/mean", "is_ratio/max"):
        assert metrics[key] == pytest.approx(1.0, abs=1e-3), key
    assert abs(metrics["rollout_mismatch_kl"]) < 1e-4


def test_truncated_importance_sampling_in_the_loop(tmp_path):
    from algorithms.models.tiny import build_tiny_model
    from algorithms.rollout.hf import HFEngine

    threshold = 1.5
    # the engine samples from other weights than the trainer holds: the trainer has the warmed-up
    # tiny model, the engine its untrained start (tokens the trainer prefers get ratios above 1)
    stale = HFEngine(build_tiny_model(), seed=0)
    # seed 1: its draws give advantages for which the truncation changes the loss (checked below)
    cfg = _config(tmp_path, model=str(build_tiny_model(warmup_steps=150)), rollout_is="tis", seed=1,
                  rollout_is_threshold=threshold)
    learner = Replay(cfg, engine=stale)
    assert stale.tokenizer.get_vocab() == learner.tokenizer.get_vocab()
    batch = _rolled_out(learner)
    old, _ = frozen_logprobs(learner.forward, learner.model, batch, learner.config.micro_batch_size)
    mask = batch.loss_mask
    on = mask > 0
    ratio = (old - batch.rollout_logprobs).exp()
    assert (ratio[on] > threshold).any() and (ratio[on] < 1).any()  # both sides of the truncation
    weights = ratio.clamp(max=threshold) * mask
    adv = batch.advantages.unsqueeze(-1) * mask
    # one update per batch: π_θ = π_old, the PPO ratio is 1 and the token-mean loss is −Σ A·w / N
    want = float(-(adv * weights).sum() / mask.sum())
    unweighted = float(-adv.sum() / mask.sum())
    assert abs(want - unweighted) > 1e-3  # the weights matter here

    metrics = learner.train_step()
    assert metrics["pg_loss"] == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert metrics["is_ratio/min"] == pytest.approx(float(ratio[on].min()), rel=1e-4)
    assert metrics["is_ratio/max"] == pytest.approx(float(ratio[on].max()), rel=1e-4)
    assert metrics["is_ratio/mean"] == pytest.approx(float(ratio[on].mean()), rel=1e-4)

    # split into 2 mini-batches x 2 epochs x micro-batches of 3: the same ratios, so the same min,
    # max and token mean (not a mean of per-batch minima, maxima or means)
    split = Replay(_config(tmp_path / "split", model=cfg.model, rollout_is="tis", rollout_is_threshold=threshold,
                           mini_batch_prompts=1, ppo_epochs=2, micro_batch_size=3), engine=stale)  # fmt: skip
    split.replay = learner.replay
    again = split.train_step()
    for key in ("is_ratio/min", "is_ratio/mean", "is_ratio/max"):
        assert again[key] == pytest.approx(metrics[key], rel=1e-5), key


def test_validate_warns_when_the_engine_truncates_the_distribution(tmp_path, recwarn):
    _config(tmp_path).validate()
    assert not [w for w in recwarn if "top_" in str(w.message)]
    with pytest.warns(UserWarning, match=r"config field 'top_p'=0\.95: the trainer applies only the temperature"):
        _config(tmp_path, top_p=0.95).validate()
    with pytest.warns(UserWarning, match=r"config field 'top_k'=20: the trainer applies only the temperature"):
        _config(tmp_path, top_k=20).validate()
