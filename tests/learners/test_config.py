"""Typed configs: every preset resolves to its frozen expectation, inheritance, nested `tree`
keys, misspellings with suggestions, type checks from annotations, and the `--help` listing."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from learner_support import REPO, cli_env

from agent_envs.base.config import build_config, config_dict, describe_config, load_preset
from algorithms.aepo import AEPOConfig
from algorithms.arpo import ARPOConfig
from algorithms.cli import learner_class
from algorithms.core.advantages import ADVANTAGE_ESTIMATORS, SCALE_MODES
from algorithms.core.learner_config import KLEstimator, LearnerConfig, LossAggMode
from algorithms.core.losses import AGG_MODES, KL_KINDS
from algorithms.sft import SFTConfig

CONFIGS = REPO / "configs"
# resolved configs of every preset, generated from the flat presets before they inherited
FROZEN = json.loads((Path(__file__).parent / "data" / "resolved_presets.json").read_text())


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_every_preset_resolves_to_its_frozen_config(name):
    path = CONFIGS / name
    algo = load_preset(path).get("algo")
    cls = SFTConfig if algo is None else learner_class(algo).config_class
    assert name.startswith(f"{algo}_") or algo is None, f"{name} names algo {algo!r}"
    resolved = json.loads(json.dumps(config_dict(build_config(cls, path))))
    assert resolved == FROZEN[name]


def test_every_preset_is_frozen_and_inherits():
    presets = sorted(p.name for p in CONFIGS.glob("*.yaml"))
    assert presets == sorted(FROZEN)
    for name in presets:
        raw = yaml.safe_load((CONFIGS / name).read_text())
        if not name.startswith("sft_"):  # SFT presets stand alone: no algo to inherit for
            assert "inherit" in raw and "algo" in raw, name


def test_inherit_chains_merge_mappings_and_report_cycles(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "a.yaml").write_text("lr: 1.0e-4\nenv_kwargs: {x: 1, y: 2}\n")
    (tmp_path / "b.yaml").write_text("inherit: base/a.yaml\nenv_kwargs: {y: 3}\ntree: {beam_size: 3}\n")
    (tmp_path / "c.yaml").write_text("inherit: b.yaml\ntree: {initial_rollouts: 2}\n")
    cfg = build_config(ARPOConfig, tmp_path / "c.yaml")
    assert cfg.lr == 1e-4 and cfg.env_kwargs == {"x": 1, "y": 3}
    assert (cfg.tree.beam_size, cfg.tree.initial_rollouts) == (3, 2)
    (tmp_path / "base" / "a.yaml").write_text("inherit: ../c.yaml\n")
    with pytest.raises(ValueError, match=r"cycle: .*c.yaml -> .*b.yaml -> .*a.yaml -> .*c.yaml"):
        build_config(ARPOConfig, tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("inherit: nowhere.yaml\n")
    with pytest.raises(FileNotFoundError, match="d.yaml: inherits 'nowhere.yaml'"):
        build_config(ARPOConfig, tmp_path / "d.yaml")


def test_tree_keys_nest_and_misspellings_suggest(tmp_path):
    cfg = build_config(ARPOConfig, None, ["tree.beam_size=3", "tree.branch_probability=1"])
    assert cfg.tree.beam_size == 3 and cfg.tree.branch_probability == 1.0
    with pytest.raises(ValueError, match=r"override 'tree.beam_sise=3': unknown config key 'tree.beam_sise' \(did you mean 'beam_size'\?\)"):  # noqa: E501
        build_config(ARPOConfig, None, ["tree.beam_sise=3"])
    with pytest.raises(ValueError, match=r"unknown config key 'beam_size'"):
        build_config(ARPOConfig, None, ["beam_size=3"])  # a tree key only exists under tree.
    bad = tmp_path / "bad.yaml"
    bad.write_text("tree:\n  initial_rollout: 4\n")
    with pytest.raises(ValueError, match=r"bad.yaml: unknown config key 'tree.initial_rollout' \(did you mean 'initial_rollouts'\?\)"):  # noqa: E501
        build_config(AEPOConfig, bad)
    with pytest.raises(ValueError, match=r"'tree.branch_mode' must be one of \['sample', 'threshold'\]"):
        build_config(ARPOConfig, None, ["tree.branch_mode=always"])
    with pytest.raises(ValueError, match=r"override 'lr.x=1': 'lr' is not a mapping"):
        build_config(ARPOConfig, None, ["lr.x=1"])


def test_aepo_switches_are_set_by_aepo_and_kept_under_overrides():
    arpo, aepo = ARPOConfig().tree, AEPOConfig().tree
    assert not arpo.enable_dynamic_rollouts and not arpo.enable_consecutive_penalty
    assert aepo.enable_dynamic_rollouts and aepo.enable_consecutive_penalty
    cfg = build_config(AEPOConfig, None, ["tree.beam_size=3"])
    assert cfg.tree.enable_dynamic_rollouts and cfg.tree.beam_size == 3


def test_types_are_checked_from_annotations_even_where_the_default_is_none():
    with pytest.raises(ValueError, match=r"'mini_batch_prompts' must be int \| null, got 'four'"):
        build_config(LearnerConfig, None, ["mini_batch_prompts=four"])
    with pytest.raises(ValueError, match=r"'threads' must be int \| auto \| null"):
        build_config(LearnerConfig, None, ["threads=1.5"])
    with pytest.raises(ValueError, match=r"'gradient_checkpointing' must be true or false"):
        build_config(LearnerConfig, None, ["gradient_checkpointing=3"])
    cfg = build_config(LearnerConfig, None, ["lr=1", "clip_ratio_c=null", "adam_betas=[0.9, 0.95]"])
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.clip_ratio_c is None
    assert cfg.adam_betas == (0.9, 0.95)
    with pytest.raises(ValueError, match=r"'engine' must be one of \['hf', 'vllm', 'vllm-server'\]"):
        LearnerConfig(engine="sglang").validate()


def test_choice_types_match_the_functions_that_implement_them():
    assert set(typing.get_args(LossAggMode)) == set(AGG_MODES)
    assert set(typing.get_args(KLEstimator)) == set(KL_KINDS)
    hints = typing.get_type_hints(LearnerConfig)
    assert set(typing.get_args(hints["advantage_estimator"])) == set(ADVANTAGE_ESTIMATORS)
    assert set(typing.get_args(hints["scale_rewards"])) == set(SCALE_MODES)


@pytest.mark.parametrize("cls", [LearnerConfig, AEPOConfig, SFTConfig, learner_class("dapo").config_class])
def test_every_key_has_help(cls):
    rows = describe_config(cls)
    missing = [key for key, _, _, help_text in rows if not help_text]
    assert not missing
    keys = [key for key, *_ in rows]
    if cls is AEPOConfig:
        tree_fields = [f.name for f in dataclasses.fields(AEPOConfig().tree)]
        assert [k for k in keys if k.startswith("tree.")] == [f"tree.{f}" for f in tree_fields]


def test_cli_help_lists_every_key_with_type_default_and_help():
    out = subprocess.run(
        [sys.executable, "-m", "agent_envs.cli", "train", "--algo", "aepo", "--help"],
        capture_output=True, text=True, env=cli_env(), cwd=REPO, check=True,
    ).stdout  # fmt: skip
    assert "  tree.beam_size (int, default 2)\n      Z: children per branch point" in out
    assert "  tree.enable_dynamic_rollouts (bool, default true)" in out
    assert "  mini_batch_prompts (int | null, default null)" in out
    assert "  entropy_adv_norm_scope (minibatch|microbatch|group, default minibatch)" in out
    for key, *_ in describe_config(AEPOConfig):
        assert f"\n  {key} (" in out, key


def test_a_whole_mapping_override_replaces_and_a_dotted_one_merges():
    preset = CONFIGS / "grpo_tiny.yaml"
    merged = build_config(LearnerConfig, preset, ["env_kwargs.max_tool_calls=2"])
    assert merged.env_kwargs["max_tool_calls"] == 2 and merged.env_kwargs["reward"] == "binary"
    replaced = build_config(LearnerConfig, preset, ['env_kwargs={"system_prompt": "hi"}'])
    assert replaced.env_kwargs == {"system_prompt": "hi"}
    assert build_config(LearnerConfig, preset, ["env_kwargs={}"]).env_kwargs == {}
