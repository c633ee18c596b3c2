"""The learner loop in-process: micro-batching does not change the update, the reference model
exists only with a KL term, DAPO's dynamic sampling and overlong shaping, configs and the CLI.

Rollouts here are scripted (a fixed batch of token ids, masks and rewards per prompt draw), so
the tests isolate the update and the batch building; real rollouts run in test_distributed.py
and test_resume.py.
"""

from __future__ import annotations

import pytest
import torch

from agent_envs.base.config import build_config
from algorithms.core.batch import PromptSampler
from algorithms.core.learner import Learner
from algorithms.core.learner_config import LearnerConfig
from algorithms.dapo import DAPOConfig, DAPOLearner
from algorithms.rollout.trajectory import Trajectory

# scripted rollouts make no tool calls; the learner rightly warns about that (docs/algorithms.md D23)
pytestmark = pytest.mark.filterwarnings("ignore:no tool calls")


def scripted_trajectories(draws, group_size: int, reward_of) -> list[Trajectory]:
    """G trajectories per draw: random ids, a 3-token tool result (mask 0) in the middle."""
    out = []
    for d in draws:
        g = torch.Generator().manual_seed(d.index)
        prompt = torch.randint(5, 300, (6 + d.index % 4,), generator=g).tolist()
        for k in range(group_size):
            n = 5 + (d.index + k) % 7
            ids = torch.randint(5, 300, (n,), generator=g).tolist()
            mask = [1] * n
            mask[2:5] = [0, 0, 0]
            lps = [0.0 if m == 0 else -3.0 for m in mask]
            out.append(Trajectory(prompt_ids=prompt, response_ids=ids, loss_mask=mask, logprobs=lps,
                                  reward=float(reward_of(d.index, k)), group_id=d.group_id,
                                  components={"correct": float(reward_of(d.index, k) > 0)}))  # fmt: skip
    return out


class ScriptedMixin:
    reward_of = staticmethod(lambda index, k: float((index + k) % 2))

    def rollout(self, draws):
        return scripted_trajectories(draws, self.config.group_size, self.reward_of)


class ScriptedGRPO(ScriptedMixin, Learner):
    pass


class ScriptedDAPO(ScriptedMixin, DAPOLearner):
    pass


def _cfg(cls=LearnerConfig, **kw):
    base = dict(model="tiny", total_steps=1, prompts_per_step=4, group_size=4, lr=1e-3, progress=False,
                tensorboard=False, export_model=False, max_response_tokens=16)  # fmt: skip
    base.update(kw)
    return cls(**base)


def _one_step(learner_cls, tmp_path, **kw) -> tuple[dict, dict]:
    learner = learner_cls(_cfg(output_dir=str(tmp_path), **kw))
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    [metrics] = learner.train()
    delta = {k: learner.model.state_dict()[k] - before[k] for k in before}
    return metrics, delta


@pytest.mark.slow
@pytest.mark.parametrize("epochs", [1, 2])
def test_micro_batch_size_does_not_change_the_update(tmp_path, epochs):
    kw = dict(ppo_epochs=epochs, mini_batch_prompts=2 if epochs == 2 else None, weight_decay=0.0)
    m_big, d_big = _one_step(ScriptedGRPO, tmp_path / "big", micro_batch_size=16, **kw)
    m_small, d_small = _one_step(ScriptedGRPO, tmp_path / "small", micro_batch_size=1, **kw)
    norm = sum(float(v.norm() ** 2) for v in d_big.values()) ** 0.5
    gap = sum(float((d_big[k] - d_small[k]).norm() ** 2) for k in d_big) ** 0.5
    assert norm > 1e-3
    assert gap < 1e-4 * norm, (gap, norm)
    assert m_big["pg_loss"] == pytest.approx(m_small["pg_loss"], abs=1e-6)
    assert m_big["entropy"] == pytest.approx(m_small["entropy"], rel=1e-5)


def test_reference_model_only_with_kl(tmp_path):
    assert ScriptedGRPO(_cfg(output_dir=str(tmp_path / "a"))).ref_model is None  # docs/algorithms.md D22
    learner = ScriptedGRPO(_cfg(output_dir=str(tmp_path / "b"), kl_coef=0.1))
    assert learner.ref_model is not None
    [metrics] = learner.train()
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)  # π_θ = π_ref before the first update


def test_prompt_sampler_epochs_and_state():
    s = PromptSampler(5, seed=1)
    first = s.draw(3) + s.draw(2)
    assert sorted(first) == [0, 1, 2, 3, 4]
    s.draw(2)
    state = s.state_dict()
    nxt = s.draw(4)
    t = PromptSampler(5, seed=1)
    t.load_state_dict(state)
    assert t.draw(4) == nxt


def test_dapo_dynamic_sampling_fills_with_spread_groups(tmp_path):
    class Half(ScriptedDAPO):
        # even groups: every sample right (no spread: dropped); odd groups: mixed. By group id, not
        # task index, so exactly half of every round is dropped whichever tasks are drawn
        def rollout(self, draws):
            trajs = scripted_trajectories(draws, self.config.group_size, lambda index, k: 0.0)
            for i, t in enumerate(trajs):
                t.reward = 1.0 if t.group_id % 2 == 0 else float(i % self.config.group_size % 2)
                t.components["correct"] = float(t.reward > 0)
            return trajs

    learner = Half(
        _cfg(DAPOConfig, output_dir=str(tmp_path), overlong_shaping=False, gen_batch_multiplier=1.0)
    )
    trajs, metrics = learner.collect(0)
    assert len(trajs) == 4 * 4
    groups = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t.reward)
    assert len(groups) == 4 and all(len(set(r)) > 1 for r in groups.values())
    assert metrics["gen_rounds"] >= 2  # half of each round is dropped, so one round cannot fill it
    assert 0 < metrics["kept_group_fraction"] < 1


@pytest.mark.parametrize("max_rounds", [0, -1, 10])
def test_dapo_group_ids_are_unique_across_steps_and_rounds(tmp_path, max_rounds):
    # with max_num_gen_batches <= 0 round 1 of step 0 once reused the group ids of step 1's round 0
    class Recording(ScriptedDAPO):
        reward_of = staticmethod(lambda index, k: 1.0 if index % 2 == 0 else float(k % 2))
        drawn: list[int] = []

        def rollout(self, draws):
            self.drawn += [d.group_id for d in draws]
            return super().rollout(draws)

    learner = Recording(_cfg(DAPOConfig, output_dir=str(tmp_path), overlong_shaping=False,
                             gen_batch_multiplier=1.0, max_num_gen_batches=max_rounds))  # fmt: skip
    rounds = 0
    for step in range(3):
        rounds += learner.collect(step)[1]["gen_rounds"]
    assert rounds >= 6  # several rounds per step, so ids of different rounds and steps can meet
    assert len(learner.drawn) == len(set(learner.drawn))


def test_dapo_gives_up_after_max_rounds(tmp_path):
    class Constant(ScriptedDAPO):
        reward_of = staticmethod(lambda index, k: 1.0)

    learner = Constant(
        _cfg(DAPOConfig, output_dir=str(tmp_path), max_num_gen_batches=3, overlong_shaping=False)
    )
    with pytest.raises(RuntimeError, match=r"after 3 generation rounds .*zero reward spread"):
        learner.collect(0)


def test_dapo_overlong_shaping_on_model_tokens(tmp_path):
    learner = ScriptedDAPO(
        _cfg(DAPOConfig, output_dir=str(tmp_path), max_response_tokens=10, overlong_buffer_len=4)
    )
    mk = lambda n_model, n_tool: Trajectory(  # noqa: E731
        prompt_ids=[1], response_ids=[7] * (n_model + n_tool), loss_mask=[1] * n_model + [0] * n_tool,
        logprobs=[-1.0] * n_model + [0.0] * n_tool, reward=1.0)  # fmt: skip
    # L_max 10, L_cache 4: free up to 6 model tokens, then −1/4 per token; tool tokens do not count
    shaped = learner.shape_rewards([mk(6, 3), mk(8, 0), mk(10, 0), mk(4, 20)])
    assert shaped.tolist() == [1.0, 0.5, 0.0, 1.0]
    assert learner.config.clip_ratio_high == 0.28 and learner.config.clip_ratio_c == 10.0


def test_config_errors_name_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: 1e-4\nlearning_rate: 3\n")
    with pytest.raises(ValueError, match=r"bad.yaml: unknown config key 'learning_rate'"):
        build_config(LearnerConfig, bad)
    with pytest.raises(ValueError, match=r"'loss_agg_mode'"):
        build_config(LearnerConfig, None, ["loss_agg_mode=mean"])
    with pytest.raises(ValueError, match="mini_batch_prompts"):
        build_config(LearnerConfig, None, ["prompts_per_step=4", "mini_batch_prompts=3"])
    cfg = build_config(DAPOConfig, "configs/dapo_tiny.yaml", ["lr=2e-4", "env_kwargs.max_tool_calls=2"])
    assert cfg.lr == 2e-4 and cfg.clip_ratio_high == 0.28 and cfg.env_kwargs["max_tool_calls"] == 2
    assert "system_prompt" in cfg.env_kwargs


def test_cli_parses_train_and_sft():
    from agent_envs.cli import build_parser

    args = build_parser().parse_args(["train", "--algo", "dapo", "--config", "configs/dapo_tiny.yaml",
                                      "--resume", "lr=1e-5"])  # fmt: skip
    assert args.algo == "dapo" and args.resume == "auto" and args.overrides == ["lr=1e-5"]
    args = build_parser().parse_args(["sft", "steps=10"])
    assert args.overrides == ["steps=10"] and callable(args.func)


@pytest.mark.parametrize("algo", ["grpo", "dapo"])
def test_every_preset_resolves(algo):
    from pathlib import Path

    from algorithms.cli import learner_class

    presets = sorted(Path("configs").glob(f"{algo}_*.yaml"))
    assert len(presets) >= 4  # tiny + Qwen2.5-7B / Qwen3-8B / Qwen3-14B
    for path in presets:
        cfg = build_config(learner_class(algo).config_class, path)
        assert cfg.kl_coef == 0.0, path


def test_validation_is_greedy_on_held_out_tasks(tmp_path, sft_run):
    from learner_support import SYSTEM_PROMPT

    from algorithms.core.run_log import read_metrics

    # Scripted training rollouts, real greedy validation: the SFT model through the runner and env.
    cfg = _cfg(model=sft_run["model"], env="AgentMath-v0", env_kwargs={"system_prompt": SYSTEM_PROMPT},
               output_dir=str(tmp_path), total_steps=2, eval_every=2, eval_episodes=48,
               max_response_tokens=128)  # fmt: skip
    learner = ScriptedGRPO(cfg)
    n = learner.sampler.num_tasks + 48
    assert learner.eval_tasks == list(range(n - 48, n))  # the env's last tasks ...
    assert max(learner.sampler.draw(3 * n)) < n - 48  # ... are never drawn for training
    learner.train()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2]  # before training, at the end
    before = rows[0]
    # Step 0 is the SFT model itself on the SFT run's own held-out tasks: the same greedy result.
    assert before["eval/accuracy"] == pytest.approx(sft_run["eval"]["accuracy"])
    assert before["eval/protocol_valid"] == pytest.approx(sft_run["eval"]["protocol_valid"])
    assert before["eval/tool_calls_mean"] > 0 and before["eval/response_length_mean"] > 0
    with pytest.raises(ValueError, match="'eval_episodes': env AgentMath-v0 has"):
        ScriptedGRPO(_cfg(output_dir=str(tmp_path / "too_many"), eval_every=1, eval_episodes=10**7))


def test_packed_pass_equals_full_passes(tmp_path, monkeypatch):
    """A group's responses reuse one prompt pass (its KV cache, with gradients) and are packed into
    rows of real tokens: log-probs, entropies and gradients equal those of a full pass per response."""
    from algorithms.core import tree_packing
    from algorithms.core.batch import MicroBatch, RolloutBatch

    learner = ScriptedGRPO(_cfg(output_dir=str(tmp_path), temperature=0.7))
    assert learner.packer.share_prompts and not learner.packer.forks
    draws = learner.draw_prompts(0, 3, 0)
    trajs = scripted_trajectories(draws, 4, ScriptedMixin.reward_of)
    batch = RolloutBatch.from_trajectories(trajs, torch.zeros(len(trajs)))
    micro = MicroBatch(rows=list(range(len(trajs))), width=batch.response_ids.shape[1])
    model = learner.model
    full_passes = []
    full = tree_packing.response_logits

    def counted(*args, **kwargs):
        full_passes.append(1)
        return full(*args, **kwargs)

    # the packer picks the full pass by name, and the packed pass falls back on it by name
    monkeypatch.setattr(tree_packing, "response_logits", counted)
    results = []
    for share in (True, False):
        learner.packer.share_prompts = share
        model.zero_grad()
        lp, ent = learner.forward(model, batch, micro, with_entropy=True, entropy_grad=True)
        assert len(full_passes) == (0 if share else 1)  # the packed pass really ran
        ((lp + ent) * batch.loss_mask).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((lp.detach(), ent.detach(), grads))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    real = batch.loss_mask > 0
    assert torch.allclose(lp_a[real], lp_b[real], atol=1e-5)
    assert torch.allclose(ent_a[real], ent_b[real], atol=1e-5)
    assert g_a.norm() > 0
    assert torch.allclose(g_a, g_b, atol=1e-5 * float(g_a.abs().max()))


def test_a_lora_step_moves_the_adapters_and_the_hf_engine_samples_them(tmp_path):
    """With LoRA the HF engine decodes with its own merged copy: after a step whose rewards spread
    (so the gradient is not zero and LoRA B leaves zero), the pushed engine's log-probs are the
    learner's, and differ from the base model's."""
    from algorithms.models.lora import LoRAConfig
    from algorithms.rollout.engine import SamplingParams

    learner = ScriptedGRPO(_cfg(output_dir=str(tmp_path), lora=LoRAConfig(enabled=True, r=4, alpha=8.0), lr=1e-2,
                                health_checks="off"))  # scripted log-probs are not the model's
    module = learner.accelerator.unwrap_model(learner.model)
    assert learner.engine.model is not module  # its own copy: only the push can update it
    bs = {n: p.detach().clone() for n, p in module.named_parameters() if ".lora_B." in n}
    assert bs and all(not b.any() for b in bs.values())  # B starts at zero: merged = base
    [metrics] = learner.train()
    assert metrics["grad_norm"] > 0
    assert any(p.any() for n, p in module.named_parameters() if ".lora_B." in n)

    prompts = [[1, 5, 7, 9, 11], [3, 4, 4, 8, 20, 11]]
    segs = learner.engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=12, seed=3))

    def logprobs(prompt, response):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logits = module(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]

    def gap(seg_lps, lps):
        return float((torch.tensor(seg_lps) - lps).abs().max())

    module.eval()
    to_learner = max(gap(s.logprobs, logprobs(p, s.token_ids)) for p, s in zip(prompts, segs, strict=True))
    with module.disable_adapter():
        to_base = max(gap(s.logprobs, logprobs(p, s.token_ids)) for p, s in zip(prompts, segs, strict=True))
    assert to_learner < 2e-3 < 10 * 2e-3 < to_base
