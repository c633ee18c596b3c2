"""The tiny local model: tokenizer properties, chat template, cache, and that transformers loads it."""

from __future__ import annotations

import json

import pytest
from rollout_helpers import WARMUP_STEPS

from algorithms.models.tiny import PROTOCOL_TAGS, TinyModelConfig, build_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def test_tags_chatml_and_digits_are_single_tokens(tokenizer):
    for tag in (*PROTOCOL_TAGS, "<|im_start|>", "<|im_end|>"):
        ids = tokenizer(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, f"{tag} is split into {ids}"
    ids = tokenizer(" print(90817 * 2)", add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]
    assert [p for p in pieces if p.isdigit()] == list("908172")
    assert tokenizer.eos_token == "<|im_end|>"
    # tags stay in decoded text (the env parses them); ChatML markers are special and dropped
    text = "<think> a </think> <python> print(1) </python><|im_end|>"
    assert (
        tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text[: -len("<|im_end|>")]
    )


def test_chat_template_is_chatml(tokenizer):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    with_tool = tokenizer.apply_chat_template(
        [*msgs, {"role": "assistant", "content": "A"}, {"role": "tool", "content": "R"}],
        tools=[{"type": "function", "function": {"name": "python"}}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert '"name": "python"' in with_tool
    assert with_tool.endswith(
        "<|im_start|>user\n<tool_response>\nR\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_model_config_and_size(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.tie_word_embeddings
    assert (
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
    ) == (128, 3, 4, 2, 384)
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 0.9e6
    assert json.loads((tiny_model_path / "tiny_model.json").read_text())["seed"] == 0


def test_cache_hit_and_bad_settings(tiny_model_path, tmp_path):
    assert build_tiny_model(seed=0, warmup_steps=WARMUP_STEPS) == tiny_model_path  # served from the cache
    with pytest.raises(TypeError, match="unknown settings"):
        build_tiny_model(hidden=64)
    with pytest.raises(ValueError, match="num_attention_heads"):
        build_tiny_model(tmp_path / "m", num_attention_heads=5)
    assert TinyModelConfig(seed=1).key() != TinyModelConfig(seed=0).key()
