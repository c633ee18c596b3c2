"""The health checks inside the learners: real tiny-model runs (GRPO and ARPO's tree rollout)
trigger none even when fatal, and perturbed behaviour log-probs are caught by the engine/trainer
agreement check."""

from __future__ import annotations

import copy
import re

import pytest

from algorithms.arpo import ARPOConfig, ARPOLearner
from algorithms.core.learner import Learner
from algorithms.core.learner_config import LearnerConfig
from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT, build_tiny_model
from algorithms.rollout.health import FAULTS, RecordedEngine, RolloutHealthError, RolloutHealthWarning

BUDGET = 80


def _config(tmp_path, cls=LearnerConfig, **kw):
    base = dict(model=str(build_tiny_model(seed=0, warmup_steps=150)), env="AgentMath-v0",
                env_kwargs={"system_prompt": WARMUP_SYSTEM_PROMPT}, output_dir=str(tmp_path), total_steps=2,
                prompts_per_step=2, group_size=4, max_response_tokens=BUDGET, micro_batch_size=4, lr=1e-4,
                threads=1, progress=False, tensorboard=False, export_model=False, health_checks="fatal")  # fmt: skip
    base.update(kw)
    return cls(**base)


def _faults(metrics):
    return {c: metrics[f"health/{c}"] for c in FAULTS}


@pytest.mark.slow
@pytest.mark.parametrize("cls", [Learner, ARPOLearner], ids=["grpo", "arpo"])
def test_a_clean_run_triggers_no_check(tmp_path, cls):
    cfg = _config(tmp_path, ARPOConfig if cls is ARPOLearner else LearnerConfig,
                  eval_every=2, eval_episodes=4)
    learner = cls(cfg)
    assert isinstance(learner.engine, RecordedEngine)
    history = learner.train()  # fatal: any failed check would raise
    assert len(history) == 2
    for m in history:
        assert _faults(m) == dict.fromkeys(FAULTS, 0.0)
        assert m["health/logprob_diff_max"] < 1e-3  # the HF engine decodes with the learner's own module
        assert m["health/time_ms"] > 0
    assert history[-1]["eval/health/prefix"] == 0.0
    # the run had the cases the checks look at: tool results and budget cuts
    assert max(m["tool_calls_mean"] for m in history) > 0
    assert max(m["truncation_rate"] for m in history) > 0


class Replay(Learner):
    """Trains on trajectories rolled out beforehand by its own engine, edited by the test."""

    replay: list

    def collect(self, step):
        return self.replay, {}


def _replay(tmp_path, **kw):
    learner = Replay(_config(tmp_path, total_steps=1, **kw))
    learner.model.eval()
    learner.replay, _ = Learner.collect(learner, 0)
    return learner


@pytest.fixture(scope="module")
def rolled_out(tmp_path_factory):
    learner = _replay(tmp_path_factory.mktemp("replay"), health_checks="warn")
    return copy.deepcopy(learner.replay)


def test_perturbed_behaviour_logprobs(tmp_path, rolled_out):
    learner = _replay(tmp_path, health_checks="warn")
    learner.replay = copy.deepcopy(rolled_out)
    row, t = next((i, t) for i, t in enumerate(learner.replay) if sum(t.loss_mask) > 5)
    index = [i for i, m in enumerate(t.loss_mask) if m][3]
    t.logprobs[index] -= 3.0  # the engine "said" a probability e^3 times smaller than the trainer sees
    where = re.escape(f"'logprob' failed: trajectory {t.traj_id} (task '{t.task_id}') at response token {index}")
    with pytest.warns(RolloutHealthWarning, match=where):
        metrics = learner.train_step()
    assert metrics["health/logprob"] == 1.0
    assert metrics["health/logprob_diff_max"] == pytest.approx(3.0, abs=1e-3)
    assert 0 < metrics["health/logprob_diff_mean"] < 3.0
    assert learner.replay[row].health == ["logprob"]


def test_fatal_mode_stops_before_the_update(tmp_path, rolled_out):
    learner = _replay(tmp_path)
    learner.replay = copy.deepcopy(rolled_out)
    learner.replay[2].reward = 4.0
    before = [p.detach().clone() for p in learner.model.parameters()]
    with pytest.raises(RolloutHealthError, match=f"'reward' failed: trajectory {learner.replay[2].traj_id} "):
        learner.train_step()
    assert all((a == b).all() for a, b in zip(before, learner.model.parameters(), strict=True))


def test_off_leaves_the_engine_alone(tmp_path):
    learner = Replay(_config(tmp_path, total_steps=1, health_checks="off"))
    assert not isinstance(learner.engine, RecordedEngine)
    learner.model.eval()
    learner.replay, _ = Learner.collect(learner, 0)
    assert not any(k.startswith("health/") for k in learner.train_step())
